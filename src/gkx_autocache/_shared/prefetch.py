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

import functools
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from gkx_autocache import _autotune, _files
from gkx_autocache._diagnostics import logger
from gkx_autocache._landing import Landing
from gkx_autocache._layout import (
    ENTRY_SUFFIX,
    TMP_SUFFIX,
)
from gkx_autocache._shared import pack
from gkx_autocache._shared.calls import ShuttingDown, Stalled, TooSlow, bounded, describe, refused
from gkx_autocache._shared.channel import Channel
from gkx_autocache._shared.manifest import (
    MANIFEST_KEYS,
    MANIFEST_LIMIT,
    autotune_name,
    manifest_name,
    program,
)
from gkx_autocache._shared.reads import Found, Reader, TooLarge
from gkx_autocache._shared.seal import EntryRefused, head_problem

WORKERS = 8  # fetches at a time: a 20 ms round trip then costs a lookup 2.5 ms of it
BUDGET = 1 << 30  # the most a prefetch lands, where the cap leaves more room
IN_FLIGHT = 256 << 20  # the most bytes fetched at once, held in memory (GPU entries can be large)
BLOCK = 4096  # the unit a file takes on disk: an entry's last block and each sidecar are charged whole
RESERVED = ".prefetch."  # in the bookkeeping: ``.prefetch.<pid>.<bytes>.tmp``, the room a live prefetch took


def cost(size: int, signed: bool) -> int:
    """What landing an entry of ``size`` bytes takes on disk: whole blocks, and a block for its
    compile-time sidecar and for its seal where a signing key keeps one."""
    return -(-size // BLOCK) * BLOCK + (2 if signed else 1) * BLOCK


class Reservation:
    """This process's share of the room under the cap, said in the bookkeeping for the other fresh
    processes of its local level (``.prefetch.<pid>.<bytes>.tmp``) and held under an ``flock``
    while it lives: a file whose lock nobody holds (its process killed, in another container, or
    planted) is not counted. The earlier reservation keeps its share; a later one takes what the
    earlier live ones left (two that start together each see the other; only the later gives way)."""

    def __init__(self, meta: str) -> None:
        self.meta = meta
        self.fd: int | None = None
        self.name = ""

    def take(self, wanted: int, room: int, parts: int) -> int:
        """At most ``wanted`` bytes of ``room`` (``parts``: pytest-xdist siblings, a share each);
        the budget. Where the bookkeeping cannot hold a reservation, what the others left."""
        budget = min(wanted, room // parts)
        name = f"{RESERVED}{os.getpid()}.{max(budget, 0)}{TMP_SUFFIX}"
        # Made under another name, locked, then renamed: one another process sees is held already.
        staged = f"{RESERVED}{os.getpid()}.new{TMP_SUFFIX}"
        if budget <= 0 or not _files.claim(self.meta, staged, stale=0):
            return budget - self._taken(None)
        self.name = staged
        try:
            import fcntl

            fd = self.fd = _files.open_regular(os.path.join(self.meta, staged))
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            folder = _files.open_dir(os.path.abspath(self.meta), search=True)
            try:
                os.rename(staged, name, src_dir_fd=folder, dst_dir_fd=folder)
            finally:
                os.close(folder)
            self.name = name
            os.utime(fd)  # ordered by when it was seen, not made: a later one never takes an earlier's room
        except (OSError, ImportError):  # (no flock here: a reservation nobody could tell is live)
            self.close()
            return budget - self._taken(None)
        granted = min(budget, room - self._taken(name))
        if granted < budget:  # said as what it holds (the lock goes with the file)
            smaller = f"{RESERVED}{os.getpid()}.{max(granted, 0)}{TMP_SUFFIX}"
            try:
                fd = _files.open_dir(os.path.abspath(self.meta), search=True)
                try:
                    os.rename(name, smaller, src_dir_fd=fd, dst_dir_fd=fd)
                finally:
                    os.close(fd)
                self.name = smaller
            except OSError:
                self.close()
                return 0
        return granted

    def _taken(self, mine: str | None) -> int:
        """The bytes live reservations of other processes hold, those made before ``mine`` (all,
        where None), by when each was made, then by pid."""
        found: list[tuple[int, int, int, str]] = []
        try:
            with os.scandir(self.meta) as items:
                for item in items:
                    pid, _, size = item.name[len(RESERVED):-len(TMP_SUFFIX)].partition(".")
                    if (item.name.startswith(RESERVED) and item.name.endswith(TMP_SUFFIX)
                            and _digits(pid) and _digits(size) and (item.name == mine or self._held(item.name))):
                        try:
                            found.append((item.stat(follow_symlinks=False).st_mtime_ns, int(pid), int(size), item.name))
                        except OSError:
                            continue
        except OSError:
            return 0
        found.sort()
        at = next((i for i, item in enumerate(found) if item[3] == mine), len(found))
        return sum(size for _, _, size, name in found[:at] if name != mine)

    def _held(self, name: str) -> bool:
        """Whether another process holds ``name``'s lock (a live reservation)."""
        try:
            import fcntl

            fd = _files.open_regular(os.path.join(self.meta, name))
        except (OSError, ImportError):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        finally:
            os.close(fd)
        return False

    def close(self) -> None:
        """The prefetch is done: its reservation goes (what landed is this process's ledger's)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.name:
            _files.unclaim(self.meta, self.name)
            self.name = ""


def _digits(text: str) -> bool:
    """ASCII digits, at most 15 (``isdigit`` takes ``²``, and ``int`` then raises)."""
    return 0 < len(text) <= 15 and text.isascii() and text.isdigit()


class Prefetch:
    """One process's prefetch into its local level, through ``channel``, landing through ``landing``
    (where the local level takes no more, disk full, the prefetch ends): the keys to fetch, those
    in flight, its budget."""

    def __init__(self, channel: Channel, reader: Reader, landing: Landing, budget: int, *, tunes: bool = False,
                 room: Callable[[bool], int] | None = None) -> None:
        self.channel = channel
        self.reader = reader
        self.landing = landing
        self.tunes = tunes  # XLA keeps GPU autotune results in the local level (``_autotune``)
        self.room_left = room  # the room under the local cap (None: no cap)
        self.budget = budget
        self.lock = threading.Lock()
        self.pending: dict[str, int] = {}  # key -> bytes, in the order to fetch; a lookup takes its own out
        self.packed: dict[str, int] = {}  # the same, for the keys a pack holds: read in its order, not by the workers
        self.packs: list[str] = []  # the pack to read: this process's own
        self.working = 0  # workers started and not yet done
        self.flight: dict[str, threading.Event] = {}
        self.asked: set[str] = set()  # keys a lookup has asked for: its own to fetch, never the prefetch's
        self.refused: dict[str, str] = {}  # key -> why its bytes were not landed (its lookup says so)
        self.slow: dict[str, str] = {}  # key -> why its read was abandoned: slower than its compile (its lookup compiles)
        self.own: list[tuple[str, int]] | None = None  # this process's own manifest, as read
        self.spent = 0
        self.holding = 0  # bytes of the fetches in flight
        self.room = threading.Condition(self.lock)
        self.writing = 0  # files being written: exit waits for these, never for the network
        self.abandoned: set[str] = set()  # in flight past a lookup's wait: its lookup read it, never landed here
        self.from_pack: set[str] = set()  # the keys in flight that a pack's record holds
        self.signed = reader.signs  # a landed entry keeps its seal beside it
        self.reservation = Reservation(landing.meta)  # this process's share of the room under the cap
        self.stopped = False
        self.autotune: tuple[str, str, int] | None = None  # (object, SHA-256, size): its manifest's autotune results
        self.tuned = threading.Event()  # they are in place (or there are none): a miss may go to XLA
        if not tunes:  # XLA keeps no autotune results in this process: no lookup waits for any
            self.tuned.set()

    def start(self) -> None:
        try:
            threading.Thread(target=self._run, name="gkx-autocache-prefetch", daemon=True).start()
        except RuntimeError:  # the interpreter is exiting
            self.stopped = True
            self.tuned.set()

    def _run(self) -> None:
        channel = self.channel
        tuning = False  # a thread lands the autotune results, and sets ``tuned`` when it is done
        try:
            if not channel.ensure():
                return
            keys, packed = self._manifests()
            if self.autotune is not None and self.tunes:  # beside the entries' prefetch, not before it
                threading.Thread(target=self._land_autotune, name="gkx-autocache-prefetch", daemon=True).start()
                tuning = True
            else:
                self.tuned.set()  # (a miss waited for the manifest, read beside its own lookup)
            if not keys:
                return
            listing = channel.listing
            wanted = []  # (filtered outside the lock: a lookup never waits on these stats)
            for key, size in keys:
                listed = listing.get(key + ENTRY_SUFFIX) if listing is not None else size
                if listed and not self.landing.has(key):
                    wanted.append((key, min(size, listed) if listing is None else listed))  # the listing's size, where it has one
            if self.room_left is not None:  # the room under the cap, less what unfolded ledgers added (a killed
                # fresh process's landing), shared with other fresh processes: what is wanted of it
                need = sum(cost(size, self.signed) for key, size in wanted)
                room = min(self.budget, self.room_left(True))
                logger.debug("prefetch: %d bytes of room, %d wanted", room, need)
                self.budget = self.reservation.take(need, room, program().parts)
                if self.budget <= 0:
                    logger.debug("prefetch: no room under the cap (other fresh processes took it)")
                    return
            with self.lock:
                for key, size in wanted:
                    if key not in self.asked:
                        (self.packed if key in packed else self.pending).setdefault(key, size)
            logger.debug("prefetch: %d of the manifest's %d entries to fetch, %d from %d packs",
                         len(self.pending) + len(self.packed), len(keys), len(self.packed), len(self.packs))
            self._spawn()
            for name in self.packs:
                if not self.packed or self.stopped or channel.off is not None:
                    break
                self._read_pack(name)
            with self.lock:  # what the packs did not give: to the workers
                for key, size in self.packed.items():
                    self.pending.setdefault(key, size)
                self.packed.clear()
            self._spawn()
        except Exception as exc:  # pragma: no cover - nothing here may reach threading's excepthook
            logger.debug("prefetch stopped: %s", exc)
        finally:
            if not tuning:
                self.tuned.set()

    def _land_autotune(self) -> None:
        """This program's GPU autotune results, into the local level's folder before any miss is
        compiled (a miss waits for them, at most one ``shared_timeout``): read whole (at most
        ``_autotune.TOTAL_LIMIT``), checked against the SHA-256 its manifest holds (signed, with a
        signing key), each file a name XLA writes; one that is there already is kept. Whatever goes
        wrong (a slow link included) costs these results only, never the channel."""
        assert self.autotune is not None
        name, sha, size = self.autotune
        channel = self.channel
        try:
            data = bounded(lambda progress: channel.backend.small(name, size + 1), channel.timeout)
            channel.count(requests=1 if channel.backend.lists else 0)
            if len(data) != size or _autotune.digest(data) != sha:
                raise ValueError("it does not match its manifest's SHA-256")
            verified = self.reader.signs  # (decode refused a manifest the key did not sign)
            landed = _autotune.land(self.landing.path, _autotune.unpack(data), self.landing.team, verified)
            logger.debug("prefetch: %d GPU autotune results landed", landed)
        except Exception as exc:
            logger.debug("the autotune object %s is not used: %s", name, describe(exc))
        finally:
            self.tuned.set()

    def _spawn(self) -> None:
        """Workers for the keys pending, up to ``WORKERS`` at once."""
        with self.lock:
            more = min(WORKERS - self.working, len(self.pending))
            self.working += max(more, 0)
        for _ in range(more):
            try:
                threading.Thread(target=self._work, name="gkx-autocache-prefetch", daemon=True).start()
            except RuntimeError:  # the interpreter is exiting
                with self.lock:
                    self.working -= 1

    def _manifests(self) -> tuple[list[tuple[str, int]], set[str]]:
        """The keys of this program's manifests (a pytest-xdist worker reads its siblings' too),
        each key once, a worker's siblings' rotated so that workers begin at different places; and
        those its own pack holds (``self.packs``, a bucket's, where the listing has it)."""
        channel = self.channel
        ident, part, index, count = program()
        parts = [part] if count == 1 else [f"gw{i}" for i in range(count)]
        merged: dict[str, int] = {}
        packed: set[str] = set()
        listing = channel.listing
        for name_part in parts:
            name = manifest_name(ident, name_part)
            if listing is not None and name not in listing:
                continue  # the listing answers: no request
            try:
                data = bounded(functools.partial(self._small, name), channel.timeout)
                channel.count(requests=1 if channel.backend.lists else 0)
            except ShuttingDown:
                return [], packed
            except Exception as exc:
                if self._failed(exc):
                    return [], packed
                continue
            try:
                keys, held, tuned = self.reader.manifest(data, ident) if data else ([], 0, None)
            except Exception as exc:  # a hint: whatever is wrong with it, it is not used, and nothing else is wrong
                logger.debug("the manifest %s is not used: %s", name, describe(exc))
                continue
            packed_here = pack.name_for(name)
            listed = listing is None or packed_here in listing
            if held and listed and channel.backend.lists and name_part == part:
                self.packs.append(packed_here)  # (a sibling's keys are the workers': claimed, each fetched once)
                packed.update(key for key, _ in keys[:held])
            if name_part == part and (listed or not held):  # (a manifest whose pack is gone is written again)
                self.own = keys
            if name_part == part and tuned is not None:
                self.autotune = (autotune_name(name), *tuned)
            for key, size in keys:
                merged.setdefault(key, size)
        keys = list(merged.items())
        if count > 1 and keys:
            start = index * len(keys) // count
            keys = keys[start:] + keys[:start]
        return keys, packed

    def _failed(self, exc: BaseException) -> bool:
        """An error of a prefetch's request: a stall or a refused connection is the level's (it
        turns off, as for a lookup: whether ``True``); any other (an object's 403, one deleted
        meanwhile) is that object's, and what is left goes to the lookups."""
        if isinstance(exc, Stalled):
            self.channel.turn_off(str(exc), timed_out=True)
            return True
        if refused(exc):
            self.channel.turn_off(describe(exc))
            return True
        logger.debug("prefetch stopped: %s", describe(exc))
        self.stopped = True
        return False

    def _small(self, name: str, progress: Any) -> bytes:
        data: bytes = self.channel.backend.small(name, MANIFEST_LIMIT)
        return data

    def _next(self) -> tuple[str, int, threading.Event] | None:
        channel = self.channel
        with self.lock:
            while self.pending and not (self.stopped or channel.closed or channel.off is not None):
                key = next(iter(self.pending))
                size = self.pending[key]
                if self.spent + cost(size, self.signed) > self.budget:
                    del self.pending[key]
                    continue  # beyond the budget: left to its lookup
                if self.flight and self.holding + size > IN_FLIGHT:
                    self.room.wait(0.1)  # (a lookup may take the key meanwhile)
                    continue
                del self.pending[key]
                self.spent += cost(size, self.signed)
                self.holding += size
                event = self.flight[key] = threading.Event()
                return key, size, event
            self.working -= 1  # (under the lock: ``_spawn`` never counts a worker that is done)
            return None

    def _work(self) -> None:
        while (taken := self._next()) is not None:
            key, size, event = taken
            try:
                self._one(key, size)
            except Exception as exc:  # pragma: no cover - _one turns errors into the level's state
                logger.debug("prefetch of %s stopped: %s", key, exc)
            finally:
                self._release(key, size, event)

    def _release(self, key: str, size: int, event: threading.Event, again: bool = False) -> None:
        """A fetch ended: its bytes no longer held, its budget given back where nothing landed,
        its waiters woken; ``again``: its key to the workers, unless a lookup took it meanwhile."""
        with self.lock:
            self.flight.pop(key, None)
            self.holding -= size
            if key not in self.landing.landed:
                self.spent -= cost(size, self.signed)  # nothing landed: nothing spent
                if again and key not in self.asked:
                    self.pending.setdefault(key, size)
            self.room.notify_all()
        event.set()

    def _one(self, key: str, size: int) -> None:
        if (claim := self.landing.claim(key, stale=2 * self.channel.timeout)) is None:
            return  # left to the other process, or to this one's lookup
        try:
            self._fetch_and_land(key, size)
        finally:
            self.landing.unclaim(claim)

    def _fetch_and_land(self, key: str, size: int) -> None:
        """``size``, the manifest's (or the listing's), is charged already; the entry may be larger
        (a stale manifest, or one that lies) by what the budget and the bytes in flight leave."""
        channel = self.channel
        started = time.perf_counter()
        with self.lock:
            most = min(self.budget - self.spent, IN_FLIGHT - self.holding) + size
        try:
            found = bounded(lambda progress: self.reader.fetch(key, progress, most), channel.timeout)
        except ShuttingDown:
            self.stopped = True
            return
        except EntryRefused as exc:
            self.refused[key] = str(exc)
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
        self._land(key, size, found)

    def _land(self, key: str, size: int, found: Found) -> None:
        """``found``, checked by its fetch, into the local level by the store's backfill."""
        channel = self.channel
        with self.lock:
            if self.stopped or channel.closed or key in self.abandoned:
                return
            self.writing += 1
        try:
            landed, why = self.landing.land(key, found)
            if landed:  # (before ``writing`` falls: ``stop`` counts it)
                with self.lock:
                    self.spent += cost(len(found.data), self.signed) - cost(size, self.signed)
                channel.count(prefetched=1, prefetched_bytes=len(found.data), backfills=1)
            elif why is not None:
                self.refused[key] = why
            else:  # the local level takes no more (disk full): what is left goes to its lookups
                self.stopped = True
        finally:
            with self.lock:
                self.writing -= 1

    def _read_pack(self, name: str) -> None:
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
                self._unpack(pack.Reader(stream.take))
            finally:
                stream.close()
        except ShuttingDown:
            self.stopped = True
        except Exception as exc:
            if isinstance(exc, Stalled) or refused(exc):
                self._failed(exc)
            else:
                logger.debug("the pack %s is not read on: %s", name, describe(exc))

    def _unpack(self, reader: pack.Reader) -> None:
        """Each record, in the pack's order: one still wanted is checked and landed as a worker's
        fetch would be (its lookup waits for it meanwhile); any other is read past. No more than
        a writer packs is read: ``pack.LIMIT`` bytes, ``MANIFEST_KEYS`` records."""
        channel = self.channel
        for _ in range(MANIFEST_KEYS):
            if not self.packed or self.stopped or channel.closed or channel.off is not None:
                return
            if (record := reader.next(min(self.reader.max_entry, pack.LIMIT))) is None:
                return
            key, raw_seal, size = record
            if reader.consumed + size > pack.LIMIT:
                raise pack.Malformed(f"longer than a pack is written ({pack.LIMIT >> 20} MiB)")
            event = self._take_record(key, size)
            if event is None:
                reader.skip(size)
                continue
            again = True  # (a record cut short, or refused: the entry's own object may be sound)
            try:
                again = self._record(key, raw_seal, size, reader)
            finally:
                self._release(key, size, event, again)
        raise pack.Malformed(f"more than {MANIFEST_KEYS} records")

    def _take_record(self, key: str, size: int) -> threading.Event | None:
        """A record's key, in flight from now (its lookup waits for it), where it is still wanted,
        not landed, and the budget and the bytes in flight leave room for its size; else None."""
        landed = self.landing.has(key)  # (a sibling's, meanwhile: outside the lock)
        with self.lock:
            if self.packed.pop(key, None) is None or landed or self.spent + cost(size, self.signed) > self.budget:
                return None
            if self.holding + size > IN_FLIGHT:  # the workers hold much: this one is theirs
                self.pending.setdefault(key, size)
                return None
            self.spent += cost(size, self.signed)
            self.holding += size
            self.from_pack.add(key)
            event = self.flight[key] = threading.Event()
            return event

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
        if not self.landing.has(key):  # (no claim: the bytes are here,
            self._land(key, size, found)  # and two processes landing one entry each write it whole)
        return False

    def take(self, key: str) -> None:
        """A lookup's key, fetched by it: never by the prefetch too."""
        with self.lock:
            self.asked.add(key)
            self.pending.pop(key, None)
            self.packed.pop(key, None)

    def wait(self, key: str) -> None:
        """Before a lookup reads the local level: wait for this key's fetch if it is in flight (a
        worker's fetch at most what the entry is worth, ``calls.worth``, as the lookup's own read;
        a pack's record at most ``shared_timeout``: a pack that drips must not hold the user's
        ``jit`` longer than its own read would; then the record is not landed); if it is not
        begun, or no longer waited for, it is the lookup's own (never queued behind the rest, nor
        behind a pack's)."""
        with self.lock:
            self.asked.add(key)
            event = self.flight.get(key)
            if event is None:
                self.pending.pop(key, None)
                self.packed.pop(key, None)
                return
        # A worker's fetch is bounded as a lookup's read is (a stall turns the level off, a read
        # slower than its compile ends at its bound: either releases its waiters); a pack's record
        # is read among others, so its lookup is bounded here.
        deadline = time.monotonic() + self.channel.timeout if key in self.from_pack else float("inf")
        while not event.wait(0.05) and self.channel.off is None:  # an off level releases its waiters at once
            if time.monotonic() >= deadline:
                with self.lock:
                    if not event.is_set():
                        self.abandoned.add(key)
                logger.debug("prefetch of %s not waited for beyond %g s: read by its lookup", key, self.channel.timeout)
                return

    def stop(self, grace: float = 1.0) -> int:
        """At exit: no more fetches; wait (at most ``grace``) for a file being written; the bytes
        landed that no lookup of this process used and no other process touched since."""
        deadline = time.monotonic() + grace
        with self.lock:
            self.stopped = True
            self.pending.clear()
        while self.writing and time.monotonic() < deadline:
            time.sleep(0.005)
        self.reservation.close()
        # A hit sets the entry's mtime (the store's recency): another process used it.
        return sum(landed.nbytes for key, landed in list(self.landing.landed.items())
                   if not self.landing.touched_since(key, landed.at))
