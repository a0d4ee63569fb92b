"""Warm bundles (SPEC §9): a version directory's entries in one archive, to ship a warm cache with
an image or a CI job.

A bundle is a plain tar (entries are compressed already): first ``gkx-autocache-manifest.json``
(the JAX and jaxlib versions, the platform, and every file's name, size and sha256), then the
entries and their sidecars, flat. The manifest detects corruption, not tampering (whoever edits an
entry can edit the manifest too): importing a bundle is trusting its author to run code on this
machine. ``--sha256`` checks the whole archive against a hash obtained separately.

The manifest comes first so that it bounds everything read after it (SPEC §8): a few KB of
compressed tar headers can hold millions of members, and ``tarfile`` keeps every header it reads
(a 75 KB ``.tar.xz`` of a million headers took 600 MB before it was refused). Import reads the
archive as a stream of members, one at a time, and keeps none of their headers: it checks the
manifest (every size a sane whole number, no name twice) and the total it declares against the cap
and the free space before reading on, then refuses the first member beyond what the manifest
lists, or not listed, or of another size or kind. A header ``tarfile`` would read whole, however
large it says it is (a GNU long name, a PAX header, a sparse map), is refused beyond
``HEADER_LIMIT``. Each member is staged to a temporary file, its sha256 checked on the way
(reading stops at its declared size); only when every member has passed does each appear
atomically (``os.replace``), and a refusal removes what was staged. An entry already present is
kept. Bundles of the earlier layout (manifest last) are still read, in two passes: the first finds
the manifest within ``EARLIER_LAYOUT_MEMBERS`` members (and the cap's worth of bytes), the second
is the same as above.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import sys
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

from gkx_autocache import _autotune, _entries, _files, _isa
from gkx_autocache._diagnostics import human_bytes, one_line, shown
from gkx_autocache._layout import ENTRY_SUFFIX, RECORD_SIDECAR, key_match, tmp_name
from gkx_autocache._record import index as _index

MANIFEST = "gkx-autocache-manifest.json"
FORMAT = 1
MANIFEST_LIMIT = 64 << 20
MAX_MEMBER = 1 << 62  # a size beyond any disk: refused as absurd, not overflowed
CHUNK = 1 << 20
HEADER_LIMIT = 1 << 20  # what tarfile may read for one member's headers; export writes under 1 KB
EARLIER_LAYOUT_MEMBERS = 100_000  # members read before a manifest written last (bundles before the manifest came first)
EXPORT_TRIES = 3


class BundleRefused(Exception):
    """The bundle is not imported; the message says why, in one line."""


def environment(jax_version: str | None, jaxlib_version: str | None) -> dict[str, Any]:
    """What a bundle records and an import compares: entries from another JAX never hit."""
    return {"jax": jax_version, "jaxlib": jaxlib_version, "system": sys.platform, "machine": platform.machine()}


def sha256_of(path: str) -> str:
    with open(path, "rb") as f:
        return _digest(f)


def _digest(f: Any) -> str:
    digest = hashlib.sha256()
    while chunk := f.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


@dataclass
class Exported:
    entries: int
    files: int
    bytes: int
    sha256: str


class _Changed(Exception):
    """A file changed between hashing it for the manifest and writing it."""


def export(version_dir: str, archive: str, env: dict[str, Any], progress: Any = None) -> Exported:
    """Write ``archive`` (atomically) from the entries of ``version_dir`` and their sidecars, the
    manifest first. Each file is read twice (for the manifest, then into the archive) and must be
    the same both times; a directory in use can change meanwhile, so that is tried again."""
    for _ in range(EXPORT_TRIES):
        try:
            return _export(version_dir, archive, env, progress)
        except _Changed:
            continue
    raise OSError(f"its entries changed while they were written, {EXPORT_TRIES} times; try again")


def _export(version_dir: str, archive: str, env: dict[str, Any], progress: Any = None) -> Exported:
    found = _entries.scan(version_dir)
    units = sorted((u for u in found.units.values() if u.has_entry), key=lambda u: u.key)
    listed: list[dict[str, Any]] = []
    paths: list[str] = []
    for unit in units:
        for path in sorted(unit.files):
            if path.endswith(RECORD_SIDECAR):  # a record is compiled by rebuild: only this user's own are trusted
                continue
            # Never through a symlink; and not a use: under relatime the first read after a write (or a
            # day) moved the access time, which the manifest carries as the entry's recency, so two
            # exports of unchanged entries differed (issue 71), and export made every entry recent.
            data = _files.read(path, keep_atime=True)
            if data is None:
                continue  # pruned meanwhile
            item: dict[str, Any] = {"name": os.path.basename(path), "size": len(data),
                                    "sha256": hashlib.sha256(data).hexdigest()}
            if path.endswith(ENTRY_SUFFIX):
                item["used"] = round(unit.last_used, 3)  # its recency travels: a foreign entry stays old
            listed.append(item)
            paths.append(path)
    tuned = _autotune.local(version_dir, team=True)  # XLA's GPU autotune results travel too (``_autotune``)
    for name, data in tuned:
        listed.append({"name": f"{_autotune.FOLDER}/{name}", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        paths.append(os.path.join(version_dir, _autotune.FOLDER, name))
    # What each entry's key was made of (SPEC §13.1: bundles carry the records of their entries), so
    # that a miss after the import is explained, and its ISA is known (SPEC §15).
    # In order (tables, then entries), not as the index holds them: a fold may compact it between two exports.
    found_records = _index.lines_of(version_dir, [u.key for u in units])
    records = sorted(r for r in found_records if not r.startswith("E\t")) + sorted(r for r in found_records if r.startswith("E\t"))
    manifest = {"format": FORMAT, "created_by": "gkx-autocache", **env, "version_dir": version_dir, "files": listed,
                "records": records}
    with _files.atomic(archive, 0o644, follow=True) as out, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, MANIFEST, json.dumps(manifest, indent=1).encode())
        for done, (path, item) in enumerate(zip(paths, listed, strict=True)):
            data = _files.read(path, keep_atime=True)
            if data is None or hashlib.sha256(data).hexdigest() != item["sha256"]:
                raise _Changed(path)  # the temporary archive goes with it
            _add(tar, item["name"], data)
            if progress is not None:
                progress(done + 1, len(paths))
    entries = sum(1 for f in listed if f["name"].endswith(ENTRY_SUFFIX))
    return Exported(entries, len(listed), sum(f["size"] for f in listed), sha256_of(archive))


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    # Nothing of the exporting machine or moment in a header (TarInfo's defaults: mtime 0, uid and
    # gid 0, no user or group names), so that unchanged entries make the same bytes (issue 71).
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o600
    tar.addfile(info, io.BytesIO(data))
    tar.members.clear()  # type: ignore[attr-defined]  # tarfile keeps every header it writes too


@dataclass
class Imported:
    entries: int
    present: int
    files: int
    bytes: int
    records: list[str] = field(default_factory=list)  # the index lines of the entries placed
    other_cpu: int = 0  # entries built for another CPU (kept, never loaded here)
    unknown_cpu: int = 0  # entries whose record does not say (no record, or made without the ISA)


def read_manifest(tar: tarfile.TarFile, member: tarfile.TarInfo) -> dict[str, Any]:
    """The manifest ``member`` of ``tar``, checked: every file once, with a sane size and a sha256."""
    if not member.isreg() or member.issparse() or member.size > MANIFEST_LIMIT:
        raise BundleRefused(f"{MANIFEST} is not a plain file of sensible size")
    stream = tar.extractfile(member)
    try:
        manifest = json.loads(_read_all(stream, member.size) if stream else b"")
        listed = manifest["files"]
        if not isinstance(listed, list):
            raise TypeError("files is not a list")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise BundleRefused(f"{MANIFEST} is unreadable ({type(exc).__name__}: {exc})") from None
    if manifest.get("format") != FORMAT:
        raise BundleRefused(f"bundle format {shown(manifest.get('format'))}, this gkx-autocache reads format {FORMAT}")
    files: dict[str, tuple[int, str]] = {}
    used: dict[str, float] = {}
    for item in listed:
        name, size, digest = _listed(item)
        if name in files:
            raise BundleRefused(f"{MANIFEST} lists {shown(name)} twice")
        files[name] = (size, digest)
        when = item.get("used")
        if isinstance(when, (int, float)) and not isinstance(when, bool) and 0 < when < 1e11:
            used[name] = float(when)
    records = manifest.get("records", [])
    if not isinstance(records, list) or len(records) > 4 * len(files) + 10_000 or \
            not all(isinstance(r, str) and len(r) <= 1 << 16 and "\n" not in r for r in records):
        raise BundleRefused(f"{MANIFEST} has records that are not index lines")
    manifest["files"], manifest["used"], manifest["records"] = files, used, records
    return dict(manifest)


def _listed(item: Any) -> tuple[str, int, str]:
    """One file of the manifest: a name, a size (a whole number of bytes, not absurd) and a sha256."""
    if not isinstance(item, dict):
        raise BundleRefused(f"{MANIFEST} lists {shown(item)}, not a file")
    name, size, digest = item.get("name"), item.get("size"), item.get("sha256")
    if not isinstance(name, str):
        raise BundleRefused(f"{MANIFEST} lists a file without a name")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_MEMBER:
        raise BundleRefused(f"{MANIFEST} gives {shown(name)} the size {str(size)[:40]}, not a byte count")
    if not isinstance(digest, str) or len(digest) != 64:
        raise BundleRefused(f"{MANIFEST} gives {shown(name)} no sha256")
    return name, size, digest.lower()


def _read_all(stream: IO[bytes], size: int) -> bytes:
    chunks = []
    while size > 0 and (chunk := stream.read(min(CHUNK, size))):
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def room(version_dir: str, cap: int) -> list[tuple[int, str]]:
    """What a bundle may hold: ``(bytes, what)`` for the cap and the free space."""
    limits = [(cap, f"max_size ({human_bytes(cap)})")] if cap else []
    try:
        st = os.statvfs(version_dir)
    except OSError:
        return limits
    free = st.f_bavail * st.f_frsize
    return [*limits, (free, f"the free space in {version_dir} ({human_bytes(free)})")]


def check_room(files: dict[str, tuple[int, str]], version_dir: str, cap: int) -> None:
    """Refuse a bundle whose declared total exceeds the cap or the free space, before anything is
    written: a small compressed archive can declare (and hold) gigabytes."""
    total = sum(size for size, _ in files.values())
    for limit, what in room(version_dir, cap):
        if total > limit:
            raise BundleRefused(f"it declares {human_bytes(total)}, more than {what}")


def check_environment(manifest: dict[str, Any], env: dict[str, Any]) -> list[str]:
    """How the bundle's environment differs from this one; its entries would never be hit."""
    return [f"{key} {manifest.get(key)} (here {env[key]})" for key in env if manifest.get(key) != env[key]]


def check_member(member: tarfile.TarInfo, files: dict[str, tuple[int, str]]) -> None:
    """A member must be a plain file, named like an entry or sidecar, with no directory part,
    and listed in the manifest with its size."""
    name = member.name
    if not member.isreg() or member.issparse():
        kind = "link" if member.issym() or member.islnk() else "directory" if member.isdir() else "special file"
        raise BundleRefused(f"{shown(name)} is a {kind}; a bundle holds plain files only")
    if not autotune_member(name) and ("/" in name or "\\" in name or name.startswith(".") or key_match(name) is None):
        raise BundleRefused(f"{shown(name)} is not the name of a cache entry or sidecar (it could escape the directory)")
    if name.endswith(RECORD_SIDECAR):
        raise BundleRefused(f"{shown(name)} is a record: bundles carry none (rebuild compiles records, and trusts only "
                            "those written here)")
    if name not in files:
        raise BundleRefused(f"{shown(name)} is not listed in the manifest")
    if member.size != files[name][0]:
        raise BundleRefused(f"{shown(name)} is {member.size} bytes, the manifest says {files[name][0]}")


def autotune_member(name: str) -> bool:
    """A GPU autotune result (``_autotune``): ``<its folder>/<a name XLA writes>``, nothing deeper."""
    folder, _, base = name.partition("/")
    return folder == _autotune.FOLDER and _autotune.is_name(base)


def import_bundle(archive: str, version_dir: str, env: dict[str, Any], *, sha256: str | None = None,
                  force: bool = False, team: bool = False, cap: int = 0, loads: tuple[str, ...] = (),
                  progress: Any = None) -> Imported:
    """Merge the bundle's entries into ``version_dir``. Raises BundleRefused, having written nothing.
    ``loads``: the ISAs in keys this host loads (its own, and its ``cpu_target``'s); its own alone by default.

    The archive is opened once: ``--sha256`` checks the very bytes that are then read (by path
    twice, someone who can write its folder could swap it between the check and the import)."""
    with open(archive, "rb") as source:
        if sha256 is not None:
            expected = sha256.strip().lower().removeprefix("sha256:")
            actual = _digest(source)
            if actual != expected:
                raise BundleRefused(f"the archive's sha256 is {actual}, not {shown(expected)}")
        try:
            with _members(source) as members:
                first = next(members)
                if first is not None and first[1].name == MANIFEST:
                    manifest = read_manifest(*first)
                    return _merge(members, manifest, True, version_dir, env, force, team, cap, loads, progress)
                manifest = _manifest_last(first, members, version_dir, cap)
            with _members(source) as members:  # the earlier layout: read again, now with its manifest
                return _merge(members, manifest, False, version_dir, env, force, team, cap, loads, progress)
        except _Unreadable as exc:
            raise BundleRefused(f"the archive is damaged: {exc}") from None
        except (tarfile.TarError, ValueError, OverflowError, RecursionError) as exc:  # a PAX size of 40 digits...
            raise BundleRefused(f"the archive is damaged ({shown(str(exc))})") from None


Member = tuple[tarfile.TarFile, tarfile.TarInfo]


class _Unreadable(tarfile.ReadError):
    """The archive cannot be read on (our own words, shown as they are)."""


class _Reader:
    """The archive, decompressed, as ``tarfile`` reads it. While a member's headers are read
    (``budget`` set), what ``tarfile`` takes is counted: it reads a GNU long name, a PAX header or
    a sparse map whole, however large the header says it is (512 MiB of long name is 100 KB of
    xz). The decompressor's errors become ``tarfile.ReadError``: the archive's own failure, not
    one of this machine's files (a full disk while staging stays an OSError)."""

    def __init__(self, raw: io.BufferedIOBase | IO[bytes], errors: tuple[type[Exception], ...]) -> None:
        self.raw = raw
        self.errors = errors
        self.budget: int | None = HEADER_LIMIT

    def read(self, size: int = -1) -> bytes:
        if self.budget is not None:
            if size < 0 or size > self.budget:
                raise _Unreadable(f"a member's tar headers exceed {human_bytes(HEADER_LIMIT)} "
                                  "(gkx-autocache writes them under 1 KB)")
            self.budget -= size
        try:
            return self.raw.read(size)
        except self.errors as exc:
            raise _Unreadable(f"it does not decompress ({one_line(str(exc))[:200]})") from None

    def seek(self, offset: int, whence: int = 0) -> int:
        try:
            return self.raw.seek(offset, whence)  # forward: decompressed and dropped, in bounded memory
        except self.errors as exc:
            raise _Unreadable(f"it does not decompress ({one_line(str(exc))[:200]})") from None

    def tell(self) -> int:
        return self.raw.tell()

    def seekable(self) -> bool:
        return True


def _decompressing(source: IO[bytes]) -> tuple[io.BufferedIOBase | IO[bytes], tuple[type[Exception], ...]]:
    """``source`` (at its start) decompressed as its first bytes say (gzip, bzip2, xz or none),
    and what its decompressor raises for a damaged stream."""
    magic = source.read(6)
    source.seek(0)
    if magic.startswith(b"\x1f\x8b"):
        import gzip
        import zlib

        return gzip.GzipFile(fileobj=source, mode="rb"), (OSError, EOFError, zlib.error)
    if magic.startswith(b"BZh"):
        import bz2

        return bz2.BZ2File(source), (OSError, EOFError)
    if magic.startswith(b"\xfd7zXZ\x00"):
        import lzma

        return lzma.LZMAFile(source), (lzma.LZMAError, EOFError)
    return source, ()


@contextmanager
def _members(source: IO[bytes]) -> Iterator[Iterator[Member | None]]:
    """The archive's members, one at a time, from the start of ``source``; ``tarfile`` keeps none
    of their headers (it appends each to ``members``, which is emptied as they come)."""
    source.seek(0)
    reader = _Reader(*_decompressing(source))
    try:
        tar: tarfile.TarFile = tarfile.open(fileobj=reader, mode="r:")  # type: ignore[call-overload]  # duck-typed file
    except (tarfile.TarError, ValueError, OverflowError, RecursionError):
        raise BundleRefused("not a readable archive (a tar, as export writes)") from None

    def each() -> Iterator[Member | None]:
        while True:
            reader.budget = HEADER_LIMIT
            member = tar.next()
            reader.budget = None
            tar.members.clear()  # type: ignore[attr-defined]
            if tar.pax_headers:  # global ones, kept for the rest of the archive
                raise BundleRefused("it holds a global PAX header; gkx-autocache writes none")
            yield (tar, member) if member is not None else None
            if member is None:
                return

    try:
        with tar:
            yield each()
    finally:
        if reader.raw is not source:
            reader.raw.close()  # the decompressor; it leaves ``source`` open


def _manifest_last(first: Member | None, members: Iterator[Member | None], version_dir: str,
                   cap: int) -> dict[str, Any]:
    """The manifest of a bundle of the earlier layout, written after its members: read within
    ``EARLIER_LAYOUT_MEMBERS`` members and the cap's worth of bytes (the manifest cannot say
    more), so that no archive costs more than that to refuse."""
    limits = room(version_dir, cap)
    count = total = 0
    item = first
    while item is not None:
        tar, member = item
        if member.name == MANIFEST:
            return read_manifest(tar, member)
        count += 1
        if count > EARLIER_LAYOUT_MEMBERS:
            raise BundleRefused(f"more than {EARLIER_LAYOUT_MEMBERS} members before its manifest (a bundle whose manifest "
                          f"comes last, as before gkx-autocache wrote it first, is read up to that many)")
        total += max(member.size, 0)
        for limit, what in limits:
            if total > limit:
                raise BundleRefused(f"its members hold more than {what}")
        item = next(members)
    raise BundleRefused(f"no {MANIFEST}: not a gkx-autocache bundle")


def _merge(members: Iterator[Member | None], manifest: dict[str, Any], manifest_read: bool, version_dir: str,
           env: dict[str, Any], force: bool, team: bool, cap: int, loads: tuple[str, ...] = (),
           progress: Any = None) -> Imported:
    """Check, stage and then place every member after the manifest: at most as many as it lists."""
    files: dict[str, tuple[int, str]] = manifest["files"]
    differences = check_environment(manifest, env)
    if differences and not force:
        raise BundleRefused(f"made for {', '.join(differences)}; its entries would never be hit here (--force to import anyway)")
    check_room(files, version_dir, cap)
    present = {u.key for u in _entries.scan(version_dir).units.values() if u.has_entry}
    mode = _files.file_mode(team)
    staged: list[tuple[str, str]] = []  # (temporary, final)
    seen: set[str] = set()
    skipped: set[str] = set()
    entries = copied = 0
    try:
        while (item := next(members)) is not None:
            tar, member = item
            if member.name == MANIFEST and not manifest_read:  # the earlier layout's, read already
                manifest_read = True
                continue
            # Each member is one the manifest lists, once: the first beyond what it lists is
            # refused (unlisted, or twice), so what is read is bounded by the manifest (SPEC §8).
            check_member(member, files)
            if member.name in seen:
                raise BundleRefused(f"{shown(member.name)} appears twice in the archive")
            seen.add(member.name)
            if progress is not None:
                progress(len(seen), len(files))
            key = _key(member.name)
            final = os.path.join(version_dir, member.name)
            if key in present:
                skipped.add(key)
                continue
            if autotune_member(member.name) and os.path.lexists(final):
                continue  # one fusion's result: the one here is as good
            tmp = os.path.join(version_dir, tmp_name(os.path.basename(final), os.getpid(), threading.get_ident()))
            staged.append((tmp, final))
            _stage(tar, member, tmp, mode, files[member.name][1])
            entries += member.name.endswith(ENTRY_SUFFIX)
            copied += member.size
        if progress is not None:
            progress(len(files), len(files))
        missing = set(files) - seen
        if missing:
            raise BundleRefused(f"{len(missing)} files of the manifest are missing, such as {shown(sorted(missing)[0])}")
        # Two phases, not _files.atomic per member: no member appears until every one has passed.
        left_out = 0
        for tmp, final in staged:
            if os.path.dirname(final) != version_dir:  # an autotune result: its folder is made now
                try:
                    _files.make_dir(os.path.dirname(final), team)
                except OSError:  # (a symlink there): left out, autotuned again; the entries go on
                    _files.remove(tmp)
                    left_out += 1
                    continue
            os.replace(tmp, final)
            when = manifest["used"].get(os.path.basename(final))
            if when is not None:  # its recency as it was: an entry of another CPU must not push ours out
                try:
                    os.utime(final, (when, when), follow_symlinks=False)
                except (OSError, NotImplementedError):
                    pass
        placed = len(staged) - left_out
        placed_keys = [_key(os.path.basename(final)) for _tmp, final in staged if final.endswith(ENTRY_SUFFIX)]
        staged.clear()
    finally:
        for tmp, _ in staged:
            _files.remove(tmp)
    done = Imported(entries=entries, present=len(skipped), files=placed, bytes=copied)
    records = manifest.get("records") or []
    isas = _index.isa_of_entries(records)
    here = set(loads or (_isa.isa(),))
    for key in placed_keys:
        name, hex_ = _index.split_key(key)
        isa = isas.get(f"{name}-{hex_}")
        done.other_cpu += isa is not None and isa not in here
        done.unknown_cpu += isa is None
    wanted = {_index.split_key(k) for k in placed_keys}
    done.records = [r for r in records if not r.startswith("E\t") or tuple(r.split("\t")[1:3]) in wanted]
    return done


def _key(name: str) -> str:
    match = key_match(name)
    return match[0] if match else name


def _stage(tar: tarfile.TarFile, member: tarfile.TarInfo, tmp: str, mode: int, expected: str) -> None:
    """Copy one member to ``tmp``, checking its sha256 against the manifest on the way."""
    source = tar.extractfile(member)
    if source is None:
        raise BundleRefused(f"{shown(member.name)} cannot be read")
    digest = hashlib.sha256()
    left = member.size
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _files.NOFOLLOW, mode)
    os.fchmod(fd, mode)  # the umask does not decide a shared cache's group access
    with os.fdopen(fd, "wb") as out:
        while left > 0 and (chunk := source.read(min(CHUNK, left))):  # never past its declared size
            left -= len(chunk)
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != expected:
        raise BundleRefused(f"{shown(member.name)} does not match its sha256 in the manifest: the bundle is corrupt")
