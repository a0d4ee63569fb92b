"""Reading a pack (``pack.py``'s format) into the local level for a prefetch (``prefetch.py``):
one request for the first 128 MiB of the entries its manifest lists, each record checked as the
entry read alone, and landed as a worker's fetch would be.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gkx_autocache._diagnostics import logger
from gkx_autocache._entry import Entry
from gkx_autocache._shared import pack
from gkx_autocache._shared.calls import ShuttingDown, bounded, describe
from gkx_autocache._shared.channel import Channel
from gkx_autocache._shared.flights import Flights
from gkx_autocache._shared.manifest import MANIFEST_KEYS
from gkx_autocache._shared.reads import Reader
from gkx_autocache._shared.seal import EntryRefused, head_problem


class Unpack:
    """The packs of one prefetch: read through ``channel``, checked by ``reader``, the keys taken
    from ``flights``; ``has(key)``: the entry is in the local level already; ``land``: the
    prefetch's landing of one checked entry."""

    def __init__(self, channel: Channel, reader: Reader, flights: Flights, has: Callable[[str], bool],
                 land: Callable[[str, int, Entry], None]) -> None:
        self.channel = channel
        self.reader = reader
        self.flights = flights
        self.has = has
        self.land = land

    def read(self, name: str) -> None:
        """One pack: each read of it bounded like a lookup's (a stall or a refused connection turns
        the level off); any other fault ends this pack only, what it held going to the workers.
        Landing is not bounded: it is this machine's work, not the endpoint's."""
        channel = self.channel
        try:
            stream = bounded(lambda progress: channel.backend.stream(name, channel.timeout), channel.timeout)
            channel.count(requests=1)
            if stream is None:
                return
            try:
                self.records(pack.Reader(stream.take))
            finally:
                stream.close()
        except ShuttingDown:
            self.flights.halt()
        except Exception as exc:
            if not channel.fault(exc):  # (a stall or a refused connection turns the level off)
                logger.debug("the pack %s is not read on: %s", name, describe(exc))

    def records(self, reader: pack.Reader) -> None:
        """Each record, in the pack's order: one still wanted is checked and landed as a worker's
        fetch would be (its lookup waits for it meanwhile); any other is read past. No more than
        a writer packs is read: ``pack.LIMIT`` bytes, ``MANIFEST_KEYS`` records."""
        channel = self.channel
        for _ in range(MANIFEST_KEYS):
            if not self.flights.packed or self.flights.stopped or channel.closed or channel.off is not None:
                return
            if (record := reader.next(min(self.reader.max_entry, pack.LIMIT))) is None:
                return
            key, raw_seal, size = record
            if reader.consumed + size > pack.LIMIT:
                raise pack.Malformed(f"longer than a pack is written ({pack.LIMIT >> 20} MiB)")
            event = self.flights.take_record(key, size, self.has(key))  # (a sibling's, meanwhile: outside the lock)
            if event is None:
                reader.skip(size)
                continue
            again = True  # (a record cut short, or refused: the entry's own object may be sound)
            try:
                again = self._record(key, raw_seal, size, reader)
            finally:
                self.flights.release(key, size, event, again)
        raise pack.Malformed(f"more than {MANIFEST_KEYS} records")

    def _record(self, key: str, raw_seal: bytes, size: int, reader: pack.Reader) -> bool:
        """Check and land one record; whether it was refused (its key then goes to the workers)."""
        channel = self.channel
        started = time.perf_counter()
        try:
            seal = self.reader.admit(key, raw_seal)
            if seal is None or seal["bytes"] != size:
                raise EntryRefused("the pack's record and its seal give different sizes")
        except EntryRefused as exc:
            reader.skip(size)
            logger.debug("the pack's record of %s is not used: %s", key, exc)
            return True
        data = reader.body(size)
        try:
            if why := head_problem(data):
                raise EntryRefused(why)
            found = self.reader.found(key, seal, data, raw_seal)
        except EntryRefused as exc:
            logger.debug("the pack's record of %s is not used: %s", key, exc)
            return True
        channel.count(bytes_read=size, read_secs=time.perf_counter() - started, reads=1)
        if not self.has(key):  # (no claim: the bytes are here,
            self.land(key, size, found)  # and two processes landing one entry each write it whole)
        return False
