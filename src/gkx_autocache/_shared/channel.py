"""The channel to a shared level (SPEC §14): what its reader, its uploads and its prefetch all talk
through, and nothing of the local level. The backend (``port.Backend``), the listing, the
off-switch, the shared level's numbers and this process's rank; built once with the level
(``level.Level``), and each part is given it rather than the level.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gkx_autocache import _fork
from gkx_autocache._backends.port import Backend, TimedOut
from gkx_autocache._diagnostics import NOTED, human_bytes, logger, warn
from gkx_autocache._shared.calls import ShuttingDown, bounded, describe, refused

LIST_TTL = 60.0

# The per-level numbers, the same names for both levels (SPEC §14). Summed over processes by the
# ledger as they are; ``shown`` turns read_secs and reads into the mean read time.
COUNTS = ("hits", "misses", "backfills", "uploads", "errors", "timeouts", "slow", "rejected", "skipped", "dropped",
          "requests", "bytes_read", "bytes_written", "read_secs", "reads",
          "prefetched", "prefetched_bytes", "prefetch_used", "prefetch_wasted_bytes")


def zero() -> dict[str, float]:
    return dict.fromkeys(COUNTS, 0)


class Channel:
    """One process's way to its shared level: ``backend``, bounded by ``timeout``; the listing
    (``ensure``, ``listing``); the off-switch (``turn_off``, ``off``); the numbers (``count``);
    ``rank()``, this process's rank among a job's (only rank 0 uploads). ``url`` and ``origin``
    (where the timeout was set) are for messages; ``local_dir`` too, the level the run goes on with."""

    def __init__(self, url: str, backend: Backend, *, timeout: float, rank: Callable[[], int], origin: str = "shared",
                 local_dir: str = "") -> None:
        self.url = url  # as the user wrote it, for messages
        self.backend = backend
        self.timeout = timeout
        self.rank = rank
        self.origin = origin
        self.local_dir = local_dir
        self.counts = zero()
        self.off: tuple[str, float] | None = None  # (why, when) once turned off
        self.closed = False  # at exit: nothing more is fetched or queued
        self._prepared: bool | None = None  # None: not yet; else whether it may be written
        self._listing: dict[str, int] | None = None
        self._listed_at = -LIST_TTL
        # Told at once: the uploads drop what is queued as the switch turns (``Uploads.drop``), and
        # check what a writer hit before the first listing (``Uploads.sweep``).
        self._on_off: list[Callable[[Callable[[], None]], int]] = []
        self._on_listed: list[Callable[[], None]] = []
        self._reset_locks()
        _fork.in_child(self._forked)

    def _reset_locks(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Lock()  # one thread prepares and lists; the others wait for it

    def _forked(self) -> None:
        self._reset_locks()
        self.counts = zero()
        self.backend.forget()

    def close(self) -> None:
        """At exit: nothing more is fetched or queued."""
        self.closed = True

    def when_off(self, drop: Callable[[Callable[[], None]], int]) -> None:
        """``drop(off)`` turns the switch itself, under its own lock, and says how many of this run's
        entries it dropped (``Uploads.drop``)."""
        self._on_off.append(drop)

    def when_listed(self, then: Callable[[], None]) -> None:
        self._on_listed.append(then)

    # -- the numbers -----------------------------------------------------------------------------

    def count(self, **add: float) -> None:
        with self._lock:
            for name, n in add.items():
                self.counts[name] += n

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self.counts)

    # -- the listing -----------------------------------------------------------------------------

    @property
    def listed(self) -> bool:
        """Whether the listing was taken (a directory and an HTTP cache: whether the level was
        prepared), not only being taken now."""
        return self._listed_at != -LIST_TTL

    @property
    def writable(self) -> bool:
        """Whether the level, prepared, may be written (a shared directory may be read-only here)."""
        return bool(self._prepared)

    @property
    def listing(self) -> dict[str, int] | None:
        """A bucket's version prefix as last listed (object name -> bytes), or None (a directory, an
        HTTP cache, a listing beyond one page, or not listed yet)."""
        return self._listing

    def ensure(self, quiet: bool = False) -> bool:
        """Prepare the level (trust, the version directory) and list a bucket's version prefix, once
        (and the listing again after LIST_TTL); whether it is usable. ``quiet``: for healing alone
        (a run of local hits), a failure stops the healing with a debug line and leaves the level
        on: such a run needs nothing of the bucket, and a later miss says what is wrong."""
        if (self._prepared is not None and self._listed_at != -LIST_TTL  # (another thread may be listing now: wait)
                and (self._listing is None or time.monotonic() - self._listed_at < LIST_TTL)):
            return self.off is None
        with self._ready:
            if self.off is not None:
                return False
            try:
                if self._prepared is None:
                    self._prepared = bool(bounded(self.backend.prepare, self.timeout))
                if time.monotonic() - self._listed_at >= LIST_TTL:
                    names = bounded(self.backend.listing, self.timeout)
                    self._listing = names if isinstance(names, dict) else None
                    self._listed_at = time.monotonic()
                    if self.backend.lists:
                        self.count(requests=1)  # (an HTTP cache's HEAD, where it has no listing)
                        for then in self._on_listed:
                            then()
                    else:
                        self._listed_at = float("inf")  # a directory is never listed
            except ShuttingDown:  # at exit: the listing stays as it is; nothing is wrong with the level
                return self.off is None and self._prepared is not None
            except Exception as exc:
                if quiet:
                    logger.debug("the shared level %s is not healed: %s", self.url, describe(exc))
                    return False
                if isinstance(exc, TimedOut):
                    self.turn_off(str(exc), timed_out=True)
                else:
                    self.turn_off(describe(exc))
        return self.off is None

    # -- the off-switch and what it says ---------------------------------------------------------

    @property
    def off_note(self) -> str | None:
        """For a miss while the level is off: what turned it off, and when."""
        if self.off is None:
            return None
        why, when = self.off
        return f"{why} at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(when))}"

    def turn_off(self, why: str, timed_out: bool = False) -> None:
        """The first stall or error: the level is off for the rest of the process, one warning."""
        def off() -> None:
            self.off = (why, time.time())

        with self._lock:  # (then the uploads' lock: never the other way round)
            if self.off is not None:
                return
            self.counts["timeouts" if timed_out else "errors"] += 1
            for drop in self._on_off:
                self.counts["dropped"] += drop(off)  # this run's own entries
            if self.off is None:
                off()
        fix = f"raise shared_timeout ({self.origin})" if timed_out else "check its endpoint and credentials"
        warn("shared:off", f"the shared level {self.url} is off for the rest of this process after {why}; the run "
                           f"goes on with the local level {self.local_dir}; fix: `gkx-autocache status` probes it, "
                           f"or {fix}")

    def fault(self, exc: BaseException) -> bool:
        """An error of a prefetch's request: a stall or a refused connection is the level's (it
        turns off, as for a lookup: whether it did); any other (an object's 403, one deleted
        meanwhile) is that object's."""
        if isinstance(exc, TimedOut):
            self.turn_off(str(exc), timed_out=True)
            return True
        if refused(exc):
            self.turn_off(describe(exc))
            return True
        return False

    def too_large(self, size: int, why: str, fix: str) -> None:
        """An upload the server refused for its size (HTTP 413: ``port.TooLarge``): that entry
        skipped, the level on, one warning a process with ``fix``, the backend's way to raise the limit."""
        warn("shared:too-large", f"the shared level {self.url} refused an entry of {human_bytes(size)} as too large "
                                 f"({why}); entries that large are not uploaded, the others are, and the level stays on; "
                                 f"fix: {fix}")

    def too_slow(self, key: str, why: str) -> None:
        """A read past what its entry is worth (``calls.worth``): that entry is compiled here; the
        level stays on (it moved, it did not stall), with one warning a process."""
        self.count(slow=1)
        logger.debug("shared entry %s not read on: %s", key, why)
        warn("shared:slow", f"a read from the shared level {self.url} was slower than compiling: {why}; the "
                            "entry is compiled here, and the level stays on for later lookups; fix: where every "
                            "large entry is this slow, check the network path to it (`gkx-autocache status` "
                            "probes it)", NOTED)
