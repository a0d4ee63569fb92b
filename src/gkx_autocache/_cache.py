"""The cache directory (SPEC §4): where it is, creating it safely, and its on-disk layout.

Layout of a version directory, shared by the store, the CLI, trust checks and pruning::

    <root>/CACHEDIR.TAG                 only when the package created <root>
    <root>/jax-<jax version>/
        CACHEDIR.TAG
        <key>-cache                     JAX's entry, JAX's format
        <key>-<sidecar>                 the package's sidecars begin with the key
        .<anything>                     temporary files
        .gkx-autocache/                 ledger, store verdict, prune lock
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from gkx_autocache import _trust
from gkx_autocache._diagnostics import logger

TAG_NAME = "CACHEDIR.TAG"
TAG = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by gkx-autocache (JAX compilation cache).\n"
    "# For information about cache directory tags, see https://bford.info/cachedir/\n"
)
ENTRY_SUFFIX = "-cache"
META_DIR = ".gkx-autocache"


def in_virtualenv(prefix: str = sys.prefix, base_prefix: str = sys.base_prefix) -> bool:
    """A venv (prefix differs from the base) or a conda environment (has conda-meta)."""
    return prefix != base_prefix or os.path.isdir(os.path.join(prefix, "conda-meta"))


def venv_root(prefix: str = sys.prefix) -> str:
    return os.path.join(prefix, ".cache", "gkx", "jax")


def user_root() -> str:
    """platformdirs' user cache path: ``~/.cache/gkx/jax`` on Linux, honouring XDG_CACHE_HOME."""
    import platformdirs

    return os.path.join(platformdirs.user_cache_dir("gkx"), "jax")


def version_name(jax_version: str) -> str:
    return f"jax-{jax_version}"


def dir_mode(shared: bool) -> int:
    return 0o2770 if shared else 0o700


class Refused(Exception):
    """The directory cannot hold the cache; the message says why, in words for the user."""


@dataclass(frozen=True)
class Prepared:
    root: str
    version_dir: str
    writable: bool


def prepare(root: str, jax_version: str, shared: bool = False, create: bool = True) -> Prepared:
    """Create (if needed) and check ``root/jax-<version>``. Raises Refused.

    ``root`` is made canonical first: where XLA's GPU caches are on, the path enters JAX's cache
    key, so two spellings of one directory would never hit each other. With ``create=False``
    (the CLI) nothing is created, and a missing directory is judged by where it would be made.
    """
    root = os.path.realpath(os.path.abspath(root))
    version_dir = os.path.join(root, version_name(jax_version))
    nearest = _nearest_existing(root)
    problem = _trust.ancestors_problem(nearest + os.sep + "x", shared)
    if problem:
        raise Refused(problem)
    for path in (root, version_dir):
        if create and _make_dir(path, shared):
            _write_tag(path)
        if not create and not os.path.lexists(path):
            continue
        problem = _trust.directory_problem(path, shared)
        if problem:
            raise Refused(problem if path == root else f"{version_dir}: {problem}")
    writable = os.access(version_dir if os.path.isdir(version_dir) else _nearest_existing(version_dir), os.W_OK)
    return Prepared(root, version_dir, writable)


@dataclass
class Choice:
    """The directory JAX gets, or None; what was tried and the problems that deserve a warning."""

    version_dir: str | None = None
    root: str | None = None
    writable: bool = False
    tried: list[tuple[str, str]] = field(default_factory=list)  # (root, why not)
    problems: list[tuple[str, str]] = field(default_factory=list)  # (cause, one-line message)


def choose(settings: Any, jax_version: str, prefix: str = sys.prefix, create: bool = True) -> Choice:
    """The version directory for JAX (SPEC §4).

    An explicit ``dir`` is used or refused, never replaced: the user asked for that place. The
    default is the environment's own ``<prefix>/.cache/gkx/jax``, else the user cache; failing
    over between them is normal (a shared conda environment, someone else's venv) and silent.
    A URL is kept verbatim, with the version added.
    """
    shared = bool(settings["trust_shared"])
    explicit = settings["dir"]
    choice = Choice()
    if explicit is not None:
        if is_url(explicit):  # kept verbatim; the bucket's access policy is its trust (§9)
            from gkx_autocache import _remote

            why = _remote.unsupported(explicit)
            if why:
                choice.tried.append((explicit, why))
                choice.problems.append((f"dir:{explicit}", f"{settings.origin('dir')}: dir {explicit} not used, {why}; running uncached"))
                return choice
            choice.root = explicit.rstrip("/")
            choice.version_dir = f"{choice.root}/{version_name(jax_version)}"
            choice.writable = True
            return choice
        try:
            prepared = prepare(explicit, jax_version, shared, create)
        except Refused as exc:
            choice.tried.append((explicit, str(exc)))
            where = settings.origin("dir")
            choice.problems.append((f"dir:{explicit}", f"{where}: dir {explicit} not used, {exc}; running uncached"))
            return choice
        if not prepared.writable:
            logger.debug("%s is read-only: entries are read, none are written", prepared.version_dir)
        choice.root, choice.version_dir, choice.writable = prepared.root, prepared.version_dir, prepared.writable
        return choice

    roots = [venv_root(prefix)] if in_virtualenv(prefix) else []
    for root in (*roots, user_root()):
        try:
            prepared = prepare(root, jax_version, shared, create)
        except Refused as exc:
            choice.tried.append((root, str(exc)))
            logger.debug("default directory %s refused: %s", root, exc)
            continue
        if prepared.writable:
            choice.root, choice.version_dir, choice.writable = prepared.root, prepared.version_dir, True
            return choice
        choice.tried.append((root, "not writable"))
        logger.debug("default directory %s is not writable", prepared.version_dir)
    reasons = "; ".join(f"{root}: {why}" for root, why in choice.tried)
    choice.problems.append(("dir:default", f"no usable cache directory ({reasons}); set GKX_JAX_CACHE_DIR; running uncached"))
    return choice


def is_url(path: str) -> bool:
    return "://" in path


def _nearest_existing(path: str) -> str:
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _make_dir(path: str, shared: bool) -> bool:
    """Create ``path`` and missing parents with the package's mode whatever the umask; True when
    ``path`` itself was created here."""
    if os.path.isdir(path):
        return False
    parent = os.path.dirname(path)
    if parent != path:
        _make_dir(parent, shared)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if os.path.isdir(path):  # another process won the race
            return False
        raise Refused(f"it cannot be created: {path} exists and is not a directory") from None
    except OSError as exc:
        raise Refused(f"it cannot be created: {exc.strerror} ({path})") from None
    os.chmod(path, dir_mode(shared))  # mkdir's mode is masked by the umask; chmod's is not
    logger.debug("created %s", path)
    return True


def bookkeeping_dir(version_dir: str, shared: bool, *parts: str) -> str | None:
    """``<version dir>/.gkx-autocache[/parts]``, created with the cache's own mode (group members
    of a shared cache write their ledgers too), or None when it cannot be made."""
    path = os.path.join(version_dir, META_DIR, *parts)
    try:
        _make_dir(path, shared)
    except Refused:
        return None
    return path


def _write_tag(path: str) -> None:
    try:
        with open(os.path.join(path, TAG_NAME), "x", encoding="ascii") as f:
            f.write(TAG)
    except OSError:
        pass


def has_tag(path: str) -> bool:
    try:
        with open(os.path.join(path, TAG_NAME), "rb") as f:
            return f.read(43) == TAG[:43].encode()
    except OSError:
        return False


# -- scanning and removing: only files named like entries, sidecars or temporary files, only in a
# -- tagged directory, never through a symlink.

_KEY = r"^(?P<key>.+-[0-9a-f]{64})(?P<suffix>-[A-Za-z0-9_-]+)$"  # compiled on first scan, not on import jax
STALE_TMP_SECS = 3600.0


def key_match(name: str) -> re.Match[str] | None:
    return re.match(_KEY, name)


@dataclass
class Unit:
    """One entry with its sidecars: pruned and cleared together."""

    key: str
    files: list[str] = field(default_factory=list)
    bytes: int = 0
    last_used: float = 0.0
    has_entry: bool = False


@dataclass
class Scan:
    units: dict[str, Unit] = field(default_factory=dict)
    temporary: list[tuple[str, int, float]] = field(default_factory=list)  # (path, bytes, mtime)
    links: list[str] = field(default_factory=list)  # named like entries, never read

    @property
    def bytes(self) -> int:
        return sum(u.bytes for u in self.units.values()) + sum(t[1] for t in self.temporary)

    @property
    def entries(self) -> int:
        return sum(1 for u in self.units.values() if u.has_entry)


def scan(version_dir: str) -> Scan:
    """Group the directory's files by key. Files of other shapes are not the package's: ignored."""
    result = Scan()
    if is_url(version_dir):
        return _scan_remote(version_dir, result)
    try:
        iterator = os.scandir(version_dir)
    except OSError:
        return result
    with iterator:
        for item in iterator:
            name = item.name
            if name.startswith("."):
                if name.endswith(".tmp") and item.is_file(follow_symlinks=False):
                    st = item.stat(follow_symlinks=False)
                    result.temporary.append((item.path, st.st_size, st.st_mtime))
                continue
            match = key_match(name)
            if match is None:
                continue
            if item.is_symlink():
                result.links.append(item.path)
                continue
            if not item.is_file(follow_symlinks=False):
                continue
            st = item.stat(follow_symlinks=False)
            unit = result.units.get(match["key"])
            if unit is None:
                unit = result.units[match["key"]] = Unit(match["key"])
            unit.files.append(item.path)
            unit.bytes += st.st_size
            if match["suffix"] == ENTRY_SUFFIX:
                unit.has_entry = True
                unit.last_used = max(unit.last_used, st.st_atime, st.st_mtime)
    return result


def _scan_remote(version_dir: str, result: Scan) -> Scan:
    """The same grouping over an object listing; an object's recency is its last write (object
    stores keep no access time, and JAX's stock cache writes none unless its own cap is on)."""
    from gkx_autocache import _remote

    for name, size, mtime, prefix in _remote.listing(version_dir):
        match = None if prefix else key_match(name)
        if match is None:
            continue
        unit = result.units.get(match["key"])
        if unit is None:
            unit = result.units[match["key"]] = Unit(match["key"])
        unit.files.append(f"{version_dir}/{name}")
        unit.bytes += size
        if match["suffix"] == ENTRY_SUFFIX:
            unit.has_entry = True
            unit.last_used = max(unit.last_used, mtime)
    return result


def least_recent_first(units: list[Unit]) -> list[Unit]:
    return sorted(units, key=lambda u: (u.has_entry, u.last_used))  # orphans first


def select_over(units: list[Unit], target: int) -> list[Unit]:
    """The least recently used units to remove so that the rest fits in ``target`` bytes."""
    total = sum(u.bytes for u in units)
    chosen = []
    for unit in least_recent_first(units):
        if total <= target:
            break
        chosen.append(unit)
        total -= unit.bytes
    return chosen


def remove_files(version_dir: str, paths: list[str]) -> int:
    """Unlink the given files of a tagged directory; the bytes freed. Refuses an untagged one.
    On a remote directory, deletes objects named like entries and sidecars; the count deleted."""
    if is_url(version_dir):
        from gkx_autocache import _remote

        return _remote.remove(version_dir, paths)
    if not has_tag(version_dir):
        raise Refused(f"{version_dir} has no gkx-autocache {TAG_NAME}: nothing removed")
    freed = 0
    for path in paths:
        if os.path.dirname(path) != version_dir:
            continue
        try:
            st = os.lstat(path)
            os.unlink(path)  # unlink never follows a symlink
            freed += st.st_size
        except OSError:
            continue
    return freed


def prune_at_exit(version_dir: str, cap: int, written: int) -> None:
    """Keep the directory under ``cap``: prune to 90 % of it, least recently used first.

    Runs at exit in a process that wrote entries, under a non-blocking lock (a process that finds
    it taken skips). The size is kept in ``.gkx-autocache/size``: a full scan happens only when
    that estimate crosses the cap, or is over an hour old.
    """
    import fcntl
    import time

    meta = os.path.join(version_dir, META_DIR)
    try:
        lock = os.open(os.path.join(meta, "prune.lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    except OSError:
        return
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return
        size_file = os.path.join(meta, "size")
        estimate = None
        try:
            if time.time() - os.stat(size_file).st_mtime < 3600:
                with open(size_file, encoding="ascii") as f:
                    estimate = int(f.read()) + written
        except (OSError, ValueError):
            pass
        if estimate is None or estimate > cap:
            found = scan(version_dir)
            units = list(found.units.values())
            removed = select_over(units, int(cap * 0.9)) if found.bytes > cap else []
            freed = remove_files(version_dir, [p for u in removed for p in u.files])
            estimate = found.bytes - freed
            if removed:
                logger.debug("pruned %d entries (%d bytes) from %s", len(removed), freed, version_dir)
        tmp = f"{size_file}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="ascii") as f:
            f.write(str(estimate))
        os.replace(tmp, size_file)
    except (OSError, Refused) as exc:
        logger.debug("prune skipped: %s", exc)
    finally:
        os.close(lock)
