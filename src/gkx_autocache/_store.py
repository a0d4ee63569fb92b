"""The cache backend JAX reads and writes through, for the directory the package resolved (SPEC §7).

JAX's format and key are kept, so stock JAX and this store read each other's directories. What
changes: writes are atomic (a temporary file, then ``os.replace``, overwriting, which heals a bad
entry); an entry that does not decompress is removed and costs one recompile, silently; an entry in
another compression format is left alone; each hit records recency with ``os.utime`` (no lock);
the real compile time of each write is kept beside the entry (``<key>-gkx-compile``), so time saved
is real for sub-second compiles; and every I/O failure is a miss and a DEBUG line, never a warning
(users run their tests under ``-W error``).

The seams, the same in JAX 0.10.2 and 0.12.0.1, each guarded (if it changes, JAX's stock
behaviour stays):
- ``jax._src.compilation_cache.get_file_cache(path)`` builds the cache object: for the directory
  the package resolved, it returns the store;
- ``jax._src.compilation_cache.get_executable_and_time(cache_key, ...)`` decompresses and
  deserialises what ``get`` returned. An entry the store served that does not deserialise (bit
  rot in a frame without a checksum, a jaxlib rebuilt under the same version, a forced bundle)
  becomes a miss there: one recompile, and ``put`` replaces the entry. JAX's own path warns
  instead, and ``-W error`` turns that warning into an exception out of the user's ``jit``, on
  every run, forever (SPEC §7).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from gkx_autocache import _files, _trust
from gkx_autocache._diagnostics import logger
from gkx_autocache._layout import COMPILE_SIDECAR, ENTRY_SUFFIX, META_DIR, VERDICT_FILE

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


MAX_COMPILE_SECS = 86400.0 * 7  # a sidecar claiming more was not written by a compile
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


def read_compile_secs(sidecar: str) -> float | None:
    """The compile time a ``-gkx-compile`` sidecar records, or None when there is none (or it is
    not a plausible number: a group member of a team cache can write anything there)."""
    return read_sidecar(sidecar)[0]


def read_sidecar(sidecar: str) -> tuple[float | None, float]:
    """``(compile seconds or None, when the entry was written)``: the sidecar is written with its
    entry and never touched after (hits touch the entry, for recency), so its mtime is the entry's
    write time; 0.0 when there is no sidecar."""
    written: list[float] = []

    def when(st: os.stat_result) -> None:
        written.append(st.st_mtime)

    data = _files.read(sidecar, 64, check=lambda st: when(st))
    try:
        value = float(data or b"")
    except ValueError:
        value = -1.0
    return (value if 0.0 <= value <= MAX_COMPILE_SECS else None), (written[0] if written else 0.0)


def compression_of(data: bytes) -> str | None:
    """``"zstd"`` or ``"zlib"`` by the frame's magic bytes, None for neither."""
    if data[:4] == ZSTD_MAGIC:
        return "zstd"
    if len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0:
        return "zlib"
    return None


class Store:
    """JAX's ``CacheInterface``: ``get(key) -> bytes | None`` and ``put(key, bytes)``."""

    def __init__(self, path: str, *, compression: str, decompress: Any, shared: bool, recorder: Any,
                 writable: bool = True, check_payload: bool = True, levels: Any = None) -> None:
        self._path = path  # JAX's VerificationCache reads this attribute
        self._levels = levels  # the shared level behind this one (SPEC §14), asked on a local miss
        self._compression = compression
        self._decompress = decompress
        self._check_payload = check_payload  # decompress before serving (see `install`)
        self._file_mode = _files.file_mode(shared)
        self._writable = writable  # a baked cache, read-only for this user: hits only
        self._shared = shared
        self._recorder = recorder
        self._misses = threading.local()  # key -> process CPU time at the miss, per thread
        self._served = threading.local()  # the key whose bytes this thread was last given

    def _entry(self, key: str) -> str:
        return os.path.join(self._path, key + ENTRY_SUFFIX)

    def get(self, key: str) -> bytes | None:
        path = self._entry(key)
        refused: list[str] = []
        started = time.perf_counter() if self._levels is not None else 0.0

        def trusted(st: os.stat_result) -> str | None:  # one fstat: an entry is code
            why = _trust.entry_problem(st, self._shared)
            if why:
                refused.append(why)
            return why

        data = _files.read(path, check=trusted)
        why = refused[0] if refused else (self._unusable(path, data) if data is not None else None)
        if data is not None and why is None:
            try:
                os.utime(path)  # recency for pruning, on noatime mounts too
            except OSError:
                pass
            compile_secs, written = self._compile_secs(key, data)
            self._recorder.hit(key, len(data), compile_secs, written)
            self._served.key = key
            if self._levels is not None:  # a writer's hit may heal the bucket (queued, off the compile path)
                self._levels.local_hit(len(data), time.perf_counter() - started, key, data, compile_secs or None, written)
            return data
        if self._levels is not None:
            self._levels.local_miss()
            if not why or compression_of(data or b"") is None:  # another environment's entry is left alone
                found = self._levels.get(key)
                if found is not None and not isinstance(found, str):
                    unusable = self._unusable_shared(found.data)
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
        self._recorder.hit(key, len(found.data), found.compile_secs or 0.0, found.written)
        self._served.key = key
        return bytes(found.data)

    def _unusable_shared(self, data: bytes) -> str | None:
        """Why a shared entry's bytes cannot be given to JAX (the checks a local entry gets)."""
        kind = compression_of(data)
        if kind not in (self._compression, None):
            return f"the shared entry is compressed with {kind}, this environment with {self._compression}"
        if self._check_payload:
            try:
                self._decompress(data)
            except Exception as exc:
                return f"the shared entry does not decompress ({type(exc).__name__})"
        return None

    def _backfill(self, key: str, found: Any) -> bool:
        """Write a shared hit into this level, with its compile time (dated when it was written, so
        that it counts as an earlier run's entry); whether it was written. Counted as a write: the
        cap's account and the explanations' index see the entry like any other."""
        path = self._entry(key)
        existing = _files.read(path, limit=4)
        if existing is not None and compression_of(existing) not in (self._compression, None):
            return False
        try:
            with _files.atomic(path, self._file_mode) as f:
                f.write(found.data)
        except OSError as exc:  # disk full: served without the backfill
            logger.debug("cannot write %s: %s", path, exc)
            return False
        written = len(found.data)
        if found.compile_secs is not None:
            sidecar_path = os.path.join(self._path, key + COMPILE_SIDECAR)
            sidecar = f"{found.compile_secs:.6f}".encode()
            if _files.write_atomic(sidecar_path, sidecar, self._file_mode):
                written += len(sidecar)
                if found.written:
                    try:
                        os.utime(sidecar_path, (found.written, found.written))
                    except OSError:
                        pass
        self._recorder.put(key, written, found.compile_secs or 0.0)
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

    def _compile_secs(self, key: str, data: bytes) -> tuple[float, float]:
        """What the entry cost to compile, and when it was written (0.0: unknown)."""
        recorded, written = read_sidecar(os.path.join(self._path, key + COMPILE_SIDECAR))
        if recorded is not None:
            return recorded, written
        try:  # JAX's own record: whole seconds, in the first 4 bytes of the payload
            return float(int.from_bytes(self._decompress(data)[:4], "big")), written
        except Exception:
            return 0.0, written

    def put(self, key: str, value: bytes) -> None:
        started = getattr(self._misses, "keys", {}).pop(key, None)
        if not self._writable:
            self._recorder.uncached(key, "read-only directory", "this user cannot write the cache (a baked image)")
            return
        path = self._entry(key)
        existing = _files.read(path, limit=4)
        if existing is not None and compression_of(existing) not in (self._compression, None):
            logger.debug("%s belongs to another environment's format: not overwritten", path)
            return
        try:
            with _files.atomic(path, self._file_mode) as f:
                f.write(value)
        except OSError as exc:  # disk full, a name too long for the file system: said, not "new" every run
            logger.debug("cannot write %s: %s", path, exc)
            self._recorder.uncached(key, "write failed", exc.strerror or str(exc))
            return
        written = len(value)
        compile_secs = max(compile_clock() - started, 0.0) if started is not None else 0.0
        if started is not None:
            sidecar = f"{compile_secs:.6f}".encode()
            if _files.write_atomic(os.path.join(self._path, key + COMPILE_SIDECAR), sidecar, self._file_mode):
                written += len(sidecar)
        self._recorder.put(key, written, compile_secs)
        if self._levels is not None:  # queued: the upload leaves the compile path
            self._levels.put(key, value, compile_secs if started is not None else None)


# -- installing the store into JAX ------------------------------------------------------------


def _guard(cc: Any) -> str | None:
    """Why this JAX's internals are not the ones the store was written for, or None."""
    get_file_cache = getattr(cc, "get_file_cache", None)
    if get_file_cache is None or _parameters(get_file_cache) != ["path"]:
        return "jax._src.compilation_cache.get_file_cache(path) is missing or has changed"
    for name in ("decompress_executable", "compress_executable", "VerificationCache", "CacheInterface"):
        if not hasattr(cc, name):
            return f"jax._src.compilation_cache.{name} is missing"
    return None


def _parameters(func: Any) -> list[str]:
    import inspect

    try:
        return list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return []


_serving: Store | None = None  # the store JAX got for the package's directory, once it asked


def _loading_guard(cc: Any, jax: Any) -> bool:
    """Wrap ``get_executable_and_time`` so that an entry the store served but JAX cannot load (it
    does not decompress, or does not deserialise) is a miss; whether it was wrapped. Left alone
    (JAX's stock behaviour) if its first parameter is no longer ``cache_key``, or if the compiler
    no longer reaches it through the module (a wrapper it would never call)."""
    original = getattr(cc, "get_executable_and_time", None)
    try:
        from jax._src import compiler

        through_module = getattr(compiler, "compilation_cache", None) is cc and "get_executable_and_time" not in vars(compiler)
    except Exception:
        through_module = False
    if original is None or _parameters(original)[:1] != ["cache_key"] or not through_module:
        logger.debug("jax._src.compilation_cache.get_executable_and_time has changed: JAX's own handling of "
                     "entries it cannot load stays")
        return False
    verification_error = getattr(cc, "CacheVerificationError", ())

    def get_executable_and_time(cache_key: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(cache_key, *args, **kwargs)
        except Exception as exc:
            store = _serving
            deliberate = isinstance(exc, verification_error) or getattr(jax.config, "jax_raise_persistent_cache_errors", False)
            if store is None or deliberate or not store.served(cache_key):
                raise
            store.reject(cache_key, exc)
            return None, None

    get_executable_and_time.__wrapped__ = original  # type: ignore[attr-defined]
    cc.get_executable_and_time = get_executable_and_time
    return True


def install(jax: Any, version_dir: str, shared: bool, recorder: Any, writable: bool = True,
            levels: Any = None) -> str | None:
    """Serve ``version_dir`` through the store; return why not (JAX's stock cache then serves)."""
    try:
        from jax._src import compilation_cache as cc
    except Exception as exc:  # pragma: no cover - a JAX without the module
        return f"jax._src.compilation_cache cannot be imported ({exc})"
    reason = _guard(cc)
    if reason is None and jax.config.jax_compilation_cache_max_size != -1:
        reason = "jax_compilation_cache_max_size is set by the user: JAX's own LRU cache serves"
    if reason is not None:
        return reason
    compression = compression_of(cc.compress_executable(b"gkx-autocache"))
    original = cc.get_file_cache
    ours = os.path.realpath(version_dir)
    guarded = _loading_guard(cc, jax)

    def get_file_cache(path: str) -> Any:
        global _serving
        if not isinstance(path, str) or "://" in path or os.path.realpath(path) != ours:
            return original(path)
        # The store checks that an entry decompresses before serving it wherever JAX would meet a
        # bad one outside the guard: JAX's VerificationCache decompresses what `get` returned, and
        # `jax_raise_persistent_cache_errors` asks the guard to leave JAX's errors to JAX.
        strict = jax.config.jax_compilation_cache_check_contents or getattr(
            jax.config, "jax_raise_persistent_cache_errors", False)
        store = _serving = Store(path, compression=compression or "zlib", decompress=cc.decompress_executable,
                                 shared=shared, recorder=recorder, writable=writable,
                                 check_payload=not guarded or bool(strict), levels=levels)
        if jax.config.jax_compilation_cache_check_contents:
            return cc.VerificationCache(store), path  # type: ignore[arg-type]  # duck-typed CacheInterface
        return store, path

    get_file_cache.__wrapped__ = original  # type: ignore[attr-defined]
    cc.get_file_cache = get_file_cache
    return None


def write_verdict(version_dir: str, store: str, reason: str | None, shared: bool = False,
                  explain: str | None = None, isa: str | None = None) -> None:
    """Record which store serves the directory, whether misses are explained (None: they are; else
    why not) and what to know of the ISA in CPU keys (None: nothing), so ``status`` can say it
    without importing jax."""
    text = json.dumps({"store": store, "reason": reason, "explain": explain, "isa": isa}) + "\n"
    path = os.path.join(version_dir, META_DIR, VERDICT_FILE)
    if _files.read(path) == text.encode():
        return
    if _files.bookkeeping_dir(version_dir, shared) is not None:
        _files.write_atomic(path, text.encode(), 0o644)


def read_verdict(version_dir: str) -> dict[str, Any] | None:
    try:
        verdict = json.loads(_files.read(os.path.join(version_dir, META_DIR, VERDICT_FILE), 4096) or b"")
    except (ValueError, RecursionError):
        return None
    if not isinstance(verdict, dict):
        return None
    return {k: v if isinstance(v, str) else None for k, v in verdict.items() if k in ("store", "reason", "explain", "isa")}
