"""XLA's GPU autotune results, carried beside the entries (issue 47).

Where a GPU plugin is installed, JAX has XLA keep the result of each fusion's autotuning in
``<version dir>/xla_gpu_per_fusion_autotune_cache_dir/``: one small text file a fusion, named by the
SHA-256 of its key (``<43 base64url characters>.textproto``), written in its ``tmp/`` and renamed
(XLA: ``xla/service/gpu/autotuning/autotuner_util.cc``, ``xla/backends/autotuner/
file_based_autotuner_cache.cc``). After an executable miss, autotuning is a large share of a GPU
compile, and these files stayed on the machine that made them. The shared level carries them in
one object beside each program's manifest (the manifest holds its SHA-256, so a signing key
vouches for it); warm bundles carry them as members. A file is never replaced: one name is one
fusion's key, and any result measured for it is valid. Only what XLA could have written is
taken or placed: that name, a plain file, at most ``FILE_LIMIT`` bytes. A result XLA wrote
group-writable (a umask of 002) is not taken, as such an entry would not be.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import struct

from gkx_autocache import _files, _mount, _trust

FOLDER = "xla_gpu_per_fusion_autotune_cache_dir"  # JAX's name for it, under its cache directory
_NAME = re.compile(r"[A-Za-z0-9_-]{43}\.textproto")
FILE_LIMIT = 64 << 10  # one fusion's result is under 1 KiB
TOTAL_LIMIT = 4 << 20  # the most one object carries, records included (some 10 000 results): the newest first
MAGIC = b"GKXTUNE1"
HEAD = struct.Struct(">HI")  # a record: its name's length, its data's length
UNVERIFIED = 0o400  # the mode of a result landed that no signing key checked: never vouched for by one


def is_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def enabled(value: object) -> bool:
    """Whether JAX's ``jax_persistent_cache_enable_xla_caches`` value has XLA keep these results."""
    return value == "all" or FOLDER in str(value or "").split(",")


def local(version_dir: str, team: bool = False, signing: bool = False) -> list[tuple[str, bytes]]:
    """The results in ``version_dir``'s folder, the newest while they fit ``TOTAL_LIMIT`` as an
    object, in the order of their names: plain files named as XLA names them, never through a symlink (the folder's own
    included), trusted as an entry is (``team``: in a team directory). With ``signing`` (a key will
    vouch for them), only this user's, and none landed unverified (``land``)."""
    try:
        fd = _files.open_dir(os.path.join(os.path.abspath(version_dir), FOLDER))
    except OSError:
        return []
    try:
        with os.scandir(fd) as found:
            named = sorted(((e.stat(follow_symlinks=False).st_mtime, e.name) for e in found if is_name(e.name)),
                           reverse=True)
        taken: list[tuple[str, bytes]] = []
        room = TOTAL_LIMIT - len(MAGIC)
        for _, name in named:
            data = _read(name, fd, team, signing)
            if data is None:
                continue
            room -= HEAD.size + len(name) + len(data)
            if room < 0:
                break
            taken.append((name, data))
        return sorted(taken)  # by name: the same results make the same object, whatever their times
    except OSError:
        return []
    finally:
        os.close(fd)


def _read(name: str, dir_fd: int, team: bool, signing: bool) -> bytes | None:
    try:
        fd = _files.open_regular(name, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        mine = not hasattr(os, "geteuid") or st.st_uid == os.geteuid()
        if (_trust.entry_problem(st, team) or not 0 < st.st_size <= FILE_LIMIT
                or (signing and (not mine or not st.st_mode & stat.S_IWUSR))):
            return None
        data = os.read(fd, FILE_LIMIT + 1)
        return data if 0 < len(data) <= FILE_LIMIT else None
    finally:
        os.close(fd)


def pack(files: list[tuple[str, bytes]]) -> bytes:
    """The object the shared level keeps: ``MAGIC``, then each file as a header, its name, its data."""
    parts = [MAGIC]
    for name, data in files:
        raw = name.encode("ascii")
        parts += [HEAD.pack(len(raw), len(data)), raw, data]
    return b"".join(parts)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def unpack(data: bytes) -> list[tuple[str, bytes]]:
    """The files of an object ``pack`` made; raises ValueError for anything else (a bad name, a
    record cut short, a file too large)."""
    if not data.startswith(MAGIC):
        raise ValueError("not an autotune object")
    files, at = [], len(MAGIC)
    while at < len(data):
        if at + HEAD.size > len(data):
            raise ValueError("a record's header cut short")
        name_size, size = HEAD.unpack_from(data, at)
        at += HEAD.size
        name = data[at:at + name_size].decode("ascii", "replace")
        if not is_name(name) or not 0 < size <= FILE_LIMIT or at + name_size + size > len(data):
            raise ValueError("a record of a bad name or size")
        at += name_size
        files.append((name, data[at:at + size]))
        at += size
    return files


def land(version_dir: str, files: list[tuple[str, bytes]], team: bool, verified: bool) -> int:
    """Write the results this directory lacks into its folder (made with the cache's mode); how
    many were written. ``verified``: a signing key checked them; else each is made read-only
    (``UNVERIFIED``), so that a later run with a key never vouches for it (``local``). Never
    raises: a result that cannot be written is autotuned again."""
    folder = os.path.join(version_dir, FOLDER)
    whole = _mount.bucket_mount(version_dir) is not None
    try:
        _files.make_dir(folder, team, mounted=whole)
    except OSError:
        return 0
    mode = _files.file_mode(team) if verified else UNVERIFIED | (0o040 if team else 0)
    written = 0
    for name, data in files:
        path = os.path.join(folder, name)
        if is_name(name) and not os.path.lexists(path):
            written += _files.write_atomic(path, data, mode, whole)
    return written
