"""SPEC §16: the package on JAX lines older than the one the suite runs on, each in its own virtual
environment built from that line's pinned wheels (the index, or uv's cache): the oldest supported
line and lines across the seams' changes (docs/jax-lines.md): 0.4.30 (7 key parts, no
`enable_xla_caches`), 0.6.2 (`executable_devices`, 8 parts), 0.9.0 (the last line without
`VerificationCache`). A real program, cold, warm under `-W error`, a changed `XLA_FLAGS`, a cap,
`status`; every figure the package's own, against the same program with the package off. The
whole table of lines: `python benchmarks/jax_lines.py`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import COUNTING, Venv, clean_env, load_benchmark, public_tmp

pytestmark = pytest.mark.once  # the lines' own wheels, whatever JAX the runner has: on the first Python only

LINES = ("0.4.30", "0.6.2", "0.9.0")
PROGRAM = r"""
import json, sys
import jax, jax.numpy as jnp
""" + COUNTING + r"""
x = jnp.ones((16, 16))
steps = [jax.jit(lambda v, i=i: jnp.sin(v) * i + jnp.cos(v @ v.T).sum()) for i in range(int(sys.argv[1]))]
result = sum(float(f(x).sum()) for f in steps)
print(json.dumps({**counts, "result": result, "dir": jax.config.jax_compilation_cache_dir}))
"""


_benchmark = load_benchmark("jax_lines")
# Whether a compile with host callbacks is cached on each line, or why not (docs/jax-lines.md).
CALLBACKS = {"0.4.30": "JAX 0.4.30 compiles each host callback's address into the executable, which no other process "
                       "can call: cached from JAX 0.8.1",
             "0.6.2": "jaxlib 0.6.2 cannot give a loaded executable its host callbacks: cached from JAX 0.8.1",
             "0.9.0": None}
CALLING: str = _benchmark.CALLING  # the program benchmarks/jax_lines.py runs for its callbacks column


def version(line: Venv) -> str:
    return line.run("-c", "import jax; print(jax.__version__)", check=True).stdout.strip()


@pytest.fixture(scope="module", params=LINES)
def line(request: pytest.FixtureRequest, wheel: Path) -> Iterator[Venv]:
    """A venv with JAX and jaxlib of one line, and the package's wheel, with bytecode (as pip installs):
    the test processes write none (PYTHONDONTWRITEBYTECODE), and without it each of the line's dozen
    or so processes compiled JAX's source at its `import jax` (9-14 s each on 2 loaded cores, 2 s with).
    ml_dtypes below 0.7 on Python 3.11, as .ci/run holds it: with NumPy 2.4, 0.7.0 adds 0.9 s of CPU
    to every `import jax`."""
    version = request.param
    base = public_tmp()
    try:
        path = base / "venv"
        subprocess.run([sys.executable, "-m", "uv", "venv", "-q", "--python", sys.executable, str(path)], check=True,
                       capture_output=True)
        install = subprocess.run([sys.executable, "-m", "uv", "pip", "install", "-q", "--compile-bytecode", "--python", str(path / "bin" / "python"),
                                  f"jax=={version}", f"jaxlib=={version}", 'ml_dtypes<0.7; python_version < "3.12"', str(wheel)], capture_output=True, text=True)
        assert install.returncode == 0, install.stderr
        home = base / "home"
        home.mkdir(mode=0o755)
        yield Venv(path, home, clean_env(HOME=str(home)))
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def run(line: Venv, env: dict[str, str], *flags: str, n: int = 6) -> tuple[dict[str, Any], str]:
    proc = line.run(*flags, "-c", PROGRAM, str(n), env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_each_line_is_served_by_the_store_explained_and_capped(line: Venv, tmp_path: Path) -> None:
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "cache"), "GKX_JAX_CACHE_REPORT": "1"}
    off, _ = run(line, {**env, "GKX_JAX_CACHE": "0"})
    cold, cold_err = run(line, env)
    warm, warm_err = run(line, env, "-W", "error")
    assert "please report" not in cold_err + warm_err, cold_err + warm_err
    assert cold["result"] == warm["result"] == off["result"]
    assert warm["requests"] > 0 and warm["hits"] == warm["requests"], warm
    assert " 0 misses" in warm_err, warm_err
    status = json.loads(line.cli("--json", "status", env=env).stdout)
    assert status["store"]["store"] == "gkx-autocache", status["store"]
    assert not status["attention"], status["attention"]

    # Other flags: a cold start that is not a code change, which rebuild ahead serves (issue 69)
    # but for the key the program reached first; that miss is explained.
    flagged, flags_err = run(line, {**env, "XLA_FLAGS": "--xla_cpu_enable_fast_math=true"})
    fresh, _ = run(line, {**env, "GKX_JAX_CACHE_DIR": str(tmp_path / "fresh"), "XLA_FLAGS": "--xla_cpu_enable_fast_math=true"})
    assert flagged["result"] == fresh["result"] and flagged["hits"] < flagged["requests"], (flagged, fresh)
    explained = json.loads(line.cli("--json", "explain", env=env).stdout)
    causes = {group["cause"] for group in explained["groups"]}
    assert causes == {"changed XLA_FLAGS"}, (causes, flags_err)
    # stats agrees with the directory and with JAX's own counts: every compile written is an entry
    totals = json.loads(line.cli("--json", "stats", env=env).stdout)["stats"]
    (present,) = json.loads(line.cli("--json", "status", env=env).stdout)["versions_present"]
    assert totals["writes"] == present["entries"] == 2 * cold["requests"], (totals, present, cold)
    assert totals["hits"] == warm["hits"] + flagged["hits"] == warm["hits"] + totals["rebuilt_hits"], (totals, warm)
    assert totals["misses"] == cold["requests"] + flagged["requests"] - flagged["hits"], (totals, flagged)
    features = json.loads(line.cli("--json", "--version", env=env).stdout)["features"]
    assert features == {**dict.fromkeys(("store", "cap", "explain", "ISA key", "levels")),
                        "host callbacks": CALLBACKS[version(line)], "rebuild": None}, features

    capped = {**env, "GKX_JAX_CACHE_DIR": str(tmp_path / "capped"), "GKX_JAX_CACHE_MAX_SIZE": "64KiB"}
    _, capped_err = run(line, capped, n=40)
    (present,) = json.loads(line.cli("--json", "status", env=capped).stdout)["versions_present"]
    assert present["bytes"] <= 64 * 1024, (present, capped_err)


def test_host_callbacks_are_cached_where_the_line_can_and_named_where_not(line: Venv, tmp_path: Path) -> None:
    """Issue 44: on 0.9.0 the package writes and loads compiles with host callbacks, and the warm run
    runs its own callbacks (prints, side effects, an error raised); on 0.4.30 and 0.6.2 they stay
    uncached, and `status`, `explain` and the report line say why, by name, with a fix."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "cache"), "GKX_JAX_CACHE_REPORT": "1",
           "GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    outputs = []
    for mode in ({**env, "GKX_JAX_CACHE": "0"}, env, env):
        proc = line.run("-W", "error", "-c", CALLING, env=mode)
        assert proc.returncode == 0 and "please report" not in proc.stderr, proc.stderr  # JAX logs the callback's error
        outputs.append((proc.stdout.strip().splitlines(), proc.stderr))
    (off, _), (cold, _), (warm, warm_err) = outputs
    assert off[:-1] == cold[:-1] == warm[:-1] and off[0] == "sum 3.0", (off, warm)
    results = [{k: v for k, v in json.loads(lines[-1]).items() if k not in ("requests", "hits")} for lines in (off, cold, warm)]
    assert results[0] == results[1] == results[2] == {"said": [[2.0, 2.0, 2.0], True], "effects": [3.0]}, results
    counts = json.loads(warm[-1])
    why = CALLBACKS[version(line)]
    status = json.loads(line.cli("--json", "status", env=env).stdout)
    assert status["features"]["host callbacks"] == why, status["features"]
    if why is None:
        assert counts["hits"] == counts["requests"] and "not cached" not in warm_err, (counts, warm_err)
        return
    assert counts["hits"] < counts["requests"] and "1 not cached (1 host callbacks: " in warm_err, (counts, warm_err)
    explained = line.cli("explain", env=env).stdout
    assert why in explained and "upgrade JAX to 0.8.1 or later" in explained, explained
