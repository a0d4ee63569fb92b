"""What an entry's record keeps of its compile (SPEC §18): the seam that sees each compile's module
and options (``compiler.compile_or_get_cached``, 0.4.30 to 0.12), and, at the compile's write, what
it takes to compile it again without the program. Compiling it again is ``rebuild``'s."""

from __future__ import annotations

import io
import threading
from typing import Any

from gkx_autocache._jax.versions import attr, loaded, parameters, patch

COMPILE_CHANGED = "jax._src.compiler.compile_or_get_cached has changed"
# Custom calls that name a Python object of the process that compiled them: no other process has it.
PYTHON_OBJECTS = ((b"python_cpu_callback", "host callbacks"), (b"python_gpu_callback", "host callbacks"),
                  (b"CustomSPMDPartitioning", "custom partitioning (a Python callback)"))
EFFORTS = ("exec_time_optimization_effort", "memory_fitting_effort")

_compiling = threading.local()  # ``now``: the arguments of the compile this thread is in


def watch_compiles() -> str | None:
    """Keep each compile's module and options on its thread while JAX looks it up and compiles it,
    for its record at the write (``recipe``): references only, nothing computed, so a hit costs a
    thread-local assignment. Why not, or None."""
    compiler = loaded("compiler")
    original = attr(compiler, "compile_or_get_cached")
    if original is None or parameters(original)[:5] != ["backend", "computation", "devices", "compile_options",
                                                        "host_callbacks"]:
        return COMPILE_CHANGED

    def compile_or_get_cached(backend: Any, computation: Any, devices: Any, compile_options: Any,
                              host_callbacks: Any, *rest: Any, **kwargs: Any) -> Any:
        outer = getattr(_compiling, "now", None)
        _compiling.now = (backend, computation, devices, compile_options, host_callbacks)
        try:
            return original(backend, computation, devices, compile_options, host_callbacks, *rest, **kwargs)
        finally:
            _compiling.now = outer

    patch(compiler, "compile_or_get_cached", compile_or_get_cached)
    return None


def recipe() -> tuple[dict[str, Any], bytes] | str:
    """What it takes to compile this thread's compile again: the fields its compile options are built
    from, its devices and platform, and its module as JAX lowered it (MLIR bytecode, with its
    locations: JAX's key strips them, and a rebuilt executable keeps the same metadata as a cold
    compile's); or why it cannot be recorded. Called at the compile's write only (a miss)."""
    now = getattr(_compiling, "now", None)
    if now is None:
        return "its compile was not seen (the seam on compile_or_get_cached is missing)"
    backend, module, devices, options, callbacks = now
    if callbacks:
        return "host callbacks"
    build = options.executable_build_options
    if getattr(build, "fdo_profile", None):
        return "a feedback-directed optimization profile (PGLE)"
    if getattr(build, "use_auto_spmd_partitioning", False):
        return "auto SPMD partitioning"
    out = io.BytesIO()
    module.operation.write_bytecode(file=out)
    data = out.getvalue()
    for marker, why in PYTHON_OBJECTS:
        if marker in data:
            return why
    flat = list(devices.flat)
    fields: dict[str, Any] = {
        "platform": str(backend.platform), "devices": [int(d.id) for d in flat], "shape": list(devices.shape),
        "kinds": sorted({str(d.device_kind) for d in flat}), "replicas": int(options.num_replicas),
        "partitions": int(options.num_partitions), "tupled": bool(options.parameter_is_tupled_arguments),
        "overrides": [[str(name), value] for name, value in options.env_option_overrides
                      if isinstance(value, (str, bool, int, float))],
        "spmd": bool(build.use_spmd_partitioning),
        "to_parameters": [bool(x) for x in build.allow_spmd_sharding_propagation_to_parameters],
        "to_output": [bool(x) for x in build.allow_spmd_sharding_propagation_to_output],
        "name": module_name(module),
    }
    if hasattr(build, "use_shardy_partitioner"):
        fields["shardy"] = bool(build.use_shardy_partitioner)
    fields["efforts"] = {name: float(getattr(build, name)) for name in EFFORTS if hasattr(build, name)}
    return fields, data


def module_name(module: Any) -> str:
    import importlib

    ir = importlib.import_module("jax._src.lib.mlir").ir
    return str(ir.StringAttr(module.operation.attributes["sym_name"]).value)
