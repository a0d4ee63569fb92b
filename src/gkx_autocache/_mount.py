"""Buckets mounted as directories (SPEC §14, amended 2026-12-04): Cloud Storage FUSE, Mountpoint for
S3, s3fs-fuse and their kind, as a local ``dir`` or a directory ``shared`` level.

Such a mount has no atomic rename (Mountpoint: none; Cloud Storage FUSE: a copy, then a delete), no
chmod, owners and modes fixed by its options, and sometimes no overwrite and no append. It has the
object store's own guarantee: an object appears whole when the file that writes it is closed. So
there the package writes each file whole in one create (``_files.atomic``), sets no mode and no
time (recency: none, an entry's age is its write time), and keeps no bookkeeping (ledgers, index,
verdict, the cap's prune need appends, locks and replaces): the bucket's lifecycle rule is the cap.

Known by the file system type and source Linux records for the mount (``/proc/self/mountinfo``).
Trust (docs/trust.md): the owners and modes a FUSE mount shows are whatever its mounter asked for,
so for any FUSE mount the mounter (the kernel's ``user_id``) must be the user or root, and those
modes must be enforced (``default_permissions``, or no ``allow_other``); past that the usual rules
read what the mount shows, the mode its files get included, and who may write the bucket is the
bucket's access policy.
"""

from __future__ import annotations

import os
import stat

# How each tool's mounts show in mountinfo: the type fuse.<subtype> -> the tool
BUCKETS = {
    "fuse.gcsfuse": "Cloud Storage FUSE",
    "fuse.mountpoint-s3": "Mountpoint for S3",
    "fuse.s3fs": "s3fs-fuse",
    "fuse.goofys": "goofys",
    "fuse.geesefs": "GeeseFS",
    "fuse.blobfuse2": "BlobFuse2",
    "fuse.blobfuse": "BlobFuse",
    "fuse.rclone": "rclone mount",
}
# The type plain ``fuse`` (no subtype): Mountpoint for S3, and the buckets Kubernetes' CSI drivers mount
# (GKE's Cloud Storage FUSE driver: its source is the bucket's name). The tools that mount POSIX file
# systems through FUSE name a subtype (sshfs, JuiceFS, fuse-overlayfs, lxcfs...): those are left as they are.
SOURCES = {"mountpoint-s3": "Mountpoint for S3"}
CHECKS_ITSELF = {"fuse.s3fs"}  # checks permissions itself, so it is mounted without default_permissions
CANNOT = ("no rename, chmod or recency there: each file is written whole in one create, and no bookkeeping is kept "
          "(no cap kept at exit, no stats or explanations: the bucket's lifecycle rule is its cap, or `gkx-autocache "
          "prune`, oldest written first)")
UNKEPT = "not kept: {dir} is on a bucket mount, which keeps no records (each run's report line counts its lookups)"


class Mount:
    """A FUSE mount: where (``point``), its type, source and super options as mountinfo gives them,
    and the bucket tool it is (``tool``), or None for a FUSE file system that is not a bucket."""

    __slots__ = ("point", "fstype", "source", "options", "tool")

    def __init__(self, point: str, fstype: str, source: str, options: str) -> None:
        self.point, self.fstype, self.source, self.options = point, fstype, source, options.split(",")
        self.tool = BUCKETS.get(fstype) or ((SOURCES.get(source) or f"a bucket ({source})") if fstype == "fuse" else None)

    @property
    def mounter(self) -> int | None:
        """Who mounted it (the kernel's ``user_id``), None where it does not say."""
        return next((int(o[8:]) for o in self.options if o.startswith("user_id=") and o[8:].isdigit()), None)

    def problem(self) -> str | None:
        """Why the mount must not be trusted, or None. Its mounter chose the owners and modes it
        shows, so the mounter must be you or root; and those modes are enforced only where the
        kernel checks them (``default_permissions``) or no one else may enter (no ``allow_other``)."""
        what = f"{self.tool or self.fstype} mount ({self.point})"
        if self.mounter not in (os.getuid(), 0):
            who = "an unknown user" if self.mounter is None else f"uid {self.mounter}"
            return (f"it is on a {what} made by {who}, not you or root: the mounter chooses the owners and modes it "
                    "shows; mount it yourself")
        if "allow_other" in self.options and "default_permissions" not in self.options \
                and self.fstype not in CHECKS_ITSELF:
            return (f"it is on a {what} with allow_other and without default_permissions: every user of this machine "
                    "may write it, whatever modes it shows; mount it with -o default_permissions")
        return None

    def describe(self) -> str:
        return f"a bucket mount ({self.tool}, {self.fstype}, at {self.point}): {CANNOT}"


# (point, device "major:minor", type, source, super options) of each mount, where any is FUSE: read
# once a process (the list holds the last reading), again where a directory is chosen.
_read_once: list[list[tuple[str, str, str, str, str]]] = []


def fuse_mount(path: str, fresh: bool = False) -> Mount | None:
    """The FUSE mount ``path`` lies on (it need not exist yet), or None: the mount of the device its
    nearest existing directory is on (a mount made over an older one hides it; the longest mount
    point alone would find the hidden one). Mounts are read once a process, and again with
    ``fresh`` (where a directory is chosen: a framework may name one mounted since); a machine
    without FUSE costs one read."""
    if not _read_once or fresh:
        _read_once[:] = [_read()]
    _table = _read_once[0]
    if not _table:
        return None
    real = os.path.realpath(path)
    nearest = real
    while True:
        try:
            dev = os.stat(nearest).st_dev
            break
        except OSError:
            if os.path.dirname(nearest) == nearest:
                return None
            nearest = os.path.dirname(nearest)
    device = f"{os.major(dev)}:{os.minor(dev)}"
    same = [mount for mount in _table if mount[1] == device]  # (a bind mount shows the device elsewhere too)
    over = [mount for mount in same if real == mount[0] or real.startswith(mount[0].rstrip("/") + "/")]
    best = max(reversed(over), key=lambda mount: len(mount[0])) if over else (same[-1] if same else None)
    if best is None or not (best[2] == "fuse" or best[2].startswith(("fuse.", "fuseblk"))):
        return None
    point, _, fstype, source, options = best
    return Mount(point, fstype, source, options)


def bucket_mount(path: str) -> Mount | None:
    """The bucket mount ``path`` lies on, or None."""
    mount = fuse_mount(path)
    return mount if mount is not None and mount.tool is not None else None


def link_problem(path: str) -> str | None:
    """Why a symlink on the way to ``path`` must not be followed, or None: one inside a bucket mount
    is an object whoever can write the bucket made, and chooses where the cache goes. Each link is
    followed as the kernel would (one of yours may point into the bucket, to one of its links)."""
    if not _read_once or not _read_once[0]:
        return None
    pending = os.path.abspath(path).split(os.sep)[1:]
    current, hops = "", 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = os.path.dirname(current)
            continue
        here = f"{current}{os.sep}{part}"
        try:
            link = stat.S_ISLNK(os.lstat(here).st_mode)
        except OSError:
            return None  # not made yet: nothing below it is a link
        if not link:
            current = here
            continue
        if (mount := bucket_mount(current or os.sep)) is not None:
            return (f"{here} is a symlink inside a {mount.tool} mount: whoever can write the bucket chose where it "
                    "points; name the directory itself")
        hops += 1
        if hops > 40:
            return None  # a loop: the directory cannot be made, which says so
        target = os.readlink(here)
        pending = target.split(os.sep) + pending
        current = "" if target.startswith(os.sep) else current
    return None


def _read() -> list[tuple[str, str, str, str, str]]:
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            data = f.read()
    except OSError:
        return []
    if b" - fuse" not in data:  # the usual machine: no FUSE mount at all
        return []
    table = []
    for line in data.decode("utf-8", "replace").splitlines():
        fields = line.split(" ")
        try:
            point, rest = _unescape(fields[4]), fields[fields.index("-") + 1:]
        except (IndexError, ValueError):
            continue
        if len(rest) >= 3:
            table.append((point, fields[2], rest[0], _unescape(rest[1]), rest[2]))
    return table


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline or backslash of a path as an octal escape."""
    if "\\" not in field:
        return field
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field
