"""Seals of shared entries (``<key>-gkx-shared``): written beside each entry, with a signing key
an HMAC-SHA256 over them; read back checked for shape. EntryRefused: an entry there that must not be
served. Design: docs/how-it-works.md.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from gkx_autocache._backends.port import Refused as EntryRefused
from gkx_autocache._diagnostics import shown
from gkx_autocache._formats import MAX_COMPILE_SECS, SEAL_LIMIT, compression_of

__all__ = ["SEAL_LIMIT", "EntryRefused", "head_problem", "mac", "make_seal", "read_seal"]
SEAL_FORMAT = 1
DOMAIN = b"gkx-autocache shared entry v1\0"

# EntryRefused: the port's ``Refused`` (the entry is there but must not be served: a miss, named
# ``rejected: <why>``), raised by the backends and by the checks here alike.


def seal_body(key: str, data: bytes, compile_secs: float | None, written: float) -> dict[str, Any]:
    return {"format": SEAL_FORMAT, "key": key, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "compile": None if compile_secs is None else round(compile_secs, 6), "written": round(written, 3)}


def mac(secret: bytes, body: dict[str, Any]) -> str:
    """HMAC-SHA256 over the seal's fields (the key, the entry's size and SHA-256, so its bytes, the
    compile time and the write time), in one canonical form."""
    fields = {k: v for k, v in body.items() if k != "hmac"}
    message = DOMAIN + json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def make_seal(key: str, data: bytes, compile_secs: float | None, written: float, secret: bytes | None) -> bytes:
    body = seal_body(key, data, compile_secs, written)
    if secret is not None:
        body["hmac"] = mac(secret, body)
    return json.dumps(body, separators=(",", ":")).encode()


def read_seal(raw: bytes, key: str, limit: int) -> dict[str, Any]:
    """The seal's fields, checked for shape (a bucket or a team member can write anything there).
    Raises EntryRefused."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise EntryRefused("the shared entry's seal is not valid JSON") from None
    if not isinstance(body, dict) or body.get("format") != SEAL_FORMAT:
        raise EntryRefused("the shared entry's seal is of an unknown format")
    size, digest = body.get("bytes"), body.get("sha256")
    if body.get("key") != key:
        raise EntryRefused("the shared entry's seal names another key")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= limit:
        raise EntryRefused(f"the shared entry's seal gives an impossible size ({shown(size)})")
    if not _hex64(digest):
        raise EntryRefused("the shared entry's seal has no SHA-256")
    if "hmac" in body and not _hex64(body["hmac"]):  # compare_digest raises on a non-ASCII string
        raise EntryRefused("the shared entry's seal has a malformed signature")
    for name, most in (("compile", MAX_COMPILE_SECS), ("written", 1e11)):  # a claim beyond them is no figure
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 <= value <= most):
            body[name] = None
    return body


def _hex64(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def head_problem(head: bytes) -> str | None:
    """Why an entry's first bytes cannot begin an executable JAX wrote (it compresses each with
    zstd or zlib), or None: a planted file of zeros is refused before the rest is read."""
    return None if compression_of(head[:4]) else "the shared entry is not a compressed executable"

