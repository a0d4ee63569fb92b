"""Counting in this process: JAX's cache events, the store's hits, misses and writes, the ledger
file they are recorded in as the process goes (the files and their folding are ``_ledger``'s), and
the ``report`` line at exit.

A remote directory (JAX's stock cache) gets one ledger object per process at exit, with the
process's sums from JAX's own events; its time saved is JAX's, from compile times JAX keeps in
whole seconds.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from typing import Any

from gkx_autocache import _files, _ledger
from gkx_autocache._diagnostics import human_bytes, logger
from gkx_autocache._explain import Folding
from gkx_autocache._layout import LEDGER_DIR, LEDGER_SUFFIX

REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
HITS = "/jax/compilation_cache/cache_hits"
RETRIEVAL = "/jax/compilation_cache/cache_retrieval_time_sec"
JAX_SAVED = "/jax/compilation_cache/compile_time_saved_sec"


class Recorder:
    """This process's counters and ledger file. Every method swallows its own errors: it runs
    inside JAX's compile path, where an exception would fail the user's ``jit`` call."""

    def __init__(self, directory: str, ledger: bool, shared: bool = False) -> None:
        self.directory = directory
        self.shared = shared
        self.requests = 0
        self.jax_hits = 0
        self.jax_saved_secs = 0.0  # JAX's own figure, whole-second compile times: for remote dirs
        self.totals = _ledger.Totals()
        self.store_serving = False  # set once the store serves the directory: then time saved is known
        self.explainer: Any = None  # names each miss's cause (SPEC §13), when JAX's key parts can be read
        self.levels: Any = None  # the shared level and both levels' numbers (SPEC §14), when one is set
        self._keeps_ledger = ledger
        self._pending = threading.local()  # the entry just read on this thread, until JAX says it loaded
        self._lock = threading.Lock()
        # When "this run" began: a hit of an entry written since is this run's own compile, not the
        # cache being warm. A pytest session's start (its plugin sets it for every worker), else now.
        self.run_start = _session_start() or time.time()
        self._waiting: dict[int, dict[str, Any]] = {}  # thread -> its miss, until the compile's fate is known
        self._fd: int | None = None
        self._pid = os.getpid()
        if ledger and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forked)

    # JAX's monitoring events: counted whichever store serves the directory.
    def on_event(self, event: str, *args: Any, **kwargs: Any) -> None:
        if event == REQUESTS:
            self.requests += 1
        elif event == HITS:
            self.jax_hits += 1

    def on_duration(self, event: str, duration_secs: float, *args: Any, **kwargs: Any) -> None:
        try:
            if event == JAX_SAVED:
                self.jax_saved_secs += max(duration_secs, 0.0)
            elif event == RETRIEVAL:
                if self.explainer is not None:
                    self.explainer.forget()
                pending = getattr(self._pending, "hit", None)
                if pending is not None:
                    self._pending.hit = None
                    key, nbytes, compile_secs, written = pending
                    record = {"e": "hit", "key": key, "bytes": nbytes, "saved": round(max(compile_secs - duration_secs, 0.0), 6)}
                    if written >= self.run_start:
                        record["own"] = True
                    self._record(record)
        except Exception:
            pass

    # The store's calls. A miss is recorded once the compile's fate is known (written, or not
    # written and why), so that it gets one cause: a compile JAX never writes is "not cached:
    # host callbacks" on every run, not "new".
    def hit(self, key: str, nbytes: int, compile_secs: float, written: float = 0.0) -> None:
        """An entry was read; it is recorded when JAX reports its load time, on this thread."""
        self._settle()
        self._pending.hit = (key, nbytes, compile_secs, written)

    def miss(self, key: str, shared_off: str | None = None) -> None:
        self._pending.hit = None
        record: dict[str, Any] = {"e": "miss", "key": key, "t": round(time.time(), 3)}
        if self.explainer is not None:
            record.update(self.explainer.cause(key))
        if shared_off:  # the shared level, off since then, may have held it (SPEC §14)
            record["off"] = shared_off
        self._settle(record)

    def rejected(self, key: str, reason: str) -> None:
        """The entry was there, but JAX could not load it: a miss."""
        self._pending.hit = None
        self._settle({"e": "miss", "key": key, "cause": "rejected", "detail": reason, "t": round(time.time(), 3)})

    def put(self, key: str, nbytes: int, compile_secs: float) -> None:
        self._pending.hit = None  # an entry read but not loadable is compiled and written again
        self._settle()
        record: dict[str, Any] = {"e": "put", "key": key, "bytes": nbytes, "compile": round(compile_secs, 6)}
        if self.explainer is not None:
            record.update(self.explainer.ingredients(key))
        self._record(record)

    def uncached(self, key: str, reason: str, detail: str = "") -> None:
        """A compile JAX did not write, and why (SPEC §13). Its miss is counted with it; the
        miss's own cause is kept too unless it was merely "new" (never written: the reason says
        why), as a second rank's "changed device assignment" is."""
        with self._lock:
            waiting = self._waiting.get(threading.get_ident())
            if waiting is not None and waiting.get("key") == key:
                del self._waiting[threading.get_ident()]
            else:
                waiting = None
        record = {"e": "uncached", "key": key, "reason": reason, "t": round(time.time(), 3)}
        if detail:
            record["detail"] = detail
        if waiting is not None and waiting.get("cause") not in (None, "new"):
            record["cause"], record["change"] = waiting["cause"], waiting.get("detail", "")
        self._record(record)

    def levels_record(self, record: dict[str, Any]) -> None:
        """Both levels' numbers, once at exit (SPEC §14)."""
        self._record(record)

    def _settle(self, waiting: dict[str, Any] | None = None) -> None:
        """Record this thread's miss that was waiting, and (optionally) start waiting on another."""
        with self._lock:
            previous = self._waiting.pop(threading.get_ident(), None)
            if waiting is not None:
                self._waiting[threading.get_ident()] = waiting
        if previous is not None:
            self._record(previous)

    def _record(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.totals.add(record)
            if not self._keeps_ledger:
                return
            try:
                if self._fd is None:
                    self._fd = self._open()
                os.write(self._fd, _ledger.encode(record))  # one write, O_APPEND: whole lines or none
            except OSError as exc:
                logger.debug("ledger not written: %s", exc)
                self._keeps_ledger = False

    def _open(self) -> int:
        """This process's ledger, created and locked for its lifetime (see ``_ledger``)."""
        import fcntl

        folder = _files.bookkeeping_dir(self.directory, self.shared, LEDGER_DIR)
        if folder is None:
            raise OSError(f"no bookkeeping directory in {self.directory}")
        dir_fd = _files.open_dir(folder)
        try:
            name = f"{os.getpid()}-{time.time_ns()}{LEDGER_SUFFIX}"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | _files.NOFOLLOW
            fd = os.open(name, flags, _files.file_mode(self.shared), dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        os.fchmod(fd, _files.file_mode(self.shared))  # the open mode is masked by the umask
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd

    def close(self) -> None:
        """Close the ledger (at exit, before folding): its lock is released with it."""
        with self._lock:
            waiting, self._waiting = list(self._waiting.values()), {}
        for record in waiting:
            self._record(record)
        with self._lock:
            if self._fd is not None:
                try:
                    os.close(self._fd)
                except OSError:
                    pass
                self._fd = None

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
        self._pid = os.getpid()
        self.totals = _ledger.Totals()
        self.requests = self.jax_hits = 0

    def snapshot(self, used: str | None = None) -> dict[str, Any]:
        """This process's counts, as ``report`` and the pytest summary show them. ``used`` is the
        directory JAX uses now (the user's code may have chosen its own after ``import jax``):
        the store's figures only when the store served it."""
        used = self.directory if used is None else used
        ours = self.store_serving and used == self.directory
        t = self.totals
        return {"dirs": [used], "hits": self.jax_hits, "misses": self.requests - self.jax_hits, "store": ours,
                "own_hits": t.own_hits if ours else 0, "causes": dict(t.causes) if ours else {},
                "uncached": dict(t.uncached) if ours else {}, "saved_secs": t.saved_secs if ours else 0.0,
                "bytes_read": t.bytes_read if ours else 0, "bytes_written": t.bytes_written if ours else 0,
                "levels": self.levels.snapshot() if ours and self.levels is not None else {}}

    def report_line(self, used: str | None = None) -> str:
        return summary_line(self.snapshot(used))


def merge(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """The counts of several processes (pytest-xdist workers), summed."""
    total: dict[str, Any] = {"dirs": [], "hits": 0, "misses": 0, "store": False, "own_hits": 0, "causes": {},
                             "uncached": {}, "saved_secs": 0.0, "bytes_read": 0, "bytes_written": 0, "levels": {}}
    for snap in snapshots:
        _ledger.add_levels(total["levels"], snap.get("levels") or {})
        total["dirs"] += [d for d in snap["dirs"] if d not in total["dirs"]]
        total["store"] = total["store"] or snap["store"]
        for name in ("hits", "misses", "own_hits", "saved_secs", "bytes_read", "bytes_written"):
            total[name] += snap[name]
        for table in ("causes", "uncached"):
            for key, n in snap[table].items():
                total[table][key] = total[table].get(key, 0) + n
    return total


def since(now: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The counts of ``now`` that were not yet in ``before``: one process's part of one pytest
    session, where the process ran others before it."""
    part = dict(now)
    for name in ("hits", "misses", "own_hits", "saved_secs", "bytes_read", "bytes_written"):
        # never below 0: the store's figures are 0 in ``now`` when JAX's directory changed since
        part[name] = max(now[name] - before[name], 0)
    for table in ("causes", "uncached"):
        part[table] = {key: n - before[table].get(key, 0) for key, n in now[table].items()
                       if n - before[table].get(key, 0) > 0}
    part["levels"] = _ledger.add_levels(_ledger.add_levels({}, now.get("levels") or {}), before.get("levels") or {}, -1)
    return part


def summary_line(snap: dict[str, Any]) -> str:
    """``gkx-autocache: 1480 hits (1045 from earlier runs, 435 of this run's own compiles), 12
    misses (8 new, 3 changed XLA_FLAGS, 1 evicted), 2.31 s compile CPU time avoided, ..., dir``."""
    hits = f"{snap['hits']} hits"
    shared = int((snap.get("levels") or {}).get("shared", {}).get("hits", 0))
    within = [f"{snap['hits'] - shared} local, {shared} shared"] if snap.get("levels") and snap["hits"] else []
    if snap["own_hits"]:
        within.append(f"{snap['hits'] - snap['own_hits']} from earlier runs, {snap['own_hits']} of this run's own compiles")
    if within:
        hits += f" ({'; '.join(within)})"
    parts = [hits, f"{snap['misses']} misses{by_cause(snap['causes'])}"]
    if snap["uncached"]:
        parts.append(f"{sum(snap['uncached'].values())} not cached{by_cause(snap['uncached'])}")
    if snap["store"]:
        parts.append(f"{snap['saved_secs']:.2f} s compile CPU time avoided")
        parts.append(f"{human_bytes(snap['bytes_read'])} read, {human_bytes(snap['bytes_written'])} written")
    dirs = snap["dirs"]
    return f"gkx-autocache: {', '.join(parts)}, {dirs[0] if len(dirs) == 1 else f'{len(dirs)} directories'}"


recorder: Recorder | None = None
SESSION_START = "GKX_JAX_CACHE_SESSION_START"  # set by the pytest plugin for the session's processes


def _session_start() -> float | None:
    try:
        start = float(os.environ[SESSION_START])
    except (KeyError, ValueError):
        return None
    return start if 0.0 < start < 1e11 else None  # a time, not "nan", "inf" or "-1e400"


def start(settings: Any, directory: str, ledger: bool, remote: bool = False) -> Recorder:
    """Listen to JAX's cache events; with ``report``, print one line at exit. A remote directory
    gets this process's sums as one ledger object at exit."""
    global recorder
    import jax.monitoring

    recorder = Recorder(directory, ledger, shared=bool(settings["trust_shared"]))
    jax.monitoring.register_event_listener(recorder.on_event)
    jax.monitoring.register_event_duration_secs_listener(recorder.on_duration)
    if remote:
        _before_thread_pools_stop(_write_remote_ledger, recorder)
    if settings["report"]:
        atexit.register(_report)
    return recorder


def finish(rec: Recorder, cap: int) -> None:
    """At exit: close this process's ledger, then fold finished ledgers and keep the cap. Also
    when this process recorded nothing but others left ledgers: a driver whose compiles all ran
    in pool workers (they end by ``os._exit``) is the one that folds them."""
    kept = rec.kept_ledger
    rec.close()
    try:
        others = not kept and bool(os.listdir(_ledger.ledger_dir(rec.directory)))
    except OSError:
        others = False
    if kept or others:
        _ledger.fold(rec.directory, cap, rec.shared, Folding())


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


def snapshot() -> dict[str, Any] | None:
    """This process's counts, for the directory JAX uses now; None when JAX was not configured."""
    if recorder is None:
        return None
    jax = sys.modules.get("jax")
    used = getattr(getattr(jax, "config", None), "jax_compilation_cache_dir", None)
    return recorder.snapshot(str(used) if used else recorder.directory)


def _report() -> None:
    try:
        snap = snapshot()
        plugin = sys.modules.get("gkx_autocache._pytest_plugin")
        if snap is not None and plugin is not None:
            snap = plugin.uncounted(snap)  # what no pytest session's line counted already
        if snap is not None:
            print(summary_line(snap), file=sys.stderr, flush=True)
    except Exception:
        pass


def by_cause(causes: dict[str, int]) -> str:
    """``" (8 new, 3 changed XLA_FLAGS, 1 evicted)"``, most frequent first."""
    if not causes:
        return ""
    ordered = sorted(causes.items(), key=lambda kv: (-kv[1], kv[0]))
    return " (" + ", ".join(f"{n} {cause}" for cause, n in ordered) + ")"


def totals_dict(t: _ledger.Totals) -> dict[str, Any]:
    lookups = t.hits + t.misses
    return {"hits": t.hits, "own_hits": t.own_hits, "misses": t.misses,
            "hit_rate": t.hits / lookups if lookups else None, "saved_secs": round(t.saved_secs, 3),
            "bytes_read": t.bytes_read, "bytes_written": t.bytes_written, "writes": t.writes,
            "causes": dict(sorted(t.causes.items(), key=lambda kv: -kv[1])),
            "uncached": dict(sorted(t.uncached.items(), key=lambda kv: -kv[1])), "levels": t.levels}


def top_functions(t: _ledger.Totals, n: int = 10) -> list[tuple[str, float]]:
    """The functions that cost most compile time, summed over their shapes."""
    return sorted(((name, cost[0]) for name, cost in t.functions.items()), key=lambda kv: -kv[1])[:n]
