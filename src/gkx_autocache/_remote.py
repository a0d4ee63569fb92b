"""Remote cache directories, ``s3://`` and ``gs://`` (SPEC §9).

JAX reads and writes them itself, through ``etils.epath``, with its stock cache and no cap: the
store of §7 is local-only. This module is what the package adds around that: the check that the
``remote`` extra is installed (on ``import jax``), the process's ledger object (at exit), and the
listing and deletion behind the CLI's ``status``, ``stats``, ``clear`` and ``prune``. It goes
through fsspec, the library ``etils.epath`` itself uses for these schemes (s3fs, gcsfs), so the
CLI sees the same bucket, endpoint and credentials as JAX. Only objects named like entries and
sidecars, directly under the version prefix, are ever deleted; an object store has no owner or
mode to check, so its trust is the bucket's access policy.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gkx_autocache._backends.schemes import SCHEMES, Row
from gkx_autocache._layout import LEDGER_DIR, LEDGER_SUFFIX, META_DIR, VERSION_PREFIX, key_match


def row(url: str) -> Row:
    """The table's row for ``url``'s scheme (the settings take for ``dir`` only those JAX's own
    cache can hold: ``Row.as_dir``)."""
    return SCHEMES[url.split("://", 1)[0].lower()]


def unsupported(url: str) -> str | None:
    """Why ``url`` cannot hold the cache here (what its row says JAX's own cache needs, missing), in
    words for the user, or None. Nothing is imported (``find_spec`` of a top-level name only
    looks), so this is cheap on ``import jax``."""
    import importlib.util

    found = row(url)
    missing = [name for name in found.as_dir or () if importlib.util.find_spec(name) is None]
    return f"{', '.join(missing)} not installed: pip install '{found.extra}'" if missing else None


class RemoteError(OSError):
    """A remote operation failed; the message is one line for the user."""


@contextmanager
def _errors(url: str) -> Iterator[None]:
    """Any failure of the filesystem library (credentials, network, permissions) as one line."""
    try:
        yield
    except FileNotFoundError:
        raise
    except Exception as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise RemoteError(f"{url}: {text}") from None


def filesystem(url: str, own: bool = False) -> tuple[Any, str]:
    """fsspec's filesystem for ``url`` and the path in it (``bucket/prefix``): the call every
    remote operation goes through. ``own``: an instance of its own, not fsspec's cached one that
    the process's other code shares (the shared level registers a retry handler on its client).
    gcsfs's aiohttp session reads the proxy variables only when told to (s3fs's botocore reads them
    itself): told where the environment names a proxy."""
    import fsspec.core

    options: dict[str, Any] = {"skip_instance_cache": True} if own else {}
    if row(url).proxy_session and any(name.lower() in ("https_proxy", "http_proxy", "all_proxy") and value
                                   for name, value in os.environ.items()):
        options["session_kwargs"] = {"trust_env": True}
    with _errors(url):
        fs, path = fsspec.core.url_to_fs(url, **options)
    return fs, path


def written(info: dict[str, Any]) -> float:
    """An object's last write, from a listing: S3 says ``LastModified``, GCS ``updated``."""
    stamp = info.get("LastModified") or info.get("updated") or info.get("mtime")
    if stamp is None:
        return 0.0
    if isinstance(stamp, (int, float)):
        return float(stamp)
    if isinstance(stamp, str):
        from datetime import datetime

        stamp = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return float(stamp.timestamp())


def listing(url: str) -> list[tuple[str, int, float, bool]]:
    """``(name, bytes, last write, is a prefix)`` for what is directly under ``url``; empty when
    there is nothing (object stores have no empty directories)."""
    fs, path = filesystem(url)
    try:
        with _errors(url):
            fs.invalidate_cache(path)
            infos = fs.ls(path, detail=True)
    except FileNotFoundError:
        return []
    found = []
    for info in infos:
        name = str(info["name"]).rstrip("/").rsplit("/", 1)[-1]
        found.append((name, int(info.get("size") or 0), written(info), info.get("type") == "directory"))
    return found


def version_dirs(root: str) -> list[str]:
    return [f"{root}/{name}" for name, _, _, prefix in sorted(listing(root)) if prefix and name.startswith(VERSION_PREFIX)]


def remove(version_dir: str, urls: list[str], progress: Any = None) -> int:
    """Delete the given objects, each directly under ``version_dir`` and named like an entry, a
    sidecar or a ledger, a thousand a request (S3's batch; ``progress(done, total)`` after each);
    the count removed."""
    fs, path = filesystem(version_dir)
    doomed = []
    for url in urls:
        parent, _, name = url.rpartition("/")
        entry = parent == version_dir and key_match(name)
        ledger = parent == ledger_dir(version_dir) and name.endswith(LEDGER_SUFFIX)
        if entry or ledger:
            doomed.append(f"{path}/{url[len(version_dir) + 1:]}")
    for at in range(0, len(doomed), 1000):
        with _errors(version_dir):
            fs.rm(doomed[at:at + 1000])
        if progress is not None:
            progress(min(at + 1000, len(doomed)), len(doomed))
    return len(doomed)


def read_bytes(url: str) -> bytes | None:
    fs, path = filesystem(url)
    try:
        return bytes(fs.cat_file(path))
    except (OSError, ValueError):
        return None


def ledger_dir(version_dir: str) -> str:
    return f"{version_dir}/{META_DIR}/{LEDGER_DIR}"


def ledger_files(version_dir: str) -> list[str]:
    folder = ledger_dir(version_dir)
    return [f"{folder}/{name}" for name, _, _, prefix in sorted(listing(folder)) if not prefix and name.endswith(LEDGER_SUFFIX)]


def write_ledger(version_dir: str, text: str) -> None:
    """One object per process, written once at exit (objects cannot be appended to)."""
    import socket

    fs, folder = filesystem(ledger_dir(version_dir))
    name = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}{LEDGER_SUFFIX}"
    with _errors(version_dir):
        fs.pipe_file(f"{folder}/{name}", text.encode("utf-8"))
