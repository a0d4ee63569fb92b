"""Long-lived processes and file systems without flock (SPEC §7): a process's bookkeeping grows with
its distinct keys, not its lookups; no other process reads a live ledger with work that grows with
that process's lifetime; and where `flock()` does not work, a lock file and process ids keep the cap
and the stats, said once per directory."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import Venv, autocache_warnings, run_program
from test_activation import VERSION_DIR
from test_cap import compiling

from gkx_autocache._layout import TAG

# A notebook kernel or a server: the real Recorder, looked up a million times over 100 keys, then
# waiting (alive) while the test reads the directory from outside.
LOOKUPS = r"""
import sys, time
from gkx_autocache._record import recorder as _stats
vdir, n = sys.argv[1], int(sys.argv[2])
rec = _stats.Recorder(vdir, ledger=True, run=_stats.begin_run())
keys = [f"jit_f{i}-" + f"{i:064x}" for i in range(100)]
for i in range(n):
    key = keys[i % 100]
    if i % 1000 == 7:
        rec.miss(key)
        rec.uncached(key, "host callbacks")
    rec.hit(key, 3500, 0.25)
    rec.on_duration(_stats.RETRIEVAL, 0.001)
time.sleep(2.1)  # the tally is written at most every 2 s: one more lookup writes it
rec.hit(keys[0], 3500, 0.25)
rec.on_duration(_stats.RETRIEVAL, 0.001)
print("ready", flush=True)
sys.stdin.readline()
_stats.finish(rec, 0)
"""


def tagged(path: Path) -> Path:
    vdir = path / VERSION_DIR
    vdir.mkdir(parents=True, mode=0o700)
    (vdir / "CACHEDIR.TAG").write_text(TAG)
    return vdir


def ledger_bytes(vdir: Path) -> int:
    return sum(p.stat().st_size for p in (vdir / ".gkx-autocache" / "ledger").iterdir())


@pytest.mark.once  # slow, and the same on every JAX line
def test_a_million_lookups_of_100_keys_keep_the_ledger_small_and_counted(venv: Venv, tmp_path: Path) -> None:
    """1 000 000 lookups of 100 keys leave a live ledger under 1 MiB (a few KB: a record per key,
    the repeats as a tally), and `stats` counts every one of them while the process still runs."""
    vdir = tagged(tmp_path / "c")
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    proc = subprocess.Popen([sys.executable, "-c", LOOKUPS, str(vdir), "1000000"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        size = ledger_bytes(vdir)
        assert size < 1 << 20 and size < 200_000, size
        stats = json.loads(venv.cli("--json", "stats", env=env).stdout)["stats"]
        assert stats["hits"] == 1_000_001 and stats["misses"] == 0 and stats["not_cached"] == 1000, stats
    finally:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("\n")
        proc.stdin.close()
        proc.wait(timeout=60)
        proc.stdout.close()
    stats = json.loads(venv.cli("--json", "stats", env=env).stdout)["stats"]
    assert stats["hits"] == 1_000_001 and not list((vdir / ".gkx-autocache" / "ledger").iterdir()), stats


def test_a_ledger_past_its_limit_ends_and_another_begins(tmp_path: Path) -> None:
    """A process that writes more distinct records than a ledger holds ends it (its final tally
    says so) and begins another: each stays under the limit, and a fold may take the ended ones
    while the process lives."""
    vdir = tagged(tmp_path / "c")
    script = r"""
import sys
from gkx_autocache._record import fold as _fold
from gkx_autocache._record import ledger as _ledger
from gkx_autocache._record import recorder as _stats
_ledger.LIVE_LIMIT = 20_000
rec = _stats.Recorder(sys.argv[1], ledger=True, run=_stats.begin_run())
for i in range(2000):
    rec.miss(f"jit_g{i}-" + f"{i:064x}")
    rec.put(f"jit_g{i}-" + f"{i:064x}", 100, 0.01)
_fold.fold(sys.argv[1], 0, False)  # while this process lives: the ended ledgers are folded
import os
left = os.listdir(os.path.join(sys.argv[1], ".gkx-autocache", "ledger"))
print(len(left))
"""
    proc = subprocess.run([sys.executable, "-c", script, str(vdir)], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "1", proc.stdout  # only the one it is writing is left
    summary = json.loads((vdir / ".gkx-autocache" / "summary.json").read_text())
    assert 1800 < summary["totals"]["writes"] < 2000, summary["totals"]["writes"]  # the ended ones were folded


# A .pth line runs at every start of the venv's interpreters: flock() fails as on Lustre (ENOSYS).
NO_FLOCK = ("import fcntl; fcntl.flock = lambda *a, **k: (_ for _ in ()).throw("
            "OSError(__import__('errno').ENOSYS, 'Function not implemented'))\n")


def test_without_flock_the_cap_and_the_stats_hold_and_it_is_said_once(venv: Venv, tmp_path: Path) -> None:
    """Where `flock()` fails (Lustre, NFS without locks: every process of this venv gets ENOSYS), 4
    writing runs keep the directory within 10 % of its cap, the stats count every run, one warning
    says it for the directory, `status` says it, and no ledger or descriptor is left behind."""
    (venv.site / "zz_no_flock.pth").write_text(NO_FLOCK)
    cap = 400_000
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_MAX_SIZE": str(cap)}
    vdir = tmp_path / "c" / VERSION_DIR
    said = []
    for run in range(4):
        _, err = run_program(venv, env=env, program=compiling(12, float(run)))
        said += [w for w in autocache_warnings(err) if "flock" in w]
    assert len(said) == 1, said
    du = sum(p.stat().st_blocks * 512 for p in vdir.rglob("*") if p.is_file())
    assert du <= 1.1 * cap, du
    stats = json.loads(venv.cli("--json", "stats", env=env).stdout)["stats"]
    assert stats["writes"] >= 4 * 12 and stats["misses"] >= 4 * 12, stats
    assert list((vdir / ".gkx-autocache" / "ledger").iterdir()) == []  # every finished ledger folded
    status = json.loads(venv.cli("--json", "status", env=env).stdout)
    assert any("no working flock" in a for a in status["attention"]), status["attention"]


def test_without_flock_a_live_process_keeps_its_ledger(venv: Venv, tmp_path: Path) -> None:
    """Without flock, a live process is told by its pid and start time: another process's fold at
    exit leaves its ledger (and so its records) alone; once it is gone, the next fold takes it."""
    (venv.site / "zz_no_flock.pth").write_text(NO_FLOCK)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    vdir = tmp_path / "c" / VERSION_DIR
    waiting = compiling(2, 7.0, tail="import sys; print('ready', flush=True); sys.stdin.readline()")
    live = subprocess.Popen([venv.python, "-c", waiting], env={**venv.env, **env}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=str(venv.home))
    try:
        assert live.stdout is not None and live.stdout.readline().strip() == "ready"
        run_program(venv, env=env, program=compiling(2, 8.0))  # its exit folds what has finished
        names = [p.name for p in (vdir / ".gkx-autocache" / "ledger").iterdir()]
        assert [n for n in names if n.startswith(f"{live.pid}-")], names
    finally:
        assert live.stdin is not None and live.stdout is not None
        live.stdin.write("\n")
        live.stdin.close()
        live.wait(timeout=60)
        live.stdout.close()
    time.sleep(0.1)
    run_program(venv, env=env, program=compiling(1, 9.0))
    left = {p.name: p.read_text()[:300] for p in (vdir / ".gkx-autocache" / "ledger").iterdir()}
    assert left == {}, left
    stats = json.loads(venv.cli("--json", "stats", env=env).stdout)["stats"]
    assert stats["writes"] >= 5, stats
