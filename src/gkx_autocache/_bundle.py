"""Warm bundles (SPEC §9): a version directory's entries in one archive, to ship a warm cache with
an image or a CI job.

A bundle is a plain tar (entries are compressed already) of entries and their sidecars, flat, plus
``gkx-autocache-manifest.json``: the JAX and jaxlib versions, the platform, and every file's name,
size and sha256. The manifest detects corruption, not tampering (whoever edits an entry can edit
the manifest too): importing a bundle is trusting its author to run code on this machine.
``--sha256`` checks the whole archive against a hash obtained separately.

Import checks everything before it writes anything: a bundle with one bad member is refused whole.
Then each entry appears atomically (a temporary file, then ``os.replace``); an entry already
present is kept.
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

from gkx_autocache import _cache, _entries

MANIFEST = "gkx-autocache-manifest.json"
FORMAT = 1
MANIFEST_LIMIT = 64 << 20
CHUNK = 1 << 20


class Refused(Exception):
    """The bundle is not imported; the message says why, in one line."""


def environment(jax_version: str | None, jaxlib_version: str | None) -> dict[str, Any]:
    """What a bundle records and an import compares: entries from another JAX never hit."""
    return {"jax": jax_version, "jaxlib": jaxlib_version, "system": sys.platform, "machine": platform.machine()}


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
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
    from gkx_autocache._store import _read

    found = _entries.scan(version_dir)
    units = sorted((u for u in found.units.values() if u.has_entry), key=lambda u: u.key)
    listed: list[dict[str, Any]] = []
    tmp = f"{archive}.{os.getpid()}.tmp"
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            for unit in units:
                for path in sorted(unit.files):
                    data = _read(path)  # never through a symlink
                    if data is None:
                        continue  # pruned meanwhile
                    name = os.path.basename(path)
                    _add(tar, name, data)
                    listed.append({"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
            manifest = {"format": FORMAT, "created_by": "gkx-autocache", **env, "version_dir": version_dir,
                        "files": listed}
            _add(tar, MANIFEST, json.dumps(manifest, indent=1).encode())
        os.replace(tmp, archive)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    entries = sum(1 for f in listed if f["name"].endswith(_cache.ENTRY_SUFFIX))
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
        files = {f["name"]: (int(f["size"]), str(f["sha256"]).lower()) for f in manifest["files"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise Refused(f"{MANIFEST} is unreadable ({type(exc).__name__}: {exc})") from None
    if manifest.get("format") != FORMAT:
        raise Refused(f"bundle format {manifest.get('format')!r}, this gkx-autocache reads format {FORMAT}")
    manifest["files"] = files
    return dict(manifest)


def check_environment(manifest: dict[str, Any], env: dict[str, Any]) -> list[str]:
    """How the bundle's environment differs from this one; its entries would never be hit."""
    return [f"{key} {manifest.get(key)} (here {env[key]})" for key in env if manifest.get(key) != env[key]]


def check_member(member: tarfile.TarInfo, files: dict[str, tuple[int, str]]) -> None:
    """A member must be a plain file, named like an entry or sidecar, with no directory part,
    and listed in the manifest with its size."""
    name = member.name
    if not member.isreg():
        kind = "link" if member.issym() or member.islnk() else "directory" if member.isdir() else "special file"
        raise Refused(f"{name!r} is a {kind}; a bundle holds plain files only")
    if "/" in name or "\\" in name or name.startswith(".") or _entries.key_match(name) is None:
        raise Refused(f"{name!r} is not the name of a cache entry or sidecar (it could escape the directory)")
    if name not in files:
        raise Refused(f"{name!r} is not listed in the manifest")
    if member.size != files[name][0]:
        raise Refused(f"{name!r} is {member.size} bytes, the manifest says {files[name][0]}")


def import_bundle(archive: str, version_dir: str, env: dict[str, Any], *, sha256: str | None = None,
                  force: bool = False, shared: bool = False) -> Imported:
    """Merge the bundle's entries into ``version_dir``. Raises Refused, having written nothing."""
    if sha256 is not None:
        expected = sha256.strip().lower().removeprefix("sha256:")
        actual = sha256_of(archive)
        if actual != expected:
            raise Refused(f"the archive's sha256 is {actual}, not {expected}")
    try:
        tar = tarfile.open(archive, "r:*")
    except tarfile.TarError:
        raise Refused("not a readable archive (a tar, as export writes)") from None
    staged: list[tuple[str, str]] = []  # (temporary, final)
    try:
        with tar:
            manifest = read_manifest(tar)
            files = manifest["files"]
            differences = check_environment(manifest, env)
            if differences and not force:
                raise Refused(f"made for {', '.join(differences)}; its entries would never be hit here (--force to import anyway)")
            members = [m for m in tar.getmembers() if m.name != MANIFEST]
            for member in members:
                check_member(member, files)
            missing = set(files) - {m.name for m in members}
            if missing:
                raise Refused(f"{len(missing)} files of the manifest are missing, such as {sorted(missing)[0]!r}")
            present = {u.key for u in _entries.scan(version_dir).units.values() if u.has_entry}
            mode = 0o660 if shared else 0o600
            skipped = set()
            for member in members:
                key = _key(member.name)
                if key in present:
                    skipped.add(key)
                    continue
                final = os.path.join(version_dir, member.name)
                tmp = os.path.join(version_dir, f".{member.name}.{os.getpid()}.{threading.get_ident()}.tmp")
                staged.append((tmp, final))
                _stage(tar, member, tmp, mode, files[member.name][1])
            for tmp, final in staged:
                os.replace(tmp, final)
            staged.clear()
    except tarfile.TarError as exc:
        raise Refused(f"the archive is damaged ({exc})") from None
    finally:
        for tmp, _ in staged:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    new = [m for m in members if _key(m.name) not in skipped]
    return Imported(entries=sum(1 for m in new if m.name.endswith(_cache.ENTRY_SUFFIX)), present=len(skipped),
                    files=len(new), bytes=sum(m.size for m in new))


def _key(name: str) -> str:
    match = _entries.key_match(name)
    return match["key"] if match else name


def _stage(tar: tarfile.TarFile, member: tarfile.TarInfo, tmp: str, mode: int, expected: str) -> None:
    """Copy one member to ``tmp``, checking its sha256 against the manifest on the way."""
    source = tar.extractfile(member)
    if source is None:
        raise Refused(f"{member.name!r} cannot be read")
    digest = hashlib.sha256()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    os.fchmod(fd, mode)  # the umask does not decide a shared cache's group access
    with os.fdopen(fd, "wb") as out:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != expected:
        raise Refused(f"{member.name!r} does not match its sha256 in the manifest: the bundle is corrupt")
