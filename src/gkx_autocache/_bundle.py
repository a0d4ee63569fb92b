"""Warm bundles (SPEC §9): a version directory's entries in one archive, to ship a warm cache with
an image or a CI job.

A bundle is a plain tar (entries are compressed already) of entries and their sidecars, flat, plus
``gkx-autocache-manifest.json``: the JAX and jaxlib versions, the platform, and every file's name,
size and sha256. The manifest detects corruption, not tampering (whoever edits an entry can edit
the manifest too): importing a bundle is trusting its author to run code on this machine.
``--sha256`` checks the whole archive against a hash obtained separately.

Import checks everything it can before it writes anything: the manifest (every size a sane
whole number, no name twice), the total it declares against the cap and the free space (a small
compressed archive can declare gigabytes), then every member's name, kind and size. A bundle with
one bad member is refused whole. Then each entry is staged and its sha256 checked while it is
copied (reading stops at its declared size), and only when all have passed does each appear
atomically (``os.replace``); an entry already present is kept.
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
from dataclasses import dataclass
from typing import Any

from gkx_autocache import _entries, _files
from gkx_autocache._diagnostics import human_bytes, shown
from gkx_autocache._layout import ENTRY_SUFFIX, key_match, tmp_name

MANIFEST = "gkx-autocache-manifest.json"
FORMAT = 1
MANIFEST_LIMIT = 64 << 20
MAX_MEMBER = 1 << 62  # a size beyond any disk: refused as absurd, not overflowed
CHUNK = 1 << 20


class Refused(Exception):
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


def export(version_dir: str, archive: str, env: dict[str, Any]) -> Exported:
    """Write ``archive`` (atomically) from the entries of ``version_dir`` and their sidecars."""
    found = _entries.scan(version_dir)
    units = sorted((u for u in found.units.values() if u.has_entry), key=lambda u: u.key)
    listed: list[dict[str, Any]] = []
    with _files.atomic(archive, 0o644) as out, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for unit in units:
            for path in sorted(unit.files):
                data = _files.read(path)  # never through a symlink
                if data is None:
                    continue  # pruned meanwhile
                name = os.path.basename(path)
                _add(tar, name, data)
                listed.append({"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        manifest = {"format": FORMAT, "created_by": "gkx-autocache", **env, "version_dir": version_dir, "files": listed}
        _add(tar, MANIFEST, json.dumps(manifest, indent=1).encode())
    entries = sum(1 for f in listed if f["name"].endswith(ENTRY_SUFFIX))
    return Exported(entries, len(listed), sum(f["size"] for f in listed), sha256_of(archive))


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o600
    tar.addfile(info, io.BytesIO(data))


@dataclass
class Imported:
    entries: int
    present: int
    files: int
    bytes: int


def read_manifest(tar: tarfile.TarFile) -> dict[str, Any]:
    try:
        member = tar.getmember(MANIFEST)
    except KeyError:
        raise Refused(f"no {MANIFEST}: not a gkx-autocache bundle") from None
    if not member.isreg() or member.size > MANIFEST_LIMIT:
        raise Refused(f"{MANIFEST} is not a plain file of sensible size")
    stream = tar.extractfile(member)
    try:
        manifest = json.loads(stream.read() if stream else b"")
        listed = manifest["files"]
        if not isinstance(listed, list):
            raise TypeError("files is not a list")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise Refused(f"{MANIFEST} is unreadable ({type(exc).__name__}: {exc})") from None
    if manifest.get("format") != FORMAT:
        raise Refused(f"bundle format {shown(manifest.get('format'))}, this gkx-autocache reads format {FORMAT}")
    files: dict[str, tuple[int, str]] = {}
    for item in listed:
        name, size, digest = _listed(item)
        if name in files:
            raise Refused(f"{MANIFEST} lists {shown(name)} twice")
        files[name] = (size, digest)
    manifest["files"] = files
    return dict(manifest)


def _listed(item: Any) -> tuple[str, int, str]:
    """One file of the manifest: a name, a size (a whole number of bytes, not absurd) and a sha256."""
    if not isinstance(item, dict):
        raise Refused(f"{MANIFEST} lists {shown(item)}, not a file")
    name, size, digest = item.get("name"), item.get("size"), item.get("sha256")
    if not isinstance(name, str):
        raise Refused(f"{MANIFEST} lists a file without a name")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_MEMBER:
        raise Refused(f"{MANIFEST} gives {shown(name)} the size {str(size)[:40]}, not a byte count")
    if not isinstance(digest, str) or len(digest) != 64:
        raise Refused(f"{MANIFEST} gives {shown(name)} no sha256")
    return name, size, digest.lower()


def check_room(files: dict[str, tuple[int, str]], version_dir: str, cap: int) -> None:
    """Refuse a bundle whose declared total exceeds the cap or the free space, before anything is
    written: a small compressed archive can declare (and hold) gigabytes."""
    total = sum(size for size, _ in files.values())
    if cap and total > cap:
        raise Refused(f"it declares {human_bytes(total)}, more than max_size ({human_bytes(cap)})")
    try:
        st = os.statvfs(version_dir)
    except OSError:
        return
    free = st.f_bavail * st.f_frsize
    if total > free:
        raise Refused(f"it declares {human_bytes(total)}, more than the free space in {version_dir} ({human_bytes(free)})")


def check_environment(manifest: dict[str, Any], env: dict[str, Any]) -> list[str]:
    """How the bundle's environment differs from this one; its entries would never be hit."""
    return [f"{key} {manifest.get(key)} (here {env[key]})" for key in env if manifest.get(key) != env[key]]


def check_member(member: tarfile.TarInfo, files: dict[str, tuple[int, str]]) -> None:
    """A member must be a plain file, named like an entry or sidecar, with no directory part,
    and listed in the manifest with its size."""
    name = member.name
    if not member.isreg():
        kind = "link" if member.issym() or member.islnk() else "directory" if member.isdir() else "special file"
        raise Refused(f"{shown(name)} is a {kind}; a bundle holds plain files only")
    if "/" in name or "\\" in name or name.startswith(".") or key_match(name) is None:
        raise Refused(f"{shown(name)} is not the name of a cache entry or sidecar (it could escape the directory)")
    if name not in files:
        raise Refused(f"{shown(name)} is not listed in the manifest")
    if member.size != files[name][0]:
        raise Refused(f"{shown(name)} is {member.size} bytes, the manifest says {files[name][0]}")


def import_bundle(archive: str, version_dir: str, env: dict[str, Any], *, sha256: str | None = None,
                  force: bool = False, shared: bool = False, cap: int = 0) -> Imported:
    """Merge the bundle's entries into ``version_dir``. Raises Refused, having written nothing.

    The archive is opened once: ``--sha256`` checks the very bytes that are then read (by path
    twice, someone who can write its folder could swap it between the check and the import)."""
    with open(archive, "rb") as source:
        if sha256 is not None:
            expected = sha256.strip().lower().removeprefix("sha256:")
            actual = _digest(source)
            if actual != expected:
                raise Refused(f"the archive's sha256 is {actual}, not {shown(expected)}")
            source.seek(0)
        try:
            tar = tarfile.open(fileobj=source, mode="r:*")
        except (tarfile.TarError, ValueError, OverflowError):
            raise Refused("not a readable archive (a tar, as export writes)") from None
        return _import(tar, version_dir, env, force, shared, cap)


def _import(tar: tarfile.TarFile, version_dir: str, env: dict[str, Any], force: bool, shared: bool,
            cap: int) -> Imported:
    staged: list[tuple[str, str]] = []  # (temporary, final)
    try:
        with tar:
            manifest = read_manifest(tar)
            files = manifest["files"]
            differences = check_environment(manifest, env)
            if differences and not force:
                raise Refused(f"made for {', '.join(differences)}; its entries would never be hit here (--force to import anyway)")
            check_room(files, version_dir, cap)
            members = [m for m in tar.getmembers() if m.name != MANIFEST]
            seen: set[str] = set()
            for member in members:
                check_member(member, files)
                if member.name in seen:
                    raise Refused(f"{shown(member.name)} appears twice in the archive")
                seen.add(member.name)
            missing = set(files) - {m.name for m in members}
            if missing:
                raise Refused(f"{len(missing)} files of the manifest are missing, such as {shown(sorted(missing)[0])}")
            present = {u.key for u in _entries.scan(version_dir).units.values() if u.has_entry}
            mode = _files.file_mode(shared)
            skipped = set()
            for member in members:
                key = _key(member.name)
                if key in present:
                    skipped.add(key)
                    continue
                final = os.path.join(version_dir, member.name)
                tmp = os.path.join(version_dir, tmp_name(member.name, os.getpid(), threading.get_ident()))
                staged.append((tmp, final))
                _stage(tar, member, tmp, mode, files[member.name][1])
            # Two phases, not _files.atomic per member: no member appears until every one has passed.
            for tmp, final in staged:
                os.replace(tmp, final)
            staged.clear()
    except (tarfile.TarError, ValueError, OverflowError, RecursionError) as exc:  # a PAX size of 40 digits...
        raise Refused(f"the archive is damaged ({shown(str(exc))})") from None
    finally:
        for tmp, _ in staged:
            _files.remove(tmp)
    new = [m for m in members if _key(m.name) not in skipped]
    return Imported(entries=sum(1 for m in new if m.name.endswith(ENTRY_SUFFIX)), present=len(skipped),
                    files=len(new), bytes=sum(m.size for m in new))


def _key(name: str) -> str:
    match = key_match(name)
    return match[0] if match else name


def _stage(tar: tarfile.TarFile, member: tarfile.TarInfo, tmp: str, mode: int, expected: str) -> None:
    """Copy one member to ``tmp``, checking its sha256 against the manifest on the way."""
    source = tar.extractfile(member)
    if source is None:
        raise Refused(f"{shown(member.name)} cannot be read")
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
        raise Refused(f"{shown(member.name)} does not match its sha256 in the manifest: the bundle is corrupt")
