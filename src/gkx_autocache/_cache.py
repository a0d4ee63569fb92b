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
from collections.abc import Iterator
from typing import Any, NamedTuple

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
    return os.path.join(user_dir("cache", "gkx"), "jax")


_XDG = {"cache": ("XDG_CACHE_HOME", "~/.cache"), "config": ("XDG_CONFIG_HOME", "~/.config")}


def user_dir(kind: str, app: str) -> str:
    """platformdirs' ``user_cache_dir(app)`` or ``user_config_dir(app)``. On Linux (not Android)
    that is the XDG rule, computed here: importing platformdirs costs about 7 ms of every
    ``import jax``. Elsewhere, platformdirs itself."""
    android = os.environ.get("ANDROID_DATA") == "/data" and os.environ.get("ANDROID_ROOT") == "/system"
    if sys.platform == "linux" and not android:
        variable, fallback = _XDG[kind]
        return os.path.join(os.environ.get(variable, "").strip() or os.path.expanduser(fallback), app)
    import platformdirs

    return str(platformdirs.user_cache_dir(app) if kind == "cache" else platformdirs.user_config_dir(app))


def version_name(jax_version: str) -> str:
    return f"jax-{jax_version}"


def dir_mode(shared: bool) -> int:
    return 0o2770 if shared else 0o700


class Refused(Exception):
    """The directory cannot hold the cache; the message says why, in words for the user."""


class Prepared(NamedTuple):
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


class Choice:
    """The directory JAX gets, or None; what was tried and the problems that deserve a warning.
    (Plain classes on this path: a dataclass costs about 1 ms of ``import jax`` to create.)"""

    def __init__(self, version_dir: str | None = None, root: str | None = None, writable: bool = False) -> None:
        self.version_dir = version_dir
        self.root = root
        self.writable = writable
        self.tried: list[tuple[str, str]] = []  # (root, why not)
        self.problems: list[tuple[str, str]] = []  # (cause, one-line message)


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

    def roots() -> Iterator[str]:  # the user root is computed only when needed
        if in_virtualenv(prefix):
            yield venv_root(prefix)
        yield user_root()

    for root in roots():
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
    """Whether ``path`` is known to be a gkx-autocache directory, so that its entries may be
    deleted. An object store has no directory to tag: there the version prefix and the entry
    names are what is recognised, so a URL counts as tagged."""
    if is_url(path):
        return True
    try:
        with open(os.path.join(path, TAG_NAME), "rb") as f:
            return f.read(43) == TAG[:43].encode()
    except OSError:
        return False
