"""The port: what a shared level's storage is to the rest of the package. One ``Backend`` Protocol,
its capabilities said as attributes rather than as a kind compared by name, and its failures typed
here (ccache's ``Failure { error, timeout }``), so that the level, its uploads and the commands
never import a backend to read one. Each backend is a class against it, chosen by ``schemes``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

# An object under the version prefix, for the commands: ``(name, bytes, last written, seconds since
# the epoch)`` (an object store keeps no access time).
Listed = tuple[str, int, float]


class Progress(Protocol):
    """What a backend tells the bounded call it runs in (``_shared/calls.Progress``): ``tick()`` a
    request completed; ``got(n)`` bytes of a body arrived (raises where the caller stopped waiting)."""

    def tick(self) -> None: ...

    def got(self, n: int) -> None: ...


class Failure(Exception):
    """A backend's failure, typed for the generic code: ``kind`` says what becomes of the level.
    ``error``: it turns off for the rest of the process (any untyped exception is one too)."""

    kind = "error"


class TimedOut(Failure):
    """No progress: the level turns off, counted as a timeout (``calls.Stalled`` is one)."""

    kind = "timeout"


class TooLarge(Failure):
    """One object refused for its size (HTTP 413, S3's ``EntityTooLarge``): that entry is skipped and
    larger ones are not sent; the level stays on. ``fix``: what raises the limit, for the warning."""

    kind = "too_large"
    fix = "raise the server's limit on a request's body"


class Refused(Failure):
    """One object is there but must not be served (a seal that does not match, a file another user
    may have written): a miss, named ``rejected: <why>``; the level stays on."""

    kind = "refused"


class Uncounted(str):
    """A listing's answer where the level answers but cannot say how many entries it holds (an HTTP
    cache, a filesystem without bounded pages): ``status`` says it, and never "more than 1000"."""


class Stream(Protocol):
    """An object's body read in order (a pack): ``take(n)``, its next ``n`` bytes (fewer only at
    its end), each read bounded; ``close()``, the body left unread dropped."""

    def take(self, n: int) -> bytes: ...

    def close(self) -> None: ...


class Backend(Protocol):
    """The storage behind a shared level. ``where``: its version directory or prefix, for messages.

    Capabilities:
    - ``lists``: an object store (a bucket, an HTTP cache): its names are listed (again after the
      level's ``LIST_TTL``), an entry is read by ranges (``first``, then ``block``), each call a round
      trip counted as a request, and a writer heals what it lost. False: a file system, read whole
      by ``read`` under its own trust checks, never listed; its entries keep their compile-time
      sidecar beside them.
    - ``sealed``: every entry was put with its seal (only this package writes there): one without a
      seal is refused.
    - ``streams()``: whether a pack can be read as one stream (``stream``); a method, as an fsspec
      bucket learns it from its client.

    A run uses the reads and writes; ``status`` ``describe()``; ``prune --shared`` and ``clear
    --shared`` ``names()`` and ``remove()``: one client, its credentials, proxies and bounds, for all.
    """

    where: str
    lists: bool
    sealed: bool

    def streams(self) -> bool: ...

    def forget(self) -> None:
        """After ``fork``: the parent's connections, loops and locks are not this process's."""

    def prepare(self, progress: Progress, create: bool = True) -> bool:
        """Check (and with ``create``, make) the version directory; whether it may be written."""

    def listing(self, progress: Progress) -> dict[str, int] | str:
        """``{name: bytes}`` of the version prefix (one bounded page), or why there is none to use."""

    def small(self, name: str, limit: int = ...) -> bytes:
        """The first ``limit`` bytes of an object (a seal, a manifest); empty where it is not there."""

    def read(self, key: str, progress: Progress,
             admit: Callable[[bytes | None, int], tuple[int, bool]]) -> bytes | None:
        """Without ``lists``: the whole entry, its seal ``admit``-ted first; None where it is not there."""

    def first(self, key: str, progress: Progress) -> tuple[bytes | None, bytes | None]:
        """With ``lists``: the entry's seal and its first block, ``(None, None)`` where it is not there."""

    def block(self, key: str, start: int, end: int, progress: Progress | None = None) -> bytes: ...

    def size(self, key: str) -> int: ...

    def compile_secs(self, key: str) -> float | None: ...

    def write(self, name: str, data: bytes) -> None: ...

    def stream(self, name: str, timeout: float) -> Stream | None: ...

    def describe(self) -> dict[str, str]:
        """What ``status`` says of it beyond its row of ``schemes``: its client, where its credentials
        come from (never their value). May resolve them (a credential process): called bounded."""

    def caution(self) -> str | None:
        """The one warning its set-up is worth (credentials withheld over plain ``http://``), or None."""

    def names(self, progress: Progress) -> list[Listed]:
        """Every object directly under the version prefix, all pages (a tick each), for the commands."""

    def remove(self, name: str) -> None:
        """Delete one object under the version prefix (the commands name only entries and sidecars);
        one already gone is no error."""
