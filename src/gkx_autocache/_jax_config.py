"""What the package sets in ``jax.config`` beside the directory: JAX's two thresholds, and XLA's own
GPU caches (never pointed at a directory the trust rules refuse; off where there is no GPU)."""

from __future__ import annotations

import os
from typing import Any

from gkx_autocache import _cache, _mount, _settings
from gkx_autocache._diagnostics import logger
from gkx_autocache._layout import is_url


def set_thresholds(config: Any, settings: _settings.Settings, directory: str) -> None:
    """JAX's two thresholds and its XLA caches, where the user's own JAX settings do not fix them."""
    updates: dict[str, Any] = {}
    for key in ("min_compile_time_secs", "min_entry_size_bytes"):
        if not settings.from_jax(key):
            updates[_settings.KEYS[key].jax_option] = settings[key]  # type: ignore[index]
    if not settings.from_jax("xla_caches") and hasattr(config, "jax_persistent_cache_enable_xla_caches"):
        xla_caches = xla_caches_for(settings, directory)
        if xla_caches is not None:
            updates["jax_persistent_cache_enable_xla_caches"] = xla_caches
    for option, value in updates.items():
        config.update(option, value)
        logger.debug("jax.config.update(%r, %r)", option, value)


def jax_cap(config: Any) -> int | None:
    """The user's own ``jax_compilation_cache_max_size`` in bytes (0 for any size at which JAX's
    cache keeps nothing: 0, or a negative one but -1), or None where it is JAX's default (-1, no cap)."""
    size = getattr(config, "jax_compilation_cache_max_size", -1)
    return None if not isinstance(size, int) or size == -1 else max(size, 0)


NOTHING_CACHED = ("jax_compilation_cache_max_size is {size}, at which JAX caches nothing: nothing is cached; fix: "
                  "unset it, or set it to -1 (no cap) or a size")


class XlaCaches:
    """XLA's own GPU caches (its autotune results; the kernel cache file: code) kept out of a
    directory the trust rules refuse. JAX points them under its cache directory whenever one is
    set, in each compile's options, before it sets up its cache object (and whether or not it sets
    one up), so they are judged at each compile where the options point them (``allowed``, from
    ``_jax.caching.guard_xla_caches``), after JAX has routed its directory (``_route.route``), and turned off
    for a refused one (``refuse``): also a directory another user made after it was set (issue 67's
    M2), and a relative one wherever the working directory has moved it. ``judge``, when the
    directory is set, turns them off in ``jax.config`` early, and back on as they were once a
    directory that may be trusted is set."""

    def __init__(self, settings: _settings.Settings, config: Any) -> None:
        self._settings, self._config = settings, config
        self._before: str | None = None  # what was turned off, to turn it back on
        self._refused: set[str] = set()  # real paths, refused once: for the rest of the process
        self._judged: set[str] = set()  # real paths that passed, checked again by one stat

    def judge(self, path: str) -> None:
        if is_url(path) or not hasattr(self._config, OPTION) or self._settings["read_untrusted_dir"]:
            return
        try:
            refused = not self.allowed(path)
        except Exception:
            return
        now = getattr(self._config, OPTION)
        if refused and now != "none":
            self._before = now
            self._config.update(OPTION, "none")
        elif not refused and self._before is not None and now == "none":
            self._config.update(OPTION, self._before)
            self._before = None

    def refuse(self, path: str) -> None:
        """JAX's directory ``path`` was refused where JAX routed it: XLA's caches go with it."""
        self._refused.add(os.path.realpath(path))
        if hasattr(self._config, OPTION) and getattr(self._config, OPTION) not in (None, "none"):
            self._before = self._before or getattr(self._config, OPTION)
            self._config.update(OPTION, "none")

    def allowed(self, directory: str) -> bool:
        """Whether XLA may keep its caches in ``directory`` now: judged as JAX's directory is, the
        first time (``_cache.prepare``: the ancestors, a planted link, a bucket mount; one not there
        yet is made then, as route makes it, before XLA or another user can: issue 67's attack on M2
        made it while JAX computed the first key), then by one stat a compile (a directory given to
        another user since); a refused one stays refused."""
        if self._settings["read_untrusted_dir"]:
            return True
        real = os.path.realpath(directory)
        if real in self._refused:
            return False
        if real not in self._judged:
            try:  # made now, as this user's, where it is not there yet: no one else can make it first
                _cache.prepare(directory, None)
            except _cache.DirectoryRefused:
                self.refuse(real)
                return False
            except OSError:  # (JAX's own set-up meets it, and says so)
                return False
            self._judged.add(real)
        from gkx_autocache import _trust

        if _trust.directory_problem(real) is not None:
            self.refuse(real)
            return False
        return True


OPTION = "jax_persistent_cache_enable_xla_caches"


def xla_caches_for(settings: _settings.Settings, directory: str) -> str | None:
    """The value for ``jax_persistent_cache_enable_xla_caches``, or None to leave JAX's default.

    XLA's C++ autotune cache cannot open gs:// or s3://, nor write on a bucket mount, and without
    a GPU there is nothing for it to cache, while its path would still enter the cache key.
    """
    if is_url(directory) or _mount.bucket_mount(directory) is not None:  # (XLA writes a file, then renames it)
        return "none"
    value: str | None = settings["xla_caches"]
    if value is not None:
        return value
    return None if gpu_plugin_installed() else "none"


def gpu_plugin_installed() -> bool:
    """Whether a JAX GPU plugin (CUDA or ROCm) is installed, without importing it.

    JAX discovers its PJRT plugins in the ``jax_plugins`` namespace package (``xla_cuda12``,
    ``xla_rocm7``...). One spec lookup and a listing of its folders: a scan of every module on
    ``sys.path`` (pkgutil) costs tens of milliseconds on ``import jax``.
    """
    import importlib.util

    try:
        spec = importlib.util.find_spec("jax_plugins")
    except (ImportError, ValueError):
        return False
    for folder in (spec.submodule_search_locations or []) if spec else []:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        if any("cuda" in name or "rocm" in name for name in names):
            return True
    return False
