"""What serves each directory JAX sets up its cache in (SPEC §5, §8): the store, JAX's own cache
object checked at each lookup, or nothing, for a directory the trust rules refuse. Given to the
seam on JAX's ``get_file_cache`` (``_jax.caching.serve_file_caches``) by ``_configure``."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gkx_autocache import _cache, _formats, _settings
from gkx_autocache._diagnostics import logger, warn
from gkx_autocache._jax_config import XlaCaches
from gkx_autocache._layout import is_url


@dataclass(frozen=True)
class Routing:
    """What ``route`` is given besides the path: the settings, the package's own directory
    (``location``; None where it has none), the recorder, the environment, XLA's caches,
    ``installed()``: whether the store serves the package's own directory, and JAX's ``config``."""

    settings: _settings.Settings
    location: _cache.Location | None
    recorder: Any
    env: Mapping[str, str]
    xla_caches: XlaCaches | None
    installed: Callable[[], bool]
    config: Any

    def __call__(self, path: str) -> tuple[str, str] | None:
        return route(self, path)


def route(routing: Routing, path: str) -> tuple[str, str] | None:
    """What serves the directory JAX sets up its cache in (``_jax.caching.serve_file_caches``), at its first
    compile since the directory was set (SPEC §5, §8, amended 2026-12-04 and 2026-12-06):

    - the package's own version directory: the store;
    - one someone else gave JAX after ``import jax`` (a framework) or in JAX_COMPILATION_CACHE_DIR,
      that may be trusted (``_cache.prepare``, the directory as it is): the store where it serves,
      the recorder moving there (the cap applies only where ``max_size`` was set); else JAX's own
      object, in the real path judged, checked again at each lookup;
    - one the trust rules refuse: nothing at all (None): JAX reads no entry of it and writes none,
      said once with a fix the user can make, and XLA's own caches there are off (``xla_caches``);
      unless ``read_untrusted_dir`` asks that JAX's own cache read it unchecked;
    - none where JAX's own cap, set since ``import jax``, keeps nothing (0): said once."""
    settings, location, recorder, env = routing.settings, routing.location, routing.recorder, routing.env
    xla_caches, installed, config = routing.xla_caches, routing.installed, routing.config
    from gkx_autocache import _adopted
    from gkx_autocache._jax_config import NOTHING_CACHED, jax_cap

    if jax_cap(config) == 0:  # (set after import jax: at import, the package turned JAX's cache off)
        warn("jax:cap", NOTHING_CACHED.format(size=getattr(config, "jax_compilation_cache_max_size", 0)))
        return None
    own = location.version_dir if location is not None and location.local else None
    if location is not None and own is not None and os.path.realpath(path) == os.path.realpath(own):
        recorder.move(own, location.writable, None, None)
        return os.path.realpath(own), "store" if location.writable else "store-read-only"
    by = _adopted.who(path, env.get("JAX_COMPILATION_CACHE_DIR"))
    try:
        prepared = _cache.prepare(path, None)
    except _cache.DirectoryRefused as exc:
        unread = not settings["read_untrusted_dir"]
        note = _cache.refused_note(f"{path} (set by {by})", exc, unread)
        warn(f"dir:{path}", note)
        if not unread:
            return path, "unchecked"
        if xla_caches is not None:
            xla_caches.refuse(path)
        if recorder is not None:  # the run's line: nothing was looked up there
            recorder.refuse(path, f"{path} (set by {by}) is refused ({exc.cause}): JAX read no entry there")
        return None
    except Exception as exc:  # never in the way of JAX's own set-up: no cache there
        logger.debug("%s (set by %s) not judged, so not used: %s", path, by, exc)
        return None
    real = prepared.version_dir
    if location is None or own is None or not installed():
        logger.debug("JAX's directory is %s, set by %s: JAX's own cache serves it, checked at each lookup", real, by)
        return real, "jax"
    cap = settings["max_size"] if settings.origin("max_size") != "default" else 0
    recorder.move(real, prepared.writable, by, cap, given=path)
    if location.writable:
        _adopted.point(own, real, by)
    if prepared.writable:
        _formats.write_verdict(real, "gkx-autocache", None)
    logger.debug("JAX's directory is %s, set by %s: the store serves it", real, by)
    return real, "store" if prepared.writable else "store-read-only"


def route_only(jax: Any, settings: _settings.Settings, env: Mapping[str, str], xla_caches: XlaCaches | None) -> None:
    """Where the store serves no directory of the package's (it has none it may use, or it is a
    bucket): JAX's stock cache serves any directory JAX is given, judged as ``route`` judges it, and
    one the trust rules refuse gets no cache. Where that seam has changed, a refused directory JAX
    has now turns its cache off for this process: the one way left to read none of it."""
    from gkx_autocache._jax import caching as jax_caching

    unserved = Routing(settings, None, None, env, xla_caches, lambda: False, jax.config)
    _, why = jax_caching.serve_file_caches(jax, unserved, None, lambda key, error: False, functools.partial(recheck, None))
    if why is not None and not settings["read_untrusted_dir"]:
        logger.debug("a directory the trust rules refuse cannot be kept from JAX: %s", why)
        given = getattr(jax.config, "jax_compilation_cache_dir", None)
        if given and not is_url(str(given)) and unserved(str(given)) is None:
            jax.config.update("jax_enable_compilation_cache", False)


def watch_dir(config: Any, xla_caches: XlaCaches) -> None:
    """From now on, who sets ``jax_compilation_cache_dir`` (``_adopted``), and XLA's caches judged
    with it, and at each compile where its options put them (``_jax.caching.guard_xla_caches``); not on
    Windows, where the trust rules do not run (``_cache.windows``)."""
    if os.name != "nt":
        from gkx_autocache import _adopted
        from gkx_autocache._jax import caching as jax_caching

        _adopted.watch(config, on_set=xla_caches.judge)
        unguarded = jax_caching.guard_xla_caches(xla_caches.allowed)
        if unguarded is not None:
            logger.debug("XLA's caches are judged only when the directory is set: %s", unguarded)


def recheck(team: str | None, real: str) -> str | None:
    """Why JAX's own cache object must read and write nothing in ``real`` now (the directory rules,
    one stat), or None; ``team``: the package's own version directory where it is a team directory."""
    from gkx_autocache import _trust

    return _trust.directory_problem(real, team is not None and os.path.realpath(team) == real)
