"""The bookkeeping lock of a directory, taken to fold, prune or reset: an ``flock`` on
``prune.lock``, or where flock does not work, ``fold.lock`` made with ``O_EXCL``
(docs/how-it-works.md, "The ledger: design notes")."""

from __future__ import annotations

import os
import stat
import time

from gkx_autocache import _files
from gkx_autocache._diagnostics import logger
from gkx_autocache._layout import EXCL_LOCK_FILE, LOCK_FILE, META_DIR, NO_FLOCK_FILE
from gkx_autocache._record import ledger as _ledger  # read there at each call (take_flock, host): tests replace them


def acquire(version_dir: str, team: bool, wait: float = 0.0) -> int | None:
    """The bookkeeping lock, taken: a descriptor to close to let it go (-1 for the lock file of a
    file system without flock, let go by ``release``); None when another process holds it (after
    ``wait`` seconds) or it cannot be taken."""
    meta = _files.bookkeeping_dir(version_dir, team)
    if meta is None:
        return None
    try:
        meta_fd = _files.open_dir(meta)
    except OSError:
        return None
    try:
        flags = os.O_RDWR | os.O_CREAT | _files.NOFOLLOW | _files.NONBLOCK  # a planted FIFO must not hang the exit
        fd = os.open(LOCK_FILE, flags, _files.file_mode(team), dir_fd=meta_fd)
    except OSError as exc:
        logger.debug("bookkeeping lock not opened: %s", exc)
        os.close(meta_fd)
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        os.close(meta_fd)
        return None
    try:
        os.fchmod(fd, _files.file_mode(team))  # the umask masked the open mode; only its owner can do this
    except OSError:
        pass
    deadline = time.monotonic() + wait
    try:
        while True:
            taken = _ledger.take_flock(fd)
            if taken is None:  # no flock here: the lock file instead
                os.close(fd)
                return _excl_lock(meta_fd, version_dir, team, deadline)
            if taken:
                return fd
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)
    finally:
        os.close(meta_fd)


def _excl_lock(meta_fd: int, version_dir: str, team: bool, deadline: float) -> int | None:
    """``fold.lock``, created with ``O_EXCL``: -1 once taken. One older than ``LOCK_STALE_SECS`` was
    left by a process that died folding (or one naming a process of this host that is gone):
    renamed away, then taken. Two processes can both see it
    stale; the one whose rename comes second moves the other's fresh lock, sees that it is not the
    file it looked at, and puts it back."""
    _ledger.no_flock(version_dir, team, "flock() fails here")
    while True:
        try:
            fd = os.open(EXCL_LOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _files.NOFOLLOW, _files.file_mode(team),
                         dir_fd=meta_fd)
        except FileExistsError:
            try:
                st = os.stat(EXCL_LOCK_FILE, dir_fd=meta_fd, follow_symlinks=False)
                if time.time() - st.st_mtime > _ledger.LOCK_STALE_SECS or _holder_gone(meta_fd):
                    away = f".{EXCL_LOCK_FILE}.{os.getpid()}.stale.tmp"
                    os.rename(EXCL_LOCK_FILE, away, src_dir_fd=meta_fd, dst_dir_fd=meta_fd)
                    moved = os.stat(away, dir_fd=meta_fd, follow_symlinks=False)
                    if (moved.st_ino, moved.st_mtime_ns) != (st.st_ino, st.st_mtime_ns):
                        # Another process took the stale lock over between our look and our
                        # rename: what we moved is its fresh lock. Put it back; it holds it.
                        try:
                            os.link(away, EXCL_LOCK_FILE, src_dir_fd=meta_fd, dst_dir_fd=meta_fd)
                        except OSError:
                            pass
                        os.unlink(away, dir_fd=meta_fd)
                        raise FileExistsError(EXCL_LOCK_FILE)
                    os.unlink(away, dir_fd=meta_fd)
                    continue
            except OSError:
                pass
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
            continue
        except OSError as exc:
            from gkx_autocache._diagnostics import warn

            warn(f"lock:{version_dir}", f"{version_dir}: neither flock nor a lock file works here ({exc.strerror}); "
                                        "max_size is not kept and stats are not folded")
            return None
        try:
            os.write(fd, f"{_ledger.host()} {os.getpid()} {time.time():.0f}\n".encode())
        finally:
            os.close(fd)
        _excl_held.append(os.path.join(version_dir, META_DIR, EXCL_LOCK_FILE))
        return -1


def _holder_gone(meta_fd: int) -> bool:
    """Whether ``fold.lock`` names a process of this host that is no longer running (killed while
    folding): then it is stale at once, not after ``LOCK_STALE_SECS``."""
    try:
        fd = _files.open_regular(EXCL_LOCK_FILE, dir_fd=meta_fd)
        try:
            fields = os.read(fd, 256).decode("utf-8", "replace").split()
        finally:
            os.close(fd)
    except OSError:
        return False
    return (len(fields) == 3 and fields[0] == _ledger.host() and fields[1].isdigit()
            and not _ledger.alive(int(fields[1]), None))


_excl_held: list[str] = []


def release(lock: int) -> None:
    if lock >= 0:
        os.close(lock)
    elif _excl_held:
        _files.remove(_excl_held.pop())


def flock_note(version_dir: str) -> str | None:
    """What ``status`` says where flock was found not to work, or None."""
    data = _files.read(os.path.join(version_dir, META_DIR, NO_FLOCK_FILE), 512)
    if data is None:
        return None
    return (f"this file system has no working flock (seen {data.decode('utf-8', 'replace').strip()[:19]}): "
            f"gkx-autocache uses a lock file ({EXCL_LOCK_FILE}, stale after {_ledger.LOCK_STALE_SECS / 60:.0f} min) "
            "and tells live processes by their pid")
