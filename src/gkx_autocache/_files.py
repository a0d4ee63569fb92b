"""File primitives shared by every reader, writer and deleter of the cache: reads that never
follow a symlink, atomic writes, directories opened without following a symlink at any level,
and the modes the package gives what it creates.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import BinaryIO

from gkx_autocache import _mount
from gkx_autocache._diagnostics import logger
from gkx_autocache._layout import LEASE_DIR, LEDGER_DIR, META_DIR, TAG, TAG_NAME, VERSION_PREFIX, tmp_name

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
DIRECTORY = getattr(os, "O_DIRECTORY", 0)
BINARY = getattr(os, "O_BINARY", 0)  # Windows: without it, a descriptor translates line ends


def file_mode(team: bool) -> int:
    """Entries and sidecars: the group's too in a team cache (SPEC §8)."""
    return 0o660 if team else 0o600


def dir_mode(team: bool) -> int:
    """Directories: setgid in a team cache, so that what members create keeps the team's group."""
    return 0o2770 if team else 0o700


NONBLOCK = getattr(os, "O_NONBLOCK", 0)
NOATIME = getattr(os, "O_NOATIME", 0)  # Linux: a read that leaves the file's access time as it was


def open_regular(path: str, dir_fd: int | None = None, write: bool = False) -> int:
    """A descriptor of a regular file (read-only unless ``write``), never through a symlink, and
    never one that blocks: a FIFO planted where a file should be must not hang ``import jax`` or a
    command (``O_NONBLOCK`` opens it at once; then it is refused, as a device or a directory is).
    Raises OSError."""
    return _open_regular(path, dir_fd, write)[0]


def _open_regular(path: str, dir_fd: int | None = None, write: bool = False,
                  keep_atime: bool = False) -> tuple[int, os.stat_result]:
    flags = (os.O_RDWR if write else os.O_RDONLY) | NOFOLLOW | NONBLOCK | BINARY
    try:
        fd = os.open(path, flags | (NOATIME if keep_atime else 0), dir_fd=dir_fd)
    except PermissionError:
        if not (keep_atime and NOATIME):
            raise
        # O_NOATIME is the owner's (or CAP_FOWNER's): another member's file in a team directory is read plainly.
        fd = os.open(path, flags, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read(path: str, limit: int = -1, check: Callable[[os.stat_result], str | None] | None = None,
         keep_atime: bool = False) -> bytes | None:
    """The regular file's bytes (at most ``limit``), or None. Never through a symlink: a planted
    link must not feed JAX. ``check`` may refuse the file by its ``fstat`` (who may write it).
    ``keep_atime``: the read is not a use (an export), so the access time, the entry's recency, is
    left as it was where the kernel allows (``O_NOATIME``). Every hit reads its entry and sidecar
    here: one ``fstat``, and ``read`` calls sized by it (five system calls where a buffered file
    makes eight)."""
    try:
        fd, st = _open_regular(path, keep_atime=keep_atime)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ELOOP):
            logger.debug("cannot read %s: %s", path, exc)
        return None
    try:
        if check is not None and (why := check(st)):
            logger.debug("not reading %s: %s", path, why)
            return None
        if 0 <= limit <= 65536:  # a sidecar: a regular file reads short only at its end
            return os.read(fd, limit)
        if st.st_size >= 1 << 30:  # a buffered read's own growth, not a list of chunks and their join
            with os.fdopen(fd, "rb") as f:
                fd = -1
                return f.read(limit)
        chunks = []
        size = st.st_size + 1  # the whole file in the first call; the next finds the end
        while limit != 0 and (chunk := os.read(fd, size if limit < 0 else min(size, limit))):
            chunks.append(chunk)
            limit = limit - len(chunk) if limit > 0 else limit
            size = 1 << 20
        return b"".join(chunks)
    except OSError as exc:
        logger.debug("cannot read %s: %s", path, exc)
        return None
    finally:
        if fd >= 0:
            os.close(fd)


@contextmanager
def atomic(path: str, mode: int, follow: bool = False, whole: bool = False) -> Iterator[BinaryIO]:
    """A file written beside ``path`` and renamed over it when the block ends: no reader ever
    sees a partial file, and a write that fails half-way (disk full, ``ulimit -f``, an exception)
    leaves nothing. The one way the package replaces a file. Raises OSError.

    The folder is opened once, without following a link at any level, and the file created and
    renamed under that descriptor (SPEC §8, amended 2026-12-02): in a team directory a member may
    swap the version directory or ``.gkx-autocache`` for a symlink after it was checked, and a
    write by path would land in (or replace a file of) a directory of the victim's own. Only
    ``follow`` (a path the user named, a bundle's archive) goes by the path as it is.

    ``whole``: on a bucket mount (``_mount``), which has no rename and no chmod, the file is made
    in one create under its own name, what was there deleted first: the object appears whole when
    it is closed, and one that fails half-way is deleted."""
    folder, name = os.path.split(path if follow else os.path.abspath(path))
    if whole:
        yield from _whole(folder, name, mode)
        return
    tmp = tmp_name(name, os.getpid(), threading.get_ident())
    dir_fd = None if follow else open_dir(folder, search=True)
    if follow:
        tmp, name = os.path.join(folder, tmp), path
    try:
        _remove(tmp, dir_fd)  # a leftover of a dead process with this pid, or something planted: never opened
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | BINARY, mode, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                if hasattr(os, "fchmod"):  # Windows has none before 3.13: its ACLs, not modes, decide
                    os.fchmod(f.fileno(), mode)  # the open mode is masked by the umask
                yield f
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            _remove(tmp, dir_fd)
            raise
    finally:
        if dir_fd is not None:
            os.close(dir_fd)


def _whole(folder: str, name: str, mode: int) -> Iterator[BinaryIO]:
    dir_fd = open_dir(folder, search=True)
    try:
        _remove(name, dir_fd)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | BINARY, mode, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                yield f
        except BaseException:
            _remove(name, dir_fd)
            raise
    finally:
        os.close(dir_fd)


def _remove(name: str, dir_fd: int | None) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def open_in(folder: str, name: str, flags: int, mode: int) -> int:
    """``os.open(folder/name)`` through ``folder``'s descriptor, opened without following a link at
    any level (see ``atomic``). Raises OSError."""
    dir_fd = open_dir(os.path.abspath(folder), search=True)
    try:
        return os.open(name, flags, mode, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def write_atomic(path: str, data: bytes, mode: int, whole: bool = False) -> bool:
    """``data`` into ``path`` through ``atomic``; False (and a DEBUG line) when it fails: the
    store's and the ledger's writes are bookkeeping, never an error of the user's run."""
    try:
        with atomic(path, mode, whole=whole) as f:
            f.write(data)
        return True
    except OSError as exc:
        logger.debug("cannot write %s: %s", path, exc)
        return False


def remove(path: str) -> None:
    try:
        os.unlink(path)  # unlink never follows a symlink
    except OSError:
        pass


def remove_at(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def claim(folder: str, name: str, stale: float) -> bool:
    """Create the empty file ``folder/name`` (exclusively, through the folder's descriptor): whether
    this process holds it now. One older than ``stale`` seconds (its holder was killed) is taken
    over; every other failure is "not held"."""
    try:
        dir_fd = open_dir(os.path.abspath(folder), search=True)
    except OSError:
        return False
    try:
        for _ in range(2):
            try:
                os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o600, dir_fd=dir_fd))
                return True
            except FileExistsError:
                try:
                    if time.time() - os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mtime < stale:
                        return False
                except OSError:
                    pass
                _remove(name, dir_fd)
            except OSError:
                return False
        return False
    finally:
        os.close(dir_fd)


def unclaim(folder: str, name: str) -> None:
    try:
        dir_fd = open_dir(os.path.abspath(folder), search=True)
    except OSError:
        return
    try:
        _remove(name, dir_fd)
    finally:
        os.close(dir_fd)


def open_dir(path: str, dir_fd: int | None = None, search: bool = False) -> int:
    """A descriptor of the directory ``path`` (absolute, or relative to ``dir_fd``), opened one
    component at a time without following a symlink at any level: what is deleted through it is
    inside that directory, whatever is renamed meanwhile. With ``search``, a descriptor good only
    as a ``dir_fd`` (Linux's ``O_PATH``), which needs no read permission on the way (a 0711
    ``/home``). Raises OSError (ELOOP, ENOTDIR...)."""
    flags = (PATH if search else os.O_RDONLY) | DIRECTORY
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise OSError(errno.EINVAL, f"'..' in {path}")
    fd = os.open("/" if dir_fd is None else ".", flags, dir_fd=dir_fd)
    pending = ""
    try:
        for i, part in enumerate(parts):
            pending = f"{pending}/{part}" if pending else part
            try:
                inner = os.open(pending, flags | NOFOLLOW, dir_fd=fd)
            except PermissionError:
                if not search or i == len(parts) - 1:
                    raise
                # Without O_PATH (macOS), a directory one may cross but not list (a 0711 /home) has
                # no descriptor: it is crossed by the next open's path (ancestors are checked to be
                # writable by no one else, so it cannot be swapped).
                continue
            os.close(fd)
            fd, pending = inner, ""
    except BaseException:
        os.close(fd)
        raise
    return fd


PATH = getattr(os, "O_PATH", os.O_RDONLY)


def make_dir(path: str, team: bool, tag: str | None = None, mounted: bool = False) -> bool:
    """Create ``path`` and missing parents with the package's mode whatever the umask; True when
    ``path`` itself was created here, and then ``tag`` written in it as its ``CACHEDIR.TAG``.
    Raises OSError; FileExistsError when a non-directory is in the way.

    Nothing is done by a path that may have been swapped (SPEC §8, amended 2026-12-02): in a team
    directory any member may rename what the victim just made and put a symlink there, so each
    directory is made under its parent's descriptor, opened without following a link, checked to
    be the one ``mkdir`` made (ours, no bits beyond 0700 and a team parent's setgid), and given
    its mode and tag through its own descriptor. On a bucket mount (``mounted``), whose owners and
    modes are the mount's, neither is checked nor set: the mount was checked (``_mount``)."""
    try:
        os.close(open_dir(path, search=True))
        return False
    except FileNotFoundError:
        pass
    parent, name = os.path.split(path.rstrip("/"))
    if parent != path:
        make_dir(parent, team, mounted=mounted)
    parent_fd = open_dir(parent, search=True)
    try:
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            try:  # another process won the race: a directory (not through a link) is fine
                os.close(os.open(name, PATH | DIRECTORY | NOFOLLOW, dir_fd=parent_fd))
            except OSError:
                raise FileExistsError(errno.EEXIST, "exists and is not a directory", path) from None
            return False
        fd = os.open(name, os.O_RDONLY | DIRECTORY | NOFOLLOW, dir_fd=parent_fd)
    finally:
        os.close(parent_fd)
    try:
        st = os.fstat(fd)
        if not mounted and (st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & ~0o2700):  # setgid: a team parent's
            raise OSError(errno.EPERM, "replaced by someone else right after it was made", path)
        if any(not _ours(name) for name in os.listdir(fd)):  # a folder of the victim's own, swapped in
            raise OSError(errno.EPERM, "replaced by a directory holding files right after it was made", path)
        if not mounted:
            os.fchmod(fd, dir_mode(team))  # mkdir's mode is masked by the umask; fchmod's is not
        if tag is not None:
            write_new_at(TAG_NAME, tag.encode("ascii"), fd, chmod=not mounted)
    finally:
        os.close(fd)
    logger.debug("created %s", path)
    return True


def _ours(name: str) -> bool:
    """What a concurrent process of the package may already have put in a directory just made."""
    return name in (TAG_NAME, META_DIR, LEDGER_DIR, LEASE_DIR) or name.startswith(VERSION_PREFIX)


def write_new_at(name: str, data: bytes, dir_fd: int, mode: int = 0o644, chmod: bool = True) -> bool:
    """A new file ``name`` in the directory ``dir_fd`` holding ``data``; False when one is there
    (whatever it is: never opened) or it cannot be written. Never through a symlink. Without
    ``chmod`` (a bucket mount), the mode is the mount's."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | NONBLOCK, mode, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        if chmod:
            os.fchmod(fd, mode)  # the open mode is masked by the umask: a 0600 tag is no team's
        os.write(fd, data)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def bookkeeping_dir(version_dir: str, team: bool, *parts: str) -> str | None:
    """``<version dir>/.gkx-autocache[/parts]``, created with the cache's own mode (group members
    of a shared cache write their ledgers too), or None when it cannot be made or is a symlink."""
    path = os.path.join(version_dir, META_DIR, *parts)
    if _mount.bucket_mount(version_dir) is not None:
        logger.debug("%s is on a bucket mount: no bookkeeping", version_dir)
        return None
    for level in range(len(parts) + 1):
        if os.path.islink(os.path.join(version_dir, META_DIR, *parts[:level])):
            logger.debug("%s is a symlink: no bookkeeping", path)
            return None
    try:  # tagged where made: a directory someone else gave JAX is known by it (``_remove.has_tag``)
        make_dir(os.path.join(version_dir, META_DIR), team, TAG)
        make_dir(path, team)
    except OSError as exc:
        logger.debug("no bookkeeping in %s: %s", path, exc)
        return None
    return path
