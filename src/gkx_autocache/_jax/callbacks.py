"""Host callbacks (``pure_callback``, ``io_callback``, ``jax.debug.*``) cached where the executable
names them by index (``jax._src.compiler``), as JAX 0.11 does: written without them, loaded with
this process's (SPEC §7, amended 2026-12-04)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from gkx_autocache._jax.hooks import HOOK, WRITE_CHANGED, contents, write_seam
from gkx_autocache._jax.versions import attr, loaded, parameters, patch, version_tuple


def host_callbacks(rest: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``_cache_write``'s host callbacks, from its arguments after the first five (JAX 0.10 passes
    them sixth; later lines have none)."""
    return rest[0] if rest else kwargs.get("host_callbacks")

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
    write = write_seam(compiler)
    return write is not None and "host_callbacks" not in parameters(write)[5:]

def _loads_callbacks() -> bool:
    """Whether this jaxlib's ``Client.deserialize_executable`` takes Python callables as host callbacks
    (0.8.1+; before, only the capsules of callbacks compiled in by address)."""
    import re

    try:
        import jax._src.lib  # noqa: F401

        doc = str(attr(attr(attr(loaded("lib"), "xla_client"), "Client"), "deserialize_executable").__doc__ or "")
    except Exception:
        return False
    return re.search(r"host_callbacks: [\w.]*Sequence\[[\w.]*Callable\]", doc) is not None

def callbacks_problem(jax: Any, compiler: Any, cc: Any) -> str | None:
    """Why compiles with host callbacks stay uncached on this line, or None (JAX 0.11+ caches them
    itself; 0.8.1 to 0.10.2 through the package)."""
    if write_seam(compiler) is None:
        return WRITE_CHANGED
    if _jax_writes_callbacks(compiler):
        return None
    version = str(getattr(jax, "__version__", "?"))
    if not _loads_callbacks():
        if (version_tuple(version) or (0, 6, 0)) < (0, 6, 0):
            return (f"JAX {version} compiles each host callback's address into the executable, which no other "
                    f"process can call: cached from JAX {CALLBACKS_FROM}")
        jaxlib = attr(loaded("lib"), "version_str") or version
        return f"jaxlib {jaxlib} cannot give a loaded executable its host callbacks: cached from JAX {CALLBACKS_FROM}"
    if not callable(attr(loaded("cache_key"), "custom_hook")):  # the package's part of the key keeps JAX out
        return f"{HOOK} is missing: JAX without the package would share their keys, and load them without callbacks"
    compile_ = attr(compiler, "compile_or_get_cached")
    if compile_ is None or parameters(compile_)[:5] != ["backend", "computation", "devices", "compile_options",
                                                        "host_callbacks"]:
        return "jax._src.compiler.compile_or_get_cached has changed"
    get = attr(cc, "get_executable_and_time")
    if (get is None or parameters(get) != ["cache_key", "compile_options", "backend", "executable_devices"]
            or attr(compiler, "compilation_cache") is not cc):
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
    why = callbacks_problem(jax, compiler, cc)
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

    patch(compiler, "compile_or_get_cached", compile_or_get_cached)
    patch(cc, "get_executable_and_time", get_executable_and_time)
    patch(compiler, "_cache_write", _cache_write)
    _Callbacks.served = True
    return None

def handing_callbacks() -> bool:
    """Whether the compile this thread is in has host callbacks that the package hands back: its key
    gets a part of its own (``_key.Seam.package_part``, which calls this as it adds it), so that a process
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
            inner += [contents(cell) for cell in (getattr(func, "__closure__", None) or ())]
            if not hasattr(func, "__code__"):  # a callable object (JAX's _FlatCallback holds callback_func)
                fields = [*getattr(func, "__dict__", ()), *getattr(func, "__dataclass_fields__", ())]
                inner += [getattr(func, name, None) for name in fields[:8]]
        except Exception:
            continue
        todo.extend(value for value in inner if callable(value))
    return "jax"
