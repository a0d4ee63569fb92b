"""Trust (SPEC §8): whoever can write the cache directory, or a settings file, can run code in
every process that reads it. The rules for both, in one place. POSIX only: on Windows every check
passes.

Directories (the cache root and its version directory):
- owned by you and writable by no one else; or
- owned by root and writable by no one else (a warm cache baked into an image): read-only for
  everyone but root;
- with ``trust_shared``, writable by one of your groups (never by others), whoever in it owns it:
  a team cache has one owner and many users, and its group is the trust boundary already.

Ancestors of the cache: each owned by root or you, or (with ``trust_shared``) a team directory as
above, and writable by no one else; or sticky (like ``/tmp``) and owned by root or you. The owner
of a sticky directory can rename what is in it, so a sticky directory owned by anyone else could
swap the cache after the check: refused. A symlinked directory is judged by its target.

Settings files: owned by you or root, and writable by their owner alone (not the group, even your
own primary group: any member of a shared ``users`` group could point everyone at their directory).
"""

from __future__ import annotations

import os
import stat

POSIX = hasattr(os, "getuid")


def user_groups() -> set[int]:
    return {os.getgid(), *os.getgroups()}


def _team(st: os.stat_result, team: bool) -> bool:
    """With ``trust_shared``: writable by one of your groups, not by others."""
    return team and bool(st.st_mode & stat.S_IWGRP) and not st.st_mode & stat.S_IWOTH and st.st_gid in user_groups()


def directory_problem(path: str, team: bool = False) -> str | None:
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
    ours = _team(st, team)
    if st.st_mode & stat.S_IWOTH:
        return "others can write to it; run chmod o-w on it"
    if st.st_uid not in (uid, 0) and not ours:
        return f"it is owned by uid {st.st_uid}, not by you (uid {uid}) or root; use a directory of your own"
    if st.st_mode & stat.S_IWGRP and not ours:
        if team:
            return f"its group {st.st_gid} can write to it and is not one of your groups"
        return "its group can write to it; run chmod g-w on it, or set trust_shared = true for a team cache"
    return None


def links_problem(path: str) -> str | None:
    """Why a symlink met on the way to ``path`` (resolved component by component, as the kernel
    does) may have been put there by someone else, or None: each must be yours or root's (an HPC
    home's ``/home/u -> /gpfs/...`` is root's). A link another user planted in a sticky ``/tmp``
    would choose where the cache goes, and the checks of the resolved path would pass: it is in a
    directory of yours. Also where your own link leads to his."""
    if not POSIX:
        return None
    uid = os.getuid()
    todo = os.path.abspath(path).split(os.sep)[1:]
    current, hops = os.sep, 0
    while todo:
        part = todo.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        step = os.path.join(current, part)
        try:
            st = os.lstat(step)
        except OSError:
            return None  # not made yet: nothing below it is a link
        if not stat.S_ISLNK(st.st_mode):
            current = step
            continue
        if st.st_uid not in (uid, 0):
            return f"{step} is a symlink of uid {st.st_uid}'s, not yours or root's; name the directory it points to"
        hops += 1
        try:
            target = os.readlink(step)
        except OSError as exc:
            return f"{step} cannot be read ({exc.strerror})"
        if hops > 40:
            return f"{path} has too many symlinks on the way"
        todo = target.split(os.sep) + todo
        if os.path.isabs(target):
            current = os.sep
    return None


def ancestors_problem(path: str, team: bool = False) -> str | None:
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
        problem = _ancestor_problem(current, st, uid, team)
        if problem:
            return problem
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def _ancestor_problem(path: str, st: os.stat_result, uid: int, team: bool) -> str | None:
    if st.st_mode & stat.S_ISVTX:
        if st.st_uid in (0, uid):
            return None  # like /tmp: only its owner and each entry's owner can rename what is in it
        return (f"its parent {path} is a sticky directory owned by uid {st.st_uid}, not root or you: "
                "its owner can rename what is in it")
    if st.st_mode & stat.S_IWOTH:
        return f"others can write to its parent {path}"
    ours = _team(st, team)
    if st.st_uid not in (0, uid) and not ours:
        return f"its parent {path} is owned by uid {st.st_uid}, neither you nor root"
    if st.st_mode & stat.S_IWGRP and not ours:
        return f"its group can write to its parent {path}; set trust_shared = true for a team cache"
    return None


def file_problem(st: os.stat_result) -> str | None:
    """Why a settings file must not be trusted: whoever can write it chooses your cache directory."""
    if not POSIX:
        return None
    uid = os.getuid()
    if st.st_uid not in (uid, 0):
        return f"it is owned by uid {st.st_uid}, not by you or root; copy it to a file you own and use that"
    if st.st_mode & stat.S_IWOTH:
        return "others can write it; run chmod o-w on it"
    if st.st_mode & stat.S_IWGRP:
        return f"its group ({st.st_gid}) can write it; run chmod g-w on it"
    return None


def entry_problem(st: os.stat_result, team: bool = False) -> str | None:
    """Why an entry must not be loaded, from its ``fstat``: it is code. Writable by others, or by
    a group outside a team cache, or owned by someone who is not you, root or (in a team cache)
    a member of your group, and it could have been swapped."""
    if not POSIX:
        return None
    if st.st_mode & stat.S_IWOTH:
        return "others can write it"
    ours = team and st.st_gid in user_groups()
    if st.st_mode & stat.S_IWGRP and not ours:
        return "its group can write it"
    if st.st_uid not in (os.getuid(), 0) and not ours:
        return f"it is owned by uid {st.st_uid}"
    return None
