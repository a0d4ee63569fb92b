"""A record (``<key>-gkx-record``, SPEC §18): what it takes to compile an entry again without its
program, as bytes: a magic line, the fields as one JSON line (what the compile options are built
from, the devices, the program, the module's size and SHA-256, and with a signing key an
HMAC-SHA256 over all of them), then the module's MLIR bytecode compressed with zlib (the standard
library's: a record is read by another JAX version, whatever compression that one installs).
Everything read is checked: a record is compiled, and a team member or a planted file can hold
anything. A leaf of the rebuild, stdlib only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import zlib
from typing import Any, NamedTuple

MAGIC = b"gkx-autocache record 1\n"
DOMAIN = b"gkx-autocache record v1\0"
FIELDS_LIMIT = 1 << 20  # the most of a record's JSON line read (a model's propagation lists: a few KB)
MODULE_LIMIT = 1 << 30  # the most a module may decompress to
RECORD_LIMIT = 256 << 20  # the most of a record file read (compressed)
KEEP_LIMIT = 64 << 20  # a module larger than this compressed is not recorded (said)


class Record(NamedTuple):
    """A record read back and checked: its fields and its module's bytecode (decompressed)."""

    fields: dict[str, Any]
    module: bytes

    @property
    def program(self) -> str:
        return str(self.fields.get("program", ""))

    @property
    def label(self) -> str:
        return str(self.fields.get("label", ""))

    @property
    def name(self) -> str:
        return str(self.fields.get("name", "?"))


class Refused(Exception):
    """A record that must not be compiled: malformed, altered, or not signed where it must be."""


def encode(fields: dict[str, Any], module: bytes, secret: bytes | None) -> bytes:
    """A record's bytes: ``fields`` with the module's size and digest (and, with ``secret``, the
    HMAC over them), then the compressed module."""
    body = {**fields, "format": 1, "module_bytes": len(module), "module_sha256": hashlib.sha256(module).hexdigest()}
    body.pop("hmac", None)
    if secret is not None:
        body["hmac"] = mac(secret, body)
    line = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    return MAGIC + line + b"\n" + zlib.compress(module, 6)


def mac(secret: bytes, body: dict[str, Any]) -> str:
    fields = {k: v for k, v in body.items() if k != "hmac"}
    return hmac.new(secret, DOMAIN + json.dumps(fields, sort_keys=True, separators=(",", ":")).encode(),
                    hashlib.sha256).hexdigest()


def fields_of(data: bytes) -> dict[str, Any]:
    """The fields of a record's bytes, checked for shape, without its module (a listing reads only
    these). Raises Refused."""
    if not data.startswith(MAGIC):
        raise Refused("not a record")
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + FIELDS_LIMIT)
    if end < 0:
        raise Refused("its fields are cut short")
    try:
        body = json.loads(data[len(MAGIC):end])
    except (ValueError, RecursionError):
        raise Refused("its fields are not valid JSON") from None
    if not isinstance(body, dict) or body.get("format") != 1:
        raise Refused("of an unknown format")
    problem = _shape(body)
    if problem:
        raise Refused(problem)
    return body


def decode(data: bytes, secret: bytes | None) -> Record:
    """The record, checked: its shape; with ``secret``, its signature (a record without one, or with
    one that does not verify, is refused); its module's size and digest. Raises Refused."""
    body = fields_of(data)
    if secret is not None:
        signature = body.get("hmac")
        if not isinstance(signature, str):
            raise Refused("not signed, and a signing key is set")
        if not hmac.compare_digest(signature.encode("ascii", "replace"), mac(secret, body).encode()):
            raise Refused("its signature does not verify under the signing key (altered, or signed with another key)")
    start = data.index(b"\n", len(MAGIC)) + 1
    size = body["module_bytes"]
    try:
        inflate = zlib.decompressobj()
        module = inflate.decompress(data[start:], size + 1)
    except zlib.error as exc:
        raise Refused(f"its module does not decompress ({exc})") from None
    if len(module) != size or not inflate.eof:
        raise Refused("its module is not the size its fields say")
    if hashlib.sha256(module).hexdigest() != body["module_sha256"]:
        raise Refused("its module is not the one its fields name (altered)")
    return Record(body, module)


def _shape(body: dict[str, Any]) -> str | None:
    """What is wrong with a record's fields, or None: each field the rebuild reads, of its type."""
    def ints(value: Any, most: int = 1 << 20) -> bool:
        return isinstance(value, list) and len(value) <= most and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 31 for v in value)

    def flags(value: Any) -> bool:
        return isinstance(value, list) and len(value) <= 1 << 20 and all(isinstance(v, bool) for v in value)

    size = body.get("module_bytes")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MODULE_LIMIT:
        return "its module's size is impossible"
    digest = body.get("module_sha256")
    if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
        return "it names no module digest"
    for name in ("platform", "name", "program", "label", "key"):
        if not isinstance(body.get(name, ""), str) or len(body.get(name, "")) > 400:
            return f"its {name} is not text"
    if not (ints(body.get("devices"), 1 << 16) and body["devices"] and ints(body.get("shape"), 8)):
        return "its devices are not a list of ids"
    for name in ("replicas", "partitions"):
        value = body.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= 1 << 16:
            return f"its {name} is not a count"
    if not isinstance(body.get("tupled"), bool) or not isinstance(body.get("spmd"), bool):
        return "its flags are not booleans"
    if "shardy" in body and not isinstance(body["shardy"], bool):
        return "its flags are not booleans"
    if not flags(body.get("to_parameters")) or not flags(body.get("to_output")):
        return "its sharding propagation lists are not lists of booleans"
    overrides = body.get("overrides")
    if not isinstance(overrides, list) or len(overrides) > 1000 or not all(
            isinstance(o, list) and len(o) == 2 and isinstance(o[0], str) and isinstance(o[1], (str, bool, int, float))
            for o in overrides):
        return "its compiler options are not name-value pairs"
    efforts = body.get("efforts", {})
    if not isinstance(efforts, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                for v in efforts.values()):
        return "its efforts are not numbers"
    for name in ("compile", "written"):
        value = body.get(name, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1e11:
            return f"its {name} time is not a time"
    return None


def identity(record: Record) -> str:
    """What two records that make the same compile share (one from each directory is one rebuild)."""
    fields = {k: v for k, v in record.fields.items()
              if k not in ("hmac", "key", "compile", "written", "program", "label", "jax", "jaxlib")}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
