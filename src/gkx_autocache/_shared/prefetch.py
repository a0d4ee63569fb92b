"""Prefetch (SPEC §14): a fresh local level fetches ahead, in parallel and bounded, the entries
this program's last run looked up, so that JAX's lookups find them local or in flight.

Which entries: a manifest. A writer's run that missed locally leaves one beside the entries at
exit (``<hash of the program>-gkx-manifest``: the keys it looked up, in order, with their sizes;
signed with the signing key). The program is what ``explain`` names a run (the script and its
first two arguments, ``pytest -q``), and a pytest-xdist worker's, its session's, one manifest per
worker. A reader takes it at its first local miss: a warm local run never asks the shared level
for anything. The whole listing was the other candidate; a team's bucket holds every program's
entries, and a listing beyond one page is not read at all (``bucket.LIST_LIMIT``).

How, from a bucket: its pack (``pack.py``, written beside the manifest), one request for the first
128 MiB of its entries, each record checked as the entry read alone; the rest entry by entry.

Bounds: ``WORKERS`` fetches at a time, each bounded like a read and verified like one (the seal,
the signature, the size; then the store's own checks) before it lands, by the store's backfill;
never more bytes than ``BUDGET`` nor than the local level's room under its cap; nothing once the
level is off, or the process exits (daemon threads: exit waits only for a file being written). A
lookup of a key in flight waits for that fetch; a key not yet begun is the lookup's own, fetched
by it as without a prefetch. Figures: docs/levels.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gkx_autocache._diagnostics import logger
from gkx_autocache._entry import Entry
from gkx_autocache._layout import ENTRY_SUFFIX
from gkx_autocache._shared import plan
from gkx_autocache._shared.calls import ShuttingDown, TooSlow, bounded, describe
from gkx_autocache._shared.channel import Channel
from gkx_autocache._shared.flights import Flights
from gkx_autocache._shared.local import LocalPort
from gkx_autocache._shared.manifest import program
from gkx_autocache._shared.reads import Reader, TooLarge
from gkx_autocache._shared.room import Reservation, cost
from gkx_autocache._shared.seal import EntryRefused
from gkx_autocache._shared.unpack import Unpack

WORKERS = 8  # fetches at a time: a 20 ms round trip then costs a lookup 2.5 ms of it
BUDGET = 1 << 30  # the most a prefetch lands, where the cap leaves more room


class Prefetch:
    """One process's prefetch into its local level, through ``channel``, landing in ``local``
    (where the local level takes no more, disk full, the prefetch ends): its plan (``plan.read``),
    its keys and bytes (``flights``), its workers and its pack's reading."""

    def __init__(self, channel: Channel, reader: Reader, local: LocalPort, budget: int, *, tunes: bool = False,
                 room: Callable[[bool], int] | None = None) -> None:
        self.channel = channel
        self.reader = reader
        self.local = local
        self.tunes = tunes  # XLA keeps GPU autotune results in the local level (``_autotune``)
        self.room_left = room  # the room under the local cap (None: no cap)
        self.flights = Flights(budget, reader.signs, lambda key: key in local.landings)
        self.lands = Lands(channel, self.flights, local)  # each fetched entry into the local level
        self.slow: dict[str, str] = {}  # key -> why its read was abandoned: slower than its compile (its lookup compiles)
        self.plan = plan.Plan()  # its manifests, as read
        self.unpack = Unpack(channel, reader, self.flights, local.has, self.lands.land)  # its packs
        self.reservation = Reservation(local.meta)  # this process's share of the room under the cap
        self.tuned = threading.Event()  # the autotune results are in place (or there are none): a miss may go to XLA
        if not tunes:  # XLA keeps no autotune results in this process: no lookup waits for any
            self.tuned.set()

    @property
    def own(self) -> list[tuple[str, int]] | None:
        """This process's own manifest, as read."""
        return self.plan.own

    @property
    def autotune(self) -> tuple[str, str, int] | None:
        """(object, SHA-256, size): its manifest's autotune results."""
        return self.plan.autotune

    def start(self) -> None:
        try:
            threading.Thread(target=self._run, name="gkx-autocache-prefetch", daemon=True).start()
        except RuntimeError:  # the interpreter is exiting
            self.flights.halt()
            self.tuned.set()

    def _closed(self) -> bool:
        return self.channel.closed or self.channel.off is not None

    def _run(self) -> None:
        channel, flights = self.channel, self.flights
        tuning = False  # a thread lands the autotune results, and sets ``tuned`` when it is done
        try:
            if not channel.ensure():
                return
            self.plan = read = plan.read(channel, self.reader)
            flights.stopped = flights.stopped or read.stopped
            if read.autotune is not None and self.tunes:  # beside the entries' prefetch, not before it
                threading.Thread(target=self._land_autotune, name="gkx-autocache-prefetch", daemon=True).start()
                tuning = True
            else:
                self.tuned.set()  # (a miss waited for the manifest, read beside its own lookup)
            if not read.keys:
                return
            listing = channel.listing
            wanted = []  # (filtered outside the lock: a lookup never waits on these stats)
            for key, size in read.keys:
                listed = listing.get(key + ENTRY_SUFFIX) if listing is not None else size
                if listed and not self.local.has(key):
                    wanted.append((key, min(size, listed) if listing is None else listed))  # the listing's size, where it has one
            if self.room_left is not None:  # the room under the cap, less what unfolded ledgers added (a killed
                # fresh process's landing), shared with other fresh processes: what is wanted of it
                need = sum(cost(size, flights.signed) for key, size in wanted)
                room = min(flights.budget, self.room_left(True))
                logger.debug("prefetch: %d bytes of room, %d wanted", room, need)
                flights.budget = self.reservation.take(need, room, program().parts)
                if flights.budget <= 0:
                    logger.debug("prefetch: no room under the cap (other fresh processes took it)")
                    return
            flights.want(wanted, read.packed)
            logger.debug("prefetch: %d of the manifest's %d entries to fetch, %d from %d packs",
                         len(flights.pending) + len(flights.packed), len(read.keys), len(flights.packed), len(read.packs))
            self._spawn()
            for name in read.packs:
                if not flights.packed or flights.stopped or channel.off is not None:
                    break
                self.unpack.read(name)
            flights.to_workers()
            self._spawn()
        except Exception as exc:  # pragma: no cover - nothing here may reach threading's excepthook
            logger.debug("prefetch stopped: %s", exc)
        finally:
            if not tuning:
                self.tuned.set()

    def _land_autotune(self) -> None:
        assert self.plan.autotune is not None
        try:
            plan.land_autotune(self.channel, self.reader, self.local, self.plan.autotune)
        finally:
            self.tuned.set()

    def _spawn(self) -> None:
        """Workers for the keys pending, up to ``WORKERS`` at once."""
        for _ in range(self.flights.spawn(WORKERS)):
            try:
                threading.Thread(target=self._work, name="gkx-autocache-prefetch", daemon=True).start()
            except RuntimeError:  # the interpreter is exiting
                self.flights.not_started()

    def _failed(self, exc: BaseException) -> None:
        """A request's error: the level's turns it off (``Channel.fault``); any other is that
        object's, and what is left goes to the lookups."""
        if not self.channel.fault(exc):
            logger.debug("prefetch stopped: %s", describe(exc))
            self.flights.halt()

    def _work(self) -> None:
        while (taken := self.flights.next(self._closed)) is not None:
            key, size, event = taken
            try:
                self._one(key, size)
            except Exception as exc:  # pragma: no cover - _one turns errors into the level's state
                logger.debug("prefetch of %s stopped: %s", key, exc)
            finally:
                self.flights.release(key, size, event)

    def _one(self, key: str, size: int) -> None:
        if (claim := self.local.claim(key, stale=2 * self.channel.timeout)) is None:
            return  # left to the other process, or to this one's lookup
        try:
            self._fetch_and_land(key, size)
        finally:
            self.local.unclaim(claim)

    def _fetch_and_land(self, key: str, size: int) -> None:
        """``size``, the manifest's (or the listing's), is charged already; the entry may be larger
        (a stale manifest, or one that lies) by what the budget and the bytes in flight leave."""
        channel = self.channel
        started = time.perf_counter()
        most = self.flights.most(size)
        try:
            found = bounded(lambda progress: self.reader.fetch(key, progress, most), channel.timeout)
        except ShuttingDown:
            self.flights.halt()
            return
        except EntryRefused as exc:
            self.lands.refuse(key, str(exc))
            return
        except TooLarge:
            return  # more than the budget leaves: its lookup reads it
        except TooSlow as exc:  # its lookup (waiting, or to come) compiles it rather than read it again
            self.slow[key] = str(exc)
            channel.too_slow(key, str(exc))
            return
        except Exception as exc:
            self._failed(exc)
            return
        if found is None:
            return
        channel.count(bytes_read=len(found.data), read_secs=time.perf_counter() - started, reads=1)
        self.lands.land(key, size, found)

    def claim(self, key: str) -> tuple[str | None, bool]:
        """A lookup's key, fetched by it: never by the prefetch too. What the prefetch found of it: why
        its bytes were refused (its lookup says so, and reads it no more), and whether its read was
        slower than its compile (its lookup compiles it)."""
        self.flights.take(key)
        return self.lands.refused(key), self.slow.pop(key, None) is not None

    def wait(self, key: str) -> None:
        """Before a lookup reads the local level: wait for this key's fetch if it is in flight
        (``Flights.wait``)."""
        self.flights.wait(key, self.channel.timeout, lambda: self.channel.off is not None)

    def stop(self, grace: float = 1.0) -> int:
        """At exit: no more fetches; wait (at most ``grace``) for a file being written; the bytes
        landed that no lookup of this process used and no other process touched since."""
        deadline = time.monotonic() + grace
        self.flights.stop()
        while self.flights.writing and time.monotonic() < deadline:
            time.sleep(0.005)
        self.reservation.close()
        # A hit sets the entry's mtime (the store's recency): another process used it.
        return sum(landed.nbytes for key, landed in self.local.landings.items()
                   if not self.local.touched_since(key, landed.at))


class Lands:
    """Each entry a prefetch fetched, checked by its fetch, into the local level (``LocalPort.land``)
    as the flights allow; what was refused, by key, until its lookup asks."""

    def __init__(self, channel: Channel, flights: Flights, local: LocalPort) -> None:
        self.channel, self.flights, self.local = channel, flights, local
        self._refused: dict[str, str] = {}  # key -> why its bytes were not landed (its lookup says so)

    def land(self, key: str, size: int, found: Entry) -> None:
        if not self.flights.begin_write(key, self.channel.closed):
            return
        written = None
        try:
            landed, why = self.local.land(key, found)
            if landed:  # (before ``writing`` falls: ``stop`` counts it)
                written = len(found.data)
                self.channel.count(prefetched=1, prefetched_bytes=written, backfills=1)
            elif why is not None:
                self._refused[key] = why
            else:  # the local level takes no more (disk full): what is left goes to its lookups
                self.flights.halt()
        finally:
            self.flights.end_write(size, written)

    def refuse(self, key: str, why: str) -> None:
        self._refused[key] = why

    def refused(self, key: str) -> str | None:
        """Why ``key``'s bytes were refused, said once (its lookup's)."""
        return self._refused.pop(key, None)
