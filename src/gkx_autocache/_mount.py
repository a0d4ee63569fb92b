"""Buckets mounted as directories (SPEC §14, amended 2026-12-04): Cloud Storage FUSE, Mountpoint for
S3, s3fs-fuse and their kind, as a local ``dir`` or a directory ``shared`` level.

Such a mount has no atomic rename (Mountpoint: none; Cloud Storage FUSE: a copy, then a delete), no
chmod, owners and modes fixed by its options, and sometimes no overwrite and no append. It has the
object store's own guarantee: an object appears whole when the file that writes it is closed. So
there the package writes each file whole in one create (``_files.atomic``), sets no mode and no
time (recency: none, an entry's age is its write time), and keeps no bookkeeping (ledgers, index,
verdict, the cap's prune need appends, locks and replaces): the bucket's lifecycle rule is the cap.

Known by the file system type Linux records for the mount (``/proc/self/mountinfo``), read once a
path. Trust (docs/trust.md): the owners and modes such a mount shows are whatever its mounter asked
for, so the mounter (the kernel's ``user_id``) must be the user or root; past that the usual rules
read what the mount shows, and who may write the bucket is the bucket's access policy.
"""

from __future__ import annotations

import os

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
SOURCES = {"mountpoint-s3": "Mountpoint for S3"}  # type plain ``fuse`` (no subtype): the source names the tool
CANNOT = ("no rename, chmod or recency there: each file is written whole in one create, and no bookkeeping is kept "
          "(no cap kept at exit, no stats or explanations: the bucket's lifecycle rule is its cap, or `gkx-autocache "
          "prune`, oldest written first)")
UNKEPT = "not kept: {dir} is on a bucket mount, which keeps no records (each run's report line counts its lookups)"


class Mount:
    """A bucket mount: where (``point``), what (``tool``, from mountinfo's type and source), and who
    mounted it (``mounter``: the kernel's ``user_id``, None where it does not say)."""

    __slots__ = ("point", "fstype", "tool", "mounter")

    def __init__(self, point: str, fstype: str, tool: str, mounter: int | None) -> None:
        self.point, self.fstype, self.tool, self.mounter = point, fstype, tool, mounter

    def problem(self) -> str | None:
        """Why the mount must not be trusted, or None: someone else mounted it, and chose what
        owners and modes it shows."""
        uid = os.getuid()
        if self.mounter in (uid, 0):
            return None
        who = "an unknown user" if self.mounter is None else f"uid {self.mounter}"
        return (f"it is on a {self.tool} mount ({self.point}) made by {who}, not you or root: the mounter chooses the "
                "owners and modes it shows; mount the bucket yourself")

    def describe(self) -> str:
        return f"a bucket mount ({self.tool}, {self.fstype}, at {self.point}): {CANNOT}"


# (point, type, source, super options) of each mount, read once a process where any is FUSE
_table: list[tuple[str, str, str, str]] | None = None


def bucket_mount(path: str) -> Mount | None:
    """The bucket mount ``path`` lies on (it need not exist yet), or None: not Linux, not a
    bucket mount. Mounts are read once a process (they do not move under a running program)."""
    global _table
    if _table is None:
        _table = _read()
    real = os.path.realpath(path) if _table else ""
    best = None
    for mount in _table:  # the last of the longest: a mount over another hides it
        point = mount[0]
        if (real == point or real.startswith(point.rstrip("/") + "/")) and (best is None or len(point) >= len(best[0])):
            best = mount
    if best is None:
        return None
    point, fstype, source, options = best
    tool = BUCKETS.get(fstype) or (SOURCES.get(source) if fstype == "fuse" else None)
    if tool is None:
        return None
    mounter = next((int(o[8:]) for o in options.split(",") if o.startswith("user_id=") and o[8:].isdigit()), None)
    return Mount(point, fstype, tool, mounter)


def _read() -> list[tuple[str, str, str, str]]:
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
            table.append((point, rest[0], _unescape(rest[1]), rest[2]))
    return table


def _unescape(field: str) -> str:
    """mountinfo writes a space, tab, newline or backslash of a path as an octal escape."""
    if "\\" not in field:
        return field
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field
