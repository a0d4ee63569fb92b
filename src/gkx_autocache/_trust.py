"""Trust (SPEC §8): whoever can write the cache directory can run code in every process reading it.

A directory is trusted when it is owned by you and not writable by group or others (group is
allowed with ``trust_shared`` when it is one of your groups), and every ancestor is owned by root
or you and not writable by others, or else carries the sticky bit (like ``/tmp``): the rule OpenSSH
applies to ``authorized_keys``. With ``trust_shared``, a directory (or ancestor) that a teammate
owns is accepted when one of your groups can write it and others cannot: a team cache has one
owner, and its group is the trust boundary already. A symlinked directory is judged by its target. POSIX only: on
Windows every check passes.
"""

from __future__ import annotations

import os
import stat

POSIX = hasattr(os, "getuid")


def user_groups() -> set[int]:
    return {os.getgid(), *os.getgroups()}


def _group_ok(st: os.stat_result, shared: bool) -> bool:
    return not st.st_mode & stat.S_IWGRP or (shared and st.st_gid in user_groups())


def _team_dir(st: os.stat_result, shared: bool) -> bool:
    """With ``trust_shared``, a teammate's directory: writable by one of your groups (so the group
    is already the trust boundary), not by others. A team cache has one owner and many users."""
    return shared and bool(st.st_mode & stat.S_IWGRP) and st.st_gid in user_groups()


def directory_problem(path: str, shared: bool = False) -> str | None:
    """Why ``path`` (an existing directory) may not hold the cache, or None when it may."""
    if not POSIX:
        return None
    try:
        st = os.stat(path)  # follows a symlink: the target is what gets read
    except OSError as exc:
        return f"it cannot be examined ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    uid = os.getuid()
    if st.st_uid != uid and not _team_dir(st, shared):
        return f"it is owned by uid {st.st_uid}, not by you (uid {uid}); use a directory of your own"
    if st.st_mode & stat.S_IWOTH:
        return "others can write to it; run chmod o-w on it"
    if not _group_ok(st, shared):
        if shared:
            return f"its group {st.st_gid} can write to it and is not one of your groups"
        return "its group can write to it; run chmod g-w on it, or set trust_shared = true for a team cache"
    return None


def ancestors_problem(path: str, shared: bool = False) -> str | None:
    """Why an ancestor of ``path`` would let someone else swap the directory, or None."""
    if not POSIX:
        return None
    uid = os.getuid()
    current = os.path.dirname(os.path.realpath(path))
    while True:
        try:
            st = os.stat(current)
        except OSError as exc:
            return f"its parent {current} cannot be examined ({exc.strerror})"
        if not st.st_mode & stat.S_ISVTX:
            if st.st_uid not in (0, uid) and not _team_dir(st, shared):
                return f"its parent {current} is owned by uid {st.st_uid}, neither you nor root, and is not sticky"
            if st.st_mode & stat.S_IWOTH:
                return f"others can write to its parent {current}, which is not sticky"
            if not _group_ok(st, shared):
                return f"its group can write to its parent {current}, which is not sticky; set trust_shared = true for a team cache"
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent
