"""Packs (SPEC §14, prefetch): beside its manifest in a bucket, a writer's run leaves one object
holding the first of the manifest's entries, each with its seal, so that a fresh machine reads
them in one request rather than two an entry. On a 2-core machine those requests' own CPU, the
client's and the server's, kept a fresh run of 500 entries at 1.65 x a local warm one.

A pack is transport, never trust: each record is checked as the entry read alone would be (its
seal, its signature, its size, its SHA-256, then the store's checks), and one that fails is left
to its own reads. Its form: ``GKXPACK1``, then records, each a header (the lengths of the key, the
seal and the entry: big-endian 2, 4 and 8 bytes), the key, the seal, the entry.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable

from gkx_autocache._layout import ENTRY_SUFFIX, MANIFEST_SUFFIX, PACK_SUFFIX, key_match
from gkx_autocache._shared.seal import SEAL_LIMIT

MAGIC = b"GKXPACK1"
HEAD = struct.Struct(">HIQ")
LIMIT = 128 << 20  # the most a writer packs (held in memory at its exit); what is beyond is read entry by entry
KEY_MOST = 512
CHUNK = 4 << 20  # a record read past is read in parts of this at most


def name_for(manifest: str) -> str:
    return manifest[: -len(MANIFEST_SUFFIX)] + PACK_SUFFIX


def build(records: Iterable[tuple[str, bytes, bytes]], limit: int = LIMIT) -> tuple[bytes, list[str]]:
    """A pack of ``(key, seal, entry)`` in order, up to ``limit`` bytes, and the keys it holds."""
    parts, keys, size = [MAGIC], [], len(MAGIC)
    for key, seal, data in records:
        name = key.encode()
        grown = size + HEAD.size + len(name) + len(seal) + len(data)
        if grown > limit:
            break
        parts += [HEAD.pack(len(name), len(seal), len(data)), name, seal, data]
        keys.append(key)
        size = grown
    return b"".join(parts), keys


class Malformed(ValueError):
    """Not a pack, or one cut short: what is left of it goes to the entries' own reads."""


class Reader:
    """A pack read as it arrives: ``take(n)`` gives its next ``n`` bytes (fewer only at its end);
    ``consumed``, the bytes read so far."""

    def __init__(self, take: Callable[[int], bytes]) -> None:
        self._take = take
        self.consumed = 0
        if self.take(len(MAGIC)) != MAGIC:
            raise Malformed("not a pack")

    def take(self, n: int) -> bytes:
        data = self._take(n)
        self.consumed += len(data)
        return data

    def next(self, max_entry: int) -> tuple[str, bytes, int] | None:
        """The next record's ``(key, seal, entry size)``, its entry left to ``body`` or ``skip``;
        None at the pack's end. Raises Malformed."""
        head = self.take(HEAD.size)
        if not head:
            return None
        if len(head) != HEAD.size:
            raise Malformed("a record's header cut short")
        key_size, seal_size, size = HEAD.unpack(head)
        if not 0 < key_size <= KEY_MOST or not 0 < seal_size <= SEAL_LIMIT or not 0 < size <= max_entry:
            raise Malformed(f"a record of impossible sizes ({key_size}, {seal_size}, {size})")
        name = self.take(key_size)
        try:
            key = name.decode("ascii")
        except UnicodeDecodeError:
            raise Malformed("a record's key is not ASCII") from None
        if key.startswith(".") or (match := key_match(key + ENTRY_SUFFIX)) is None or match[0] != key:
            raise Malformed("a record's key names no entry")
        seal = self.take(seal_size)
        if len(seal) != seal_size:
            raise Malformed("a record's seal cut short")
        return key, seal, size

    def body(self, size: int) -> bytes:
        data = self.take(size)
        if len(data) != size:
            raise Malformed("an entry cut short")
        return data

    def skip(self, size: int) -> None:
        while size > 0:
            chunk = self.take(min(size, CHUNK))
            if not chunk:
                raise Malformed("an entry cut short")
            size -= len(chunk)
