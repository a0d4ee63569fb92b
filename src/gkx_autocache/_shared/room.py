"""The room a prefetch takes under the local level's cap (SPEC §14): what an entry costs on disk
(``cost``), and this process's share of the room, said in the bookkeeping for the other fresh
processes of its local level (``Reservation``).
"""

from __future__ import annotations

import os

from gkx_autocache import _files
from gkx_autocache._layout import TMP_SUFFIX

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
            self._rename(staged, name)
            self.name = name
            os.utime(fd)  # ordered by when it was seen, not made: a later one never takes an earlier's room
        except (OSError, ImportError):  # (no flock here: a reservation nobody could tell is live)
            self.close()
            return budget - self._taken(None)
        granted = min(budget, room - self._taken(name))
        if granted < budget:  # said as what it holds (the lock goes with the file)
            smaller = f"{RESERVED}{os.getpid()}.{max(granted, 0)}{TMP_SUFFIX}"
            try:
                self._rename(name, smaller)
                self.name = smaller
            except OSError:
                self.close()
                return 0
        return granted

    def _rename(self, old: str, new: str) -> None:
        """``old`` to ``new`` in the bookkeeping, through its folder's descriptor."""
        folder = _files.open_dir(os.path.abspath(self.meta), search=True)
        try:
            os.rename(old, new, src_dir_fd=folder, dst_dir_fd=folder)
        finally:
            os.close(folder)

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
