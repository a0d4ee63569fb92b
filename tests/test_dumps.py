"""An XLA dump is never lost to a hit (SPEC §7, amended 2026-12-04; issue 45): JAX leaves the dump
flags out of its key, so a warm run hits and XLA, never run, dumps nothing. Where one is asked for,
the process reads no entry, still writes, and says so once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import Venv, autocache_warnings, run_program

from gkx_autocache._unread import dump_asked


def _dumped(folder: Path) -> set[str]:
    """The dump's files, less XLA's module numbers (which count every module the process compiled)."""
    return {re.sub(r"^module_\d+\.", "", p.name) for p in folder.iterdir()}


def test_a_warm_run_that_asks_for_a_dump_dumps_what_an_uncached_run_dumps(venv: Venv, tmp_path: Path) -> None:
    """On 79a6036 the dump of a warm run held 0 of the jitted functions' files: each was a hit."""
    cache = {"GKX_JAX_CACHE_DIR": str(tmp_path / "cache"), "GKX_JAX_CACHE_REPORT": "1"}
    cold, _ = run_program(venv, env=cache)
    assert cold["hits"] == 0 and cold["requests"] > 0
    dumping, stderr = run_program(venv, env={**cache, "XLA_FLAGS": f"--xla_dump_to={tmp_path / 'warm'}"})
    assert dumping["hits"] == 0 and dumping["result"] == cold["result"], stderr
    said = [w for w in autocache_warnings(stderr) if "AutocacheWarning" in w]
    assert len(said) == 1 and "asks for an XLA dump" in said[0] and "reads no cache entry" in said[0], stderr
    assert f"{dumping['requests']} not read: XLA dump" in stderr, stderr  # the report line's cause
    run_program(venv, env={"GKX_JAX_CACHE": "0", "JAX_ENABLE_COMPILATION_CACHE": "false",
                           "XLA_FLAGS": f"--xla_dump_to={tmp_path / 'plain'}"})
    plain = _dumped(tmp_path / "plain")
    assert any(name.startswith("jit_f.") for name in plain), sorted(plain)
    assert _dumped(tmp_path / "warm") == plain
    warm, stderr = run_program(venv, env=cache)  # the flag gone: served as before
    assert warm["hits"] == warm["requests"] > 0, stderr
    explained = venv.cli("explain", env=cache)
    assert "not read: XLA dump" in explained.stdout and "--xla_dump_to" in explained.stdout, explained.stdout


@pytest.mark.parametrize(("env", "argv", "asked"), [
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=2 --xla_dump_to=/tmp/d"}, [], "XLA_FLAGS --xla_dump_to=/tmp/d"),
    ({"XLA_FLAGS": "--xla_dump_hlo_as_text"}, [], "XLA_FLAGS --xla_dump_hlo_as_text"),  # to stdout
    ({"XLA_FLAGS": "--xla_dump_hlo_as_text=false --xla_dump_to="}, [], None),
    ({"LIBTPU_INIT_ARGS": "--xla_dump_hlo_pass_re=.*"}, [], "LIBTPU_INIT_ARGS --xla_dump_hlo_pass_re=.*"),
    ({}, ["--xla_dump_to=/tmp/d"], "the command line --xla_dump_to=/tmp/d"),
    ({"XLA_FLAGS": "--xla_dump_max_hlo_modules=3"}, ["--dump"], None),  # a modifier alone dumps nothing
    ({"JAX_DUMP_IR_TO": "/tmp/ir"}, [], None),  # JAX's IR dumps come before the lookup: a hit loses none
])
def test_which_flags_ask_for_a_dump(env: dict[str, str], argv: list[str], asked: str | None) -> None:
    assert dump_asked(env, ["train.py", *argv]) == asked


LATE = r"""
import os, sys
import jax, jax.numpy as jnp
os.environ["XLA_FLAGS"] = "--xla_dump_to=" + sys.argv[1]  # after import jax: XLA reads it when its backend starts

@jax.jit
def f(x):
    return jnp.tanh(x @ x.T).sum(axis=0) * 3.0

print(float(f(jnp.ones((8, 8))).sum()))
"""


def test_a_dump_asked_for_after_import_jax_is_not_lost(venv: Venv, tmp_path: Path) -> None:
    """XLA reads XLA_FLAGS when its backend starts, which a program may set after `import jax`: the
    flag is read at the first lookup (a review found such a warm run dumping 6 files of 33)."""
    (tmp_path / "late.py").write_text(LATE)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "cache")}
    assert venv.run(str(tmp_path / "late.py"), str(tmp_path / "cold"), env=env).returncode == 0
    warm = venv.run(str(tmp_path / "late.py"), str(tmp_path / "warm"), env=env)
    assert warm.returncode == 0 and "asks for an XLA dump" in warm.stderr, warm.stderr
    assert _dumped(tmp_path / "warm") == _dumped(tmp_path / "cold")
