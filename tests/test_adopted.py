"""A cache directory a framework gives JAX after `import jax` (SPEC §5, §7, amended 2026-12-04;
issue 45 part 1): MaxText's `jax_cache_dir`, vLLM's TPU backend, AlphaFold 3's flag. Until then
JAX's stock cache served it: no atomic writes, no records, no explanations, and nothing said."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import Venv, autocache_warnings

FRAMEWORK = r"""
import os, sys
import jax, jax.numpy as jnp

def setup(directory):  # a framework's own setting, after import jax
    if os.environ.get("HOW") == "set_cache_dir":
        from jax.experimental.compilation_cache import compilation_cache
        compilation_cache.set_cache_dir(directory)
    else:
        jax.config.update("jax_compilation_cache_dir", directory)

setup(os.environ["FRAMEWORK_DIR"])

@jax.jit
def step(x):
    return jnp.tanh(x @ x.T).sum()

print(float(step(jnp.ones((8, 8)))))
"""


def _run(venv: Venv, folder: Path, env: dict[str, str]) -> str:
    proc = venv.run(str(folder / "train.py"), env=env, cwd=str(folder))
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("gkx-autocache:")]
    return line


@pytest.mark.parametrize("how", ["config.update", "set_cache_dir"])
def test_a_directory_a_framework_sets_after_import_is_served_and_explained(venv: Venv, tmp_path: Path,
                                                                           how: str) -> None:
    (tmp_path / "train.py").write_text(FRAMEWORK)
    framework = tmp_path / "framework-cache"
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "ours"), "GKX_JAX_CACHE_REPORT": "1", "HOW": how,
           "FRAMEWORK_DIR": str(framework)}
    line = {"config.update": "train.py:10", "set_cache_dir": "train.py:8"}[how]  # the framework's line, not JAX's
    cold = _run(venv, tmp_path, env)
    assert cold.endswith(f"{framework} (set by {line})"), cold
    assert any(p.name.endswith("-gkx-compile") for p in framework.iterdir())  # the store's writes
    assert (framework / ".gkx-autocache" / "ledger").is_dir()
    warm = _run(venv, tmp_path, env)
    assert re.match(r"gkx-autocache: [1-9]\d* hits, 0 misses", warm), warm
    changed = _run(venv, tmp_path, {**env, "XLA_FLAGS": "--xla_cpu_enable_fast_math=true"})
    assert "changed XLA_FLAGS" in changed, changed
    # `explain` resolves the package's own directory, and follows the framework's there
    explained = venv.cli("--json", "explain", env=env)
    data = json.loads(explained.stdout)
    assert data["moved"]["dir"] == str(framework) and data["moved"]["by"] == line, data["moved"]
    assert "changed XLA_FLAGS" in data["last_run"]["misses_by_cause"], data["last_run"]
    status = venv.cli("status", env=env).stdout
    assert f"JAX's directory is {framework}, set by {line}" in status, status


def test_a_framework_directory_others_can_write_stays_jaxs_and_is_said(venv: Venv, tmp_path: Path) -> None:
    """Never trust a directory others can write (SPEC §8): JAX's own cache reads it, as the
    framework asked, and one line says the package's store does not."""
    (tmp_path / "train.py").write_text(FRAMEWORK)
    framework = tmp_path / "open"
    framework.mkdir()
    framework.chmod(0o777)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "ours"), "FRAMEWORK_DIR": str(framework)}
    proc = venv.run(str(tmp_path / "train.py"), env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    said = [w for w in autocache_warnings(proc.stderr) if "AutocacheWarning" in w]
    assert len(said) == 1 and "set by train.py:10" in said[0] and "others can write" in said[0], proc.stderr
    assert not (framework / ".gkx-autocache").exists() and any(framework.iterdir())


def test_the_cap_applies_to_a_framework_directory_only_where_max_size_is_set(venv: Venv, tmp_path: Path) -> None:
    """A framework's directory may be shared with tools that expect their entries to stay: the
    package prunes it only where the user set max_size (here, 1 byte)."""
    (tmp_path / "train.py").write_text(FRAMEWORK)
    for cap, kept in ((None, True), ("1", False)):
        framework = tmp_path / f"cache-{cap}"
        env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "ours"), "FRAMEWORK_DIR": str(framework),
               **({"GKX_JAX_CACHE_MAX_SIZE": cap} if cap else {})}
        assert venv.run(str(tmp_path / "train.py"), env=env, cwd=str(tmp_path)).returncode == 0
        assert any(p.name.endswith("-cache") for p in framework.iterdir()) == kept, (cap, list(framework.iterdir()))
