"""What a missed key was made of (SPEC §13.1), as far as a person can act on it: each part's own
hash and readable value, the module's input signature, where its code is, and the ``jax.config``
values. Measured on a miss (or a write) only; how: docs/how-it-works.md, "Why it missed"."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
import struct
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

from gkx_autocache._diagnostics import logger
from gkx_autocache._explain import inputs
from gkx_autocache._jax import hooks as jax_hooks
from gkx_autocache._jax import versions as jax_versions
from gkx_autocache._key import PARTS

PART_DIGITS = 16  # a part's hash, shortened: enough to tell parts apart, small to keep
NO_HOOK = hashlib.sha256(b"").hexdigest()[:PART_DIGITS]  # the hook part of a key made without one (stock JAX)
UNKNOWN_PLACE = "?"
HELPER_PLACE = "jax"  # JAX's own helpers: a name JAX jits, with no frame of that function in the module
# jax.config values that cannot change what is compiled: the cache's own settings, logs and printing.
CONFIG_IGNORED = ("jax_compilation_cache", "jax_persistent_cache", "jax_enable_compilation_cache",
                  "jax_raise_persistent_cache_errors", "jax_explain_cache_misses", "jax_log_compiles",
                  "jax_logging_level", "jax_debug_log_modules", "jax_pprint_use_color", "jax_traceback",
                  "jax_include_full_tracebacks_in_locations", "jax_tracer_error_num_traceback_frames",
                  "jax_compiler_detailed_logging_min_ops", "jax_check_proxy_envs")



class Facts(NamedTuple):
    """What a key was made of, as far as a person can act on it (measured on a miss only)."""

    parts: dict[str, str]  # part -> its own hash (PART_DIGITS digits)
    readable: dict[str, str]  # part -> what its hash stands for
    signature: str  # the module's inputs: "f32[8,8], i32[]"
    place: str  # "model/core.py:step"; HELPER_PLACE; UNKNOWN_PLACE
    config: dict[str, str]  # jax.config values (less CONFIG_IGNORED)
    # What a run with nothing changed compiles alike: the inputs, the contents of the files its code
    # is in, the command line and the environment (a digest); "misses on every run" compares it.
    rerun: str = ""


def measure(parts: list[tuple[str, Any]], computation: str, hook: str | None, name: str,
            package: str | None = None) -> Facts:
    """Each part's own hash (the computation's was taken on the way: it is not hashed twice), the
    readable values, the input signature, the place and the config. ``hook``: what the hook part
    hashed (None where the user's hook replaced the package's, whose string the seam chained
    ``package`` to)."""
    hashes = {PARTS[0]: computation}
    readable: dict[str, str] = {}
    signature, place, files = "?", UNKNOWN_PLACE, ()
    for part, hashfn in parts:
        cells = jax_hooks.part_values(hashfn)
        if part == PARTS[0]:
            module = cells.get("module")
            if module is not None:
                signature, interface = _guarded(interface_of, module, ("?", {}))
                place, files = _guarded(place_and_files, (module, name), (UNKNOWN_PLACE, ()))
                # The computation's readable value: its scalar constants (a t_final, a step size), and
                # what its main takes and gives (its outputs, donation, shardings).
                constants = {**(_guarded(computation_of, module, None) or {}), **interface}
                if constants:
                    readable[PARTS[0]] = json.dumps(constants, separators=(",", ":"))
            continue
        keyed, value = ((hook, hook) if part == "custom_hook" else
                        _guarded(xla_flags, (), (None, None)) if part == "XLA flags" else (None, None))
        fresh = hashlib.sha256()
        raw = _serialized_options(cells) if part == "compile_options" else None
        if raw is not None and raw in _OPTIONS_HASH:
            hashes[part] = _OPTIONS_HASH[raw]
        else:
            if part in ("XLA flags", "custom_hook") and keyed is not None:
                fresh.update(keyed.encode())  # JAX's flags part logs each flag at DEBUG: not called twice
            else:
                hashfn(fresh)
                if part == "custom_hook":  # a user's hook replaced the package's: the seam adds the ISA
                    fresh.update((package or "").encode())
            hashes[part] = fresh.hexdigest()[:PART_DIGITS]
            if raw is not None:
                if len(_OPTIONS_HASH) >= 256:
                    _OPTIONS_HASH.clear()
                _OPTIONS_HASH[raw] = hashes[part]
        if part == "compile_options":  # some 300 fields, the same for nearly every compile of a process
            value = _readable_once(part, hashes[part], cells)
        elif part not in ("XLA flags", "custom_hook"):  # (the devices' text names device ids, which
            value = _guarded(_readable, (part, cells), None)  # the accelerator part's hash may not)
        if value is not None:
            readable[part] = value
    for part in PARTS:
        hashes.setdefault(part, "-")
    return Facts(hashes, readable, signature, place, _guarded(config_map, (), {}), _guarded(rerun_of, (signature, files), ""))


def _guarded(func: Any, args: Any, default: Any) -> Any:
    try:
        return func(*args) if isinstance(args, tuple) else func(args)
    except Exception as exc:
        logger.debug("%s: %s", getattr(func, "__name__", func), exc)
        return default


_READABLE: dict[tuple[str, str], str | None] = {}
_OPTIONS_HASH: dict[tuple[str, bytes], str] = {}  # the compile options as serialised -> their part's hash


def _serialized_options(cells: dict[str, Any]) -> tuple[str, bytes] | None:
    """The compile options of a key, serialised as they are (a fifth of the cost of JAX's own hashing
    of them, which copies them and clears fields first): the same bytes give the same part hash."""
    try:
        return getattr(cells.get("backend"), "platform", ""), cells["compile_options"].SerializeAsString()
    except Exception:
        return None


def _readable_once(part: str, hash_: str, cells: dict[str, Any]) -> str | None:
    """A part's readable value, made once per process for each of its hashes: for the compile options
    (some 300 fields, 0.4 ms), whose readable fields are all in what their hash covers."""
    if (part, hash_) not in _READABLE:
        if len(_READABLE) >= 256:
            _READABLE.clear()
        _READABLE[(part, hash_)] = _guarded(_readable, (part, cells), None)
    return _READABLE[(part, hash_)]


def _readable(part: str, cells: dict[str, Any]) -> str | None:
    if part == "jax_lib version":
        return jax_versions.jaxlib_version()
    if part == "backend version" and "backend" in cells:
        return f"{cells['backend'].platform} {cells['backend'].platform_version}"
    if part == "compile_options" and "compile_options" in cells:
        backend = cells.get("backend")
        return json.dumps(compile_options(cells["compile_options"], getattr(backend, "platform", "") == "gpu"),
                          sort_keys=True, separators=(",", ":"))
    if part == "accelerator_config" and "devices" in cells:
        return devices_text(cells["devices"])
    if part == "compression" and "compression_algorithm" in cells:
        return str(cells["compression_algorithm"])
    return None


LIBTPU_MARK = "LIBTPU_INIT_ARGS: "  # where the readable XLA flags say LIBTPU_INIT_ARGS's apart


def xla_flags() -> tuple[str, str]:
    """The XLA flags JAX puts in its key, as JAX gathers them (``XLA_FLAGS``, ``LIBTPU_INIT_ARGS``,
    ``--xla…`` arguments), less the ones it leaves out; and as a person reads them, those of
    ``LIBTPU_INIT_ARGS`` apart (``--xla_a=1 LIBTPU_INIT_ARGS: --xla_tpu_b=2``): a TPU flag is
    named by the variable that set it."""
    excluded = jax_hooks.excluded_xla_flags()

    def kept(flags: list[str]) -> list[str]:
        return [f for f in sorted(flags) if f.split("=")[0] not in excluded]

    libtpu = os.environ.get("LIBTPU_INIT_ARGS", "").split()
    others = [*os.environ.get("XLA_FLAGS", "").split(), *(a for a in sys.argv if a.startswith("--xla"))]
    said, tpu = " ".join(kept(others)), " ".join(kept(libtpu))
    return " ".join(kept(others + libtpu)), f"{said} {LIBTPU_MARK}{tpu}".lstrip() if tpu else said


# The platforms whose devices are chips of a slice: their topology is said with them.
TOPOLOGY_PLATFORMS = ("tpu",)


def devices_text(devices: Any) -> str:
    """The process's devices, kind and count (``2 x cpu``), a TPU slice's topology (``TPU topology
    4 chips 2x2x1 (v6e-4)``), and which of them the computation runs on (``on device 1``) where
    that is not all of them from the first."""
    import jax

    every = jax.devices()
    kinds: dict[str, int] = {}
    for device in every:
        kinds[device.device_kind] = kinds.get(device.device_kind, 0) + 1
    text = ", ".join(f"{n} x {kind}" for kind, n in kinds.items())
    if jax.process_count() > 1:
        text += f" in {jax.process_count()} processes"
    if every[0].platform in TOPOLOGY_PLATFORMS:
        text += f"; TPU topology {topology(every)}"
    ids = [getattr(d, "id", "?") for d in devices.flat]
    if ids != list(range(len(ids))):
        text += f"; the computation on device {', '.join(map(str, ids[:16]))}"
    return text


def topology(devices: list[Any]) -> str:
    """A slice's chips, their bounds (from each chip's coordinates, else ``TPU_TOPOLOGY``) and its
    accelerator type as the host says it: ``4 chips 2x2x1 (v6e-4)``; ``1 chip (v5litepod-4)``, one
    chip of a four-chip host (TPU_ACCELERATOR_TYPE names the host's slice, not what is visible)."""
    coords = [tuple(getattr(d, "coords", ())) for d in devices]
    slices = len({getattr(d, "slice_index", 0) for d in devices})
    # A chip's cores (v2, v3) share its coordinates; so do the chips of two slices (multislice).
    placed = bool(coords) and all(coords)
    chips = len({(getattr(d, "slice_index", 0), c) for d, c in zip(devices, coords, strict=True)}) if placed else len(devices)
    bounds = "x".join(str(max(c[i] for c in coords) + 1) for i in range(len(coords[0]))) if placed else ""
    bounds = bounds or os.environ.get("TPU_TOPOLOGY", "")
    kind = os.environ.get("TPU_ACCELERATOR_TYPE", "")
    return (f"{chips} chip{'s' if chips != 1 else ''}" + (f" {bounds}" if bounds and chips > 1 else "")
            + (f" in {slices} slices" if slices > 1 else "") + (f" ({kind})" if kind else ""))


_cleared: list[frozenset[str]] = []


def _cleared_by_jax() -> frozenset[str]:
    """The debug options JAX clears before hashing the compile options (read from its source, once):
    their values never change a key, so they are never named as a change."""
    if not _cleared:
        try:
            _cleared.append(jax_hooks.cleared_debug_options())
        except Exception:
            _cleared.append(frozenset())
    return _cleared[0]


def compile_options(options: Any, strip_device_assignment: bool) -> dict[str, str]:
    """Every field the compile-options binding exposes (its build options and debug options
    included), ``env_option_overrides``, after JAX's own clearing; and ``#<n>`` digests of the
    serialised fields, for changes no exposed field shows (``field <n> changed``)."""
    cleared = _cleared_by_jax()
    excluded = jax_hooks.excluded_env_overrides()
    fields: dict[str, str] = {}

    def walk(obj: Any, prefix: str) -> None:
        for attr in dir(obj):
            if attr.startswith("_") or attr in ("ParseFromString", "SerializeAsString") or attr in cleared:
                continue
            try:
                value = getattr(obj, attr)
            except Exception:
                continue
            if attr in ("executable_build_options", "debug_options"):
                walk(value, f"{prefix}{attr}.")
            elif not callable(value):
                if attr == "env_option_overrides":
                    value = [v for v in value if v[0] not in excluded]
                if attr == "device_assignment" and strip_device_assignment:
                    continue
                fields[prefix + attr] = bounded(repr(value))

    walk(options, "")
    fields.update(_wire_digests(options, strip_device_assignment))
    return fields


def _wire_digests(options: Any, strip: bool) -> dict[str, str]:
    """The serialised compile options (as JAX hashes them), field by field: ``#3`` for a top-level
    field, ``#3.14`` for a field of a message in it."""
    capture = _Capture()
    jax_hooks.hash_compile_options(capture, options, strip)
    found: dict[str, str] = {}
    for number, values in _by_number(_wire_fields(capture.data) or []).items():
        inner = _wire_fields(values[0]) if len(values) == 1 and isinstance(values[0], bytes) else None
        if not inner:
            found[f"#{number}"] = _digest(values)
            continue
        for sub, sub_values in _by_number(inner).items():
            found[f"#{number}.{sub}"] = _digest(sub_values)
            if f"#{number}.{sub}" == DEBUG_OPTIONS and len(sub_values) == 1 and isinstance(sub_values[0], bytes):
                # The debug options (some 250 fields) in one digest, less those JAX sets from the module
                # (its size: xla_detailed_logging), kept apart: those follow the computation.
                debug = _by_number(_wire_fields(sub_values[0]) or [])
                apart = {n: debug.pop(n) for n in DEBUG_FOLLOWS if n in debug}
                found[DEBUG_OPTIONS] = _digest(sorted(debug.items()))
                found.update({f"{DEBUG_OPTIONS}.{n}": _digest(v) for n, v in apart.items()})
    return found


DEBUG_OPTIONS = "#3.3"  # executable_build_options.debug_options, on the wire
DEBUG_FOLLOWS = (252,)  # its xla_detailed_logging, which JAX sets for a module of 10 operations or more


def _by_number(fields: list[tuple[int, bytes | int]]) -> dict[int, list[bytes | int]]:
    """Wire fields by number, a repeated field's values together (one value per input: each counts)."""
    found: dict[int, list[bytes | int]] = {}
    for number, value in fields:
        found.setdefault(number, []).append(value)
    return found


def _digest(values: Any) -> str:
    return hashlib.sha256(repr(values).encode()).hexdigest()[:8]


FIELD_KEPT = 200  # a compile-options field's value longer than this is kept in short, with a digest


def bounded(text: str) -> str:
    """A compile-options field's value: whole where short; else in short (``[True x338]``, a list
    by its runs) with a digest of the whole, so that two values are equal only where they are: a
    value per input, 338 of them, is not 410 beyond any cut."""
    if len(text) <= FIELD_KEPT:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    short = runs(text)
    if short != text and len(short) <= FIELD_KEPT:
        return f"{short} #{digest}"
    head = text[:FIELD_KEPT].rsplit(", ", 1)[0] if ", " in text[:FIELD_KEPT] else text[:FIELD_KEPT]
    return f"{head}, ... ({len(text)} characters) #{digest}"


def runs(text: str) -> str:
    """A list as written by its runs (``[True x338]``); anything else as it is."""
    if not (text.startswith("[") and text.endswith("]") and ", " in text):
        return text
    found: list[list[Any]] = []
    for item in text[1:-1].split(", "):
        if found and found[-1][0] == item:
            found[-1][1] += 1
        else:
            found.append([item, 1])
    return "[" + ", ".join(f"{v} x{n}" if n > 1 else v for v, n in found) + "]"


class _Capture:
    data = b""

    def update(self, data: bytes) -> None:
        self.data = data


def _wire_fields(data: bytes) -> list[tuple[int, bytes | int]] | None:
    """Protocol buffer fields ``(number, value)``, or None where ``data`` is not one message."""
    found: list[tuple[int, bytes | int]] = []
    at = 0

    def varint() -> int:
        nonlocal at
        shift = result = 0
        while True:
            if at >= len(data) or shift > 63:
                raise ValueError("truncated")
            byte = data[at]
            at += 1
            result |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return result

    try:
        while at < len(data):
            tag = varint()
            number, kind = tag >> 3, tag & 7
            if number == 0:
                return None
            if kind == 0:
                found.append((number, varint()))
            elif kind in (1, 5):
                size = 8 if kind == 1 else 4
                found.append((number, data[at:at + size]))
                at += size
            elif kind == 2:
                size = varint()
                if at + size > len(data):
                    return None
                found.append((number, data[at:at + size]))
                at += size
            else:
                return None
    except ValueError:
        return None
    return found


def interface_of(module: Any) -> tuple[str, dict[str, Any]]:
    """The module's inputs, as JAX prints avals (``f32[8,8], i32[]``), kept (``_explain.inputs``);
    and what else its ``main`` says of what it takes and gives, for the computation's readable
    value: its outputs, kept (``out``); the order of a long list of inputs (``order``); the inputs
    it marks donated (``donated``: ``0-5``) and each input's sharding (``sharded``: ``[["P('data')",
    "6-7"]]``), where it marks any."""
    main = next((op for op in module.body.operations if str(op.attributes["sym_name"]).strip('"') == "main"), None)
    if main is None:
        return "?", {}
    found = inputs.types_of(str(main.attributes["function_type"]))
    if found is None:
        return "?", {}
    avals, results = found
    said: dict[str, Any] = {"out": inputs.kept(results)}
    order = inputs.order_of(avals)
    if order is not None:
        said["order"] = order
    attributes = main.attributes
    if "arg_attrs" in attributes:
        # (guarded apart: a binding that cannot read them costs the marks, not the signature)
        said.update(_guarded(_marked, attributes["arg_attrs"], {}))
    return inputs.kept(avals), said


MARKS = ("jax.buffer_donor", "tf.aliasing_output", "sdy.sharding", "mhlo.sharding")
MAX_SHARDINGS = 32  # distinct input shardings kept by name (beyond: a digest of them all)


def _marked(arg_attrs: Any) -> dict[str, Any]:
    """The inputs ``main`` marks donated (``jax.buffer_donor``, or aliased to an output), and each
    input's sharding, from its argument attributes (read one by one only where some input has one)."""
    text = str(arg_attrs)
    if not any(mark in text for mark in MARKS):
        return {}
    from jaxlib.mlir import ir

    donated: list[int] = []
    shardings: dict[str, list[int]] = {}
    for i, attrs in enumerate(ir.ArrayAttr(arg_attrs)):
        attrs = ir.DictAttr(attrs)
        if "jax.buffer_donor" in attrs or "tf.aliasing_output" in attrs:
            donated.append(i)
        for mark in ("sdy.sharding", "mhlo.sharding"):
            if mark in attrs:
                shardings.setdefault(sharding_text(str(attrs[mark])), []).append(i)
    said: dict[str, Any] = {}
    if donated:
        said["donated"] = inputs.ranges(donated)
    if len(shardings) > MAX_SHARDINGS:
        said["sharded"] = "#" + hashlib.sha256(repr(sorted(shardings.items())).encode()).hexdigest()[:12]
    elif shardings:
        said["sharded"] = [[text, inputs.ranges(at)] for text, at in shardings.items()]
    return said


_SDY = re.compile(r'#sdy\.sharding<@[\w.$-]+, \[((?:\{(?:"[^"{}]*"(?:, )?)*\}(?:, )?)*)\]>')


def sharding_text(attr: str) -> str:
    """An input's sharding as a person wrote it where it is a plain one: Shardy's ``#sdy.sharding<@mesh,
    [{"data"}, {}]>`` as ``P('data')`` (``P(None)``: the dimensions left whole); GSPMD's, and any
    other, as the module writes it (at most 120 characters, and a digest of the rest)."""
    match = _SDY.fullmatch(attr)
    if match is None:
        text = attr.strip('"')
        return text if len(text) <= 120 else f"{text[:100]}... #{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    dims = []
    for axes in re.findall(r"\{([^{}]*)\}", match[1]):
        names = re.findall(r'"([^"]*)"', axes)
        dims.append("None" if not names else repr(names[0]) if len(names) == 1 else repr(tuple(names)))
    while len(dims) > 1 and dims[-1] == "None":
        dims.pop()
    return f"P({', '.join(dims)})"


_SCALAR = re.compile(r"dense<([^<>\[\],]+)> : tensor<(\w+)>$")
MAX_CONSTANTS, MAX_OPS = 48, 200_000
PLAIN_DTYPES = ("f32", "i32", "i1")  # a constant of another dtype is named with it: 0.5:f64
SMALL_CONSTANT = 64  # elements of a constant array printed into the digest (a larger one: a splat, or not kept)


def computation_of(module: Any) -> dict[str, Any] | None:
    """The computation's readable value: each scalar constant with the number of its uses (a
    ``t_final``, a learning rate used once a parameter), and a digest of the rest of it (its
    operations in order, its other constants), so that a constant is named as the change only
    where it is the only one: ``{"constants": [["0.001", 112], ...], "ops": ..., "whole": ...}``;
    ``whole`` false where the module has more than ``MAX_OPS`` operations, more than ``MAX_CONSTANTS``
    distinct constants, or a large constant array."""
    names: list[str] = []
    constants: dict[Any, int] = {}  # MLIR uniques attributes: equal values are one key, printed once

    def visit(op: Any) -> bool:
        name = op.name
        names.append(name)
        if name == "stablehlo.constant":
            value = op.attributes["value"]
            constants[value] = constants.get(value, 0) + 1
        return len(names) < MAX_OPS

    _walk(module, visit)
    whole = len(names) < MAX_OPS
    rest = hashlib.sha256("\n".join(names).encode())
    scalars: dict[str, int] = {}
    for value, uses in constants.items():
        text = _printed(value)
        match = _SCALAR.match(text or "")
        if match is not None:
            number = _number(match[1], match[2] == "f32") + ("" if match[2] in PLAIN_DTYPES else f":{match[2]}")
            scalars[number] = scalars.get(number, 0) + uses
        elif text is not None:
            rest.update(f"\n{text} x{uses}".encode())
        else:
            whole = False
    if len(scalars) > MAX_CONSTANTS:
        whole = False
    return {"constants": [[k, n] for k, n in list(scalars.items())[:MAX_CONSTANTS]],
            "ops": rest.hexdigest()[:PART_DIGITS], "whole": whole}


def _printed(value: Any) -> str | None:
    """A constant as MLIR prints it, where that is short: a scalar, a splat or a small array."""
    try:
        dims = str(value.type).removeprefix("tensor<").split("x")[:-1]
        size = 1
        for dim in dims:
            size *= int(dim)
        if size > SMALL_CONSTANT:
            from jaxlib.mlir import ir

            if not ir.DenseElementsAttr(value).is_splat:
                return None
    except Exception:
        return None
    return str(value)


def _walk(module: Any, visit: Any) -> None:
    """Each operation of ``module``, nested ones included, to ``visit`` until it returns False: by
    MLIR's own walk where this jaxlib has one (a Python loop over blocks costs four times as much:
    17 against 4.6 ms for a train step of 6800 operations)."""
    try:
        from jaxlib.mlir import ir

        advance, stop = ir.WalkResult.ADVANCE, ir.WalkResult.INTERRUPT
        walk = module.operation.walk
    except (ImportError, AttributeError):
        for op in _operations(module, MAX_OPS):
            if not visit(getattr(op, "operation", op)):
                return
        return
    walk(lambda op: advance if visit(op) else stop)


def _number(text: str, single: bool = False) -> str:
    """``2.000000e+00`` as ``2.0``; a float32 (``single``) by the fewest digits that read back as it
    (``9.99999977E-3`` as ``0.01``); anything else as it is (a hex float, ``true``)."""
    try:
        value = float(text)
    except ValueError:
        return text.strip()[:24]
    if value.is_integer() and "e" not in text and "." not in text:
        return repr(int(value))
    if single and math.isfinite(value) and abs(value) < 3e38:
        packed = struct.pack("<f", value)
        for digits in range(1, 10):
            if struct.pack("<f", float(f"{value:.{digits}g}")) == packed:
                return repr(float(f"{value:.{digits}g}"))
    return repr(value)


_FRAME = re.compile(r'"([^"]+)"\("([^"]+)":(\d+)')


def place_of(module: Any, name: str) -> str:
    """Where the function's code is: the module path (relative to the ``sys.path`` entry that holds
    it) and the function's name, from the MLIR locations of the code in its body (``model/core.py:
    step``); ``jax`` for JAX's own helpers (locations, but no frame of a function of that name);
    ``?`` where it cannot be known (no locations; ``<stdin>``, a notebook cell)."""
    return place_and_files(module, name)[0]


def place_and_files(module: Any, name: str) -> tuple[str, tuple[str, ...]]:
    """``place_of``, and the files of the code that made the computation (the frames of its
    locations: the function's own file, the caller's, a test's), as the locations name them."""
    wanted = name.removeprefix("jit_").removeprefix("pmap_").rstrip("_") or "_"  # 0.4.x-0.6: `jit__lambda_`
    files: set[str] = set()
    chains: list[list[tuple[str, str]]] = []
    for op in _operations(module, 2000):
        frames = [(_unescaped(fn), _unescaped(file), line) for fn, file, line in _FRAME.findall(str(op.location))]
        match = [(fn, file) for fn, file, _line in frames if _sanitized(fn) == wanted]
        if match:  # the outermost: the jitted function itself
            return _where(match[-1][1], match[-1][0]), tuple(sorted({file for _fn, file, _line in frames}))
        files.update(file for _fn, file, _line in frames)
        if frames:
            chains.append([(fn, file) for fn, file, _line in frames])
    # A name JAX gave a wrapper of the user's function (``jax.pmap(h)`` compiles as ``jit__fun``):
    # the body runs code of a function beyond the call site that every op shares (the caller's
    # frames). JAX's own helpers run none: their ops carry only the call site.
    if chains:
        shared = set.intersection(*(set(chain) for chain in chains))
        inner = [(fn, file) for chain in chains for fn, file in chain if (fn, file) not in shared]
        if inner:
            fn, file = inner[-1]  # the outermost frame of the body's own code
            return _where(file, fn), tuple(sorted(files))
    return HELPER_PLACE if files else UNKNOWN_PLACE, tuple(sorted(files))


# Variables that differ between two runs of the same program from the same shell (the run's own
# name, pytest's worker and test, the shell's bookkeeping): not a change of what it compiles.
VOLATILE_ENV = ("GKX_JAX_CACHE_RUN", "PYTEST_", "OLDPWD", "_", "SHLVL", "TERM_SESSION_ID", "WINDOWID",
                "SSH_", "XDG_SESSION", "INVOCATION_ID", "JOURNAL_STREAM", "SECURITYSESSIONID", "COLUMNS",
                "LINES", "KITTY_", "VSCODE_", "JPY_", "TMUX_PANE", "STY", "WEZTERM_", "ITERM_")
MAX_FILE = 4 << 20  # the most of a source file read for its digest
_files_read: dict[tuple[str, int, int], str] = {}  # (path, mtime, size) -> the digest of its contents
_process: list[str] = []  # the command line and the environment, as a digest (once a process)


def rerun_of(signature: str, files: tuple[str, ...]) -> str:
    """What a run that changed nothing compiles alike: a digest of the inputs, the contents of the
    files the computation's code is in (an edit between two runs changes one), the command line
    and the environment (which, with the files, set ``jax.config``). Two runs' misses of one
    function with one digest each missed with nothing changed between them: a value that differs
    on every run is closed over."""
    digest = hashlib.sha256()
    if not _process:
        _process.append(_program())
    digest.update(f"{_process[0]}\n{signature}".encode("utf-8", "surrogatepass"))
    for file in files[:64]:
        digest.update(f"\n{file}\n{_contents(file)}".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:PART_DIGITS]


MAX_MODULES = 5000  # the most module files stat-ed for a process's digest (once, at its first miss)


def _program() -> str:
    """A digest of what this process runs, once at its first miss: the command line, the
    environment (less ``VOLATILE_ENV``), and each imported module's file by its size and time.
    The locations of a deep call keep its last 10 frames only (``jax_traceback_in_locations_limit``):
    a test file that set a tolerance may not be among them, and its edit is seen here."""
    env = sorted((k, v) for k, v in os.environ.items() if not k.startswith(VOLATILE_ENV))
    files = []
    # The standard library and JAX itself do not change under a version directory (a JAX upgrade
    # is another directory): 600 of a model's 700 modules, not stat-ed. Nor this package's: its
    # threads import some of its modules about now (rebuild ahead, at this very miss), a race.
    skip = tuple(os.path.dirname(getattr(sys.modules.get(name), "__file__", None) or "/nonexistent/x") + os.sep
                 for name in ("os", "jax", "jaxlib", "gkx_autocache"))
    for module in list(sys.modules.values())[:MAX_MODULES]:
        # (from the module's own dict: a module's __getattr__, a lazy loader's, may import on access)
        path = getattr(module, "__dict__", {}).get("__file__")
        if isinstance(path, str) and not path.startswith(skip):
            try:
                st = os.stat(path)
            except (OSError, ValueError):
                continue
            files.append((path, st.st_size, st.st_mtime_ns))
    return hashlib.sha256(repr((sys.argv, env, sorted(files))).encode("utf-8", "surrogatepass")).hexdigest()


def _contents(file: str) -> str:
    """A digest of a source file's contents (read once a process while unchanged); "" where it
    cannot be read (``<frozen ...>``, a notebook cell, a file gone)."""
    try:
        st = os.stat(file)
    except (OSError, ValueError):
        return ""
    known = (file, st.st_mtime_ns, st.st_size)
    if known not in _files_read:
        if len(_files_read) >= 1024:
            _files_read.clear()
        try:  # never blocks: a FIFO named like a source file is not read (nor waited on)
            fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except OSError:
            return ""
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return ""
            _files_read[known] = hashlib.sha256(os.read(fd, MAX_FILE)).hexdigest()
        except OSError:
            return ""
        finally:
            os.close(fd)
    return _files_read[known]


_ESCAPE = re.compile(r"\\([0-9A-Fa-f]{2}|\\)")


def _unescaped(text: str) -> str:
    r"""A string as MLIR prints it in a location, unescaped: it writes each byte of a non-ASCII or
    unprintable character as ``\XX`` (``jos\C3\A9`` for ``josé``), a backslash as ``\\``."""
    if "\\" not in text:
        return text
    data = bytearray()
    at = 0
    for match in _ESCAPE.finditer(text):
        data += text[at:match.start()].encode("utf-8", "surrogatepass")
        data += b"\\" if match[1] == "\\" else bytes([int(match[1], 16)])
        at = match.end()
    data += text[at:].encode("utf-8", "surrogatepass")
    return data.decode("utf-8", "replace")


def _operations(module: Any, limit: int) -> Iterator[Any]:
    """The module's operations, nested regions included (a ``shard_map`` body is inside its op),
    at most ``limit``."""
    stack = list(module.body.operations)[::-1]
    seen = 0
    while stack and seen < limit:
        parent = stack.pop()
        for region in parent.regions:
            for block in region.blocks:
                for op in block.operations:
                    seen += 1
                    if seen > limit:
                        return
                    yield op
                    if len(op.regions):
                        stack.append(op)


def _sanitized(function: str) -> str:
    """A Python function's name as JAX puts it in a module's name (``<lambda>`` -> ``_lambda``):
    JAX's ``mlir.sanitize_name`` keeps word characters of any script (``σ``), ``.`` and ``-``."""
    return re.sub(r"[^\w.-]", "_", function.rsplit(".", 1)[-1]).rstrip("_") or "_"


def _where(file: str, function: str) -> str:
    if not file.endswith(".py") or "ipykernel_" in file or file.startswith("<"):
        return UNKNOWN_PLACE  # a notebook cell, <stdin>, <string>: no module to tell functions apart by
    best = ""
    for entry in sys.path:
        root = os.path.abspath(entry or ".").rstrip("/") + "/"
        if file.startswith(root) and len(root) > len(best):
            best = root
    return f"{file[len(best):] if best else file}:{function}"


def config_map() -> dict[str, str]:
    """Every ``jax.config`` value (the thread's own where a context manager set one), but those that
    cannot change what is compiled."""
    import jax

    holders = jax_hooks.config_holders(jax)
    if not _CONFIG_KEPT or _CONFIG_KEPT[0] is not holders or _CONFIG_KEPT[1] != len(holders):
        _CONFIG_KEPT[:] = [holders, len(holders), [(o, h) for o, h in holders.items() if not o.startswith(CONFIG_IGNORED)]]
    found = {}
    for option, holder in _CONFIG_KEPT[2]:
        try:
            found[option] = repr(holder.value)[:120]
        except Exception:
            continue
    return found


_CONFIG_KEPT: list[Any] = []  # jax.config's holders, their count, and those config_map reads (once a process)
