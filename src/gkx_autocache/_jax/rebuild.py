"""Compiling a record again (SPEC §18) with this JAX's own functions: the module parsed, the
compile options built by this JAX's ``get_compile_options`` from what was recorded (never an old
options object: jaxlib's default debug options differ between releases), the key by this JAX's key
function, the compile, and the entry's bytes as JAX's own write makes them."""

from __future__ import annotations

import threading
from typing import Any

from gkx_autocache._jax.recipes import EFFORTS
from gkx_autocache._jax.versions import attr, parameters

CONTEXT_BYTES = 16 << 20  # the modules parsed into a thread's MLIR context before it is made again


class Rebuilder:
    """This JAX's own functions for compiling a record again, found once (``problem``: why not)."""

    def __init__(self) -> None:
        self.problem: str | None = None
        try:
            import importlib

            import numpy as np
            from jax._src import compilation_cache as cc
            from jax._src import compiler, xla_bridge
            from jax._src.interpreters import mlir

            xc = importlib.import_module("jax._src.lib").xla_client
            ir = importlib.import_module("jax._src.lib.mlir").ir
        except Exception as exc:  # pragma: no cover - a JAX without the modules
            self.problem = f"jax._src cannot be imported ({exc})"
            return
        self._np, self._cc, self._compiler, self._bridge, self._mlir, self._xc, self._ir = (
            np, cc, compiler, xla_bridge, mlir, xc, ir)
        options = attr(compiler, "get_compile_options")
        self._option_names = set(parameters(options))
        if not {"num_replicas", "num_partitions", "device_assignment"} <= self._option_names:
            self.problem = "jax._src.compiler.get_compile_options has changed"
        key = attr(compiler, "_get_cache_key")  # what JAX's compile calls (0.6+): its rules for ignoring callbacks
        self._key = key if parameters(key)[:4] == ["options", "backend", "computation", "devices"] else None
        if self._key is None and parameters(attr(cc, "get_cache_key"))[:4] != ["module", "devices", "compile_options", "backend"]:
            self.problem = "jax._src.compilation_cache.get_cache_key has changed"
        for name in ("combine_executable_and_time", "compress_executable", "_get_cache"):
            if attr(cc, name) is None:
                self.problem = f"jax._src.compilation_cache.{name} is missing"
        self._lock = threading.Lock()
        self._contexts = threading.local()

    def backend(self, platform: str) -> Any:
        """This process's client for ``platform``; raises LookupError where it has none."""
        try:
            backend = self._bridge.get_backend(platform)
        except Exception as exc:
            raise LookupError(f"no {platform} here ({' '.join(str(exc).split())[:120]})") from None
        with self._lock:  # JAX sets up its cache object at its first use (the store), once
            used = attr(self._cc, "is_cache_used")  # (0.4.31+)
            if (used is not None and not used(backend)) or self._cc._get_cache(backend) is None:
                raise LookupError("JAX's persistent cache is not in use in this process")
        return backend

    def devices(self, backend: Any, ids: list[int], shape: list[int]) -> Any:
        """The recorded devices of ``backend``, as JAX's compile was given them; raises LookupError
        where one is not here."""
        here = {int(d.id): d for d in backend.devices()}
        missing = [i for i in ids if i not in here]
        if missing:
            return_ids = ", ".join(map(str, missing[:4]))
            raise LookupError(f"{backend.platform} device{'s' if len(missing) > 1 else ''} {return_ids} "
                              f"{'are' if len(missing) > 1 else 'is'} not here ({len(here)} here)")
        array = self._np.empty(len(ids), dtype=object)
        for i, device_id in enumerate(ids):
            array[i] = here[device_id]
        return array.reshape(shape)

    def parse(self, data: bytes) -> Any:
        """The module, in this thread's context: made once a thread, never used by another thread
        (XLA's compile loads dialects into it without the GIL). Making one registers every dialect
        under the GIL (5 ms on this EPYC, 50 ms on the TPU v5e's host): one a module held every
        other thread of the process for the rebuild's keying (4.4 s of 84 modules there, the
        program's tracing and the compiles' writes waiting on it). A context keeps what is parsed
        into it (a module's constants) until it is freed: made again after ``CONTEXT_BYTES`` of
        modules (the keying parses every record: 24 MB of modules kept 18 MB in one context)."""
        held = self._contexts
        context = getattr(held, "context", None)
        if context is None or held.parsed > CONTEXT_BYTES:
            context = held.context = self._mlir.make_ir_context()
            held.parsed = 0
        held.parsed += len(data)
        with context:
            return self._ir.Module.parse(data)

    def options(self, fields: dict[str, Any], backend: Any, devices: Any, module: Any) -> Any:
        """The compile options, built by this JAX's ``get_compile_options`` as its compile builds them,
        from what the record holds; then what JAX sets after it (the tupled arguments, the sharding
        propagation lists) and the program's own flags (SPMD, Shardy, the efforts)."""
        replicas, partitions = int(fields["replicas"]), int(fields["partitions"])
        if replicas * partitions != devices.size:
            raise ValueError(f"{devices.size} devices for {replicas} replicas x {partitions} partitions")
        given: dict[str, Any] = {"num_replicas": replicas, "num_partitions": partitions,
                                 "device_assignment": devices.reshape((replicas, partitions)),
                                 "env_options_overrides": dict(fields["overrides"]), "backend": backend,
                                 "use_spmd_partitioning": bool(fields["spmd"]), "fdo_profile": None}
        if "shardy" in fields:
            given["use_shardy_partitioner"] = bool(fields["shardy"])
        logging = attr(self._compiler, "use_detailed_logging")
        if logging is not None:
            given["detailed_logging"] = logging(module)
        options = self._compiler.get_compile_options(**{k: v for k, v in given.items() if k in self._option_names})
        build = options.executable_build_options
        options.parameter_is_tupled_arguments = bool(fields["tupled"])
        build.use_spmd_partitioning = bool(fields["spmd"])
        if "shardy" in fields and hasattr(build, "use_shardy_partitioner"):
            build.use_shardy_partitioner = bool(fields["shardy"])
        build.allow_spmd_sharding_propagation_to_parameters = list(fields["to_parameters"])
        build.allow_spmd_sharding_propagation_to_output = list(fields["to_output"])
        for name, value in (fields.get("efforts") or {}).items():
            if name in EFFORTS and hasattr(build, name):
                setattr(build, name, float(value))
        return options

    def key(self, module: Any, devices: Any, options: Any, backend: Any) -> str:
        """The key this JAX computes for the compile (its own key function; the package's hook in it)."""
        if self._key is not None:
            key = self._key(options, backend, module, devices)
            if key is None:
                raise LookupError("JAX computes no key for it (its cache is not in use)")
            return str(key)
        return str(self._cc.get_cache_key(module, devices, options, backend))

    def compile(self, backend: Any, data: bytes, devices: Any, options: Any) -> Any:
        """The executable of a module's bytes, as JAX's own compile makes it (no host callbacks:
        records have none). The client is given the bytes, as JAX's compile gave it through 0.7: XLA
        parses them into a context of its own, where it loads dialects without the GIL, so no
        compiling thread makes a Python MLIR context (50 ms of the GIL each on the TPU v5e's host)
        or shares one (a data race)."""
        if hasattr(backend, "compile_and_load"):  # (after jaxlib 0.6.0, ``compile`` makes an unloaded one)
            return backend.compile_and_load(data, executable_devices=self._xc.DeviceList(tuple(devices.flat)),
                                            compile_options=options)
        return backend.compile(data, compile_options=options)

    def entry(self, executable: Any, backend: Any, compile_secs: float) -> bytes:
        """The entry's bytes, as JAX's ``put_executable_and_time`` makes them: the serialised
        executable behind its compile time in whole seconds, compressed with JAX's codec."""
        serialize = getattr(executable, "serialize", None)
        data = serialize() if callable(serialize) else backend.serialize_executable(executable)
        return bytes(self._cc.compress_executable(self._cc.combine_executable_and_time(data, int(compile_secs))))

    def thresholds(self) -> tuple[float, int]:
        """JAX's write thresholds in this process: the least compile time and entry size it writes."""
        config = self._compiler.config
        return (float(config.persistent_cache_min_compile_time_secs.value),
                int(config.persistent_cache_min_entry_size_bytes.value))
