"""The port a prefetch lands through (SPEC §14): the local level's entry paths as a prefetch sees
them, the claim that keeps two processes of one machine off one key, the store's check and write
(given when JAX makes the store, at its first compile: ``open``), and the entries landed that no
lookup used yet, in one place: a lookup's first use takes its entry out (``take``), and at exit
what is left is the prefetch's waste and is recorded as written (``rest``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from gkx_autocache import _files, _fork
from gkx_autocache._layout import ENTRY_SUFFIX, META_DIR, TMP_SUFFIX


class Landed(NamedTuple):
    """A prefetched entry: its bytes as fetched, what it took on disk, its compile time, when it landed."""

    nbytes: int
    written: int
    compile_secs: float
    at: float


# The store's check and write of one prefetched entry: what it wrote on disk (None: refused or not
# written) and why not (None where the local level took no write: disk full).
Land = Callable[[str, Any], tuple[int | None, str | None]]


class Landing:
    """``path``, the local version directory; ``team``: a team directory (§8)."""

    def __init__(self, path: str, team: bool = False) -> None:
        self.path = path
        self.team = team
        self.meta = os.path.join(path, META_DIR)
        self.landed: dict[str, Landed] = {}
        self._land: Land | None = None
        self._writable = False
        self._uploadable: Callable[[str], tuple[bytes, bytes] | None] | None = None
        self._lock = threading.Lock()
        _fork.in_child(self._forked)

    def _forked(self) -> None:
        self._lock = threading.Lock()
        self.landed = {}  # the parent's: it records them

    def open(self, land: Land, writable: bool, uploadable: Callable[[str], tuple[bytes, bytes] | None]) -> None:
        """The store, once JAX has made it: its check and write, whether it takes writes, and the
        entries it may upload (healing, a pack)."""
        self._land, self._writable, self._uploadable = land, writable, uploadable

    @property
    def opened(self) -> bool:
        """Whether JAX has made the store."""
        return self._land is not None

    @property
    def writable(self) -> bool:
        """Whether an entry can land: the store is made and takes writes."""
        return self._land is not None and self._writable

    def has(self, key: str) -> bool:
        """Whether the entry is there (landed by another process, or compiled meanwhile)."""
        return os.path.exists(os.path.join(self.path, key + ENTRY_SUFFIX))

    def touched_since(self, key: str, when: float) -> bool:
        """Whether another process used the entry since ``when`` (a hit sets its mtime: recency)."""
        try:
            return os.stat(os.path.join(self.path, key + ENTRY_SUFFIX)).st_mtime > when
        except OSError:
            return False

    def claim(self, key: str, stale: float) -> str | None:
        """The claim file that keeps another process from fetching ``key`` here too, or None where
        it is landed or being fetched by another already."""
        if self.has(key):
            return None
        claim = f".{key}{ENTRY_SUFFIX}.prefetch{TMP_SUFFIX}"
        return claim if _files.claim(self.path, claim, stale=stale) else None

    def unclaim(self, claim: str) -> None:
        _files.unclaim(self.path, claim)

    def land(self, key: str, found: Any) -> tuple[bool, str | None]:
        """A prefetched entry, checked as a shared hit is and written: ``(landed, why not)``, why
        None where the local level took no write (disk full)."""
        if self._land is None:
            return False, None
        written, why = self._land(key, found)
        if written is None:
            return False, why
        with self._lock:
            # Dated once written: a later mtime is another process's hit (``touched_since``).
            self.landed[key] = Landed(len(found.data), written, found.compile_secs or 0.0, time.time())
        return True, None

    def take(self, key: str) -> Landed | None:
        """A lookup's hit on ``key``: where it is a prefetched entry's first use, that entry."""
        if not self.landed:
            return None
        with self._lock:
            return self.landed.pop(key, None)

    def rest(self) -> list[tuple[str, Landed]]:
        """At exit: the entries no lookup used, taken out."""
        with self._lock:
            rest, self.landed = list(self.landed.items()), {}
        return rest

    def uploadable(self, key: str) -> tuple[bytes, bytes] | None:
        """A local entry and the seal it may be uploaded with (healing, a pack), or None."""
        return self._uploadable(key) if self._uploadable is not None else None
