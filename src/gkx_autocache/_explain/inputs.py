"""A computation's inputs as a person reads them (SPEC §13.1): the avals of its ``main`` as JAX
prints them (``f32[8,8], c128[28,28], i32[]``), kept whole where short and, for a model's train
step of hundreds of inputs, as the count of each aval with a digest of the whole list; and two of
them compared, said as a difference (``338 -> 410 inputs: 72 added (f32[16,16] x24, ...)``,
``f32 -> f16 in 336 inputs``), never cut inside a token."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from typing import NamedTuple

WHOLE = 300  # a list of inputs up to this long is kept as it is
SHAPES_KEPT = 64  # the distinct avals a longer list names, with their counts
SHORT, WHOLE_INPUTS = 120, 3  # two lists up to this long, of at most 3 inputs, are shown whole, before and after
SHOWN = 4  # avals (or changes) named in a difference

_COMPLEX = {"f32": "c64", "f64": "c128"}
_KEPT = re.compile(r"^(\d+) inputs: (.*?)(?: and (\d+) more shapes?)? \(#([0-9a-f]+)\)$")
_AVAL = re.compile(r"^([a-z][a-z0-9_]*)\[([^\[\]]*)\]$")


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
    if not text.startswith("("):
        return "?"
    depth = 0
    for at, char in enumerate(text):
        depth += char in "<([{"
        depth -= char in ">)]}"
        if depth == 0:
            return kept([aval(t) for t in _split(text[1:at])])
    return "?"


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


def _counted(n: int, of: str = "") -> str:
    """``3 inputs``, ``1 of 338 inputs``."""
    return f"{n}{of} input{'' if n == 1 and not of else 's'}"


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


def change(before: str, after: str) -> str:
    """What differs between two kept signatures, as a person says it: both lists where short,
    else the difference (inputs added or removed, a dtype or a dimension changed, with counts)."""
    old, new = parse(before), parse(after)
    if (old is not None and new is not None and max(old.total, new.total) <= WHOLE_INPUTS
            and len(before) <= SHORT and len(after) <= SHORT and not _KEPT.match(before) and not _KEPT.match(after)):
        return f"inputs {before} -> {after}"
    if old is None or new is None:
        return f"inputs {_unparsed(before) if old is None else shown(before)} -> " \
               f"{_unparsed(after) if new is None else shown(after)}"
    removed = Counter(old.counts) - Counter(new.counts)
    added = Counter(new.counts) - Counter(old.counts)
    parts = _paired(removed, added, f" of {new.total}" if old.total == new.total else "")
    if added:
        parts.append(f"{sum(added.values())} added ({_listed(added)})")
    if removed:
        parts.append(f"{sum(removed.values())} removed ({_listed(removed)})")
    if not parts:
        parts.append(f"the same {new.total} inputs in another order")
    said = "; ".join(parts)
    partial = "" if old.whole and new.whole else " (counted in part: a list of more than 64 shapes)"
    if old.total != new.total:
        return f"{old.total} -> {new.total} inputs: {said}{partial}"
    return f"{said}{partial}"


def _paired(removed: Counter[str], added: Counter[str], of: str) -> list[str]:
    """Avals that changed into another, taken out of ``removed`` and ``added``: the same shape in
    another dtype (``f32 -> f16 in 336 inputs``), or the same dtype and rank with other dimensions
    (``4 -> 8 in 1 input (i32[4,17] -> i32[8,17])``); ``of``: `` of <n>`` where the count stays."""
    dtypes: Counter[tuple[str, str]] = Counter()
    dims: dict[tuple[tuple[str, str], ...], Counter[tuple[str, str]]] = {}
    for same_shape in (True, False):
        for old in list(removed):
            parsed = _dtype_dims(old)
            if parsed is None:
                continue
            for new in list(added):
                other = _dtype_dims(new)
                if other is None or removed[old] == 0 or added[new] == 0:
                    continue
                if same_shape and other[1] == parsed[1] and other[0] != parsed[0]:
                    n = min(removed[old], added[new])
                    dtypes[(parsed[0], other[0])] += n
                elif not same_shape and other[0] == parsed[0] and len(other[1]) == len(parsed[1]):
                    n = min(removed[old], added[new])
                    moved = tuple((a, b) for a, b in zip(parsed[1], other[1], strict=True) if a != b)
                    dims.setdefault(moved, Counter())[(old, new)] += n
                else:
                    continue
                removed[old] -= n
                added[new] -= n
        removed += Counter()  # (drops the zeros)
        added += Counter()
    said = [f"{a} -> {b} in {_counted(n, of)}" for (a, b), n in dtypes.most_common()]
    for moved, pairs in sorted(dims.items(), key=lambda kv: -sum(kv[1].values())):
        examples = ", ".join(f"{a} -> {b}" + (f" x{n}" if n > 1 else "") for (a, b), n in pairs.most_common(3))
        more = f" and {len(pairs) - 3} more" if len(pairs) > 3 else ""
        head = f"{moved[0][0]} -> {moved[0][1]} in " if len(moved) == 1 else "shape changed in "
        said.append(f"{head}{_counted(sum(pairs.values()), of)} ({examples}{more})")
    return said[:SHOWN] + ([f"and {len(said) - SHOWN} more changes"] if len(said) > SHOWN else [])
