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
import sys
from dataclasses import dataclass

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


def prepare(root: str, jax_version: str, shared: bool = False) -> Prepared:
    """Create (if needed) and check ``root/jax-<version>``. Raises Refused.

    ``root`` is made canonical first: where XLA's GPU caches are on, the path enters JAX's cache
    key, so two spellings of one directory would never hit each other.
    """
    root = os.path.realpath(os.path.abspath(root))
    version_dir = os.path.join(root, version_name(jax_version))
    problem = _trust.ancestors_problem(_nearest_existing(root) + os.sep + "x", shared)
    if problem:
        raise Refused(problem)
    for path in (root, version_dir):
        if _make_dir(path, shared):
            _write_tag(path)
        problem = _trust.directory_problem(path, shared)
        if problem:
            raise Refused(problem if path == root else f"{version_dir}: {problem}")
    return Prepared(root, version_dir, os.access(version_dir, os.W_OK))


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
