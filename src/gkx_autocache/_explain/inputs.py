"""A computation's inputs as a person reads them (SPEC §13.1): the avals of its ``main`` as JAX
prints them (``f32[8,8], c128[28,28], i32[]``), kept whole where short and, for a model's train
step of hundreds of inputs, as the count of each aval with a digest of the whole list (and their
order, in short); and two of them compared, said as a difference (``338 -> 410 inputs: 72 added
(f32[16,16] x24, ...)``, ``f32 -> f16 in 336 inputs``), never cut inside a token. Two lists whose
order is known are aligned first, so that layers inserted are added, not other layers' shapes
changed. The same for its outputs, and for what the module marks on each input: donated, sharded.
"""

from __future__ import annotations

import base64
import hashlib
import re
import zlib
from collections import Counter
from typing import Any, NamedTuple

WHOLE = 300  # a list of inputs up to this long is kept as it is
SHAPES_KEPT = 64  # the distinct avals a longer list names, with their counts
SHORT, WHOLE_INPUTS = 120, 3  # two lists up to this long, of at most 3 inputs, are shown whole, before and after
SHOWN = 4  # avals (or changes) named in a difference

_COMPLEX = {"f32": "c64", "f64": "c128"}
_KEPT = re.compile(r"^(\d+) inputs: (.*?)(?: and (\d+) more shapes?)? \(#([0-9a-f]+)\)$")
_AVAL = re.compile(r"^([a-z][a-z0-9_]*)\[([^\[\]]*)\]$")
_PLAIN = re.compile(r"tensor<((?:\d+x)*)([a-z][a-z0-9_]*)>")  # tensor<8x8xf32>: its dimensions, its dtype


def _split(text: str) -> list[str]:
    """``text`` split at its commas outside brackets: ``tensor<8x8xf32>, tensor<2xcomplex<f64>>``."""
    if text.count("<") == text.count("tensor<") and not any(c in text for c in "([{#"):
        return [item.strip() for item in text.split(",") if item.strip()]  # no brackets nested (as most are)
    items, depth, start = [], 0, 0
    for at, char in enumerate(text):
        if char in "<([{":
            depth += 1
        elif char in ">)]}":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:at].strip())
            start = at + 1
    if text[start:].strip():
        items.append(text[start:].strip())
    return items


def aval(mlir_type: str) -> str:
    """``tensor<8x8xf32>`` as ``f32[8,8]``, ``tensor<28x28xcomplex<f64>>`` as ``c128[28,28]``;
    a type that is not a ranked tensor (a token) as MLIR writes it."""
    plain = _PLAIN.fullmatch(mlir_type)
    if plain is not None:  # (nearly every type: one match, not the parse below)
        return f"{plain[2]}[{plain[1][:-1].replace('x', ',')}]"
    if not (mlir_type.startswith("tensor<") and mlir_type.endswith(">")):
        return mlir_type
    body = _split(mlir_type[len("tensor<"):-1])[0]  # (an encoding after a comma is not the shape)
    complex_at = body.find("complex<")
    if complex_at >= 0:
        dims, dtype = body[:complex_at].rstrip("x"), "c" + body[complex_at + 8:-1]
        dtype = _COMPLEX.get(dtype[1:], dtype)
    else:
        *shape, dtype = body.split("x")
        dims = "x".join(shape)
    return f"{dtype}[{dims.replace('x', ',')}]"


def of_function_type(text: str) -> str:
    """The inputs of a ``function_type`` (``(tensor<8xf32>, tensor<i32>) -> tensor<f32>``), kept."""
    found = types_of(text)
    return "?" if found is None else kept(found[0])


def types_of(text: str) -> tuple[list[str], list[str]] | None:
    """The avals of a ``function_type``'s inputs and of its results; None where it is not one."""
    if not text.startswith("("):
        return None
    at = text.find(") -> ")
    if at < 0 or "(" in text[1:at]:  # (a type with parentheses in it: found by its depth, char by char)
        at = _closing(text)
        if at < 0:
            return None
    results = text[at + 1:].strip().removeprefix("->").strip()
    if results.startswith("(") and results.endswith(")"):
        results = results[1:-1]
    return [aval(t) for t in _split(text[1:at])], [aval(t) for t in _split(results)]


def _closing(text: str) -> int:
    """Where the bracket that opens ``text`` closes; -1 where it does not."""
    depth = 0
    for at, char in enumerate(text):
        depth += char in "<([{"
        depth -= char in ">)]}"
        if depth == 0:
            return at
    return -1


ORDER_KEPT = 4096  # the most characters of a long list's order kept (40 for a GPT-like train step of 338 inputs)


def order_of(avals: list[str]) -> str | None:
    """The order of a list too long to keep whole (``kept`` counts its avals): each input as the
    number of its aval among the distinct ones, compressed (a model's layers repeat: 338 inputs in
    some 40 characters); None where the list is kept whole, or names more avals than it keeps."""
    if len(", ".join(avals)) <= WHOLE:
        return None
    distinct = {a: i for i, a in enumerate(dict.fromkeys(avals))}
    if len(distinct) > SHAPES_KEPT:
        return None
    code = base64.b85encode(zlib.compress(bytes(distinct[a] for a in avals), 9)).decode()
    return code if len(code) <= ORDER_KEPT else None


def listed(signature: str, order: str | None = None) -> list[str] | None:
    """A kept signature's avals in order: a whole one as it is; a long one from its ``order_of``,
    only where that gives this very list back (its digest); None where it cannot be known."""
    match = _KEPT.match(signature)
    if match is None:
        found = parse(signature)
        return None if found is None else _split(signature)
    counted = parse(signature)
    if order is None or counted is None or not counted.whole:
        return None
    names = list(counted.counts)
    try:
        raw = zlib.decompressobj().decompress(base64.b85decode(order), counted.total + 1)
    except (ValueError, zlib.error):
        return None
    if len(raw) != counted.total or any(i >= len(names) for i in raw):
        return None
    avals = [names[i] for i in raw]
    return avals if kept(avals) == signature else None


def ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2,5``."""
    said: list[str] = []
    for i in sorted(indices):
        if said and "-" in said[-1] and int(said[-1].rpartition("-")[2]) == i - 1:
            said[-1] = f"{said[-1].rpartition('-')[0]}-{i}"
        elif said and "-" not in said[-1] and int(said[-1]) == i - 1:
            said[-1] = f"{said[-1]}-{i}"
        else:
            said.append(str(i))
    return ",".join(said)


def indices(text: str, limit: int = 1 << 16) -> list[int] | None:
    """``0-2,5`` as ``[0, 1, 2, 5]``; None where it is not one (or names more than ``limit``)."""
    found: list[int] = []
    try:
        for item in text.split(","):
            low, _, high = item.partition("-")
            found.extend(range(int(low), int(high or low) + 1))
            if len(found) > limit:
                return None
    except ValueError:
        return None
    return found


def kept(avals: list[str]) -> str:
    """The list of avals as the index keeps it: whole where short; else each aval's count, in order
    of first use, and a digest of the whole list (so that two lists are the same only where equal)."""
    whole = ", ".join(avals)
    if len(whole) <= WHOLE:
        return whole
    counts = Counter(avals)
    named = [f"{a} x{n}" if n > 1 else a for a, n in list(counts.items())[:SHAPES_KEPT]]
    more = len(counts) - len(named)
    rest = f" and {more} more shape{'s' if more > 1 else ''}" if more else ""
    return f"{len(avals)} inputs: {', '.join(named)}{rest} (#{hashlib.sha256(whole.encode()).hexdigest()[:12]})"


class Inputs(NamedTuple):
    """A kept list of inputs, read back: how many, each aval's count, whether every aval is counted."""

    total: int
    counts: dict[str, int]
    whole: bool


def parse(signature: str) -> Inputs | None:
    """A kept signature read back; None where it cannot be (``?``, or an older gkx-autocache's,
    which cut long lists)."""
    match = _KEPT.match(signature)
    if match is not None:
        counts: dict[str, int] = {}
        for item in match[2].split(", "):
            name, _, times = item.rpartition(" x")
            if name and times.isdigit():
                counts[name] = int(times)
            else:
                counts[item] = 1
        return Inputs(int(match[1]), counts, match[3] is None)
    if signature == "?" or signature.endswith(" inputs)") or "..." in signature:
        return None
    avals = _split(signature)
    return Inputs(len(avals), dict(Counter(avals)), True)


def count_of(signature: str) -> int | None:
    inputs = parse(signature)
    return None if inputs is None else inputs.total


def shown(signature: str) -> str:
    """A kept signature as said in a sentence: a long one by its count and first avals; none as none."""
    match = _KEPT.match(signature)
    if match is None:
        return signature or "none"
    items = match[2].split(", ")
    more = len(items) - 3 + int(match[3] or 0)
    rest = f" and {more} more shape{'s' if more > 1 else ''}" if more > 0 else ""
    return f"{match[1]} inputs: {', '.join(items[:3])}{rest}"


def _unparsed(signature: str) -> str:
    return "?" if signature == "?" else "(recorded in part, by an older gkx-autocache)"


def _counted(n: int, of: str = "", noun: str = "inputs") -> str:
    """``3 inputs``, ``1 of 338 inputs``."""
    return f"{n}{of} {noun.removesuffix('s') if n == 1 and not of else noun}"


def _listed(counts: Counter[str] | dict[str, int], limit: int = SHOWN) -> str:
    items = [f"{a} x{n}" if n > 1 else a for a, n in list(counts.items())[:limit]]
    more = len(counts) - len(items)
    return ", ".join(items) + (f" and {more} more shape{'s' if more > 1 else ''}" if more > 0 else "")


def _dtype_dims(value: str) -> tuple[str, list[str]] | None:
    match = _AVAL.match(value)
    if match is None:
        return None
    return match[1], match[2].split(",") if match[2] else []


def distance(before: str, after: str) -> tuple[int, int]:
    """How many inputs differ between two kept signatures in their shapes, then in their avals
    (a dtype change alone is nearer than other shapes: float32 -> bfloat16 is told from the entry
    of its own sizes); large where either cannot be read."""
    old, new = parse(before), parse(after)
    if old is None or new is None:
        return 1 << 30, 1 << 30

    def apart(a: dict[str, int], b: dict[str, int]) -> int:
        return max(sum((Counter(a) - Counter(b)).values()), sum((Counter(b) - Counter(a)).values()))

    def shapes(counts: dict[str, int]) -> dict[str, int]:
        found: Counter[str] = Counter()
        for aval_, n in counts.items():
            found[aval_[aval_.find("["):]] += n
        return found

    return apart(shapes(old.counts), shapes(new.counts)), apart(old.counts, new.counts)


def change(before: str, after: str, orders: tuple[str | None, str | None] = (None, None), noun: str = "inputs") -> str:
    """What differs between two kept signatures, as a person says it: both lists where short,
    else the difference (inputs added or removed, a dtype or a dimension changed, with counts).
    Where the order of both is known (``orders``, for lists kept by their counts), they are aligned
    first: what was inserted is added, and only what stands in another's place is paired with it."""
    old, new = parse(before), parse(after)
    if (old is not None and new is not None and max(old.total, new.total) <= WHOLE_INPUTS
            and len(before) <= SHORT and len(after) <= SHORT and not _KEPT.match(before) and not _KEPT.match(after)):
        return f"{noun} {before or 'none'} -> {after or 'none'}"
    if old is None or new is None:
        return f"{noun} {_unparsed(before) if old is None else shown(before)} -> " \
               f"{_unparsed(after) if new is None else shown(after)}"
    first, second = listed(before, orders[0]), listed(after, orders[1])
    # (the same avals in another order are said so, not paired place by place)
    aligned = (_aligned(first, second) if first is not None and second is not None and old.counts != new.counts
               else None)
    if aligned is not None:
        pairs, removed, added = aligned
    else:
        removed = Counter(old.counts) - Counter(new.counts)
        added = Counter(new.counts) - Counter(old.counts)
        pairs = _pairs(removed, added, set(old.counts) - set(new.counts), set(new.counts) - set(old.counts))
    parts = _said(pairs, f" of {new.total}" if old.total == new.total else "", noun)
    if added:
        parts.append(f"{sum(added.values())} added ({_listed(_in_order(added, new.counts))})")
    if removed:
        parts.append(f"{sum(removed.values())} removed ({_listed(_in_order(removed, old.counts))})")
    if not parts:
        parts.append(f"the same {new.total} {noun} in another order")
    said = "; ".join(parts)
    partial = "" if old.whole and new.whole else " (counted in part: a list of more than 64 shapes)"
    if old.total != new.total:
        return f"{old.total} -> {new.total} {noun}: {said}{partial}"
    return f"{said}{partial}"


def _in_order(counts: Counter[str], order: dict[str, int]) -> Counter[str]:
    """``counts`` in the order of the avals' first use in their list (``order``: its counts)."""
    first = {a: i for i, a in enumerate(order)}
    return Counter({a: counts[a] for a in sorted(counts, key=lambda a: first.get(a, len(first)))})


MAX_EDITS = 512  # the most inputs inserted or removed that two lists are aligned for (beyond it: by their counts)


def _aligned(first: list[str], second: list[str]) -> tuple[Counter[tuple[str, str]], Counter[str], Counter[str]] | None:
    """Two lists of avals aligned: the pairs of avals that stand in each other's place, and what
    was removed and added. Lists of one length are compared place by place; others by their
    longest common subsequence (layers inserted in a model's parameters, and in the optimizer's
    copies of them, are each an insertion), and what is left between two common runs is paired
    as ``_pairs`` pairs it. None where they differ in more than ``MAX_EDITS`` places."""
    pairs: Counter[tuple[str, str]] = Counter()
    removed: Counter[str] = Counter()
    added: Counter[str] = Counter()
    vanished, appeared = set(first) - set(second), set(second) - set(first)
    if len(first) == len(second):
        blocks = [([a], [b]) for a, b in zip(first, second, strict=True) if a != b]
    else:
        found = _blocks(first, second)
        if found is None:
            return None
        blocks = found
    for gone, new in blocks:
        if len(gone) == len(new):
            for a, b in zip(gone, new, strict=True):
                if _pairable(a, b):
                    pairs[(a, b)] += 1
                else:
                    removed[a] += 1
                    added[b] += 1
            continue
        left, right = Counter(gone), Counter(new)
        pairs.update(_pairs(left, right, vanished, appeared))
        removed.update(left)
        added.update(right)
    return pairs, removed, added


def _blocks(first: list[str], second: list[str]) -> list[tuple[list[str], list[str]]] | None:
    """What differs between two lists, as runs of (removed, added) between their common runs: the
    shortest edit script (Myers' greedy algorithm, in O((N + M) D) for D edits); None beyond
    ``MAX_EDITS``."""
    ids: dict[str, int] = {}
    a = [ids.setdefault(x, len(ids)) for x in first]
    b = [ids.setdefault(x, len(ids)) for x in second]
    n, m = len(a), len(b)
    offset = MAX_EDITS + 1
    v = [0] * (2 * offset + 1)
    trace: list[list[int]] = []
    for d in range(min(n + m, MAX_EDITS) + 1):
        trace.append(v[offset - d - 1:offset + d + 2])
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[offset + k - 1] < v[offset + k + 1]):
                x = v[offset + k + 1]
            else:
                x = v[offset + k - 1] + 1
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x += 1
                y += 1
            v[offset + k] = x
            if x >= n and y >= m:
                return _backtrack(trace, first, second, d, k)
    return None


def _backtrack(trace: list[list[int]], first: list[str], second: list[str], d: int, k: int) -> list[tuple[list[str], list[str]]]:
    """The runs of the edit script ``_blocks`` found, walked back from its end: ``trace[e]`` is the
    frontier as step ``e`` began (the furthest x on diagonals ``-e-1 .. e+1``)."""
    edits: list[tuple[bool, int, int]] = []  # (an insertion, x, y where it starts), the last first
    for e in range(d, 0, -1):
        row = trace[e]
        down = k == -e or (k != e and row[k + e] < row[k + e + 2])
        k = k + 1 if down else k - 1
        x = row[k + e + 1]
        edits.append((down, x, x - k))
    blocks: list[tuple[list[str], list[str]]] = []
    end = (-1, -1)
    for down, x, y in reversed(edits):
        if (x, y) != end:  # something common between this edit and the one before: another run
            blocks.append(([], []))
        if down:
            blocks[-1][1].append(second[y])
            end = (x, y + 1)
        else:
            blocks[-1][0].append(first[x])
            end = (x + 1, y)
    return blocks


def _pairable(old: str, new: str) -> bool:
    """Whether one aval may have become the other: the same shape in another dtype, or the same
    dtype and rank with other dimensions."""
    a, b = _dtype_dims(old), _dtype_dims(new)
    return a is not None and b is not None and a != b and (a[1] == b[1] or (a[0] == b[0] and len(a[1]) == len(b[1])))


def _pairs(removed: Counter[str], added: Counter[str], vanished: set[str], appeared: set[str]) -> Counter[tuple[str, str]]:
    """Avals that changed into another, taken out of ``removed`` and ``added``: first the same shape
    in another dtype, then the same dtype and rank with other dimensions. An aval gone from the
    whole list (``vanished``) is paired first with one new to it (``appeared``), then with the one
    that differs in the fewest dimensions: with two layers added and the sequence shortened, the
    position table f32[12,16] became f32[8,16], not a layer's f32[16,16], of which there are more."""
    pairs: Counter[tuple[str, str]] = Counter()
    for same_shape in (True, False):
        for old in list(removed):
            parsed = _dtype_dims(old)
            if parsed is None:
                continue
            while removed[old] > 0:
                candidates = []
                for at, new in enumerate(added):
                    other = _dtype_dims(new)
                    if other is None or added[new] == 0 or not _pairable(old, new):
                        continue
                    if (other[1] == parsed[1]) != same_shape:
                        continue
                    apart = sum(x != y for x, y in zip(parsed[1], other[1], strict=True))
                    both = (old in vanished) + (new in appeared)
                    candidates.append((-both, apart, removed[old] != added[new], at, new))
                if not candidates:
                    break
                new = min(candidates)[-1]
                n = min(removed[old], added[new])
                pairs[(old, new)] += n
                removed[old] -= n
                added[new] -= n
        removed += Counter()  # (drops the zeros)
        added += Counter()
    return pairs


def _said(pairs: Counter[tuple[str, str]], of: str, noun: str = "inputs") -> list[str]:
    """Pairs of avals as a person says them: a dtype changed (``f32 -> f16 in 336 inputs``), or a
    dimension (``4 -> 8 in 1 input (i32[4,17] -> i32[8,17])``); ``of``: `` of <n>`` where the count
    stays."""
    dtypes: Counter[tuple[str, str]] = Counter()
    dims: dict[tuple[tuple[str, str], ...], Counter[tuple[str, str]]] = {}
    for (old, new), n in pairs.items():
        a, b = _dtype_dims(old), _dtype_dims(new)
        if a is None or b is None:
            continue
        if a[1] == b[1]:
            dtypes[(a[0], b[0])] += n
        else:
            moved = tuple((x, y) for x, y in zip(a[1], b[1], strict=True) if x != y)
            dims.setdefault(moved, Counter())[(old, new)] += n
    said = [f"{a} -> {b} in {_counted(n, of, noun)}" for (a, b), n in dtypes.most_common()]
    for moved, found in sorted(dims.items(), key=lambda kv: -sum(kv[1].values())):
        examples = ", ".join(f"{a} -> {b}" + (f" x{n}" if n > 1 else "") for (a, b), n in found.most_common(3))
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        head = f"{moved[0][0]} -> {moved[0][1]} in " if len(moved) == 1 else "shape changed in "
        said.append(f"{head}{_counted(sum(found.values()), of, noun)} ({examples}{more})")
    return said[:SHOWN] + ([f"and {len(said) - SHOWN} more changes"] if len(said) > SHOWN else [])


def interface_change(before: dict[str, Any], after: dict[str, Any], signature: str) -> dict[str, str]:
    """What differs between two computations of the same inputs (``signature``) in what their
    ``main`` marks on the inputs and gives back (``facts.interface_of``), as a person says it, by
    kind: ``donated``, ``sharded``, ``out``; empty where nothing differs, or either was recorded
    without it (an older gkx-autocache's)."""
    if not isinstance(before.get("out"), str) or not isinstance(after.get("out"), str):
        return {}
    avals = listed(signature, after.get("order") if isinstance(after.get("order"), str) else None)
    total = count_of(signature) or 0
    said: dict[str, str] = {}
    old, new = _donated(before), _donated(after)
    if old is not None and new is not None and old != new:
        changed = sorted(old ^ new)
        said["donated"] = (f"donated inputs: {len(old) or 'none'} -> {len(new) or 'none'} of {total}"
                           f"{_avals_at(avals, changed)}")
    old_sharded, new_sharded = _sharded(before), _sharded(after)
    if old_sharded != new_sharded:
        if isinstance(old_sharded, dict) and isinstance(new_sharded, dict):
            moves: dict[tuple[str, str], list[int]] = {}
            for i in sorted(set(old_sharded) | set(new_sharded)):
                pair = (old_sharded.get(i, UNSPECIFIED), new_sharded.get(i, UNSPECIFIED))
                if pair[0] != pair[1]:
                    moves.setdefault(pair, []).append(i)
            said["sharded"] = "; ".join(f"the sharding of {_counted(len(at), f' of {total}')}: {a} -> {b}"
                                        f"{_avals_at(avals, at)}" for (a, b), at in list(moves.items())[:SHOWN])
            if len(moves) > SHOWN:
                said["sharded"] += f"; and {len(moves) - SHOWN} more sharding changes"
        else:
            said["sharded"] = "the inputs' shardings differ (more kinds than are kept by name)"
    if before["out"] != after["out"]:
        said["out"] = change(before["out"], after["out"], noun="outputs")
    return said


UNSPECIFIED = "unspecified"  # an input the module gives no sharding


def _donated(said: dict[str, Any]) -> set[int] | None:
    found = indices(said["donated"]) if isinstance(said.get("donated"), str) else []
    return None if found is None else set(found)


def _sharded(said: dict[str, Any]) -> dict[int, str] | str | None:
    """Each input's sharding (index -> as said); a digest where there were too many to keep."""
    kept_ = said.get("sharded")
    if isinstance(kept_, str):
        return kept_
    found: dict[int, str] = {}
    for item in kept_ if isinstance(kept_, list) else []:
        if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], str):
            for i in indices(item[1]) or []:
                found[i] = item[0]
    return found


def _avals_at(avals: list[str] | None, at: list[int]) -> str:
    """`` (f32[64,16], f32[64])``: the avals of the inputs at ``at``, where the list is known."""
    if avals is None or any(i >= len(avals) for i in at):
        return ""
    return f" ({_listed(Counter(avals[i] for i in at))})"
