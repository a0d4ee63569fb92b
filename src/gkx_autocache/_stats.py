"""Counting hits, misses and time saved: in this process (for ``report``) and across processes
(the ledger, for ``gkx-autocache stats``).

The ledger is one append-only JSON-lines file per process under
``<version dir>/.gkx-autocache/ledger/`` (appends to one shared file are not atomic on NFS), written
as the process goes, so a worker that ends by ``os._exit`` loses at most its last line. A remote
directory (JAX's stock cache) gets one object per process at exit, with the process's sums from
JAX's own events; its time saved is JAX's, from compile times JAX keeps in whole seconds.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from gkx_autocache._diagnostics import human_bytes, logger
from gkx_autocache._files import bookkeeping_dir
from gkx_autocache._layout import LEDGER_DIR, LEDGER_SUFFIX, META_DIR, is_url

REQUESTS = "/jax/compilation_cache/compile_requests_use_cache"
HITS = "/jax/compilation_cache/cache_hits"
RETRIEVAL = "/jax/compilation_cache/cache_retrieval_time_sec"
JAX_SAVED = "/jax/compilation_cache/compile_time_saved_sec"


class Totals:
    """Counts summed over ledger records (a plain class: this module is imported on ``import jax``)."""

    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0
        self.saved_secs = 0.0
        self.bytes_read = 0
        self.bytes_written = 0
        self.writes = 0
        self.compile_secs: dict[str, float] = {}  # key -> compile time, from writes

    def add(self, record: dict[str, Any]) -> None:
        kind = record.get("e")
        if kind == "hit":
            self.hits += 1
            self.saved_secs += float(record.get("saved", 0.0))
            self.bytes_read += int(record.get("bytes", 0))
        elif kind == "miss":
            self.misses += 1
        elif kind == "put":
            self.writes += 1
            self.bytes_written += int(record.get("bytes", 0))
            self.compile_secs[str(record.get("key"))] = float(record.get("compile", 0.0))
        elif kind == "sum":  # a remote directory's process, at exit
            self.hits += int(record.get("hits", 0))
            self.misses += int(record.get("misses", 0))
            self.saved_secs += float(record.get("saved", 0.0))


class Recorder:
    """This process's counters and ledger file. Every method swallows its own errors: it runs
    inside JAX's compile path, where an exception would fail the user's ``jit`` call."""

    def __init__(self, directory: str, ledger: bool, shared: bool = False) -> None:
        self.directory = directory
        self.shared = shared
        self.requests = 0
        self.jax_hits = 0
        self.jax_saved_secs = 0.0  # JAX's own figure, whole-second compile times: for remote dirs
        self.totals = Totals()
        self._pending = threading.local()  # compile time of the entry just read on this thread
        self._lock = threading.Lock()
        self._ledger_path = os.path.join(directory, META_DIR, LEDGER_DIR, f"{os.getpid()}-{time.time_ns()}{LEDGER_SUFFIX}") if ledger else None
        self._ledger: Any = None
        self.store_serving = False  # set once the store serves the directory: then time saved is known

    # JAX's monitoring events: counted whichever store serves the directory.
    def on_event(self, event: str, **kwargs: Any) -> None:
        if event == REQUESTS:
            self.requests += 1
        elif event == HITS:
            self.jax_hits += 1

    def on_duration(self, event: str, duration_secs: float, **kwargs: Any) -> None:
        try:
            if event == JAX_SAVED:
                self.jax_saved_secs += max(duration_secs, 0.0)
            elif event == RETRIEVAL:
                pending = getattr(self._pending, "hit", None)
                if pending is not None:
                    self._pending.hit = None
                    key, nbytes, compile_secs = pending
                    self._record({"e": "hit", "key": key, "bytes": nbytes, "saved": max(compile_secs - duration_secs, 0.0)})
        except Exception:
            pass

    # The store's calls.
    def hit(self, key: str, nbytes: int, compile_secs: float) -> None:
        """An entry was read; it is recorded when JAX reports its load time, on this thread."""
        self._pending.hit = (key, nbytes, compile_secs)

    def miss(self, key: str) -> None:
        self._pending.hit = None
        self._record({"e": "miss", "key": key})

    def put(self, key: str, nbytes: int, compile_secs: float) -> None:
        self._pending.hit = None  # an entry read but not loadable is compiled and written again
        self._record({"e": "put", "key": key, "bytes": nbytes, "compile": round(compile_secs, 6)})

    def _record(self, record: dict[str, Any]) -> None:
        with self._lock:
            self.totals.add(record)
            if self._ledger_path is None:
                return
            try:
                if self._ledger is None:
                    bookkeeping_dir(self.directory, self.shared, LEDGER_DIR)
                    self._ledger = open(self._ledger_path, "a", encoding="utf-8")
                self._ledger.write(json.dumps(record, separators=(",", ":")) + "\n")
                self._ledger.flush()
            except OSError as exc:
                logger.debug("ledger not written: %s", exc)
                self._ledger_path = None

    def report_line(self) -> str:
        misses = self.requests - self.jax_hits
        parts = [f"{self.jax_hits} hits", f"{misses} misses"]
        if self.store_serving:
            parts.append(f"{self.totals.saved_secs:.2f} s compile time saved")
            parts.append(f"{human_bytes(self.totals.bytes_read)} read, {human_bytes(self.totals.bytes_written)} written")
        return f"gkx-autocache: {', '.join(parts)}, {self.directory}"


recorder: Recorder | None = None


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


def _report() -> None:
    if recorder is not None:
        try:
            print(recorder.report_line(), file=sys.stderr, flush=True)
        except Exception:
            pass


def ledger_files(version_dir: str) -> Iterator[str]:
    if is_url(version_dir):
        from gkx_autocache import _remote

        yield from _remote.ledger_files(version_dir)
        return
    folder = os.path.join(version_dir, META_DIR, LEDGER_DIR)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return
    for name in names:
        if name.endswith(LEDGER_SUFFIX):
            yield os.path.join(folder, name)


def remove_ledger(version_dir: str) -> int:
    """Delete every process's ledger (``stats --reset``); the count removed."""
    from gkx_autocache import _entries

    files = list(ledger_files(version_dir))
    try:
        _entries.remove_files(version_dir, files)
    except _entries.Refused as exc:
        logger.debug("ledger not removed: %s", exc)
        return 0
    return len(files)


def read_ledger(version_dir: str) -> Totals | None:
    """Totals across every process since the last reset, or None when there is no ledger yet."""
    files = list(ledger_files(version_dir))
    if not files:
        return None
    totals = Totals()
    for path in files:
        for line in _read_text(path).splitlines():
            try:
                totals.add(json.loads(line))
            except ValueError:
                continue  # a torn last line of a process that died mid-write
    return totals


def _read_text(path: str) -> str:
    if is_url(path):
        from gkx_autocache import _remote

        return (_remote.read_bytes(path) or b"").decode("utf-8", "replace")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def totals_dict(t: Totals) -> dict[str, Any]:
    lookups = t.hits + t.misses
    return {"hits": t.hits, "misses": t.misses, "hit_rate": t.hits / lookups if lookups else None,
            "saved_secs": round(t.saved_secs, 3), "bytes_read": t.bytes_read, "bytes_written": t.bytes_written,
            "writes": t.writes}


def top_functions(t: Totals, n: int = 10) -> list[tuple[str, float]]:
    """The functions that cost most compile time, summed over their shapes."""
    from gkx_autocache._layout import function_name

    by_function: dict[str, float] = {}
    for key, secs in t.compile_secs.items():
        by_function[function_name(key)] = by_function.get(function_name(key), 0.0) + secs
    return sorted(by_function.items(), key=lambda kv: -kv[1])[:n]
