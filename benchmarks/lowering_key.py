"""A prototype of a key made before lowering (issue 62), for measuring only: what it costs to
fingerprint a closed jaxpr by content (every equation's primitive, parameters, avals, context and
name stack; constants by their bytes; sub-jaxprs recursively) with lowering's other arguments and
every effective ``jax.config`` value, and which programs it cannot cover.
``benchmarks/lowering.py --prototype`` computes it inside ``_cached_lowering_to_hlo``, before JAX
lowers, and charges its time to its own part ("fingerprint"); nothing is looked up or skipped.

Not the package's key: a type it does not know makes it give up (``Uncovered`` with the cause),
where a shipped key would have to be shown to cover each type lowering reads.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from typing import Any

import numpy as np


class Uncovered(Exception):
    """The jaxpr holds something the prototype cannot fingerprint; the message is the cause."""


# Parameters lowering never reads: the differentiation rules of custom_jvp / custom_vjp (their
# primal, call_jaxpr, is what is lowered; a rule matters only where it was traced into the jaxpr).
IGNORED = {
    "custom_jvp_call": {"jvp_jaxpr_fun", "jvp_jaxpr_thunk"},
    "custom_vjp_call": {"fwd_jaxpr_thunk", "bwd", "out_trees"},
    "custom_vjp_call_jaxpr": {"fwd_jaxpr_thunk", "bwd", "out_trees"},
}
# Primitives whose lowering runs code the jaxpr does not show: host callbacks, custom
# partitioning, kernels with compilers of their own.
UNCOVERED_PRIMITIVES = {
    "pure_callback": "host callback", "io_callback": "host callback", "debug_callback": "host callback",
    "custom_partitioning": "custom partitioning", "pallas_call": "Pallas kernel",
    "tpu_custom_call": "Mosaic kernel", "mosaic_gpu_call": "Mosaic kernel",
}


class Fingerprint:
    def __init__(self) -> None:
        self.out: list[str] = []
        self.jaxprs: dict[int, int] = {}  # id(jaxpr) -> its number, within one fingerprint

    def add(self, x: Any) -> None:
        out = self.out
        t = type(x)
        if x is None or t is bool or t is int or t is str:
            out.append(f"{t.__name__[0]}{x!r}")
        elif t is float:
            out.append(f"f{x.hex()}")
        elif t is tuple or t is list:
            out.append(f"({len(x)}")
            for item in x:
                self.add(item)
            out.append(")")
        elif t is dict:
            out.append(f"{{{len(x)}")
            for k in sorted(x, key=repr):
                self.add(k)
                self.add(x[k])
            out.append("}")
        elif isinstance(x, enum.Enum):
            out.append(f"e{t.__module__}.{t.__qualname__}.{x.name}")
        elif isinstance(x, np.dtype):
            out.append(f"d{x.str}")
        elif isinstance(x, np.ndarray | np.generic):
            self.array(np.asarray(x))
        elif isinstance(x, tuple) and hasattr(x, "_fields"):  # a NamedTuple (dimension numbers...)
            out.append(f"n{t.__module__}.{t.__qualname__}")
            self.add(tuple(x))
        else:
            self.other(x, t)

    def array(self, a: np.ndarray) -> None:
        self.out.append(f"a{a.dtype.str}{a.shape}{hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()}")

    def other(self, x: Any, t: type) -> None:
        name = t.__name__
        if name in ("ClosedJaxpr",):
            self.closed(x)
        elif name == "Jaxpr":
            self.jaxpr(x)
        elif name in ("ShapedArray", "AbstractToken", "AbstractRef", "DShapedArray"):
            self.out.append(f"v{x.str_short(True, True)}|{getattr(x, 'weak_type', '')}|{getattr(x, 'sharding', '')!r}"
                            f"|{getattr(x, 'memory_space', '')!r}|{getattr(x, 'vma', '')!r}")
        elif name == "ArrayImpl":
            self.array(np.asarray(x))
        elif name in ("NamedSharding", "PartitionSpec", "Mesh", "AbstractMesh", "SingleDeviceSharding",
                      "GSPMDSharding", "PositionalSharding", "Layout", "Format", "MemorySpace",
                      "UnspecifiedValue", "AutoLayout", "Precision", "DotAlgorithmPreset", "CanonicalPrecision",
                      "NameStack", "GatherScatterMode", "RoundingMethod", "ShardingTypeError",
                      "PaddingType", "AxisType", "ConvDimensionNumbers", "RaggedDotDimensionNumbers",
                      "ScatterDimensionNumbers", "GatherDimensionNumbers", "DType", "ExtendedDType",
                      "PRNGImpl", "KeyTyRules", "AvalQDD", "_ScalarMeta", "type"):
            self.out.append(f"r{name}:{x!r}")
        elif name in ("TypedInt", "TypedFloat", "TypedComplex", "TypedNdArray"):  # a literal with its dtype
            self.out.append(f"t{name}:{x.dtype.str}:{float.hex(x) if isinstance(x, float) else repr(x)}")
        elif name == "Client":  # the backend: what lowering reads of it
            self.out.append(f"B{x.platform}|{x.platform_version}")
        elif name == "SemanticallyEqualShardings":
            self.add(tuple(x.shardings))
            self.add(tuple(x.avals))
        elif name.endswith("Device"):
            self.out.append(f"r{name}:{x!r}")
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):  # LoweringParameters...
            self.out.append(f"k{t.__module__}.{t.__qualname__}")
            for field in dataclasses.fields(x):
                self.add(getattr(x, field.name))
        elif name.endswith("Effect") or name == "Effects":
            self.out.append(f"x{name}:{x!r}")
        elif name in ("frozenset", "set"):
            self.out.append(f"s{sorted(repr(i) for i in x)!r}")
        elif callable(x):
            raise Uncovered(f"a Python callable in a parameter ({getattr(x, '__qualname__', name)})")
        else:
            raise Uncovered(f"an unknown parameter type ({t.__module__}.{t.__qualname__})")

    def closed(self, closed: Any) -> None:
        self.jaxpr(closed.jaxpr)
        self.out.append(f"c{len(closed.consts)}")
        for c in closed.consts:
            self.add(c)

    def jaxpr(self, jaxpr: Any) -> None:
        seen = self.jaxprs.get(id(jaxpr))
        if seen is not None:
            self.out.append(f"j#{seen}")
            return
        self.jaxprs[id(jaxpr)] = len(self.jaxprs)
        names: dict[int, int] = {}
        out = self.out

        def var(v: Any) -> None:
            if type(v).__name__ == "Literal":
                out.append("l")
                self.add(v.val)
                self.add(v.aval)
            else:
                n = names.get(id(v))
                if n is None:
                    n = names[id(v)] = len(names)
                    self.add(v.aval)
                out.append(f"%{n}")

        out.append(f"J{len(jaxpr.constvars)},{len(jaxpr.invars)}")
        for v in (*jaxpr.constvars, *jaxpr.invars):
            var(v)
        for eqn in jaxpr.eqns:
            prim = eqn.primitive.name
            cause = UNCOVERED_PRIMITIVES.get(prim)
            if cause is not None:
                raise Uncovered(cause)
            out.append(f"E{prim}")
            ignored = IGNORED.get(prim, ())
            for k in sorted(eqn.params):
                if k in ignored:
                    continue
                out.append(k)
                self.add(eqn.params[k])
            for v in eqn.invars:
                var(v)
            out.append("=")
            for v in eqn.outvars:
                var(v)
            ctx = eqn.ctx
            out.append(f"C{ctx.compute_type}|{ctx.threefry_partitionable}|{ctx.cur_abstract_mesh!r}"
                       f"|{getattr(ctx, 'remove_size_one_mesh_axis', '')}|{ctx.xla_metadata!r}")
            out.append(f"N{eqn.source_info.name_stack}")
            if eqn.effects:
                out.append(f"x{sorted(repr(e) for e in eqn.effects)}")
        out.append("O")
        for v in jaxpr.outvars:
            var(v)
        if jaxpr.effects:
            out.append(f"x{sorted(repr(e) for e in jaxpr.effects)}")
        info = jaxpr.debug_info
        out.append(f"D{getattr(info, 'arg_names', None)!r}{getattr(info, 'result_paths', None)!r}")


def configuration() -> tuple[tuple[str, Any], ...]:
    """Every ``jax.config`` value as it is in effect on this thread (context managers included), and
    JAX's version: lowering reads the configuration (``mlir.lower_fun`` traces rules again under it)."""
    import jax
    from jax._src import config

    holders = config.config._value_holders
    return (("jax", jax.__version__), *((name, holders[name].value) for name in sorted(holders)))


def fingerprint(closed_jaxpr: Any, *rest: Any) -> str:
    """sha256 of the closed jaxpr (a ClosedJaxpr on JAX 0.10, a Jaxpr with its consts on 0.12), the
    rest of lowering's arguments, and the configuration."""
    f = Fingerprint()
    f.add(closed_jaxpr)
    for r in rest:
        f.add(r)
    f.add(configuration())
    return hashlib.sha256("\x00".join(f.out).encode()).hexdigest()
