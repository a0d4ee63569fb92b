"""On the first ``import jax``: settings -> directory -> ``jax.config`` -> the process's cache (its
recorder, its levels, the store) -> JAX's seams, in the order ``SEAMS`` declares. Never raises."""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
from collections.abc import Mapping
from typing import Any

from gkx_autocache import _cache, _formats, _jax_config, _process, _route, _settings
from gkx_autocache._chain import Chain, NoLevel
from gkx_autocache._diagnostics import NOTED, logger, note_import_site, warn

# JAX's functions the package wraps, by whom, and why, in the order the wrappers are put on: on one
# function, a wrapper listed later is outside one listed earlier, and runs first. Each wrapper's
# ``__wrapped__`` is the one before it (``_jax.versions.patch``): tests/test_jax_seams.py reads the
# chains of a configured JAX back against this table.
SEAMS = (
    ("cache_key.custom_hook", "_key.install", "the host's ISA (or the cpu_target) in every key"),
    ("cache_key._log_cache_key_hash", "_jax.hooks.watch_key_parts", "each key's parts, to the explain watch"),
    ("compiler.compile_or_get_cached", "_jax.caching.guard_xla_caches", "XLA's caches kept out of a refused directory"),
    ("compilation_cache.get_file_cache", "_jax.caching.serve_file_caches", "the store, JAX's own object, or none"),
    ("compilation_cache.get_executable_and_time", "_jax.caching._guard_loading", "an entry JAX cannot load is a miss"),
    ("compiler.compile_or_get_cached", "_jax.callbacks.serve_host_callbacks", "the compile's host callbacks"),
    ("compiler.compile_or_get_cached", "_jax.recipes.watch_compiles", "each compile's module and options, for its record"),
    ("compiler.compile_or_get_cached", "_jax.caching.bracket_compiles", "a key's lease let go where JAX wrote nothing"),
    ("compilation_cache.get_executable_and_time", "_jax.callbacks.serve_host_callbacks", "loaded with this process's"),
    ("compiler._cache_write", "_jax.callbacks.serve_host_callbacks", "an entry written without its callbacks"),
    ("compiler._cache_write", "_jax.caching.rank_local_writes", "every rank writes its own local level"),
    ("compiler._cache_write", "_explain.seam.install", "what each written key was made of"),
    ("compilation_cache.get_executable_and_time", "_jax.caching.skip_lookups", "lookups that read no entry (_unread)"),
)

_once = threading.Event()  # configured (or given up on) in this process
_lock = threading.Lock()


def configure(jax: Any, env: Mapping[str, str] = os.environ) -> None:
    """Configure JAX's persistent cache, once per process. Any failure is one warning."""
    with _lock:
        if _once.is_set():
            return
        _once.set()
        try:
            note_import_site()  # where a warning at exit points: no line of the user's runs then
            _configure(jax, env)
        except Exception as exc:
            warn("configure", f"cache not configured, {type(exc).__name__}: {exc}; please report this")


def _configure(jax: Any, env: Mapping[str, str]) -> None:
    from gkx_autocache import _cpu_target, _fork, _key, _store
    from gkx_autocache._explain import seam as _explain_seam
    from gkx_autocache._jax import caching as jax_caching
    from gkx_autocache._jax import callbacks as jax_callbacks
    from gkx_autocache._jax import recipes as jax_recipes
    from gkx_autocache._jax import runtime as jax_runtime
    from gkx_autocache._jax import versions as jax_versions

    if _cpu_target.ADDED in os.environ:  # a parent's cpu_target cap, inherited: this process decides its own
        _cpu_target.strip_inherited()

    old = jax_versions.unsupported(str(getattr(jax, "__version__", "")))
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

    # Every CPU key of the process gets the host's ISA (or the cpu_target, where the store serves the
    # directory JAX uses then), whichever directory JAX uses (SPEC §15). Its parts go to the watch,
    # which explains misses once started (where the store serves, below).
    location = _cache.locate(settings, jax.__version__)
    installed = threading.Event()  # the store serves the package's own directory (set once it does)
    watch = _explain_seam.Watch()
    verdict = _formats.Verdict()
    own = os.path.realpath(location.version_dir) if location.version_dir and location.local and not location.refused else None
    target = _cpu_target.decide(settings["cpu_target"], functools.partial(_store.serving_now, config, own, installed.is_set))
    keys, unkeyed = _key.install(jax, listener=watch, on_replaced=verdict.rewrite, target=target)
    if unkeyed:
        logger.debug("CPU entries are not keyed by ISA: %s", unkeyed)

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
        _route.route_only(jax, settings, env, xla_caches)
        return
    directory = location.version_dir
    # The user's own jax_compilation_cache_max_size: JAX's LRU keeps it, where it can (it needs filelock);
    # where it cannot, the store serves and keeps it as the cap; at 0 nothing is cached, as JAX means.
    jax_cap = _jax_config.jax_cap(config)
    if jax_cap == 0:
        note = _jax_config.NOTHING_CACHED.format(size=config.jax_compilation_cache_max_size)
        warn("jax:cap", note)
        config.update("jax_enable_compilation_cache", False)  # (JAX's own cache would warn at every compile)
        if settings["report"]:
            atexit.register(print, f"gkx-autocache: this run was uncached: {note.split('; fix:')[0]}", file=sys.stderr,
                            flush=True)
        if location.keeps_books:
            _formats.write_verdict(directory, "none", note, location.team)
        return
    lru = jax_caching.jax_lru_usable()
    _fork.in_child(jax_runtime.keep_backends)  # a warm run's forked child would hang at its exit (JAX's own cache too)
    if location.stock:  # Windows: said at every import jax, as status says it (issue 46)
        warn("dir:stock", _cache.STOCK_NOTE.format(dir=directory), silence=NOTED)
        unguarded = jax_caching.guard_stock(jax, directory)
        if unguarded:
            logger.debug("JAX's own errors reading and writing %s stay JAX's: %s", directory, unguarded)
    if not location.users_own:  # the user's own directory is left as they set it
        config.update("jax_compilation_cache_dir", directory)
        logger.debug("jax.config.update('jax_compilation_cache_dir', %r)", directory)
    _jax_config.set_thresholds(config, settings, directory)
    _route.watch_dir(config, xla_caches)  # who sets the directory from now on, and XLA's caches kept out of a refused one

    from gkx_autocache._record import recorder as recording

    keeping = location.keeps_books  # a baked read-only cache is read and nothing else
    set_by = None  # who gave JAX its own directory (``_adopted``)
    if location.local and location.users_own:
        from gkx_autocache import _adopted

        set_by = _adopted.who(directory, env.get("JAX_COMPILATION_CACHE_DIR"))
    recorder = recording.start(settings, directory, ledger=keeping, remote=location.remote, team=location.team,
                               set_by=set_by, serving=installed.is_set, explainer=watch)
    # The levels of the package's own directory, where it is a local one (SPEC §14): the local level
    # first, then the shared one behind it, given the local one; objects only, no I/O here.
    local = _local_level(jax, settings, location, env, recorder, target, keys.targeted) if location.local else None
    levels = None
    if settings["shared"] is not None and local is not None:
        from gkx_autocache import _autotune
        from gkx_autocache._shared import setup as shared_setup

        tunes = _autotune.enabled(getattr(config, "jax_persistent_cache_enable_xla_caches", None))
        max_size = settings["max_size"]
        room = functools.partial(recording.prefetch_room, directory, max_size) if max_size else None
        levels, problems = shared_setup.level_for(settings, location, jax.__version__, env, local, tunes, room)
        for cause, message in problems:
            warn(cause, message)
    elif settings["shared"] is not None:
        from gkx_autocache._shared import setup as shared_setup

        if (why := shared_setup.problem(settings, location)) is not None:
            warn(f"shared:{settings['shared']}", f"{settings.origin('shared')}: shared {settings['shared']} not used, "
                                                 f"{why}; running with the local level only")
    chain = Chain(local, levels if levels is not None else NoLevel()) if local is not None else None
    _process.begin(_process.Process(recorder, chain if levels is not None else None))
    if settings["report"]:
        _process.report_at_exit()
    # The cap: in the package's own directory; in the user's own JAX directory only where they set max_size.
    cap = settings["max_size"] if location.packages or settings.origin("max_size") != "default" else 0
    keeper, ahead = _rebuilds(jax, settings, location, env, local, target, cap)
    reason: str | None = "the directory is not a local one"
    if location.local:
        kept = None
        if jax_cap is not None and not lru:  # (JAX's own LRU cannot keep it: the store does)
            kept = (f"it keeps jax_compilation_cache_max_size ({jax_cap} bytes) as its cap: JAX's own LRU cache needs "
                    "filelock, which is not installed")
        routing = _route.Routing(settings, location, recorder, env, xla_caches, installed.is_set, config)
        from gkx_autocache._local.lease import Leases

        leases = Leases(settings["shared_timeout"])  # once per key across processes (objects only: no I/O)
        reason = _store.install(jax, directory, chain, recorder, routing,
                                functools.partial(_route.recheck, location.version_dir if location.team else None),
                                target, keys.targeted, leases, keeper, ahead)
        if reason is None:
            installed.set()
        callbacks = reason or jax_callbacks.serve_host_callbacks(  # before the other write seams: the one nearest JAX
            jax, lambda: _store.serving(str(config.jax_compilation_cache_dir)))
        if callbacks and not reason:
            logger.debug("compiles with host callbacks are not cached: %s", callbacks)
        unrecorded: str | None
        if reason or keeper is None:
            unrecorded = reason or "this user cannot write the directory"
        else:
            unrecorded = jax_recipes.watch_compiles()
        if unrecorded:
            logger.debug("entries are written without records (rebuild cannot make them again): %s", unrecorded)
        unleased = reason or jax_caching.bracket_compiles(leases.begin, leases.end)  # outermost: its end runs last
        if unleased and not reason:
            logger.debug("every process compiles each key it misses: %s", unleased)
        if reason:
            logger.debug("JAX's stock cache serves %s: %s", directory, reason)
        elif levels is not None and chain is not None:
            shared_setup.at_exit(functools.partial(_finish_levels, chain, recorder))
            unwritten = jax_caching.rank_local_writes(jax, directory) if location.writable else None
            if unwritten:
                logger.debug("ranks other than 0 do not write their local level: %s", unwritten)
        thresholds = {k: (getattr(config, str(_settings.KEYS[k].jax_option), None), settings.origin(k))
                      for k in ("min_compile_time_secs", "min_entry_size_bytes")}
        unexplained = reason or _explain_seam.install(jax, keys, watch, recorder, directory, origins=thresholds)
        if unexplained:
            logger.debug("misses are not explained: %s", unexplained)
        if keeping:
            verdict.write(directory, "jax" if reason else "gkx-autocache", reason or kept, location.team,
                          explain=unexplained, unkeyed=unkeyed, callbacks=callbacks, rebuild=unrecorded)
        # At exit: close the ledger, fold finished ledgers, keep the cap (SPEC §7); also where this
        # directory is read-only, as JAX may be given another one since (``route``).
        atexit.register(_finish_local, recorder, config, cap if not reason else None)
        if ahead is not None:  # (registered after: runs before, while the ledger is open and JAX's backend is up)
            atexit.register(ahead.finish)
    if not location.local and os.name != "nt":  # a bucket as dir: JAX's stock cache; a local one given later is judged
        _route.route_only(jax, settings, env, xla_caches)
    # Before XLA's backend starts: it reads XLA_FLAGS then.
    _cpu_target.take(jax, target, settings["cpu_target"], serving=reason is None)
    from gkx_autocache import _unread

    _unread.install(env, recorder.not_read)


def _local_level(jax: Any, settings: _settings.Settings, location: _cache.Location, env: Mapping[str, str],
                 recorder: Any, target: Any, keyed: Any) -> Any:
    """The local level of the package's own directory, with JAX's codec, accounting its landings
    to ``recorder``, checking entries against the ``cpu_target`` where ``keyed()``; None where this
    JAX's cache module has none (its store cannot serve: ``_jax.caching.store_problem``)."""
    from gkx_autocache import _mount
    from gkx_autocache._formats import compression_of
    from gkx_autocache._jax import caching as jax_caching
    from gkx_autocache._local.level import LocalLevel

    codec = jax_caching.codec(jax)
    if codec is None or location.version_dir is None:
        return None
    sample, decompress = codec
    signs = settings["shared"] is not None and _settings.signing_key(env) is not None
    return LocalLevel(os.path.realpath(location.version_dir), compression=compression_of(sample) or "zlib",
                      decompress=decompress, team=location.team, writable=location.writable,
                      check_payload=jax_caching.payload_checks(jax), signs=signs,
                      whole=_mount.bucket_mount(location.version_dir) is not None, account=recorder.landed,
                      target=target, keyed=keyed)


def _rebuilds(jax: Any, settings: _settings.Settings, location: _cache.Location, env: Mapping[str, str],
              local: Any, target: Any, cap: int) -> tuple[Any, Any]:
    """The records the package's own directory keeps of each entry written, and the rebuild ahead
    of this process's program (SPEC §18); ``(None, None)`` where this user cannot write there."""
    if local is None or not location.writable or not location.keeps_books:
        return None, None
    from gkx_autocache._rebuild import ahead as _ahead
    from gkx_autocache._rebuild import keeper as _keeper

    secret = _settings.signing_key(env)
    keeper = _keeper.Keeper(local.path, local.keep_record, location.team, secret,
                            functools.partial(_keeper.this_program, functools.partial(_isa_of, target)),
                            str(jax.__version__))
    # Every core: where the rebuild serves the program, its main thread mostly waits for it; where it
    # does not (the program's misses are none of its keys), it stops. (With every core, 2 cores gave
    # 0.76-0.82 x today's cold: docs/benchmarks.md, "Rebuild".)
    jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    ahead = _ahead.Ahead(local.path, location.team, secret, keeper.program, keeper.noted, cap, jobs,
                         float(settings["shared_timeout"]), bool(settings["rebuild_ahead"]))
    return keeper, ahead


def _isa_of(target: Any) -> str:
    """What a CPU key holds of this host: its ISA, or the ``cpu_target`` taken."""
    from gkx_autocache._key import isa_suffix

    return str(target.isa_text()) if target.level is not None else isa_suffix()


def _finish_local(recorder: Any, config: Any, cap: int | None) -> None:
    """At exit: the recorder's ledger closed and folded, the directory kept under ``cap`` (None: the
    store did not serve; 0: no cap), or under the user's own jax_compilation_cache_max_size where the
    store served in place of JAX's LRU cache (set at ``import jax`` or since)."""
    from gkx_autocache._record import recorder as recording

    size = _jax_config.jax_cap(config)
    recording.finish(recorder, 0 if cap is None else size if size else cap)


def _finish_levels(chain: Chain, recorder: Any) -> None:
    """At exit, before the ledger closes: the shared level's uploads, manifest and pack; the entries
    a prefetch landed that no lookup used, recorded as written; both levels' numbers."""
    try:
        for key, receipt in chain.finish():
            recorder.put(key, receipt.disk, receipt.compile_secs, landed=True)
        recorder.levels_record(chain.numbers())
    except Exception as exc:  # never costs the exit
        logger.debug("the levels' exit: %s", exc)
