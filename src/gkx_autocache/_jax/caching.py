"""The cache's seams (``jax._src.compilation_cache``, ``compiler``): the cache object JAX sets up
(``get_file_cache``, which the store serves), its codec, its lookup (guarded: an entry JAX cannot
load is a miss; skipped where a lookup must read nothing), its write, and XLA's own caches in a
compile's options."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from gkx_autocache._diagnostics import logger
from gkx_autocache._jax.callbacks import callbacks_kept, host_callbacks
from gkx_autocache._jax.hooks import WRITE_CHANGED, write_seam
from gkx_autocache._jax.versions import attr, loaded, parameters, patch

FILE_CACHE_CHANGED = "jax._src.compilation_cache.get_file_cache(path) is missing or has changed"

def store_problem(cc: Any) -> str | None:
    """Why this JAX's cache module is not the one the store was written for, or None."""
    get_file_cache = attr(cc, "get_file_cache")
    if get_file_cache is None or parameters(get_file_cache) != ["path"]:
        return FILE_CACHE_CHANGED
    for name in ("decompress_executable", "compress_executable", "CacheInterface"):  # VerificationCache: 0.9.1+
        if attr(cc, name) is None:
            return f"jax._src.compilation_cache.{name} is missing"
    return None

def jax_lru_usable() -> bool:
    """Whether JAX's LRU cache can keep a size cap: it needs ``filelock`` (``lru_cache.filelock`` is
    None without it, and every lookup then raises inside JAX, which warns and caches nothing)."""
    try:
        from jax._src import lru_cache
    except Exception:
        return False
    return getattr(lru_cache, "filelock", None) is not None

def serve_file_caches(jax: Any, route: Callable[[str], tuple[str, str] | None],
                      make: Callable[[str, bool, bytes, Any, bool], Any] | None,
                      unloadable: Callable[[str, BaseException], bool],
                      recheck: Callable[[str], str | None]) -> tuple[str | None, str | None]:
    """JAX sets up its cache object through ``get_file_cache(path)`` (at its first compile since the
    directory was set, 0.4.30 to 0.12). For a local directory, ``route(path)`` says what serves it:

    - None: nothing; JAX reads and writes nothing there (a directory the trust rules refuse);
    - ``(real, "store")`` or ``(real, "store-read-only")``: the store, ``make(real, writable, sample,
      decompress, check_payload)``, in the real path judged (``sample``: a payload as this JAX
      compresses it); where the store cannot serve (or ``make`` is None), JAX's own object as below;
    - ``(real, "jax")``: JAX's own object in the real path judged, which reads and writes nothing
      once ``recheck(real)`` names why (one stat a lookup: a directory given to another user since);
      ``(path, "unchecked")``: JAX's own object, as JAX would.
    Where ``get_executable_and_time`` can be guarded, an entry the store served that does not load
    is a miss when ``unloadable(key, error)`` says so. Returns ``(why the store does not serve, why
    no directory is routed)``, each None where it does."""
    try:
        from jax._src import compilation_cache as cc
    except Exception as exc:  # pragma: no cover - a JAX without the module
        why = f"jax._src.compilation_cache cannot be imported ({exc})"
        return why, why
    original = attr(cc, "get_file_cache")
    if original is None or parameters(original) != ["path"]:
        return FILE_CACHE_CHANGED, FILE_CACHE_CHANGED
    store_why = "the package has no directory of its own here" if make is None else store_problem(cc)
    if store_why is None and jax.config.jax_compilation_cache_max_size != -1 and jax_lru_usable():
        store_why = "jax_compilation_cache_max_size is set by the user: JAX's own LRU cache serves"
    sample = cc.compress_executable(b"gkx-autocache") if store_why is None else b""
    guarded = store_why is None and _guard_loading(cc, jax, unloadable)

    def get_file_cache(path: str) -> Any:
        if not isinstance(path, str) or "://" in path:
            return original(path)
        routed = route(path)
        if routed is None:
            return None
        real, how = routed
        if how == "unchecked":
            return original(real)
        if how == "jax" or store_why is not None:
            found = original(real)
            return None if found is None else (_Rechecked(found[0], real, recheck), found[1])
        # The store checks that an entry decompresses before serving it wherever JAX would meet a
        # bad one outside the guard: JAX's VerificationCache decompresses what `get` returned, and
        # `jax_raise_persistent_cache_errors` asks the guard to leave JAX's errors to JAX.
        checked = getattr(jax.config, "jax_compilation_cache_check_contents", False)  # 0.9.1+, as VerificationCache
        strict = checked or getattr(jax.config, "jax_raise_persistent_cache_errors", False)
        assert make is not None
        store = make(real, how == "store", sample, cc.decompress_executable, not guarded or bool(strict))
        return (cc.VerificationCache(store) if checked else store), real

    patch(cc, "get_file_cache", get_file_cache)
    return store_why, None

def codec(jax: Any) -> tuple[bytes, Callable[[bytes], Any]] | None:
    """A payload as this JAX compresses it (its compression named from it) and JAX's own
    decompression, or None where the cache module lacks them."""
    cc = loaded("compilation_cache")
    compress, decompress = attr(cc, "compress_executable"), attr(cc, "decompress_executable")
    if compress is None or decompress is None:
        return None
    return compress(b"gkx-autocache"), decompress

def payload_checks(jax: Any) -> Callable[[], bool]:
    """Whether the store decompresses an entry before it gives it to JAX, asked at each lookup:
    where JAX's loading cannot be guarded (``_guard_loading``), or where JAX is to meet the bytes
    itself (its VerificationCache decompresses what ``get`` returned; ``jax_raise_persistent_cache_errors``
    asks the guard to leave JAX's errors to JAX)."""
    cc = loaded("compilation_cache")
    guarded = cc is not None and lookup_seam(cc) is not None
    config = jax.config

    def check() -> bool:
        return (not guarded or bool(getattr(config, "jax_compilation_cache_check_contents", False))
                or bool(getattr(config, "jax_raise_persistent_cache_errors", False)))

    return check

class _Rechecked:
    """JAX's own cache object for a directory it may use only while the directory passes the trust
    rules, asked at each lookup and write (``recheck``); the rest is the object's."""

    def __init__(self, cache: Any, path: str, recheck: Callable[[str], str | None]) -> None:
        self._cache, self._checked_path, self._recheck = cache, path, recheck

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cache, name)

    def get(self, key: str) -> Any:
        if (why := self._recheck(self._checked_path)) is not None:
            logger.debug("%s is not read: %s", self._checked_path, why)
            return None
        return self._cache.get(key)

    def put(self, key: str, value: bytes) -> None:
        if self._recheck(self._checked_path) is None:
            self._cache.put(key, value)

LOOKUP_CHANGED = "jax._src.compilation_cache.get_executable_and_time has changed"

def lookup_seam(cc: Any) -> Any:
    """JAX's lookup, ``get_executable_and_time(cache_key, ...)``, where a wrapper of it is what the
    compiler calls; None if its first parameter is no longer ``cache_key``, or if the compiler no
    longer reaches it through the module (a wrapper it would never call)."""
    original = attr(cc, "get_executable_and_time")
    try:
        from jax._src import compiler

        through_module = attr(compiler, "compilation_cache") is cc and "get_executable_and_time" not in vars(compiler)
    except Exception:
        through_module = False
    return original if original is not None and parameters(original)[:1] == ["cache_key"] and through_module else None

def skip_lookups(skip: Callable[[str, Callable[[], list[int]]], tuple[str, str] | None],
                 on_skip: Callable[[str, str, str], None]) -> str | None:
    """Make a lookup a miss wherever ``skip(platform, device_ids)`` names a cause and why (an XLA
    dump is asked for: a hit would skip XLA and its dump; a TPU device subset without device 0),
    telling ``on_skip(cache_key, cause, why)``; JAX still writes. Why not, or None."""
    try:
        from jax._src import compilation_cache as cc
    except Exception as exc:  # pragma: no cover - a JAX without the module
        return f"jax._src.compilation_cache cannot be imported ({exc})"
    original = lookup_seam(cc)
    if original is None:
        return LOOKUP_CHANGED

    def get_executable_and_time(cache_key: str, *args: Any, **kwargs: Any) -> Any:
        try:
            backend = args[1] if len(args) > 1 else kwargs.get("backend")
            skipped = skip(str(getattr(backend, "platform", "")), lambda: lookup_devices(args, kwargs))
        except Exception:  # never in the way of JAX's lookup
            skipped = None
        if skipped is None:
            return original(cache_key, *args, **kwargs)
        on_skip(cache_key, *skipped)
        return None, None

    patch(cc, "get_executable_and_time", get_executable_and_time)
    return None

def lookup_devices(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int]:
    """The ids of the devices a lookup's executable runs on: ``get_executable_and_time``'s
    ``executable_devices`` (JAX 0.4.36 to 0.12, its fourth argument), else the compile options'
    device assignment (``DeviceAssignment{... Computation0{2} Computation1{3}}``: 0.4.30 on)."""
    import re

    devices = args[2] if len(args) > 2 else kwargs.get("executable_devices")
    if devices is not None:
        return [int(d.id) for d in devices]
    options: Any = args[0] if args else kwargs.get("compile_options")
    assignment = str(options.executable_build_options.device_assignment)
    return [int(n) for group in re.findall(r"\{([\d ,]+)\}", assignment) for n in re.findall(r"\d+", group)]

# Platforms whose warm read of an executable for a device assignment without device 0 can halt the
# runtime: jax-ml/jax#38004 (open; TPU v6e-4, JAX 0.8.1, libtpu 0.0.30: "Core halted unexpectedly");
# sglang-jax turns its cache off there (its PR #1225). No libtpu is known to be fixed.
SUBSET_PLATFORMS = ("tpu",)

SUBSET_ISSUE = "jax-ml/jax#38004"

def unsafe_subset(platform: str, devices: Callable[[], list[int]]) -> str | None:
    """Why a lookup must not read an entry, as its executable runs on a device subset without
    device 0 of a platform whose runtime that can crash (``SUBSET_PLATFORMS``), or None."""
    if platform not in SUBSET_PLATFORMS:
        return None
    ids = devices()
    if not ids or 0 in ids:
        return None
    return (f"{platform.upper()} devices {sorted(set(ids))[:8]} (without device 0): a warm read there can crash the "
            f"{platform.upper()} runtime ({SUBSET_ISSUE})")

def _guard_loading(cc: Any, jax: Any, unloadable: Callable[[str, BaseException], bool]) -> bool:
    """Wrap ``get_executable_and_time`` so that an entry the store served but JAX cannot load (it
    does not decompress, or does not deserialise) is a miss; whether it was wrapped (JAX's stock
    behaviour stays where the seam changed)."""
    original = lookup_seam(cc)
    if original is None:
        logger.debug("%s: JAX's own handling of entries it cannot load stays", LOOKUP_CHANGED)
        return False
    verification_error = attr(cc, "CacheVerificationError") or ()

    def get_executable_and_time(cache_key: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(cache_key, *args, **kwargs)
        except Exception as exc:
            deliberate = isinstance(exc, verification_error) or getattr(jax.config, "jax_raise_persistent_cache_errors", False)
            if deliberate or not unloadable(cache_key, exc):
                raise
            return None, None

    patch(cc, "get_executable_and_time", get_executable_and_time)
    return True

def guard_stock(jax: Any, directory: str) -> str | None:
    """JAX's stock cache in a directory the package chose (Windows, ``_cache.windows``): an entry
    JAX cannot load is removed (JAX never rewrites one) and is a miss, and a write JAX fails at is
    logged; neither becomes JAX's "Error reading/writing persistent compilation cache entry"
    warning, which ``-W error`` raises out of the user's ``jit`` (SPEC §6). Why not, or None."""
    try:
        from jax._src import compilation_cache as cc
    except Exception as exc:  # pragma: no cover - a JAX without the module
        return f"jax._src.compilation_cache cannot be imported ({exc})"

    def unloadable(cache_key: str, exc: BaseException) -> bool:
        logger.debug("entry %s of JAX's cache does not load, removed: %s", cache_key, exc)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(directory, f"{cache_key}-cache"))
        return True

    def quiet(write: Callable[..., Any]) -> Callable[..., Any]:
        def _cache_write(*args: Any, **kwargs: Any) -> Any:
            try:
                return write(*args, **kwargs)
            except Warning as warning:  # JAX's own warning of a failed write, made an error by the filters
                if getattr(jax.config, "jax_raise_persistent_cache_errors", False):
                    raise
                logger.debug("JAX's cache write failed: %s", warning)
                return None
        return _cache_write

    if not _guard_loading(cc, jax, unloadable):
        return LOOKUP_CHANGED
    return wrap_cache_write(quiet)

def wrap_cache_write(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> str | None:
    """Make ``wrap(write)`` JAX's ``_cache_write(cache_key, compile_time_secs, module_name, backend,
    executable, ...)``; why not, or None."""
    try:
        from jax._src import compiler
    except Exception as exc:
        return f"jax._src.compiler cannot be imported ({exc})"
    write = write_seam(compiler)
    if write is None:
        return WRITE_CHANGED
    patch(compiler, "_cache_write", wrap(write))
    return None

XLA_CACHE_PATHS = ("xla_gpu_per_fusion_autotune_cache_dir", "xla_gpu_kernel_cache_file")

def guard_xla_caches(allowed: Callable[[str], bool]) -> str | None:
    """XLA's own caches (``<dir>/xla_gpu_...`` in a compile's debug options) cleared where ``allowed(<dir>)``
    says no, once JAX has routed its directory (``is_cache_used``), before key and compile (0.4.30+)."""
    compiler, cc = loaded("compiler"), loaded("compilation_cache")  # (import jax loaded them)
    original, set_up = attr(compiler, "compile_or_get_cached"), attr(cc, "is_cache_used")
    if original is None or parameters(original)[:4] != ["backend", "computation", "devices", "compile_options"]:
        return "jax._src.compiler.compile_or_get_cached has changed"
    set_up = set_up if set_up is not None and parameters(set_up) == ["backend"] else None

    def compile_or_get_cached(backend: Any, computation: Any, devices: Any, compile_options: Any,
                              *rest: Any, **kwargs: Any) -> Any:
        try:  # (JAX's options as they were where anything fails: never in the way of a compile)
            debug = compile_options.executable_build_options.debug_options
            named = [(name, path) for name in XLA_CACHE_PATHS if (path := getattr(debug, name, ""))]
            if named and set_up is not None:
                set_up(backend)  # (JAX's first step anyway: its directory routed, and judged, before XLA's are)
            for name, path in named:
                if not allowed(os.path.dirname(path)):
                    setattr(debug, name, "")
        except Exception as exc:
            logger.debug("XLA's caches not judged: %s", exc)
        return original(backend, computation, devices, compile_options, *rest, **kwargs)

    patch(compiler, "compile_or_get_cached", compile_or_get_cached)
    return None

def bracket_compiles(begin: Callable[[], Any], end: Callable[[Any], None]) -> str | None:
    """Call ``begin()`` as each ``compile_or_get_cached`` starts and ``end(what begin gave)`` as it
    ends, however it ends (a write, no write, an error): where a lease a lookup took in it is let
    go when JAX wrote no entry (``_local.lease``). Any signature (0.4.30 to 0.12): nothing is read
    of its arguments. Why not, or None."""
    compiler = loaded("compiler")
    original = attr(compiler, "compile_or_get_cached")
    if not callable(original):
        return "jax._src.compiler.compile_or_get_cached is missing"

    def compile_or_get_cached(*args: Any, **kwargs: Any) -> Any:
        try:
            outer = begin()
        except Exception:  # never in the way of a compile
            return original(*args, **kwargs)
        try:
            return original(*args, **kwargs)
        finally:
            try:
                end(outer)
            except Exception as exc:
                logger.debug("end of a compile: %s", exc)

    patch(compiler, "compile_or_get_cached", compile_or_get_cached)
    return None

def rank_local_writes(jax: Any, version_dir: str) -> str | None:
    """With a shared level, the local level is this host's own: let every rank write its own
    compiles there (process 0 alone still writes the shared level, JAX's rule, which is there to
    spare a shared file system or bucket many writers). On CPU each rank's keys include its
    devices, so without this a rank other than 0 would compile again on every run. Why not, or
    None. Guarded like the store: JAX's own rule stays if the seam has changed."""
    try:
        from jax._src import compilation_cache as cc
        from jax._src import compiler, distributed
    except Exception as exc:  # pragma: no cover - a JAX without the modules
        return f"jax._src.compiler cannot be imported ({exc})"
    write = write_seam(compiler)
    put = attr(cc, "put_executable_and_time")
    if (write is None or put is None or parameters(put) != ["cache_key", "module_name", "executable", "backend", "compile_time"]
            or attr(attr(distributed, "global_state"), "process_id") is None):
        return "jax._src.compiler._cache_write or compilation_cache.put_executable_and_time has changed"

    def _cache_write(cache_key: str, compile_time_secs: float, module_name: str, backend: Any, executable: Any,
                     *rest: Any, **kwargs: Any) -> None:
        try:
            other_rank = distributed.global_state.process_id != 0 and jax.config.jax_compilation_cache_dir == version_dir
            kept = callbacks_kept(host_callbacks(rest, kwargs), backend)
            minimum = jax.config.jax_persistent_cache_min_compile_time_secs
        except Exception:
            other_rank = False
        if not other_rank or kept or compile_time_secs < minimum:  # JAX's other reasons stay JAX's
            return write(cache_key, compile_time_secs, module_name, backend, executable, *rest, **kwargs)  # type: ignore[no-any-return]
        try:
            put(cache_key, module_name, executable, backend, int(compile_time_secs))
        except Exception as exc:
            logger.debug("rank-local write of %s failed: %s", cache_key, exc)
        return None

    patch(compiler, "_cache_write", _cache_write)
    return None


def cache_object() -> Any:
    """The cache object JAX set up and reads through now (``compilation_cache._cache``, 0.4.30 to 0.12;
    within a VerificationCache, the one it wraps), or None before JAX's first compile or where it has none."""
    cache = attr(loaded("compilation_cache"), "_cache")
    wrapped = attr(cache, "_base_cache") if cache is not None else None
    return wrapped if wrapped is not None else cache
