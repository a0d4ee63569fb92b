"""The cache backend JAX reads and writes through, for the directory the package resolved (SPEC §7).

JAX's format and key are kept, so stock JAX and this store read each other's directories. What
changes: writes are atomic (a temporary file, then ``os.replace``, overwriting, which heals a bad
entry; on a bucket mount, one create: ``_mount``); an entry that does not decompress is removed
and costs one recompile, silently; an entry in another compression format is left alone; each hit
records recency with ``os.utime`` (no lock);
the real compile time of each write is kept beside the entry (``<key>-gkx-compile``), so time saved
is real for sub-second compiles; and every I/O failure is a miss and a DEBUG line, never a warning
(users run their tests under ``-W error``).

JAX's seams, patched by ``_jax.serve_store`` (if one changes, JAX's stock behaviour stays):
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
from typing import Any

from gkx_autocache import _cpu_target, _files, _fork, _formats, _jax, _key, _mount, _trust
from gkx_autocache._diagnostics import logger
from gkx_autocache._formats import SEAL_LIMIT, compression_of, read_sidecar
from gkx_autocache._layout import COMPILE_SIDECAR, ENTRY_SUFFIX, META_DIR, SEAL_SIDECAR, VERDICT_FILE

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


class Store:
    """JAX's ``CacheInterface``: ``get(key) -> bytes | None`` and ``put(key, bytes)``."""

    def __init__(self, path: str, *, compression: str, decompress: Any, shared: bool, recorder: Any,
                 writable: bool = True, check_payload: bool = True, levels: Any = None, whole: bool = False) -> None:
        self._path = path  # JAX's VerificationCache reads this attribute
        self._levels = levels  # the shared level behind this one (SPEC §14), asked on a local miss
        self._landed: dict[str, tuple[int, float]] = {}  # prefetched, not yet recorded: key -> (bytes, compile)
        if levels is not None:
            _fork.in_child(self._landed.clear)  # the parent's: it records them
        if levels is not None:
            levels.attach(self)  # a prefetched entry lands as a backfill; healing and packs read its entries
        self._compression = compression
        self._decompress = decompress
        self._check_payload = check_payload  # decompress before serving (see `install`)
        self._file_mode = _files.file_mode(shared)
        self._writable = writable  # a baked cache, read-only for this user: hits only
        self._whole = whole  # a bucket mount (``_mount``): each file made whole in one create, no times set
        self._shared = shared
        self._recorder = recorder
        self._misses = threading.local()  # key -> process CPU time at the miss, per thread
        self._served = threading.local()  # the key whose bytes this thread was last given

    @property
    def writable(self) -> bool:
        """Whether it takes writes (a baked cache, read-only for this user, serves hits only)."""
        return self._writable

    @property
    def path(self) -> str:
        """The version directory it serves (real path)."""
        return self._path

    def _entry(self, key: str) -> str:
        return os.path.join(self._path, key + ENTRY_SUFFIX)

    def get(self, key: str) -> bytes | None:
        path = self._entry(key)
        refused: list[str] = []
        started = 0.0
        if self._levels is not None:
            self._levels.before_lookup(key)  # its prefetch, if in flight, lands first
            started = time.perf_counter()

        def trusted(st: os.stat_result) -> str | None:  # one fstat: an entry is code
            why = _trust.entry_problem(st, self._shared)
            if why:
                refused.append(why)
            return why

        data = _files.read(path, check=trusted)
        why = refused[0] if refused else (self._unusable(path, data) if data is not None else None)
        if data is not None and why is None:
            why = self._foreign(data, landing=False)
        if data is not None and why is None:
            if not self._whole:  # (a bucket mount keeps no recency: an entry's age is its write time)
                try:
                    os.utime(path)  # recency for pruning, on noatime mounts too
                except OSError:
                    pass
            compile_secs, _, by = self._compile_secs(key, data)
            if (landed := self._landed.pop(key, None)) is not None:  # recorded here, where its lookup's facts are
                self._recorder.put(key, *landed, landed=True)
            self._recorder.hit(key, len(data), compile_secs, by)
            self._served.key = key
            if self._levels is not None:  # a writer's hit may heal the bucket (queued, off the compile path)
                self._levels.local_hit(len(data), time.perf_counter() - started, key)
            return data
        if self._levels is not None:
            self._levels.local_miss(key)
            if not why or compression_of(data or b"") is None:  # another environment's entry is left alone
                found = self._levels.get(key)
                if found is not None and not isinstance(found, str):
                    unusable = self._unusable_shared(found.data, landing=False)
                    if unusable is None:
                        return self._serve_shared(key, found)
                    found = unusable
                if found is not None:
                    why = found
        self._missed(key)
        if why:  # the entry was there but cannot be used: named, not "evicted" on every run
            self._recorder.rejected(key, why)
        elif self._levels is not None and self._levels.off_note is not None:
            self._recorder.miss(key, shared_off=self._levels.off_note)
        else:
            self._recorder.miss(key)
        return None

    def _serve_shared(self, key: str, found: Any) -> bytes:
        """A shared hit: written into this level first (the backfill, atomic) where this level takes
        writes, so that the next run reads it here; served either way (a read-only or full local
        level serves it without the backfill)."""
        if self._writable and self._backfill(key, found):
            self._levels.count("shared", backfills=1)
        self._recorder.hit(key, len(found.data), found.compile_secs or 0.0)  # another run's compile
        self._served.key = key
        return bytes(found.data)

    def land(self, key: str, found: Any) -> tuple[bool, str | None]:
        """A prefetched entry (SPEC §14), checked as a shared hit is, then written into this level:
        ``(landed, why not)``, why None where this level took no write (disk full)."""
        why = self._unusable_shared(found.data, landing=True)
        if why is not None:
            return False, why
        return self._backfill(key, found, record=False), None

    def uploadable(self, key: str) -> tuple[bytes, bytes] | None:
        """A writer's entry to heal the shared level with or to pack (SPEC §14), read as a hit
        reads it (trusted, in this environment's compression), and the seal it may go with
        (``Level.seal_for``: with a signing key, only the seal kept beside it, verified now against
        these bytes); else None."""
        def signable(st: os.stat_result) -> str | None:  # in a team directory, only what this user wrote
            mine = not self._shared or not hasattr(os, "geteuid") or st.st_uid == os.geteuid()
            return _trust.entry_problem(st, self._shared) or (None if mine else "another user's")

        data = _files.read(self._entry(key), check=signable)
        if data is None or compression_of(data) != self._compression:
            return None
        kept = _files.read(self._seal(key), SEAL_LIMIT, check=signable) if self._levels.signs else None
        # The compile time as recorded (0.0 is a time: a compile the clock's ticks could not see), else none.
        compile_secs, written = None, 0.0
        if kept is None:
            compile_secs, written, _ = read_sidecar(os.path.join(self._path, key + COMPILE_SIDECAR))
        seal = self._levels.seal_for(key, data, kept, compile_secs, written)
        return (data, seal) if seal is not None else None

    def _seal(self, key: str) -> str:
        """The seal kept beside a local entry (``<key>-gkx-shared``), where a signing key vouched for
        its bytes: this process's compile, or a shared entry verified under the key."""
        return os.path.join(self._path, key + SEAL_SIDECAR)

    def _keep_seal(self, key: str, seal: bytes | None) -> int:
        """Write (or, with none, remove) the seal beside a local entry just written; its bytes."""
        path = self._seal(key)
        if seal is None:
            if self._levels is not None and self._levels.signs:
                _files.remove(path)  # (bytes it did not vouch for replaced the entry: never a stale seal)
            return 0
        return len(seal) if _files.write_atomic(path, seal, self._file_mode, self._whole) else 0

    def record_landed(self) -> None:
        """At exit: the prefetched entries no lookup used, recorded as written (the cap's account)."""
        while self._landed:
            key, landed = self._landed.popitem()
            self._recorder.put(key, *landed, landed=True)

    def _unusable_shared(self, data: bytes, landing: bool) -> str | None:
        """Why a shared entry's bytes cannot be given to JAX (the checks a local entry gets);
        ``landing``: a prefetched entry, whose key this thread did not compute."""
        kind = compression_of(data)
        if kind not in (self._compression, None):
            return f"the shared entry is compressed with {kind}, this environment with {self._compression}"
        if self._check_payload:
            try:
                self._decompress(data)
            except Exception as exc:
                return f"the shared entry does not decompress ({type(exc).__name__})"
        return self._foreign(data, landing)

    def _foreign(self, data: bytes, landing: bool) -> str | None:
        """Under a ``cpu_target``, why an entry must not run on this CPU (it lists a feature this
        host lacks: another host at the target wrote it), or None. One more decompression a hit,
        only for a key that holds the target (this thread's last), or a prefetched entry, which
        may be one (``_cpu_target``)."""
        target = _cpu_target.active
        if target.level is None or not (landing or _key.targeted()):
            return None
        try:
            payload = self._decompress(data)
        except Exception:
            return None  # JAX's loading meets it, as any entry that does not decompress
        return target.foreign(payload)

    def _backfill(self, key: str, found: Any, record: bool = True) -> bool:
        """Write a shared hit into this level, with its compile time (dated when it was written, so
        that it counts as an earlier run's entry); whether it was written. Counted as a write: the
        cap's account and the explanations' index see the entry like any other (a prefetch's,
        ``record`` False, is recorded at its lookup, whose thread holds the facts the index needs)."""
        path = self._entry(key)
        existing = _files.read(path, limit=4)
        if existing is not None and compression_of(existing) not in (self._compression, None):
            return False
        try:
            with _files.atomic(path, self._file_mode, whole=self._whole) as f:
                f.write(found.data)
        except OSError as exc:  # disk full: served without the backfill
            logger.debug("cannot write %s: %s", path, exc)
            return False
        written = len(found.data) + self._keep_seal(key, found.seal)
        if found.compile_secs is not None:
            sidecar_path = os.path.join(self._path, key + COMPILE_SIDECAR)
            sidecar = _formats.sidecar(found.compile_secs)
            if _files.write_atomic(sidecar_path, sidecar, self._file_mode, self._whole):
                written += len(sidecar)
                if found.written and not self._whole:
                    try:
                        os.utime(sidecar_path, (found.written, found.written))
                    except OSError:
                        pass
        if record:
            self._recorder.put(key, written, found.compile_secs or 0.0)
        else:
            self._recorder.landed(written)
            self._landed[key] = (written, found.compile_secs or 0.0)
        return True

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
        data = _files.read(self._entry(key))
        corrupt = False
        if data is not None:
            try:
                self._decompress(data)
            except Exception:
                corrupt = True
                if self._writable:
                    _files.remove(self._entry(key))
        what = ("corrupt entry: it does not decompress" if corrupt
                else "an entry JAX could not load (it decompresses, but does not deserialise)")
        self._missed(key)
        self._recorder.rejected(key, f"{what}; compiled again and replaced ({reason})"[:400])

    def _unusable(self, path: str, data: bytes) -> str | None:
        """Why these bytes cannot be given to JAX, or None. Where the loading guard is installed
        (``_loading_guard``), bytes that do not decompress are JAX's failure to load them, a miss
        like any other, and decompressing them here first would double the cost of every hit."""
        kind = compression_of(data)
        if kind not in (self._compression, None):
            logger.debug("%s is in another compression format: a miss, left alone", path)
            return f"written by an environment that compresses with {kind}: left alone"
        if not self._check_payload:
            return None
        try:
            self._decompress(data)
        except Exception as exc:
            logger.debug("%s is corrupt (%s): removed, it will be compiled again", path, exc)
            if self._writable:
                _files.remove(path)
            return f"does not decompress ({type(exc).__name__}): compiled again and replaced"
        return None

    def _compile_secs(self, key: str, data: bytes) -> tuple[float, float, str]:
        """What the entry cost to compile, when it was written (0.0: unknown) and by which run ("")."""
        recorded, written, by = read_sidecar(os.path.join(self._path, key + COMPILE_SIDECAR))
        if recorded is not None:
            return recorded, written, by
        try:  # JAX's own record: whole seconds, in the first 4 bytes of the payload
            return float(int.from_bytes(self._decompress(data)[:4], "big")), written, by
        except Exception:
            return 0.0, written, by

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
        if not self._writable:
            self._uncached(key, "READ_ONLY", "this user cannot write the cache (a baked image)")
            return
        path = self._entry(key)
        existing = _files.read(path, limit=4)
        if existing is not None and compression_of(existing) not in (self._compression, None):
            logger.debug("%s belongs to another environment's format: not overwritten", path)
            return
        try:
            with _files.atomic(path, self._file_mode, whole=self._whole) as f:
                f.write(value)
        except OSError as exc:  # disk full, a name too long for the file system: said, not "new" every run
            logger.debug("cannot write %s: %s", path, exc)
            self._uncached(key, "WRITE_FAILED", exc.strerror or str(exc))
            return
        written = len(value)
        compile_secs = max(compile_clock() - started, 0.0) if started is not None else 0.0
        if started is not None:
            sidecar = _formats.sidecar(compile_secs, self._recorder.run.id)
            if _files.write_atomic(os.path.join(self._path, key + COMPILE_SIDECAR), sidecar, self._file_mode, self._whole):
                written += len(sidecar)
        seal, now = None, time.time()
        if self._levels is not None:  # what this process compiled, its key vouches for: kept beside it
            seal = self._levels.vouch(key, value, compile_secs if started is not None else None, now)
            written += self._keep_seal(key, seal)
        self._recorder.put(key, written, compile_secs)
        if self._levels is not None:  # queued: the upload leaves the compile path
            self._levels.put(key, value, compile_secs if started is not None else None, seal, now)


# -- installing the store into JAX ------------------------------------------------------------


_serving: Store | None = None  # the store JAX got for the package's directory, once it asked
_own: str | None = None  # the package's own version directory (real path), once installed


def install(jax: Any, version_dir: str, shared: bool, recorder: Any, writable: bool = True,
            levels: Any = None, follow: Callable[[str], bool | None] | None = None) -> str | None:
    """Serve ``version_dir`` through the store; return why not (JAX's stock cache then serves).

    ``follow(path)`` is told of every directory JAX sets up its cache in (at its first compile
    since the setting changed): it says whether the store serves it too, and whether it may be
    written (None: JAX's stock cache serves it), and moves the recorder there (``_adopted``)."""
    global _own
    ours = os.path.realpath(version_dir)
    served: dict[str, bool] = {ours: writable}  # a directory the store serves -> whether it writes it

    def serves(path: str) -> bool:
        real = os.path.realpath(path)
        said = follow(path) if follow is not None else None
        if real != ours and said is not None:
            served[real] = said
        return real == ours or said is not None

    def make(path: str, sample: bytes, decompress: Any, check_payload: bool) -> Store:
        global _serving
        real = os.path.realpath(path)  # as checked: JAX's own spelling may go through a link, or be relative
        mine = real == ours
        _serving = Store(real, compression=compression_of(sample) or "zlib", decompress=decompress,
                         shared=shared and mine, recorder=recorder, writable=served[os.path.realpath(path)],
                         check_payload=check_payload, levels=levels if mine else None,
                         whole=_mount.bucket_mount(real) is not None)
        return _serving

    why = _jax.serve_store(jax, serves, make, _unloadable)
    if why is None:
        _own = ours
    return why


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


def write_verdict(version_dir: str, store: str, reason: str | None, shared: bool = False,
                  explain: str | None = None, isa: str | None = None, callbacks: str | None = None) -> None:
    """Record which store serves the directory, whether misses are explained and what to know of
    the ISA in CPU keys (``_formats.verdict``), so ``status`` can say it without importing jax."""
    text = _formats.verdict(store, reason, explain, isa, callbacks)
    path = os.path.join(version_dir, META_DIR, VERDICT_FILE)
    if _files.read(path) == text:
        return
    if _files.bookkeeping_dir(version_dir, shared) is not None:
        _files.write_atomic(path, text, 0o644)


def read_verdict(version_dir: str) -> dict[str, Any] | None:
    return _formats.parse_verdict(_files.read(os.path.join(version_dir, META_DIR, VERDICT_FILE), 4096))
