"""On the first ``import jax``: settings -> directory -> ``jax.config``. Never raises."""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

from gkx_autocache import _cache, _formats, _jax_config, _route, _settings
from gkx_autocache._diagnostics import NOTED, logger, note_import_site, warn

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
            note_import_site()  # where a warning at exit points: no line of the user's runs then
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
    xla_caches = _jax_config.XlaCaches(settings, config)  # never pointed at a directory the trust rules refuse
    if location.version_dir is None or location.refused:
        if settings["report"] and location.problems:  # the run's line says it was uncached, and why
            said = location.problems[0][1].removesuffix("; running uncached")
            atexit.register(print, f"gkx-autocache: this run was uncached: {said}", file=sys.stderr, flush=True)
        if location.version_dir is not None:  # the user's own, refused: thresholds as usual, no entry read
            _jax_config.set_thresholds(config, settings, location.version_dir)
            xla_caches.judge(location.version_dir)
        _route.watch_dir(config, xla_caches)
        _route.route_only(jax, settings, env)
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
    _jax_config.set_thresholds(config, settings, directory)
    _route.watch_dir(config, xla_caches)  # who sets the directory from now on, and XLA's caches kept out of a refused one

    from gkx_autocache import _store
    from gkx_autocache._record import recorder as _stats

    keeping = location.keeps_books  # a baked read-only cache is read and nothing else
    levels = None
    if settings["shared"] is not None:  # a second level behind this one (SPEC §14): objects only, no I/O here
        from gkx_autocache import _autotune
        from gkx_autocache._shared import setup as _levels

        tunes = _autotune.enabled(getattr(config, "jax_persistent_cache_enable_xla_caches", None))
        max_size = settings["max_size"]
        room = functools.partial(_stats.prefetch_room, directory, max_size) if max_size else None
        levels, problems = _levels.level_for(settings, location, jax.__version__, env, tunes, room)
        for cause, message in problems:
            warn(cause, message)
    set_by = None  # who gave JAX its own directory (``_adopted``)
    if location.local and location.users_own:
        from gkx_autocache import _adopted

        set_by = _adopted.who(directory, env.get("JAX_COMPILATION_CACHE_DIR"))
    recorder = _stats.start(settings, directory, ledger=keeping, remote=location.remote,
                            team=location.team, levels=levels, set_by=set_by,
                            serving=_store.installed, explainer=watch)
    if location.local:
        # The cap: in the package's own directory; in the user's own JAX directory only where they set max_size.
        cap = settings["max_size"] if location.packages or settings.origin("max_size") != "default" else 0
        routing = functools.partial(_route.route, settings, location, recorder, env)
        reason = _store.install(jax, directory, location.team, recorder, levels, routing,
                                functools.partial(_route.recheck, location.version_dir if location.team else None))
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
            verdict.write(directory, "jax" if reason else "gkx-autocache", reason, location.team, explain=unexplained,
                          unkeyed=unkeyed, callbacks=callbacks)
        # At exit: close the ledger, fold finished ledgers, keep the cap (SPEC §7); also where this
        # directory is read-only, as JAX may be given another one since (``route``).
        atexit.register(_stats.finish, recorder, cap if not reason else 0)
    if not location.local and os.name != "nt":  # a bucket as dir: JAX's stock cache; a local one given later is judged
        _route.route_only(jax, settings, env)
    if settings["cpu_target"] != "host":  # before XLA's backend starts: it reads XLA_FLAGS then
        _cpu_target.take(jax, settings["cpu_target"], serves, directory if location.local else None)
    from gkx_autocache import _unread

    _unread.install(env, recorder.not_read)
