"""The cache backend JAX reads and writes through, for the directory the package resolved (SPEC §7).

JAX's format and key are kept, so stock JAX and this store read each other's directories. What
changes: writes are atomic (a temporary file, then ``os.replace``, overwriting, which heals a bad
entry; on a bucket mount, one create: ``_mount``); an entry that does not decompress is removed
and costs one recompile, silently; an entry in another compression format is left alone; each hit
records recency with ``os.utime`` (no lock);
the real compile time of each write is kept beside the entry (``<key>-gkx-compile``), so time saved
is real for sub-second compiles; and every I/O failure is a miss and a DEBUG line, never a warning
(users run their tests under ``-W error``).

JAX's seams, patched by ``_jax.serve_file_caches`` (if one changes, JAX's stock behaviour stays):
- its cache module's ``get_file_cache(path)`` builds the cache object: for the directory
  the package resolved, it returns the store;
- ``get_executable_and_time(cache_key, ...)`` decompresses and
  deserialises what ``get`` returned. An entry the store served that does not deserialise (bit
  rot in a frame without a checksum, a jaxlib rebuilt under the same version, a forced bundle)
  becomes a miss there: one recompile, and ``put`` replaces the entry. JAX's own path warns
  instead, and ``-W error`` turns that warning into an exception out of the user's ``jit``, on
  every run, forever (SPEC §7).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gkx_autocache import _jax, _mount
from gkx_autocache._diagnostics import logger
from gkx_autocache._formats import compression_of
from gkx_autocache._landing import Landing
from gkx_autocache._local import LocalLevel

if TYPE_CHECKING:  # (a type only: nothing to compile on import jax)
    from typing import Protocol

    from gkx_autocache._shared.answer import Answer

    class SharedLevel(Protocol):
        """What the store asks of the shared level behind the local one (``_shared.level.Level``)."""

        @property
        def off_note(self) -> str | None: ...

        @property
        def signs(self) -> bool: ...

        @property
        def landing(self) -> Landing: ...

        def before_lookup(self, key: str) -> None: ...

        def local_hit(self, key: str, nbytes: int, prefetched: bool = False) -> None: ...

        def local_miss(self, key: str = "") -> None: ...

        def get(self, key: str) -> Answer: ...

        def count(self, **add: float) -> None: ...

        def vouch(self, key: str, data: bytes, compile_secs: float | None, written: float) -> bytes | None: ...

        def seal_for(self, key: str, data: bytes, raw_seal: bytes | None, compile_secs: float | None,
                     written: float) -> bytes | None: ...

        def put(self, key: str, data: bytes, compile_secs: float | None, seal: bytes | None = None,
                written: float = 0.0) -> None: ...


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def compile_clock() -> float:
    """CPU seconds of this process, less those of its other Python threads: what a compile costs
    is measured as the difference of two readings. Not wall time: under contention (pytest-xdist
    workers sharing cores) it inflated the same warm run's "saved" from 90 s to 129 s. Not the
    compiling thread's own CPU time either: XLA compiles on worker threads of its own (the calling
    thread does 0.2 % of it, measured), so that would read as nothing. Not the whole process's: a
    busy thread of the user's program would count as compiling (SPEC §7). XLA's threads that run
    another thread's computations meanwhile are counted in, an overestimate, where that happens."""
    total = time.process_time()
    me = threading.get_native_id()
    for thread in threading.enumerate():
        tid = thread.native_id
        if tid is None or tid == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                fields = f.read(1024).rsplit(b")", 1)[1].split()
            total -= (int(fields[11]) + int(fields[12])) / _TICK
        except (OSError, IndexError, ValueError):
            continue
    return total


class Unshared:
    """No shared level behind the local one: every question answered as a level that has nothing."""

    off_note: str | None = None
    signs = False

    def __init__(self) -> None:
        from gkx_autocache._shared.answer import MISS  # (a leaf; loaded at JAX's first compile, not on import jax)

        self.landing = Landing("")  # never opened: nothing lands, and a hit takes nothing from it
        self._miss = MISS

    def before_lookup(self, key: str) -> None:
        pass

    def local_hit(self, key: str, nbytes: int, prefetched: bool = False) -> None:
        pass

    def local_miss(self, key: str = "") -> None:
        pass

    def get(self, key: str) -> Answer:
        return self._miss

    def count(self, **add: float) -> None:
        pass

    def vouch(self, key: str, data: bytes, compile_secs: float | None, written: float) -> bytes | None:
        return None

    def seal_for(self, key: str, data: bytes, raw_seal: bytes | None, compile_secs: float | None,
                 written: float) -> bytes | None:
        return None

    def put(self, key: str, data: bytes, compile_secs: float | None, seal: bytes | None = None,
            written: float = 0.0) -> None:
        pass


class Store:
    """JAX's ``CacheInterface``: ``get(key) -> bytes | None`` and ``put(key, bytes)``. It asks the
    local level (``_local``), then the shared level behind it (``Unshared`` where none is set),
    times each compile that follows a miss, and tells the recorder what happened."""

    def __init__(self, path: str, *, compression: str, decompress: Any, team: bool, recorder: Any,
                 writable: bool = True, check_payload: bool = True, levels: SharedLevel | None = None,
                 whole: bool = False) -> None:
        self._path = path  # JAX's VerificationCache reads this attribute
        self._local = LocalLevel(path, compression=compression, decompress=decompress, team=team,
                                 writable=writable, check_payload=check_payload, whole=whole,
                                 signs=levels is not None and levels.signs)
        self._levels: SharedLevel = levels if levels is not None else Unshared()  # asked on a local miss (SPEC §14)
        self._landing = self._levels.landing
        if levels is not None:  # a prefetched entry lands as a backfill; healing and packs read its entries
            self._landing.open(self._land, self._local.writable, self.uploadable)
        self._recorder = recorder
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
        levels = self._levels
        levels.before_lookup(key)  # its prefetch, if in flight, lands first
        started = time.perf_counter()
        data, why = self._local.read(key)
        if data is not None and why is None:
            compile_secs, _, by = self._local.compile_secs(key, data)
            if (landed := self._landing.take(key)) is not None:  # recorded here, where its lookup's facts are
                self._recorder.put(key, landed.written, landed.compile_secs, landed=True)
            self._recorder.hit(key, len(data), compile_secs, by)
            self._served.key = key
            # A prefetched entry's first use is the shared level's hit, and the local level's miss.
            if landed is None:
                self._recorder.local_hit(len(data), time.perf_counter() - started)
            else:
                self._recorder.local_miss()
            levels.local_hit(key, len(data), prefetched=landed is not None)
            return data
        self._recorder.local_miss()
        levels.local_miss(key)
        if not why or compression_of(data or b"") is None:  # another environment's entry is left alone
            answer = levels.get(key)
            refused = answer.refused
            if answer.found is not None:
                refused = self._local.unusable_shared(answer.found.data, landing=False)
                if refused is None:
                    return self._serve_shared(key, answer.found)
            if refused is not None:
                why = refused
        self._missed(key)
        if why:  # the entry was there but cannot be used: named, not "evicted" on every run
            self._recorder.rejected(key, why)
        elif levels.off_note is not None:
            self._recorder.miss(key, shared_off=levels.off_note)
        else:
            self._recorder.miss(key)
        return None

    def _serve_shared(self, key: str, found: Any) -> bytes:
        """A shared hit: written into this level first (the backfill, atomic) where this level takes
        writes, so that the next run reads it here; served either way (a read-only or full local
        level serves it without the backfill)."""
        if self._local.writable and self._backfill(key, found) is not None:
            self._levels.count(backfills=1)
        self._recorder.hit(key, len(found.data), found.compile_secs or 0.0)  # another run's compile
        self._served.key = key
        return bytes(found.data)

    # -- what the landing port asks of this level (``_landing.Landing``) ----------------------------

    def _land(self, key: str, found: Any) -> tuple[int | None, str | None]:
        """A prefetched entry (SPEC §14), checked as a shared hit is, then written into this level:
        ``(bytes written, why not)``, why None where this level took no write (disk full)."""
        why = self._local.unusable_shared(found.data, landing=True)
        if why is not None:
            return None, why
        return self._backfill(key, found, record=False), None

    def uploadable(self, key: str) -> tuple[bytes, bytes] | None:
        """A writer's entry to heal the shared level with or to pack, and its seal (``LocalLevel.uploadable``)."""
        return self._local.uploadable(key, self._levels.seal_for)

    def _backfill(self, key: str, found: Any, record: bool = True) -> int | None:
        """Write a shared hit into this level, with its compile time (dated when it was written, so
        that it counts as an earlier run's entry); the bytes written, None where it was not. Counted as a write: the
        cap's account and the explanations' index see the entry like any other (a prefetch's,
        ``record`` False, is recorded at its lookup, whose thread holds the facts the index needs)."""
        local = self._local
        if local.other_format(key):
            return None
        try:
            local.write(key, found.data)
        except OSError as exc:  # disk full: served without the backfill
            logger.debug("cannot write %s: %s", local.entry(key), exc)
            return None
        written = len(found.data) + local.keep_seal(key, found.seal)
        if found.compile_secs is not None:
            written += local.write_sidecar(key, found.compile_secs, dated=found.written)
        if record:
            self._recorder.put(key, written, found.compile_secs or 0.0)
        else:
            self._recorder.landed(written)
        return written

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
        started = getattr(self._misses, "keys", {}).pop(key, None)
        local = self._local
        if not local.writable:
            self._uncached(key, "READ_ONLY", "this user cannot write the cache (a baked image)")
            return
        if local.other_format(key):
            logger.debug("%s belongs to another environment's format: not overwritten", local.entry(key))
            return
        try:
            local.write(key, value)
        except OSError as exc:  # disk full, a name too long for the file system: said, not "new" every run
            logger.debug("cannot write %s: %s", local.entry(key), exc)
            self._uncached(key, "WRITE_FAILED", exc.strerror or str(exc))
            return
        written = len(value)
        compile_secs = max(compile_clock() - started, 0.0) if started is not None else 0.0
        if started is not None:
            written += local.write_sidecar(key, compile_secs, by=self._recorder.run.id)
        now = time.time()  # what this process compiled, its key vouches for: kept beside it
        seal = self._levels.vouch(key, value, compile_secs if started is not None else None, now)
        written += local.keep_seal(key, seal)
        self._recorder.put(key, written, compile_secs)
        self._levels.put(key, value, compile_secs if started is not None else None, seal, now)  # queued: off the compile path


# -- installing the store into JAX ------------------------------------------------------------


_serving: Store | None = None  # the store JAX got for the package's directory, once it asked
_own: str | None = None  # the package's own version directory (real path), once installed


def install(jax: Any, version_dir: str, team: bool, recorder: Any, levels: Any,
            route: Callable[[str], tuple[str, str] | None], recheck: Callable[[str], str | None]) -> str | None:
    """Serve JAX's cache objects as ``route`` says (``_jax.serve_file_caches``): the store for the
    package's own ``version_dir``, with the shared level ``levels`` behind it, and for a directory
    someone else gave JAX that may be trusted; why the store does not serve (JAX's stock cache then
    serves, checked at each lookup by ``recheck``), or None."""
    global _own
    ours = os.path.realpath(version_dir)

    def make(real: str, writable: bool, sample: bytes, decompress: Any, check_payload: bool) -> Store:
        global _serving
        mine = real == ours
        _serving = Store(real, compression=compression_of(sample) or "zlib", decompress=decompress,
                         team=team and mine, recorder=recorder, writable=writable, check_payload=check_payload,
                         levels=levels if mine else None, whole=_mount.bucket_mount(real) is not None)
        return _serving

    why, unrouted = _jax.serve_file_caches(jax, route, make, _unloadable, recheck)
    if unrouted is not None:
        logger.debug("JAX's directories are not judged: %s", unrouted)
    if why is None:
        _own = ours
    return why


def installed() -> bool:
    """Whether the store serves the package's own directory in this process (``install`` succeeded)."""
    return _own is not None


def serving(path: str) -> bool:
    """Whether the store serves ``path`` now (JAX's directory may have been set since)."""
    store = _serving
    return store is not None and os.path.realpath(store.path) == os.path.realpath(path)


def serving_now(config: Any) -> bool:
    """Whether the store serves the directory JAX's ``config`` names now (a framework may set
    another): the package's own, or one the store was given since. (JAX computes a key before it
    sets up its cache object at its first compile: the package's own directory is known before.)"""
    path = str(config.jax_compilation_cache_dir)
    return (_own is not None and os.path.realpath(path) == _own) or serving(path)


def _unloadable(cache_key: str, exc: BaseException) -> bool:
    """Whether an entry JAX could not load is the store's to turn into a miss (it served it): then
    it is removed, and JAX compiles again."""
    store = _serving
    if store is None or not store.served(cache_key):
        return False
    store.reject(cache_key, exc)
    return True


