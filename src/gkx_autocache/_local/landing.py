"""What a prefetch landed in the local level that no lookup has used yet (SPEC §14), in one place:
a lookup's first use of such an entry takes it out (``take``: the shared level's hit, recorded at
that lookup), and at exit what is left is the prefetch's waste, recorded as written (``rest``).
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from gkx_autocache import _fork


class Receipt(NamedTuple):
    """What landing one prefetched entry cost: its bytes as fetched, what it took on disk, its
    compile time, and when it landed (a later access time is another process's hit)."""

    nbytes: int
    disk: int
    compile_secs: float
    at: float


class Landings:
    """The receipts of the entries landed and not used yet, by key."""

    def __init__(self) -> None:
        self._landed: dict[str, Receipt] = {}
        self._lock = threading.Lock()
        _fork.in_child(self._forked)

    def _forked(self) -> None:
        self._lock = threading.Lock()
        self._landed = {}  # the parent's: it records them

    def book(self, key: str, receipt: Receipt) -> None:
        with self._lock:
            self._landed[key] = receipt

    def __contains__(self, key: object) -> bool:
        return key in self._landed

    def items(self) -> list[tuple[str, Receipt]]:
        with self._lock:
            return list(self._landed.items())

    def take(self, key: str) -> Receipt | None:
        """A lookup's hit on ``key``: where it is a prefetched entry's first use, its receipt."""
        if not self._landed:
            return None
        with self._lock:
            return self._landed.pop(key, None)

    def rest(self) -> list[tuple[str, Receipt]]:
        """At exit: the entries no lookup used, taken out."""
        with self._lock:
            rest, self._landed = list(self._landed.items()), {}
        return rest
