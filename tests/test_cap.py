"""The cap holds and the bookkeeping stays small (SPEC §7, §11): team members, forked workers that
end by `os._exit`, killed jobs, and many runs. Real JAX in fresh processes, real non-root users."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import InProcess, Venv, planted_run
from test_activation import VERSION_DIR

MEMBER_A, MEMBER_B, TEAM = 1001, 1002, 3000


def compiling(n: int, salt: float, tail: str = "") -> str:
    """A program that compiles ``n`` distinct small functions (~3.5 kB entries each)."""
    return f"""
import json, os, jax, jax.numpy as jnp
x = jnp.ones(16)
for i in range({n}):
    jax.jit(lambda v, c=float(i): jnp.tanh(v * c + {salt}).sum())(x).block_until_ready()
{tail}
print(json.dumps({{"requests": {n}, "result": 1.0}}))
"""


SIZE = 5000  # an executable's bytes in a process here: its entry and sidecar take 12 KiB on disk


def compiles(n: int, salt: float) -> tuple[str, ...]:
    """``compiling``'s functions for a process here (conftest's ``InProcess.run_program``)."""
    return tuple(f"_lambda:{i}.0+{salt}" for i in range(n))


def forked(call: Callable[[], object]) -> int:
    """``call()`` in a forked child of this process that then ends by ``os._exit`` (no at-exit hook
    runs; 1 where ``call`` raised), unless it ended itself; how it ended (``os.waitpid``'s status)."""
    import warnings

    with warnings.catch_warnings():
        # (3.12 warns of a fork in a process with threads: the child runs ``call`` alone and exits)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = 0
        try:
            call()
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)
    return os.waitpid(pid, 0)[1]


def on_disk(vdir: Path) -> int:
    """Every file in the version directory but the tag, as `du` counts it (allocated blocks: an
    entry of 3.5 kB and its sidecar take 8 KiB), the package's bookkeeping included: what the cap
    counts (SPEC §10)."""
    return sum(p.stat().st_blocks * 512 for p in vdir.rglob("*") if p.is_file() and p.name != "CACHEDIR.TAG")


def test_a_second_team_member_brings_the_cache_under_the_cap(public: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two users of one group share a trust_shared cache: the second member's writing run can take
    the lock the first created, and prunes the directory under the cap."""
    here = InProcess(public, monkeypatch)  # where the members reach it
    team = public / "team"
    team.mkdir()
    os.chown(team, 0, TEAM)
    team.chmod(0o2770)
    cap = 200_000
    (here.path / "gkx-autocache.toml").write_text(f'dir = "{team}"\ntrust_shared = true\nmax_size = {cap}\n')
    vdir = team / VERSION_DIR
    here.run_program(names=compiles(10, 1.0), user=MEMBER_A, groups=(TEAM,), size=SIZE)
    assert 80_000 < on_disk(vdir) <= cap
    lock = vdir / ".gkx-autocache" / "prune.lock"
    assert lock.stat().st_uid == MEMBER_A and lock.stat().st_mode & 0o060 == 0o060
    here.run_program(names=compiles(10, 2.0), user=MEMBER_B, groups=(TEAM,), size=SIZE)
    assert on_disk(vdir) <= cap, on_disk(vdir)
    assert len(list(vdir.glob("*-cache"))) < 20


def test_workers_that_end_by_os_exit_are_counted(here: InProcess, tmp_path: Path) -> None:
    """Three forked workers import JAX after the fork, compile and end by `os._exit` (no at-exit
    hook runs), overfilling the cap after an ordinary run recorded the size; the next ordinary
    writing run brings the directory back under it."""
    cap = 160_000
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_MAX_SIZE": str(cap)}
    vdir = tmp_path / "c" / VERSION_DIR
    here.run_program(env, compiles(3, 1.0), size=SIZE)

    def worker(w: int) -> None:
        with here.process(env) as ran:  # its own import of jax, after the fork
            for i in range(6):
                ran.jit("_lambda", f"sin {i} {w}", size=SIZE)
            os._exit(0)

    assert [forked(lambda w=w: worker(w)) for w in range(3)] == [0, 0, 0]  # type: ignore[misc]
    assert on_disk(vdir) > cap  # nobody pruned: every worker ended by os._exit
    here.run_program(env, compiles(1, 99.0), size=SIZE)
    assert on_disk(vdir) <= cap, on_disk(vdir)


def test_a_killed_process_is_counted(here: InProcess, tmp_path: Path) -> None:
    """A process killed with SIGKILL after writing: its writes reach the totals and the account,
    and the next writing run prunes what it overfilled."""
    cap = 160_000
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_MAX_SIZE": str(cap)}
    vdir = tmp_path / "c" / VERSION_DIR
    here.run_program(env, compiles(2, 1.0), size=SIZE)

    def killed() -> None:
        with here.process(env) as ran:
            for name in compiles(14, 5.0):
                ran.jit(*name.split(":"), size=SIZE)
            os.kill(os.getpid(), signal.SIGKILL)

    assert os.WTERMSIG(forked(killed)) == signal.SIGKILL
    assert on_disk(vdir) > cap
    here.run_program(env, compiles(1, 99.0), size=SIZE)
    assert on_disk(vdir) <= cap, on_disk(vdir)
    stats = json.loads(here.cli("--json", "stats", env=env).stdout)["stats"]
    assert stats["writes"] >= 2 + 14 + 1  # the killed process's writes are in the totals


def warm_run(vdir: Path) -> None:
    """A run without JAX that records like a warm one: real Recorder, real ledger, real fold at exit."""
    from gkx_autocache._record import recorder as _stats

    rec = _stats.Recorder(str(vdir), ledger=True)
    for i in range(20):
        key = f"jit_f{i}-" + f"{i:064x}"
        rec.hit(key, 3500, 0.25)
        rec.on_duration(_stats.RETRIEVAL, 0.001)
    rec.miss("jit_debug_print-" + "d" * 64)  # the same uncached function, every run
    _stats.finish(rec, 0)


def runs(vdir: Path, first: int, last: int) -> None:
    """``warm_run`` in a process of its own for each run (its own pid, its own ledger): forked from
    this one, not a fresh interpreter each (0.4 s apiece)."""
    for _ in range(first, last):
        assert forked(lambda: warm_run(vdir)) == 0


def meta_bytes(vdir: Path) -> int:
    return sum(p.stat().st_size for p in (vdir / ".gkx-autocache").rglob("*") if p.is_file())


def test_bookkeeping_grows_with_entries_not_runs(tmp_path: Path) -> None:
    """60 runs leave a `.gkx-autocache/` no bigger than 25 runs did (within a small constant): the
    summary keeps the last 20 runs for `explain`, and the same misses once."""
    vdir = tmp_path / VERSION_DIR
    vdir.mkdir(mode=0o700)
    from gkx_autocache._layout import TAG

    (vdir / "CACHEDIR.TAG").write_text(TAG)
    runs(vdir, 0, 25)
    after_25 = meta_bytes(vdir)
    runs(vdir, 25, 60)
    after_60 = meta_bytes(vdir)
    assert after_60 <= after_25 + 1_000, (after_25, after_60)
    assert len(list((vdir / ".gkx-autocache" / "ledger").iterdir())) == 0


def test_folding_keeps_the_totals(here: InProcess, tmp_path: Path) -> None:
    """`stats` totals and costliest functions are the same before and after 100 ledgers are folded."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    vdir = planted_run(tmp_path / "c")
    ledger = vdir / ".gkx-autocache" / "ledger"
    for n in range(100):  # finished processes' ledgers, in the package's format, not folded yet
        lines = [{"e": "hit", "key": f"jit_f-{n:064x}", "bytes": 100, "saved": 0.5},
                 {"e": "miss", "key": f"jit_g-{n:064x}", "cause": "new"},
                 {"e": "put", "key": f"jit_g-{n:064x}", "bytes": 200, "compile": 0.25 + n / 1000}]
        (ledger / f"{n + 10}-{n}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    before = json.loads(here.cli("--json", "stats", env=env).stdout)
    assert before["stats"]["hits"] >= 100 and before["stats"]["writes"] >= 100
    fold = "import sys; from gkx_autocache._record import fold as _fold; _fold.fold(sys.argv[1], 0, False)"
    subprocess.run([sys.executable, "-c", fold, str(vdir)], check=True)
    assert list(ledger.iterdir()) == []
    after = json.loads(here.cli("--json", "stats", env=env).stdout)
    assert after["stats"] == before["stats"] and after["top_functions"] == before["top_functions"]


def test_clear_leaves_stats_at_zero(here: InProcess) -> None:
    """`clear` is a fresh start: it resets the totals too, and says so."""
    planted_run(here.default_cache)
    assert json.loads(here.cli("--json", "status").stdout)["stats"]["misses"] == 2  # before: the run's
    proc = here.cli("clear", "--yes")
    assert proc.returncode == 0 and "reset" in proc.stdout
    assert "none yet" in here.cli("stats").stdout
    assert json.loads(here.cli("--json", "status").stdout)["stats"] is None


def test_a_driver_whose_pool_compiled_everything_folds_and_prunes(here: InProcess, tmp_path: Path) -> None:
    """The parent imports JAX and records nothing itself; its forked workers compile and end by
    `os._exit`: the parent's exit folds their ledgers and keeps the cap, run after run."""
    cap = 150_000
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_MAX_SIZE": str(cap)}
    vdir = tmp_path / "c" / VERSION_DIR
    for run in range(3):
        with here.process(env) as ran:  # the driver: jax imported before the fork
            def work(w: int, run: int = run) -> None:
                for i in range(6):
                    ran.jit("_lambda", f"sin {i} {10.0 * run + w}", size=SIZE)

            assert [forked(lambda w=w: work(w)) for w in range(2)] == [0, 0]  # type: ignore[misc]
            assert ran.jax.requests == 0
        assert list((vdir / ".gkx-autocache" / "ledger").iterdir()) == []
        assert len(list(vdir.glob("*-cache"))) >= 6 and on_disk(vdir) <= cap, (run, on_disk(vdir))


def test_temporaries_of_killed_writers_are_pruned_at_exit(here: InProcess, tmp_path: Path) -> None:
    """Temporary files two hours old (writers killed mid-write) count against the cap, and the
    at-exit scan (at least hourly: its writers never recorded them) removes them; a fresh one (a
    write in progress) stays."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_MAX_SIZE": "150kB"}
    vdir = tmp_path / "c" / VERSION_DIR
    here.run_program(env)
    old = [vdir / f".jit_x{i}-{i:064x}-cache.1.2.tmp" for i in range(3)] + [vdir / ".gkx-autocache" / ".summary.json.3.4.tmp"]
    for path in old:
        path.write_bytes(bytes(20_000))
        os.utime(path, (time.time() - 7200, time.time() - 7200))
    fresh = vdir / ".jit_y-cache.5.6.tmp"
    fresh.write_bytes(b"x")
    summary = vdir / ".gkx-autocache" / "summary.json"
    data = json.loads(summary.read_text())
    summary.write_text(json.dumps({**data, "scanned_at": time.time() - 7200}))  # the last full scan: two hours ago
    here.run_program(env, compiles(1, 42.0), size=SIZE)
    assert not any(p.exists() for p in old) and fresh.exists()
    assert on_disk(vdir) <= 150_000


def test_a_version_directory_someone_else_made_is_kept_under_the_cap(here: InProcess, tmp_path: Path) -> None:
    """A `jax-<version>` made by hand (no tag): the package tags it and prunes it like its own."""
    vdir = tmp_path / "c" / VERSION_DIR
    vdir.mkdir(parents=True, mode=0o700)
    (tmp_path / "c").chmod(0o700)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_MAX_SIZE": "120kB"}
    out, _ = here.run_program(env, compiles(12, 3.0), size=SIZE)
    assert out["requests"] == 12 and len(list(vdir.glob("*-cache"))) < 12
    assert (vdir / "CACHEDIR.TAG").exists() and on_disk(vdir) <= 120_000


def test_reset_waits_for_a_fold_and_then_says_busy(here: InProcess, tmp_path: Path) -> None:
    """`stats --reset` and `clear` while another process holds the bookkeeping lock: exit 1, "busy",
    rather than a reset that a fold in progress would undo."""
    import fcntl

    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    lock = planted_run(tmp_path / "c") / ".gkx-autocache" / "prune.lock"
    lock.touch(mode=0o600)  # (a process's exit makes it; the commands open it: another descriptor, another lock)
    with open(lock, "r+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        for command in (["stats", "--reset"], ["clear", "--yes"]):
            proc = here.cli(*command, env=env)
            assert proc.returncode == 1 and "busy" in proc.stderr, (command, proc.stderr)
    assert json.loads(here.cli("--json", "stats", env=env).stdout)["stats"]["misses"] > 0


SIZED = r"""
import json, sys
import numpy as np
import jax, jax.numpy as jnp
n = int(sys.argv[1])
x = np.ones(n, np.float32)  # a NumPy input: no helper compiles, only the three functions below
fs = [jax.jit(lambda v: jnp.tanh(v).sum()), jax.jit(lambda v: (v * v).cumsum()), jax.jit(lambda v: jnp.sort(v)[::-1])]
print(json.dumps({"result": [float(np.asarray(f(x)).sum()) for f in fs]}))
"""


@pytest.mark.slow
def test_without_a_cap_the_index_grows_about_300_bytes_an_entry(venv: Venv, tmp_path: Path) -> None:
    """With ``max_size = 0`` (no cap), 8 writing runs, each compiling three new entries: each run
    after the first adds about 300 B an entry to the index (SPEC §13.1; some 90 of them the
    computation's readable value: its scalar constants with their uses and a digest of its operations,
    by which `explain` names a constant only where it is the only difference, issue 58), not its tables again (a
    ``jax.config`` line of some 5 KB, a compile-options line of 3 KB). The first run's tables are a
    fixed cost of the directory, once a config."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_MAX_SIZE": "0"}
    vdir = tmp_path / "c" / VERSION_DIR
    sizes = []
    for run in range(8):
        proc = venv.run("-c", SIZED, str(8 + run), env=env)
        assert proc.returncode == 0, proc.stderr
        sizes.append((len(list(vdir.glob("*-cache"))), (vdir / ".gkx-autocache" / "index").stat().st_size))
    (first_entries, first), (entries, index) = sizes[0], sizes[-1]
    added = (index - first) / (entries - first_entries)
    print(f"max_size=0, 8 writing runs: {entries} entries, index {index} B ({index / entries:.0f} B an entry); "
          f"runs 2-8 added {added:.0f} B an entry; the first run's {first} B hold the tables")
    assert entries == 24, sizes
    assert added <= 320, sizes


def test_without_a_cap_the_hourly_scan_compacts_the_index_and_keeps_live_tables(tmp_path: Path) -> None:
    """``max_size = 0``: the fold's hourly full scan still rewrites the index (a table line once,
    the entries still there), and keeps the tables a live process's ledger refers to (that process
    appended none of them: the index held them when it read it)."""
    import fcntl

    from gkx_autocache._key import PARTS
    from gkx_autocache._layout import TAG
    from gkx_autocache._record import fold as _fold
    from gkx_autocache._record import index as _index
    from gkx_autocache._record import ledger as _ledger

    vdir = tmp_path / VERSION_DIR
    (vdir / ".gkx-autocache" / "ledger").mkdir(parents=True, mode=0o700)
    (vdir / "CACHEDIR.TAG").write_text(TAG)
    parts = dict.fromkeys(PARTS, "0123456789abcdef")
    here = _index.lines_for("jit_f", "a" * 64, 1.8e9, "r1", parts, {"XLA flags": ""}, "f32[8]", "m.py:f", {"x": "1"})
    live = _index.lines_for("jit_g", "b" * 64, 1.8e9, "r2", parts, {}, "f32[9]", "m.py:g", {"x": "1"})
    (vdir / f"jit_f-{'a' * 64}-cache").write_bytes(b"x")
    (vdir / f"jit_g-{'b' * 64}-cache").write_bytes(b"x")
    index = vdir / ".gkx-autocache" / "index"
    tables = [line for line in here + live if not line.startswith("E\t")]
    index.write_text("\n".join(tables * 5 + [here[-1]]) + "\n")  # five runs' tables; jit_g's E line not folded yet
    ledger = vdir / ".gkx-autocache" / "ledger" / "999-1.jsonl"
    ledger.write_bytes(_ledger.encode({"e": "put", "key": f"jit_g-{'b' * 64}", "bytes": 1, "rec": live[-1]}))
    with open(ledger, "r+b") as held:  # the live process's lock on its ledger
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _fold.fold(str(vdir), 0, False)
    lines = index.read_text().splitlines()
    assert len(lines) == len(set(lines)), "compacted: each line once"
    assert here[-1] in lines and f"S\t{_index.digest('f32[9]')}\t\"f32[9]\"" in lines, lines
