"""A bucket mounted as a directory, for the tests (SPEC §14, amended 2026-12-04): a real FUSE file
system (mfusepy over libfuse 2) that keeps its objects in a backing folder and behaves as a bucket
mount does. Run as ``python bucketfs.py BACKING MOUNTPOINT SEMANTICS UID GID``; tests use ``Mounted``.

What both semantics share (Mountpoint for S3 and Cloud Storage FUSE): owners and modes are the
mount's (``uid``, ``gid``, files 0644, directories 0755), whatever a file was created with; a file
being written is an upload, staged out of sight, and its object appears whole when it is closed;
locks are the kernel's own (the file system implements none). Then:

- ``mountpoint`` (Mountpoint for S3, with ``--allow-delete``; its doc/SEMANTICS.md): no rename
  (ENOSYS), no chmod or chown (EPERM), no utime but on a file being written (EPERM), no overwrite
  of an existing object and no append (EPERM), writes only in sequence (EINVAL);
- ``gcsfuse`` (Cloud Storage FUSE before its atomic MoveObject rename; its docs/semantics.md):
  rename is a copy then a delete (not atomic), chmod and chown succeed and change nothing, utime
  sets the object's time, an existing object may be rewritten (uploaded whole again at close).
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SEMANTICS = ("mountpoint", "gcsfuse")
# As /proc/self/mountinfo shows each: Mountpoint sets no subtype (type ``fuse``, source ``mountpoint-s3``);
# Cloud Storage FUSE's type is ``fuse.gcsfuse``, its source the bucket's name.
MOUNT_OPTIONS = {"mountpoint": {"fsname": "mountpoint-s3"}, "gcsfuse": {"subtype": "gcsfuse", "fsname": "team-bucket"}}


def serve(backing: str, mountpoint: str, semantics: str, uid: int, gid: int, options: dict[str, object]) -> None:
    import mfusepy as fuse  # type: ignore[import-untyped]

    options = {k: v for k, v in {**MOUNT_OPTIONS[semantics], "allow_other": True, "default_permissions": True,
                                 **options}.items() if v is not None}  # (None: an option left out)
    file_mode, dir_mode = int(options.pop("file_mode", 0o644)), int(options.pop("dir_mode", 0o755))  # type: ignore[call-overload]
    staging = os.path.join(backing, ".staging")
    os.makedirs(staging, exist_ok=True)
    numbers = itertools.count()
    lock = threading.Lock()

    class Bucket(fuse.Operations):  # type: ignore[misc]
        def __init__(self) -> None:
            self.open_writes: dict[int, tuple[str, int, str]] = {}  # fh -> (path, fd, staged file)
            self.next = itertools.count(1 << 20)

        def _real(self, path: str) -> str:
            if path.startswith("/.staging"):
                raise fuse.FuseOSError(errno.ENOENT)
            return os.path.join(backing, path.lstrip("/"))

        def _writing(self, path: str) -> tuple[str, int, str] | None:
            return next((w for w in self.open_writes.values() if w[0] == path), None)

        def getattr(self, path: str, fh: int | None = None) -> dict[str, int | float]:
            being = self._writing(path)
            st = os.fstat(being[1]) if being else os.lstat(self._real(path))
            kind, mode = ((stat.S_IFDIR, dir_mode) if stat.S_ISDIR(st.st_mode) else
                          (stat.S_IFLNK, 0o777) if stat.S_ISLNK(st.st_mode) else (stat.S_IFREG, file_mode))
            return {"st_mode": kind | mode, "st_uid": uid, "st_gid": gid, "st_size": st.st_size, "st_nlink": 1,
                    "st_blocks": -(-st.st_size // 512),
                    "st_mtime": st.st_mtime, "st_atime": st.st_mtime, "st_ctime": st.st_mtime}

        def readlink(self, path: str) -> str:  # an object a bucket writer made to look like a link
            return os.readlink(self._real(path))

        def readdir(self, path: str, fh: int) -> list[str]:
            names = [n for n in os.listdir(self._real(path)) if not (path == "/" and n == ".staging")]
            return [".", "..", *names]

        def mkdir(self, path: str, mode: int) -> int:
            os.mkdir(self._real(path))
            return 0

        def rmdir(self, path: str) -> int:
            os.rmdir(self._real(path))
            return 0

        def unlink(self, path: str) -> int:
            os.unlink(self._real(path))
            return 0

        def chmod(self, path: str, mode: int) -> int:
            if semantics == "mountpoint":
                raise fuse.FuseOSError(errno.EPERM)
            return 0

        def chown(self, path: str, uid_: int, gid_: int) -> int:
            if semantics == "mountpoint":
                raise fuse.FuseOSError(errno.EPERM)
            return 0

        def utimens(self, path: str, times: tuple[float, float] | None = None) -> int:
            if semantics == "mountpoint" and self._writing(path) is None:
                raise fuse.FuseOSError(errno.EPERM)
            os.utime(self._real(path), times)
            return 0

        def rename(self, old: str, new: str) -> int:
            if semantics == "mountpoint":
                raise fuse.FuseOSError(errno.ENOSYS)
            if os.path.isdir(self._real(old)):
                raise fuse.FuseOSError(errno.ENOTSUP)
            shutil.copyfile(self._real(old), self._real(new))  # a copy, then a delete: not atomic
            os.unlink(self._real(old))
            return 0

        def _stage(self, path: str, copy_from: str | None) -> int:
            staged = os.path.join(staging, f"{next(numbers)}")
            if copy_from is not None:
                shutil.copyfile(copy_from, staged)
            fd = os.open(staged, os.O_RDWR | os.O_CREAT, 0o600)
            with lock:
                fh = next(self.next)
                self.open_writes[fh] = (path, fd, staged)
            return fh

        def create(self, path: str, mode: int, fi: object = None) -> int:
            if os.path.lexists(self._real(path)) and semantics == "mountpoint":
                raise fuse.FuseOSError(errno.EPERM)
            return self._stage(path, None)

        def open(self, path: str, flags: int) -> int:
            real = self._real(path)
            if flags & (os.O_WRONLY | os.O_RDWR):
                if semantics == "mountpoint" and (flags & os.O_APPEND or not flags & os.O_TRUNC):
                    raise fuse.FuseOSError(errno.EPERM)  # an existing object is never rewritten in place
                if semantics == "mountpoint":
                    raise fuse.FuseOSError(errno.EPERM)  # no overwrite (``--allow-overwrite`` not given)
                return self._stage(path, None if flags & os.O_TRUNC else real)
            return os.open(real, os.O_RDONLY)

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            fd = self.open_writes[fh][1] if fh in self.open_writes else fh
            return os.pread(fd, size, offset)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            _, fd, _ = self.open_writes[fh]
            if semantics == "mountpoint" and offset != os.fstat(fd).st_size:
                raise fuse.FuseOSError(errno.EINVAL)
            return os.pwrite(fd, data, offset)

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            being = self._writing(path)
            if being is None:
                if semantics == "mountpoint":
                    raise fuse.FuseOSError(errno.EPERM)
                os.truncate(self._real(path), length)
            else:
                os.ftruncate(being[1], length)
            return 0

        def flush(self, path: str, fh: int) -> int:
            return 0

        def release(self, path: str, fh: int) -> int:
            with lock:
                writing = self.open_writes.pop(fh, None)
            if writing is None:
                os.close(fh)
                return 0
            name, fd, staged = writing
            os.close(fd)
            os.replace(staged, self._real(name))  # the upload completes: the object appears whole
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            st = os.statvfs(backing)
            return {k: getattr(st, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                                 "f_files", "f_ffree", "f_favail", "f_namemax")}

    fuse.FUSE(Bucket(), mountpoint, foreground=True, nothreads=False, **options)


def mounted_at(mountpoint: str) -> str | None:
    """The file system type /proc/self/mountinfo gives ``mountpoint``, or None."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == mountpoint:
                return fields[fields.index("-") + 1]
    return None


def unavailable() -> str | None:
    """Why no FUSE file system can be mounted by this process, or None."""
    if not os.path.exists("/dev/fuse") or os.geteuid() != 0:
        return "no /dev/fuse, or not root"
    try:
        import mfusepy  # noqa: F401  (it finds libfuse when imported)
    except (ImportError, OSError) as exc:
        return f"mfusepy or libfuse is missing ({exc})"
    return None


class Mounted:
    """A bucket mount at ``mountpoint`` over ``backing``, served by a child process; ``user_id`` is
    who mounted it as the kernel records it (``user_id=`` in mountinfo): the test process's by
    default, another uid to play a mount someone else made (its real uid; it keeps root's
    effective uid, so that it may still mount). ``options`` replace the semantics' own mount options
    (``allow_other`` and ``default_permissions`` on, as gcsfuse and Mountpoint mount; ``subtype``,
    ``fsname``) and set ``file_mode`` and ``dir_mode``, the modes every file and directory shows."""

    def __init__(self, backing: Path, mountpoint: Path, semantics: str, uid: int | None = None, gid: int | None = None,
                 user_id: int | None = None, options: dict[str, object] | None = None) -> None:
        assert semantics in SEMANTICS
        missing = unavailable()
        if missing is not None:
            import pytest

            if os.environ.get("CI"):
                pytest.fail(f"FUSE cannot be mounted here: {missing} (.ci/run installs libfuse2)")
            pytest.skip(f"FUSE cannot be mounted here: {missing}")
        self.backing, self.mountpoint, self.semantics = backing, mountpoint, semantics
        backing.mkdir(parents=True, exist_ok=True)
        mountpoint.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, __file__, str(backing), str(mountpoint), semantics,
                str(os.getuid() if uid is None else uid), str(os.getgid() if gid is None else gid), json.dumps(options or {})]
        become = None if user_id is None else (lambda: os.setresuid(user_id, 0, 0))
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(args, stderr=self.log, preexec_fn=become)
        deadline = time.monotonic() + 30
        while mounted_at(str(mountpoint)) is None:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                self.log.seek(0)
                raise RuntimeError(f"the {semantics} mount at {mountpoint} did not come up: {self.log.read().decode()}")
            time.sleep(0.05)

    def objects(self, under: str = "") -> list[str]:
        """The objects the bucket holds (its backing files), relative to the mount point."""
        root = self.backing / under
        return sorted(str(p.relative_to(self.backing)) for p in root.rglob("*")
                      if p.is_file() and ".staging" not in p.parts)

    def close(self) -> None:
        if mounted_at(str(self.mountpoint)) is not None:
            subprocess.run(["umount", "-l", str(self.mountpoint)], check=False, capture_output=True)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), json.loads(sys.argv[6]))
