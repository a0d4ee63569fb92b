"""The shared level in a directory: a team directory (``trust_shared``) or a read-only one baked
into an image, trusted by the rules of §8 before it is read; each entry read after its seal is
admitted, and written by a temporary file and a rename (on a bucket mount, ``_mount``, whole in one
create). Design: docs/how-it-works.md.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

from gkx_autocache import _files, _trust
from gkx_autocache._backends.port import Failure, Listed, Progress, Refused
from gkx_autocache._diagnostics import human_bytes
from gkx_autocache._formats import SEAL_LIMIT
from gkx_autocache._layout import COMPILE_SIDECAR, ENTRY_SUFFIX, SEAL_SIDECAR, is_temporary, version_name
from gkx_autocache._shared.calls import FIRST_BLOCK
from gkx_autocache._shared.seal import head_problem


def _read_exactly(fd: int, size: int, progress: Progress) -> bytes:
    """``size`` bytes of the file, by blocks (each one progress), and not one more: a file that
    grew or shrank while it was read is refused."""
    if size <= 0:  # no first block to check: an empty file is no executable
        raise Refused("the shared entry is empty")
    chunks: list[bytes] = []
    left = size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20 if chunks else FIRST_BLOCK))
        if not chunk:
            break
        if not chunks and (why := head_problem(chunk)):
            raise Refused(why)
        chunks.append(chunk)
        left -= len(chunk)
        progress.tick()
        progress.got(len(chunk))
    if left or os.read(fd, 1):
        raise Refused("the shared entry changed size while it was read")
    return b"".join(chunks)


class Directory:
    """A team directory (``trust_shared``) or a read-only one baked into an image, trusted by the
    rules of §8 before it is read."""

    lists = False  # read whole under the trust checks, never listed (``port.Backend``)
    sealed = False  # a directory baked from a local level has no seals

    def __init__(self, root: str, jax_version: str, team: bool) -> None:
        self.root = root
        self.where = os.path.join(root, version_name(jax_version))
        self.jax_version = jax_version
        self.team = team
        self.whole = False  # a bucket mount (``_mount``): each file made whole in one create

    @classmethod
    def opened(cls, url: str, jax_version: str, env: Any, *, team: bool, over_http: bool) -> Directory:
        """``schemes``' factory: ``url`` is a path here."""
        return cls(url, jax_version, team)

    def forget(self) -> None:
        pass

    def describe(self) -> dict[str, str]:
        return {}

    def caution(self) -> str | None:
        return None

    def prepare(self, progress: Progress, create: bool = True) -> bool:
        """Check (and, with ``create``, where it may be written and is missing, create) the version
        directory; whether this user may write it. Raises the refusal (an OSError: one line)."""
        from gkx_autocache import _cache

        try:
            prepared = _cache.prepare(self.root, self.jax_version, self.team,
                                      create=create and os.access(self.root, os.W_OK))
        except _cache.DirectoryRefused as exc:
            raise PermissionError(errno.EACCES, str(exc)) from None
        if not os.path.isdir(prepared.version_dir):
            raise FileNotFoundError(errno.ENOENT, f"{prepared.version_dir} does not exist"
                                                  f"{' and cannot be created here' if create else ''}")
        self.where = prepared.version_dir
        self.whole = prepared.mount is not None
        progress.tick()
        return prepared.writable

    def listing(self, progress: Progress) -> dict[str, int] | str:
        return "a directory is not listed"  # a lookup of a missing file is as cheap as a listing would be

    def _open(self, name: str) -> tuple[int, os.stat_result] | None:
        """A descriptor of the file and its ``fstat``, never through a symlink, only if its owner and
        mode may be trusted; None when it is not there. Raises EntryRefused."""
        try:
            fd = _files.open_regular(os.path.join(self.where, name))
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            if exc.errno == errno.ELOOP:
                raise Refused("the shared entry is a symlink: never read") from None
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EINVAL):
                raise Refused(f"the shared entry cannot be read ({exc.strerror})") from None
            raise
        st = os.fstat(fd)
        why = _trust.entry_problem(st, self.team)
        if why:
            os.close(fd)
            raise Refused(f"the shared entry: {why}")
        return fd, st

    def small(self, name: str, limit: int = SEAL_LIMIT) -> bytes:
        """The first ``limit`` bytes of a file (a seal for ``status``, a manifest); empty when it
        is not there or not to be read."""
        opened = self._open(name)
        if opened is None:
            return b""
        chunks, left = [], limit
        try:
            while left > 0 and (chunk := os.read(opened[0], min(left, 1 << 20))):
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        finally:
            os.close(opened[0])

    def read(self, key: str, progress: Progress,
             admit: Callable[[bytes | None, int], tuple[int, bool]]) -> bytes | None:
        """The entry, or None when it is not there. Its seal is read and ``admit``-ted (checked, and
        with a signing key its HMAC) before a byte of the entry is: ``admit(seal, the file's size)``
        gives the size the entry must have (``exact``), or the most it may have. A planted sparse file of gigabytes
        costs a reader an ``fstat``, never its memory. Read by blocks, each one progress."""
        opened = self._open(key + ENTRY_SUFFIX)
        if opened is None:
            return None
        fd, st = opened
        try:
            seal = self._open(key + SEAL_SIDECAR)
            raw_seal = None
            if seal is not None:
                try:
                    raw_seal = os.read(seal[0], SEAL_LIMIT)
                finally:
                    os.close(seal[0])
            size, exact = admit(raw_seal, st.st_size)
            if st.st_size != size if exact else st.st_size > size:
                said = f"its seal says {size} bytes" if exact else f"the most read of one entry is {human_bytes(size)}"
                raise Refused(f"the shared entry has {st.st_size} bytes where {said}")
            return _read_exactly(fd, st.st_size, progress)
        finally:
            os.close(fd)

    def streams(self) -> bool:
        return False  # no pack is written to a directory: each entry is a file to read

    def stream(self, name: str, timeout: float) -> None:
        return None

    def first(self, key: str, progress: Progress) -> tuple[bytes | None, bytes | None]:
        raise AssertionError("a directory's entry is read whole")  # read() returns it all

    def block(self, key: str, start: int, end: int, progress: Progress | None = None) -> bytes:
        raise AssertionError("a directory's entry is read whole")

    def size(self, key: str) -> int:
        raise AssertionError("a directory's entry is read whole")

    def compile_secs(self, key: str) -> float | None:
        """From the store's own sidecar: a directory baked from a local level has no seals."""
        from gkx_autocache._formats import read_compile_secs

        return read_compile_secs(os.path.join(self.where, key + COMPILE_SIDECAR))

    def write(self, name: str, data: bytes) -> None:
        """A temporary file and a rename (on a bucket mount, one create: an object appears whole
        when it is closed): never a partial file under the entry's name."""
        with _files.atomic(os.path.join(self.where, name), _files.file_mode(self.team), whole=self.whole) as f:
            f.write(data)

    def names(self, progress: Progress) -> list[Listed]:
        """Its entries, sidecars and temporary files, for the commands: in a directory the package
        did not make, only what it can show it wrote (``_entries.ours``). An entry's recency is its
        last access or write. Raises Failure where the directory does not carry the package's tag."""
        from gkx_autocache import _entries, _remove

        if not os.path.isdir(self.where):
            return []
        if not _remove.has_tag(self.where):
            raise Failure(f"{self.where} has no gkx-autocache CACHEDIR.TAG, so it is not known to be a cache")
        found = _entries.scan(self.where)
        listed: list[Listed] = []
        for unit in _entries.ours(self.where, list(found.units.values())):
            for path in unit.files:
                try:
                    st = os.lstat(path)
                except OSError:  # removed meanwhile
                    continue
                used = max(st.st_atime, st.st_mtime) if path.endswith(ENTRY_SUFFIX) else st.st_mtime
                listed.append((os.path.basename(path), _remove.on_disk(st), used))
        listed += [(os.path.basename(path), size, mtime) for path, size, mtime in found.temporary
                   if os.path.dirname(path) == self.where and is_temporary(os.path.basename(path))]
        progress.tick()
        return listed

    def remove(self, name: str) -> None:
        """Through ``_remove``: in the tagged directory only, never through a symlink."""
        from gkx_autocache import _remove

        try:
            done = _remove.remove_files(self.where, [os.path.join(self.where, name)])
        except _remove.RemovalRefused as exc:
            raise Failure(str(exc)) from None
        if done.failed:
            raise Failure(f"{done.failed[0]} could not be removed")
