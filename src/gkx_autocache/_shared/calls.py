"""Bounded calls to the shared level: each runs in a daemon thread, and its caller waits while it
makes progress (a request that completes); ``shared_timeout`` without any is a stall. A lookup's
read of an entry is bounded twice more (SPEC §14, 2026-12-06): less than ``FLOOR_RATE`` bytes a
second over ``shared_timeout`` is a stall too, and its whole read has a wall-clock bound that does
not grow with its blocks (``worth``: no longer than compiling it took). Also the block sizes reads
go by, and an error of the level in one short line. Design: docs/how-it-works.md.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from typing import Any

from gkx_autocache._backends.port import TimedOut
from gkx_autocache._diagnostics import one_line

FIRST_BLOCK = 256 << 10  # most CPU entries fit in one block: one round trip
MAX_BLOCK = 64 << 20
FLOOR_RATE = 64 << 10  # bytes a second: an entry's read that moves less, for shared_timeout, is stalled
# What a link that works needs to read an entry (its round trips, then 16 MiB a second: S3 gives one
# connection 50-100 MB/s in its region): a seal's compile time below it, a bug's or a liar's, never
# makes an entry unreadable.
LEAST_SECS = 1.0
LEAST_RATE = 16 << 20
MOST_TIMEOUTS = 30  # a seal's compile time above 30 shared_timeouts (5 minutes) holds no lookup longer
LINE = 240  # the most of an error said in a warning, its hint kept whole
WATCH = 0.1  # how often a waiting caller looks at a read's bound and rate


class Stalled(TimedOut):
    """No progress for ``shared_timeout`` seconds (or less than ``FLOOR_RATE`` for that long)."""


class TooSlow(Exception):
    """A read still moving, past its wall-clock bound: slower than compiling the entry. The lookup
    compiles; the level stays on (it is slow, not stalled)."""


class ShuttingDown(Exception):
    """No new thread can be started: the interpreter is exiting (Python 3.12 refuses them from the
    start of its finalisation, ``threading``'s at-exit hooks included)."""


class Abandoned(Exception):
    """Raised in a read its caller gave up on, at its next part (``Progress.got``): its connection
    is dropped, not left downloading in the background."""


def worth(size: int, compile_secs: float | None, timeout: float,
          unknown: str = "no compile time known (no seal)") -> tuple[float, str]:
    """How long a lookup may spend reading an entry of ``size`` bytes in all, and why: no longer
    than compiling it took (its signed seal's compile time), never less than a link that works needs
    (``LEAST_SECS`` and ``LEAST_RATE``: a tiny compile time cannot make an entry unreadable), never
    more than ``MOST_TIMEOUTS`` timeouts (a huge one cannot hold a lookup for hours). Without a
    compile time that can be taken (``unknown`` says why: no seal, as stock JAX writes; a seal no key
    signed), one ``shared_timeout``, or what a link needs where that is more."""
    least = LEAST_SECS + size / LEAST_RATE
    if compile_secs is None:
        return (max(least, timeout), f"{unknown}: one shared_timeout" if timeout >= least
                else f"what a link that works needs for {size >> 10} KiB")
    most = MOST_TIMEOUTS * timeout
    if compile_secs >= least:
        return (min(compile_secs, max(least, most)), f"its compile took {compile_secs:.2f} s" if compile_secs <= most
                else f"{MOST_TIMEOUTS} shared_timeouts, less than its compile ({compile_secs:.0f} s)")
    return least, f"its compile took {compile_secs:.2f} s; a link that works needs up to {least:.2f} s"


_current = threading.local()  # the Progress of the bounded call this thread runs (``current``)


def current() -> Progress | None:
    """The progress of the bounded call this thread runs, or None: what a client's own waits (a
    retry's backoff) count as, without a progress passed down every call."""
    found: Progress | None = getattr(_current, "progress", None)
    return found


def waiting(secs: float) -> None:
    """Sleep ``secs`` as a client's backoff before it asks again: progress all along for the bounded
    call this thread runs (the server answered, and asked to be asked later), its rate measured
    afresh after (a backoff moves no bytes)."""
    progress = current()
    end = time.monotonic() + secs
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, WATCH))
        if progress is not None:
            progress.tick()
    if progress is not None and progress.metered:
        progress.meter()


class Progress:
    """Ticked by a call to the shared level each time a request completes; an entry's read also
    says the bytes it receives (``got``), once it is ``metered``, and its wall-clock ``deadline``
    once its seal says what it is worth."""

    __slots__ = ("at", "began", "deadline", "why", "metered", "received", "samples", "cancelled", "_lock")

    def __init__(self) -> None:
        self.at = self.began = time.monotonic()
        self.deadline = float("inf")
        self.why = ""
        self.metered = False
        self.received = 0
        self.samples: list[tuple[float, int]] = [(self.began, 0)]  # (when, bytes received by then)
        self.cancelled = False
        self._lock = threading.Lock()

    def tick(self) -> None:
        self.at = time.monotonic()

    def meter(self) -> None:
        """From now, a rate below ``FLOOR_RATE`` for a timeout is a stall."""
        with self._lock:
            self.metered = True
            self.samples = [(time.monotonic(), self.received)]

    def bound(self, secs: float, why: str) -> None:
        """The read ends ``secs`` after it began (``worth``)."""
        self.deadline, self.why = self.began + secs, why

    def got(self, n: int) -> None:
        """``n`` bytes received (a part of a body); raises Abandoned where the caller gave up."""
        if self.cancelled:
            raise Abandoned("the caller stopped waiting")
        if n <= 0:
            return
        now = time.monotonic()
        with self._lock:
            self.received += n
            samples = self.samples
            samples.append((now, self.received))
            if len(samples) > 64:  # one sample every WATCH is plenty to find a window's start
                del samples[1:len(samples) // 2:2]

    def moved(self, since: float) -> int | None:
        """Bytes received since ``since`` (None where metering began after it)."""
        with self._lock:
            first = self.samples[0]
            if not self.metered or first[0] > since:
                return None
            before = first[1]
            for when, total in self.samples:
                if when > since:
                    break
                before = total
            return self.received - before


def bounded(func: Callable[[Progress], Any], timeout: float) -> Any:
    """``func(progress)`` in a daemon thread: its result or its exception, or Stalled once
    ``progress`` has not been ticked for ``timeout`` seconds, or (a metered read) has received less
    than ``FLOOR_RATE`` bytes a second over the last ``timeout``; TooSlow past its ``deadline``.
    The thread is then left behind, stuck in the client (being a daemon, it never holds the process
    up), and told to stop at its next part (``Progress.got``)."""
    progress = Progress()
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        _current.progress = progress
        try:
            box["value"] = func(progress)
        except BaseException as exc:  # everything reaches the caller: nothing for threading's excepthook
            box["error"] = exc
        finally:
            done.set()

    try:
        threading.Thread(target=run, name="gkx-autocache-shared", daemon=True).start()
    except RuntimeError as exc:
        raise ShuttingDown(str(exc)) from None
    while not done.is_set():
        now = time.monotonic()
        left = progress.at + timeout - now
        if left <= 0:
            progress.cancelled = True
            raise Stalled(f"no progress for {timeout:g} s")
        if now >= progress.deadline:
            progress.cancelled = True
            raise TooSlow(f"not read within {progress.deadline - progress.began:.1f} s ({progress.why})")
        moved = progress.moved(now - timeout) if progress.metered else None
        if moved is not None and moved < FLOOR_RATE * timeout:
            progress.cancelled = True
            raise Stalled(f"less than {FLOOR_RATE >> 10} KiB/s for {timeout:g} s ({moved >> 10} KiB)")
        done.wait(min(left, WATCH))  # (a read's bound and meter are set in its thread, after it began)
    if "error" in box:
        raise box["error"]
    return box["value"]


def describe(exc: BaseException) -> str:
    """An error of the shared level in one short line, a server's words in it escaped (an S3 error's
    message, a reason phrase: they reach ``status``, ``explain`` and the logs); a refused connection
    names its endpoint (botocore's error keeps it in ``kwargs``; ``http.py`` sets ``endpoint``)."""
    if refused(exc):
        url = str(getattr(exc, "endpoint", None) or (getattr(exc, "kwargs", None) or {}).get("endpoint_url") or "")
        where = "/".join(url.split("/", 3)[:3]) if "://" in url else "the endpoint"
        return one_line(f"the connection was refused by {where} (nothing listens there: a server stopped, or a wrong "
                        "endpoint)")
    hint = one_line(getattr(exc, "hint", ""))  # (a fix, such as where credentials come from: never cut)
    text = one_line(" ".join(str(exc).split()))
    if hint and text.endswith(hint):
        text = text[:-len(hint)].rstrip()
    said = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    room = max(LINE - len(hint), 80)
    if len(said) > room:  # a server's long message is cut, at a word, and said to be
        said = said[:room].rsplit(" ", 1)[0] + " ..."
    return f"{said} {hint}" if hint else said


def refused(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a connection refused (botocore's EndpointConnectionError keeps the
    client's error, aiohttp's keeps the OSError)."""
    seen = 0
    while exc is not None and seen < 6:
        if isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == errno.ECONNREFUSED:
            return True
        exc = (getattr(exc, "os_error", None) or (getattr(exc, "kwargs", None) or {}).get("error")
               or exc.__cause__ or exc.__context__)
        seen += 1
    return False
