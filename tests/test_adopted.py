"""A cache directory a framework gives JAX after `import jax` (SPEC §5, §7, amended 2026-12-04;
issue 45 part 1): MaxText's `jax_cache_dir`, vLLM's TPU backend, AlphaFold 3's flag. Until then
JAX's stock cache served it: no atomic writes, no records, no explanations, and nothing said."""

from __future__ import annotations

import json
import re
import time
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


def test_a_framework_directory_through_a_link_of_roots_is_served_where_it_points(venv: Venv, tmp_path: Path) -> None:
    """An HPC home (`/home/u -> /gpfs/...`, a link of root's): the store writes where the link
    points. A review found every write refused (the store was handed JAX's spelling, and opens
    nothing through a link): nothing cached, nothing said."""
    import os

    (tmp_path / "train.py").write_text(FRAMEWORK)
    (tmp_path / "gpfs" / "u").mkdir(parents=True)
    (tmp_path / "home").symlink_to(tmp_path / "gpfs" / "u")
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "ours"), "GKX_JAX_CACHE_REPORT": "1",
           "FRAMEWORK_DIR": str(tmp_path / "home" / "cache")}
    _run(venv, tmp_path, env)
    assert re.match(r"gkx-autocache: [1-9]\d* hits, 0 misses", _run(venv, tmp_path, env))
    assert any(p.name.endswith("-cache") for p in (tmp_path / "gpfs" / "u" / "cache").iterdir())
    # a link another user planted (in a sticky /tmp) would choose where the cache goes: refused, said
    planted = tmp_path / "planted"
    planted.symlink_to(tmp_path / "gpfs" / "u" / "elsewhere")
    os.lchown(planted, 1001, 1001)
    proc = venv.run(str(tmp_path / "train.py"), env={**env, "FRAMEWORK_DIR": str(planted)}, cwd=str(tmp_path))
    said = [w for w in autocache_warnings(proc.stderr) if "AutocacheWarning" in w]
    assert proc.returncode == 0 and len(said) == 1 and "symlink of uid 1001" in said[0], proc.stderr
    assert not (tmp_path / "gpfs" / "u" / "elsewhere" / ".gkx-autocache").exists()


RELATIVE = FRAMEWORK.replace('setup(os.environ["FRAMEWORK_DIR"])', 'setup("rel-cache")') + r"""
os.makedirs("elsewhere", mode=0o777, exist_ok=True)
os.chmod("elsewhere", 0o777)  # a folder anyone can write: the relative name must not follow the process there
os.chdir("elsewhere")
print(float(jax.jit(lambda x: x * 7)(jnp.ones(3)).sum()))
"""


def test_a_relative_framework_directory_is_the_one_checked_whatever_the_current_directory(venv: Venv,
                                                                                           tmp_path: Path) -> None:
    """A relative setting, then `os.chdir`: the directory checked is the one served and recorded
    (a review found the store serving the relative name in the new current directory)."""
    (tmp_path / "train.py").write_text(RELATIVE)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "ours"), "GKX_JAX_CACHE_REPORT": "1"}
    for _ in range(2):
        proc = venv.run(str(tmp_path / "train.py"), env=env, cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stderr
    assert any(p.name.startswith("jit__lambda") for p in (tmp_path / "rel-cache").iterdir())
    assert not (tmp_path / "elsewhere" / "rel-cache").exists()
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("gkx-autocache:")]
    assert re.match(r"gkx-autocache: [1-9]\d* hits, 0 misses", line) and line.endswith("(set by train.py:10)"), line


def test_a_framework_directory_that_existed_keeps_its_bookkeeping_folded_and_its_cap(venv: Venv, tmp_path: Path) -> None:
    """A directory that existed gets no tag of its own (it would hide it from backups), but the
    bookkeeping folder the package makes in it does: ledgers are folded and an explicit cap is kept
    (a review found every ledger kept for good, and max_size never applied there)."""
    (tmp_path / "train.py").write_text(FRAMEWORK)
    framework = tmp_path / "existing"
    framework.mkdir(mode=0o700)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "ours"), "FRAMEWORK_DIR": str(framework)}
    for _ in range(3):
        assert venv.run(str(tmp_path / "train.py"), env=env, cwd=str(tmp_path)).returncode == 0
    assert not (framework / "CACHEDIR.TAG").exists() and (framework / ".gkx-autocache" / "CACHEDIR.TAG").exists()
    assert len(list((framework / ".gkx-autocache" / "ledger").iterdir())) == 0
    assert venv.run(str(tmp_path / "train.py"), env={**env, "GKX_JAX_CACHE_MAX_SIZE": "1"},
                    cwd=str(tmp_path)).returncode == 0
    assert not any(p.name.endswith("-cache") for p in framework.iterdir())


def test_a_pointer_to_a_directory_others_can_write_is_not_followed(venv: Venv, tmp_path: Path) -> None:
    """`moved.json` names a directory `explain` reads and `status` shows: one others can write is
    never followed, and who moved it is shown printable."""
    ours = tmp_path / "ours"
    env = {"GKX_JAX_CACHE_DIR": str(ours)}
    assert venv.run("-c", "import jax", env=env).returncode == 0
    meta = next(ours.glob("jax-*")) / ".gkx-autocache"
    meta.mkdir(exist_ok=True)
    for mode, followed in ((0o777, False), (0o700, True)):
        target = tmp_path / f"target-{mode:o}"
        target.mkdir()
        target.chmod(mode)
        (meta / "moved.json").write_text(json.dumps({"dir": str(target), "by": "x\n  FAKE \x1b[31m", "t": time.time()}))
        status = venv.cli("status", env=env).stdout
        assert (f"JAX's directory is {target}" in status) == followed, status
        assert "\x1b" not in status and "\n  FAKE" not in status, status
