"""What a shared level's storage is to the rest of ``_shared/``: one ``Backend`` Protocol, with its
capabilities said as attributes rather than as a kind compared by name. Adding a level (an Azure
container, a bazel-remote server) is one class against it: ``directory.Directory``, ``bucket.Bucket``
(fsspec), ``http.HttpCache`` and ``s3.S3`` (with ``s3.Deferred`` choosing between the last two) are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gkx_autocache._shared.calls import Progress


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
        """``{name: bytes}`` of the version prefix, or why there is none to use."""

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
