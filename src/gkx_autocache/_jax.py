"""JAX's private internals (``jax._src``): the one module that names them.

Each seam the package uses is found here, checked against the shape the package was written for,
and patched here. A seam that differs is reported as why not (one line), and JAX keeps its own
behaviour there; nothing here raises into JAX. What each JAX line has: docs/jax-lines.md.
Imported on ``import jax`` (stdlib only at import: ``jax._src`` is reached inside the functions).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from gkx_autocache._diagnostics import logger

OLDEST = (0, 4, 30)  # the oldest JAX line supported (SPEC §16); each seam is probed, on every line
HOOK = "jax._src.cache_key.custom_hook"  # the key's part meant for additions, as messages name it
WRITE = ["cache_key", "compile_time_secs", "module_name", "backend", "executable"]  # _cache_write's first five


def unsupported(version: str) -> str | None:
    """Why this JAX is left as it is (older than ``OLDEST``), or None (a local build's too: probed)."""
    line = version_tuple(version)
    if line is None or line >= OLDEST:
        return None
    return (f"JAX {version} is not supported (gkx-autocache supports JAX {'.'.join(map(str, OLDEST))} and later): "
            "JAX is left as it is")


def version_tuple(version: str) -> tuple[int, int, int] | None:
    """``(0, 4, 30)`` of ``"0.4.30"``, or None where it does not read as a version."""
    import re

    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    return None if found is None else (int(found[1]), int(found[2]), int(found[3] or 0))


def parameters(func: Any) -> list[str]:
    import inspect

    try:
        return list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return []


def signature_text(func: Any) -> str:
    import inspect

    try:
        return str(inspect.signature(func))
    except (TypeError, ValueError):
        return ""


def _loaded(name: str) -> Any:
    """``jax._src.<name>`` where JAX has imported it, else None: never imports."""
    return sys.modules.get(f"jax._src.{name}")


def _attr(owner: Any, name: str) -> Any:
    """``owner.name``, or None where it is missing or reading it raises (a later JAX's deprecation
    shim, which ``-W error`` turns into an exception): such a seam is missing."""
    try:
        return getattr(owner, name, None)
    except Exception:
        return None


def _patch(owner: Any, name: str, new: Any) -> None:
    new.__wrapped__ = getattr(owner, name)
    setattr(owner, name, new)


# -- the key: its custom hook and its parts (jax._src.cache_key) ----------------------------------


def install_hook(wrap: Callable[[Callable[[], Any]], Callable[[], Any]]) -> str | None:
    """Make ``wrap(previous)`` the key's custom hook (the package's, chaining the one set before);
    why not, or None."""
    try:
        from jax._src import cache_key
    except Exception as exc:
        return f"jax._src.cache_key cannot be imported ({exc})"
    previous = _attr(cache_key, "custom_hook")
    if not callable(previous):
        return f"{HOOK} is missing"
    _patch(cache_key, "custom_hook", wrap(previous))
    _hooked[:] = [cache_key]
    return None


_hooked: list[Any] = []  # the key's module whose hook is the package's


def current_hook() -> Any:
    """The key's custom hook now (the user's code may replace the package's after ``import jax``)."""
    return _attr(_hooked[0] if _hooked else None, "custom_hook")


def _parts_logger(cache_key: Any) -> Any:
    """JAX's ``_log_cache_key_hash(hash_obj, last_serialized, hashfn)``, or None where it differs."""
    log_part = _attr(cache_key, "_log_cache_key_hash")
    return log_part if log_part is not None and parameters(log_part) == ["hash_obj", "last_serialized", "hashfn"] else None


def _write_seam(compiler: Any) -> Any:
    """JAX's ``_cache_write`` whose first five parameters are ``WRITE``, or None where it differs."""
    write = _attr(compiler, "_cache_write")
    return write if write is not None and parameters(write)[:5] == WRITE else None


WRITE_CHANGED = "jax._src.compiler._cache_write has changed"


def watch_key_parts(on_part: Callable[[Any, str, Any], None]) -> bool:
    """Call ``on_part(hash_obj, name, hashfn)`` after each part of each key, where JAX's
    ``_log_cache_key_hash(hash_obj, last_serialized, hashfn)`` (called by ``get`` after each
    part) has the shape it had from JAX 0.4.30 to 0.12; whether it is watched. The parts are
    watched with or without the package's hook in place."""
    try:
        from jax._src import cache_key
    except Exception:
        return False
    log_part = _parts_logger(cache_key)
    if log_part is None:
        logger.debug("jax._src.cache_key._log_cache_key_hash has changed: a replaced hook is not noticed")
        return False

    def _log_cache_key_hash(hash_obj: Any, last_serialized: str, hashfn: Any) -> None:
        log_part(hash_obj, last_serialized, hashfn)
        try:
            on_part(hash_obj, last_serialized, hashfn)
        except Exception:
            pass

    _patch(cache_key, "_log_cache_key_hash", _log_cache_key_hash)
    return True


def key_platform(hashfn: Any) -> str | None:
    """The platform a key is for (``cpu``, ``cuda``...), from its "backend version" part's function,
    a closure over ``backend`` (JAX 0.4.30 to 0.12); None where it is not one."""
    try:
        cells = dict(zip(hashfn.__code__.co_freevars, hashfn.__closure__ or (), strict=True))
        return str(_contents(cells["backend"]).platform)
    except Exception:
        return None


def replace_config_update(config: Any, update: Callable[..., Any]) -> str | None:
    """``jax.config.update`` replaced by ``update`` (which calls the one it replaces): None, or why
    this JAX's config takes no such attribute. JAX's objects are patched here alone."""
    try:
        config.update = update
    except (AttributeError, TypeError) as exc:
        return str(exc)
    return None


def exclude_xla_flag(flag: str) -> None:
    """Leave ``flag`` out of the key's XLA-flags part, as JAX leaves its dump flags (its list,
    ``xla_flags_to_exclude_from_cache_key``, is read at every key, JAX 0.4.30 to 0.12)."""
    excluded = _attr(_loaded("cache_key"), "xla_flags_to_exclude_from_cache_key")
    if isinstance(excluded, list) and flag not in excluded:
        excluded.append(flag)


def backends_started(jax: Any) -> bool:
    """Whether XLA's backends have started (and read ``XLA_FLAGS``): ``xla_bridge._backends``."""
    try:
        from jax._src import xla_bridge

        return bool(getattr(xla_bridge, "_backends", None))
    except Exception:
        return False


def keep_backends() -> None:
    """In a forked child (``os.register_at_fork``): JAX's backends are never destroyed. Their thread
    pools' threads were not forked, and destroying one waits on them for ever: a child that exits
    normally after a warm run hangs in ``~PjRtClient`` (stock JAX's own cache too, JAX 0.10 and
    0.12; JAX warns that fork is unsafe). One reference each that nothing owns; the child's memory
    is its parent's anyway."""
    xla_bridge = sys.modules.get("jax._src.xla_bridge")
    backends = getattr(xla_bridge, "_backends", None)
    if not isinstance(backends, dict) or not backends:
        return
    import ctypes

    for backend in list(backends.values()):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(backend))


def took_xla_flag(value: str) -> bool | None:
    """Whether XLA's flags, as its backend read them, hold a string option of ``value`` (its
    compile options' debug options, serialised: the Python binding exposes few fields); None where
    that cannot be read."""
    try:
        from jax._src.lib import xla_client  # type: ignore[attr-defined]

        serialized = xla_client.CompileOptions().SerializeAsString()
    except Exception:
        return None
    return bytes([len(value)]) + value.encode() in serialized


PARTS_CHANGED = "jax._src.cache_key._log_cache_key_hash(hash_obj, last_serialized, hashfn) is missing or has changed"


def probe() -> dict[str, str | None]:
    """What this JAX's seams give, each feature and why it is missing (None where it works), read
    without patching anything; ``--version`` asks it in a child process where no process here has
    recorded it. Settings can still take a feature away (``max_size`` of JAX's own, a bucket)."""
    import jax
    from jax._src import cache_key, compilation_cache, compiler

    store = _store_problem(compilation_cache)
    explain = (PARTS_CHANGED if _parts_logger(cache_key) is None
               else WRITE_CHANGED if _write_seam(compiler) is None else None)
    needs = "they need the store" if store else None
    return {"store": store, "cap": needs, "explain": needs or explain,
            "ISA key": None if callable(_attr(cache_key, "custom_hook")) else f"{HOOK} is missing", "levels": needs,
            "host callbacks": needs or _callbacks_problem(jax, compiler, compilation_cache)}


# -- the store: JAX's cache object and its loading (jax._src.compilation_cache) -----------------------


FILE_CACHE_CHANGED = "jax._src.compilation_cache.get_file_cache(path) is missing or has changed"


def _store_problem(cc: Any) -> str | None:
    """Why this JAX's cache module is not the one the store was written for, or None."""
    get_file_cache = _attr(cc, "get_file_cache")
    if get_file_cache is None or parameters(get_file_cache) != ["path"]:
        return FILE_CACHE_CHANGED
    for name in ("decompress_executable", "compress_executable", "CacheInterface"):  # VerificationCache: 0.9.1+
        if _attr(cc, name) is None:
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
    original = _attr(cc, "get_file_cache")
    if original is None or parameters(original) != ["path"]:
        return FILE_CACHE_CHANGED, FILE_CACHE_CHANGED
    store_why = "the package has no directory of its own here" if make is None else _store_problem(cc)
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

    _patch(cc, "get_file_cache", get_file_cache)
    return store_why, None


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


def _lookup_seam(cc: Any) -> Any:
    """JAX's lookup, ``get_executable_and_time(cache_key, ...)``, where a wrapper of it is what the
    compiler calls; None if its first parameter is no longer ``cache_key``, or if the compiler no
    longer reaches it through the module (a wrapper it would never call)."""
    original = _attr(cc, "get_executable_and_time")
    try:
        from jax._src import compiler

        through_module = _attr(compiler, "compilation_cache") is cc and "get_executable_and_time" not in vars(compiler)
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
    original = _lookup_seam(cc)
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

    _patch(cc, "get_executable_and_time", get_executable_and_time)
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
    original = _lookup_seam(cc)
    if original is None:
        logger.debug("%s: JAX's own handling of entries it cannot load stays", LOOKUP_CHANGED)
        return False
    verification_error = _attr(cc, "CacheVerificationError") or ()

    def get_executable_and_time(cache_key: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return original(cache_key, *args, **kwargs)
        except Exception as exc:
            deliberate = isinstance(exc, verification_error) or getattr(jax.config, "jax_raise_persistent_cache_errors", False)
            if deliberate or not unloadable(cache_key, exc):
                raise
            return None, None

    _patch(cc, "get_executable_and_time", get_executable_and_time)
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


# -- the write: where JAX decides to write a compile (jax._src.compiler._cache_write) ---------------


def wrap_cache_write(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> str | None:
    """Make ``wrap(write)`` JAX's ``_cache_write(cache_key, compile_time_secs, module_name, backend,
    executable, ...)``; why not, or None."""
    try:
        from jax._src import compiler
    except Exception as exc:
        return f"jax._src.compiler cannot be imported ({exc})"
    write = _write_seam(compiler)
    if write is None:
        return WRITE_CHANGED
    _patch(compiler, "_cache_write", wrap(write))
    return None


def host_callbacks(rest: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``_cache_write``'s host callbacks, from its arguments after the first five (JAX 0.10 passes
    them sixth; later lines have none)."""
    return rest[0] if rest else kwargs.get("host_callbacks")


# -- host callbacks: cached where the executable names them by index (jax._src.compiler) -----------
#
# From jaxlib 0.8.1 an executable calls its host callbacks (jax.debug.print, pure_callback,
# io_callback, equinox's error checks) by their index in the list handed to it when it is loaded,
# and the key holds that index, not the Python function. JAX 0.11 writes such compiles and hands
# the process's own callbacks to what it loads (jax-ml/jax#38405); JAX 0.8.1 to 0.10.2 can load
# them the same way but refuse to write them. The package does what 0.11 does, there: the compile
# seam notes this thread's callbacks, the write seam lets JAX write without them, and the load
# gives them back. Earlier lines compile a callback's address into the executable (0.4.30 to 0.5)
# or cannot hand callbacks to a loaded executable (0.6 to 0.8.0): there such a compile stays
# uncached, and says why.

CALLBACKS_FROM = "0.8.1"  # the first line whose loaded executables take the process's callbacks
CALLING = "cpu", "cuda", "rocm"  # where a host callback is an indexed FFI call (TPU's go through send/recv)
_compiling = threading.local()  # ``callbacks``: the host callbacks of the compile this thread is in


class _Callbacks:
    """Whether the package writes and loads compiles with host callbacks here, or why not."""

    served = False
    why: str | None = "not set up"


def _jax_writes_callbacks(compiler: Any) -> bool:
    """Whether JAX writes and loads compiles with host callbacks itself (0.11+: its write seam no
    longer takes them)."""
    write = _write_seam(compiler)
    return write is not None and "host_callbacks" not in parameters(write)[5:]


def _loads_callbacks() -> bool:
    """Whether this jaxlib's ``Client.deserialize_executable`` takes Python callables as host callbacks
    (0.8.1+; before, only the capsules of callbacks compiled in by address)."""
    import re

    try:
        import jax._src.lib  # noqa: F401

        doc = str(_attr(_attr(_attr(_loaded("lib"), "xla_client"), "Client"), "deserialize_executable").__doc__ or "")
    except Exception:
        return False
    return re.search(r"host_callbacks: [\w.]*Sequence\[[\w.]*Callable\]", doc) is not None


def _callbacks_problem(jax: Any, compiler: Any, cc: Any) -> str | None:
    """Why compiles with host callbacks stay uncached on this line, or None (JAX 0.11+ caches them
    itself; 0.8.1 to 0.10.2 through the package)."""
    if _write_seam(compiler) is None:
        return WRITE_CHANGED
    if _jax_writes_callbacks(compiler):
        return None
    version = str(getattr(jax, "__version__", "?"))
    if not _loads_callbacks():
        if (version_tuple(version) or (0, 6, 0)) < (0, 6, 0):
            return (f"JAX {version} compiles each host callback's address into the executable, which no other "
                    f"process can call: cached from JAX {CALLBACKS_FROM}")
        jaxlib = _attr(_loaded("lib"), "version_str") or version
        return f"jaxlib {jaxlib} cannot give a loaded executable its host callbacks: cached from JAX {CALLBACKS_FROM}"
    if not callable(_attr(_loaded("cache_key"), "custom_hook")):  # the package's part of the key keeps JAX out
        return f"{HOOK} is missing: JAX without the package would share their keys, and load them without callbacks"
    compile_ = _attr(compiler, "compile_or_get_cached")
    if compile_ is None or parameters(compile_)[:5] != ["backend", "computation", "devices", "compile_options",
                                                        "host_callbacks"]:
        return "jax._src.compiler.compile_or_get_cached has changed"
    get = _attr(cc, "get_executable_and_time")
    if (get is None or parameters(get) != ["cache_key", "compile_options", "backend", "executable_devices"]
            or _attr(compiler, "compilation_cache") is not cc):
        return "jax._src.compilation_cache.get_executable_and_time has changed"
    return None


class _GivingCallbacks:
    """A backend whose ``deserialize_executable`` hands the loaded executable this compile's host
    callbacks; everything else is the backend's."""

    def __init__(self, backend: Any, callbacks: list[Any]) -> None:
        self._backend = backend
        self._callbacks = callbacks

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def deserialize_executable(self, *args: Any, **kwargs: Any) -> Any:
        return self._backend.deserialize_executable(*args, host_callbacks=self._callbacks, **kwargs)


def serve_host_callbacks(jax: Any, is_ours: Callable[[], bool]) -> str | None:
    """Write and load compiles with host callbacks in the package's directory (``is_ours()``) as
    JAX 0.11 does, where this line can (see above); why such compiles stay uncached, or None."""
    try:
        from jax._src import compilation_cache as cc
        from jax._src import compiler
    except Exception as exc:  # pragma: no cover - a JAX without the modules
        return f"jax._src.compiler cannot be imported ({exc})"
    why = _callbacks_problem(jax, compiler, cc)
    _Callbacks.served, _Callbacks.why = False, why
    if why is not None or _jax_writes_callbacks(compiler):
        return why
    compile_, get, write = compiler.compile_or_get_cached, cc.get_executable_and_time, compiler._cache_write

    def compile_or_get_cached(backend: Any, computation: Any, devices: Any, compile_options: Any,
                              host_callbacks: Any, *rest: Any, **kwargs: Any) -> Any:
        outer = getattr(_compiling, "callbacks", ()), getattr(_compiling, "marked", False)
        _compiling.callbacks, _compiling.marked = host_callbacks, False
        try:
            return compile_(backend, computation, devices, compile_options, host_callbacks, *rest, **kwargs)
        finally:
            _compiling.callbacks, _compiling.marked = outer

    def get_executable_and_time(cache_key: str, compile_options: Any, backend: Any, executable_devices: Any) -> Any:
        callbacks = getattr(_compiling, "callbacks", ())
        if callbacks and callbacks_kept(callbacks, backend) is None:
            backend = _GivingCallbacks(backend, list(callbacks))
        return get(cache_key, compile_options, backend, executable_devices)

    def _cache_write(cache_key: str, compile_time_secs: float, module_name: str, backend: Any, executable: Any,
                     *rest: Any, **kwargs: Any) -> None:
        callbacks = host_callbacks(rest, kwargs)
        try:
            written = (bool(callbacks) and callbacks_kept(callbacks, backend) is None and is_ours()
                       and getattr(_compiling, "marked", False))  # its key has the part of its own
        except Exception:
            written = False
        if written:  # JAX writes what it loads: the executable; the callbacks are the loading process's
            rest, kwargs = ((), {**kwargs, "host_callbacks": []}) if "host_callbacks" in kwargs else (([], *rest[1:]), kwargs)
        return write(cache_key, compile_time_secs, module_name, backend, executable, *rest, **kwargs)

    _patch(compiler, "compile_or_get_cached", compile_or_get_cached)
    _patch(cc, "get_executable_and_time", get_executable_and_time)
    _patch(compiler, "_cache_write", _cache_write)
    _Callbacks.served = True
    return None


XLA_CACHE_PATHS = ("xla_gpu_per_fusion_autotune_cache_dir", "xla_gpu_kernel_cache_file")


def guard_xla_caches(allowed: Callable[[str], bool]) -> str | None:
    """XLA's own caches (``<dir>/xla_gpu_...`` in a compile's debug options) cleared where ``allowed(<dir>)``
    says no, once JAX has routed its directory (``is_cache_used``), before key and compile (0.4.30+)."""
    compiler, cc = _loaded("compiler"), _loaded("compilation_cache")  # (import jax loaded them)
    original, set_up = _attr(compiler, "compile_or_get_cached"), _attr(cc, "is_cache_used")
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

    _patch(compiler, "compile_or_get_cached", compile_or_get_cached)
    return None


def handing_callbacks() -> bool:
    """Whether the compile this thread is in has host callbacks that the package hands back: its key
    gets a part of its own (``_key.package_part``, which calls this as it adds it), so that a process
    that would not hand them back (JAX alone, an older gkx-autocache, a seam changed) never loads its
    entry, which would call into nothing. Such a compile is written only where its key got it."""
    handing = _Callbacks.served and bool(getattr(_compiling, "callbacks", ()))
    if handing:
        _compiling.marked = True
    return handing


def callbacks_kept(callbacks: Any, backend: Any) -> str | None:
    """Why these host callbacks keep a compile on ``backend`` from being written, or None (none, or
    the package writes and loads them)."""
    if not callbacks:
        return None
    if not _Callbacks.served:
        return _Callbacks.why or "they are not served"
    import inspect

    platform = str(getattr(backend, "platform", "?"))
    if platform not in CALLING or not all(inspect.isfunction(c) for c in callbacks):
        return f"host callbacks on {platform} are not cached before JAX 0.11"
    return None


def callbacks_by(callbacks: Any) -> str:
    """The library that put these host callbacks in a function, by the module of the first function
    outside JAX that they call (``equinox``, ``__main__``), or ``jax`` (``jax.debug.print``)."""
    seen: set[int] = set()
    todo = list(callbacks or ())[:16]
    while todo and len(seen) < 200:
        func = todo.pop(0)
        if id(func) in seen:
            continue
        seen.add(id(func))
        try:  # a user's callable object may answer getattr with anything, or raise
            top = str(getattr(func, "__module__", "") or "").split(".")[0]
            if top and callable(func) and top not in ("jax", "jaxlib", "functools", "builtins"):
                return top  # jax_md, not jax: the package's name, not a prefix
            inner = [getattr(func, name, None) for name in ("func", "__wrapped__", "__func__")]
            inner += [_contents(cell) for cell in (getattr(func, "__closure__", None) or ())]
            if not hasattr(func, "__code__"):  # a callable object (JAX's _FlatCallback holds callback_func)
                fields = [*getattr(func, "__dict__", ()), *getattr(func, "__dataclass_fields__", ())]
                inner += [getattr(func, name, None) for name in fields[:8]]
        except Exception:
            continue
        todo.extend(value for value in inner if callable(value))
    return "jax"


def part_values(hashfn: Any) -> dict[str, Any]:
    """What one part of JAX's key hashed: the values its ``hashfn`` closes over (``cache_key.get``
    builds each as a lambda over the module, the options, the backend...), by their names there."""
    return dict(zip(hashfn.__code__.co_freevars, (c.cell_contents for c in hashfn.__closure__ or ()), strict=False))


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not yet filled
        return None


def process_id() -> int:
    """This process's rank in a multi-process run (0 alone, or before ``jax.distributed`` starts)."""
    found = _attr(_attr(_loaded("distributed"), "global_state"), "process_id")
    return found if isinstance(found, int) else 0


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
    write = _write_seam(compiler)
    put = _attr(cc, "put_executable_and_time")
    if (write is None or put is None or parameters(put) != ["cache_key", "module_name", "executable", "backend", "compile_time"]
            or _attr(_attr(distributed, "global_state"), "process_id") is None):
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

    _patch(compiler, "_cache_write", _cache_write)
    return None


# -- what explaining a miss reads of the key (jax._src.cache_key, loaded by then) --------------------


def jaxlib_version() -> str:
    return str(getattr(_loaded("cache_key"), "jaxlib_version_str", "?"))


def excluded_xla_flags() -> set[str]:
    """The XLA flags JAX leaves out of its key."""
    return set(getattr(_loaded("cache_key"), "xla_flags_to_exclude_from_cache_key", ()))


def excluded_env_overrides() -> set[str]:
    """The compile options' environment overrides JAX leaves out of its key."""
    return set(getattr(_loaded("cache_key"), "env_override_flags_to_exclude_from_cache_key", ()))


def cleared_debug_options() -> frozenset[str]:
    """The debug options JAX clears before hashing the compile options, read from its source."""
    import inspect
    import re

    source = inspect.getsource(_loaded("cache_key")._hash_serialized_compile_options)
    return frozenset(re.findall(r"debug_options\.(\w+)\s*=", source))


def hash_compile_options(hash_obj: Any, options: Any, strip_device_assignment: bool) -> None:
    """JAX's own hashing of the compile options (it serialises them, cleared, into ``hash_obj``)."""
    _loaded("cache_key")._hash_serialized_compile_options(hash_obj, options,
                                                          strip_device_assignment=strip_device_assignment)


def config_holders(jax: Any) -> dict[str, Any]:
    """``jax.config``'s value holders by option name (each ``.value`` the thread's own)."""
    return getattr(jax.config, "_value_holders", {})
