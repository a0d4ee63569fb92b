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


class XlaCaches:
    """JAX puts XLA's own GPU caches (its autotune results, the kernel cache file: code) under the
    cache directory whenever one is set, whether or not it set up a cache object there: for a
    directory the trust rules refuse they are turned off (``none``), and back on as they were once a
    directory that may be trusted is set. Judged when the directory is set (JAX builds a compile's
    options, and these paths with them, before it sets up its cache object)."""

    def __init__(self, settings: _settings.Settings, config: Any) -> None:
        self._settings, self._config = settings, config
        self._before: str | None = None  # what was turned off, to turn it back on

    def judge(self, path: str) -> None:
        option = "jax_persistent_cache_enable_xla_caches"
        if is_url(path) or not hasattr(self._config, option) or self._settings["read_untrusted_dir"]:
            return
        try:
            _cache.prepare(path, None, create=False)
            refused = False
        except _cache.DirectoryRefused:
            refused = True
        except Exception:
            return
        now = getattr(self._config, option)
        if refused and now != "none":
            self._before = now
            self._config.update(option, "none")
        elif not refused and self._before is not None and now == "none":
            self._config.update(option, self._before)
            self._before = None


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
