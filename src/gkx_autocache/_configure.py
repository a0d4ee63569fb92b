"""On the first ``import jax``: settings -> directory -> ``jax.config``. Never raises."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

from gkx_autocache import _cache, _settings
from gkx_autocache._diagnostics import logger, warn

# JAX's own defaults for the options the package sets (the same in JAX 0.10 and 0.12). A value
# in jax.config that differs from these was set by the user, and is left as they set it.
JAX_DEFAULTS: dict[str, Any] = {
    "jax_compilation_cache_dir": None,
    "jax_persistent_cache_min_compile_time_secs": 1.0,
    "jax_persistent_cache_min_entry_size_bytes": 0,
    "jax_persistent_cache_enable_xla_caches": "xla_gpu_per_fusion_autotune_cache_dir",
}

_lock = threading.Lock()
_configured = False


def configure(jax: Any, env: Mapping[str, str] = os.environ) -> None:
    """Configure JAX's persistent cache, once per process. Any failure is one warning."""
    global _configured
    with _lock:
        if _configured:
            return
        _configured = True
        try:
            _configure(jax, env)
        except Exception as exc:
            warn("configure", f"cache not configured, {type(exc).__name__}: {exc}; please report this")


def jax_explicit(jax_config: Any, env: Mapping[str, str] = os.environ) -> dict[str, tuple[Any, str]]:
    """The keys whose JAX option the user set themselves: ``key -> (value, origin)``."""
    explicit = {}
    for key in _settings.KEYS.values():
        option = key.jax_option
        if option is None:
            continue
        value = getattr(jax_config, option)
        variable = option.upper()
        if env.get(variable, "").strip():
            explicit[key.name] = (value, f"JAX ({variable})")
        elif value != JAX_DEFAULTS[option]:
            explicit[key.name] = (value, f"JAX (jax.config {option})")
    return explicit


def _configure(jax: Any, env: Mapping[str, str]) -> None:
    config = jax.config
    if not config.jax_enable_compilation_cache:
        logger.debug("JAX's compilation cache is turned off by the user: nothing to do")
        return
    settings = _settings.resolve(env, jax_explicit=jax_explicit(config, env))
    for cause, message in settings.problems:
        warn(cause, message)
    for key, resolved in settings.values.items():
        logger.debug("setting %s = %r (%s)", key, resolved.value, resolved.origin)
    if not settings["enabled"]:
        logger.debug("disabled by %s", settings.origin("enabled"))
        return

    updates: dict[str, Any] = {"jax_enable_compilation_cache": True}
    if settings.from_jax("dir"):
        directory = settings["dir"]  # the user's own: JAX's stock cache, thresholds only
    else:
        directory = choose_directory(settings, jax.__version__)
        if directory is None:
            return
        updates["jax_compilation_cache_dir"] = directory
    for key in ("min_compile_time_secs", "min_entry_size_bytes"):
        if not settings.from_jax(key):
            updates[_settings.KEYS[key].jax_option] = settings[key]  # type: ignore[index]
    if not settings.from_jax("xla_caches"):
        xla_caches = xla_caches_for(settings, str(directory))
        if xla_caches is not None:
            updates["jax_persistent_cache_enable_xla_caches"] = xla_caches
    for option, value in updates.items():
        config.update(option, value)
        logger.debug("jax.config.update(%r, %r)", option, value)

    from gkx_autocache import _stats, _store

    ours = not settings.from_jax("dir") and not _settings.is_url(directory)
    recorder = _stats.start(settings, directory, ledger=ours)
    if ours:
        reason = _store.install(jax, directory, bool(settings["trust_shared"]), recorder)
        if reason:
            logger.debug("JAX's stock cache serves %s: %s", directory, reason)
        _store.write_verdict(directory, "jax" if reason else "gkx-autocache", reason)


def choose_directory(settings: _settings.Settings, jax_version: str, prefix: str = sys.prefix) -> str | None:
    """The version directory to hand to JAX, or None (uncached, after one warning).

    An explicit ``dir`` is used or refused, never replaced. The default is the environment's
    own ``<prefix>/.cache/gkx/jax``, else the user cache; failing over between them is normal
    (a shared conda environment, someone else's venv) and is logged only.
    """
    shared = bool(settings["trust_shared"])
    explicit = settings["dir"]
    if explicit is not None:
        origin = settings.origin("dir")
        if _settings.is_url(explicit):
            return f"{explicit.rstrip('/')}/{_cache.version_name(jax_version)}"
        try:
            prepared = _cache.prepare(explicit, jax_version, shared)
        except _cache.Refused as exc:
            warn(f"dir:{explicit}", f"{origin}: dir {explicit} not used, {exc}; running uncached")
            return None
        if not prepared.writable:
            logger.debug("%s is read-only: entries are read, none are written", prepared.version_dir)
        return prepared.version_dir

    reasons = []
    roots = [_cache.venv_root(prefix)] if _cache.in_virtualenv(prefix) else []
    for root in (*roots, _cache.user_root()):
        try:
            prepared = _cache.prepare(root, jax_version, shared)
        except _cache.Refused as exc:
            reasons.append(f"{root}: {exc}")
            logger.debug("default directory %s refused: %s", root, exc)
            continue
        if prepared.writable:
            return prepared.version_dir
        reasons.append(f"{prepared.version_dir}: not writable")
        logger.debug("default directory %s is not writable", prepared.version_dir)
    warn("dir:default", f"no usable cache directory ({'; '.join(reasons)}); set GKX_JAX_CACHE_DIR; running uncached")
    return None


def xla_caches_for(settings: _settings.Settings, directory: str) -> str | None:
    """The value for ``jax_persistent_cache_enable_xla_caches``, or None to leave JAX's default.

    XLA's C++ autotune cache cannot open gs:// or s3://, and without a GPU there is nothing for
    it to cache, while its path would still enter the cache key.
    """
    if _settings.is_url(directory):
        return "none"
    value: str | None = settings["xla_caches"]
    if value is not None:
        return value
    return None if gpu_plugin_installed() else "none"


def gpu_plugin_installed() -> bool:
    """Whether a JAX GPU plugin (CUDA or ROCm) is importable, without importing it."""
    import pkgutil

    for module in pkgutil.iter_modules():
        name = module.name
        if name.startswith(("jax_cuda", "jax_rocm")) and name.endswith("_plugin"):
            return True
    jax_plugins = sys.modules.get("jax_plugins")
    if jax_plugins is not None:
        for module in pkgutil.iter_modules(getattr(jax_plugins, "__path__", [])):
            if "cuda" in module.name or "rocm" in module.name:
                return True
    return False
