"""The store (SPEC §7) with real JAX compiling real programs in fresh processes."""

from __future__ import annotations

import json
import os
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import PROGRAM, InProcess, Venv, autocache_warnings, cache_files, in_a_child_as, run_program
from test_activation import VERSION_DIR

from gkx_autocache._layout import TAG

JAX_READ_ERROR = "Error reading persistent compilation cache entry"


def cache_env(root: Path, **extra: str) -> dict[str, str]:
    return {"GKX_JAX_CACHE_DIR": str(root), **extra}


def test_eight_processes_at_once_then_a_ninth_is_all_hits(venv: Venv, tmp_path: Path) -> None:
    """Eight processes on an empty directory: same results, no read errors; a ninth is all hits."""
    env = {**venv.env, **cache_env(tmp_path / "c")}
    procs = [subprocess.Popen([venv.python, "-c", PROGRAM], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(8)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    results = {json.loads(out.strip().splitlines()[-1])["result"] for out, _ in outs}
    assert len(results) == 1
    assert not any(JAX_READ_ERROR in err for _, err in outs)
    ninth, err = run_program(venv, env=cache_env(tmp_path / "c"))
    assert ninth["hits"] == ninth["requests"] >= 2 and {ninth["result"]} == results
    assert not list((tmp_path / "c" / VERSION_DIR).glob(".*.tmp"))


@pytest.mark.parametrize("damage", ["truncate", "zero", "garbage"])
def test_corrupt_entry_costs_one_recompile_then_hits(venv: Venv, tmp_path: Path, damage: str) -> None:
    """A damaged entry: right result, exactly one recompile, no JAX warning; the next run hits."""
    env = cache_env(tmp_path / "c")
    cold, _ = run_program(venv, env=env)
    victim = cache_files(tmp_path / "c" / VERSION_DIR)[0]
    data = victim.read_bytes()
    victim.write_bytes({"truncate": data[: len(data) // 2], "zero": b"\0" * len(data),
                        "garbage": os.urandom(len(data))}[damage])
    after, err = run_program(venv, env=env)
    assert after["result"] == cold["result"]
    assert after["requests"] - after["hits"] == 1
    assert JAX_READ_ERROR not in err and autocache_warnings(err) == []
    healed, _ = run_program(venv, env=env)
    assert healed["hits"] == healed["requests"]


@pytest.mark.parametrize("flags", [
    {"JAX_COMPILATION_CACHE_CHECK_CONTENTS": "1"},  # JAX's VerificationCache decompresses what get returned
    {"JAX_RAISE_PERSISTENT_CACHE_ERRORS": "1"},  # the loading guard leaves JAX's errors to JAX
    {"GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS": "100"},  # nothing is written back over the bad entry
])
def test_an_entry_that_does_not_decompress_costs_one_recompile_whatever_jax_is_told(
        venv: Venv, tmp_path: Path, flags: dict[str, str]) -> None:
    """Under -W error, with each JAX setting that takes another path than the loading guard: two
    runs over a truncated entry both succeed, and the bad entry is gone or replaced by the first.
    (JAX's check_contents compares each first compile in a process with the entry on disk and
    raises when they differ, by design; some of XLA's CPU executables, reductions among them,
    differ from compile to compile: this program has none.)"""
    program = ("import json, jax, jax.numpy as jnp\n"
               "print(json.dumps({'result': jax.jit(lambda x: jnp.sin(x) * 2.0)(jnp.ones(8)).tolist()}))")
    env = cache_env(tmp_path / "c")
    jax_flags = {k: v for k, v in flags.items() if k.startswith("JAX_")}  # the cold run writes every entry
    cold, _ = run_program(venv, env={**env, **jax_flags}, program=program)
    victim = cache_files(tmp_path / "c" / VERSION_DIR)[0]
    victim.write_bytes(victim.read_bytes()[:40])
    for _ in range(2):
        out, err = run_program(venv, "-W", "error", env={**env, **flags}, program=program)
        assert out["result"] == cold["result"] and JAX_READ_ERROR not in err, err
    assert not victim.exists() or zlib.decompress(victim.read_bytes())


def test_failed_write_leaves_no_partial_entry(here: InProcess, tmp_path: Path) -> None:
    """Under `ulimit -f` writes fail half-way: no partial entry, no temporary file is left."""
    import resource

    vdir = tmp_path / "c" / VERSION_DIR

    def under_ulimit_f_2() -> tuple[int, str]:  # (in a child: the limit is the process's; Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))
        with here.process(cache_env(tmp_path / "c")) as ran:
            for name, size in (("f", 3000), ("g", 3000), ("h", 500), ("k", 500)):  # two above the limit, two below
                ran.jit(name, size=size)
        return ran.jax.requests, ran.stderr

    requests, err = in_a_child_as(0, (), under_ulimit_f_2)
    assert JAX_READ_ERROR not in err and autocache_warnings(err) == [], err
    assert 0 < len(cache_files(vdir)) < requests  # some writes did fail half-way...
    big = [p for p in cache_files(vdir) if p.stat().st_size >= 2048]
    assert big == []  # ...and none left a truncated entry at the limit
    for entry in cache_files(vdir):  # whatever was written is whole
        zlib.decompress(entry.read_bytes())
    assert not list(vdir.glob(".*"))  or [p.name for p in vdir.glob(".*")] == [".gkx-autocache"]


def _give_to_nobody(root: Path, writable: bool) -> None:
    for folder, _dirs, files in os.walk(root):
        os.chown(folder, 65534, 65534)
        os.chmod(folder, 0o700 if writable else 0o500)
        for name in files:
            os.chown(os.path.join(folder, name), 65534, 65534)
            os.chmod(os.path.join(folder, name), 0o400)


def test_read_only_directory_serves_hits_silently(public: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries owned by and readable to a non-root user who cannot write them: hits, no warning."""
    here = InProcess(public, monkeypatch)  # where uid 65534 reaches it
    root = here.home / "ro-cache"
    cold, _ = here.run_program(cache_env(root))
    _give_to_nobody(root, writable=False)
    warm, err = here.run_program(cache_env(root), user=65534)
    assert warm["hits"] == warm["requests"] >= 2 and warm["result"] == cold["result"]
    assert err.strip() == "", err


def test_w_error_with_corrupt_entry_and_unwritable_directory(public: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under -W error: a corrupt entry in a directory the user cannot write, the run still succeeds."""
    here = InProcess(public, monkeypatch)  # where uid 65534 reaches it
    root = here.home / "ro-cache"
    cold, _ = here.run_program(cache_env(root))
    victim = cache_files(root / VERSION_DIR)[0]
    victim.write_bytes(b"garbage" * 10)
    _give_to_nobody(root, writable=False)
    out, err = here.run_program(cache_env(root), w_error=True, user=65534)
    assert out["result"] == cold["result"] and out["requests"] - out["hits"] == 1 and "Traceback" not in err, err


def du(folder: Path) -> int:
    """Bytes on disk, as `du` counts them: allocated blocks, the package's bookkeeping included."""
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def test_max_size_prunes_least_recently_used_at_exit(here: InProcess, tmp_path: Path) -> None:
    """A directory past a small cap is pruned to 90 % of it at exit, oldest first, counting what
    `du` counts (an 8-byte sidecar takes a 4 KiB block), bookkeeping included."""
    vdir = tmp_path / "c" / VERSION_DIR
    vdir.mkdir(parents=True, mode=0o700)
    (tmp_path / "c").chmod(0o700)
    (vdir / "CACHEDIR.TAG").write_text(TAG)
    now = time.time()
    for i in range(10):  # ten old 8 kB entries, the oldest first in name order
        path = vdir / f"jit_old{i}-{i:064x}-cache"
        path.write_bytes(b"\0" * 8000)
        os.utime(path, (now - 10_000 + i, now - 10_000 + i))
    here.run_program(cache_env(tmp_path / "c", GKX_JAX_CACHE_MAX_SIZE="160kB"), tuple("fghkmnpq"), size=6000)
    # (+ the tag; + the index's first block: a run here explains nothing, so the prune's own lines make it)
    assert du(vdir) <= 0.9 * 160_000 + 2 * 4096, du(vdir)
    left = sorted(p.name for p in vdir.iterdir() if p.name.startswith("jit_old"))
    assert left == sorted(left)[-len(left):] and "jit_old9" in " ".join(left) and "jit_old0" not in " ".join(left)
    assert any(p.name.startswith(("jit_f", "jit_g")) for p in cache_files(vdir))  # this run's entries kept


TIMED = PROGRAM.replace(
    "jax.monitoring.register_event_listener(listen)",
    """jax.monitoring.register_event_listener(listen)
durations = {"compile": 0.0, "load": 0.0}
def on_duration(event, secs, *a, **k):
    if event == "/jax/core/compile/backend_compile_duration": durations["compile"] += secs
    elif event == "/jax/compilation_cache/cache_retrieval_time_sec": durations["load"] += secs
jax.monitoring.register_event_duration_secs_listener(on_duration)""",
).replace('print(json.dumps({**counts,', 'print(json.dumps({**counts, **durations,')


def test_time_saved_is_real_for_subsecond_compiles(venv: Venv, tmp_path: Path) -> None:
    """`report` and the ledger show positive time saved on a warm run: the compile CPU time the
    cold run recorded beside each entry (sub-second compiles, which JAX's whole seconds count as 0)
    less the warm run's load time; and that CPU time is of the order of JAX's own compile time
    (not a whole process's: it never exceeds the wall time on the machine's cores)."""
    env = cache_env(tmp_path / "c", GKX_JAX_CACHE_REPORT="1")
    cold, _ = run_program(venv, env=env, program=TIMED)
    warm, err = run_program(venv, env=env, program=TIMED)
    line = [ln for ln in err.splitlines() if ln.startswith("gkx-autocache:")][-1]
    saved = float(line.split(" s compile CPU time avoided")[0].rsplit(",", 1)[1])
    recorded = sum(float(p.read_text().split()[0]) for p in (tmp_path / "c" / VERSION_DIR).glob("*-gkx-compile"))
    assert 0 < cold["compile"] < 1.0 * len(cold) and saved > 0
    assert abs(saved - (recorded - warm["load"])) <= 0.02 + 0.1 * recorded, (saved, recorded, warm["load"], line)
    assert 0.1 * cold["compile"] < recorded <= (os.cpu_count() or 1) * cold["compile"] + 0.05, (recorded, cold)
    proc = venv.cli("--json", "stats", env=env)
    stats = json.loads(proc.stdout)["stats"]
    assert stats["hits"] == warm["hits"] and stats["saved_secs"] > 0


def test_stock_jax_and_the_store_share_a_directory_but_not_cpu_entries(venv: Venv, tmp_path: Path) -> None:
    """Stock JAX and the store read and write one directory side by side (with the same
    key-relevant settings: XLA's extra caches enter the key), but CPU keys hold the ISA with the
    package (SPEC §15): each of stock JAX's entries is compiled once more, said as such, and
    after that both are served their own."""
    vdir = tmp_path / "c" / VERSION_DIR
    stock_env = {"GKX_JAX_CACHE": "0", "JAX_COMPILATION_CACHE_DIR": str(vdir),
                 "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none"}
    run_program(venv, env=stock_env)
    assert not list(vdir.glob("*-gkx-compile"))
    first, _ = run_program(venv, env=cache_env(tmp_path / "c"))
    assert first["hits"] == 0
    causes = {g["cause"] for g in json.loads(venv.cli("--json", "explain", env=cache_env(tmp_path / "c")).stdout)["groups"]}
    assert causes == {"before CPU keying"}, causes
    ours, _ = run_program(venv, env=cache_env(tmp_path / "c"))
    stock, _ = run_program(venv, env=stock_env)
    assert ours["hits"] == ours["requests"] and stock["hits"] == stock["requests"] > 0


GUARD_TRIPPED = "import gkx_autocache._jax.caching as j; j.store_problem = lambda cc: 'simulated: internals changed'\n" + PROGRAM


def test_guard_falls_back_to_jax_stock_cache(venv: Venv, tmp_path: Path) -> None:
    """When JAX's internals are not the expected ones, JAX's stock cache still serves, and the
    verdict is recorded for `status`."""
    env = cache_env(tmp_path / "c")
    cold, _ = run_program(venv, env=env, program=GUARD_TRIPPED)
    vdir = tmp_path / "c" / VERSION_DIR
    assert cache_files(vdir) and not list(vdir.glob("*-gkx-compile"))
    verdict = json.loads((vdir / ".gkx-autocache" / "store.json").read_text())
    assert verdict == {"store": "jax", "reason": "simulated: internals changed", "explain": "simulated: internals changed",
                       "isa": None, "callbacks": "simulated: internals changed", "rebuild": "simulated: internals changed"}
    warm, _ = run_program(venv, env=env, program=GUARD_TRIPPED)
    assert warm["hits"] == warm["requests"]
    status = json.loads(venv.cli("--json", "status", env=env).stdout)
    assert status["store"]["store"] == "jax"


def test_symlinked_entry_is_never_read(here: InProcess, tmp_path: Path) -> None:
    """An entry replaced by a symlink (even to a valid entry) is a miss, and is not followed."""
    env = cache_env(tmp_path / "c")
    here.run_program(env)
    victim = cache_files(tmp_path / "c" / VERSION_DIR)[0]
    good = tmp_path / "elsewhere"
    victim.rename(good)
    victim.symlink_to(good)
    out, err = here.run_program(env)
    assert out["requests"] - out["hits"] == 1 and JAX_READ_ERROR not in err
    assert not victim.is_symlink() and good.exists()  # healed by the atomic rewrite; target untouched


def test_a_jax_before_0_9_1_is_served_by_the_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """JAX 0.4.36-0.9.0 have no `VerificationCache` and no `jax_compilation_cache_check_contents`
    (docs/jax-lines.md): neither is needed unless contents are checked, so the store serves there
    too (it was off, and with it the cap and explanations). Here, this JAX with both taken away."""
    import types

    from jax._src import compilation_cache as cc

    from gkx_autocache._jax import caching as jax_caching

    monkeypatch.delattr(cc, "VerificationCache")
    monkeypatch.setattr(cc, "get_file_cache", cc.get_file_cache)  # put back after the test
    monkeypatch.setattr(cc, "get_executable_and_time", cc.get_executable_and_time)
    old = types.SimpleNamespace(config=types.SimpleNamespace(jax_compilation_cache_max_size=-1))
    made: list[tuple[Any, ...]] = []

    def make(*args: Any) -> str:
        made.append(args)
        return "store"

    reason = jax_caching.serve_file_caches(old, lambda path: (path, "store"), make, lambda key, error: True, lambda path: None)
    assert reason == (None, None)
    served: Any = cc.get_file_cache(str(tmp_path))
    assert served == ("store", str(tmp_path))
    assert made and made[0][:2] == (str(tmp_path), True)


BITS = r"""
import hashlib, jax, jax.numpy as jnp
@jax.jit
def model(w, x):
    for _ in range(4):
        x = jnp.tanh(x @ w) + 0.1 * jnp.sin(x)
    return (x @ x.T).sum(axis=0) / 3.0
w = jax.random.normal(jax.random.key(0), (64, 64), dtype=jnp.float32) / 8
x = jax.random.normal(jax.random.key(1), (32, 64), dtype=jnp.float32)
print(hashlib.sha256(bytes(jax.device_get(model(w, x)).tobytes())).hexdigest())
"""


def test_a_warm_run_gives_the_bits_of_the_cold_one(venv: Venv, tmp_path: Path) -> None:
    """Issue 45: with a warm cache, results are bit-identical from process to process (the
    executable is the same bytes); AlphaFold 3 measured 0.000 A apart with its cache, 0.131 A
    without. On CPU, a cold run, two warm runs and a run without the cache agree to the bit."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_REPORT": "1"}
    digests, lines = [], []
    for extra in ({}, {}, {}, {"GKX_JAX_CACHE": "0"}):
        proc = venv.run("-c", BITS, env={**env, **extra})
        assert proc.returncode == 0, proc.stderr
        digests.append(proc.stdout.split()[-1])
        lines.append(next((ln for ln in proc.stderr.splitlines() if ln.startswith("gkx-autocache:")), ""))
    assert "0 hits" in lines[0] and " 0 misses" in lines[1] and " 0 misses" in lines[2], lines
    assert len(set(digests)) == 1, digests


def test_the_compile_clock_counts_this_thread_and_xlas_not_another_python_threads_work() -> None:
    """What a compile costs is the process's CPU less that of its other Python threads (each read
    from its own CPU clock): another thread busy meanwhile is not counted; this thread's work is."""
    import threading
    import time

    from gkx_autocache._store import compile_clock

    def burn(secs: float) -> None:
        until = time.thread_time() + secs
        while time.thread_time() < until:
            pass

    go, burnt, end = threading.Event(), threading.Event(), threading.Event()

    def busy() -> None:
        go.wait()
        burn(0.4)
        burnt.set()
        end.wait()

    other = threading.Thread(target=busy)
    other.start()
    before = compile_clock()
    go.set()
    burnt.wait()
    others = compile_clock() - before
    end.set()
    other.join()
    before = compile_clock()
    burn(0.4)
    mine = compile_clock() - before
    assert others < 0.1 and mine > 0.3, (others, mine)


def test_a_python_thread_that_ends_during_a_compile_does_not_count_its_work_in_it() -> None:
    """A Python thread that ends while a compile runs (the rebuild's keying thread, a compiling
    thread whose last compile ended before another's): its CPU stays in the process's, so the
    compile would count the whole of it. Only what it spent since it was last read may count."""
    import threading
    import time

    from gkx_autocache._store import compile_clock

    burnt, end = threading.Event(), threading.Event()

    def busy() -> None:
        until = time.thread_time() + 0.4
        while time.thread_time() < until:
            pass
        burnt.set()
        end.wait()

    other = threading.Thread(target=busy)
    other.start()
    burnt.wait()
    before = compile_clock()
    end.set()
    other.join()
    counted = compile_clock() - before
    assert counted < 0.1, counted


def test_the_compile_clock_of_a_child_forked_while_another_thread_read_it() -> None:
    """The readings are kept under a lock: a child forked while another thread held it (a worker
    forked mid-compile) reads its own clock, never waiting on a lock no thread of it will free."""
    import signal

    from gkx_autocache import _store

    _store.compile_clock()
    with _store._THREADS._lock:  # (as the other thread holds it at the fork)
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            code = 1
            try:
                signal.alarm(20)
                code = 0 if _store.compile_clock() >= 0.0 else 2
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
