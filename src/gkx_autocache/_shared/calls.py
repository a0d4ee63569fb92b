"""Bounded calls to the shared level: each runs in a daemon thread, and its caller waits while it
makes progress (a request that completes); ``shared_timeout`` without any is a stall. Also the
block sizes reads go by, and an error of the level in one short line. Design: docs/how-it-works.md.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from typing import Any

FIRST_BLOCK = 256 << 10  # most CPU entries fit in one block: one round trip
MAX_BLOCK = 64 << 20


class Stalled(Exception):
    """No progress for ``shared_timeout`` seconds."""


class ShuttingDown(Exception):
    """No new thread can be started: the interpreter is exiting (Python 3.12 refuses them from the
    start of its finalisation, ``threading``'s at-exit hooks included)."""


class Progress:
    """Ticked by a call to the shared level each time a request completes."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at = time.monotonic()

    def tick(self) -> None:
        self.at = time.monotonic()


def bounded(func: Callable[[Progress], Any], timeout: float) -> Any:
    """``func(progress)`` in a daemon thread: its result or its exception, or Stalled once
    ``progress`` has not been ticked for ``timeout`` seconds (the thread is then left behind,
    stuck in the client; being a daemon, it never holds the process up)."""
    progress = Progress()
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
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
        left = progress.at + timeout - time.monotonic()
        if left <= 0:
            raise Stalled(f"no progress for {timeout:g} s")
        done.wait(left)
    if "error" in box:
        raise box["error"]
    return box["value"]


def describe(exc: BaseException) -> str:
    """An error of the shared level in one short line; a refused connection names its endpoint
    (botocore's error keeps it in ``kwargs``; ``http.py`` sets ``endpoint``)."""
    if refused(exc):
        url = str(getattr(exc, "endpoint", None) or (getattr(exc, "kwargs", None) or {}).get("endpoint_url") or "")
        where = "/".join(url.split("/", 3)[:3]) if "://" in url else "the endpoint"
        return f"the connection was refused by {where} (nothing listens there: a server stopped, or a wrong endpoint)"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:240] if text else type(exc).__name__


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
