"""Another CPU's ``/dev/cpu/0/cpuid``, for the tests (SPEC §12, §15): a real FUSE file system
(mfusepy over libfuse 2) with one file, ``cpuid``, read as the kernel's cpuid driver reads: 16 bytes
at offset ``leaf | subleaf << 32`` are that leaf's four registers (a plain file cannot: its leaves
would overlap). Run as ``python cpuidfs.py REGISTERS.json MOUNTPOINT``; tests use ``Served``, and bind
the file over the driver's in a private mount namespace (``cpus.Cpu``).
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NAME = "cpuid"


def serve(registers: str, mountpoint: str) -> None:
    import mfusepy as fuse  # type: ignore[import-untyped]

    with open(registers) as f:
        regs = {(int(leaf), int(subleaf)): values for leaf, subleaf, *values in json.load(f)}

    class Cpuid(fuse.Operations):  # type: ignore[misc]
        def getattr(self, path: str, fh: int | None = None) -> dict[str, int | float]:
            if path == "/":
                return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2}
            if path == f"/{NAME}":  # as the driver's node: root's alone
                return {"st_mode": stat.S_IFREG | 0o400, "st_nlink": 1, "st_size": 0, "st_uid": 0, "st_gid": 0}
            raise fuse.FuseOSError(errno.ENOENT)

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", NAME]

        def open(self, path: str, flags: int) -> int:
            if path != f"/{NAME}":
                raise fuse.FuseOSError(errno.ENOENT)
            return 0

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            out = b""
            while len(out) + 16 <= size:  # as the driver: one leaf after another, 16 bytes each
                values = regs.get((offset & 0xFFFFFFFF, offset >> 32), [0, 0, 0, 0])
                out += b"".join(int(v).to_bytes(4, "little") for v in values)
                offset += 1
            return out

    # direct_io: each read reaches ``read`` with its own offset (the page cache would serve it in pages).
    fuse.FUSE(Cpuid(), mountpoint, foreground=True, direct_io=True, ro=True, fsname="gkx-test-cpuid")


def unavailable() -> str | None:
    """Why no FUSE file system can be mounted by this process, or None."""
    from bucketfs import unavailable as bucket_unavailable

    return bucket_unavailable()


class Served:
    """``regs`` (``{(leaf, subleaf): (eax, ebx, ecx, edx)}``) served at ``folder``/cpuid by a child
    process until ``close`` (or this process's exit)."""

    def __init__(self, regs: dict[tuple[int, int], tuple[int, int, int, int]], folder: Path) -> None:
        from bucketfs import mounted_at

        self.mountpoint = folder
        folder.mkdir(parents=True, exist_ok=True)
        data = folder.with_name(folder.name + ".json")
        data.write_text(json.dumps([[leaf, subleaf, *values] for (leaf, subleaf), values in regs.items()]))
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen([sys.executable, __file__, str(data), str(folder)], stderr=self.log)
        deadline = time.monotonic() + 30
        while mounted_at(str(folder)) is None:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                self.log.seek(0)
                raise RuntimeError(f"the cpuid file system at {folder} did not come up: {self.log.read().decode()}")
            time.sleep(0.05)
        atexit.register(self.close)

    @property
    def path(self) -> Path:
        return self.mountpoint / NAME

    def close(self) -> None:
        from bucketfs import mounted_at

        if mounted_at(str(self.mountpoint)) is not None:
            subprocess.run(["umount", "-l", str(self.mountpoint)], check=False, capture_output=True)
        if self.process.poll() is None:
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


if __name__ == "__main__":
    os.umask(0o022)
    serve(sys.argv[1], sys.argv[2])
