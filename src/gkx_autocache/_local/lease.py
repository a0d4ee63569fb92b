"""Once per key across processes on one host (SPEC §18, issue 69): a key one process is compiling is
not compiled by another at the same time. The first process to miss a key takes its lease, a file
made with ``O_EXCL`` in the local level's bookkeeping (no flock: the store works where there is
none), holding its host, pid and start time, and kept fresh by a heartbeat; the others wait for its
entry, bounded, then compile themselves. Design and figures: docs/how-it-works.md, "Leases".
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from gkx_autocache import _files, _fork
from gkx_autocache._diagnostics import logger
from gkx_autocache._formats import compile_secs_of
from gkx_autocache._layout import COMPILE_SIDECAR, LEASE_DIR, META_DIR
from gkx_autocache._record import ledger as _ledger  # host(), alive(), born(): how ledgers tell a live process

# What a lookup that missed comes to: this process holds the key's lease (it compiles, and lets go
# after its write); another's entry appeared while it waited (a hit); or it compiles without one.
# A rebuild's compile, which never waits, may also find another process compiling the key now.
HELD, READY, ALONE, BUSY = "held", "ready", "alone", "busy"

BEAT = 1.0  # a holder touches its leases this often (their mtime is the heartbeat)
STALE = 5.0  # a lease whose heartbeat is older was left by a holder that stopped (killed on another host, stopped)
UNWRITTEN_KEEP = 60.0  # a key JAX did not write (its threshold, an error): waiters compile at once this long
FACTOR, MARGIN = 2.0, 1.0  # the wait for a key with a recorded compile time: twice that (CPU seconds), and a second
FIRST_POLL, LAST_POLL = 0.005, 0.05  # a waiter looks for the entry this often, backing off from the first to the last
MAGIC = "gkx-lease"
COMPILING, UNWRITTEN = b"C", b"U"  # the lease's last byte: its holder compiles; its holder's JAX did not write


class Holder(NamedTuple):
    """A lease as a waiter reads it: who holds it (``uid``: the file's owner), what its holder
    recorded the compile to take (None: nothing), whether the key was left unwritten, the file."""

    uid: int
    host: str
    pid: int
    expect: float | None
    unwritten: bool
    ino: int


class Broken(NamedTuple):
    """A lease no one holds any more (its process is gone, its heartbeat stopped, it says nothing
    readable), to be broken; ``ino`` None: not a regular file, planted, never waited on or removed."""

    ino: int | None
    why: str


def line(host: str, pid: int, born: int | None, expect: float | None) -> bytes:
    """A lease's bytes: who holds it, what it expects the compile to take, and its state, last."""
    expected = "-" if expect is None else f"{expect:.3f}"
    return f"{MAGIC} {host} {pid} {born if born is not None else '-'} {expected} ".encode() + COMPILING


def parse(data: bytes) -> tuple[str, int, int | None, float | None, bool] | None:
    """``(host, pid, born, expect, unwritten)`` of a lease's bytes, or None where they are not one
    (a group member of a team directory can write anything there)."""
    fields = data.decode("ascii", "replace").split()
    if len(fields) != 6 or fields[0] != MAGIC or not fields[2].isdigit() or fields[5] not in ("C", "U"):
        return None
    born = int(fields[3]) if fields[3].isdigit() else None
    expect = compile_secs_of(fields[4].encode()) if fields[4] != "-" else None
    return fields[1], int(fields[2]), born, expect, fields[5] == "U"


def recorded(version_dir: str, key: str) -> float | None:
    """The compile time this user recorded for ``key`` in an earlier run, where its sidecar outlived
    its entry (an entry JAX could not load is removed, its sidecar kept), or None. Another user's
    sidecar in a team directory sets no wait: a waiter never trusts a claim beyond ``shared_timeout``."""
    uid = os.geteuid() if hasattr(os, "geteuid") else -1
    data = _files.read(os.path.join(version_dir, key + COMPILE_SIDECAR), 64,
                       check=lambda st: None if st.st_uid == uid else "another user's")
    return compile_secs_of(data) if data is not None else None


class Unleased:
    """No leases (a directory someone else reads, a test's store): every miss compiles."""

    def settle(self, version_dir: str, team: bool, key: str, ready: Callable[[], bool],
               expected: float | None = None) -> str:
        return ALONE

    def take(self, version_dir: str, team: bool, key: str, ready: Callable[[], bool],
             expected: float | None = None) -> str:
        return ALONE

    def release(self, version_dir: str, key: str) -> None:
        pass


class Leases:
    """This process's leases: those each thread took in the compile it is in (let go at that
    compile's end, ``begin``/``end`` around JAX's ``compile_or_get_cached``), the heartbeat of those
    held, and the holders it stopped waiting for. ``timeout``: ``shared_timeout``, the wait where no
    compile time is recorded, and the most another user's lease holds anyone."""

    def __init__(self, timeout: float, host: str = "", uid: int | None = None) -> None:
        self._timeout = timeout
        self._host = host or _ledger.host()
        self._uid = uid if uid is not None else (os.geteuid() if hasattr(os, "geteuid") else -1)
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str], tuple[int, int, float | None]] = {}  # (dir, key) -> lease fd, folder fd, unwritten since
        self._compiles = threading.local()  # ``taken``: (dir, key) this thread's compile took; None outside one
        self._beating = threading.Event()  # set while the heartbeat thread runs
        self._distrusted: set[tuple[int, str, int]] = set()  # holders waited out: (uid, host, pid); another user's: pid -1
        # Each version directory's lease folder, opened once (its descriptor, and its device and
        # inode to tell it is still the one its path names): opening it a component at a time was
        # 13 system calls a lease, each a hand-over of the GIL (a rebuild's leases on a TPU host
        # took 20 ms each with 12 threads, mostly waiting on the compile clock's reads: 1.7 s of 84
        # leases before this and after).
        self._folders: dict[str, tuple[int, tuple[int, int]]] = {}
        self._born: tuple[int, int | None] = (-1, None)  # (this process's pid, when it started)
        _fork.in_child(self._forked)
        atexit.register(self.release_all)

    def _forked(self) -> None:
        """A forked child holds none of its parent's leases (their files name the parent), and has no
        heartbeat; it opens the lease folders again (a daemon closes every descriptor it inherited:
        a number kept would be another file's by its first lease)."""
        inherited = [d for fd, folder, _ in self._held.values() for d in (fd, folder)]
        for descriptor in inherited + [kept for kept, _ in self._folders.values()]:
            try:
                os.close(descriptor)
            except OSError:
                pass
        self._held = {}
        self._folders = {}
        self._lock = threading.Lock()
        self._compiles = threading.local()
        self._beating = threading.Event()

    # -- around JAX's compile ---------------------------------------------------------------------

    def begin(self) -> list[tuple[str, str]] | None:
        """A compile starts on this thread: what an enclosing one took, to give to ``end``."""
        outer: list[tuple[str, str]] | None = getattr(self._compiles, "taken", None)
        self._compiles.taken = []
        return outer

    def end(self, outer: list[tuple[str, str]] | None) -> None:
        """The compile ends: a lease it took and did not let go at a write is a key JAX did not write
        (below a threshold, an error, host callbacks it cannot cache): waiters compile at once."""
        taken: list[tuple[str, str]] = getattr(self._compiles, "taken", None) or []
        self._compiles.taken = outer
        for version_dir, key in taken:
            self._unwritten(version_dir, key)

    # -- a lookup that missed ---------------------------------------------------------------------

    def settle(self, version_dir: str, team: bool, key: str, ready: Callable[[], bool],
               expected: float | None = None) -> str:
        """What a miss of ``key`` in ``version_dir`` comes to: ``HELD`` (this thread compiles it, and
        ``release`` lets go after the write), ``READY`` (another's entry is there now: ``ready()``), or
        ``ALONE`` (compile without a lease: outside a compile, no folder, the wait is over).
        ``expected``: the compile time this user recorded for it, or None. Never raises."""
        taken = getattr(self._compiles, "taken", None)
        if taken is None:  # a lookup outside JAX's compile (a probe): nothing would let the lease go
            return ALONE
        outcome = self._lease(version_dir, team, key, ready, expected, wait=True)
        if outcome == HELD:
            taken.append((version_dir, key))
        return outcome

    def take(self, version_dir: str, team: bool, key: str, ready: Callable[[], bool],
             expected: float | None = None) -> str:
        """A compile outside JAX's (a rebuild's) of ``key``, which never waits: ``HELD`` (this thread
        compiles it; ``release`` after the write), ``READY`` (its entry is there now), ``BUSY``
        (another process compiles it now: leave it to that one), or ``ALONE`` (no lease can be
        made: compile). Never raises."""
        return self._lease(version_dir, team, key, ready, expected, wait=False)

    def _lease(self, version_dir: str, team: bool, key: str, ready: Callable[[], bool], expected: float | None,
               wait: bool) -> str:
        """``settle``'s and ``take``'s outcome; a lease taken is held (``HELD``). Never raises."""
        try:
            folder = self._folder(version_dir, team)
        except OSError as exc:
            logger.debug("no lease for %s: %s", key, exc)
            return ALONE
        outcome, fd = ALONE, None
        try:
            outcome, fd = self._settle(folder, team, key, ready, expected, wait=wait)
        except Exception as exc:  # a lease is an optimisation: never in the way of a compile
            logger.debug("lease of %s: %s", key, exc)
        finally:  # (a KeyboardInterrupt while it waits goes on to the user, the folder closed)
            if fd is None:
                os.close(folder)
        if fd is None:
            return outcome
        self._hold(version_dir, key, fd, folder)
        return HELD

    def _hold(self, version_dir: str, key: str, fd: int, folder: int) -> None:
        with self._lock:
            self._held[(version_dir, key)] = (fd, folder, None)
            if not self._beating.is_set():
                self._beating.set()
                threading.Thread(target=self._beat, name="gkx-autocache-lease", daemon=True).start()

    def _folder(self, version_dir: str, team: bool) -> int:
        """A descriptor of ``.gkx-autocache/leases`` of ``version_dir``, made where missing, opened
        without following a link at any level (once: then a copy of that descriptor, while the path
        still names that folder; removed since by ``clear``, made again). Raises OSError."""
        path = os.path.join(version_dir, META_DIR, LEASE_DIR)
        try:
            st = os.stat(path)
            named: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except OSError:
            named = None
        with self._lock:  # (under the lock: one another thread replaces is closed, its number soon another file's)
            known = self._folders.get(version_dir)
            if known is not None and known[1] == named:
                try:
                    return os.dup(known[0])
                except OSError:
                    pass
        if _files.bookkeeping_dir(version_dir, team, LEASE_DIR) is None:
            raise OSError(f"no bookkeeping folder in {version_dir}")
        fd = _files.open_dir(path, search=True)
        try:
            st = os.fstat(fd)
            kept = os.dup(fd)
        except OSError:
            os.close(fd)
            raise
        with self._lock:
            old = self._folders.get(version_dir)
            self._folders[version_dir] = (kept, (st.st_dev, st.st_ino))
            if old is not None:
                os.close(old[0])
        return fd

    def _settle(self, folder: int, team: bool, key: str, ready: Callable[[], bool],
                expected: float | None, wait: bool = True) -> tuple[str, int | None]:
        """``settle``'s outcome, with the lease's descriptor where it is ``HELD``; ``wait``: False
        for ``take`` (``BUSY`` where a live holder has it)."""
        deadline: float | None = None
        delay = FIRST_POLL
        for _ in range(8):  # takes: each after a lease was let go or broken (a race lost to another waiter: waits again)
            fd = self._create(folder, team, key, expected)
            if fd is not None:
                if not ready():
                    return HELD, fd
                # Its holder wrote it and let go between this thread's lookup and its create: a hit.
                _files.remove_at(key, folder)
                os.close(fd)
                return READY, None
            while True:
                found = self._judge(folder, team, key)
                if found is None:  # let go: after a write, the entry is there
                    if ready():
                        return READY, None
                    break
                if isinstance(found, Broken):
                    if found.ino is None:
                        logger.debug("lease of %s: %s, not waited on", key, found.why)
                        return ALONE, None
                    logger.debug("lease of %s broken: %s", key, found.why)
                    self._break(folder, key, found.ino)
                    break
                if found.unwritten or (found.uid, found.host, found.pid) in self._distrusted \
                        or (found.uid, "", -1) in self._distrusted:
                    return ALONE, None
                if not wait:
                    return (READY if ready() else BUSY), None
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._bound(found, expected)
                    logger.debug("lease of %s: waiting for %s:%d, at most %.1f s", key, found.host, found.pid,
                                 deadline - now)
                if ready():
                    return READY, None
                if now >= deadline:  # a hung holder, or one whose compile takes longer than recorded
                    logger.debug("lease of %s: waited out its holder %s:%d; compiling", key, found.host, found.pid)
                    self._distrusted.add((found.uid, found.host, found.pid) if found.uid == self._uid
                                         else (found.uid, "", -1))
                    return ALONE, None
                time.sleep(min(delay, max(deadline - now, 0.0)))
                delay = min(delay * 1.5, LAST_POLL)
        return ALONE, None

    def _bound(self, holder: Holder, expected: float | None) -> float:
        """How long a waiter waits for ``holder``: twice the compile time recorded for the key, and a
        second (this user's own record, or its own lease's), else ``shared_timeout``; another user's
        lease never longer than ``shared_timeout``."""
        own = holder.uid == self._uid
        recorded = expected if expected is not None else holder.expect if own else None
        bound = self._timeout if recorded is None else FACTOR * recorded + MARGIN
        return bound if own else min(bound, self._timeout)

    def _create(self, folder: int, team: bool, key: str, expected: float | None) -> int | None:
        """The lease, made (its descriptor), or None where another holds one. Raises OSError where
        none can be made (a read-only folder, a name too long)."""
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _files.NOFOLLOW | _files.BINARY
        try:
            fd = os.open(key, flags, 0o600, dir_fd=folder)
        except FileExistsError:
            return None
        try:
            if team and hasattr(os, "fchmod"):
                os.fchmod(fd, 0o640)  # the team's members honour it; the umask masked the open mode
            os.write(fd, line(self._host, os.getpid(), self._started(), expected))
        except OSError:
            os.close(fd)
            _files.remove_at(key, folder)
            raise
        return fd

    def _started(self) -> int | None:
        """When this process started (``ledger.born``), read once a process."""
        pid = os.getpid()
        if self._born[0] != pid:
            self._born = (pid, _ledger.born(pid))
        return self._born[1]

    def _judge(self, folder: int, team: bool, key: str) -> Holder | Broken | None:
        """The lease of ``key`` as a waiter reads it: its holder, or why it is broken; None where
        there is none (let go meanwhile)."""
        try:
            fd = _files.open_regular(key, dir_fd=folder)
        except FileNotFoundError:
            return None
        except OSError as exc:  # a symlink, a FIFO, a directory: planted
            return Broken(None, f"not a regular file ({exc.strerror})")
        try:
            st = os.fstat(fd)
            data = os.read(fd, 256)
        finally:
            os.close(fd)
        if st.st_uid != self._uid and not team:
            return Broken(None, f"owned by uid {st.st_uid} in a private folder")
        parsed = parse(data)
        if parsed is None:
            # A holder writes its line right after its create: a lease a second old that says nothing is no one's.
            return Broken(st.st_ino, "unreadable") if time.time() - st.st_mtime > 1.0 else \
                Holder(st.st_uid, "?", -1, None, False, st.st_ino)
        host, pid, born, expect, unwritten = parsed
        if host == self._host:
            if not _running(pid, born):
                return Broken(st.st_ino, f"its process {pid} is gone")
            if _owner(pid) not in (None, st.st_uid):
                return Broken(st.st_ino, f"process {pid} is not its owner's")
        if time.time() - st.st_mtime > (UNWRITTEN_KEEP if unwritten else STALE):
            return Broken(st.st_ino, f"its heartbeat stopped {time.time() - st.st_mtime:.0f} s ago")
        return Holder(st.st_uid, host, pid, expect, unwritten, st.st_ino)

    def _break(self, folder: int, key: str, ino: int) -> None:
        """Remove the broken lease ``ino``: moved aside first, so that one another waiter broke and
        took meanwhile is put back, not removed (as ``_record.locks`` breaks a stale lock)."""
        away = f".{key}.{os.getpid()}.{threading.get_ident()}.broken"
        try:
            os.rename(key, away, src_dir_fd=folder, dst_dir_fd=folder)
        except OSError:
            return
        try:
            if os.stat(away, dir_fd=folder, follow_symlinks=False).st_ino != ino:
                os.link(away, key, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
        except OSError:
            pass
        _files.remove_at(away, folder)

    # -- holding ----------------------------------------------------------------------------------

    def release(self, version_dir: str, key: str) -> None:
        """Let go of the lease of ``key`` after its entry was written (nothing where none is held)."""
        taken = getattr(self._compiles, "taken", None)
        if taken is not None and (version_dir, key) in taken:
            taken.remove((version_dir, key))
        self._let_go((version_dir, key))

    def release_all(self) -> None:
        """At exit: every lease this process holds (a process that ends by ``os._exit`` or a signal
        leaves its own, broken by the next waiter: its pid is gone)."""
        for held in list(self._held):
            self._let_go(held)

    def _let_go(self, held: tuple[str, str]) -> None:
        with self._lock:
            found = self._held.pop(held, None)
        if found is None:
            return
        fd, folder, _ = found
        try:
            if os.fstat(fd).st_ino == os.stat(held[1], dir_fd=folder, follow_symlinks=False).st_ino:
                os.unlink(held[1], dir_fd=folder)  # (one another waiter broke and took is not ours)
        except OSError:
            pass
        finally:
            os.close(fd)
            os.close(folder)

    def _unwritten(self, version_dir: str, key: str) -> None:
        """Mark the lease of a key JAX did not write: waiters compile at once, and so do later misses
        of it while this process keeps it (``UNWRITTEN_KEEP``)."""
        with self._lock:  # (under the lock: a descriptor closed meanwhile may be another file's by now)
            found = self._held.get((version_dir, key))
            if found is None:
                return
            fd, folder, _ = found
            self._held[(version_dir, key)] = (fd, folder, time.monotonic())
            try:
                os.lseek(fd, -1, os.SEEK_END)
                marked = os.write(fd, UNWRITTEN) == 1
            except OSError:
                marked = False
        if not marked:
            self._let_go((version_dir, key))

    def _beat(self) -> None:
        """The heartbeat: each held lease's mtime, every ``BEAT`` seconds, while any is held; an
        unwritten key's lease let go after ``UNWRITTEN_KEEP``."""
        while True:
            time.sleep(BEAT)
            now = time.monotonic()
            expired = []
            with self._lock:  # (under the lock: a descriptor let go meanwhile may be another file's by now)
                if not self._held:
                    self._beating.clear()
                    return
                for name, (fd, _, unwritten) in self._held.items():
                    if unwritten is not None and now - unwritten > UNWRITTEN_KEEP:
                        expired.append(name)
                        continue
                    try:
                        os.utime(fd)
                    except Exception:  # (a platform without futimens: the lease goes stale, others break it)
                        pass
            for name in expired:
                self._let_go(name)


def _running(pid: int, born: int | None) -> bool:
    """Whether the process ``pid`` (started at ``born``) runs on this host: a killed one that its
    parent has not reaped yet (a zombie, which a launcher waiting on its copies in turn keeps) does not."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read(4096).rsplit(b")", 1)[1].split()
        if fields[0] in (b"Z", b"X"):
            return False
    except (OSError, IndexError):
        pass
    return _ledger.alive(pid, born)


def _owner(pid: int) -> int | None:
    """The uid a process of this host runs as (Linux), or None where it cannot be read."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
