"""The keys of one prefetch (``prefetch.py``) and the bytes they take, under one lock: those to
fetch (the workers' ``pending``, a pack's ``packed``), those in flight (a lookup of one waits for
it), those a lookup asked for (its own, never the prefetch's), and the budget each fetch is
charged against (``room.cost``) and the bytes held in memory meanwhile (at most ``IN_FLIGHT``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gkx_autocache._diagnostics import logger
from gkx_autocache._shared.room import cost

IN_FLIGHT = 256 << 20  # the most bytes fetched at once, held in memory (GPU entries can be large)


class Flights:
    """``budget``: the most the prefetch lands; ``signed``: a landed entry keeps its seal beside it;
    ``landed(key)``: whether the prefetch landed ``key`` (its budget then stays spent)."""

    def __init__(self, budget: int, signed: bool, landed: Callable[[str], bool]) -> None:
        self.budget = budget
        self.signed = signed
        self.landed = landed
        self.lock = threading.Lock()
        self.room = threading.Condition(self.lock)
        self.pending: dict[str, int] = {}  # key -> bytes, in the order to fetch; a lookup takes its own out
        self.packed: dict[str, int] = {}  # the same, for the keys a pack holds: read in its order, not by the workers
        self.flight: dict[str, threading.Event] = {}
        self.asked: set[str] = set()  # keys a lookup has asked for: its own to fetch, never the prefetch's
        self.abandoned: set[str] = set()  # in flight past a lookup's wait: its lookup read it, never landed here
        self.from_pack: set[str] = set()  # the keys in flight that a pack's record holds
        self.spent = 0
        self.holding = 0  # bytes of the fetches in flight
        self.working = 0  # workers started and not yet done
        self.writing = 0  # files being written: exit waits for these, never for the network
        self.stopped = False

    def want(self, wanted: list[tuple[str, int]], packed: set[str]) -> None:
        """The keys to fetch, but those a lookup asked for meanwhile: a pack's, or the workers'."""
        with self.lock:
            for key, size in wanted:
                if key not in self.asked:
                    (self.packed if key in packed else self.pending).setdefault(key, size)

    def to_workers(self) -> None:
        """What the packs did not give: to the workers."""
        with self.lock:
            for key, size in self.packed.items():
                self.pending.setdefault(key, size)
            self.packed.clear()

    def spawn(self, most: int) -> int:
        """How many workers to start for the keys pending, ``most`` at once; counted as started."""
        with self.lock:
            more = min(most - self.working, len(self.pending))
            self.working += max(more, 0)
        return more

    def not_started(self) -> None:
        with self.lock:
            self.working -= 1

    def next(self, closed: Callable[[], bool]) -> tuple[str, int, threading.Event] | None:
        """A worker's next key, charged and in flight; None when there is none (or ``closed()``, the
        level off or the process exiting): that worker is done."""
        with self.lock:
            while self.pending and not (self.stopped or closed()):
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
            self.working -= 1  # (under the lock: ``spawn`` never counts a worker that is done)
            return None

    def take_record(self, key: str, size: int, landed: bool) -> threading.Event | None:
        """A record's key, in flight from now (its lookup waits for it), where it is still wanted,
        not ``landed``, and the budget and the bytes in flight leave room for its size; else None."""
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

    def release(self, key: str, size: int, event: threading.Event, again: bool = False) -> None:
        """A fetch ended: its bytes no longer held, its budget given back where nothing landed,
        its waiters woken; ``again``: its key to the workers, unless a lookup took it meanwhile."""
        with self.lock:
            self.flight.pop(key, None)
            self.holding -= size
            if not self.landed(key):
                self.spent -= cost(size, self.signed)  # nothing landed: nothing spent
                if again and key not in self.asked:
                    self.pending.setdefault(key, size)
            self.room.notify_all()
        event.set()

    def most(self, size: int) -> int:
        """The most a fetch charged ``size`` may read: an entry may be larger (a stale manifest, or
        one that lies) by what the budget and the bytes in flight leave."""
        with self.lock:
            return min(self.budget - self.spent, IN_FLIGHT - self.holding) + size

    def begin_write(self, key: str, closed: bool) -> bool:
        """Whether ``key``'s fetched bytes may be written (not stopped, not abandoned); counted."""
        with self.lock:
            if self.stopped or closed or key in self.abandoned:
                return False
            self.writing += 1
            return True

    def end_write(self, size: int, written: int | None) -> None:
        """A write ended; ``written``: the bytes landed where it landed (charged for what they took)."""
        with self.lock:
            if written is not None:
                self.spent += cost(written, self.signed) - cost(size, self.signed)
            self.writing -= 1

    def take(self, key: str) -> None:
        """A lookup's key, fetched by it: never by the prefetch too."""
        with self.lock:
            self.asked.add(key)
            self.pending.pop(key, None)
            self.packed.pop(key, None)

    def wait(self, key: str, timeout: float, off: Callable[[], bool]) -> None:
        """Before a lookup reads the local level: wait for this key's fetch if it is in flight (a
        worker's fetch at most what the entry is worth, ``calls.worth``, as the lookup's own read;
        a pack's record at most ``timeout``: a pack that drips must not hold the user's ``jit``
        longer than its own read would; then the record is not landed); if it is not begun, or no
        longer waited for, it is the lookup's own (never queued behind the rest, nor a pack's).
        ``off()``: the level is off, which releases its waiters at once."""
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
        deadline = time.monotonic() + timeout if key in self.from_pack else float("inf")
        while not event.wait(0.05) and not off():
            if time.monotonic() >= deadline:
                with self.lock:
                    if not event.is_set():
                        self.abandoned.add(key)
                logger.debug("prefetch of %s not waited for beyond %g s: read by its lookup", key, timeout)
                return

    def halt(self) -> None:
        """Nothing more is fetched: what is left goes to the lookups."""
        self.stopped = True

    def stop(self) -> None:
        """No more fetches."""
        with self.lock:
            self.stopped = True
            self.pending.clear()
