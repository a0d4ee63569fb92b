"""What every command and the Python API start from: the settings as a process of this
environment resolves them, the installed JAX, the directory and its kind (``Context``), where the
start-up hook stands; the one failure a command raises (``CliError``) and the version of the JSON
documents. Never imports ``jax``."""

from __future__ import annotations

import os
import sys
import types
from typing import NamedTuple

from gkx_autocache import _cache, _cpu_target, _layout, _settings

JSON_VERSION = 2  # the JSON documents' (commands' and the API's); 2: misses and compiles not cached are two counts


class CliError(Exception):
    """A failure to report as one line; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:  # 1: the CLI's FAILED
        super().__init__(message)
        self.code = code


class NoDirectory(Exception):
    """There is no cache directory to act on; the message says why."""


class Context(NamedTuple):
    settings: _settings.Settings
    jax_version: str | None
    location: _cache.Location | None  # None when disabled or JAX is not installed

    @property
    def version_dir(self) -> str:
        if self.location is None or self.location.version_dir is None:
            raise NoDirectory(self.why_no_dir())
        return self.location.version_dir

    def store_dir(self, command: str) -> str:
        """The version directory, for a command that reads or writes the package's store: never
        on Windows, where JAX's own cache serves it (``_cache.windows``)."""
        vdir = self.version_dir
        if self.location is not None and self.location.stock:
            raise CliError(f"{command} needs gkx-autocache's store, and {_cache.STOCK_NOTE.format(dir=vdir)}")
        return vdir

    @property
    def root(self) -> str | None:
        return self.location.root if self.location else None

    def why_no_dir(self) -> str:
        if not self.settings["enabled"]:
            return f"the cache is disabled ({self.settings.origin('enabled')})"
        if self.jax_version is None:
            return "JAX is not installed in this environment, so there is no version directory"
        if self.location is not None and self.location.problems:
            return self.location.problems[0][1]
        return "no cache directory"


def distribution_version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_target(level: str) -> _cpu_target.Target:
    """What ``cpu_target`` comes to on this host, with this environment's jaxlib (from its metadata)."""
    from gkx_autocache._jax import versions as jax_versions

    return _cpu_target.here(level, jax_versions.version_tuple(distribution_version("jaxlib") or ""), os.environ.get("XLA_FLAGS", ""))


def load_context(create: bool = False) -> Context:
    """The settings as a process of this environment would resolve them (from the ``JAX_*``
    variables: the commands do not import jax), and the directory it would use."""
    from gkx_autocache._diagnostics import logger

    settings = _settings.resolve(jax_explicit=_settings.jax_explicit(os.environ))
    for path, verdict in settings.files.items():  # (seen with -v: which files, and why one is not)
        logger.info("settings file %s: %s%s", path, verdict.status, f" ({verdict.problem})" if verdict.problem else "")
    for key, resolved in settings.values.items():
        logger.debug("setting %s = %s (%s)", key, resolved.shown(), resolved.origin)
    jax_version = distribution_version("jax")
    location = None
    if jax_version is not None and settings["enabled"]:
        location = _cache.locate(settings, jax_version, create=create)
        logger.info("the version directory: %s", location.version_dir if location else None)
    return Context(settings, jax_version, location)


def skipped_dir(ctx: Context) -> str | None:
    """The warning about an explicit ``dir`` that was skipped (an unset ``$VAR`` in it; relative,
    with the current directory gone), or None. The directory in use is then not the one named."""
    return next((message for cause, message in ctx.settings.problems
                 if cause.startswith("value:") and cause.endswith(":dir")), None)


def refuse_skipped_dir(ctx: Context, command: str) -> None:
    """``clear``, ``prune``, ``verify --repair`` never remove from a directory the user did not name."""
    message = skipped_dir(ctx)
    if message is not None:
        raise CliError(f"{message}; nothing removed ({command} acts only on the directory you named)")


def start_files() -> dict[str, str | None]:
    """Where ``gkx_autocache.pth`` and ``.start`` are installed in this environment."""
    import site
    import sysconfig

    # sys.path's own site folders too: `uv run --with` adds an overlay environment's through a .pth
    folders = [sysconfig.get_paths()["purelib"], *getattr(site, "getsitepackages", list)(),
               *(p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages"))]
    found: dict[str, str | None] = {"gkx_autocache.pth": None, "gkx_autocache.start": None}
    for folder in folders:
        for name in found:
            path = os.path.join(folder, name)
            if found[name] is None and os.path.isfile(path):
                found[name] = path
    return found


def hook_live() -> bool:
    """Whether the hook is live in this interpreter: a finder is in place, ``jax`` is not imported
    yet (a finder put in place after it, by a ``.pth`` line that ran late, never fires), and
    ``GKX_JAX_CACHE`` does not say off (the .pth line puts its finder in place either way, and the
    finder reads the variable when ``jax`` is imported); or, once ``jax`` is imported, whether the
    hook configured it in this process (the API's ``status()``). The finder is known by its name, as
    ``gkx_autocache.is_finder`` knows it (the package's ``__init__`` is imported by no module)."""
    if getattr(sys.modules.get("gkx_autocache._process"), "current", None) is not None:  # the API, where the hook configured JAX
        return True
    off = os.environ.get("GKX_JAX_CACHE", "").strip().lower() in _settings.FALSE
    return not off and _layout.TARGET not in sys.modules and any(_is_finder(f) for f in sys.meta_path)


def _is_finder(obj: object) -> bool:
    try:
        return isinstance(obj, (type, types.FunctionType)) and obj.__name__ == _layout.FINDER
    except Exception:  # another finder on sys.meta_path whose __class__ or __name__ raises
        return False
