"""A program's manifest (``prefetch.py``): the keys its last run looked up, in order, with their
sizes, how many of the first are in its pack, and its GPU autotune object; signed with the signing
key. Named by a hash of the program (``explain``'s name for the run, less what changes each run),
one a pytest-xdist worker.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
import time
from typing import Any, NamedTuple

from gkx_autocache import _autotune
from gkx_autocache._diagnostics import label
from gkx_autocache._layout import AUTOTUNE_SUFFIX, ENTRY_SUFFIX, MANIFEST_SUFFIX, key_match

MANIFEST_LIMIT = 4 << 20  # the most read of a manifest (about 50 000 keys): a longer one is not used
MANIFEST_KEYS = 20_000  # the most a writer lists
XDIST_WORKERS = 32  # the most sibling workers' manifests a pytest-xdist worker reads


class Program(NamedTuple):
    """This program (its hashed identity), this process's part of it, the part's position, and how
    many parts there are: a pytest-xdist worker is ``gw<n>`` of its session's
    ``PYTEST_XDIST_WORKER_COUNT``, any other process the one part of its program."""

    ident: str
    part: str
    position: int  # (not ``index``: a tuple has one)
    parts: int


def program() -> Program:
    """This process's program and part (``Program``)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        count = min(max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), 1), XDIST_WORKERS)
        index = int(worker[2:]) if worker.startswith("gw") else 0
    except ValueError:
        worker = ""
    if not worker or index >= count:
        return Program(identity(), "", 0, 1)
    return Program(identity(), worker, index, count)


def identity() -> str:
    """What names this program on every machine, hashed (a manifest never shows its arguments):
    ``explain``'s name for the run less the arguments that are paths or long (a Jupyter kernel's
    connection file, a run's output directory: a new name each run), with the working directory's
    name (a checkout's is the same on a CI runner and a laptop); for ``python -c``, its code."""
    words = label().split(" ")
    kept = [w for w in words[1:] if "/" not in w and "\\" not in w and len(w) <= 40]
    try:
        here = os.path.basename(os.getcwd())
    except OSError:
        here = ""
    if words[0] == "-c":  # every `python -c` is one label: the code tells them apart
        orig = [str(a) for a in getattr(sys, "orig_argv", [])]
        at = next((i for i, a in enumerate(orig[1:-1], 1)
                   if a == "-c" or (a[:1] == "-" and a[1:2] != "-" and a.endswith("c"))), None)
        kept.append(_hash(orig[at + 1]) if at is not None else "")
    return _hash("\0".join([words[0], *kept, here]))


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode(errors="surrogatepass")).hexdigest()[:32]


def manifest_name(program: str, part: str) -> str:
    return _hash(f"{program}\0{part}") + MANIFEST_SUFFIX


def autotune_name(manifest: str) -> str:
    return manifest[: -len(MANIFEST_SUFFIX)] + AUTOTUNE_SUFFIX


def encode(keys: list[tuple[str, int]], program: str, secret: bytes | None, packed: int = 0,
           autotune: tuple[str, int] | None = None) -> bytes:
    """A manifest: ``keys`` in order, the first ``packed`` of them in its pack; ``autotune``, the
    SHA-256 and size of the GPU autotune object beside it (``_autotune``)."""
    body: dict[str, Any] = {"v": 1, "program": program, "written": round(time.time(), 3), "keys": keys[:MANIFEST_KEYS],
                            "pack": packed}
    if autotune is not None:
        body["autotune"] = list(autotune)
    if secret is not None:
        body["hmac"] = _mac(secret, body)
    return json.dumps(body, separators=(",", ":")).encode()


def _mac(secret: bytes, body: dict[str, Any]) -> str:
    signed = {name: value for name, value in body.items() if name != "hmac"}
    return hmac.new(secret, json.dumps(signed, sort_keys=True, separators=(",", ":")).encode(), hashlib.sha256).hexdigest()


def decode(data: bytes, secret: bytes | None,
           program: str | None = None) -> tuple[list[tuple[str, int]], int, tuple[str, int] | None]:
    """A manifest's keys, those that name an entry (no path, no separator, not hidden), how many
    of the first are in its pack, and its autotune object's ``(SHA-256, size)`` or None; raises
    ValueError for one that is not a manifest (of ``program``, where given), too long, or (with a
    signing key) not signed by it."""
    if len(data) >= MANIFEST_LIMIT:
        raise ValueError(f"longer than {MANIFEST_LIMIT >> 20} MiB")
    body = json.loads(data)
    if not isinstance(body, dict) or body.get("v") != 1 or not isinstance(body.get("keys"), list):
        raise ValueError("not a manifest")
    if program is not None and body.get("program") != program:
        raise ValueError("another program's manifest")
    if secret is not None:
        said = body.get("hmac")
        if not isinstance(said, str) or not said.isascii() or not hmac.compare_digest(said, _mac(secret, body)):
            raise ValueError("not signed")
    keys = []
    for item in body["keys"][:MANIFEST_KEYS]:
        if (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], int)
                and item[1] > 0 and not item[0].startswith(".")
                and (match := key_match(item[0] + ENTRY_SUFFIX)) and match[0] == item[0]):
            keys.append((item[0], item[1]))
    packed = body.get("pack")
    tuned = body.get("autotune")
    autotune = None
    if (isinstance(tuned, list) and len(tuned) == 2 and isinstance(tuned[0], str) and len(tuned[0]) == 64
            and not tuned[0].strip("0123456789abcdef") and isinstance(tuned[1], int) and not isinstance(tuned[1], bool)
            and 0 < tuned[1] <= _autotune.TOTAL_LIMIT):
        autotune = (tuned[0], tuned[1])
    return keys, packed if isinstance(packed, int) and not isinstance(packed, bool) and packed > 0 else 0, autotune
