"""Why it missed (SPEC §13, §13.1): every miss gets one cause that is true, or says what the evidence
cannot tell apart; every compile JAX does not write gets its reason.

JAX's key is one sha256 over eight parts (``_key``). On every key the seam hands each part to
``_explain_seam.Watch.on_part``, which keeps the part functions and takes two digests (the
computation's own hash after the first part, hashed once, and the final one that pairs the parts
with the key the store is then asked for), and a copy of the hash before the hook part (the key
stock JAX makes). A hit costs that and nothing else: this module is imported at the first miss or
write. On a miss, and only then, ``measure`` hashes the seven cheap parts alone and reads what a
person can read of each (the XLA flags, the compile options field by field, the process's devices,
the versions, the ISA), the module's input signature, where its code is (the MLIR locations), and
the ``jax.config`` values.

The evidence is the whole directory (``_index``): at the first miss the index and one listing are
read; every entry of the function's name counts, recorded or not. The cause comes from the closest
entry, the one with the fewest differing parts (the most recent among equals), in this order:
``evicted`` (this very key was there, and who removed it), ``new``, then ``changed``:

- an entry with this computation: ``changed <part>`` (the first of ``PRIORITY`` that differs), with
  before and after;
- entries of the name from elsewhere (another module path, or JAX's own helper against the user's
  function): ``new (another jit_step, in model/core.py)``; where the place is not known (a notebook
  cell, ``<stdin>``), ``cannot tell`` a changed function from another of that name;
- entries of the same place: ``changed computation``, with the ``jax.config`` values that differ,
  else the input signature before and after, else "same input shapes: its code, a static argument, a
  closed-over constant or a weak type changed" (none of them is in the signature);
  a further shape of a function whose entries this very run wrote is ``new`` (``new shape``);
- entries without a record: never ``new``; ``cannot tell`` what changed.

The second seam, ``jax._src.compiler._cache_write`` (wrapped in ``_explain_seam``), is where JAX
decides not to write an entry (not process 0, host callbacks in 0.10, below
``min_compile_time_secs``); a write that reaches it but not the store was below
``min_entry_size_bytes``. Both seams are guarded: where they changed, explanations are
"unavailable" (``status`` says why) and nothing else changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

from gkx_autocache import _isa, _key
from gkx_autocache._diagnostics import logger, plural
from gkx_autocache._explain import index as _index
from gkx_autocache._explain.index import Evidence, Record
from gkx_autocache._key import PARTS
from gkx_autocache._layout import ENTRY_SUFFIX, VERSION_PREFIX, function_name

LABELS = {"computation": "computation", "jax_lib version": "jaxlib", "backend version": "backend",
          "XLA flags": "XLA_FLAGS", "compile_options": "compile options", "accelerator_config": "devices",
          "compression": "compression", "custom_hook": "custom hook"}
# When the computation matches and several other parts differ, the cause named is the first here:
# an XLA flag also changes the compile options it sets, a jaxlib upgrade the backend version.
PRIORITY = ("jax_lib version", "backend version", "XLA flags", "compression", "custom_hook", "accelerator_config",
            "compile_options")
HEX = 16  # a part's hash, shortened: enough to tell parts apart, small to keep
NO_HOOK = hashlib.sha256(b"").hexdigest()[:HEX]  # the hook part of a key made without one (stock JAX)
# What changes a computation without changing its input shapes and dtypes: none is in the signature.
SAME_SHAPES = ("its code, a static argument, a closed-over constant, or a weak type (a Python scalar passed for an "
               "array) changed")
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

    parts: dict[str, str]  # part -> its own hash (HEX digits)
    readable: dict[str, str]  # part -> what its hash stands for
    signature: str  # the module's inputs: "f32[8,8], i32[]"
    place: str  # "model/core.py:step"; HELPER_PLACE; UNKNOWN_PLACE
    config: dict[str, str]  # jax.config values (less CONFIG_IGNORED)


class Explainer:
    """Names the cause of each miss in this process (the recorder asks), and gives each written
    entry its index lines (for the ledger, so that later processes can compare)."""

    def __init__(self, version_dir: str, run: str, run_start: float, load: Any = None, thread: Any = None) -> None:
        self.version_dir = version_dir
        self.run = run
        self.run_start = run_start
        self._read = load or (lambda: _index.load(version_dir))
        # The key being computed on each thread, its parts as the seam saw them (_explain_seam.Watch).
        self._thread = thread if thread is not None else threading.local()
        self._evidence: Evidence | None = None  # the directory as seen at this process's first miss
        self._lock = threading.Lock()
        self._written: set[str] = set()  # table lines this process gave the ledger already
        # A table line is given only where the index lacked it: the index read at the first miss or
        # write holds it, and is still the file there (a compaction or `clear` may have dropped it).
        self._own: set[str] = set()  # table lines this process added to its evidence, the index lacking them
        self._read_as: tuple[int, int, int, str] | None = None  # the index's identity when read (_index.identity)
        self._trusted = True  # the index read is still the file there

    # -- the recorder's questions -------------------------------------------------------------------

    def cause(self, key: str) -> dict[str, Any]:
        """``{"cause": ..., "detail": ...}`` for a miss of ``key``; never raises."""
        try:
            facts = self._facts(key)
            if facts is None:
                return {"cause": "unexplained", "detail": "its key was not computed on this thread"}
            before = self._before_cpu_keying(key)
            with self._lock:
                evidence = self._load()
                if before is not None and not _known(key, evidence):
                    return before  # not when this very key was written since, and removed
                found = classify(key, facts, evidence, self.run, self.run_start)
            if facts.place == HELPER_PLACE:
                found["helper"] = True  # grouped after the user's functions
            return found
        except Exception as exc:  # an explanation must never cost a compile
            logger.debug("miss of %s not explained: %s", key, exc)
            return {"cause": "unexplained", "detail": f"{type(exc).__name__}: {exc}"[:200]}

    def _before_cpu_keying(self, key: str) -> dict[str, Any] | None:
        """The migration (SPEC §15): the entry stock JAX, or the package before it keyed CPU entries
        by ISA, wrote for exactly this compile is here, under the key without the ISA."""
        pending = self._thread
        before_hook, text = getattr(pending, "before_hook", None), getattr(pending, "hook", None)
        if before_hook is None or text is None or _key.isa_of(text) is None:
            return None
        legacy = before_hook.copy()
        legacy.update(text[:text.rfind(_key.ISA_MARK)].encode())
        name = f"{function_name(key)}-{legacy.hexdigest()}"
        if not os.path.lexists(os.path.join(self.version_dir, name + ENTRY_SUFFIX)):
            return None
        return {"cause": "before CPU keying",
                "detail": "its entry was written by stock JAX or before gkx-autocache keyed CPU entries by the "
                          "CPU's instruction set: compiled once more under the new key"}

    def ingredients(self, key: str) -> dict[str, Any]:
        """What a written entry's ledger record carries: its index lines (a table line only where the
        index lacks it, and once a ledger); and the entry joins this process's evidence at once."""
        try:
            facts = self._facts(key)
            if facts is None:
                return {}
            name, hex_ = _index.split_key(key)
            lines = _index.lines_for(name, hex_, time.time(), self.run, facts.parts, facts.readable,
                                     facts.signature, facts.place, facts.config)
            with self._lock:
                evidence = self._load()
                indexed = self._still_read()
                tables = [ln for ln in lines if not ln.startswith("E\t")]
                self._own.update(ln for ln in tables if not evidence.holds(ln))
                fresh = [ln for ln in lines if ln.startswith("E\t")
                         or (ln not in self._written and (ln in self._own or not indexed))]
                self._written.update(ln for ln in fresh if not ln.startswith("E\t"))
                evidence.add(lines)
                evidence.wrote(name, hex_)
            return {"rec": "\n".join(fresh), **({"helper": True} if facts.place == HELPER_PLACE else {})}
        except Exception as exc:
            logger.debug("ingredients of %s not kept: %s", key, exc)
            return {}

    def forget_given(self) -> None:
        """This process begins another ledger (or, forked, its own): give the tables again."""
        with self._lock:
            self._written = set()

    def _facts(self, key: str) -> Facts | None:
        pending = self._thread
        final = getattr(pending, "final", None)
        if final is None or not key.endswith(final):
            return None
        if pending.facts is None:
            if not pending.parts:
                return None
            pending.facts = measure(pending.parts, pending.computation.hex()[:HEX], getattr(pending, "hook", None),
                                    function_name(key))
            pending.parts = None  # what the put needs is measured: the functions can go
        facts: Facts = pending.facts
        return facts

    def _still_read(self) -> bool:
        """Whether the index this process read is still the file there, only appended to since (one
        ``stat``, at a write); once not, this process gives every table line again, once a ledger."""
        if self._trusted and self._read_as is not None:
            now = _index.identity(self.version_dir)
            self._trusted = (now is not None and now[:2] == self._read_as[:2] and now[2] >= self._read_as[2]
                             and now[3] == self._read_as[3])
            if self._trusted and now is not None:
                self._read_as = now
        return self._trusted

    def _load(self) -> Evidence:
        if self._evidence is None:
            started = time.perf_counter()
            self._read_as = _index.identity(self.version_dir)  # before reading: a file replaced meanwhile is not trusted
            self._evidence = self._read()
            logger.debug("index of %s read in %.1f ms", self.version_dir, (time.perf_counter() - started) * 1e3)
        return self._evidence


def _known(key: str, evidence: Evidence) -> bool:
    """Whether the directory has a record of this very key, or of its removal."""
    name, hex_ = _index.split_key(key)
    return (name, hex_) in evidence.removed or any(r.hex == hex_ for r in evidence.records(name))


# -- measuring a key's parts (on a miss) ------------------------------------------------------------


def _cells(hashfn: Any) -> dict[str, Any]:
    return dict(zip(hashfn.__code__.co_freevars, (c.cell_contents for c in hashfn.__closure__ or ()), strict=False))


def measure(parts: list[tuple[str, Any]], computation: str, hook: str | None, name: str) -> Facts:
    """Each part's own hash (the computation's was taken on the way: it is not hashed twice), the
    readable values, the input signature, the place and the config."""
    hashes = {PARTS[0]: computation}
    readable: dict[str, str] = {}
    signature, place = "?", UNKNOWN_PLACE
    for part, hashfn in parts:
        cells = _cells(hashfn)
        if part == PARTS[0]:
            module = cells.get("module")
            if module is not None:
                signature, place = _guarded(signature_of, module, "?"), _guarded(place_of, (module, name), UNKNOWN_PLACE)
            continue
        value = hook if part == "custom_hook" else _guarded(_readable, (part, cells), None) if part == "XLA flags" else None
        fresh = hashlib.sha256()
        raw = _serialized_options(cells) if part == "compile_options" else None
        if raw is not None and raw in _OPTIONS_HASH:
            hashes[part] = _OPTIONS_HASH[raw]
        else:
            if part in ("XLA flags", "custom_hook") and value is not None:
                fresh.update(value.encode())  # JAX's flags part logs each flag at DEBUG: not called twice
            else:
                hashfn(fresh)
                if part == "custom_hook":  # a user's hook replaced the package's: the seam adds the ISA
                    fresh.update(_key.isa_suffix().encode())
            hashes[part] = fresh.hexdigest()[:HEX]
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
    return Facts(hashes, readable, signature, place, _guarded(config_map, (), {}))


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
        return str(getattr(sys.modules.get("jax._src.cache_key"), "jaxlib_version_str", "?"))
    if part == "backend version" and "backend" in cells:
        return f"{cells['backend'].platform} {cells['backend'].platform_version}"
    if part == "XLA flags":
        return xla_flags()
    if part == "compile_options" and "compile_options" in cells:
        backend = cells.get("backend")
        return json.dumps(compile_options(cells["compile_options"], getattr(backend, "platform", "") == "gpu"),
                          sort_keys=True, separators=(",", ":"))
    if part == "accelerator_config" and "devices" in cells:
        return devices_text(cells["devices"])
    if part == "compression" and "compression_algorithm" in cells:
        return str(cells["compression_algorithm"])
    return None


def xla_flags() -> str:
    """The XLA flags JAX puts in its key, as JAX gathers them (``XLA_FLAGS``, ``LIBTPU_INIT_ARGS``,
    ``--xla…`` arguments), less the ones it leaves out."""
    cache_key = sys.modules.get("jax._src.cache_key")
    excluded = set(getattr(cache_key, "xla_flags_to_exclude_from_cache_key", ()))
    flags = [*os.environ.get("XLA_FLAGS", "").split(), *os.environ.get("LIBTPU_INIT_ARGS", "").split(),
             *(a for a in sys.argv if a.startswith("--xla"))]
    return " ".join(f for f in sorted(flags) if f.split("=")[0] not in excluded)


def devices_text(devices: Any) -> str:
    """The process's devices, kind and count (``2 x cpu``), and which of them the computation runs
    on (``on device 1``) where that is not all of them from the first."""
    import jax

    kinds: dict[str, int] = {}
    for device in jax.devices():
        kinds[device.device_kind] = kinds.get(device.device_kind, 0) + 1
    text = ", ".join(f"{n} x {kind}" for kind, n in kinds.items())
    if jax.process_count() > 1:
        text += f" in {jax.process_count()} processes"
    ids = [getattr(d, "id", "?") for d in devices.flat]
    if ids != list(range(len(ids))):
        text += f"; the computation on device {', '.join(map(str, ids[:16]))}"
    return text


_cleared: list[frozenset[str]] = []


def _cleared_by_jax() -> frozenset[str]:
    """The debug options JAX clears before hashing the compile options (read from its source, once):
    their values never change a key, so they are never named as a change."""
    if not _cleared:
        import inspect

        try:
            source = inspect.getsource(sys.modules["jax._src.cache_key"]._hash_serialized_compile_options)
            _cleared.append(frozenset(re.findall(r"debug_options\.(\w+)\s*=", source)))
        except Exception:
            _cleared.append(frozenset())
    return _cleared[0]


def compile_options(options: Any, strip_device_assignment: bool) -> dict[str, str]:
    """Every field the compile-options binding exposes (its build options and debug options
    included), ``env_option_overrides``, after JAX's own clearing; and ``#<n>`` digests of the
    serialised fields, for changes no exposed field shows (``field <n> changed``)."""
    cleared = _cleared_by_jax()
    excluded = set(getattr(sys.modules.get("jax._src.cache_key"), "env_override_flags_to_exclude_from_cache_key", ()))
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
                fields[prefix + attr] = repr(value)[:300]

    walk(options, "")
    fields.update(_wire_digests(options, strip_device_assignment))
    return fields


def _wire_digests(options: Any, strip: bool) -> dict[str, str]:
    """The serialised compile options (as JAX hashes them), field by field: ``#3`` for a top-level
    field, ``#3.14`` for a field of a message in it."""
    capture = _Capture()
    sys.modules["jax._src.cache_key"]._hash_serialized_compile_options(capture, options, strip_device_assignment=strip)
    found: dict[str, str] = {}
    for number, value in _wire_fields(capture.data) or []:
        inner = _wire_fields(value) if isinstance(value, bytes) else None
        if inner:
            for sub, sub_value in inner:
                found[f"#{number}.{sub}"] = hashlib.sha256(repr(sub_value).encode()).hexdigest()[:8]
        else:
            found[f"#{number}"] = hashlib.sha256(repr(value).encode()).hexdigest()[:8]
    return found


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


_TENSOR = re.compile(r"tensor<([^<>]*)>")


def signature_of(module: Any) -> str:
    """The module's inputs, as JAX prints avals: ``f32[8,8], i32[]``."""
    main = next((op for op in module.body.operations if str(op.attributes["sym_name"]).strip('"') == "main"), None)
    if main is None:
        return "?"
    text = str(main.attributes["function_type"])
    inputs = text[1:text.index(") -> ")] if text.startswith("(") and ") -> " in text else text

    def aval(match: re.Match[str]) -> str:
        *dims, dtype = match[1].split(",")[0].split("x")
        return f"{dtype}[{','.join(dims)}]"

    shown = _TENSOR.sub(aval, inputs)
    return shown if len(shown) <= 300 else f"{shown[:280]}... ({shown.count(',') + 1} inputs)"


_FRAME = re.compile(r'"([^"]+)"\("([^"]+)":(\d+)')


def place_of(module: Any, name: str) -> str:
    """Where the function's code is: the module path (relative to the ``sys.path`` entry that holds
    it) and the function's name, from the MLIR locations of the code in its body (``model/core.py:
    step``); ``jax`` for JAX's own helpers (locations, but no frame of a function of that name);
    ``?`` where it cannot be known (no locations; ``<stdin>``, a notebook cell)."""
    wanted = name.removeprefix("jit_").removeprefix("pmap_")
    files: set[str] = set()
    chains: list[list[tuple[str, str]]] = []
    for op in _operations(module, 2000):
        frames = [(_unescaped(fn), _unescaped(file), line) for fn, file, line in _FRAME.findall(str(op.location))]
        match = [(fn, file) for fn, file, _line in frames if _sanitized(fn) == wanted]
        if match:
            return _where(match[-1][1], match[-1][0])  # the outermost: the jitted function itself
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
            return _where(file, fn)
    return HELPER_PLACE if files else UNKNOWN_PLACE


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

    holders = getattr(jax.config, "_value_holders", {})
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


# -- deciding the cause ------------------------------------------------------------------------------


def classify(key: str, facts: Facts, evidence: Evidence, run: str, run_start: float) -> dict[str, Any]:
    """The one cause of a miss: evicted, new, then changed (SPEC §13.1)."""
    name, hex_ = _index.split_key(key)
    removed = evidence.removed.get((name, hex_))
    records = evidence.records(name)
    mine = next((r for r in records if r.hex == hex_), None)
    if removed is not None and mine is not None and mine.written > removed[0]:
        removed = None  # written again after that removal: whoever removed it since left no record
    if removed is not None or (mine is not None and not evidence.present(name, hex_)):
        return evicted(removed)
    recorded = [r for r in records if evidence.present(name, r.hex)]
    unrecorded = evidence.unrecorded(name, recorded)
    if not recorded and not unrecorded:
        return new_here(name, evidence, facts.place)
    same = [r for r in recorded if r.parts[0] == facts.parts[PARTS[0]]]
    if same:
        return changed_part(closest(same, facts), facts, evidence)
    # Every entry of the name written by this run (by this process, or another of the run whose
    # ledger is not folded yet: an xdist worker, a pool): the directory held none before, so
    # whatever this compile is, it is new here.
    ours = all(r.run == run for r in recorded) and all(evidence.written_at(k) >= run_start for k in unrecorded)
    if ours and (facts.place == UNKNOWN_PLACE or not any(r.place == facts.place for r in recorded)):
        return {"cause": "new", "detail": f"a further variant of {name} (inputs {facts.signature}): every entry of "
                                          f"{name} here was written by this run"}
    if facts.place == UNKNOWN_PLACE:
        where = "its code has no module to tell it by (a notebook cell, <stdin>, python -c)"
        return {"cause": "cannot tell", "detail": f"new, or another function named {name} changed: {where}",
                "by": "place"}
    here = [r for r in recorded if r.place == facts.place]
    unrecorded = evidence.unrecorded(name, recorded) if not here or not any(r.run != run for r in here) else []
    if not here and unrecorded:
        return {"cause": "cannot tell", "by": "record",
                "detail": f"new, or changed: {plural(len(unrecorded), 'entry', 'entries')} of {name} here "
                          f"{'has' if len(unrecorded) == 1 else 'have'} no record (written by stock JAX, an older "
                          "gkx-autocache, a bundle without records, or a process still running or killed)"}
    if not here:
        elsewhere = sorted({r.place for r in recorded})
        alias = next((p for p in elsewhere if _maybe_same(p, facts.place)), None)
        if alias is not None:  # model/core.py imported as model.core, and as core (its folder on sys.path)
            return {"cause": "cannot tell", "by": "alias",
                    "detail": f"new, or changed: its entries here are {_in(alias)}, which may be this very file "
                              f"imported another way ({_in(facts.place)})"}
        # Two functions of one name in one file (a `step` of two classes) are told apart by name.
        qualified = facts.place.rsplit(":", 1)[0] in {p.rsplit(":", 1)[0] for p in elsewhere}
        return {"cause": "new", "detail": f"another {name}, {_in(facts.place, qualified)} (its entries here are "
                                          f"{', '.join(_in(p, qualified) for p in elsewhere[:3])})"}
    # What this run wrote cannot have been a hit for it: the question is what the directory held
    # before. Only where this run wrote every entry of the function is a further shape "new".
    earlier = [r for r in here if r.run != run]
    before = [k for k in unrecorded if evidence.written_at(k) < run_start]
    if not earlier and before:
        return {"cause": "cannot tell", "by": "record",
                "detail": f"new, or changed: {plural(len(before), 'older entry', 'older entries')} of {name} here "
                          f"{'has' if len(before) == 1 else 'have'} no record"}
    if not earlier:
        shapes = sorted({r.signature for r in here})
        if facts.place == HELPER_PLACE:
            return {"cause": "new", "detail": f"a further variant of JAX's own {name} (inputs {facts.signature})"}
        if facts.signature in shapes:
            return {"cause": "new", "detail": f"a further variant of {name} with inputs this run compiled it for "
                                              f"({facts.signature}): other static arguments or closed-over values"}
        return {"cause": "new", "detail": f"new shape {facts.signature} (this run compiled {name} for "
                                          f"{'; '.join(shapes[:3])}{_more(shapes, 3)})"}
    # jax.config is named only where no earlier entry has this very jax.config: an entry with it
    # rules it out (its computation differs all the same), whichever variant was written last.
    alike = [r for r in earlier if r.config == facts.config]
    if not alike:
        diffs: dict[int, list[str]] = {}  # records of one config share its dict (``Evidence``)
        for r in earlier:
            if id(r.config) not in diffs:
                diffs[id(r.config)] = [k for k in sorted(set(r.config) | set(facts.config))
                                       if r.config.get(k) != facts.config.get(k)]
        fewest = min(len(d) for d in diffs.values())
        nearest = closest([r for r in earlier if len(diffs[id(r.config)]) == fewest], facts)
        differing = diffs[id(nearest.config)]
        shown = "; ".join(f"{k}: {nearest.config.get(k, 'unset')} -> {facts.config.get(k, 'unset')}" for k in differing[:4])
        # Whether a value changes what is compiled (x64 does, jax_debug_nans does not) cannot be
        # told from the key: where the inputs are the same, the code is as likely.
        also = (f"; or, if that does not change what is compiled, {SAME_SHAPES}"
                if any(r.signature == facts.signature for r in earlier) else "")
        return {"cause": "changed computation", "detail": f"jax.config differs: {shown}{_more(differing, 4)}{also}"}
    earlier = alike
    nearest = closest(earlier, facts)
    if facts.place == HELPER_PLACE:  # another use of JAX's own helper (other shapes, other static arguments)
        return {"cause": "new", "detail": f"a further variant of JAX's own {name} (inputs {facts.signature})"}
    if facts.place.endswith("<lambda>"):  # every lambda of a file (or of one function in it) has one place
        file, _, where = facts.place.rpartition(":")
        inside = f" ({where.removesuffix('.<lambda>')})" if where != "<lambda>" else ""
        return {"cause": "cannot tell", "by": "lambda",
                "detail": f"changed, or another lambda in {file}{inside}: lambdas have no name to tell them apart"}
    if any(r.signature == facts.signature for r in earlier):
        return {"cause": "changed computation", "detail": f"same input shapes ({facts.signature}): {SAME_SHAPES}"}
    return {"cause": "changed computation", "detail": f"inputs {nearest.signature} -> {facts.signature}"}


def _maybe_same(one: str, other: str) -> bool:
    """Whether two places of one function name may be one file reached through two sys.path
    entries: the same function, one path ending with the other (``core.py``, ``model/core.py``)."""
    file_a, _, function_a = one.rpartition(":")
    file_b, _, function_b = other.rpartition(":")
    return function_a == function_b and file_a != file_b and (file_a.endswith("/" + file_b)
                                                              or file_b.endswith("/" + file_a))


def _in(place: str, qualified: bool = False) -> str:
    if place == HELPER_PLACE:
        return "JAX's own helper"
    if place == UNKNOWN_PLACE:
        return "in an unknown place"
    file, _, function = place.rpartition(":")
    return f"{function}, in {file}" if qualified else f"in {file}"


def _more(items: list[Any], shown: int) -> str:
    return f" and {len(items) - shown} more" if len(items) > shown else ""


def closest(records: list[Record], facts: Facts) -> Record:
    """The record with the fewest parts that differ from ``facts``, the most recent among equals."""
    ours = tuple(facts.parts[p] for p in PARTS)
    apart: dict[tuple[str, ...], int] = {}  # the other seven parts, shared by many records: compared once each
    best: tuple[tuple[int, float, int], Record] | None = None
    for i, r in enumerate(records):
        others = r.parts[1:]
        far = apart.get(others)
        if far is None:
            far = apart[others] = sum(a != b for a, b in zip(others, ours[1:], strict=True))
        rank = (far + (r.parts[0] != ours[0]), -r.written, -i)  # the index: written later in the index, more recent
        if best is None or rank < best[0]:
            best = (rank, r)
    assert best is not None
    return best[1]


def evicted(removed: tuple[float, str] | None) -> dict[str, Any]:
    when = f" on {time.strftime('%Y-%m-%d %H:%M', time.localtime(removed[0]))}" if removed else ""
    by = removed[1] if removed else "outside"
    detail = {"max_size": f"removed by the cap (max_size){when}: the working set is larger than the cap",
              "prune": f"removed by gkx-autocache prune{when}",
              "verify": f"removed by gkx-autocache verify --repair{when} (it did not load)",
              }.get(by, f"removed outside gkx-autocache{when} (by hand, or another tool): this exact entry was here")
    return {"cause": "evicted", "detail": detail, "by": by}


def new_here(name: str, evidence: Evidence, place: str = UNKNOWN_PLACE) -> dict[str, Any]:
    """No entry of ``name`` here. After a JAX upgrade, the previous version's directory may hold
    it: said where its records put that entry's code at this function's place; where they put it
    elsewhere, that was another function of the name; where there is no record, it cannot tell."""
    other = _other_version(evidence.version_dir, name)
    if len(evidence.removed) >= _index.MAX_REMOVED:  # the index may have forgotten older removals by number
        since = min(when for when, _by in evidence.removed.values())
        horizon = (f"none removed since {time.strftime('%Y-%m-%d %H:%M', time.localtime(since))}; older removals "
                   "are not kept")
    else:
        horizon = f"none removed in the last {int(_index.REMOVED_SECS // 86400)} days"
    first = {"cause": "new", "detail": f"no entry of {name} here before ({horizon})"}
    if other is None:
        return first
    mine = os.path.basename(evidence.version_dir).removeprefix(VERSION_PREFIX)
    theirs = os.path.basename(other).removeprefix(VERSION_PREFIX)
    places = _places_of(other).get(name, set())
    if place != UNKNOWN_PLACE and place in places:
        return {"cause": "changed JAX", "detail": f"JAX {theirs} -> {mine}: the entries of {theirs} are in "
                                                  f"{os.path.basename(other)}/; every entry is compiled once for {mine}"}
    if place != UNKNOWN_PLACE and places - {UNKNOWN_PLACE}:
        return first  # the older version's entries of this name are another function's
    return {"cause": "cannot tell", "by": "jax",
            "detail": f"new, or JAX {theirs} -> {mine}: {os.path.basename(other)}/ holds entries named {name}, "
                      "with no record of where their code is"}


_places: dict[str, dict[str, set[str]]] = {}  # another version dir -> function name -> where its entries' code is


def _places_of(version_dir: str) -> dict[str, set[str]]:
    if version_dir not in _places:
        _places[version_dir] = _index.places_of(version_dir)
    return _places[version_dir]


_others: dict[str, dict[str, str]] = {}  # version dir -> function name -> the newest other version dir holding it


def _other_version(version_dir: str, name: str) -> str | None:
    if version_dir not in _others:
        found: dict[str, str] = {}
        root = os.path.dirname(version_dir)
        try:
            siblings = sorted((os.stat(os.path.join(root, d)).st_mtime, d) for d in os.listdir(root)
                              if d.startswith(VERSION_PREFIX) and os.path.join(root, d) != version_dir)
        except OSError:
            siblings = []
        for _mtime, sibling in siblings[-3:]:  # the newest last, so it wins
            try:
                for entry in os.listdir(os.path.join(root, sibling)):
                    if entry.endswith(ENTRY_SUFFIX):
                        found[function_name(entry[:-len(ENTRY_SUFFIX)])] = os.path.join(root, sibling)
            except OSError:
                continue
        _others[version_dir] = found
    return _others[version_dir].get(name)


def changed_part(nearest: Record, facts: Facts, evidence: Evidence) -> dict[str, Any]:
    """The computation matches an entry: the first other part that differs, named with before and
    after (and the parts that changed with it)."""
    changed = [p for p in PRIORITY if nearest.parts[PARTS.index(p)] != facts.parts[p]]
    if not changed:
        return {"cause": "evicted", "detail": "this exact key was stored before and is gone", "by": "outside"}
    if "compile_options" in changed and set(changed) <= {"accelerator_config", "compile_options"}:
        options = compile_options_change(
            evidence.readable("compile_options", nearest.parts[PARTS.index("compile_options")]),
            facts.readable.get("compile_options"), "")
        if options["cause"] == "changed device assignment":  # another rank's devices, on CPU
            return options
    first = changed[0]
    before = evidence.readable(first, nearest.parts[PARTS.index(first)])
    after = facts.readable.get(first)
    label = LABELS[first]
    with_it = f" (and the {', '.join(LABELS[p] for p in changed[1:])} with it)" if changed[1:] else ""
    if first == "custom_hook":
        old, new = _key.isa_of(before or ""), _key.isa_of(after or "")
        if new is not None and old is None and (before is not None or nearest.parts[PARTS.index(first)] == NO_HOOK):
            return {"cause": "before CPU keying",
                    "detail": "its entry was written before gkx-autocache keyed CPU entries by the CPU's instruction "
                              "set (or by stock JAX): compiled once more under the new key"}
        if old is not None and new is not None and old != new:
            return {"cause": "changed CPU", "detail": f"built for another CPU: {_isa.difference(old, new)}{with_it}"}
    if first == "compile_options":
        return compile_options_change(before, after, with_it)
    if first == "XLA flags":
        return {"cause": "changed XLA_FLAGS", "detail": f"XLA_FLAGS: {before!r} -> {after!r}{with_it}"}
    if before is None or after is None:
        return {"cause": f"changed {label}", "detail": f"{label} differs (its value was not recorded){with_it}"}
    if before == after:
        return {"cause": f"changed {label}", "detail": f"{label} hashes differently, though it reads {after!r} both "
                                                       f"times{with_it}"}
    return {"cause": f"changed {label}", "detail": f"{label}: {before} -> {after}{with_it}"}


def compile_options_change(before: str | None, after: str | None, with_it: str) -> dict[str, Any]:
    """Every compile-options field that differs, by name and value; ``field <n>`` for the rest. On
    CPU the device assignment is in the compile options (JAX strips it from the key on GPU only)."""
    try:
        old, new = json.loads(before or "{}"), json.loads(after or "{}")
    except ValueError:
        old, new = {}, {}
    named = [k for k in sorted(set(old) | set(new)) if not k.startswith("#") and old.get(k) != new.get(k)]
    if named == ["device_assignment"] or named == ["device_assignment", "executable_build_options.device_assignment"]:
        return {"cause": "changed device assignment",
                "detail": f"device assignment, in the compile options on CPU: {_short(old.get('device_assignment'))} -> "
                          f"{_short(new.get('device_assignment'))}{with_it}"}
    if named:
        shown = "; ".join(f"{k.removeprefix('executable_build_options.')}: {_short(old.get(k))} -> {_short(new.get(k))}"
                          for k in named[:4])
        return {"cause": "changed compile options", "detail": f"{shown}{_more(named, 4)}{with_it}"}
    fields = [k[1:] for k in sorted(set(old) | set(new)) if k.startswith("#") and old.get(k) != new.get(k)]
    if fields:
        return {"cause": "changed compile options",
                "detail": f"field {', '.join(fields[:4])} changed (not one the binding names){with_it}"}
    return {"cause": "changed compile options", "detail": f"they serialise differently{with_it}"}


def _short(value: Any) -> str:
    text = "unset" if value is None else str(value)
    text = text.removeprefix("DeviceAssignment")
    return text if len(text) <= 80 else text[:77] + "..."
