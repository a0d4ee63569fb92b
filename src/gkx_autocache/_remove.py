"""Removing files of a version directory (SPEC §7, §8), never through a symlink at any level and
only in a directory carrying the package's own tag; on a bucket, only objects named like entries,
sidecars and ledgers. Every process that folds its ledger at exit removes it: this module is what
such an exit imports, not the scanning and choosing of ``_entries``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from gkx_autocache import _files
from gkx_autocache._layout import META_DIR, TAG_NAME, is_own_tag, is_url


def on_disk(st: os.stat_result) -> int:
    """A file's bytes as ``du`` counts them: its allocated blocks (an 8-byte sidecar takes a 4 KiB
    block). The cap, ``status`` and ``prune`` all count this way (SPEC §10)."""
    blocks = getattr(st, "st_blocks", None)
    return blocks * 512 if blocks is not None else st.st_size


class RemovalRefused(Exception):
    """Nothing is removed; the message says why, in words for the user."""


def has_tag(version_dir: str) -> bool:
    """Whether ``version_dir`` carries the package's own ``CACHEDIR.TAG``, reached without
    following a symlink at any level, so that its entries may be deleted. An object store has no
    directory to tag: there the version prefix and the entry names are what is recognised, so a
    URL counts as tagged."""
    if is_url(version_dir):
        return True
    if os.name == "nt":  # no directory descriptors there (_cache.windows): by path
        data = _files.read(os.path.join(version_dir, TAG_NAME), 4096)
        return data is not None and is_own_tag(data)
    try:
        fd = _files.open_dir(version_dir)
    except OSError:
        return False
    try:
        return tagged(fd)
    finally:
        os.close(fd)


def tagged(dir_fd: int) -> bool:
    """The package's own tag in the directory, or in its bookkeeping folder: a directory that
    existed before the store served it (one a framework gave JAX, ``_adopted``) gets no tag of its
    own, which would hide it from backups, but the folder the package made in it has one."""
    if _tag_in(dir_fd):
        return True
    try:  # a tag of the directory's own that is not the package's (a FIFO, another tool's): not a cache of ours
        os.stat(TAG_NAME, dir_fd=dir_fd, follow_symlinks=False)
        return False
    except OSError:
        pass
    try:
        meta = os.open(META_DIR, os.O_RDONLY | _files.DIRECTORY | _files.NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        return _tag_in(meta)
    finally:
        os.close(meta)


def tag_at_top(dir_fd: int) -> bool:
    """The package's own tag in the directory itself: the package made it (``tagged`` takes the
    bookkeeping folder's too)."""
    return _tag_in(dir_fd)


def _tag_in(dir_fd: int) -> bool:
    try:
        tag = _files.open_regular(TAG_NAME, dir_fd=dir_fd)
    except OSError:
        return False
    with os.fdopen(tag, "rb") as f:
        try:
            return is_own_tag(f.read(4096))
        except OSError:
            return False


class Removed:
    """What a removal did: files and bytes removed, and the paths that could not be."""

    __slots__ = ("files", "bytes", "failed")

    def __init__(self, files: int = 0, bytes: int = 0, failed: tuple[str, ...] = ()) -> None:
        self.files, self.bytes, self.failed = files, bytes, failed

    def __add__(self, other: object) -> Removed:
        assert isinstance(other, Removed)
        return Removed(self.files + other.files, self.bytes + other.bytes, self.failed + other.failed)

    def why(self) -> str:
        return f"{len(self.failed)} files could not be removed, such as {self.failed[0]}" if self.failed else ""


def remove_files(version_dir: str, paths: list[str], progress: Callable[[int, int], None] | None = None) -> Removed:
    """Unlink the given files of a tagged version directory (entries, sidecars, temporaries, and
    bookkeeping under ``.gkx-autocache``). Every directory on the way is opened without following
    a symlink, so nothing outside the cache is touched, whatever was planted or renamed. Raises
    RemovalRefused for an untagged directory or one reached through a symlink. On a bucket, deletes
    objects named like entries, sidecars or ledgers. ``progress(done, total)``: as it goes."""
    if is_url(version_dir):
        from gkx_autocache import _remote

        return Removed(_remote.remove(version_dir, paths, progress))
    try:
        top = _files.open_dir(version_dir)
    except OSError as exc:
        raise RemovalRefused(f"{version_dir} cannot be opened without following a symlink ({exc.strerror}): "
                      "nothing removed") from None
    try:
        if not tagged(top):
            raise RemovalRefused(f"{version_dir} has no gkx-autocache {TAG_NAME}: nothing removed")
        by_folder: dict[str, list[str]] = {}
        inside = version_dir.rstrip("/") + "/"
        for path in paths:
            if path.startswith(inside) and "/../" not in path and not path.endswith("/.."):
                folder, name = os.path.split(path[len(inside):])
                by_folder.setdefault(folder, []).append(name)
        done = Removed()
        for folder, names in by_folder.items():
            for at in range(0, len(names), 500):  # (a part at a time: the count moves on a terminal)
                done += _unlink_in(top, version_dir, folder, names[at:at + 500])
                if progress is not None:
                    progress(min(done.files + len(done.failed), len(paths)), len(paths))
        if progress is not None:
            progress(len(paths), len(paths))
        return done
    finally:
        os.close(top)


def _unlink_in(top: int, version_dir: str, folder: str, names: list[str]) -> Removed:
    try:
        fd = _files.open_dir(folder, dir_fd=top) if folder else top
    except OSError:
        return Removed(failed=tuple(os.path.join(version_dir, folder, n) for n in names))
    files = freed = 0
    failed = []
    try:
        for name in names:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode):
                    os.unlink(name, dir_fd=fd)  # unlink never follows a symlink
                    files += 1
                    freed += on_disk(st)
            except FileNotFoundError:
                continue  # gone already (another process pruned it)
            except OSError:
                failed.append(os.path.join(version_dir, folder, name))
    finally:
        if fd != top:
            os.close(fd)
    return Removed(files, freed, tuple(failed))


def remove_empty_dirs(version_dir: str, paths: list[str]) -> list[str]:
    """Remove the given directories of a tagged version directory if they are empty (``rmdir``
    neither follows a symlink nor removes what is inside); the paths left. Raises RemovalRefused."""
    try:
        top = _files.open_dir(version_dir)
    except OSError as exc:
        raise RemovalRefused(f"{version_dir} cannot be opened without following a symlink ({exc.strerror}): "
                      "nothing removed") from None
    left = []
    try:
        if not tagged(top):
            raise RemovalRefused(f"{version_dir} has no gkx-autocache {TAG_NAME}: nothing removed")
        for path in paths:
            folder, name = os.path.split(path)
            if folder != version_dir.rstrip("/") or name in ("", ".", ".."):
                left.append(path)
                continue
            try:
                os.rmdir(name, dir_fd=top)
            except FileNotFoundError:
                continue
            except OSError:
                left.append(path)
    finally:
        os.close(top)
    return left
