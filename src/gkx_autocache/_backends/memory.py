"""A shared level in this process's memory: an object store with the port's every method, for tests
that run the shared level (lookups, uploads, prefetch, healing, packs) in one process. No setting
names it (it is not in the table): a test builds it and gives it to a level.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from gkx_autocache._backends.port import Listed, Progress, TooLarge
from gkx_autocache._formats import SEAL_LIMIT
from gkx_autocache._layout import ENTRY_SUFFIX, SEAL_SIDECAR, version_name
from gkx_autocache._shared.calls import FIRST_BLOCK

LIST_LIMIT = 1000  # one page, as a bucket's


class Memory:
    """``objects``: name -> bytes, shared by the levels given the same dict (two "machines"); each
    call is recorded in ``calls`` as ``(method, name)``. ``limit``: an object larger is refused as
    a server refuses a body (``port.TooLarge``); ``failing``: raised by every call while set (a
    level that stalls, a refused connection)."""

    lists = True  # (``port.Backend``)
    streams_packs = True

    def __init__(self, where: str = "memory://level/jax", objects: dict[str, bytes] | None = None, *,
                 sealed: bool = False, limit: int | None = None) -> None:
        self.where = where
        self.objects: dict[str, bytes] = {} if objects is None else objects
        self.written: dict[str, float] = {}
        self.sealed = sealed
        self.limit = limit
        self.failing: BaseException | None = None
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    @classmethod
    def opened(cls, url: str, jax_version: str, env: Mapping[str, str], *, team: bool, over_http: bool) -> Memory:
        return cls(f"{url.rstrip('/')}/{version_name(jax_version)}")

    def _call(self, method: str, name: str = "") -> None:
        with self._lock:
            self.calls.append((method, name))
        if self.failing is not None:
            raise self.failing

    def streams(self) -> bool:
        return self.streams_packs

    def forget(self) -> None:
        self._lock = threading.Lock()

    def prepare(self, progress: Progress, create: bool = True) -> bool:
        progress.tick()
        return True

    def listing(self, progress: Progress) -> dict[str, int] | str:
        self._call("list")
        progress.tick()
        names = {name: len(data) for name, data in list(self.objects.items())}
        return names if len(names) <= LIST_LIMIT else f"more than {LIST_LIMIT}"

    def small(self, name: str, limit: int = SEAL_LIMIT) -> bytes:
        self._call("get", name)
        return self.objects.get(name, b"")[:limit]

    def read(self, key: str, progress: Progress,
             admit: Callable[[bytes | None, int], tuple[int, bool]]) -> bytes | None:
        raise AssertionError("an object store's entry is read by ranges")

    def first(self, key: str, progress: Progress) -> tuple[bytes | None, bytes | None]:
        self._call("first", key)
        seal, entry = self.objects.get(key + SEAL_SIDECAR), self.objects.get(key + ENTRY_SUFFIX)
        progress.got(len(entry or b"") + len(seal or b""))
        progress.tick()
        return (None if seal is None else seal[:SEAL_LIMIT]), (None if entry is None else entry[:FIRST_BLOCK])

    def block(self, key: str, start: int, end: int, progress: Progress | None = None) -> bytes:
        self._call("block", key)
        data = self.objects.get(key + ENTRY_SUFFIX, b"")[start:end]
        if progress is not None:
            progress.got(len(data))
        return data

    def size(self, key: str) -> int:
        self._call("size", key)
        return len(self.objects[key + ENTRY_SUFFIX])

    def compile_secs(self, key: str) -> float | None:
        return None  # carried by the seal

    def write(self, name: str, data: bytes) -> None:
        self._call("put", name)
        if self.limit is not None and len(data) > self.limit:
            raise TooLarge(f"{self.where}/{name}: {len(data)} bytes, more than this level takes ({self.limit})")
        self.objects[name] = bytes(data)
        self.written[name] = time.time()

    def stream(self, name: str, timeout: float) -> Body | None:
        self._call("stream", name)
        data = self.objects.get(name)
        return None if data is None else Body(data)

    def describe(self) -> dict[str, str]:
        return {"credentials": "none: this process's memory"}

    def caution(self) -> str | None:
        return None

    def names(self, progress: Progress) -> list[Listed]:
        self._call("names")
        progress.tick()
        return [(name, len(data), self.written.get(name, 0.0)) for name, data in list(self.objects.items())]

    def remove(self, name: str) -> None:
        self._call("delete", name)
        self.objects.pop(name, None)
        self.written.pop(name, None)


class Body:
    """An object's bytes read in order (``port.Stream``)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        taken = self.data[self.at:self.at + n]
        self.at += len(taken)
        return taken

    def close(self) -> None:
        self.data = b""
