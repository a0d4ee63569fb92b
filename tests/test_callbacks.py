"""Host callbacks (jax.debug.print, pure_callback, io_callback, equinox's error checks) cached on
every line that can be made correct: JAX 0.8.1 to 0.10.2 through the package, 0.11 and later by JAX
itself (docs/jax-lines.md). A warm run serves the function and runs the process's own callbacks
as a cold one does: the same prints in the same order, the same side effects, the same errors,
under ``-W error``. Lines that cannot (0.4.30, 0.6.2) are in test_jax_lines.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import COUNTING, Venv
from test_jax_seams import FAKE, with_parameter

HEADER = r"""
import json, os, sys, threading
import jax, jax.numpy as jnp
from jax.experimental import io_callback
""" + COUNTING

# Several callbacks in one function, in a scan and a while_loop body, an ordered io_callback with a
# side effect, a pure_callback under vmap; every line it prints is compared.
MANY = HEADER + r"""
effects = []
def record(v):
    effects.append(float(v.sum()))
    return v * 2
@jax.jit
def f(x):
    jax.debug.print("sum {s}", s=x.sum())
    y = jax.pure_callback(lambda v: v * 3, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    z = io_callback(record, jax.ShapeDtypeStruct(x.shape, x.dtype), x, ordered=True)
    def body(c, _):
        jax.debug.print("scan {c}", c=c)
        return c + 1, c
    c, _ = jax.lax.scan(body, 0, None, length=3)
    def step(k):
        jax.debug.print("loop {k}", k=k)
        return k + 1
    k = jax.lax.while_loop(lambda k: k < 2, step, 0)
    return y + z + c + k
first = f(jnp.arange(3.0))
second = f(jnp.arange(3.0) + 1)
batched = jax.jit(jax.vmap(lambda v: jax.pure_callback(lambda a: a + 1, jax.ShapeDtypeStruct(v.shape, v.dtype), v,
                                                        vmap_method="sequential")))(jnp.ones((2, 3)))
print(json.dumps({**counts, "first": first.tolist(), "second": second.tolist(), "batched": batched.tolist(),
                  "effects": effects}))
"""

# The callbacks are the process's own: the same jitted code, behind it a format string and a
# function body that differ between runs (argv), and two functions that share one callback.
OWN = HEADER + r"""
label, factor = sys.argv[1], float(sys.argv[2])
def scale(v):
    return v * factor
@jax.jit
def f(x):
    jax.debug.print(label + " {x}", x=x.sum())
    return jax.pure_callback(scale, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
@jax.jit
def g(x):
    return jax.pure_callback(scale, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + 1
@jax.jit
def h(x):  # the same computation as f, another format string
    jax.debug.print("other " + label + " {x}", x=x.sum())
    return jax.pure_callback(scale, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
x = jnp.arange(4.0)
out = {"f": f(x).tolist(), "g": g(x).tolist(), "h": h(x).tolist()}
print(json.dumps({**counts, **out}))
"""

# An exception raised in a callback reaches the caller, as without the cache.
RAISING = HEADER + r"""
def check(v):
    if float(v.sum()) > 10:
        raise ValueError(f"too large: {float(v.sum())}")
    return v
@jax.jit
def f(x):
    return jax.pure_callback(check, jax.ShapeDtypeStruct(x.shape, x.dtype), x) * 2
said = [f(jnp.ones(3)).tolist()]
try:
    f(jnp.ones(3) * 5).block_until_ready()
except Exception as exc:
    said.append(f"{type(exc).__name__}: {'too large: 15.0' in str(exc)}")
try:
    import equinox as eqx
except ImportError:
    eqx = None
if eqx is not None:
    @jax.jit
    def positive(x):
        return eqx.error_if(x, x < 0, "negative input").sum()
    said.append(float(positive(jnp.ones(3))))
    try:
        positive(-jnp.ones(3)).block_until_ready()
    except Exception as exc:
        said.append(f"{type(exc).__name__}: {'negative input' in str(exc)}")
print(json.dumps({**counts, "said": said}))
"""

# Called from two threads at once, then the process forks (JAX cannot run in the child: it only
# exits), and the parent's callbacks still run.
THREADS = HEADER + r"""
seen = []
def note(v):
    seen.append(float(v.sum()))
    return v
@jax.jit
def f(x):
    return jax.pure_callback(note, jax.ShapeDtypeStruct(x.shape, x.dtype), x) + 1
results = {}
def call(i):
    results[i] = f(jnp.ones(4) * i).tolist()
threads = [threading.Thread(target=call, args=(i,)) for i in (1, 2)]
for t in threads: t.start()
for t in threads: t.join()
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
after = f(jnp.ones(4) * 3).tolist()
print(json.dumps({**counts, "results": [results[1], results[2]], "after": after, "seen": sorted(seen)}))
"""


def run(venv: Venv, program: str, env: dict[str, str], *args: str, flags: tuple[str, ...] = ("-W", "error")
        ) -> tuple[dict[str, Any], list[str], str]:
    """The program's JSON line, the lines it printed before it, and its stderr."""
    proc = venv.run(*flags, "-c", program, *args, env=env)
    assert proc.returncode == 0, proc.stderr
    *printed, last = proc.stdout.strip().splitlines()
    return json.loads(last), printed, proc.stderr


def three(venv: Venv, tmp_path: Path, program: str, *args: str, flags: tuple[str, ...] = ("-W", "error")
          ) -> list[tuple[dict[str, Any], list[str], str]]:
    """The program with the package off, cold, then warm."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "cache"), "GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    return [run(venv, program, {**env, "GKX_JAX_CACHE": "0"}, *args, flags=flags),
            run(venv, program, env, *args, flags=flags), run(venv, program, env, *args, flags=flags)]


def skip_where_jax_writes_callbacks(venv: Venv) -> None:
    probe = venv.run("-c", "import jax; from gkx_autocache._jax import versions; from jax._src import compiler; "
                           "print('host_callbacks' in versions.parameters(compiler._cache_write))", check=True)
    if probe.stdout.strip() != "True":
        pytest.skip("this JAX writes host callbacks itself (0.11 and later): no seam of the package's to lose")


def results(counts: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in counts.items() if k not in ("requests", "hits")}


def test_a_warm_run_serves_host_callbacks_and_runs_them_as_a_cold_one(venv: Venv, tmp_path: Path) -> None:
    """Several callbacks in one function, in scan and while_loop bodies, an ordered io_callback's
    side effects, vmap: every compile served warm, every line printed the same, in order."""
    off, cold, warm = three(venv, tmp_path, MANY)
    assert off[1] == cold[1] == warm[1] and "sum 3.0" in off[1] and "loop 1" in off[1], (off[1], warm[1])
    assert results(off[0]) == results(cold[0]) == results(warm[0]), (off[0], warm[0])
    assert off[0]["effects"] == [3.0, 6.0]
    assert warm[0]["requests"] > 0 and warm[0]["hits"] == warm[0]["requests"], warm  # 79a6036: f and the vmap missed
    for _, _, err in (cold, warm):
        assert "gkx-autocache" not in err and "Traceback" not in err, err


def test_the_callbacks_are_the_processs_own_not_the_writers(venv: Venv, tmp_path: Path) -> None:
    """The entry holds the compiled code, not the callbacks: a warm run with another format string
    and another function body behind the same jitted code runs its own; two functions of one
    computation each print their own; one callback shared by two functions."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "cache"), "GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    cold, cold_printed, _ = run(venv, OWN, env, "first", "2")
    warm, warm_printed, _ = run(venv, OWN, env, "second", "5")
    off, off_printed, _ = run(venv, OWN, {**env, "GKX_JAX_CACHE": "0"}, "second", "5")
    assert cold_printed == ["first 6.0", "other first 6.0"], cold_printed
    assert warm_printed == off_printed == ["second 6.0", "other second 6.0"], warm_printed
    assert results(warm) == results(off) == {"f": [0.0, 5.0, 10.0, 15.0], "g": [1.0, 6.0, 11.0, 16.0],
                                             "h": [0.0, 5.0, 10.0, 15.0]}, warm
    assert warm["requests"] > 0 and warm["hits"] == warm["requests"], warm


def test_an_exception_raised_in_a_callback_reaches_the_caller_on_a_warm_run(venv: Venv, tmp_path: Path) -> None:
    """A callback that raises, and equinox's error_if (every diffrax solve has one): the warm run
    raises what the cold one and the run without the package raise, and serves the functions."""
    off, cold, warm = three(venv, tmp_path, RAISING)
    assert results(off[0]) == results(cold[0]) == results(warm[0]), (off[0], warm[0])
    said = off[0]["said"]
    assert len(said) == 4 and said[0] == [2.0, 2.0, 2.0] and said[2] == 3.0, said  # equinox is a test dependency
    assert said[1].endswith(": True") and said[3].endswith(": True"), said  # each error, with its message
    assert warm[0]["requests"] > 0 and warm[0]["hits"] == warm[0]["requests"], warm


def test_callbacks_from_two_threads_and_after_a_fork(venv: Venv, tmp_path: Path) -> None:
    """Compiled and loaded from two threads at once (each compile hands its own callbacks), then a
    fork: the parent's loaded executable still calls its callbacks."""
    off, cold, warm = three(venv, tmp_path, THREADS, flags=())
    assert results(off[0]) == results(cold[0]) == results(warm[0]), (off[0], warm[0])
    assert off[0]["seen"] == [4.0, 8.0, 12.0] and off[0]["after"] == [4.0] * 4, off[0]
    assert warm[0]["requests"] > 0 and warm[0]["hits"] == warm[0]["requests"], warm


XDIST_TESTS = r"""
import jax, jax.numpy as jnp, pytest

@pytest.mark.parametrize("n", range(4))
def test_prints(n, capfd):
    @jax.jit
    def f(x):
        jax.debug.print("value {v}", v=x.sum())
        return jax.pure_callback(lambda v: v + n, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    assert f(jnp.ones(2)).tolist() == [1.0 + n] * 2
    assert "value 2.0" in capfd.readouterr().out
"""


def test_pytest_xdist_workers_serve_callbacks(venv: Venv, tmp_path: Path) -> None:
    """Two xdist workers, twice: the second session's compiles are served (the package's summary
    line says how many hits and misses), and every test's callback ran in its own worker."""
    (tmp_path / "test_cb.py").write_text(XDIST_TESTS)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "cache"), "GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    lines = []
    for _ in range(2):
        proc = venv.run("-W", "error", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", str(tmp_path / "test_cb.py"),
                        env=env, cwd=str(tmp_path))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "4 passed" in proc.stdout, proc.stdout
        lines += [line for line in proc.stdout.splitlines() if line.startswith("gkx-autocache:")]
    assert len(lines) == 2 and " 0 misses" in lines[1] and "not cached" not in lines[1], lines


def test_a_jax_whose_compile_seam_changed_leaves_callbacks_uncached_and_says_why(venv: Venv, tmp_path: Path) -> None:
    """A later JAX whose compile seam has another shape: callbacks run as without the package,
    their compile is not cached, and status, explain and stats say why, and what it costs; the
    fix names equinox's own switch when equinox put them there."""
    skip_where_jax_writes_callbacks(venv)
    program = (f"MODULE = 'compiler'\nRENAME = None\n{with_parameter('compile_or_get_cached', 'options', 1)}\n"
               f"{FAKE}\n{RAISING}")
    off, cold, warm = three(venv, tmp_path, program)
    assert results(off[0]) == results(cold[0]) == results(warm[0]), (off[0], warm[0])
    assert warm[0]["hits"] < warm[0]["requests"], warm  # the callbacks' compiles: not cached, as JAX would
    # A directory where a process that hands callbacks back wrote them: this one never loads them.
    mixed = {"GKX_JAX_CACHE_DIR": str(tmp_path / "mixed"), "GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    run(venv, RAISING, mixed)
    handed, _, _ = run(venv, program, mixed)  # before the key's own part for them: a segfault (exit -11)
    assert results(handed) == results(off[0]), handed
    # The rest of the package is whole: a shared level still gets this run's entries at exit.
    (tmp_path / "shared").mkdir()
    shared = {"GKX_JAX_CACHE_DIR": str(tmp_path / "other"), "GKX_JAX_CACHE_SHARED": str(tmp_path / "shared"),
              "GKX_JAX_CACHE_REPORT": "1"}
    _, _, err = run(venv, program, shared)
    assert " uploaded to " in err, err
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "cache")}
    status = json.loads(venv.cli("--json", "status", env=env).stdout)
    assert status["features"]["host callbacks"] == "jax._src.compiler.compile_or_get_cached has changed", status
    assert status["stats"]["not_cached_by_reason"] == {"host callbacks": 4}, status["stats"]
    assert status["stats"]["not_cached_secs"] > 0, status["stats"]
    explain = venv.cli("explain", env=env).stdout
    assert "jax._src.compiler.compile_or_get_cached has changed" in explain, explain
    assert "equinox's runtime checks" in explain and "EQX_ON_ERROR=nan" in explain, explain
    assert "upgrade JAX" not in explain and "report it" in explain, explain  # this JAX is new enough: its seam changed
    assert "1 host callback (jax.debug.print" not in explain and "1 host callback of" in explain, explain
    stats = venv.cli("stats", env=env).stdout
    assert "4 not cached (" in stats and "compile, paid again every run)" in stats, stats
    assert "jit_f  (not cached: compiled on every run)" in stats, stats


def test_the_diffrax_shape_of_error_check_is_named_by_its_library() -> None:
    """What names the library behind a callback: equinox's checks, the user's own module, JAX's print."""
    code = r"""
import jax, jax.numpy as jnp, equinox as eqx
from gkx_autocache._jax import callbacks as jax_callbacks, versions as jax_versions
def user_callback(v):
    return v
found = {}
for name, fn in {"equinox": lambda x: eqx.error_if(x, x < 0, "no"),
                 "__main__": lambda x: jax.pure_callback(user_callback, jax.ShapeDtypeStruct(x.shape, x.dtype), x),
                 "jax": lambda x: (jax.debug.print("{x}", x=x), x)[1]}.items():
    lowered = jax.jit(fn).lower(jnp.ones(2))
    callbacks = lowered._lowering.compile_args["host_callbacks"]
    found[name] = jax_callbacks.callbacks_by(callbacks)
print(found)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"GKX_JAX_CACHE": "0", "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "{'equinox': 'equinox', '__main__': '__main__', 'jax': 'jax'}", proc.stdout


UNMARKED = HEADER.replace("import jax, jax.numpy as jnp\n", "import jax, jax.numpy as jnp\nimport jax._src.cache_key as ck\nck.custom_hook = lambda: ''\n") + r"""
@jax.jit
def f(x):
    jax.debug.print("sum {s}", s=x.sum())
    return jax.pure_callback(lambda v: v * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
out = f(jnp.arange(3.0)).tolist()
print(json.dumps({**counts, "out": out}))
"""


def test_a_compile_whose_key_lacks_the_callbacks_part_is_not_written(venv: Venv, tmp_path: Path) -> None:
    """The user's code replaced the key's hook, and the seam on the key's parts has changed: nothing
    adds the package's part to the key, so a process that would not hand callbacks back could load
    the entry (and crash). Such a compile is left uncached; the run is as without the package."""
    skip_where_jax_writes_callbacks(venv)
    program = (f"MODULE = 'cache_key'\nRENAME = None\n{with_parameter('_log_cache_key_hash', 'depth', 3)}\n"
               f"{FAKE}\n{UNMARKED}")
    off, cold, warm = three(venv, tmp_path, program)
    assert off[1] == cold[1] == warm[1] == ["sum 3.0"] and results(off[0]) == results(warm[0]), (off, warm)
    assert warm[0]["hits"] < warm[0]["requests"], warm  # before: written under a key anyone computes
