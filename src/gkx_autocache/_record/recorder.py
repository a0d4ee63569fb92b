"""Counting in this process: JAX's cache events, the store's hits, misses and writes, the ledger
file they are recorded in as the process goes (SPEC §7: what repeats is counted here and written as
a tally), the run the process belongs to (SPEC §13.1), and the ``report`` line at exit. The files
and their folding are ``ledger``'s and ``fold``'s; the design: docs/how-it-works.md, "The ledger:
design notes".
"""

from __future__ import annotations

import atexit
import json
import os
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from gkx_autocache import _files, _fork
from gkx_autocache._diagnostics import label, logger, warn
from gkx_autocache._layout import LEDGER_DIR, LEDGER_SUFFIX
from gkx_autocache._record import ledger as _ledger

if TYPE_CHECKING:  # (a type only: nothing to compile on import jax)
    from typing import Protocol

    class Explains(Protocol):
        """What the recorder asks of who explains its misses (``_explain.seam.Watch``)."""

        def cause(self, key: str, run: Run) -> dict[str, Any]: ...

        def ingredients(self, key: str, run: Run) -> dict[str, Any]: ...

        def forget(self) -> None: ...

        def forget_given(self) -> None: ...

        def move(self, version_dir: str) -> None: ...

        def after_fork(self) -> None: ...

REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
HITS = "/jax/compilation_cache/cache_hits"
RETRIEVAL = "/jax/compilation_cache/cache_retrieval_time_sec"
JAX_SAVED = "/jax/compilation_cache/compile_time_saved_sec"
# Tracing and lowering, which no cache skips: the largest cost left in a warm run (JAX's dispatch module),
# with the function's name where JAX gives it (``fun_name``: from JAX 0.5).
TRACING = "/jax/core/compile/jaxpr_trace_duration"
LOWERING = "/jax/core/compile/jaxpr_to_mlir_module_duration"
RUN = "GKX_JAX_CACHE_RUN"  # "<start time>-<pid>": the run this process belongs to


class Run(NamedTuple):
    """A run (SPEC §13.1): the processes that count an entry written since it began as their own
    compile (a process, a pytest session with its workers, a parent and the children it starts)."""

    id: str  # "<start time>-<pid>"
    start: float


def run_of(env: Any = os.environ) -> Run | None:
    """The run named in the environment, and when it began; None when there is none (or it is not
    a plausible time: not ``nan``, ``inf`` or ``-1e400``)."""
    value = str(env.get(RUN, "")).strip()
    start, sep, pid = value.partition("-")
    try:
        when = float(start)
    except ValueError:
        return None
    if not sep or not pid.isdigit() or not 0.0 < when < 1e11 or len(value) > 40:
        return None
    return Run(value, when)


def begin_run() -> Run:
    """This process's run: the one the environment names, else a new one, named in the environment
    for the processes this one starts."""
    found = run_of()
    if found is not None:
        return found
    now = time.time()
    run = Run(f"{now:.3f}-{os.getpid()}", now)
    os.environ[RUN] = run.id
    return run


def module_name(traced: str) -> str:
    """A traced function's name as its module and its key name it: JAX names the tracing
    ``jit(step)`` (from 0.6; ``step`` before) and the lowering ``jit_step``; a lambda's ``jit(<lambda>)``
    is ``jit__lambda`` (``mlir.sanitize_name``, the trailing ``_`` stripped as JAX strips it after 0.6)."""
    head, paren, rest = traced.partition("(")
    if paren and rest.endswith(")"):
        traced = f"{head}_{rest[:-1]}"
    elif traced and not traced.startswith(("jit_", "pmap_", "xla_pmap_")):
        traced = f"jit_{traced}"
    return re.sub(r"[^\w.-]", "_", traced).rstrip("_") if traced else traced


class Recorder:
    """This process's counters and ledger file. Every method swallows its own errors: it runs
    inside JAX's compile path, where an exception would fail the user's ``jit`` call."""

    def __init__(self, directory: str, ledger: bool, team: bool = False, run: Run | None = None,
                 set_by: str | None = None,
                 serving: Callable[[], bool] = lambda: False, explainer: Explains | None = None) -> None:
        self.directory = directory
        self.team = team
        self.requests = 0
        self.jax_hits = 0
        self.jax_saved_secs = 0.0  # JAX's own figure, whole-second compile times: for remote dirs
        self.totals = _ledger.Totals()  # everything this process counted
        self.explainer = explainer  # names each miss's cause (SPEC §13), where JAX's key parts can be read
        self.run = run or Run(f"{time.time():.3f}-{os.getpid()}", time.time())  # begin() changes it
        self.set_by = set_by  # who gave JAX this directory, where it was not the package (``move``)
        self.cap: int | None = None  # the cap of a directory moved to, where not the package's own
        self.given = directory  # the directory as JAX was given it (a framework's may be relative)
        self.unserved: dict[str, str] = {}  # a directory JAX was given that the trust rules refuse -> why (``refuse``)
        self._serving = serving  # whether the store serves it (``_store.installed``)
        self._keeps_ledger = ledger
        self._pending = threading.local()  # the entry just read on this thread, until JAX says it loaded
        self._lock = threading.Lock()
        self._waiting: dict[int, dict[str, Any]] = {}  # thread -> its miss, until the compile's fate is known
        self._fd: int | None = None
        self._seen: set[tuple[str, ...]] = set()  # what this ledger has a record of
        self._repeats = _ledger.Totals()  # counted, not written as records: this ledger's tally
        self._tallied = _ledger.Totals()  # of those, what its last tally written holds
        self._ledger_run: str | None = None  # the run of the last ledger this process began
        self._dirty = False
        self._tally_at = 0.0
        self._written = 0
        self._block = 4096
        _fork.in_child(self._forked)  # also without a ledger: JAX may be given a writable directory since (move)

    @property
    def store_serving(self) -> bool:
        """Whether the package's store serves this process's directory: then its counts are true;
        else JAX's stock cache does, and only JAX's events are counted."""
        return self._serving()

    @property
    def writes(self) -> int:
        return self.totals.writes

    # JAX's monitoring events: counted whichever store serves the directory.
    def on_event(self, event: str, *args: Any, **kwargs: Any) -> None:
        if event == REQUESTS:
            self.requests += 1
        elif event == HITS:
            self.jax_hits += 1

    def on_duration(self, event: str, duration_secs: float, *args: Any, **kwargs: Any) -> None:
        try:
            if event in (TRACING, LOWERING):
                self._count_only({"e": "trace", "secs": max(duration_secs, 0.0),
                                  "name": module_name(str(kwargs.get("fun_name") or ""))})
            elif event == JAX_SAVED:
                self.jax_saved_secs += max(duration_secs, 0.0)
            elif event == RETRIEVAL:
                if self.explainer is not None:
                    self.explainer.forget()
                pending = getattr(self._pending, "hit", None)
                if pending is not None:
                    self._pending.hit = None
                    key, nbytes, compile_secs, by, rebuilt = pending
                    record = {"e": "hit", "key": key, "bytes": nbytes, "saved": round(max(compile_secs - duration_secs, 0.0), 6),
                              "read": round(max(duration_secs, 0.0), 6)}
                    if by == self.run.id:  # this run's own compile (SPEC §13.1), not one written while it ran
                        record["own"] = True
                    if rebuilt:  # a rebuild compiled it from a record (SPEC §18)
                        record["rebuilt"] = True
                    self._record(record, ("hit", key))
        except Exception:
            pass

    # The store's calls. A miss is recorded once the compile's fate is known (written, or not
    # written and why), so that it gets one cause: a compile JAX never writes is "not cached:
    # host callbacks" on every run, not "new".
    def hit(self, key: str, nbytes: int, compile_secs: float, by: str = "", rebuilt: bool = False) -> None:
        """An entry was read (written by the run ``by``, where its sidecar names one; ``rebuilt``: a
        rebuild compiled it); it is recorded when JAX reports its load time, on this thread."""
        self._settle()
        self._pending.hit = (key, nbytes, compile_secs, by, rebuilt)

    def miss(self, key: str, shared_off: str | None = None) -> None:
        self._pending.hit = None
        record: dict[str, Any] = {"e": "miss", "key": key, "t": round(time.time(), 3)}
        if self.explainer is not None:
            record.update(self.explainer.cause(key, self.run))
        if shared_off:  # the shared level, off since then, may have held it (SPEC §14)
            record["off"] = shared_off
        self._settle(record)

    def rejected(self, key: str, reason: str) -> None:
        """The entry was there, but JAX could not load it: a miss."""
        self._known_miss(key, "REJECTED", reason)

    def not_read(self, key: str, cause: str, why: str) -> None:
        """A lookup this process skips (``cause``, a name in ``_causes``): an XLA dump is asked for, or
        a TPU device subset a warm read could crash; a miss."""
        self._known_miss(key, cause, why)

    def _known_miss(self, key: str, cause: str, detail: str) -> None:
        self._pending.hit = None
        try:
            from gkx_autocache import _causes as causes  # the package's files may be gone mid-run: never raise here

            self._settle({"e": "miss", "key": key, "cause": getattr(causes, cause), "detail": detail,
                          "t": round(time.time(), 3)})
        except Exception as exc:
            logger.debug("the miss of %s not recorded: %s", key, exc)

    def _disk(self, nbytes: int) -> int:
        return -(-nbytes // self._block) * self._block + self._block  # the entry and its sidecar, in whole blocks

    def landed(self, nbytes: int) -> None:
        """A prefetched entry landed: its blocks on disk, at once (the cap's account; a killed
        process's landings count until the next fold), its ``put`` later (``put(landed=True)``)."""
        self._record({"e": "added", "disk": self._disk(nbytes)})

    def put(self, key: str, nbytes: int, compile_secs: float, landed: bool = False, rebuilt: bool = False,
            unrecorded: str | None = None) -> None:
        """An entry written (``rebuilt``: by a rebuild, not by a lookup's compile on this thread;
        ``unrecorded``: why no record was kept with it, SPEC §18)."""
        if not rebuilt:
            self._pending.hit = None  # an entry read but not loadable is compiled and written again
            self._settle()
        disk = 0 if landed else self._disk(nbytes)  # (a landing's blocks were counted as it landed)
        record: dict[str, Any] = {"e": "put", "key": key, "bytes": nbytes, "disk": disk,
                                  "compile": round(compile_secs, 6), "t": round(time.time(), 3)}
        if rebuilt:
            record["rebuilt"] = True
        if unrecorded:
            record["norec"] = unrecorded[:200]
        if self.explainer is not None:
            record.update(self.explainer.ingredients(key, self.run))
        self._record(record)

    def uncached(self, key: str, reason: str, detail: str = "", origin: str = "", by: str = "", secs: float = 0.0) -> None:
        """A compile JAX did not write, and why (SPEC §13): it counts as not cached, not as a miss.
        The miss's own cause is kept with it unless it was merely "new" (never written: the reason
        says why), as a second rank's "changed device assignment" is."""
        with self._lock:
            waiting = self._waiting.get(threading.get_ident())
            if waiting is not None and waiting.get("key") == key:
                del self._waiting[threading.get_ident()]
            else:
                waiting = None
        record = {"e": "uncached", "key": key, "reason": reason, "compile": round(max(secs, 0.0), 3), "t": round(time.time(), 3)}
        if detail:
            record["detail"] = detail
        if origin:  # where the threshold came from, in this run (the fix names it)
            record["origin"] = origin
        if by:  # the library that put host callbacks there (the fix names its own switch)
            record["by"] = by
        try:
            from gkx_autocache import _causes as causes  # the package's files may be gone mid-run: never raise here

            if waiting is not None and waiting.get("cause") not in (None, causes.NEW):
                record["cause"], record["change"] = waiting["cause"], waiting.get("detail", "")
            if waiting is not None and waiting.get("helper"):  # JAX's own helper: listed after the user's functions
                record["helper"] = True
        except Exception as exc:
            logger.debug("the miss of %s not kept with it: %s", key, exc)
        self._record(record, ("uncached", key, reason))

    def levels_record(self, numbers: dict[str, dict[str, float]]) -> None:
        """Both levels' numbers, once at exit (SPEC §14), as each level counted them
        (``Chain.numbers``). The ledger sums them over processes."""
        self._record({"e": "levels", **{level: {k: round(v, 6) if isinstance(v, float) else v
                                                for k, v in counts.items() if v}
                                        for level, counts in numbers.items()}})

    def _settle(self, waiting: dict[str, Any] | None = None) -> None:
        """Record this thread's miss that was waiting, and (optionally) start waiting on another."""
        with self._lock:
            previous = self._waiting.pop(threading.get_ident(), None)
            if waiting is not None:
                self._waiting[threading.get_ident()] = waiting
        if previous is not None:
            self._record(previous, ("miss", previous["key"], str(previous.get("cause"))))

    def _count_only(self, record: dict[str, Any]) -> None:
        """Counted, and written in the tally only: too frequent to keep one by one."""
        with self._lock:
            self.totals.add(record)
            if self._keeps_ledger:
                self._repeats.add(record)
                self._dirty = True

    def _record(self, record: dict[str, Any], same: tuple[str, ...] | None = None) -> None:
        with self._lock:
            self.totals.add(record)
            if not self._keeps_ledger:
                return
            try:
                if same is not None and same in self._seen:  # a repeat: counted, written as the tally
                    self._repeats.add(record)
                    self._dirty = True
                    if time.monotonic() - self._tally_at >= _ledger.TALLY_SECS:
                        self._write_tally()
                    return
                if same is not None:
                    self._seen.add(same)
                self._write(record)
            except OSError as exc:
                logger.debug("ledger not written: %s", exc)
                self._keeps_ledger = False

    def _write(self, record: dict[str, Any]) -> None:
        """One record, one ``write``, ``O_APPEND``: whole lines or none. Past ``LIVE_LIMIT`` the
        ledger ends (its final tally) and the next record begins another."""
        self._check_removed()
        if self._fd is None:
            self._fd = self._open()
            self._written = 0
        data = _ledger.encode(record)
        os.write(self._fd, data)
        self._written += len(data)
        if self._written > _ledger.LIVE_LIMIT:
            self._end()

    def _write_tally(self, end: bool = False) -> None:
        self._check_removed()
        if self._fd is None:
            self._fd = self._open()
            self._written = 0
        tally = self._repeats.tally()
        if end:
            tally["end"] = True
        self._dirty = False
        self._tally_at = time.monotonic()
        os.write(self._fd, _ledger.encode(tally))
        self._tallied = _ledger.Totals()
        self._tallied.merge(self._repeats)

    def _check_removed(self) -> None:
        """Where flock does not work, a fold on another host takes a ledger untouched for
        ``STALE_SECS`` (a kernel idle overnight) for a finished one: it counts it and deletes it.
        What this process records next goes to a new ledger, with the repeats its last tally did
        not hold, never to the deleted file."""
        if self._fd is None:
            return
        try:
            removed = os.fstat(self._fd).st_nlink == 0
        except OSError:
            return
        if removed:
            self._close()
            self._repeats.merge(self._tallied, -1)  # what the fold counted stays counted once
            self._tallied = _ledger.Totals()
            self._new_ledger()

    def _end(self) -> None:
        """End this ledger: the final tally says it is finished (where flock does not work, that is
        how a fold knows), and the descriptor goes with its lock."""
        if self._fd is None:
            return
        try:
            self._write_tally(end=True)
        finally:
            self._close()
            self._repeats = _ledger.Totals()
            self._tallied = _ledger.Totals()
            self._new_ledger()

    def _close(self) -> None:
        """Let the ledger's descriptor go (and its lock with it), and what this process wrote to it."""
        fd, self._fd = self._fd, None
        try:
            if fd is not None:
                os.close(fd)
        except OSError:
            pass
        self._seen = set()

    def _new_ledger(self) -> None:
        """The next ledger is folded on its own: its entries' index lines must not refer to table
        lines only an earlier ledger holds (a full scan may have dropped them since)."""
        if self.explainer is not None:
            self.explainer.forget_given()

    def _open(self) -> int:
        """A new ledger of this process, created and locked for as long as it is written (see
        ``ledger``); where flock does not work, said once for the directory."""
        folder = _files.bookkeeping_dir(self.directory, self.team, LEDGER_DIR)
        if folder is None:
            raise OSError(f"no bookkeeping directory in {self.directory}")
        dir_fd = _files.open_dir(folder)
        try:
            name = f"{os.getpid()}-{time.time_ns()}{LEDGER_SUFFIX}"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | _files.NOFOLLOW
            fd = os.open(name, flags, _files.file_mode(self.team), dir_fd=dir_fd)
            try:
                self._block = os.fstatvfs(fd).f_frsize or 4096
                os.fchmod(fd, _files.file_mode(self.team))  # the open mode is masked by the umask
                locked = _ledger.take_flock(fd)
                if locked is None and _ledger.no_flock(self.directory, self.team, "flock() fails here"):
                    warn(f"flock:{self.directory}", f"{self.directory}: this file system has no working flock "
                         "(Lustre, or NFS mounted without locks); gkx-autocache uses lock files and process ids "
                         "there instead")
                start = {"e": "start", "run": self.run.id, "host": _ledger.host(), "pid": os.getpid(),
                         "t": round(time.time(), 3), "label": label()}
                started = _ledger.born(os.getpid())
                if started is not None:
                    start["born"] = started
                if self._ledger_run == self.run.id:
                    start["more"] = True  # this process's next ledger: the run has no more processes
                self._ledger_run = self.run.id
                os.write(fd, _ledger.encode(start))
            except BaseException:  # no empty ledger, no open descriptor left behind
                os.close(fd)
                _files.remove_at(name, dir_fd)
                raise
        finally:
            os.close(dir_fd)
        return fd

    def close(self) -> None:
        """End the ledger (at exit, before folding)."""
        with self._lock:
            waiting, self._waiting = list(self._waiting.values()), {}
        for record in waiting:
            self._record(record, ("miss", record["key"], str(record.get("cause"))))
        with self._lock:
            try:
                self._end()
            except OSError:
                self._fd = None

    def move(self, directory: str, ledger: bool, set_by: str | None = None, cap: int | None = None,
             given: str | None = None) -> None:
        """JAX's directory is another now (``_adopted``): what this process records from here goes
        there, and its explanations read that directory's records. ``given``: as JAX was given it."""
        self.given = given or directory
        if directory == self.directory:
            return
        self.close()
        with self._lock:
            self.directory, self._keeps_ledger, self.set_by, self.cap = directory, ledger, set_by, cap
        if self.explainer is not None:
            self.explainer.move(directory)

    def begin(self, run: Run) -> None:
        """This process goes on in another run (a pytest session after an earlier one): the ledger of
        the earlier run ends, and what is counted and explained from now on is the new run's."""
        self.close()
        self.run = run

    def flush(self) -> None:
        """Write what this process counted but has not written yet (its tally; a miss waiting for
        its compile's fate), so that a reader of the ledger sees it: the Python API calls this."""
        with self._lock:
            waiting, self._waiting = list(self._waiting.values()), {}
        for record in waiting:
            self._record(record, ("miss", record["key"], str(record.get("cause"))))
        with self._lock:
            if self._fd is not None and self._dirty:
                try:
                    self._write_tally()
                except OSError:
                    pass

    @property
    def kept_ledger(self) -> bool:
        return self._fd is not None

    def _forked(self) -> None:
        """In a forked child: its own ledger and counts from here on (one file per process)."""
        if self._fd is not None:
            try:
                os.close(self._fd)  # the parent's descriptor; the parent keeps its lock
            except OSError:
                pass
            self._fd = None
        self._lock = threading.Lock()
        self._pending = threading.local()
        self._waiting = {}
        self.totals = _ledger.Totals()
        self._seen = set()
        self._repeats = _ledger.Totals()
        self._tallied = _ledger.Totals()
        self._ledger_run = None
        if self.explainer is not None:  # a lock another thread of the parent held at the fork stays held
            self.explainer.after_fork()
        self._new_ledger()
        self.requests = self.jax_hits = 0

    def refuse(self, path: str, note: str) -> None:
        """JAX was given ``path``, which the trust rules refuse: it has no cache there (``note``: why,
        as the warning said it), so nothing is looked up or missed there."""
        self.unserved[path] = self.unserved[os.path.realpath(path)] = note

    def snapshot(self, used: str | None = None) -> dict[str, Any]:
        """This process's counts, as ``report`` and the pytest summary show them. ``used`` is the
        directory JAX uses now (the user's code may have chosen its own after ``import jax``):
        the store's figures only when the store served it; JAX's own events otherwise; that the
        run was uncached where JAX had no cache there (a refused directory)."""
        used = self.directory if used is None else used
        if (note := self.unserved.get(used)) is not None:
            from gkx_autocache._record.show import empty

            return {**empty(), "dirs": [used], "uncached": note}
        ours = self.store_serving and (used == self.given or os.path.realpath(used) == os.path.realpath(self.directory))
        used = self.directory if ours else used  # as the store resolved it (JAX's may be relative)
        t = self.totals
        if not ours:
            from gkx_autocache._record.show import empty

            return {**empty(), "dirs": [used], "hits": self.jax_hits, "misses": self.requests - self.jax_hits,
                    "tracing_secs": t.tracing_secs}
        return {"dirs": [used], "set_by": self.set_by, "store": True, "hits": t.hits, "own_hits": t.own_hits,
                "rebuilt_hits": t.rebuilt_hits, "rebuilt": t.rebuilt, "misses": t.misses,
                "causes": dict(t.causes), "not_cached": t.not_cached, "not_cached_secs": t.not_cached_secs, "reasons": dict(t.reasons),
                "saved_secs": t.saved_secs, "bytes_read": t.bytes_read, "bytes_written": t.bytes_written,
                "tracing_secs": t.tracing_secs, "levels": {}, "shared": None}


def prefetch_room(version_dir: str, cap: int, unfolded: bool) -> int:
    """``fold.prefetch_room``, its module loaded at a prefetch's start, not on ``import jax``."""
    from gkx_autocache._record import fold

    return fold.prefetch_room(version_dir, cap, unfolded)


def start(settings: Any, directory: str, ledger: bool, remote: bool = False, team: bool = False,
          set_by: str | None = None, serving: Callable[[], bool] = lambda: False,
          explainer: Explains | None = None) -> Recorder:
    """Listen to JAX's cache events; with ``report``, print one line at exit. A remote directory
    gets this process's sums as one ledger object at exit. ``team``: the directory is a team's
    (``trust_shared`` may be the shared level's alone, SPEC §14); ``set_by``, who gave JAX the
    directory where it was not the package;
    ``serving()``, whether the store serves it (asked, not told: it is installed after the recorder);
    ``explainer``, who names a miss's cause (``_explain.seam.Watch``)."""
    import jax.monitoring

    recorder = Recorder(directory, ledger, team=team, run=begin_run(), set_by=set_by, serving=serving,
                        explainer=explainer)
    jax.monitoring.register_event_listener(recorder.on_event)
    jax.monitoring.register_event_duration_secs_listener(recorder.on_duration)
    if remote:
        _before_thread_pools_stop(_write_remote_ledger, recorder)
    return recorder


def finish(rec: Recorder, cap: int) -> None:
    """At exit: end this process's ledger, then fold finished ledgers and keep the cap. Also when
    this process recorded nothing but others left ledgers: a driver whose compiles all ran in pool
    workers (they end by ``os._exit``) is the one that folds them."""
    kept = rec.kept_ledger
    rec.close()
    if not os.access(rec.directory, os.W_OK):  # a baked cache, read-only for this user: its writers fold
        return
    try:
        others = not kept and bool(os.listdir(_ledger.ledger_dir(rec.directory)))
    except OSError:
        others = False
    if kept or others:
        try:
            from gkx_autocache._record import fold  # at exit only: never on `import jax`
        except ImportError as exc:  # the package's files gone mid-run: the next process folds
            logger.debug("no fold at exit: %s", exc)
            return
        fold.fold(rec.directory, cap if rec.cap is None else rec.cap, rec.team)


def _before_thread_pools_stop(func: Any, *args: Any) -> None:
    """Run ``func`` at exit while thread pools still take work: s3fs and gcsfs need them, and by
    the time ``atexit`` runs, ``concurrent.futures`` refuses new futures. Its own hook is
    ``threading._register_atexit``, run last-registered first: registering after it runs first."""
    import concurrent.futures.thread  # noqa: F401  (registers its hook before ours)

    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(func, *args)
            return
    except RuntimeError:  # already shutting down
        return
    atexit.register(func, *args)


def _write_remote_ledger(rec: Recorder) -> None:
    if not rec.requests:
        return
    record = {"e": "sum", "hits": rec.jax_hits, "misses": rec.requests - rec.jax_hits,
              "saved": round(rec.jax_saved_secs, 6)}
    try:
        from gkx_autocache import _remote

        _remote.write_ledger(rec.directory, json.dumps(record) + "\n")
    except Exception as exc:  # a ledger is bookkeeping: never a failure at exit
        logger.debug("remote ledger not written: %s", exc)
