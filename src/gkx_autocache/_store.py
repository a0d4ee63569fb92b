"""JAX's cache interface over the chain of levels (SPEC §7): ``get(key) -> bytes | None`` and
``put(key, bytes)``, for the directory the package resolved (and one someone else gave JAX, that
may be trusted). It asks the chain (``_chain``: the local level, then the shared one), times each
compile that follows a miss, and tells the recorder what each lookup came to. What the levels do
beyond JAX's own cache (atomic writes, repair, recency, compile times, the shared level) is theirs.

JAX's format and key are kept, so stock JAX and this store read each other's directories. Every
I/O failure is a miss and a DEBUG line, never a warning (users run their tests under ``-W error``).
JAX's seams, patched by ``_jax.caching.serve_file_caches`` (if one changes, JAX's stock behaviour stays):
- its cache module's ``get_file_cache(path)`` builds the cache object: for the directory the
  package resolved, it returns the store;
- ``get_executable_and_time(cache_key, ...)`` decompresses and deserialises what ``get`` returned.
  An entry the store served that does not deserialise (bit rot in a frame without a checksum, a
  jaxlib rebuilt under the same version, a forced bundle) becomes a miss there: one recompile, and
  ``put`` replaces the entry. JAX's own path warns instead, and ``-W error`` turns that warning into
  an exception out of the user's ``jit``, on every run, forever (SPEC §7).
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gkx_autocache import _fork, _mount
from gkx_autocache._chain import Chain, Lookup, NoLevel
from gkx_autocache._diagnostics import logger
from gkx_autocache._entry import Entry
from gkx_autocache._formats import compression_of
from gkx_autocache._jax import caching as jax_caching
from gkx_autocache._local import lease as _lease
from gkx_autocache._local.level import LocalLevel

_LINUX = sys.platform.startswith("linux")


class _Threads:
    """Each Python thread's CPU as ``compile_clock`` last read it (in any thread), and that of those
    that ended since, which stays in the process's."""

    def __init__(self) -> None:
        self._forked()
        _fork.in_child(self._forked)

    def _forked(self) -> None:  # the parent's threads are none of the child's (and its lock may have been held)
        self._lock = threading.Lock()
        self._read: dict[threading.Thread, float] = {}  # (the thread itself: an ended one's id comes back)
        self._ended = 0.0

    def ended(self, read: dict[threading.Thread, float]) -> float:
        """The CPU of the threads that ended, each as last read, ``read`` the threads' CPU now."""
        with self._lock:
            for thread in [t for t in self._read if t not in read]:
                self._ended += self._read.pop(thread)
            self._read.update(read)
            return self._ended


_THREADS = _Threads()


def compile_clock() -> float:
    """CPU seconds of this process, less those of its other Python threads: what a compile costs
    is measured as the difference of two readings. Not wall time: under contention (pytest-xdist
    workers sharing cores) it inflated the same warm run's "saved" from 90 s to 129 s. Not the
    compiling thread's own CPU time either: XLA compiles on worker threads of its own (the calling
    thread does 0.2 % of it, measured), so that would read as nothing. Not the whole process's: a
    busy thread of the user's program would count as compiling (SPEC §7). XLA's threads that run
    another thread's computations meanwhile are counted in, an overestimate, where that happens.
    A Python thread that ended since its last reading is less its CPU as read then: else the whole
    of it counted in the compile it ended during (a rebuild's keying thread, seconds)."""
    total = time.process_time()
    if not _LINUX:
        return total
    me = threading.get_native_id()
    read: dict[threading.Thread, float] = {}
    for thread in threading.enumerate():
        tid = thread.native_id
        if tid is None:
            continue
        try:
            # The thread's own CPU clock, as glibc's pthread_getcpuclockid names it from its kernel
            # id (a thread that ended meanwhile: EINVAL). Read without letting go of the GIL, where
            # /proc/self/task/<tid>/stat cost three hand-overs a thread: 84 a compile of the
            # rebuild's 13 threads on a TPU host, 50 ms a compile waiting for the GIL.
            read[thread] = time.clock_gettime(((~tid) << 3) | 6)
        except OSError:
            continue
        if tid != me:
            total -= read[thread]
    return total - _THREADS.ended(read)


class NoRecords:
    """No records kept (a directory someone else gave JAX), and no rebuild in this process: the
    store's ports for them (SPEC §18) answered as nothing."""

    def keep(self, key: str, compile_secs: float | None) -> tuple[int, str | None]:
        return 0, None

    def copy(self, key: str, data: bytes) -> int:
        return 0

    def missed(self, key: str) -> bool:
        return False


class Store:
    """JAX's ``CacheInterface`` over ``chain``, for the version directory ``path`` (real);
    ``leases``: a key one process compiles, the others wait for (``_local.lease``); ``records``:
    keeps each written entry's record (``_rebuild.keeper``); ``rebuilds``: told of each miss, which
    waits where a rebuild in this process compiles its key (``_rebuild.ahead``)."""

    def __init__(self, path: str, chain: Chain, recorder: Any,
                 leases: _lease.Leases | _lease.Unleased | None = None,
                 records: Any = None, rebuilds: Any = None) -> None:
        self._path = path  # JAX's VerificationCache reads this attribute
        self._chain = chain
        self._local = chain.local
        self._recorder = recorder
        self._leases = leases if leases is not None else _lease.Unleased()
        self._records = records if records is not None else NoRecords()
        self._rebuilds = rebuilds if rebuilds is not None else NoRecords()
        self._misses = threading.local()  # key -> process CPU time at the miss, per thread
        self._served = threading.local()  # the key whose bytes this thread was last given

    @property
    def writable(self) -> bool:
        """Whether it takes writes (a baked cache, read-only for this user, serves hits only)."""
        return self._local.writable

    @property
    def path(self) -> str:
        """The version directory it serves (real path)."""
        return self._path

    def get(self, key: str) -> bytes | None:
        looked = self._chain.lookup(key)
        if looked.entry is None and self._rebuilds.missed(key):  # compiled by a rebuild here meanwhile: its entry
            again = self._chain.lookup(key, again=True)
            looked = again if again.entry is not None else looked
        if looked.entry is None and not looked.refused and self._local.writable:
            looked = self._settle(key, looked)
        recorder = self._recorder
        entry = looked.entry
        if entry is not None:
            if looked.receipt is not None:  # a prefetched entry's first use: recorded here, where its lookup's facts are
                recorder.put(key, looked.receipt.disk, looked.receipt.compile_secs, landed=True)
            if looked.backfilled is not None:
                recorder.put(key, looked.backfilled, entry.compile_secs or 0.0)
            recorder.hit(key, len(entry.data), entry.compile_secs or 0.0, looked.run,  # (a shared one: another run's)
                         rebuilt=looked.rebuilt)
            self._served.key = key
            self._served.local = looked.level == "local" and looked.receipt is None  # (a prefetched one: the shared level's)
            return bytes(entry.data)
        self._missed(key)
        if looked.refused:  # the entry was there but cannot be used: named, not "evicted" on every run
            recorder.rejected(key, looked.refused)
        elif looked.shared_off is not None:
            recorder.miss(key, shared_off=looked.shared_off)
        else:
            recorder.miss(key)
        return None

    def _settle(self, key: str, missed: Lookup) -> Lookup:
        """A miss: this thread takes the key's lease and compiles (``put`` lets it go), or another
        process compiles it now and its entry is read once written (a hit), or, the wait over, this
        thread compiles it too (``_local.lease``). A hit never comes here: a warm run takes no lease."""
        local = self._local
        outcome = self._leases.settle(local.path, local.team, key, lambda: local.has(key),
                                      _lease.recorded(local.path, key))
        if outcome != _lease.READY:
            return missed
        started = time.perf_counter()
        data, why = local.read(key)
        if data is None or why is not None:
            return missed
        self._chain.waited(len(data), time.perf_counter() - started)
        compile_secs, written, run, rebuilt = local.compile_secs(key, data)
        logger.debug("%s: another process compiled it while this one waited", key)
        return Lookup(Entry(data, compile_secs, written), "local", run, rebuilt=rebuilt)

    # -- the compile that follows a miss ---------------------------------------------------------

    def _missed(self, key: str) -> None:
        """Start the clock of the compile that follows a miss on this thread (see ``compile_clock``)."""
        pending = getattr(self._misses, "keys", None)
        if pending is None:
            pending = self._misses.keys = {}
        pending[key] = compile_clock()

    def served(self, key: str) -> bool:
        """Whether this thread's last hit was ``key``: the bytes JAX failed to load came from here."""
        return getattr(self._served, "key", None) == key

    def reject(self, key: str, exc: BaseException) -> None:
        """JAX could not load the entry it was given: a miss, one recompile, and ``put`` replaces
        the entry. Silent but for a DEBUG line (SPEC §7). One that does not even decompress is
        removed at once: JAX may not write the recompile back (below its threshold, not process 0)."""
        self._served.key = None
        if getattr(self._served, "local", False):
            self._served.local = False
            self._chain.unserved()
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        logger.debug("%s-cache could not be loaded (%s): it will be compiled again and replaced", key, reason)
        corrupt = self._local.remove_corrupt(key)
        what = ("corrupt entry: it does not decompress" if corrupt
                else "an entry JAX could not load (it decompresses, but does not deserialise)")
        self._missed(key)
        self._recorder.rejected(key, f"{what}; compiled again and replaced ({reason})"[:400])

    def _uncached(self, key: str, reason: str, detail: str) -> None:
        """A compile not written, and why (``reason``: its name in ``_causes``, imported at the
        first write: a run where every lookup hits has none; never raising, the files may be gone)."""
        try:
            from gkx_autocache import _causes as causes

            self._recorder.uncached(key, getattr(causes, reason), detail)
        except Exception as exc:
            logger.debug("uncached %s not recorded: %s", key, exc)

    def put(self, key: str, value: bytes) -> None:
        try:
            self._put(key, value)
        finally:  # written or not: waiters read it, or compile it themselves, now
            self._leases.release(self._local.path, key)

    def _put(self, key: str, value: bytes) -> None:
        started = getattr(self._misses, "keys", {}).pop(key, None)
        local = self._local
        if not local.writable:
            self._uncached(key, "READ_ONLY", "this user cannot write the cache (a baked image)")
            return
        if local.other_format(key):
            logger.debug("%s belongs to another environment's format: not overwritten", local.entry(key))
            return
        compile_secs = max(compile_clock() - started, 0.0) if started is not None else None
        try:
            written = self._chain.write(key, value, compile_secs, self._recorder.run.id)
        except OSError as exc:  # disk full, a name too long for the file system: said, not "new" every run
            logger.debug("cannot write %s: %s", local.entry(key), exc)
            self._uncached(key, "WRITE_FAILED", exc.strerror or str(exc))
            return
        kept, unrecorded = self._records.keep(key, compile_secs)
        self._recorder.put(key, written + kept, compile_secs or 0.0, unrecorded=unrecorded)

    def has(self, key: str) -> bool:
        """Whether the local level holds an entry of ``key`` (a rebuild skips it)."""
        return self._local.has(key)

    def lease(self, key: str, compile_secs: float) -> bool:
        """Whether a rebuild may compile ``key`` now: its lease taken, as a miss takes it (the
        processes that miss it meanwhile wait for its entry), or none to take; False where another
        process compiles it now (or its entry is there)."""
        local = self._local
        return self._leases.take(local.path, local.team, key, lambda: local.has(key),
                                 compile_secs or None) in (_lease.HELD, _lease.ALONE)

    def let_go(self, key: str) -> None:
        """The rebuild's compile of ``key`` is over (written or not): its lease let go."""
        self._leases.release(self._local.path, key)

    def rebuilt(self, key: str, value: bytes, compile_secs: float, record: bytes) -> int:
        """An entry a rebuild compiled from ``record`` (SPEC §18), written as a compile's is (atomic,
        with its compile time, sealed where a key is set, handed to the shared level), with its
        record beside it; the bytes written. Raises OSError (read-only, a disk full)."""
        if not self._local.writable:
            raise OSError(errno.EROFS, "this user cannot write the cache (a baked image)")
        written = self._chain.write(key, value, compile_secs, self._recorder.run.id, rebuilt=True)
        written += self._records.copy(key, record)
        self._recorder.put(key, written, compile_secs, rebuilt=True)
        return written


# -- installing the store into JAX ------------------------------------------------------------


def install(jax: Any, version_dir: str, chain: Chain | None, recorder: Any,
            route: Callable[[str], tuple[str, str] | None], recheck: Callable[[str], str | None],
            target: Any, keyed: Callable[[], bool], leases: _lease.Leases | None = None,
            records: Any = None, rebuilds: Any = None) -> str | None:
    """Serve JAX's cache objects as ``route`` says (``_jax.caching.serve_file_caches``): the store over
    ``chain`` for the package's own ``version_dir`` (None: this JAX's cache module lacks what the
    store needs, and it does not serve), and over a chain of a local level of its own for a
    directory someone else gave JAX that may be trusted; why the store does not serve (JAX's stock
    cache then serves, checked at each lookup by ``recheck``), or None; ``target`` and ``keyed``:
    the ``cpu_target`` a local level checks entries against (``LocalLevel``); ``leases``: this
    process's, which every store it makes shares (``_local.lease``); ``records`` and ``rebuilds``:
    the package's own directory's records and rebuilds (SPEC §18). Which store JAX has is JAX's
    own to say (``current``): nothing is kept here."""
    ours = os.path.realpath(version_dir)

    def make(real: str, writable: bool, sample: bytes, decompress: Any, check_payload: bool) -> Store:
        if real == ours and chain is not None:
            return Store(real, chain, recorder, leases, records, rebuilds)
        local = LocalLevel(real, compression=compression_of(sample) or "zlib", decompress=decompress, team=False,
                           writable=writable, check_payload=lambda: check_payload, signs=False,
                           whole=_mount.bucket_mount(real) is not None, target=target, keyed=keyed)
        return Store(real, Chain(local, NoLevel()), recorder, leases)

    why, unrouted = jax_caching.serve_file_caches(jax, route, make, _unloadable, recheck)
    if unrouted is not None:
        logger.debug("JAX's directories are not judged: %s", unrouted)
    return why


def current() -> Store | None:
    """The store JAX reads through now, where it is one (JAX's own cache object otherwise, or none)."""
    cache = jax_caching.cache_object()
    return cache if isinstance(cache, Store) else None


def serving(path: str) -> bool:
    """Whether the store serves ``path`` now (JAX's directory may have been set since)."""
    store = current()
    return store is not None and os.path.realpath(store.path) == os.path.realpath(path)


def serving_now(config: Any, own: str | None, installed: Callable[[], bool]) -> bool:
    """Whether the store serves the directory JAX's ``config`` names now (a framework may set
    another): the package's own (``own``, its real path, once ``installed()``), or one the store was given since.
    JAX computes its first key before it sets up its cache object (at its first lookup): the
    package's own directory is known before."""
    path = str(config.jax_compilation_cache_dir)
    return (own is not None and installed() and os.path.realpath(path) == own) or serving(path)


def _unloadable(cache_key: str, exc: BaseException) -> bool:
    """Whether an entry JAX could not load is the store's to turn into a miss (it served it): then
    it is removed, and JAX compiles again."""
    store = current()
    if store is None or not store.served(cache_key):
        return False
    store.reject(cache_key, exc)
    return True
