"""The pytest plugin (SPEC §6's `report`, for test suites): one line per session with the totals of
every pytest-xdist worker, in a real JAX test project run in a venv built from the wheel."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from conftest import Venv, make_venv, public_tmp

pytestmark = pytest.mark.every_python  # pytest's plugin hooks and xdist, as each Python runs them

TESTS = '''
import jax, jax.numpy as jnp, pytest

x = jnp.linspace(0.0, 1.0, 64).reshape(8, 8)

@pytest.mark.parametrize("scale", [1.0, 2.0, 3.0])
def test_tanh(scale):
    assert float(jax.jit(lambda v: jnp.tanh(v @ v.T * scale).sum())(x)) > 0

def test_cumsum():
    assert float(jax.jit(lambda v: jnp.cumsum(jnp.sin(v) ** 2).sum())(x.ravel())) > 0

def test_grad():
    assert float(jax.jit(jax.grad(lambda v: (v ** 3).sum()))(x).sum()) > 0

@pytest.mark.xfail(strict=True)
def test_expected_failure():
    assert float(jax.jit(lambda v: v.max())(x)) > 2

@pytest.mark.skip(reason="not here")
def test_skipped():
    pass
'''

INI = "[pytest]\nfilterwarnings =\n    error\naddopts = -p xdist\n"


def project(base: Path) -> Path:
    proj = base / "proj"
    proj.mkdir()
    (proj / "test_model.py").write_text(TESTS)
    (proj / "pytest.ini").write_text(INI)
    return proj


def session(venv: Venv, proj: Path, env: dict[str, str], *extra: str) -> tuple[str, list[str], str]:
    """Run the project's suite: (pytest's outcome line, the gkx-autocache lines, all output)."""
    proc = venv.run("-X", "dev", "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", *extra, str(proj), env=env,
                    cwd=str(proj), timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    outcome = [ln for ln in proc.stdout.splitlines() if re.search(r"\d+ passed", ln)][-1]
    return re.sub(r" in [\d.]+s.*", "", outcome.strip("= ")), [ln for ln in output.splitlines() if ln.startswith("gkx-autocache:")], output


def counts(line: str) -> tuple[int, int]:
    match = re.search(r"gkx-autocache: (\d+) hits?\b.*?, (\d+) miss(?:es)?\b", line)
    assert match, line
    return int(match[1]), int(match[2])


def test_one_line_per_session_with_every_workers_totals(venv: Venv, tmp_path: Path) -> None:
    """Two sessions with `-n 2` and `-W error`-style filters: exactly one gkx-autocache line each
    (no worker's `report` line), its totals those of the workers' ledgers, the warm session all
    hits, no ResourceWarning, and the same outcomes as without the package."""
    proj = project(tmp_path)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_REPORT": "1"}
    cold_outcome, cold_lines, output = session(venv, proj, env)
    assert len(cold_lines) == 1 and "ResourceWarning" not in output, output
    cold_hits, cold_misses = counts(cold_lines[0])
    assert cold_misses > 0
    assert venv.cli("stats", "--reset", env=env).returncode == 0
    warm_outcome, warm_lines, output = session(venv, proj, env)
    assert len(warm_lines) == 1 and "ResourceWarning" not in output, output
    hits, misses = counts(warm_lines[0])
    assert misses == 0 and hits >= cold_misses, warm_lines
    assert "from earlier runs" not in warm_lines[0] or ", 0 of this run's own" not in warm_lines[0]
    stats = json.loads(venv.cli("--json", "stats", env=env).stdout)["stats"]  # the two workers' ledgers
    assert (stats["hits"], stats["misses"]) == (hits, misses), (stats, warm_lines)
    assert warm_outcome == cold_outcome and "1 skipped" in warm_outcome and "1 xfailed" in warm_outcome

    base = public_tmp()
    try:
        without = make_venv(base, None, without=("gkx_autocache",))  # not even its metadata
        plain_outcome, plain_lines, _ = session(without, proj, env)
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
    assert plain_outcome == cold_outcome and plain_lines == []


@pytest.mark.line  # pytest's own `-p no:`, not the interpreter (the plugin's hooks run in the tests beside it)
def test_the_plugin_can_be_turned_off(venv: Venv, tmp_path: Path) -> None:
    """`-p no:gkx_autocache`: no summary line; each worker's own `report` line again."""
    proj = project(tmp_path)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_REPORT": "1"}
    proc = venv.run("-m", "pytest", "-n", "2", "-p", "no:gkx_autocache", "-p", "no:cacheprovider", "-s", str(proj),
                    env=env, cwd=str(proj), timeout=600)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("gkx-autocache:")]
    assert proc.returncode == 0 and len(lines) == 2, proc.stdout + proc.stderr  # each worker's own


@pytest.mark.line  # the spellings of the CI setting, not the interpreter: each JAX line's first Python
def test_ci_false_is_not_ci(venv: Venv, tmp_path: Path) -> None:
    """`CI=false` is not CI: no "the cache was cold" line; `CI=true` on a cold cache: one."""
    proj = project(tmp_path)
    for value, expected in (("false", 1), ("true", 2)):
        env = {"GKX_JAX_CACHE_DIR": str(tmp_path / f"c-{value}"), "CI": value}
        _, lines, _ = session(venv, proj, env)
        assert len(lines) == expected and ("cold" in lines[-1]) == (expected == 2), lines


def test_pytest_without_xdist(venv: Venv, tmp_path: Path) -> None:
    """Where pytest-xdist is not loaded (not installed, `-p no:xdist`, plugin autoload off), pytest
    runs as before: the plugin's xdist-only hook is optional. One summary line, for this process."""
    proj = project(tmp_path)
    (proj / "pytest.ini").write_text("[pytest]\nfilterwarnings =\n    error\n")
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_REPORT": "1"}
    for extra in (["-p", "no:xdist"], []):
        env_run = {**env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"} if not extra else env
        loads = ["-p", "gkx_autocache"] if not extra else []  # with autoload off, by its entry point's name
        proc = venv.run("-X", "dev", "-m", "pytest", "-p", "no:cacheprovider", *extra, *loads, str(proj),
                        env=env_run, cwd=str(proj), timeout=600)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0 and "INTERNALERROR" not in output, output
        assert "5 passed, 1 skipped, 1 xfailed" in output, output
        assert len([ln for ln in output.splitlines() if ln.startswith("gkx-autocache:")]) == 1, output


TWICE = r"""
import sys, pytest, jax, jax.numpy as jnp
print("before", float(jax.jit(lambda v: (v * 5).sum())(jnp.ones(2))))
for _ in range(2):
    assert pytest.main(["-q", "-p", "no:cacheprovider", sys.argv[1]]) == 0
print("after", float(jax.jit(lambda v: (v * 3).sum())(jnp.ones(3))))
"""

NESTED = r"""
import jax, jax.numpy as jnp
pytest_plugins = ["pytester"]

def test_outer(pytester):
    assert float(jax.jit(lambda v: (v - 1).sum())(jnp.ones(4))) == 0
    pytester.makepyfile("def test_inner():\n    assert True\n")
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("gkx-autocache*")
"""


INNER_ONLY = r"""
pytest_plugins = ["pytester"]

def test_outer(pytester):
    pytester.makepyfile("import jax\ndef test_inner():\n    assert float(jax.jit(lambda v: v * 2)(2.0)) == 4\n")
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
"""


def test_sessions_in_one_process_each_count_their_own(venv: Venv, tmp_path: Path) -> None:
    """pytest.main() twice in one process (ipytest does so in a notebook): each session's line counts
    that session only (the second: hits of the first's entries, from an earlier run, no miss), and
    the `report` line at exit counts what no session did (compiles before and after them): the
    three add up to the process's ledger. A session inside another (pytester) prints no line of
    its own. --collect-only prints no line; under -p no:terminal the process prints its `report`
    line instead."""
    proj = project(tmp_path)
    (proj / "pytest.ini").write_text("[pytest]\nfilterwarnings =\n    error\n")
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_REPORT": "1"}
    (tmp_path / "twice.py").write_text(TWICE)
    proc = venv.run("-X", "dev", str(tmp_path / "twice.py"), str(proj), env=env, cwd=str(proj), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first, second = (ln for ln in proc.stdout.splitlines() if ln.startswith("gkx-autocache:"))
    hits, misses = counts(first)
    assert misses > 0 and hits < misses, first
    assert 0 < counts(second)[0] <= misses and counts(second)[1] == 0 and "of this run's own" not in second, second
    (report,) = (ln for ln in proc.stderr.splitlines() if ln.startswith("gkx-autocache:"))
    stats = json.loads(venv.cli("--json", "stats", env=env).stdout)["stats"]
    parts = [counts(first), counts(second), counts(report)]
    total = (sum(h for h, _ in parts), sum(m for _, m in parts))
    assert counts(report)[1] > 0 and (stats["hits"], stats["misses"]) == total, (parts, stats)

    (proj / "test_nested.py").write_text(NESTED)
    proc = venv.run("-m", "pytest", "-q", "-p", "no:cacheprovider", "test_nested.py", env=env, cwd=str(proj), timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert len([ln for ln in output.splitlines() if ln.startswith("gkx-autocache:")]) == 1, output

    # Only the inner session imports jax, and pytester takes its modules out of sys.modules after:
    # the outer session's line still counts its compiles.
    (proj / "test_nested.py").write_text(INNER_ONLY)
    proc = venv.run("-m", "pytest", "-q", "-p", "no:cacheprovider", "test_nested.py", env=env, cwd=str(proj), timeout=600)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("gkx-autocache:")]
    assert proc.returncode == 0 and len(lines) == 1 and counts(lines[0])[1] > 0, proc.stdout + proc.stderr

    lazy = tmp_path / "lazy"  # imports jax, compiles only when a test runs
    lazy.mkdir()
    (lazy / "test_lazy.py").write_text("import jax\n\ndef test_one():\n    assert jax.jit(lambda v: v + 1)(1) == 2\n")
    proc = venv.run("-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", env=env, cwd=str(lazy), timeout=600)
    assert proc.returncode == 0 and "gkx-autocache" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    for workers in ([], ["-n", "2"]):  # each process's `report` line: the one process, or each worker
        proc = venv.run("-m", "pytest", "-p", "no:terminal", "-p", "no:cacheprovider", *workers, "test_model.py",
                        env=env, cwd=str(proj), timeout=600)
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("gkx-autocache:")]
        assert proc.returncode == 0 and len(lines) == (2 if workers else 1), proc.stdout + proc.stderr


def test_a_refused_cache_is_said_under_filterwarnings_error(venv: Venv, tmp_path: Path) -> None:
    """With `filterwarnings = error` the package's warning cannot be a warning (it would fail the
    import): the summary says it instead, once, from the workers too, so that CI does not run
    uncached unseen."""
    proj = project(tmp_path)
    (tmp_path / "file").write_text("x")
    bad = tmp_path / "file" / "cache"
    env = {"GKX_JAX_CACHE_DIR": str(bad)}
    for extra in (["-n", "2"], ["-p", "no:xdist"]):
        proc = venv.run("-m", "pytest", "-p", "no:cacheprovider", *extra, str(proj), env=env, cwd=str(proj), timeout=600)
        output = proc.stdout + proc.stderr
        lines = [ln for ln in output.splitlines() if ln.startswith("gkx-autocache:")]
        assert proc.returncode == 0 and "5 passed" in output, output
        assert len(lines) == 1 and str(bad) in lines[0] and "GKX_JAX_CACHE_DIR" in lines[0], output
