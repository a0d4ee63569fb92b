"""JAX at its persistent cache's interface, in the pytest process (STYLE's second ring): a stand-in
``jax`` whose ``jax._src.compilation_cache`` and ``jax._src.compiler`` hold the names the store's
seams take hold of (``get_file_cache(path)``, the codec, ``CacheInterface``,
``get_executable_and_time``, ``_cache_write``), and a ``jit`` that does with them what JAX's
``compile_or_get_cached`` does for one function: count the request, set up the cache object at the
first compile since the directory was set, look up and load (an entry that does not decompress or
deserialise is JAX's error, which the store's guard turns into a miss), or compile and write what
JAX's thresholds let through; JAX's monitoring events said as JAX says them.

It stands for none of JAX's key (no ``cache_key`` module: CPU keys carry no ISA and misses are not
explained), its XLA, or the shapes of its seams on a real line: what needs those runs real JAX in a
test venv. ``conftest.InProcess.process`` configures one with ``_configure`` and runs its exit hooks.
"""

from __future__ import annotations

import hashlib
import os
import time
import types
import zlib
from typing import Any

from gkx_autocache._record.recorder import HITS, JAX_SAVED, REQUESTS, RETRIEVAL

MAGIC = b"XLA-EXECUTABLE:"  # what the stand-in's backend deserialises; anything else it refuses, as XLA does


def key_of(name: str, variant: str = "") -> str:
    """A key as JAX names an entry: the lowered module's name, then a 64-digit hash."""
    return f"jit_{name}-{hashlib.sha256(f'{name}|{variant}'.encode()).hexdigest()}"


def executable(name: str, variant: str = "", size: int = 2000) -> bytes:
    """What XLA compiles ``name`` to: the same bytes on every machine, ``size`` of them."""
    blocks = (hashlib.sha256(f"{name}|{variant}|{i}".encode()).digest() for i in range(size // 32 + 1))
    return MAGIC + b"".join(blocks)[:size]


class Backend:
    platform = "cpu"

    def deserialize_executable(self, data: bytes) -> bytes:
        if not data.startswith(MAGIC):
            raise RuntimeError("INVALID_ARGUMENT: the executable does not deserialise")
        return data


class StockCache:
    """JAX's own cache object for a local directory (its ``LRUCache`` without a cap): ``<key>-cache``
    files, read and written as they are, through links, whoever wrote them."""

    def __init__(self, path: str) -> None:
        self.path = path

    def get(self, key: str) -> bytes | None:
        try:
            with open(os.path.join(self.path, f"{key}-cache"), "rb") as f:
                return f.read()
        except OSError:
            return None

    def put(self, key: str, value: bytes) -> None:
        os.makedirs(self.path, exist_ok=True)
        with open(os.path.join(self.path, f"{key}-cache"), "wb") as f:
            f.write(value)


class StandInJax:
    """One process's ``jax``: ``module`` goes in ``sys.modules["jax"]``, ``modules`` the private ones."""

    def __init__(self, version: str) -> None:
        self.config = config = types.SimpleNamespace(
            jax_enable_compilation_cache=True, jax_compilation_cache_dir=None,
            jax_persistent_cache_min_compile_time_secs=1.0, jax_persistent_cache_min_entry_size_bytes=0,
            jax_persistent_cache_enable_xla_caches="xla_gpu_per_fusion_autotune_cache_dir",
            jax_compilation_cache_max_size=-1)
        config.update = self._update
        self.cc: Any
        self.compiler: Any
        self.listeners: list[Any] = []
        self.duration_listeners: list[Any] = []
        monitoring: Any = types.ModuleType("jax.monitoring")
        monitoring.register_event_listener = self.listeners.append
        monitoring.register_event_duration_secs_listener = self.duration_listeners.append
        self.backend = Backend()
        cc: Any = types.ModuleType("jax._src.compilation_cache")
        self.cc = cc
        cc._cache = None
        cc._cache_initialized = False
        cc.CacheInterface = type("CacheInterface", (), {})
        cc.compress_executable = zlib.compress  # (JAX's codec without zstandard)
        cc.decompress_executable = zlib.decompress

        def get_file_cache(path: str) -> Any:  # JAX's own object: its files, read unchecked (no LRU, no cap)
            return None if "://" in path else (StockCache(path), path)  # (a bucket: JAX's etils, not stood in for)

        def get_executable_and_time(cache_key: str, compile_options: Any, backend: Any) -> tuple[Any, Any]:
            cache = self._cache()
            found = None if cache is None else cache.get(cache_key)
            if found is None:
                return None, None
            data = cc.decompress_executable(found)
            compile_ms = int.from_bytes(data[:4], "big")
            return backend.deserialize_executable(data[4:]), compile_ms / 1000

        def put_executable_and_time(cache_key: str, module_name: str, executable: Any, backend: Any,
                                    compile_time: int) -> None:
            cache = self._cache()
            if cache is None:
                return
            payload = cc.compress_executable(int(compile_time * 1000).to_bytes(4, "big") + executable)
            if len(payload) < config.jax_persistent_cache_min_entry_size_bytes:
                return
            cache.put(cache_key, payload)

        cc.get_file_cache = get_file_cache
        cc.get_executable_and_time = get_executable_and_time
        cc.put_executable_and_time = put_executable_and_time
        compiler: Any = types.ModuleType("jax._src.compiler")
        self.compiler = compiler
        compiler.compilation_cache = cc

        def _cache_write(cache_key: str, compile_time_secs: float, module_name: str, backend: Any, executable: Any,
                         host_callbacks: Any = ()) -> None:
            if compile_time_secs < config.jax_persistent_cache_min_compile_time_secs:
                return
            cc.put_executable_and_time(cache_key, module_name, executable, backend, int(compile_time_secs))

        compiler._cache_write = _cache_write
        src: Any = types.ModuleType("jax._src")
        src.compilation_cache = cc
        src.compiler = compiler
        jax: Any = types.ModuleType("jax")
        self.module = jax
        jax.__version__ = version
        jax.config = config
        jax.monitoring = monitoring
        jax._src = src
        jax.process_index = lambda: 0
        self.modules = {"jax": jax, "jax.monitoring": monitoring, "jax._src": src,
                        "jax._src.compilation_cache": cc, "jax._src.compiler": compiler}
        self.requests = self.hits = 0
        self.served: dict[str, bytes] = {}  # each key's executable, as this process ran it

    def _update(self, name: str, value: Any) -> None:
        setattr(self.config, name, value)
        if name == "jax_compilation_cache_dir":  # JAX sets its cache object up again at the next compile
            self.cc._cache, self.cc._cache_initialized = None, False

    def _cache(self) -> Any:
        """JAX's ``_get_cache``: its cache object, set up at the first compile since the directory was set."""
        cc = self.cc
        if not cc._cache_initialized:
            cc._cache_initialized = True
            path = self.config.jax_compilation_cache_dir
            found = cc.get_file_cache(path) if path else None
            cc._cache = None if found is None else found[0]
        return cc._cache

    def _event(self, name: str) -> None:
        for listen in list(self.listeners):
            listen(name)

    def _duration(self, name: str, secs: float, **kwargs: Any) -> None:
        for listen in list(self.duration_listeners):
            listen(name, secs, **kwargs)

    def key(self, name: str, variant: str = "") -> str:
        """The key of ``name`` in this process: XLA's own caches enter it (JAX puts their options in
        the compile options it hashes)."""
        caches = self.config.jax_persistent_cache_enable_xla_caches
        return key_of(name, variant if caches in (None, "", "none") else f"{variant}|xla_caches={caches}")

    def jit(self, name: str, variant: str = "", *, size: int = 2000, compile_secs: float = 1.5) -> bool:
        """One compile of the function ``name`` (``variant``: another shape, constant or flag: another
        key), as JAX's ``compile_or_get_cached``; whether it was a hit. The executable it runs is kept
        in ``served``: a hit's is the one a compile makes, or the test sees it."""
        key = self.key(name, variant)
        if not self.config.jax_enable_compilation_cache or not self.config.jax_compilation_cache_dir:
            self.served[key] = executable(name, variant, size)
            return False
        self.requests += 1
        self._event(REQUESTS)
        started = time.monotonic()
        try:
            loaded, compile_time = self.cc.get_executable_and_time(key, None, self.backend)
        except Exception as exc:  # JAX warns and compiles ("Error reading persistent compilation cache entry")
            import warnings

            warnings.warn(f"Error reading persistent compilation cache entry for '{key}': {exc}", stacklevel=2)
            loaded, compile_time = None, None
        if loaded is not None:
            self.hits += 1
            self.served[key] = loaded
            self._event(HITS)
            self._duration(JAX_SAVED, max(compile_time - (time.monotonic() - started), 0.0))
            self._duration(RETRIEVAL, time.monotonic() - started)
            return True
        made = executable(name, variant, size)
        self.served[key] = made
        self.compiler._cache_write(key, compile_secs, f"jit_{name}", self.backend, made)
        return False

    def result(self) -> str:
        """What the process's functions computed: a digest of every executable it ran, by key."""
        return hashlib.sha256(b"".join(k.encode() + v for k, v in sorted(self.served.items()))).hexdigest()[:16]
