"""The files of a version directory (SPEC §7, §8): scanning them into entries with their sidecars,
choosing what to prune, and removing, for the CLI and the at-exit prune. Only files named like
entries, sidecars or temporary files are touched, only in a tagged directory, never through a
symlink; on a remote directory, only objects named like entries and sidecars.

Not imported on ``import jax``: the CLI, the at-exit prune and bundles use it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from gkx_autocache._cache import ENTRY_SUFFIX, META_DIR, TAG_NAME, Refused, has_tag, is_url
from gkx_autocache._diagnostics import logger

_KEY = r"^(?P<key>.+-[0-9a-f]{64})(?P<suffix>-[A-Za-z0-9_-]+)$"
STALE_TMP_SECS = 3600.0


def key_match(name: str) -> re.Match[str] | None:
    return re.match(_KEY, name)


@dataclass
class Unit:
    """One entry with its sidecars: pruned and cleared together."""

    key: str
    files: list[str] = field(default_factory=list)
    bytes: int = 0
    last_used: float = 0.0
    has_entry: bool = False


@dataclass
class Scan:
    units: dict[str, Unit] = field(default_factory=dict)
    temporary: list[tuple[str, int, float]] = field(default_factory=list)  # (path, bytes, mtime)
    links: list[str] = field(default_factory=list)  # named like entries, never read

    @property
    def bytes(self) -> int:
        return sum(u.bytes for u in self.units.values()) + sum(t[1] for t in self.temporary)

    @property
    def entries(self) -> int:
        return sum(1 for u in self.units.values() if u.has_entry)


def scan(version_dir: str) -> Scan:
    """Group the directory's files by key. Files of other shapes are not the package's: ignored."""
    result = Scan()
    if is_url(version_dir):
        return _scan_remote(version_dir, result)
    try:
        iterator = os.scandir(version_dir)
    except OSError:
        return result
    with iterator:
        for item in iterator:
            name = item.name
            if name.startswith("."):
                if name.endswith(".tmp") and item.is_file(follow_symlinks=False):
                    st = item.stat(follow_symlinks=False)
                    result.temporary.append((item.path, st.st_size, st.st_mtime))
                continue
            match = key_match(name)
            if match is None:
                continue
            if item.is_symlink():
                result.links.append(item.path)
                continue
            if not item.is_file(follow_symlinks=False):
                continue
            st = item.stat(follow_symlinks=False)
            unit = result.units.get(match["key"])
            if unit is None:
                unit = result.units[match["key"]] = Unit(match["key"])
            unit.files.append(item.path)
            unit.bytes += st.st_size
            if match["suffix"] == ENTRY_SUFFIX:
                unit.has_entry = True
                unit.last_used = max(unit.last_used, st.st_atime, st.st_mtime)
    return result


def _scan_remote(version_dir: str, result: Scan) -> Scan:
    """The same grouping over an object listing; an object's recency is its last write (object
    stores keep no access time, and JAX's stock cache writes none unless its own cap is on)."""
    from gkx_autocache import _remote

    for name, size, mtime, prefix in _remote.listing(version_dir):
        match = None if prefix else key_match(name)
        if match is None:
            continue
        unit = result.units.get(match["key"])
        if unit is None:
            unit = result.units[match["key"]] = Unit(match["key"])
        unit.files.append(f"{version_dir}/{name}")
        unit.bytes += size
        if match["suffix"] == ENTRY_SUFFIX:
            unit.has_entry = True
            unit.last_used = max(unit.last_used, mtime)
    return result


def least_recent_first(units: list[Unit]) -> list[Unit]:
    return sorted(units, key=lambda u: (u.has_entry, u.last_used))  # orphans first


def select_over(units: list[Unit], target: int) -> list[Unit]:
    """The least recently used units to remove so that the rest fits in ``target`` bytes."""
    total = sum(u.bytes for u in units)
    chosen = []
    for unit in least_recent_first(units):
        if total <= target:
            break
        chosen.append(unit)
        total -= unit.bytes
    return chosen


def remove_files(version_dir: str, paths: list[str]) -> int:
    """Unlink the given files of a tagged directory; the bytes freed. Refuses an untagged one.
    On a remote directory, deletes objects named like entries and sidecars; the count deleted."""
    if not has_tag(version_dir):
        raise Refused(f"{version_dir} has no gkx-autocache {TAG_NAME}: nothing removed")
    if is_url(version_dir):
        from gkx_autocache import _remote

        return _remote.remove(version_dir, paths)
    freed = 0
    for path in paths:
        if os.path.dirname(path) != version_dir:
            continue
        try:
            st = os.lstat(path)
            os.unlink(path)  # unlink never follows a symlink
            freed += st.st_size
        except OSError:
            continue
    return freed


def forget_size(version_dir: str) -> None:
    """Drop the at-exit prune's size estimate after entries were added or removed by hand."""
    if is_url(version_dir):
        return
    try:
        os.unlink(os.path.join(version_dir, META_DIR, "size"))
    except OSError:
        pass


def prune_at_exit(version_dir: str, cap: int, written: int) -> None:
    """Keep the directory under ``cap``: prune to 90 % of it, least recently used first.

    Runs at exit in a process that wrote entries, under a non-blocking lock (a process that finds
    it taken skips). The size is kept in ``.gkx-autocache/size``: a full scan happens only when
    that estimate crosses the cap, or is over an hour old.
    """
    import fcntl
    import time

    meta = os.path.join(version_dir, META_DIR)
    try:
        lock = os.open(os.path.join(meta, "prune.lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    except OSError:
        return
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return
        size_file = os.path.join(meta, "size")
        estimate = None
        try:
            if time.time() - os.stat(size_file).st_mtime < 3600:
                with open(size_file, encoding="ascii") as f:
                    estimate = int(f.read()) + written
        except (OSError, ValueError):
            pass
        if estimate is None or estimate > cap:
            found = scan(version_dir)
            units = list(found.units.values())
            removed = select_over(units, int(cap * 0.9)) if found.bytes > cap else []
            freed = remove_files(version_dir, [p for u in removed for p in u.files])
            estimate = found.bytes - freed
            if removed:
                logger.debug("pruned %d entries (%d bytes) from %s", len(removed), freed, version_dir)
        tmp = f"{size_file}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="ascii") as f:
            f.write(str(estimate))
        os.replace(tmp, size_file)
    except (OSError, Refused) as exc:
        logger.debug("prune skipped: %s", exc)
    finally:
        os.close(lock)
