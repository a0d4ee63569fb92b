"""The one cause of a miss (SPEC §13.1): evicted, new, then changed, from the closest entry of the
directory's evidence; or what the evidence cannot tell apart. The order and its reasons:
docs/how-it-works.md, "Why it missed"."""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from typing import Any

from gkx_autocache import _causes as causes
from gkx_autocache import _isa, _key
from gkx_autocache._diagnostics import plural
from gkx_autocache._explain import inputs
from gkx_autocache._explain.facts import (
    DEBUG_FOLLOWS,
    DEBUG_OPTIONS,
    HELPER_PLACE,
    LIBTPU_MARK,
    NO_HOOK,
    UNKNOWN_PLACE,
    Facts,
    runs,
)
from gkx_autocache._formats import read_sidecar
from gkx_autocache._key import PARTS
from gkx_autocache._layout import COMPILE_SIDECAR, ENTRY_SUFFIX, RECORD_SIDECAR, VERSION_PREFIX, function_name
from gkx_autocache._record import index as _index
from gkx_autocache._record.index import Evidence, Record

LABELS = {"computation": "computation", "jax_lib version": "jaxlib", "backend version": "backend",
          "XLA flags": "XLA_FLAGS", "compile_options": "compile options", "accelerator_config": "devices",
          "compression": "compression", "custom_hook": "custom hook"}
# When the computation matches and several other parts differ, the cause named is the first here:
# an XLA flag also changes the compile options it sets, a jaxlib upgrade the backend version.
PRIORITY = ("jax_lib version", "backend version", "XLA flags", "compression", "custom_hook", "accelerator_config",
            "compile_options")
# What changes a computation without changing its input shapes and dtypes: none is in the signature.
SAME_SHAPES = ("its code, a static argument, a closed-over constant, or a weak type (a Python scalar passed for an "
               "array) changed")
HELPER_SAME = "a static argument of JAX's own helper (a shape, an axis, a dtype, a count) differs"


def classify(key: str, facts: Facts, evidence: Evidence, run: str) -> dict[str, Any]:
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
    # Its entries here were all rebuilt from an older JAX's records (SPEC §18): this module is not
    # one of those it lowered, so the upgrade is the cause, said as such, not a change of the code.
    # (A rebuilt entry has no record of what its key was made of: no program compiled it here.)
    if (recorded or unrecorded) and all(evidence.rebuilt(f"{name}-{r.hex}") for r in recorded) and \
            all(evidence.rebuilt(k) for k in unrecorded) and (found := upgraded(name, evidence, facts.place)) is not None:
        return found
    # Every entry of the name written by this run (this process, or another of the run: an xdist
    # worker, a pool), by its record or its sidecar; not one another run wrote while this one ran
    # (a sweep's other job): the directory held none before, so whatever this compile is, it is new.
    ours = all(r.run == run for r in recorded) and all(evidence.written_by(k) == run for k in unrecorded)
    if ours and (found := upgraded(name, evidence, facts.place)) is not None:
        return found
    if ours and (facts.place == UNKNOWN_PLACE or not any(r.place == facts.place for r in recorded)):
        # Every entry of the name is this run's, and each is at a known place other than this one (a
        # `train_step` in mlp_model.py and in conv_model.py): another function, not a variant of one.
        elsewhere = sorted({r.place for r in recorded})
        if facts.place not in (UNKNOWN_PLACE, HELPER_PLACE) and not unrecorded and not set(elsewhere) & {
                UNKNOWN_PLACE, HELPER_PLACE} and not any(_maybe_same(p, facts.place) for p in elsewhere):
            return another(name, facts.place, elsewhere)
        return {"cause": causes.NEW, "detail": f"a further variant of {name} (inputs {inputs.shown(facts.signature)}): "
                                          f"every entry of {name} here was written by this run"}
    if facts.place == UNKNOWN_PLACE:
        where = "its code has no module to tell it by (a notebook cell, <stdin>, python -c)"
        return {"cause": causes.CANNOT_TELL, "by": "place",
                "detail": f"new, or another function named {name} changed: {where}"
                          f"{_closest_differs(recorded, facts, evidence)}"}
    here = [r for r in recorded if r.place == facts.place]
    unrecorded = evidence.unrecorded(name, recorded) if not here or not any(r.run != run for r in here) else []
    if not here and unrecorded:
        return {"cause": causes.CANNOT_TELL, "by": "record",
                "detail": f"new, or changed: {plural(len(unrecorded), 'entry', 'entries')} of {name} here "
                          f"{'has' if len(unrecorded) == 1 else 'have'} no record (written by stock JAX, an older "
                          "gkx-autocache, a bundle without records, or a process still running or killed)"}
    if not here:
        elsewhere = sorted({r.place for r in recorded})
        alias = next((p for p in elsewhere if _maybe_same(p, facts.place)), None)
        if alias is not None:  # model/core.py imported as model.core, and as core (its folder on sys.path)
            return {"cause": causes.CANNOT_TELL, "by": "alias",
                    "detail": f"new, or changed: its entries here are {_in(alias)}, which may be this very file "
                              f"imported another way ({_in(facts.place)})"}
        # A file renamed or moved (git mv): the same function, or another; its entries' file is gone.
        gone = [p for p in elsewhere if p not in (HELPER_PLACE, UNKNOWN_PLACE) and not _file_here(p)]
        if gone:
            moved = [r for r in recorded if r.place in gone]
            return {"cause": causes.CANNOT_TELL, "by": "moved",
                    "detail": f"new, or {name} moved from {_file(gone[0])} ({_file(gone[0])} is gone; this one is "
                              f"{_in(facts.place)}){_closest_differs(moved, facts, evidence)}"}
        return another(name, facts.place, elsewhere)
    found = _at_place(name, here, unrecorded, facts, evidence, run)
    others = {r.place for r in recorded} - {facts.place, UNKNOWN_PLACE}
    if others and facts.place != HELPER_PLACE and found["cause"] in (causes.CHANGED_COMPUTATION, causes.NEW):
        # The name has entries of other functions (mlp_model.py's train_step): say which this is.
        qualified = _file(facts.place) in {_file(p) for p in others}
        file, _, function = facts.place.rpartition(":")
        found["detail"] = f"{f'{function} in {file}' if qualified else f'the {name} in {file}'}: {found['detail']}"
    return found


def another(name: str, place: str, elsewhere: list[str]) -> dict[str, Any]:
    """``new``: another function of a known name, at another place than the name's entries."""
    # Two functions of one name in one file (a `step` of two classes) are told apart by name.
    qualified = _file(place) in {_file(p) for p in elsewhere}
    return {"cause": causes.NEW, "detail": f"another {name}, {_in(place, qualified)} (its entries here are "
                                      f"{', '.join(_in(p, qualified) for p in elsewhere[:3])})"}


def _at_place(name: str, here: list[Record], unrecorded: list[str], facts: Facts, evidence: Evidence,
              run: str) -> dict[str, Any]:
    """The cause of a miss of a function with entries at its place (``here``)."""
    # What this run wrote cannot have been a hit for it: the question is what the directory held
    # before. Only where this run wrote every entry of the function is a further shape "new".
    earlier = [r for r in here if r.run != run]
    before = [k for k in unrecorded if evidence.written_by(k) != run]
    if not earlier and before:
        return {"cause": causes.CANNOT_TELL, "by": "record",
                "detail": f"new, or changed: {plural(len(before), 'older entry', 'older entries')} of {name} here "
                          f"{'has' if len(before) == 1 else 'have'} no record"}
    if not earlier and (found := upgraded(name, evidence, facts.place)) is not None:
        return found
    if not earlier:
        shapes = sorted({r.signature for r in here})
        if facts.place == HELPER_PLACE:
            return {"cause": causes.NEW,
                    "detail": f"a further variant of JAX's own {name} (inputs {inputs.shown(facts.signature)})"}
        if facts.signature in shapes:
            return {"cause": causes.NEW, "detail": f"a further variant of {name} with inputs this run compiled it for "
                                              f"({inputs.shown(facts.signature)}): other static arguments or closed-over values"}
        return {"cause": causes.NEW, "detail": f"new shape {inputs.shown(facts.signature)} (this run compiled {name} for "
                                          f"{'; '.join(map(inputs.shown, shapes[:3]))}{_more(shapes, 3)})"}
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
        if _other_parts_differ(nearest, facts, evidence):  # JAX_NUM_CPU_DEVICES: a config value, the devices and the computation
            return _with_computation(nearest, facts, evidence, f"; jax.config differs too: {shown}{_more(differing, 4)}")
        # Whether a value changes what is compiled (x64 does, jax_debug_nans does not) cannot be
        # told from the key: where the inputs are the same, the code is as likely.
        also = (f"; or, if that does not change what is compiled, {SAME_SHAPES}"
                if any(r.signature == facts.signature for r in earlier) else "")
        return {"cause": causes.CHANGED_COMPUTATION, "detail": f"jax.config differs: {shown}{_more(differing, 4)}{also}"}
    earlier = alike
    nearest = closest(earlier, facts)
    if _other_parts_differ(nearest, facts, evidence):
        return _with_computation(nearest, facts, evidence)
    if facts.place == HELPER_PLACE:  # another use of JAX's own helper than its earlier entries
        if nearest.signature != facts.signature:
            return {"cause": causes.CHANGED_COMPUTATION, "detail": inputs_change(nearest, facts, evidence)}
        return {"cause": causes.CHANGED_COMPUTATION,
                "detail": f"same input shapes ({inputs.shown(facts.signature)}): {HELPER_SAME}"}
    if facts.place.endswith("<lambda>"):  # every lambda of a file (or of one function in it) has one place
        file, _, where = facts.place.rpartition(":")
        inside = f" ({where.removesuffix('.<lambda>')})" if where != "<lambda>" else ""
        return {"cause": causes.CANNOT_TELL, "by": "lambda",
                "detail": f"changed, or another lambda in {file}{inside}: lambdas have no name to tell them apart"}
    same_inputs = [r for r in earlier if r.signature == facts.signature]
    if same_inputs:
        said, by = same_inputs_change(closest_constants(same_inputs, facts, evidence), facts, evidence)
        return {"cause": causes.CHANGED_COMPUTATION, "detail": f"same input shapes ({inputs.shown(facts.signature)}): "
                f"{said}", **({"by": by} if by else {})}
    return {"cause": causes.CHANGED_COMPUTATION, "detail": inputs_change(nearest, facts, evidence)}


# What sets an output's shape without changing the inputs' (a top_k's k, a closed-over length).
OTHER_OUTPUTS = "a static argument or a closed-over value that sets a shape changed, or its code"


def same_inputs_change(nearest: Record, facts: Facts, evidence: Evidence) -> tuple[str, str | None]:
    """What differs in a computation of the same inputs: what its module marks on them (donation,
    shardings) and its outputs, where they differ; then its constants or its operations
    (``constant_change``); the possible causes where nothing it can read differs. And, where the
    donation or the shardings are all that differs, which (``by``: its fix)."""
    marked = interface_change(nearest, facts, evidence)
    changed = constant_change(nearest, facts, evidence)
    if "out" in marked and changed is None:
        marked["out"] += f": {OTHER_OUTPUTS}"
    said = [*marked.values(), *([changed] if changed else [])]
    only = "donated" if list(marked) == ["donated"] else "sharded" if list(marked) == ["sharded"] else None
    return "; ".join(said) or SAME_SHAPES, only if changed is None else None


def interface_change(nearest: Record, facts: Facts, evidence: Evidence) -> dict[str, str]:
    """``inputs.interface_change`` between an entry's computation and this one's."""
    before = _readable_json(evidence.readable(PARTS[0], nearest.parts[0]))
    return inputs.interface_change(before, _readable_json(facts.readable.get(PARTS[0])), facts.signature)


def inputs_change(nearest: Record, facts: Facts, evidence: Evidence) -> str:
    """``inputs.change`` between an entry's inputs and this one's, aligned where both orders are known."""
    before = _readable_json(evidence.readable(PARTS[0], nearest.parts[0])).get("order")
    after = _readable_json(facts.readable.get(PARTS[0])).get("order")
    return inputs.change(nearest.signature, facts.signature, (before if isinstance(before, str) else None,
                                                              after if isinstance(after, str) else None))


def _readable_json(readable: str | None) -> dict[str, Any]:
    """A computation's readable value as a dict (``facts.measure``); empty where none or not one."""
    try:
        found = json.loads(readable or "{}")
    except (ValueError, RecursionError):
        return {}
    return found if isinstance(found, dict) else {}


def constant_change(nearest: Record, facts: Facts, evidence: Evidence) -> str | None:
    """What differs in a computation of the same inputs, as far as its readable value tells: its
    operations (its code changed: a constant that changed as well is not the cause), or else its
    constants, named before and after where they are the only difference (a ``t_final`` written
    into the code, a learning rate); None where it cannot tell."""
    old = _computation(evidence.readable(PARTS[0], nearest.parts[0]))
    new = _computation(facts.readable.get(PARTS[0]))
    if old is None or new is None:
        return None
    before, after = Counter(dict(old["constants"])), Counter(dict(new["constants"]))
    if old["ops"] != new["ops"]:
        pairs = _constant_pairs(before, after)
        also = f"; its constants differ too ({'; '.join(pairs)})" if pairs else ""
        return f"its operations differ, not only its constants: {SAME_SHAPES}{also}"
    if not (old["whole"] and new["whole"]) or before == after:
        return None
    pairs = _constant_pairs(before, after)
    fix = "(a value written into the function or closed over: pass it as an argument to keep one entry for every value)"
    if pairs and len(pairs) <= 3:
        which = "a constant" if len(pairs) == 1 else f"{len(pairs)} constants"
        return f"{which} in its code changed, {'; '.join(pairs)} {fix}"
    return f"its constants changed, its operations did not: {_uses(before - after)} -> {_uses(after - before)} {fix}"


def _uses(constants: Counter[str]) -> str:
    said = [value.partition(":")[0] + (f" ({uses} places)" if uses > 1 else "") for value, uses in
            list(constants.items())[:4]]
    return (", ".join(said) + _more(list(constants), 4)) or "none"


def closest_constants(records: list[Record], facts: Facts, evidence: Evidence) -> Record:
    """Of entries with this compile's inputs, the one whose computation differs least as its readable
    value tells (its operations, then what its module marks on its inputs and its outputs, then how
    many uses of constants differ, then how many values; a weight decay changed after a learning
    rate is one constant from the entry before both), the most recent among equals; ``closest``
    where that cannot be read."""
    mine = _computation(facts.readable.get(PARTS[0]))
    if mine is None:
        return closest(records, facts)
    ours = Counter(dict(mine["constants"]))
    interface = {k: mine.get(k) for k in INTERFACE}
    best: tuple[tuple[int, int, int, int, float], Record] | None = None
    for r in sorted(records, key=lambda r: -r.written)[:TIED_COMPARED]:
        theirs = _computation(evidence.readable(PARTS[0], r.parts[0]))
        if theirs is None:
            continue
        constants = Counter(dict(theirs["constants"]))
        apart = (ours - constants) + (constants - ours)
        marked = sum(theirs.get(k) != v for k, v in interface.items())
        rank = (int(theirs["ops"] != mine["ops"]), marked, sum(apart.values()), len(apart), -r.written)
        if best is None or rank < best[0]:
            best = (rank, r)
    return best[1] if best is not None else closest(records, facts)


def _computation(readable: str | None) -> dict[str, Any] | None:
    """A computation's readable value (``facts.computation_of``), or None (none, or an older one's)."""
    try:
        found = json.loads(readable or "")
    except (ValueError, RecursionError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("constants"), list):
        return None
    try:
        found["constants"] = [(str(value), int(uses)) for value, uses in found["constants"]]
    except (TypeError, ValueError):
        return None
    return found


def _constant_pairs(before: Counter[str], after: Counter[str]) -> list[str] | None:
    """Each constant that became another, used as many times (``2.0 -> 3.5 (5 places)``: one value
    used in a loop is one change); None where the difference is not values swapped for values."""
    removed, added = before - after, after - before
    pairs: dict[str, int] = {}  # (the same change in two dtypes, 8 -> 9 in i32 and i64, is said once)
    for value, uses in list(removed.items()):
        other = next((v for v, n in added.items() if n == uses), None)
        if other is None:
            return None
        pairs[_pair_of(value, other)] = pairs.get(_pair_of(value, other), 0) + uses
        del added[other]
    return None if added else [pair + (f" ({uses} places)" if uses > 1 else "") for pair, uses in pairs.items()]


def _pair_of(value: str, other: str) -> str:
    """``100.0 -> 200.0``: a constant's dtype (``100.0:f64``) said only where it changed."""
    one, _, dtype = value.partition(":")
    two, _, other_dtype = other.partition(":")
    return f"{one} -> {two}" if dtype == other_dtype else f"{value} -> {other}"


def _other_parts_differ(nearest: Record, facts: Facts, evidence: Evidence) -> bool:
    return any(_differs(nearest, facts, evidence, p) for p in PARTS[1:])


def _differs(nearest: Record, facts: Facts, evidence: Evidence, part: str) -> bool:
    """Whether a key part differs, as a person counts it: a hook part that differs only in the mark of
    host callbacks does not (they were added to or taken from the computation, which says so)."""
    i = PARTS.index(part)
    if nearest.parts[i] == facts.parts[part]:
        return False
    if part != "custom_hook":
        return True
    before, after = evidence.readable(part, nearest.parts[i]), facts.readable.get(part)
    return before is None or after is None or _key.without_callbacks(before) != _key.without_callbacks(after)


# Compile-options fields whose value follows the computation: one value per input or output (a
# saveat of 9 times for 8, 14 layers for 12), or set by JAX from the module (xla_detailed_logging,
# for a module of 10 operations or more: a float16 model converts more). Where only these differ
# beside the computation, the computation is the cause. By name, and on the wire for a binding that
# does not name them (argument_layouts #1, result_layout #3.2, the two sharding lists #3.12, #3.18).
FOLLOW_COMPUTATION = ("allow_spmd_sharding_propagation_to_output", "allow_spmd_sharding_propagation_to_parameters",
                      "argument_layouts", "result_layout", "debug_options.xla_detailed_logging")
FOLLOW_WIRE = ("#1", "#3.2", "#3.12", "#3.18", *(f"{DEBUG_OPTIONS}.{n}" for n in DEBUG_FOLLOWS))


def _with_computation(nearest: Record, facts: Facts, evidence: Evidence, also: str = "") -> dict[str, Any]:
    """The computation differs, and so do other parts (8 -> 4 devices: their number is in a sharded
    computation): every part that differs is named, the first as where the computation matches."""
    found = changed_part(nearest, facts, evidence)
    if found["cause"] == causes.CHANGED_COMPILE_OPTIONS and not also and _options_follow(nearest, facts, evidence):
        outputs = interface_change(nearest, facts, evidence).get("out") if nearest.signature == facts.signature else None
        shapes = (inputs_change(nearest, facts, evidence) if nearest.signature != facts.signature else
                  f"same input shapes ({inputs.shown(facts.signature)}), other outputs")
        return {"cause": causes.CHANGED_COMPUTATION,
                "detail": f"{shapes}: the compile options follow them ({found['detail']}){f'; {outputs}' if outputs else ''}"}
    sharded = (" (a computation sharded over the devices holds their number, or its code changed as well)"
               if nearest.parts[PARTS.index("accelerator_config")] != facts.parts["accelerator_config"] else
               " (a computation sharded over a mesh holds its size, or its code changed as well)"
               if found.get("by") == "mesh" else "")
    changed = f", {inputs_change(nearest, facts, evidence)}" if nearest.signature != facts.signature else ""
    return {**found, "detail": f"{found['detail']}{also}; its computation differs too{changed}{sharded}"}


def _options_follow(nearest: Record, facts: Facts, evidence: Evidence) -> bool:
    """Whether the compile options are the only other part that differs, and only in fields that
    follow the computation (``FOLLOW_COMPUTATION``, ``FOLLOW_WIRE``)."""
    if [p for p in PRIORITY if _differs(nearest, facts, evidence, p)] != ["compile_options"]:
        return False
    before = evidence.readable("compile_options", nearest.parts[PARTS.index("compile_options")])
    after = facts.readable.get("compile_options")
    named, wire = option_fields(before, after), wire_fields(before, after)
    return (bool(named or wire) and all(k.removeprefix("executable_build_options.") in FOLLOW_COMPUTATION for k in named)
            and all(k in FOLLOW_WIRE or k.startswith("#1.") for k in wire))


def differences(nearest: Record, facts: Facts, evidence: Evidence) -> list[str]:
    """Every part in which this compile differs from an entry, as a person reads it: the key's
    parts, jax.config's values, the input shapes, or else the computation."""
    said = []
    for part in PRIORITY:
        i = PARTS.index(part)
        if not _differs(nearest, facts, evidence, part):
            continue
        before, after = evidence.readable(part, nearest.parts[i]), facts.readable.get(part)
        old, new = _key.isa_of(before or ""), _key.isa_of(after or "")
        if part == "compile_options":
            said.append(compile_options_change(before, after, "")["detail"])
        elif part == "custom_hook" and old is not None and new is not None and old != new:
            said.append(f"CPU: {_isa.difference(old, new)}")
        elif (tpu := tpu_change(part, before, after)) is not None:
            said.append(tpu["detail"])
        elif part == "XLA flags" and before is not None and after is not None:
            said.append(f"XLA_FLAGS: {before!r} -> {after!r}")
        elif before is not None and after is not None and before != after:
            said.append(f"{LABELS[part]}: {before} -> {after}")
        else:
            said.append(LABELS[part])
    config = [k for k in sorted(set(nearest.config) | set(facts.config)) if nearest.config.get(k) != facts.config.get(k)]
    said += [f"{k}: {nearest.config.get(k, 'unset')} -> {facts.config.get(k, 'unset')}" for k in config[:4]]
    if config[4:]:
        said.append(f"{len(config) - 4} more jax.config values")
    if nearest.signature != facts.signature:
        said.append(inputs_change(nearest, facts, evidence))
    elif nearest.parts[0] != facts.parts[PARTS[0]]:
        marked = "; ".join(interface_change(nearest, facts, evidence).values())
        said.append(f"its computation, with the same input shapes ({inputs.shown(facts.signature)}): {marked or SAME_SHAPES}")
    return said


def _closest_differs(records: list[Record], facts: Facts, evidence: Evidence) -> str:
    """``; the closest entry differs in ...`` (what a ``cannot tell`` still knows), or ""."""
    if not records:
        return ""
    said = differences(closest(records, facts), facts, evidence)
    return f"; the closest entry differs in {'; '.join(said)}" if said else ""


def _file(place: str) -> str:
    return place.rpartition(":")[0]


def _file_here(place: str) -> bool:
    """Whether a place's file is on this process's ``sys.path`` (places are relative to it)."""
    import sys

    file = _file(place)
    if os.path.isabs(file):
        return os.path.isfile(file)
    return any(os.path.isfile(os.path.join(os.path.abspath(entry or "."), file)) for entry in sys.path)


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


TIED_COMPARED = 256  # records of equal distance whose inputs are compared (the most recent)
INTERFACE = ("out", "donated", "sharded")  # what a computation's readable value says of what it takes and gives


def closest(records: list[Record], facts: Facts) -> Record:
    """The record with the fewest parts that differ from ``facts``; among equals, the one whose
    inputs differ least (a float16 run after a batch and a sequence change is told from the float32
    entry of its own sizes, not from the latest), then the most recent."""
    ours = tuple(facts.parts[p] for p in PARTS)
    apart: dict[tuple[str, ...], int] = {}  # the other seven parts, shared by many records: compared once each
    ranked: list[tuple[tuple[int, float, int], Record]] = []
    for i, r in enumerate(records):
        others = r.parts[1:]
        far = apart.get(others)
        if far is None:
            far = apart[others] = sum(a != b for a, b in zip(others, ours[1:], strict=True))
        ranked.append(((far + (r.parts[0] != ours[0]), -r.written, -i), r))  # later in the index: more recent
    best = min(ranked, key=lambda item: item[0])
    tied = sorted((item for item in ranked if item[0][0] == best[0][0]), key=lambda item: item[0])
    same = next((r for _rank, r in tied if r.signature == facts.signature), None)  # the most recent of these inputs
    if len(tied) == 1 or same is not None:
        return same or best[1]
    distance: dict[str, tuple[int, int]] = {}
    for _rank, r in tied[:TIED_COMPARED]:
        if r.signature not in distance:
            distance[r.signature] = inputs.distance(r.signature, facts.signature)
    return min(tied[:TIED_COMPARED], key=lambda item: (distance[item[1].signature], item[0]))[1]


def evicted(removed: tuple[float, str] | None) -> dict[str, Any]:
    when = f" on {time.strftime('%Y-%m-%d %H:%M', time.localtime(removed[0]))}" if removed else ""
    by = removed[1] if removed else "outside"
    detail = {"max_size": f"removed by the cap (max_size){when}: the working set is larger than the cap",
              "prune": f"removed by gkx-autocache prune{when}",
              "verify": f"removed by gkx-autocache verify --repair{when} (it did not load)",
              }.get(by, f"removed outside gkx-autocache{when} (by hand, or another tool): this exact entry was here")
    return {"cause": causes.EVICTED, "detail": detail, "by": by}


def new_here(name: str, evidence: Evidence, place: str = UNKNOWN_PLACE) -> dict[str, Any]:
    """No entry of ``name`` here: its first, or (``upgraded``) the JAX before held it."""
    if len(evidence.removed) >= _index.MAX_REMOVED:  # the index may have forgotten older removals by number
        since = min(when for when, _by in evidence.removed.values())
        horizon = (f"none removed since {time.strftime('%Y-%m-%d %H:%M', time.localtime(since))}; older removals "
                   "are not kept")
    else:
        horizon = f"none removed in the last {int(_index.REMOVED_SECS // 86400)} days"
    return upgraded(name, evidence, place) or {"cause": causes.NEW, "detail": f"no entry of {name} here before ({horizon})"}


def upgraded(name: str, evidence: Evidence, place: str) -> dict[str, Any] | None:
    """Whether this miss is a JAX upgrade's: the directory here held nothing of ``name`` before this
    run, and another version's directory holds entries of it. Said, whatever the function (a
    further shape of JAX's own ``jit_broadcast_in_dim`` too), where its records put that entry's
    code at this function's place; not where they put it elsewhere (another function of the
    name); where there is no record, it cannot tell."""
    other = _other_version(evidence.version_dir, name)
    if other is None:
        return None
    mine = os.path.basename(evidence.version_dir).removeprefix(VERSION_PREFIX)
    theirs = os.path.basename(other).removeprefix(VERSION_PREFIX)
    places = _places_of(other).get(name, set())
    if place != UNKNOWN_PLACE and place in places:
        return {"cause": causes.CHANGED_JAX, "detail": f"JAX {theirs} -> {mine}: the entries of {theirs} are in "
                                                  f"{os.path.basename(other)}/; every entry is compiled once for {mine}"
                                                  + _rebuilt(name, evidence.version_dir, other, theirs, mine)}
    if place != UNKNOWN_PLACE and places - {UNKNOWN_PLACE}:
        return None  # the older version's entries of this name are another function's
    if place == HELPER_PLACE:
        # A name JAX itself jits (no frame of the user's of that name): the older JAX's entries of it,
        # none recorded at a user's function, are its helper's as well.
        return {"cause": causes.CHANGED_JAX, "detail": f"JAX {theirs} -> {mine}: {os.path.basename(other)}/ holds "
                                                  f"entries of {name}, which JAX compiles itself (recorded at no "
                                                  f"function of yours); every entry is compiled once for {mine}"
                                                  + _rebuilt(name, evidence.version_dir, other, theirs, mine)}
    known = ("holds JAX's own helper of that name, and this compile's code has no place to tell it by"
             if places == {HELPER_PLACE} else f"holds entries named {name}, with no record of where their code is")
    return {"cause": causes.CANNOT_TELL, "by": "jax",
            "detail": f"new, or JAX {theirs} -> {mine}: {os.path.basename(other)}/ {known}"}


def _rebuilt(name: str, version_dir: str, other: str, theirs: str, mine: str) -> str:
    """What a rebuild did for ``name`` (SPEC §18), said after a JAX upgrade's miss: the entries of it
    rebuilt here from the older directory's records, none of which this compile is (its module
    lowers differently under this JAX); or that such records wait for a rebuild."""
    try:
        recorded = sum(1 for e in os.listdir(other) if e.startswith(f"{name}-") and e.endswith(RECORD_SIDECAR))
        rebuilt = sum(1 for e in os.listdir(version_dir) if e.startswith(f"{name}-") and e.endswith(COMPILE_SIDECAR)
                      and read_sidecar(os.path.join(version_dir, e))[3]  # (written before its entry: one there)
                      and os.path.exists(os.path.join(version_dir, e[:-len(COMPILE_SIDECAR)] + ENTRY_SUFFIX)))
    except OSError:
        return ""
    if rebuilt:
        return (f"; {rebuilt} of its entries here were rebuilt from the records of {theirs}, and this compile is not "
                f"one of them: its module is not the one {theirs} lowered (JAX {mine} lowers it differently, or its "
                "code changed since)")
    if recorded:
        return f"; {theirs} kept records of {recorded} of its entries: gkx-autocache rebuild compiles them for {mine}"
    return ""


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
    changed = [p for p in PRIORITY if _differs(nearest, facts, evidence, p)]
    if not changed:
        return {"cause": causes.EVICTED, "detail": "this exact key was stored before and is gone", "by": "outside"}
    if "compile_options" in changed and set(changed) <= {"accelerator_config", "compile_options"}:
        options = compile_options_change(
            evidence.readable("compile_options", nearest.parts[PARTS.index("compile_options")]),
            facts.readable.get("compile_options"), "")
        if options["cause"] == causes.CHANGED_DEVICE_ASSIGNMENT:  # another rank's devices, on CPU
            return options
    first = changed[0]
    before = evidence.readable(first, nearest.parts[PARTS.index(first)])
    after = facts.readable.get(first)
    label = LABELS[first]
    with_it = f" (and the {', '.join(LABELS[p] for p in changed[1:])} with it)" if changed[1:] else ""
    if first == "custom_hook":
        old, new = _key.isa_of(before or ""), _key.isa_of(after or "")
        if new is not None and old is None and (before is not None or nearest.parts[PARTS.index(first)] == NO_HOOK):
            return {"cause": causes.BEFORE_CPU_KEYING,
                    "detail": "its entry was written before gkx-autocache keyed CPU entries by the CPU's instruction "
                              "set (or by stock JAX): compiled once more under the new key"}
        if old is not None and new is not None and old != new:
            return {"cause": causes.CHANGED_CPU, "detail": f"built for another CPU: {_isa.difference(old, new)}{with_it}"}
    if first == "compile_options":
        return compile_options_change(before, after, with_it)
    if (tpu := tpu_change(first, before, after)) is not None:
        return {**tpu, "detail": tpu["detail"] + with_it}
    if first == "XLA flags":
        return {"cause": causes.CHANGED_XLA_FLAGS, "detail": f"XLA_FLAGS: {before!r} -> {after!r}{with_it}"}
    if before is None or after is None:
        return {"cause": causes.changed(label), "detail": f"{label} differs (its value was not recorded){with_it}"}
    if before == after:
        return {"cause": causes.changed(label), "detail": f"{label} hashes differently, though it reads {after!r} both "
                                                       f"times{with_it}"}
    return {"cause": causes.changed(label), "detail": f"{label}: {before} -> {after}{with_it}"}


def tpu_change(part: str, before: str | None, after: str | None) -> dict[str, str] | None:
    """A TPU's own change of a key part, said as one: another libtpu build (the backend version's
    last line, ``Built on ... cl/...``), a ``LIBTPU_INIT_ARGS`` flag (by name, where XLA_FLAGS are
    the same), another slice (the devices' ``TPU topology``); None for any other change."""
    if before is None or after is None or before == after:
        return None
    if part == "backend version" and before.startswith("tpu ") and after.startswith("tpu "):
        old, new = before.splitlines(), after.splitlines()
        if old[:-1] == new[:-1] and old[-1].startswith("Built on") and new[-1].startswith("Built on"):
            builds = [re.sub(r" \(\d+\)", "", line) for line in (old[-1], new[-1])]  # (its time in seconds)
            return {"cause": causes.CHANGED_LIBTPU, "detail": f"libtpu rebuilt: {builds[0]} -> {builds[1]}"}
    if part == "XLA flags":
        (old_xla, _, old_tpu), (new_xla, _, new_tpu) = before.partition(LIBTPU_MARK), after.partition(LIBTPU_MARK)
        old_flags, new_flags = _flags(old_tpu), _flags(new_tpu)
        named = [k for k in sorted(set(old_flags) | set(new_flags)) if old_flags.get(k) != new_flags.get(k)]
        if old_xla.strip() == new_xla.strip() and named:
            said = "; ".join(f"{k}: {old_flags.get(k, 'unset')} -> {new_flags.get(k, 'unset')}" for k in named[:4])
            return {"cause": causes.CHANGED_LIBTPU_INIT_ARGS, "detail": f"LIBTPU_INIT_ARGS: {said}{_more(named, 4)}"}
    old_slice, new_slice = _slice(before), _slice(after)
    if part == "accelerator_config" and old_slice and new_slice and old_slice != new_slice:
        return {"cause": causes.CHANGED_TPU_TOPOLOGY, "detail": f"TPU topology: {old_slice} -> {new_slice}"}
    return None


def _flags(text: str) -> dict[str, str]:
    """``--a=1 --b`` as ``{"--a": "1", "--b": "set"}`` (one flag given twice: the later value)."""
    return {name: value if sep else "set" for name, sep, value in (f.partition("=") for f in text.split())}


def _slice(devices: str) -> str:
    return devices.partition("; TPU topology ")[2].partition(";")[0]


def compile_options_change(before: str | None, after: str | None, with_it: str) -> dict[str, Any]:
    """Every compile-options field that differs, by name and value; ``field <n>`` for the rest. On
    CPU the device assignment is in the compile options (JAX strips it from the key on GPU only)."""
    old, new = _options(before), _options(after)
    named = option_fields(before, after)
    # The binding shows the build options both at the top and under executable_build_options: once.
    named = [k for k in named if not (k.startswith(BUILD) and k.removeprefix(BUILD) in named
                                      and (old.get(k), new.get(k)) == (old.get(k.removeprefix(BUILD)),
                                                                       new.get(k.removeprefix(BUILD))))]
    if named == ["device_assignment"]:
        return {"cause": causes.CHANGED_DEVICE_ASSIGNMENT,
                "detail": f"device assignment, in the compile options on CPU: {_short(old.get('device_assignment'))} -> "
                          f"{_short(new.get('device_assignment'))}{with_it}"}
    if set(named) <= set(MESH_FIELDS) and set(named) & {"num_partitions", "num_replicas"}:
        return {"cause": causes.changed("devices"), "by": "mesh", "detail": f"{mesh_change(old, new, named)}{with_it}"}
    if named:
        said = "; ".join(f"{k.removeprefix('executable_build_options.')}: {_pair(old.get(k), new.get(k))}"
                         for k in named[:4])
        return {"cause": causes.CHANGED_COMPILE_OPTIONS, "detail": f"{said}{_more(named, 4)}{with_it}"}
    fields = [k[1:] for k in wire_fields(before, after)]
    if fields:
        return {"cause": causes.CHANGED_COMPILE_OPTIONS,
                "detail": f"field {', '.join(fields[:4])} changed (not one the binding names){with_it}"}
    return {"cause": causes.CHANGED_COMPILE_OPTIONS, "detail": f"they serialise differently{with_it}"}


BUILD = "executable_build_options."
# The compile options JAX derives from the devices a computation is sharded over (a Mesh): none is
# an option someone set.
MESH_FIELDS = ("num_partitions", "num_replicas", "device_assignment")


def mesh_change(old: dict[str, Any], new: dict[str, Any], named: list[str]) -> str:
    """The devices a computation is sharded or replicated over, from the compile options that follow
    them: ``mesh of 8 -> 4 devices (num_partitions 8 -> 4, device_assignment devices 0-7 -> 0-3)``."""
    def size(options: dict[str, Any]) -> str:
        try:
            return str(int(options.get("num_partitions", 1)) * int(options.get("num_replicas", 1)))
        except (TypeError, ValueError):
            return "?"

    said = [f"{k} {_pair(old.get(k), new.get(k))}" for k in MESH_FIELDS[:2] if k in named]
    if "device_assignment" in named:
        ids = [_device_ids(old.get("device_assignment")), _device_ids(new.get("device_assignment"))]
        pair = (f"devices {inputs.ranges(ids[0])} -> {inputs.ranges(ids[1])}" if ids[0] is not None and ids[1] is not None
                else _pair(old.get("device_assignment"), new.get("device_assignment")))
        said.append(f"device_assignment {pair}")
    over = "mesh of" if "num_partitions" in named else "replicas on"  # (pmap's devices: replicas, no mesh)
    return f"{over} {size(old)} -> {size(new)} devices ({', '.join(said)})"


def _device_ids(assignment: Any) -> list[int] | None:
    """The devices of a device assignment as the binding writes it (``DeviceAssignment{replica_count=1,
    computation_count=2, Computation0{0} Computation1{1}}``); None where it was kept in short."""
    text = str(assignment or "")
    if not text.endswith("}}") or " #" in text:
        return None
    return [int(i) for ids in re.findall(r"Computation\d+\{([\d ]+)\}", text) for i in ids.split()]


def _options(readable: str | None) -> dict[str, Any]:
    try:
        found = json.loads(readable or "{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def wire_fields(before: str | None, after: str | None) -> list[str]:
    """The compile options' fields on the wire (``#3.12``) that differ between two readable values."""
    old, new = _options(before), _options(after)
    return [k for k in sorted(set(old) | set(new)) if k.startswith("#") and old.get(k) != new.get(k)]


def option_fields(before: str | None, after: str | None) -> list[str]:
    """The compile-options fields the binding names that differ between two readable values."""
    old, new = _options(before), _options(after)
    return [k for k in sorted(set(old) | set(new)) if not k.startswith("#") and old.get(k) != new.get(k)]


def _pair(before: Any, after: Any) -> str:
    """A field's values before and after; a long one's digest (``#0827376c8096``) only where its
    short form is the same both times."""
    old = _short(None if before is None else runs(str(before)))  # a list by its runs: [True x8]
    new = _short(None if after is None else runs(str(after)))
    if old.split(" #")[0] != new.split(" #")[0]:
        old, new = old.split(" #")[0], new.split(" #")[0]
    return f"{old} -> {new}"


def _short(value: Any) -> str:
    text = "unset" if value is None else str(value)
    text = text.removeprefix("DeviceAssignment")
    if len(text) <= 80:
        return text
    head = text[:77]
    cut = max(head.rfind(", "), head.rfind(" "))  # never inside a value
    return (head[:cut] if cut > 20 else head) + " ..."
