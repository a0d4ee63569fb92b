"""On the first ``import jax``: settings -> directory -> ``jax.config``. Never raises."""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

from gkx_autocache import _cache, _formats, _mount, _settings
from gkx_autocache._diagnostics import NOTED, logger, warn
from gkx_autocache._layout import is_url

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


def _configure(jax: Any, env: Mapping[str, str]) -> None:
    from gkx_autocache import _cpu_target, _fork, _jax

    if _cpu_target.ADDED in os.environ:  # a parent's cpu_target cap, inherited: this process decides its own
        _cpu_target.strip_inherited()

    old = _jax.unsupported(str(getattr(jax, "__version__", "")))
    if old is not None:
        warn("jax:unsupported", old)
        return
    config = jax.config
    if not config.jax_enable_compilation_cache:
        logger.debug("JAX's compilation cache is turned off by the user: nothing to do")
        return
    settings = _settings.resolve(env, jax_explicit=_settings.jax_explicit(env, config))
    for cause, message in settings.problems:
        warn(cause, message)
    for key, resolved in settings.values.items():
        logger.debug("setting %s = %r (%s)", key, resolved.value, resolved.origin)
    if not settings["enabled"]:
        logger.debug("disabled by %s", settings.origin("enabled"))
        return
    from gkx_autocache import _key
    from gkx_autocache._explain import seam as _explain_seam

    # Every CPU key of the process gets the host's ISA (or the cpu_target), whichever directory JAX uses (SPEC §15).
    # Its parts go to the watch, which explains misses once started (where the store serves, below).
    watch = _explain_seam.Watch()
    verdict = _formats.Verdict(_key.replaced_note)
    unkeyed = _key.install(jax, listener=watch, on_replaced=verdict.rewrite)
    if unkeyed:
        logger.debug("CPU entries are not keyed by ISA: %s", unkeyed)

    location = _cache.locate(settings, jax.__version__)
    for cause, message in location.problems:
        warn(cause, message)
    if location.remote and _settings.signing_key(env) is not None:
        warn("signing:remote", _settings.remote_signing_note(str(settings["dir"])))
    xla_caches = XlaCaches(settings, config)  # never pointed at a directory the trust rules refuse
    if location.version_dir is None or location.refused:
        if settings["report"] and location.problems:  # the run's line says it was uncached, and why
            said = location.problems[0][1].removesuffix("; running uncached")
            atexit.register(print, f"gkx-autocache: this run was uncached: {said}", file=sys.stderr, flush=True)
        if location.version_dir is not None:  # the user's own, refused: thresholds as usual, no entry read
            _set_thresholds(config, settings, location.version_dir)
            xla_caches.judge(location.version_dir)
        watch_dir(config, xla_caches)
        route_only(jax, settings, env)
        return
    directory = location.version_dir
    _fork.in_child(_jax.keep_backends)  # a warm run's forked child would hang at its exit (JAX's own cache too)
    serves: Any = None  # where the store serves: whether it serves the directory JAX uses now (cpu_target)
    if location.stock:  # Windows: said at every import jax, as status says it (issue 46)
        warn("dir:stock", _cache.STOCK_NOTE.format(dir=directory), silence=NOTED)
        unguarded = _jax.guard_stock(jax, directory)
        if unguarded:
            logger.debug("JAX's own errors reading and writing %s stay JAX's: %s", directory, unguarded)
    if not location.users_own:  # the user's own directory is left as they set it
        config.update("jax_compilation_cache_dir", directory)
        logger.debug("jax.config.update('jax_compilation_cache_dir', %r)", directory)
    _set_thresholds(config, settings, directory)
    watch_dir(config, xla_caches)  # who sets the directory from now on, and XLA's caches kept out of a refused one

    from gkx_autocache import _jax, _store
    from gkx_autocache._record import recorder as _stats

    keeping = location.keeps_books  # a baked read-only cache is read and nothing else
    levels = None
    if settings["shared"] is not None:  # a second level behind this one (SPEC §14): objects only, no I/O here
        from gkx_autocache import _autotune
        from gkx_autocache._shared import setup as _levels

        tunes = _autotune.enabled(getattr(config, "jax_persistent_cache_enable_xla_caches", None))
        max_size = settings["max_size"]
        room = functools.partial(prefetch_room, directory, max_size) if max_size else None
        levels, problems = _levels.level_for(settings, location, jax.__version__, env, tunes, room)
        for cause, message in problems:
            warn(cause, message)
    set_by = None  # who gave JAX its own directory (``_adopted``)
    if location.local and location.users_own:
        from gkx_autocache import _adopted

        set_by = _adopted.who(directory, env.get("JAX_COMPILATION_CACHE_DIR"))
    recorder = _stats.start(settings, directory, ledger=keeping, remote=location.remote,
                            shared=location.team, levels=levels, set_by=set_by,
                            serving=_store.installed, explainer=watch)
    if location.local:
        shared = location.team
        # The cap: in the package's own directory; in the user's own JAX directory only where they set max_size.
        cap = settings["max_size"] if location.packages or settings.origin("max_size") != "default" else 0
        routing = functools.partial(route, settings, location, recorder, env)
        reason = _store.install(jax, directory, shared, recorder, levels, routing,
                                functools.partial(recheck, location.version_dir if location.team else None))
        if reason is None:
            serves = functools.partial(_store.serving_now, config)
        callbacks = reason or _jax.serve_host_callbacks(  # before the other write seams: the one nearest JAX
            jax, lambda: _store.serving(str(config.jax_compilation_cache_dir)))
        if callbacks and not reason:
            logger.debug("compiles with host callbacks are not cached: %s", callbacks)
        if reason:
            logger.debug("JAX's stock cache serves %s: %s", directory, reason)
        elif levels is not None:
            _levels.at_exit(levels, recorder)
            unwritten = _jax.rank_local_writes(jax, directory) if location.writable else None
            if unwritten:
                logger.debug("ranks other than 0 do not write their local level: %s", unwritten)
        thresholds = {k: (getattr(config, str(_settings.KEYS[k].jax_option), None), settings.origin(k))
                      for k in ("min_compile_time_secs", "min_entry_size_bytes")}
        unexplained = reason or _explain_seam.install(jax, watch, recorder, directory, origins=thresholds)
        if unexplained:
            logger.debug("misses are not explained: %s", unexplained)
        if keeping:
            verdict.write(directory, "jax" if reason else "gkx-autocache", reason, shared, explain=unexplained,
                          unkeyed=unkeyed, callbacks=callbacks)
        # At exit: close the ledger, fold finished ledgers, keep the cap (SPEC §7); also where this
        # directory is read-only, as JAX may be given another one since (``route``).
        atexit.register(_stats.finish, recorder, cap if not reason else 0)
    if not location.local and os.name != "nt":  # a bucket as dir: JAX's stock cache; a local one given later is judged
        route_only(jax, settings, env)
    if settings["cpu_target"] != "host":  # before XLA's backend starts: it reads XLA_FLAGS then
        _cpu_target.take(jax, settings["cpu_target"], serves, directory if location.local else None)
    from gkx_autocache import _unread

    _unread.install(env, recorder.not_read)


def _set_thresholds(config: Any, settings: _settings.Settings, directory: str) -> None:
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


def prefetch_room(version_dir: str, cap: int, unfolded: bool) -> int:
    """``fold.prefetch_room``, its module loaded at a prefetch's start, not on ``import jax``."""
    from gkx_autocache._record import fold

    return fold.prefetch_room(version_dir, cap, unfolded)


def route(settings: _settings.Settings, location: _cache.Location | None, recorder: Any, env: Mapping[str, str],
          path: str) -> tuple[str, str] | None:
    """What serves the directory JAX sets up its cache in (``_jax.serve_file_caches``), at its first
    compile since the directory was set (SPEC §5, §8, amended 2026-12-04 and 2026-12-06):

    - the package's own version directory: the store;
    - one someone else gave JAX after ``import jax`` (a framework) or in JAX_COMPILATION_CACHE_DIR,
      that may be trusted (``_cache.prepare``, the directory as it is): the store where it serves,
      the recorder moving there (the cap applies only where ``max_size`` was set); else JAX's own
      object, in the real path judged, checked again at each lookup;
    - one the trust rules refuse: nothing at all (None): JAX reads no entry of it and writes none,
      said once with a fix the user can make; unless ``read_untrusted_dir`` asks that JAX's own
      cache read it unchecked."""
    from gkx_autocache import _adopted, _store

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
        if recorder is not None:  # the run's line: nothing was looked up there
            recorder.refuse(path, f"{path} (set by {by}) is refused ({exc.cause}): JAX read no entry there")
        return None
    except Exception as exc:  # never in the way of JAX's own set-up: no cache there
        logger.debug("%s (set by %s) not judged, so not used: %s", path, by, exc)
        return None
    real = prepared.version_dir
    if location is None or own is None or not _store.installed():
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


def route_only(jax: Any, settings: _settings.Settings, env: Mapping[str, str]) -> None:
    """Where the store serves no directory of the package's (it has none it may use, or it is a
    bucket): JAX's stock cache serves any directory JAX is given, judged as ``route`` judges it, and
    one the trust rules refuse gets no cache. Where that seam has changed, a refused directory JAX
    has now turns its cache off for this process: the one way left to read none of it."""
    from gkx_autocache import _jax

    _, why = _jax.serve_file_caches(jax, functools.partial(route, settings, None, None, env), None,
                                    lambda key, error: False, functools.partial(recheck, None))
    if why is not None and not settings["read_untrusted_dir"]:
        logger.debug("a directory the trust rules refuse cannot be kept from JAX: %s", why)
        given = getattr(jax.config, "jax_compilation_cache_dir", None)
        if given and not is_url(str(given)) and route(settings, None, None, env, str(given)) is None:
            jax.config.update("jax_enable_compilation_cache", False)


def watch_dir(config: Any, xla_caches: XlaCaches) -> None:
    """From now on, who sets ``jax_compilation_cache_dir`` (``_adopted``), and XLA's caches judged
    with it; not on Windows, where the trust rules do not run (``_cache.windows``)."""
    if os.name != "nt":
        from gkx_autocache import _adopted

        _adopted.watch(config, on_set=xla_caches.judge)


def recheck(team: str | None, real: str) -> str | None:
    """Why JAX's own cache object must read and write nothing in ``real`` now (the directory rules,
    one stat), or None; ``team``: the package's own version directory where it is a team directory."""
    from gkx_autocache import _trust

    return _trust.directory_problem(real, team is not None and os.path.realpath(team) == real)


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

