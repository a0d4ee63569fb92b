"""The rebuild (SPEC §18): the records of a version directory read as trust allows, each compile
made again by this JAX (its module parsed, its options built, its key computed by this JAX's own
functions: ``_jax.rebuild``), the keys already there skipped, the rest compiled in parallel threads
(XLA releases the GIL while it compiles) and written through the store; and what came of it.
The ``rebuild`` command and ``ahead`` run it; how: docs/how-it-works.md, "Rebuild ahead".
"""

from __future__ import annotations

import errno
import functools
import os
import queue
import stat
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol

from gkx_autocache import _files, _trust
from gkx_autocache._diagnostics import logger
from gkx_autocache._layout import RECORD_SIDECAR, VERSION_PREFIX, key_match
from gkx_autocache._rebuild import record as _record

ELSEWHERE = "another process compiles it now"
TEAM_UNSIGNED = ("in a directory others can write (a team directory), records are read only when signed: set "
                 "GKX_JAX_CACHE_SIGNING_KEY")


class Target(Protocol):
    """Where rebuilt entries go: the store serving this JAX's directory (``_store.Store``)."""

    @property
    def path(self) -> str: ...

    def has(self, key: str) -> bool: ...

    def lease(self, key: str, compile_secs: float) -> bool: ...

    def let_go(self, key: str) -> None: ...

    def rebuilt(self, key: str, value: bytes, compile_secs: float, record: bytes) -> int: ...


class Claims(Protocol):
    """Keys being rebuilt in this process, which its lookups wait for (``ahead.Inflight``): told each
    key the rebuild will compile (``known``) and when all are known (``keyed``); asked whether the
    program's compiles are none of them (``futile``: its code changed too)."""

    def claim(self, key: str, compile_secs: float) -> bool: ...

    def done(self, key: str) -> None: ...

    def known(self, key: str) -> None: ...

    def keyed(self) -> None: ...

    def futile(self) -> bool: ...


class Unclaimed:
    """No lookups to tell (the ``rebuild`` command's own process): every key is the rebuild's."""

    def claim(self, key: str, compile_secs: float) -> bool:
        return True

    def done(self, key: str) -> None:
        pass

    def known(self, key: str) -> None:
        pass

    def keyed(self) -> None:
        pass

    def futile(self) -> bool:
        return False


class Keyed(NamedTuple):
    """A record whose key this JAX computed, missing here: what its compile needs (its module's
    bytes are the record's: see ``Rebuilder.compile``)."""

    found: Found
    key: str
    backend: Any
    devices: Any
    options: Any


class Found(NamedTuple):
    """A record to rebuild: the key it was written with, where, its bytes and what they hold."""

    key: str
    version_dir: str
    data: bytes
    record: _record.Record


class Gathered:
    """The records found, and those refused, by why."""

    def __init__(self) -> None:
        self.found: list[Found] = []
        self.refused: dict[str, int] = {}
        self.other_programs = 0
        self.dirs: list[str] = []

    def refuse(self, why: str, n: int = 1) -> None:
        self.refused[why] = self.refused.get(why, 0) + n


def version_of(version_dir: str) -> tuple[int, ...]:
    """``(0, 10, 1)`` of ``.../jax-0.10.1`` (its numbers, for ordering), ``()`` where it has none."""
    import re

    name = os.path.basename(version_dir.rstrip(os.sep)).removeprefix(VERSION_PREFIX)
    return tuple(int(n) for n in re.findall(r"\d+", name.split("+")[0])[:4])


def older_dir(version_dir: str) -> str | None:
    """The newest version directory beside ``version_dir`` of an older JAX, or None."""
    root, mine = os.path.dirname(version_dir.rstrip(os.sep)), version_of(version_dir)
    try:
        names = [d.name for d in os.scandir(root) if d.name.startswith(VERSION_PREFIX) and d.is_dir(follow_symlinks=False)]
    except OSError:
        return None
    older = sorted((version_of(n), n) for n in names if version_of(n) < mine)
    return os.path.join(root, older[-1][1]) if older else None


def gather(dirs: Iterable[str], secret: bytes | None, program: str | None = None,
           keys: dict[str, set[str]] | None = None) -> Gathered:
    """The records of ``dirs`` this user may compile (SPEC §8, §18): in a private directory, those
    owned by this user (or root) and writable by no one else; in a directory others can write,
    none unless signed; with a signing key, only those whose signature verifies. ``program``: only
    a program's records (its label contains it, or its identity begins with it); ``keys``: only
    these entries' records, by directory. One record a compile (the newest, where two directories
    hold it), in the order the program first compiled them."""
    gathered = Gathered()
    newest: dict[str, Found] = {}
    for version_dir in dirs:
        gathered.dirs.append(version_dir)
        team = _trust.directory_problem(version_dir, team=False) is not None
        if team and _trust.directory_problem(version_dir, team=True) is not None:
            continue  # not a directory this user may read at all (the store refuses it too)
        names = _names(version_dir, None if keys is None else keys.get(version_dir, set()))
        if team and secret is None:
            gathered.refuse(TEAM_UNSIGNED, len(names))
            continue
        check = functools.partial(_trust.entry_problem, team=team)
        for key in names:
            data = _files.read(os.path.join(version_dir, key + RECORD_SIDECAR), _record.RECORD_LIMIT, check=check)
            if data is None:
                gathered.refuse("not this user's to trust (another user wrote it, or others can write it)")
                continue
            try:
                found = _record.decode(data, secret)
            except _record.Refused as exc:
                gathered.refuse(f"refused: {exc}")
                continue
            if program is not None and program not in found.label and not found.program.startswith(program):
                gathered.other_programs += 1
                continue
            same = _record.identity(found)
            if same not in newest or newest[same].record.fields.get("written", 0) < found.fields.get("written", 0):
                newest[same] = Found(key, version_dir, data, found)
    gathered.found = sorted(newest.values(), key=lambda f: float(f.record.fields.get("written", 0.0)))
    return gathered


def longest_first(found: list[Found]) -> list[Found]:
    """``found`` with the compiles recorded as the longest first (a record without a time, last):
    where no program waits for its keys in its order (the ``rebuild`` command), the last compiles
    to start are short and the threads end together. In the program's order, on the TPU v5e's 13
    threads, a long compile started last kept the other twelve idle (docs/benchmarks.md)."""
    return sorted(found, key=lambda f: -float(f.record.fields.get("compile", 0.0)))  # (a time: ``record``'s check)


def _names(version_dir: str, only: set[str] | None) -> list[str]:
    """The keys whose records ``version_dir`` holds (``only``: of these)."""
    if only is not None:
        return sorted(only)
    try:
        with os.scandir(version_dir) as items:
            return sorted(match[0] for item in items if item.name.endswith(RECORD_SIDECAR)
                          and (match := key_match(item.name)) is not None)
    except OSError:
        return []


class Outcome:
    """What came of a rebuild."""

    def __init__(self) -> None:
        self.rebuilt = 0
        self.present = 0
        self.would = 0  # ``--dry-run``: missing, would be compiled
        self.taken = 0  # looked up by the program before the rebuild reached it: compiled there
        self.failed: dict[str, int] = {}
        self.stopped: str | None = None
        self.bytes = 0
        self.compile_secs = 0.0
        self.seconds = 0.0
        self._lock = threading.Lock()

    def add(self, what: str, nbytes: int = 0, secs: float = 0.0) -> None:
        with self._lock:
            if what in ("rebuilt", "present", "would", "taken"):
                setattr(self, what, getattr(self, what) + 1)
            else:
                self.failed[what] = self.failed.get(what, 0) + 1
            self.bytes += nbytes
            self.compile_secs += secs

    @property
    def done(self) -> int:
        return self.rebuilt + self.present + self.would + self.taken + sum(self.failed.values())


class Rebuild:
    """Compile ``found`` records again for ``target`` with ``jobs`` threads of this process; each key
    ``claims`` allows (a lookup of this process may have taken it), under ``cap`` bytes of the
    directory (0: none) of which ``used`` are taken; ``progress(outcome, total)`` after each."""

    def __init__(self, target: Target, rebuilder: Any, jobs: int, claims: Claims | None = None, cap: int = 0,
                 used: int = 0, dry_run: bool = False,
                 progress: Callable[[Outcome, int], None] | None = None) -> None:
        self._target = target
        self._rebuilder = rebuilder
        self._jobs = max(1, jobs)
        self._claims = claims if claims is not None else Unclaimed()
        self._cap, self._used = cap, used
        self._dry_run = dry_run
        self._progress = progress
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._compiling = 0  # compiles running now: each one's CPU is its share of the process's
        self.outcome = Outcome()

    @property
    def compiling(self) -> int:
        """The compiles running now."""
        with self._lock:
            return self._compiling

    def stop(self, why: str) -> None:
        """Take no more records (those compiling finish)."""
        with self._lock:
            if self.outcome.stopped is None:
                self.outcome.stopped = why
        self._stop.set()

    def run(self, found: list[Found]) -> Outcome:
        """One thread computes the keys, in the records' order (parsing and keying hold the GIL: more
        would not go faster), and hands the missing ones to ``jobs`` threads that compile them."""
        started = time.perf_counter()
        jobs = min(self._jobs, max(len(found), 1))
        ready: queue.Queue[Keyed | None] = queue.Queue()

        def told() -> None:
            if self._progress is not None:
                try:
                    self._progress(self.outcome, len(found))
                except Exception:
                    pass

        def keyer() -> None:
            try:
                for item in found:
                    if self._stop.is_set():
                        break
                    keyed = self._key(item)
                    if isinstance(keyed, Keyed):
                        ready.put(keyed)
                    else:
                        self.outcome.add(keyed)
                        told()
            finally:
                self._claims.keyed()
                for _ in range(jobs):
                    ready.put(None)

        def work() -> None:
            while (item := ready.get()) is not None:
                if self._stop.is_set():
                    continue  # (drained: the keyer's end comes through)
                if self._claims.futile():
                    self.stop("futile")
                    continue
                self.outcome.add(*self._claimed(item))
                told()

        threads = [threading.Thread(target=keyer, name="gkx-autocache rebuild keys", daemon=True)]
        threads += [threading.Thread(target=work, name=f"gkx-autocache rebuild {i}", daemon=True) for i in range(jobs)]
        for thread in threads:
            thread.start()
        # Not ``join``: one that Ctrl-C interrupts marks its thread stopped while it still runs
        # (CPython 3.11's threading, bpo-45274), and nothing could wait for it any more.
        try:
            while any(thread.is_alive() for thread in threads):
                time.sleep(0.02)
        except KeyboardInterrupt:
            # A compile cannot be interrupted, and a thread that comes back from XLA once the
            # interpreter finalizes aborts the process ("terminate called ..."): the running ones end first.
            self.stop("interrupted")
            while any(thread.is_alive() for thread in threads):
                time.sleep(0.02)
            raise
        self.outcome.seconds = time.perf_counter() - started
        return self.outcome

    def _key(self, found: Found) -> Keyed | str:
        """A record's key as this JAX computes it, with what its compile needs; or what came of it
        (present, would be rebuilt, not here, not parsed...). Never raises."""
        rebuilder, fields = self._rebuilder, found.record.fields
        step = "its devices"
        try:
            backend = rebuilder.backend(str(fields["platform"]))
            devices = rebuilder.devices(backend, list(fields["devices"]), list(fields["shape"]))
            step = "its module does not parse under this JAX"
            module = rebuilder.parse(found.record.module)
            step = "its compile options cannot be built"
            options = rebuilder.options(fields, backend, devices, module)
            step = "its key cannot be computed"
            key = rebuilder.key(module, devices, options, backend)
        except LookupError as exc:
            return f"not here: {exc}"
        except Exception as exc:
            return f"{step} ({_first_line(exc)})"
        self._claims.known(key)
        if self._target.has(key):
            return "present"
        if self._dry_run:
            return "would"
        return Keyed(found, key, backend, devices, options)

    def _claimed(self, item: Keyed) -> tuple[str, int, float]:
        if not self._claims.claim(item.key, float(item.found.record.fields.get("compile", 0.0))):
            return "taken", 0, 0.0
        try:
            if self._target.has(item.key):  # (written meanwhile: another process, the program)
                return "present", 0, 0.0
            # Once per key across processes, as a miss: copies of the program started together
            # wait for this compile, and one that another process is in is left to it.
            if not self._target.lease(item.key, float(item.found.record.fields.get("compile", 0.0))):
                return ("present", 0, 0.0) if self._target.has(item.key) else (ELSEWHERE, 0, 0.0)
            try:
                return self._compile(item.found, item.key, item.backend, item.devices, item.options)
            finally:
                self._target.let_go(item.key)
        finally:
            self._claims.done(item.key)

    def _compile(self, found: Found, key: str, backend: Any, devices: Any, options: Any) -> tuple[str, int, float]:
        from gkx_autocache._store import compile_clock

        rebuilder = self._rebuilder
        with self._lock:
            self._compiling += 1
            sharing = self._compiling
        cpu, wall = compile_clock(), time.perf_counter()
        try:
            executable = rebuilder.compile(backend, found.record.module, devices, options)
            wall = time.perf_counter() - wall
            # The process's CPU over the compile, shared among the compiles running meanwhile.
            cpu = max(compile_clock() - cpu, 0.0) / max(sharing, 1)
            least_secs, least_bytes = rebuilder.thresholds()
            if wall < least_secs:
                return "below min_compile_time_secs: JAX would not write it", 0, cpu
            entry = rebuilder.entry(executable, backend, wall)
        except Exception as exc:
            return f"does not compile under this JAX ({_first_line(exc)})", 0, 0.0
        finally:
            with self._lock:
                self._compiling -= 1
        if len(entry) < least_bytes:
            return "below min_entry_size_bytes: JAX would not write it", 0, cpu
        with self._lock:
            if self._cap and self._used + len(entry) > self._cap:
                self._stop.set()
                self.outcome.stopped = self.outcome.stopped or "cap"
                return "not written: the directory is at its cap (max_size)", 0, cpu
            self._used += len(entry)
        try:
            written = self._target.rebuilt(key, entry, cpu, found.data)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS):  # (EFBIG: `ulimit -f`)
                self.stop(f"disk: {exc.strerror or exc}")
            return f"not written ({exc.strerror or exc})", 0, cpu
        return "rebuilt", written, cpu


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:240]


def take_lock(version_dir: str, team: bool) -> tuple[int | None, str | None]:
    """The directory's rebuild lock (``rebuild.lock``, an ``flock``, let go with its descriptor, and
    by a killed holder): ``(descriptor, None)``; ``(None, who holds it)`` where another rebuild runs;
    ``(-1, None)`` where this file system has no flock (then two rebuilds may compile one key twice:
    each writes it whole)."""
    from gkx_autocache._layout import REBUILD_LOCK
    from gkx_autocache._record import ledger

    meta = _files.bookkeeping_dir(version_dir, team)
    if meta is None:
        return -1, None
    try:
        fd = os.open(os.path.join(meta, REBUILD_LOCK), os.O_RDWR | os.O_CREAT | _files.NOFOLLOW | _files.NONBLOCK,
                     _files.file_mode(team))
    except OSError as exc:
        logger.debug("rebuild lock not opened: %s", exc)
        return -1, None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO planted there: no lock, never a hang
        os.close(fd)
        return -1, None
    taken = ledger.take_flock(fd)
    if taken is None:
        os.close(fd)
        return -1, None
    if not taken:
        try:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        except OSError:
            holder = ""
        os.close(fd)
        return None, holder or "another process"
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
    except OSError:
        pass
    return fd, None


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
