"""Once per key across processes on one host (issue 69, SPEC §18): a key one process compiles is not
compiled by another at the same time; the others wait for its entry, bounded, then compile. Units
on ``_local.lease`` in this process (a planted lease stands for another process), then real
processes started together on a barrier, compiling real programs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import S3, Venv
from test_activation import VERSION_DIR

from gkx_autocache._local import lease as _lease
from gkx_autocache._local.lease import ALONE, HELD, READY, Leases
from gkx_autocache._record import ledger as _ledger

KEY = "jit_f-" + "ab" * 32
LONG = 3600.0  # a bound no test waits out: only what the test does ends a wait


@pytest.fixture
def vdir(tmp_path: Path) -> Path:
    path = tmp_path / "jax-0.0"
    path.mkdir(mode=0o700)
    return path


def folder(vdir: Path) -> Path:
    return vdir / ".gkx-autocache" / "leases"


def in_compile(leases: Leases) -> None:
    """As JAX's ``compile_or_get_cached`` starts (``_jax.caching.bracket_compiles``)."""
    leases.begin()


def plant(vdir: Path, key: str = KEY, *, host: str | None = None, pid: int | None = None, expect: float | None = None,
          state: bytes = b"C", mtime: float | None = None, uid: int | None = None) -> Path:
    """Another process's lease (by default a live one of this host: this process)."""
    (folder(vdir)).mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder(vdir) / key
    pid = os.getpid() if pid is None else pid
    data = _lease.line(host or socket.gethostname()[:100], pid, _ledger.born(pid), expect)
    path.write_bytes(data[:-1] + state)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    if uid is not None:
        os.chown(path, uid, -1)
    return path


def never() -> bool:
    return False


# -- units: one process, its leases, planted ones ---------------------------------------------------


def test_a_miss_takes_the_lease_and_the_write_lets_it_go(vdir: Path) -> None:
    """The first miss of a key holds its lease (a file naming this host and pid); after the write
    it is gone, and nothing else is left in the folder."""
    leases = Leases(LONG)
    in_compile(leases)
    assert leases.settle(str(vdir), False, KEY, never) == HELD
    made = folder(vdir) / KEY
    host, pid, born, expect, unwritten = _lease.parse(made.read_bytes()) or ("", 0, None, None, True)
    assert (host, pid, born, expect, unwritten) == (socket.gethostname()[:100], os.getpid(), _ledger.born(os.getpid()),
                                                    None, False)
    assert made.stat().st_mode & 0o777 == 0o600 and folder(vdir).stat().st_mode & 0o7777 == 0o700
    leases.release(str(vdir), KEY)
    assert list(folder(vdir).iterdir()) == []
    leases.end(None)  # (the compile's end: nothing more to let go)
    assert list(folder(vdir).iterdir()) == []


def test_a_lookup_outside_a_compile_takes_no_lease(vdir: Path) -> None:
    """Only a lookup inside JAX's compile takes a lease: nothing else would let it go."""
    assert Leases(LONG).settle(str(vdir), False, KEY, never) == ALONE
    assert not (vdir / ".gkx-autocache").exists()


def test_a_key_jax_did_not_write_sends_its_waiters_to_compile_at_once(vdir: Path) -> None:
    """A compile that ends without a write (below a threshold, an error) marks its lease: another
    process's miss of that key compiles at once, without waiting; at exit the lease is gone."""
    holder, other = Leases(LONG), Leases(LONG, host="elsewhere")
    outer = holder.begin()
    assert holder.settle(str(vdir), False, KEY, never) == HELD
    holder.end(outer)
    assert _lease.parse((folder(vdir) / KEY).read_bytes())[4] is True  # type: ignore[index]
    in_compile(other)
    assert other.settle(str(vdir), False, KEY, never) == ALONE
    holder.release_all()
    assert list(folder(vdir).iterdir()) == []


def test_a_waiter_reads_the_entry_its_holder_writes(vdir: Path) -> None:
    """A waiter on a live holder's lease gets the entry the holder writes (``READY``), whenever it
    is written; then the holder lets go."""
    holder, waiter = Leases(LONG), Leases(LONG)
    in_compile(holder)
    assert holder.settle(str(vdir), False, KEY, never) == HELD
    entry = vdir / (KEY + "-cache")
    outcome: list[str] = []

    def wait() -> None:
        in_compile(waiter)
        outcome.append(waiter.settle(str(vdir), False, KEY, entry.exists))

    thread = threading.Thread(target=wait)
    thread.start()
    entry.write_bytes(b"entry")  # the holder's write, then its let-go
    holder.release(str(vdir), KEY)
    thread.join()
    assert outcome == [READY]


def test_a_lease_let_go_between_a_lookup_and_its_take_is_a_hit(vdir: Path) -> None:
    """A miss whose lease is free but whose entry is there by then (its holder wrote it and let go
    meanwhile) reads the entry rather than compiling it again, and leaves no lease."""
    (vdir / (KEY + "-cache")).write_bytes(b"entry")
    leases = Leases(LONG)
    in_compile(leases)
    assert leases.settle(str(vdir), False, KEY, (vdir / (KEY + "-cache")).exists) == READY
    assert list(folder(vdir).iterdir()) == []


def test_a_lease_whose_process_is_gone_is_broken_and_taken(vdir: Path) -> None:
    """A holder killed on this host (its pid no longer runs): its lease is broken at once and the
    waiter takes it, whatever the bound."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    plant(vdir, pid=int(gone.stdout), mtime=time.time() + LONG)
    leases = Leases(LONG)
    in_compile(leases)
    assert leases.settle(str(vdir), False, KEY, never) == HELD
    assert _lease.parse((folder(vdir) / KEY).read_bytes())[1] == os.getpid()  # type: ignore[index]


def test_a_rebuild_leaves_a_key_another_process_compiles_and_holds_those_it_compiles(vdir: Path) -> None:
    """A rebuild (``rebuild``, or ahead) takes the lease of each key it compiles, without waiting:
    a key another process is compiling now is left to it (``BUSY``), and one it takes makes the
    other processes that miss it wait for its entry; the write lets it go."""
    plant(vdir)  # another process compiles KEY now
    leases = Leases(LONG)
    assert leases.take(str(vdir), False, KEY, never) == _lease.BUSY
    other = "jit_g-" + "cd" * 32
    assert leases.take(str(vdir), False, other, never) == HELD
    assert _lease.parse((folder(vdir) / other).read_bytes())[1] == os.getpid()  # type: ignore[index]
    leases.release(str(vdir), other)
    assert not (folder(vdir) / other).exists()
    assert leases.take(str(vdir), False, other, lambda: True) == READY  # written meanwhile


def test_a_lease_whose_heartbeat_stopped_is_broken(vdir: Path) -> None:
    """A holder on another host (no pid to ask) whose heartbeat stopped: broken, taken."""
    plant(vdir, host="elsewhere", pid=1, mtime=time.time() - _lease.STALE - 30)
    leases = Leases(LONG)
    in_compile(leases)
    assert leases.settle(str(vdir), False, KEY, never) == HELD


def test_a_hung_holder_holds_no_one_past_the_bound(vdir: Path) -> None:
    """A holder alive and beating that never writes: the waiter compiles once ``shared_timeout`` is
    over, and waits no more for that holder in this process (its next key: at once)."""
    plant(vdir, mtime=time.time() + LONG)
    plant(vdir, "jit_g-" + "cd" * 32, mtime=time.time() + LONG)
    leases = Leases(0.2, host=socket.gethostname()[:100])
    in_compile(leases)
    assert leases.settle(str(vdir), False, KEY, never) == ALONE
    assert leases.settle(str(vdir), False, "jit_g-" + "cd" * 32, never) == ALONE
    assert (folder(vdir) / KEY).exists()  # not broken: it is alive, only not waited for


def test_the_bound_is_the_recorded_compile_time_or_shared_timeout() -> None:
    """Twice the compile time recorded (this user's record, or this user's lease's), and a second;
    else ``shared_timeout``; another user's lease never longer than ``shared_timeout``."""
    leases = Leases(10.0, uid=1000)
    mine = _lease.Holder(1000, "h", 1, 30.0, False, 1)
    theirs = _lease.Holder(1001, "h", 1, 1e6, False, 1)
    assert leases._bound(mine, None) == 61.0
    assert leases._bound(mine, 2.0) == 5.0
    assert leases._bound(mine._replace(expect=None), None) == 10.0
    assert leases._bound(theirs, None) == 10.0 and leases._bound(theirs, 100.0) == 10.0
    assert leases._bound(theirs, 1.0) == 3.0


def test_another_users_lease_in_a_private_folder_is_neither_waited_on_nor_removed(vdir: Path) -> None:
    """A lease planted by another user where only this one writes (it cannot be, but for root):
    the miss compiles at once, and the file is left where it is."""
    planted = plant(vdir, uid=1001, mtime=time.time() + LONG)
    leases = Leases(LONG)
    in_compile(leases)
    assert leases.settle(str(vdir), False, KEY, never) == ALONE
    assert planted.exists() and planted.stat().st_uid == 1001


def test_a_team_members_lease_is_honoured_at_most_shared_timeout(vdir: Path) -> None:
    """In a team directory another member's lease is waited for, never beyond ``shared_timeout``
    whatever it claims, and that member's leases are not waited for again in this process."""
    plant(vdir, host="elsewhere", expect=1e6, uid=1001, mtime=time.time() + LONG)
    plant(vdir, "jit_g-" + "cd" * 32, host="elsewhere", uid=1001, mtime=time.time() + LONG)
    leases = Leases(0.2)
    in_compile(leases)
    assert leases.settle(str(vdir), True, KEY, never) == ALONE
    assert leases.settle(str(vdir), True, "jit_g-" + "cd" * 32, never) == ALONE
    assert leases._distrusted == {(1001, "", -1)}


def test_a_lease_claiming_a_live_process_of_another_user_is_broken(vdir: Path) -> None:
    """A member's lease naming a process of this host that is not theirs (pid 1, root's): a lie,
    broken, and the miss holds the lease."""
    plant(vdir, pid=1, uid=1001, mtime=time.time() + LONG)
    leases = Leases(LONG)
    in_compile(leases)
    assert leases.settle(str(vdir), True, KEY, never) == HELD


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_a_planted_file_at_the_lease_is_never_waited_on_nor_followed(vdir: Path, tmp_path: Path, kind: str) -> None:
    """A symlink, a FIFO or a directory where a lease goes: the miss compiles at once, nothing is
    opened through it, and it is left alone."""
    folder(vdir).mkdir(parents=True)
    target = tmp_path / "victim"
    target.write_bytes(b"keep")
    at = folder(vdir) / KEY
    if kind == "symlink":
        at.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(at)
    else:
        at.mkdir()
    leases = Leases(LONG)
    in_compile(leases)
    assert leases.settle(str(vdir), False, KEY, never) == ALONE
    assert target.read_bytes() == b"keep" and (at.is_symlink() or at.exists())


@pytest.mark.parametrize("where", [".gkx-autocache", ".gkx-autocache/leases"])
def test_a_symlinked_folder_takes_no_lease(vdir: Path, tmp_path: Path, where: str) -> None:
    """``.gkx-autocache`` or its ``leases`` a symlink to a folder of the victim's: no lease is
    made, nothing is written there."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if where != ".gkx-autocache":
        (vdir / ".gkx-autocache").mkdir(mode=0o700)
    (vdir / where).symlink_to(elsewhere)
    leases = Leases(LONG)
    in_compile(leases)
    assert leases.settle(str(vdir), False, KEY, never) == ALONE
    assert list(elsewhere.iterdir()) == []


def test_the_folder_removed_or_swapped_for_a_link_after_a_lease_is_opened_again(vdir: Path, tmp_path: Path) -> None:
    """The lease folder is opened once a process and then reused while its path names it: removed
    since (``clear``), the next lease is made in the new one, where other processes look; swapped
    for a link to another folder, no lease is made and nothing is written there."""
    leases = Leases(LONG)
    in_compile(leases)
    assert leases.settle(str(vdir), False, KEY, never) == HELD
    leases.release(str(vdir), KEY)
    shutil.rmtree(vdir / ".gkx-autocache")
    other = "jit_g-" + "cd" * 32
    assert leases.settle(str(vdir), False, other, never) == HELD
    assert (folder(vdir) / other).is_file()
    leases.release(str(vdir), other)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    folder(vdir).rename(tmp_path / "moved")
    folder(vdir).symlink_to(elsewhere)
    assert leases.settle(str(vdir), False, KEY, never) == ALONE
    assert list(elsewhere.iterdir()) == []


def test_threads_leasing_at_once_on_first_use_never_copy_a_descriptor_another_closed(
        vdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rebuild's threads take their first leases at once, and each opens the lease folder: the
    one kept is replaced by the last. A thread that found the one replaced must not copy its
    descriptor once closed, when its number is another folder's by then (a lease made there)."""
    from gkx_autocache import _files

    leases = Leases(LONG)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    b_in, b_go, c_in, c_go = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    outcome: dict[str, str] = {}
    made, stat = _files.bookkeeping_dir, os.stat

    def held_made(version_dir: str, team: bool, *parts: str) -> str | None:
        if threading.current_thread().name == "b":  # the first use's open, after it found none kept
            b_in.set()
            b_go.wait(10)
        return made(version_dir, team, *parts)

    def held_stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if threading.current_thread().name == "c" and str(path) == str(folder(vdir)):
            c_in.set()
            c_go.wait(10)
        return stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_files, "bookkeeping_dir", held_made)
    monkeypatch.setattr(os, "stat", held_stat)

    def take(name: str) -> threading.Thread:
        key = f"jit_{name}-" + "cd" * 32
        thread = threading.Thread(target=lambda: outcome.setdefault(name, leases.take(str(vdir), False, key, never)),
                                  name=name)
        thread.start()
        return thread

    b = take("b")
    assert b_in.wait(10)
    assert leases.take(str(vdir), False, KEY, never) == HELD  # the first folder kept
    c = take("c")
    assert c_in.wait(10)
    b_go.set()
    b.join(10)  # b's folder kept, the first closed
    others = [os.open(elsewhere, os.O_RDONLY) for _ in range(64)]  # the closed number, another folder's
    try:
        c_go.set()
        c.join(10)
    finally:
        for fd in others:
            os.close(fd)
    assert outcome == {"b": HELD, "c": HELD}, outcome
    assert list(elsewhere.iterdir()) == [] and (folder(vdir) / ("jit_c-" + "cd" * 32)).is_file()
    leases.release_all()


def test_a_forked_child_that_closes_every_descriptor_leases_in_the_folder(vdir: Path, tmp_path: Path) -> None:
    """A child forked after a lease (a daemon) closes every descriptor it inherited and opens its
    own: the parent's lease folder, kept open, is not copied by its number in the child, which
    may be another folder's by then."""
    leases = Leases(LONG)
    in_compile(leases)
    assert leases.settle(str(vdir), False, KEY, never) == HELD
    leases.release(str(vdir), KEY)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other = "jit_g-" + "cd" * 32
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            fd = os.open(elsewhere, os.O_RDONLY)
            for n in range(3, 1024):  # every number past stdio: a folder of the child's own
                if n != fd:
                    os.dup2(fd, n)
            in_compile(leases)
            mine = leases.settle(str(vdir), False, other, never)
            code = 0 if mine == HELD and (folder(vdir) / other).is_file() and not os.listdir(elsewhere) else 2
            leases.release_all()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert list(elsewhere.iterdir()) == []


def test_a_forked_child_holds_none_of_its_parents_leases(vdir: Path) -> None:
    """A child forked while its parent holds a lease does not let the parent's go (at its exit or
    its own write), and takes leases of its own."""
    leases = Leases(LONG)
    in_compile(leases)
    assert leases.settle(str(vdir), False, KEY, never) == HELD
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            leases.release(str(vdir), KEY)
            leases.release_all()
            in_compile(leases)
            mine = leases.settle(str(vdir), False, "jit_g-" + "cd" * 32, never)
            theirs = leases.settle(str(vdir), False, KEY, lambda: True)  # the parent's, alive: waited for
            code = 0 if (mine, theirs) == (HELD, READY) and (folder(vdir) / KEY).exists() else 2
            leases.release_all()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sorted(p.name for p in folder(vdir).iterdir()) == [KEY]
    leases.release(str(vdir), KEY)
    assert list(folder(vdir).iterdir()) == []


def test_at_exit_every_lease_is_let_go(vdir: Path) -> None:
    """A process exiting mid-compile (an exception out of the user's code, ``sys.exit`` in a
    callback) leaves no lease: the at-exit hook lets go of every one it holds."""
    leases = Leases(LONG)
    in_compile(leases)
    for key in (KEY, "jit_g-" + "cd" * 32):
        assert leases.settle(str(vdir), False, key, never) == HELD
    leases.release_all()
    assert list(folder(vdir).iterdir()) == []


# -- real processes started together ----------------------------------------------------------------

# Each copy imports JAX, says it is ready, and compiles only once every copy is (the barrier): the race is real.
COPIES = r"""
import json, logging, os, sys, time
log = logging.getLogger("gkx_autocache")
log.setLevel(logging.DEBUG)
log.addHandler(logging.FileHandler(sys.argv[2]))
import numpy as np
import jax, jax.numpy as jnp
counts = {"requests": 0, "hits": 0}
def listen(event, *a, **k):
    if event == "/jax/compilation_cache/compile_requests_use_cache": counts["requests"] += 1
    elif event == "/jax/compilation_cache/cache_hits": counts["hits"] += 1
jax.monitoring.register_event_listener(listen)
barrier = sys.argv[1]
open(os.path.join(barrier, f"ready-{os.getpid()}"), "w").close()
while not os.path.exists(os.path.join(barrier, "go")):
    time.sleep(0.01)
def make(i):
    def f(v):
        for _ in range(8):
            v = jnp.tanh(v @ v.T * (i + 1)) + jnp.sin(v)
        return v.sum()
    return jax.jit(f)
x = np.ones((32, 32), np.float32)
result = [float(make(i)(x)) for i in range(int(sys.argv[3]))]
print(json.dumps({**counts, "result": result}))
"""


def start_together(venv: Venv, tmp_path: Path, n: int, env: dict[str, str], functions: int = 4,
                   *flags: str) -> Iterator[subprocess.Popen[str]]:
    """``n`` copies of COPIES, let go at once when all have imported JAX."""
    barrier = tmp_path / f"barrier-{time.monotonic_ns()}"
    barrier.mkdir()
    procs = [subprocess.Popen([venv.python, *flags, "-c", COPIES, str(barrier), str(tmp_path / f"log{i}"), str(functions)],
                              env={**venv.env, **env}, cwd=str(venv.home), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(n)]
    limit = time.monotonic() + 600  # a hang guard, not a race: each copy is ready after its import jax
    while len(list(barrier.glob("ready-*"))) < n and time.monotonic() < limit:
        time.sleep(0.02)
    (barrier / "go").touch()
    yield from procs


def outputs(procs: Iterator[subprocess.Popen[str]]) -> list[dict[str, object]]:
    done = [(p, *p.communicate(timeout=600)) for p in list(procs)]
    assert all(p.returncode == 0 for p, _, _ in done), [err[-3000:] for _, _, err in done]
    assert all("Traceback" not in err and "gkx-autocache" not in err for _, _, err in done), [e for _, _, e in done]
    return [json.loads(out.strip().splitlines()[-1]) for _, out, _ in done]


def test_copies_started_together_compile_each_key_once(venv: Venv, tmp_path: Path) -> None:
    """Three copies of one program released together on a cold cache, under ``-W error``: each key
    is compiled by one of them (their misses add up to one copy's lookups), the others load it; the
    same results; no lease left. (A bound none of them can reach: only the entries end the waits.)"""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_SHARED_TIMEOUT": "3600"}
    runs = outputs(start_together(venv, tmp_path, 3, env, 4, "-W", "error"))
    lookups = {run["requests"] for run in runs}
    assert len(lookups) == 1 and len({json.dumps(run["result"]) for run in runs}) == 1, runs
    compiled = sum(int(run["requests"]) - int(run["hits"]) for run in runs)  # type: ignore[call-overload]
    assert compiled == lookups.pop(), runs
    assert list((tmp_path / "c" / VERSION_DIR / ".gkx-autocache" / "leases").iterdir()) == []


def test_an_entry_another_copy_wrote_while_this_one_waited_is_a_local_hit(venv: Venv, tmp_path: Path, s3: S3) -> None:
    """Copies started together with a shared level: a copy that waited for another's compile is
    served from the local level, and `stats` counts it there (its hits and the shared level's add
    up to the runs' hits), not as a local miss that JAX then saw hit."""
    env = {**s3.env, "GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_SHARED": f"s3://{s3.bucket}/team",
           "GKX_JAX_CACHE_SHARED_TIMEOUT": "3600"}
    runs = outputs(start_together(venv, tmp_path, 3, env, 4))
    hits = sum(int(run["hits"]) for run in runs)  # type: ignore[call-overload]
    requests = sum(int(run["requests"]) for run in runs)  # type: ignore[call-overload]
    assert hits >= requests // 3, runs  # (the waits happened: one copy's lookups compiled, at most)
    levels = json.loads(venv.cli("--json", "stats", env=env).stdout)["levels"]
    assert levels["local"]["hits"] + levels["shared"].get("hits", 0) == hits, (levels, runs)
    assert levels["local"]["misses"] == requests - levels["local"]["hits"], (levels, runs)


def test_copies_of_a_program_jax_does_not_write_all_compile(venv: Venv, tmp_path: Path) -> None:
    """Where JAX writes nothing (a threshold above every compile), each copy compiles each key (no
    one waits a bound for an entry that never comes: the holder marks its lease), and no lease is
    left once they have exited."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_SHARED_TIMEOUT": "3600",
           "GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS": "1000"}
    runs = outputs(start_together(venv, tmp_path, 3, env, 3))
    assert all(run["hits"] == 0 for run in runs), runs
    assert list((tmp_path / "c" / VERSION_DIR / ".gkx-autocache" / "leases").iterdir()) == []


HOLDER = "import os, sys, time\nwhile True:\n    os.utime(sys.argv[1])\n    time.sleep(0.2)\n"


def test_a_holder_killed_while_another_waits(venv: Venv, tmp_path: Path) -> None:
    """A holder that beats and never writes is killed while a copy waits on it (a bound it cannot
    reach): the copy breaks the lease (its process is gone), compiles, and writes the entry."""
    learn = {"GKX_JAX_CACHE_DIR": str(tmp_path / "learn")}
    outputs(start_together(venv, tmp_path, 1, learn, 1))
    (key,) = [p.name.removesuffix("-cache") for p in (tmp_path / "learn" / VERSION_DIR).glob("jit_f-*-cache")]
    vdir = tmp_path / "c" / VERSION_DIR
    lease = folder(vdir)
    lease.mkdir(parents=True, mode=0o700)
    (lease / key).touch()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lease / key)])
    try:
        plant(vdir, key, pid=holder.pid)
        env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_SHARED_TIMEOUT": "3600"}
        (waiter,) = procs = list(start_together(venv, tmp_path, 1, env, 1))
        log = tmp_path / "log0"
        limit = time.monotonic() + 600  # a hang guard
        while "waiting for" not in (log.read_text() if log.exists() else "") and time.monotonic() < limit:
            assert waiter.poll() is None, waiter.communicate()
            time.sleep(0.05)
        holder.send_signal(signal.SIGKILL)
        (run,) = outputs(iter(procs))
    finally:
        holder.kill()
        holder.wait()
    assert f"its process {holder.pid} is gone" in log.read_text(), log.read_text()
    assert run["hits"] == 0 and (vdir / f"{key}-cache").exists()
    assert list(lease.iterdir()) == []


def test_a_warm_run_takes_no_lease(venv: Venv, tmp_path: Path) -> None:
    """A hit takes no lease: a warm run does not even make the leases folder again."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    outputs(start_together(venv, tmp_path, 1, env, 2))
    leases = folder(tmp_path / "c" / VERSION_DIR)
    leases.rmdir()
    (run,) = outputs(start_together(venv, tmp_path, 1, env, 2))
    assert run["hits"] == run["requests"] and not leases.exists(), run


MEMBER_A, MEMBER_B, TEAM = 1001, 1002, 3000


def test_a_hostile_team_member_holds_a_victim_one_bound_at_most(venv: Venv, public: Path) -> None:
    """In a team directory, a member plants a lease for every key the victim will compile, each
    claiming a compile of days from another host, its heartbeat set in the future (never stale):
    the victim waits out ``shared_timeout`` once, then no more for that member; it compiles and
    writes every key, gets the right results, and leaves the member's files alone."""
    team = public / "team"
    team.mkdir()
    os.chown(team, 0, TEAM)
    team.chmod(0o2770)
    (venv.path / "gkx-autocache.toml").write_text(f'dir = "{team}"\ntrust_shared = true\n')
    from conftest import PROGRAM, run_program

    run_program(venv, env={"GKX_JAX_CACHE_DIR": str(public / "learn")})  # the victim's keys (the path is not in them)
    first = PROGRAM.replace("* 3.0", "* 4.0").replace("** 2", "** 3")  # a member's own run: makes the folders
    run_program(venv, user=MEMBER_A, groups=(TEAM,), program=first)
    leases = folder(team / VERSION_DIR)
    there = {p.name for p in (team / VERSION_DIR).glob("*-cache")}  # (JAX's helpers both programs use)
    keys = sorted(p.name.removesuffix("-cache") for p in (public / "learn" / VERSION_DIR).glob("*-cache")
                  if p.name not in there)
    assert leases.is_dir() and len(keys) >= 2, keys
    for key in keys:
        plant(team / VERSION_DIR, key, host="elsewhere", pid=4242, expect=86400.0, uid=MEMBER_A,
              mtime=time.time() + 86400)
        os.chmod(leases / key, 0o640)
        os.chown(leases / key, MEMBER_A, TEAM)
    log = public / "victim.log"
    log.touch()
    os.chown(log, MEMBER_B, TEAM)
    logged = ("import logging\nlogging.getLogger('gkx_autocache').setLevel(logging.DEBUG)\n"
              f"logging.getLogger('gkx_autocache').addHandler(logging.FileHandler({str(log)!r}))\n")
    run, err = run_program(venv, "-W", "error", user=MEMBER_B, groups=(TEAM,), program=logged + PROGRAM,
                           env={"GKX_JAX_CACHE_SHARED_TIMEOUT": "1"})
    clean, _ = run_program(venv, env={"GKX_JAX_CACHE_DIR": str(public / "clean")})
    assert run["result"] == clean["result"] and run["requests"] - run["hits"] == len(keys) and "Traceback" not in err, err
    text = log.read_text()
    assert text.count("waited out its holder elsewhere:4242") == 1 and text.count("waiting for") == 1, text
    assert all((team / VERSION_DIR / f"{key}-cache").exists() for key in keys)
    assert sorted(p.name for p in leases.iterdir()) == keys  # the member's files, as they were
