"""Why it missed (SPEC §13): every miss gets one cause, and every compile JAX does not write gets
its reason, recorded in the ledger for ``report``, ``stats`` and ``explain``.

JAX's key is one sha256 over eight parts, hashed in turn into one object by
``jax._src.cache_key.get``: the computation, the jaxlib version, the backend version, the XLA
flags, the compile options, the accelerator config, the compression and a custom hook. After each
part, ``get`` calls the module function ``_log_cache_key_hash(hash_obj, name, hashfn)`` (the same
in JAX 0.10.2 and 0.12), which hashes the part again for DEBUG logs only when that logger is on.
The seam wraps it, and on every key it only keeps the part's name and function and takes two
digests: after the first part, which is the computation's own hash (the expensive part, hashed
once), and after the last, which pairs the parts with the key the store is then asked for. On a
miss, and only then, the seven cheap parts are hashed on their own, and the readable values
(jaxlib and backend versions, XLA flags, devices, device assignment, compression) are read from
the part functions' closures. A hit costs the wrapper's calls and two digests (benchmarked).

The cause is decided against what the directory holds, kept per function name (the module name
JAX puts before the hash): for each of its computations, the parts of its latest entry. That index
and the keys the cap or ``prune`` removed ("evicted") are folded into the summary with the rest of
the ledger (``_ledger``); ``clear`` forgets them. Order when two causes apply: evicted, new,
changed (SPEC §13).

The second seam, ``jax._src.compiler._cache_write``, is where JAX decides not to write an entry
(not process 0, host callbacks in 0.10, below ``min_compile_time_secs``); a write that reaches it
but not the store was below ``min_entry_size_bytes``. Both seams are guarded like the store: if
either has changed, explanations are "unavailable" (``status`` says why) and nothing else changes.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from typing import Any

from gkx_autocache import _isa, _key
from gkx_autocache._diagnostics import human_bytes, logger
from gkx_autocache._layout import ENTRY_SUFFIX, function_name

# JAX's part names, in the order it hashes them, and what the user calls each.
PARTS = ("computation", "jax_lib version", "backend version", "XLA flags", "compile_options", "accelerator_config",
         "compression", "custom_hook")
LABELS = {"computation": "computation", "jax_lib version": "jaxlib", "backend version": "backend",
          "XLA flags": "XLA_FLAGS", "compile_options": "compile options", "accelerator_config": "devices",
          "compression": "compression", "custom_hook": "custom hook"}
# When the computation matches and several other parts differ, the cause named is the first here:
# an XLA flag also changes the compile options it sets, a jaxlib upgrade the backend version.
PRIORITY = ("jax_lib version", "backend version", "XLA flags", "compression", "accelerator_config",
            "compile_options", "custom_hook")
HEX = 16  # a part's hash, shortened: enough to tell parts apart, small to keep
NO_HOOK = hashlib.sha256(b"").hexdigest()[:HEX]  # the hook part of a key made without one (stock JAX)
MAX_COMPUTATIONS = 8  # per function name: its latest shapes
MAX_FUNCTIONS = 2000  # the summary stays a few MB at most: every exit reads and writes it
MAX_VALUES = 64  # readable values kept per part
MAX_EVICTED = 10000


class Explainer:
    """Names the cause of each miss in this process (the recorder asks), and keeps the
    ingredients of each key written (for the ledger, so that later processes can compare)."""

    def __init__(self, version_dir: str, cap: int, load: Any) -> None:
        self.version_dir = version_dir
        self.cap = cap
        self._read_state = load  # () -> the directory's explain state, as stored (``_ledger``)
        self._thread = threading.local()  # the key being computed on this thread: its parts
        self._state: dict[str, Any] | None = None  # the directory's index, loaded at the first miss
        self._lock = threading.Lock()

    # -- the seam: called by JAX for each part of each key ----------------------------------------

    def on_part(self, hash_obj: Any, name: str, hashfn: Any) -> None:
        pending = self._thread
        if name == PARTS[0]:
            pending.parts = [(name, hashfn)]
            pending.computation = hash_obj.digest().hex()[:HEX]  # the first part: its own hash
            pending.final = None
            pending.ingredients = None
            return
        parts = getattr(pending, "parts", None)
        if parts is None:
            return
        parts.append((name, hashfn))
        if name == "compression":  # the key as far as the hook: what stock JAX's key goes on from
            pending.before_hook = hash_obj.copy()
        elif name == PARTS[-1]:
            pending.final = hash_obj.digest().hex()
            pending.hook = _key.seam.last() if _key.seam is not None else None

    def forget(self) -> None:
        """The key was served: let go of its part functions now, while JAX still holds what they
        refer to (the module, the compile options). Held until the next key instead, they made
        the previous module's teardown land inside JAX's key computation: ~0.3 ms a key."""
        self._thread.parts = None

    # -- the recorder's questions -------------------------------------------------------------------

    def cause(self, key: str) -> dict[str, Any]:
        """``{"cause": ..., "detail": ...}`` for a miss of ``key``; never raises."""
        try:
            ingredients = self._ingredients(key)
            if ingredients is None:
                return {"cause": "unexplained", "detail": "its key was not computed on this thread"}
            before = self._before_cpu_keying(key)
            if before is not None:
                return before
            with self._lock:
                state = self._load()
                return classify(key, ingredients, state, self.cap)
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
        """What a written entry's ledger record keeps: its parts' hashes and readable values; and
        the entry joins this process's index at once."""
        try:
            ingredients = self._ingredients(key)
            if ingredients is None:
                return {}
            parts, readable = ingredients
            with self._lock:
                remember(self._load(), key, parts, readable)
            return {"parts": ",".join(parts[p] for p in PARTS), "readable": readable}
        except Exception as exc:
            logger.debug("ingredients of %s not kept: %s", key, exc)
            return {}

    def _ingredients(self, key: str) -> tuple[dict[str, str], dict[str, str]] | None:
        pending = self._thread
        final = getattr(pending, "final", None)
        if final is None or not key.endswith(final):
            return None
        if pending.ingredients is None:
            if not pending.parts:
                return None
            pending.ingredients = measure(pending.parts, pending.computation, getattr(pending, "hook", None))
            pending.parts = None  # what the put needs is measured: the functions can go
        result: tuple[dict[str, str], dict[str, str]] = pending.ingredients
        return result

    def _load(self) -> dict[str, Any]:
        if self._state is None:
            self._state = validate(self._read_state())
        return self._state


def measure(parts: list[tuple[str, Any]], computation: str,
            hook: str | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Each part's own hash (the computation's was taken on the way: it is not hashed twice) and
    the readable values of the parts a person can read. ``hook`` is what the key's hook part hashed
    (``_key``), where known."""
    hashes = {PARTS[0]: computation}
    readable: dict[str, str] = {}
    for name, hashfn in parts[1:]:
        value = _readable(name, hashfn) if name != "custom_hook" else hook
        if value is not None:
            readable[name] = value if name == "custom_hook" else value[:400]  # the ISA in full
        fresh = hashlib.sha256()
        if name in ("XLA flags", "custom_hook") and value is not None:
            fresh.update(value.encode())  # JAX's part function logs each flag at DEBUG: not called twice
        else:
            hashfn(fresh)
            if name == "custom_hook":  # a user's hook replaced the package's: the seam adds the ISA
                fresh.update(_key.isa_suffix().encode())
        hashes[name] = fresh.hexdigest()[:HEX]
    for name in PARTS:
        hashes.setdefault(name, "-")
    return hashes, readable


def _readable(name: str, hashfn: Any) -> str | None:
    cells = dict(zip(hashfn.__code__.co_freevars, (c.cell_contents for c in hashfn.__closure__ or ()), strict=False))
    if name == "jax_lib version":
        return str(getattr(sys.modules.get("jax._src.cache_key"), "jaxlib_version_str", "?"))
    if name == "backend version" and "backend" in cells:
        return f"{cells['backend'].platform} {cells['backend'].platform_version}"
    if name == "XLA flags":
        return xla_flags()
    if name == "compile_options" and "compile_options" in cells:
        assignment = getattr(cells["compile_options"], "device_assignment", None)
        return f"device assignment {str(assignment).removeprefix('DeviceAssignment')}" if assignment else "no device assignment"
    if name == "accelerator_config" and "devices" in cells:
        kinds: dict[str, int] = {}
        for device in cells["devices"].flat:
            kinds[device.device_kind] = kinds.get(device.device_kind, 0) + 1
        return ", ".join(f"{n} x {kind}" for kind, n in kinds.items())
    if name == "compression" and "compression_algorithm" in cells:
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


# -- deciding the cause ------------------------------------------------------------------------------


def classify(key: str, ingredients: tuple[dict[str, str], dict[str, str]], state: dict[str, Any], cap: int) -> dict[str, Any]:
    """The one cause of a miss, in SPEC §13's order: evicted, new, changed."""
    hashes, readable = ingredients
    evicted = state["evicted"].get(key)
    if evicted is not None:
        why = evicted[1]
        if why == "max_size":
            return {"cause": "evicted", "detail": f"pruned by the cap (max_size {human_bytes(cap) if cap else 'now 0'}): "
                                                  "the working set is larger; raise max_size"}
        return {"cause": "evicted", "detail": f"removed by {why}"}
    name = function_name(key)
    known = state["index"].get(name)
    if not known:
        return {"cause": "new", "detail": f"no entry for {name} yet"}
    found = known.get(hashes[PARTS[0]])
    if found is None:
        latest = list(known.values())[-1].split(",")
        others = [p for p in PRIORITY if latest[PARTS.index(p)] != hashes[p]]
        also = f"; also changed: {', '.join(LABELS[p] for p in others)}" if others else ""
        return {"cause": "changed computation",
                "detail": f"{name}: its code, input shapes or dtypes, or a closed-over constant{also}"}
    same = found.split(",")
    changed = [p for p in PRIORITY if same[PARTS.index(p)] != hashes[p]]
    if not changed:
        return {"cause": "evicted", "detail": "this exact key was stored before; its entry was removed outside the cap"}
    def values(part: str) -> tuple[str, str]:
        return state["values"].get(part, {}).get(same[PARTS.index(part)], "?"), readable.get(part, "?")

    # The first changed part a person can see change: on CPU, a second rank's accelerator config
    # hashes differently while reading "1 x cpu" on both sides; its device assignment says why.
    first = next((p for p in changed if values(p)[0] != values(p)[1]), changed[0])
    before, after = values(first)
    label = LABELS[first]
    if first == "custom_hook":
        old, new = _key.isa_of(before), _key.isa_of(after)
        if new is not None and (old is None and (before != "?" or same[PARTS.index(first)] == NO_HOOK)):
            return {"cause": "before CPU keying",
                    "detail": "its entry was written before gkx-autocache keyed CPU entries by the CPU's instruction "
                              "set (or by stock JAX): compiled once more under the new key"}
        if old is not None and new is not None and old != new:
            return {"cause": "changed CPU", "detail": f"built for another CPU: {_isa.difference(old, new)}"}
    if first == "compile_options" and before != after and "device assignment" in after:
        label = "device assignment"  # on CPU JAX keeps it in the compile options (it strips it only on GPU)
        detail = f"device assignment, in the compile options on CPU: {before} -> {after}"
    elif first == "XLA flags":
        detail = f"XLA_FLAGS: {before!r} -> {after!r}"
    else:
        detail = f"{label}: {before} -> {after}"
    return {"cause": f"changed {label}", "detail": detail[:600]}


# -- the index: built from written entries, folded with the ledger -----------------------------------


def empty() -> dict[str, Any]:
    return {"index": {}, "values": {}, "evicted": {}}


def validate(data: Any) -> dict[str, Any]:
    """The explain state as read from disk (a member of a team cache can write anything there)."""
    state = empty()
    if not isinstance(data, dict):
        return state
    index = data.get("index")
    if isinstance(index, dict):
        for name, computations in list(index.items())[-MAX_FUNCTIONS:]:
            if isinstance(name, str) and isinstance(computations, dict):
                kept = {c: p for c, p in list(computations.items())[-MAX_COMPUTATIONS:]
                        if isinstance(c, str) and isinstance(p, str) and p.count(",") == len(PARTS) - 1}
                if kept:
                    state["index"][name] = kept
    values = data.get("values")
    if isinstance(values, dict):
        for part, table in values.items():
            if part in PARTS and isinstance(table, dict):
                state["values"][part] = {h: v for h, v in list(table.items())[-MAX_VALUES:]
                                         if isinstance(h, str) and isinstance(v, str)}
    evicted = data.get("evicted")
    if isinstance(evicted, dict):
        state["evicted"] = {k: v for k, v in list(evicted.items())[-MAX_EVICTED:]
                            if isinstance(k, str) and isinstance(v, list) and len(v) == 2 and isinstance(v[1], str)}
    return state


def remember(state: dict[str, Any], key: str, parts: dict[str, str], readable: dict[str, str]) -> None:
    """An entry written: its function's index gets its parts; its readable values are kept."""
    computations = state["index"].setdefault(function_name(key), {})
    computations.pop(parts[PARTS[0]], None)  # latest last
    computations[parts[PARTS[0]]] = ",".join(parts[p] for p in PARTS)
    while len(computations) > MAX_COMPUTATIONS:
        computations.pop(next(iter(computations)))
    while len(state["index"]) > MAX_FUNCTIONS:
        state["index"].pop(next(iter(state["index"])))
    for part, value in readable.items():
        table = state["values"].setdefault(part, {})
        table.pop(parts.get(part, ""), None)
        table[parts.get(part, "")] = value
        while len(table) > MAX_VALUES:
            table.pop(next(iter(table)))
    state["evicted"].pop(key, None)


class Folding:
    """What ``_ledger.fold`` asks of explanations: to fold a record into the summary's state, and
    to remember the keys a prune removed. The state is validated the first time it is touched (it
    was read from disk) and then changed in place."""

    def __init__(self) -> None:
        self._checked: set[int] = set()

    def fold(self, raw: dict[str, Any], record: dict[str, Any]) -> None:
        if record["e"] == "put" and "parts" in record:
            hashes = record["parts"].split(",")
            if len(hashes) == len(PARTS):
                remember(self._state(raw), record.get("key", ""), dict(zip(PARTS, hashes, strict=True)),
                         record.get("readable", {}))
        elif record["e"] == "evicted" and record.get("key"):
            self.evicted(raw, [record["key"]], record.get("reason") or "prune")

    def evicted(self, raw: dict[str, Any], keys: list[str], why: str) -> None:
        import time

        state = self._state(raw)
        for key in keys:
            state["evicted"].pop(key, None)
            state["evicted"][key] = [round(time.time(), 1), why]
        while len(state["evicted"]) > MAX_EVICTED:
            state["evicted"].pop(next(iter(state["evicted"])))

    def _state(self, raw: dict[str, Any]) -> dict[str, Any]:
        if id(raw) not in self._checked:
            fresh = validate(raw)
            raw.clear()
            raw.update(fresh)
            self._checked.add(id(raw))
        return raw


# -- installing the seams ----------------------------------------------------------------------------


def install(jax: Any, recorder: Any, version_dir: str, cap: int, load: Any) -> str | None:
    """Wrap the two seams; return why explanations are unavailable (nothing else changes).
    ``load()`` reads the directory's state, at the first miss."""
    try:
        from jax._src import compiler
    except Exception as exc:
        return f"jax._src.compiler cannot be imported ({exc})"
    from gkx_autocache import _key
    from gkx_autocache._store import _parameters

    seam = _key.seam
    if seam is None or not seam.parts:
        return "jax._src.cache_key._log_cache_key_hash(hash_obj, last_serialized, hashfn) is missing or has changed"
    write = getattr(compiler, "_cache_write", None)
    if write is None or _parameters(write)[:5] != ["cache_key", "compile_time_secs", "module_name", "backend", "executable"]:
        return "jax._src.compiler._cache_write has changed"
    explainer = Explainer(version_dir, cap, load)

    def _cache_write(cache_key: str, compile_time_secs: float, module_name: str, backend: Any, executable: Any,
                     *rest: Any, **kwargs: Any) -> None:
        reason = _not_written(jax, compile_time_secs, rest[0] if rest else kwargs.get("host_callbacks"))
        before = recorder.totals.writes
        write(cache_key, compile_time_secs, module_name, backend, executable, *rest, **kwargs)
        try:
            if jax.config.jax_compilation_cache_dir != version_dir:
                return  # the user's code chose another directory: its compiles are not ours to count
            if reason is None and recorder.totals.writes == before and recorder.store_serving:
                minimum = jax.config.jax_persistent_cache_min_entry_size_bytes
                reason = ("below min_entry_size_bytes", f"{minimum} bytes") if minimum > 0 else None
            if reason is not None and recorder.totals.writes == before:  # a rank's own local write (SPEC §14) is one
                recorder.uncached(cache_key, *reason)
        except Exception:
            pass

    _cache_write.__wrapped__ = write  # type: ignore[attr-defined]
    compiler._cache_write = _cache_write
    seam.listener = explainer
    recorder.explainer = explainer
    return None


def _not_written(jax: Any, compile_time_secs: float, host_callbacks: Any) -> tuple[str, str] | None:
    """Why JAX will not write this compile, by JAX's own rules, before it decides: a reason and
    its detail."""
    try:
        if jax.process_index() != 0:
            return "not process 0", f"process {jax.process_index()}: only process 0 of a multi-process run writes"
        if host_callbacks:
            return "host callbacks", "jax.debug.print, pure_callback or io_callback in the function"
        minimum = jax.config.jax_persistent_cache_min_compile_time_secs
        if compile_time_secs < minimum:
            return "below min_compile_time_secs", f"{minimum:g} s; it took {compile_time_secs:.2f} s"
    except Exception:
        pass
    return None
