"""The files of a version directory (SPEC §7, §8): scanning them into entries with their sidecars,
choosing what to prune, what ``clear`` removes, verifying, for the CLI, the at-exit prune and
bundles; the removing itself is ``_remove``'s (only files named like entries, sidecars, temporary
files or the package's bookkeeping, only in a directory carrying the package's own tag, never
through a symlink).

Not imported on ``import jax``, nor at an exit that only folds its ledger.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from typing import Any

from gkx_autocache import _files
from gkx_autocache._layout import (
    COMPILE_SIDECAR,
    COUNT_FILE,
    ENTRY_SUFFIX,
    LEDGER_DIR,
    META_DIR,
    OWN_SUFFIXES,
    RECORD_SIDECAR,
    TAG_NAME,
    VERSION_PREFIX,
    common_name,
    is_temporary,
    is_url,
    key_match,
)
from gkx_autocache._remove import Removed, on_disk, remove_files, tagged

STALE_TMP_SECS = 3600.0


STALE_VERSION_SECS = 30 * 86400.0


# Plain classes, not dataclasses or NamedTuples: an exit that scans (hourly, or over the cap) imports
# this module, and four dataclasses cost 2 ms there (a NamedTuple ~0.3 ms).


class Unit:
    """One entry with its sidecars: pruned and cleared together."""

    __slots__ = ("key", "files", "bytes", "last_used", "has_entry", "uids", "written")

    def __init__(self, key: str, bytes: int = 0, last_used: float = 0.0, has_entry: bool = False) -> None:
        self.key = key
        self.files: list[str] = []
        self.bytes = bytes
        self.last_used = last_used
        self.has_entry = has_entry
        self.uids: set[int] = set()  # who owns its files (none known on a bucket)
        self.written = 0.0  # its newest sidecar's write (``in_flight``; none known on a bucket)


class Scan:
    def __init__(self) -> None:
        self.units: dict[str, Unit] = {}
        self.temporary: list[tuple[str, int, float]] = []  # (path, bytes, mtime)
        self.links: list[str] = []  # named like entries, never read
        self.not_regular: list[tuple[str, str]] = []  # (path, kind): a FIFO, a socket... named like one

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
            try:  # a file another process prunes meanwhile is simply gone
                if name.startswith("."):
                    if is_temporary(name) and item.is_file(follow_symlinks=False):
                        st = item.stat(follow_symlinks=False)
                        result.temporary.append((item.path, on_disk(st), st.st_mtime))
                    continue
                match = key_match(name)
                if match is None:
                    continue
                if item.is_symlink():
                    result.links.append(item.path)
                    continue
                st = item.stat(follow_symlinks=False)  # lstat: a FIFO is never opened
                if not stat.S_ISREG(st.st_mode):
                    result.not_regular.append((item.path, kind_of(st.st_mode)))
                    continue
            except OSError:
                continue
            key, suffix = match
            unit = result.units.get(key)
            if unit is None:
                unit = result.units[key] = Unit(key)
            unit.files.append(item.path)
            unit.bytes += on_disk(st)
            unit.uids.add(st.st_uid)
            if suffix == ENTRY_SUFFIX:
                unit.has_entry = True
                unit.last_used = max(unit.last_used, st.st_atime, st.st_mtime)
            else:
                unit.written = max(unit.written, st.st_mtime)
    try:  # the bookkeeping's own temporaries: a summary whose writer was killed
        with os.scandir(os.path.join(version_dir, META_DIR)) as items:
            for item in items:
                if is_temporary(item.name, bookkeeping=True) and item.is_file(follow_symlinks=False):
                    st = item.stat(follow_symlinks=False)
                    result.temporary.append((item.path, on_disk(st), st.st_mtime))
    except OSError:
        pass
    return result


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return kind
    return "a special file"


def count(version_dir: str) -> tuple[int, int]:
    """``(entries, bytes)`` of a version directory, where bytes are what the cap counts: entries,
    sidecars, temporary files and the package's bookkeeping. ``status``'s fast path: no grouping,
    one ``stat`` per file, and none at all where the directory has not changed since it was last
    counted (``recorded``; 100 000 entries: docs/benchmarks.md, "The CLI on 100 000 entries")."""
    if is_url(version_dir):
        found = scan(version_dir)
        return found.entries, found.bytes
    if os.name == "nt":  # a directory has no descriptor there: JAX's own files, by name (_cache.windows)
        return _count_by_path(version_dir)
    try:
        fd = os.open(version_dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return 0, 0
    try:
        before = os.fstat(fd)
        counted = recorded(version_dir, before)
        if counted is None:
            started = time.time()
            entries, total, newest = _count_in(fd)
            counted = entries, total
            if os.fstat(fd).st_ctime_ns == before.st_ctime_ns and started - max(before.st_ctime, newest) > QUIET_SECS:
                _record(version_dir, before, counted)
    except OSError:
        return 0, 0
    finally:
        os.close(fd)
    return counted[0], counted[1] + bookkeeping_bytes(version_dir)


# A count is kept with the directory's inode and change time, which every entry's creation, removal
# or rename changes, and which no one can set back (``touch``, ``rsync -a`` and ``tar`` restore a
# modification time). Kept only where the directory and every file in it were quiet for QUIET_SECS
# before the count began: a change after it has a later time (also where a file system keeps times
# to 2 s), and an entry still being written in place (JAX's own cache writes so) is not kept half.
QUIET_SECS = 10.0


def count_path(version_dir: str) -> str | None:
    """Where a directory's count is kept: in its own bookkeeping where the package made it (or a run
    of the store served it); else (stock JAX's directory, another version's, a copy: ``status``
    writes nothing in a directory that is not the package's) in this user's cache, by the
    directory's real path. None where this user has no cache folder. Without the second place, such
    a directory was counted whole at every ``status``: 3.3-5.7 s at 100 000 entries (issue 71)."""
    meta = os.path.join(version_dir, META_DIR)
    if os.path.isdir(meta) and not os.path.islink(meta):
        return os.path.join(meta, COUNT_FILE)
    import hashlib

    from gkx_autocache._userdirs import user_dir

    folder = user_dir("cache", "gkx")
    if folder is None:
        return None
    named = hashlib.sha256(os.path.realpath(version_dir).encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return os.path.join(folder, "counts", named)


def recorded(version_dir: str, now: os.stat_result) -> tuple[int, int] | None:
    """The ``(entries, bytes)`` counted when the directory was as ``now`` is, or None. Written by this
    user or the directory's owner only: another member of a team's directory is not believed."""
    def check(st: os.stat_result) -> str | None:
        return None if st.st_uid in (os.getuid(), now.st_uid) else "written by another user"

    path = count_path(version_dir)
    text = _files.read(path, 256, check=check) if path is not None else None
    words = text.split() if text is not None else []
    if len(words) != 4 or not all(w.isdigit() for w in words):
        return None
    inode, ctime_ns, entries, total = map(int, words)
    return (entries, total) if (inode, ctime_ns) == (now.st_ino, now.st_ctime_ns) else None


def _record(version_dir: str, when: os.stat_result, counted: tuple[int, int]) -> None:
    path = count_path(version_dir)
    if path is None:
        return
    if not path.endswith(os.path.join(META_DIR, COUNT_FILE)):  # this user's own folder: made where missing
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        except OSError:
            return
    _files.write_atomic(path, f"{when.st_ino} {when.st_ctime_ns} {counted[0]} {counted[1]}\n".encode(), 0o644)


def _count_in(fd: int) -> tuple[int, int, float]:
    # Names, then one lstat each relative to the directory: the cheapest way in Python (scandir's
    # DirEntry objects cost more than they save). The common names take one C call; the rest,
    # key_match. 100 000 entries (200 000 files): lstat 0.5 s (0.4 s in the kernel), listdir 0.1 s,
    # the names 0.1 s (docs/benchmarks.md). Also the newest change time of a file counted.
    common = common_name()
    stat_at = os.stat
    entries = blocks = 0
    newest = 0.0
    for name in os.listdir(fd):
        if common(name) is not None:
            entry = name.endswith(ENTRY_SUFFIX)
        elif name[0] == ".":
            if not is_temporary(name):
                continue
            entry = False
        else:
            match = key_match(name)
            if match is None:
                continue
            entry = match[1] == ENTRY_SUFFIX
        try:
            st = stat_at(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            blocks += st.st_blocks
            entries += entry
            if st.st_ctime > newest:
                newest = st.st_ctime
    return entries, blocks * 512, newest


def _count_by_path(version_dir: str) -> tuple[int, int]:
    entries = total = 0
    try:
        with os.scandir(version_dir) as items:
            for item in items:
                match = key_match(item.name)
                if match is not None and item.is_file(follow_symlinks=False):
                    total += item.stat(follow_symlinks=False).st_size
                    entries += match[1] == ENTRY_SUFFIX
    except OSError:
        return 0, 0
    return entries, total


def bookkeeping_bytes(version_dir: str) -> int:
    """The bytes of ``.gkx-autocache/`` and its ledgers: the cap counts them too."""
    total = 0
    for folder in (os.path.join(version_dir, META_DIR), os.path.join(version_dir, META_DIR, LEDGER_DIR)):
        try:
            with os.scandir(folder) as items:
                for item in items:
                    try:
                        if item.is_file(follow_symlinks=False) and not is_temporary(item.name, True):  # scan counts those
                            total += on_disk(item.stat(follow_symlinks=False))
                    except OSError:
                        continue
        except OSError:
            continue
    return total


def _scan_remote(version_dir: str, result: Scan) -> Scan:
    """The same grouping over an object listing; an object's recency is its last write (object
    stores keep no access time, and JAX's stock cache writes none unless its own cap is on)."""
    from gkx_autocache import _remote

    for name, size, mtime, prefix in _remote.listing(version_dir):
        match = None if prefix else key_match(name)
        if match is None:
            continue
        key, suffix = match
        unit = result.units.get(key)
        if unit is None:
            unit = result.units[key] = Unit(key)
        unit.files.append(f"{version_dir}/{name}")
        unit.bytes += size
        if suffix == ENTRY_SUFFIX:
            unit.has_entry = True
            unit.last_used = max(unit.last_used, mtime)
    return result


def in_flight(unit: Unit, now: float) -> bool:
    """Whether the unit's sidecars, without their entry, may be a writer's, mid-put (the seal and
    the compile time are written before the entry, ``LocalLevel.put``): as young as a temporary
    file that is not stale. Not an orphan: one removed now leaves the entry without it."""
    return not unit.has_entry and unit.written > now - STALE_TMP_SECS


def least_recent_first(units: list[Unit]) -> list[Unit]:
    now = time.time()  # orphans first; sidecars mid-put as recent as their write
    return sorted(units, key=lambda u: (u.has_entry or in_flight(u, now), u.last_used if u.has_entry else u.written))


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


# -- removing: only in a tagged directory, never through a symlink --------------------------------


def version_dirs(root: str) -> list[str]:
    """The ``jax-*`` directories under ``root``; a symlink named like one is not one."""
    if is_url(root):
        from gkx_autocache import _remote

        return _remote.version_dirs(root)
    try:
        with os.scandir(root) as items:
            names = sorted(i.name for i in items if i.name.startswith(VERSION_PREFIX) and i.is_dir(follow_symlinks=False))
    except OSError:
        return []
    return [os.path.join(root, n) for n in names]


def last_used(version_dir: str) -> float:
    """When a process last used the directory: its newest entry access or write, or bookkeeping
    write (a ledger, the summary)."""
    newest = max((u.last_used for u in scan(version_dir).units.values()), default=0.0)
    if is_url(version_dir):
        from gkx_autocache import _remote

        ledgers = _remote.listing(f"{version_dir}/{META_DIR}/{LEDGER_DIR}")
        return max([newest, *(mtime for _, _, mtime, _ in ledgers)])
    for folder in (os.path.join(version_dir, META_DIR), os.path.join(version_dir, META_DIR, LEDGER_DIR)):
        try:
            with os.scandir(folder) as items:
                for item in items:
                    if item.is_file(follow_symlinks=False) and item.name != COUNT_FILE:  # (status writes it)
                        newest = max(newest, item.stat(follow_symlinks=False).st_mtime)
        except OSError:
            continue
    return newest


def stale(version_dir: str, installed: str, now: float | None = None) -> bool:
    """A directory of a JAX version not installed here that no process has used for 30 days: the
    user cache is shared by environments with other JAX versions (SPEC §8)."""
    if os.path.basename(version_dir.rstrip("/")) == installed:
        return False
    return last_used(version_dir) < (time.time() if now is None else now) - STALE_VERSION_SECS


def remove_version_dir(version_dir: str) -> None:
    """Everything the package put in a tagged version directory, then the directory itself if
    nothing else is left; never through a symlink (``rmtree`` under a directory descriptor)."""
    found = scan(version_dir)
    remove_files(version_dir, [p for u in found.units.values() for p in u.files] + [t[0] for t in found.temporary])
    if is_url(version_dir):
        from gkx_autocache import _remote

        _remote.remove(version_dir, _remote.ledger_files(version_dir))
        return
    import shutil

    parent, name = os.path.split(version_dir)
    try:
        root = _files.open_dir(parent)
    except OSError:
        return
    try:
        vfd = os.open(name, os.O_RDONLY | _files.DIRECTORY | _files.NOFOLLOW, dir_fd=root)
        try:
            if not tagged(vfd):
                return
            shutil.rmtree(META_DIR, ignore_errors=True, dir_fd=vfd)  # refuses a symlink, never follows one
            os.unlink(TAG_NAME, dir_fd=vfd)
        finally:
            os.close(vfd)
        os.rmdir(name, dir_fd=root)
    except OSError:
        pass
    finally:
        os.close(root)


# -- what the commands remove -------------------------------------------------------------------


class Removal:
    """The units and temporary files a command removes (or would, with ``--dry-run``)."""

    def __init__(self, version_dir: str, units: list[Unit], temporary: list[tuple[str, int, float]],
                 compile_secs: float, before: tuple[int, int] | None = None) -> None:
        self.version_dir = version_dir
        self.units = units
        self.temporary = temporary
        self.compile_secs = compile_secs  # what it cost to compile them, where the sidecars say
        self.before = before  # (entries, bytes as the cap counts them) the scan found, where it is known

    @property
    def files(self) -> list[str]:
        return [p for u in self.units for p in u.files] + [t[0] for t in self.temporary]

    @property
    def entries(self) -> int:
        return sum(1 for u in self.units if u.has_entry)

    @property
    def bytes(self) -> int:
        return sum(u.bytes for u in self.units) + sum(t[1] for t in self.temporary)


def _removal(version_dir: str, units: list[Unit], temporary: list[tuple[str, int, float]]) -> Removal:
    return Removal(version_dir, units, temporary, sum(compile_secs(u) for u in units))


def compile_secs(unit: Unit) -> float:
    """What the unit's entry cost to compile, from its sidecar (0 where there is none: written by
    stock JAX, or on a bucket). About 3 us a unit: 0.3 s for 100 000."""
    from gkx_autocache._formats import read_compile_secs

    for path in unit.files:
        if path.endswith(COMPILE_SIDECAR) and not is_url(path):
            return read_compile_secs(path) or 0.0
    return 0.0


def made_here(version_dir: str) -> bool:
    """Whether the package made ``version_dir`` (its own tag at the top; a bucket's prefix counts):
    a directory that existed before it served it (a framework's, the user's own JAX directory)
    carries the tag only in its bookkeeping folder, and may hold files of other tools."""
    if is_url(version_dir):
        return True
    from gkx_autocache._remove import tag_at_top

    try:
        fd = _files.open_dir(version_dir)
    except OSError:
        return False
    try:
        return tag_at_top(fd)
    finally:
        os.close(fd)


def ours(version_dir: str, units: list[Unit], made: bool | None = None) -> list[Unit]:
    """The units the package may remove (SPEC §7, amended 2026-12-06): in a directory it did not
    make, only what it can show it wrote: units of this user's files alone whose entry carries
    JAX's format (a compressed frame: 4 bytes read), or that have no entry and only the package's
    own sidecars. Another tool's ``model-<sha256>-cache`` or ``notes-<sha256>-atime`` stays."""
    if made if made is not None else made_here(version_dir):
        return units
    from gkx_autocache._formats import compression_of

    me = os.geteuid() if hasattr(os, "geteuid") else None

    def jax_format(unit: Unit) -> bool:
        entry = next(p for p in unit.files if p.endswith(ENTRY_SUFFIX))
        head = _files.read(entry, 4)
        return head is not None and compression_of(head) is not None

    def sidecars(unit: Unit) -> bool:
        return all(p.endswith(OWN_SUFFIXES) for p in unit.files)

    return [u for u in units if all(uid == me for uid in u.uids) and (jax_format(u) if u.has_entry else sidecars(u))]


def plan_clear(version_dir: str) -> Removal:
    found = scan(version_dir)
    return _removal(version_dir, ours(version_dir, list(found.units.values())), found.temporary)


def plan_prune(version_dir: str, cap: int, older_than: float | None = None) -> Removal:
    """Entries unused for ``older_than`` seconds, then the least recently used until the rest fits
    in ``cap`` bytes (0: no cap), and temporary files left by processes that died writing (in a
    directory the package did not make, only under a cap)."""
    found = scan(version_dir)
    made = made_here(version_dir)
    units = ours(version_dir, list(found.units.values()), made)
    now = time.time()
    chosen: list[Unit] = []
    rest: list[Unit] = []
    for unit in units:  # one pass: `unit not in chosen` compared dataclasses, 100 000 x 100 000
        old = older_than is not None and unit.last_used < now - older_than and not in_flight(unit, now)
        (chosen if old else rest).append(unit)
    if cap:
        chosen += select_over(rest, cap)
    stale_tmp = [t for t in found.temporary if now - t[2] > STALE_TMP_SECS] if made or cap else []
    removal = _removal(version_dir, chosen, stale_tmp)
    removal.before = (found.entries, found.bytes + bookkeeping_bytes(version_dir))  # what remains, without a recount
    return removal


def execute(removal: Removal, progress: Callable[[int, int], None] | None = None) -> Removed:
    """Remove what ``removal`` lists (``progress(done, total)`` as it goes). Raises RemovalRefused."""
    if not removal.files:
        return Removed()
    return remove_files(removal.version_dir, removal.files, progress)


def check_entry(path: str) -> str | None:
    """Why the entry cannot be loaded, or None. Decompresses without importing JAX."""
    from gkx_autocache._formats import compression_of

    if is_url(path):
        from gkx_autocache import _remote

        data = _remote.read_bytes(path)
    else:
        data = _files.read(path)
    if data is None:
        return "unreadable"
    kind = compression_of(data)
    try:
        if kind == "zlib":
            import zlib

            payload = zlib.decompress(data)
        elif kind == "zstd":
            try:
                import zstandard  # type: ignore[import-not-found]
            except ImportError:
                return None  # cannot check here; JAX with zstandard will
            payload = zstandard.ZstdDecompressor().decompress(data)
        else:
            return "not a compressed JAX entry"
    except Exception as exc:
        return f"does not decompress ({exc})"
    return None if len(payload) > 4 else "empty executable"


class Verification:
    """What ``verify`` found; in a directory the package did not make, links and other odd files
    named like entries are listed, never removed (they are not the package's)."""

    def __init__(self, version_dir: str, checked: int, corrupt: list[tuple[Unit, str]], orphans: list[str],
                 stale: list[str], links: list[str], not_regular: list[tuple[str, str]], made: bool = True) -> None:
        self.version_dir = version_dir
        self.checked = checked
        self.corrupt = corrupt
        self.orphans = orphans  # sidecars whose entry is gone
        self.stale = stale  # temporary files of processes that died writing
        self.links = links  # named like entries: never read
        self.not_regular = not_regular  # (path, kind) named like entries: never read
        self.made = made  # the package made the directory (``made_here``)

    @property
    def doomed(self) -> list[str]:
        """What ``--repair`` unlinks (directories are ``doomed_dirs``: removed only when empty)."""
        odd = [p for p, kind in self.not_regular if kind != "a directory"] + self.links if self.made else []
        corrupt = [p for u, _ in self.corrupt for p in u.files if not p.endswith(RECORD_SIDECAR)]  # (its record: rebuild's)
        return corrupt + self.orphans + self.stale + odd

    @property
    def doomed_dirs(self) -> list[str]:
        return [p for p, kind in self.not_regular if kind == "a directory"] if self.made else []


def verify(version_dir: str, progress: Any = None) -> Verification:
    """Read back every entry of ``version_dir``."""
    found = scan(version_dir)
    corrupt: list[tuple[Unit, str]] = []
    orphans: list[str] = []
    made = made_here(version_dir)
    units = ours(version_dir, list(found.units.values()), made)  # another tool's file of an entry's name is not one
    now = time.time()
    units = [u for u in units if not in_flight(u, now)]
    for i, unit in enumerate(units):
        if progress is not None and i % 1000 == 0:
            progress(f"verify: {i}/{len(units)} entries checked")
        entry = next((p for p in unit.files if p.endswith(ENTRY_SUFFIX)), None)
        if entry is None:  # a record stays: it is what rebuild makes the entry again from (SPEC §18)
            orphans.extend(p for p in unit.files if not p.endswith(RECORD_SIDECAR))
            continue
        why = check_entry(entry)
        if why:
            corrupt.append((unit, why))
    if progress is not None:
        progress("")
    stale_tmp = [t[0] for t in found.temporary if time.time() - t[2] > STALE_TMP_SECS]
    return Verification(version_dir, len(units) - len(orphans), corrupt, orphans, stale_tmp, found.links,
                        found.not_regular, made)
