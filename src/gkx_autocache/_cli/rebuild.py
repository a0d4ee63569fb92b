"""``gkx-autocache rebuild``: compile again, in parallel, the entries another JAX version's
directory (or this one's, after other XLA flags, another ``cpu_target``, an eviction) has records
of, as this JAX computes their keys, and write them through the store (SPEC §18). The one command
that imports JAX: the compiles are this process's."""

from __future__ import annotations

import argparse
import os
from typing import Any

from gkx_autocache import _process, _settings
from gkx_autocache._cli.output import FAILED, OK, CliError, counter, emit
from gkx_autocache._context import load_context
from gkx_autocache._diagnostics import human_bytes, human_secs, plural
from gkx_autocache._layout import version_name


def cmd_rebuild(args: argparse.Namespace) -> int:
    from gkx_autocache._rebuild import engine

    ctx = load_context()
    vdir = ctx.store_dir("rebuild")
    jobs = args.jobs if args.jobs is not None else engine.cores()
    if jobs < 1:
        raise CliError(f"--jobs takes a number of threads from 1, got {jobs}", 2)
    location = ctx.location
    team = bool(location is not None and location.team)
    dirs = sources(vdir, args.source)
    store, rebuilder = _jax_here(vdir)
    fd, holder = engine.take_lock(vdir, team) if not args.dry_run else (-1, None)
    if fd is None:
        raise CliError(f"another rebuild runs in {vdir} now ({holder}): wait for it to end, then run rebuild again "
                       "(it skips what that one wrote)")
    try:
        secret = _settings.signing_key()
        gathered = engine.gather(dirs, secret, program=args.program)
        cap = int(ctx.settings["max_size"] or 0)
        used = _used(vdir) if cap else 0
        show = counter(args, "rebuild")
        rebuild = engine.Rebuild(store, rebuilder, jobs, cap=cap, used=used, dry_run=args.dry_run,
                                 progress=(lambda out, total: show(out.done, total)) if show else None)
        outcome = rebuild.run(engine.longest_first(gathered.found))
        if show is not None:
            show(len(gathered.found), len(gathered.found))
    finally:
        if fd is not None and fd >= 0:
            os.close(fd)
    data = summary_data(vdir, dirs, gathered, outcome, jobs, args)
    emit(args, summary_text(data, args.dry_run), data)
    return FAILED if outcome.stopped and outcome.stopped != "cap" else OK


def sources(vdir: str, chosen: str | None) -> list[str]:
    """The directories whose records are read: ``chosen`` (a JAX version beside this one, or
    ``this``); by default this one and the newest of an older JAX."""
    from gkx_autocache._rebuild import engine

    if chosen in ("this", "here"):
        return [vdir]
    if chosen:
        found = os.path.join(os.path.dirname(vdir.rstrip(os.sep)), version_name(chosen.removeprefix("jax-")))
        if not os.path.isdir(found):
            raise CliError(f"--from {chosen}: there is no {found}")
        return [found]
    older = engine.older_dir(vdir)
    return [vdir] if older is None else [older, vdir]


def _jax_here(vdir: str) -> tuple[Any, Any]:
    """This process's JAX, configured by the package (the import hook), with the store serving
    ``vdir``; the store and this JAX's rebuilding functions. Raises CliError."""
    try:
        import jax
    except ImportError as exc:
        raise CliError(f"JAX is not installed here ({exc}): there is nothing to compile with") from None
    from gkx_autocache import _store
    from gkx_autocache._jax import rebuild as jax_rebuild

    if _process.current is None:
        raise CliError("gkx-autocache did not configure JAX in this process (is it turned off: GKX_JAX_CACHE=0, or "
                       "JAX's cache off?); rebuild writes through its store")
    rebuilder = jax_rebuild.Rebuilder()
    if rebuilder.problem is not None:
        raise CliError(f"this JAX cannot rebuild: {rebuilder.problem}")
    try:
        rebuilder.backend(jax.default_backend())  # JAX sets up its cache object (the store) at its first use
    except Exception as exc:
        raise CliError(f"JAX cannot start here: {exc}") from None
    _process.current.runs_command("rebuild")
    store = _store.current()
    if store is None or os.path.realpath(store.path) != os.path.realpath(vdir):
        used = getattr(store, "path", None) or getattr(jax.config, "jax_compilation_cache_dir", None)
        raise CliError(f"gkx-autocache's store does not serve {vdir} in this process (JAX uses {used}): rebuild "
                       "writes through it")
    return store, rebuilder


def _used(vdir: str) -> int:
    from gkx_autocache import _entries

    return _entries.count(vdir)[1]


def summary_data(vdir: str, dirs: list[str], gathered: Any, outcome: Any, jobs: int,
                 args: argparse.Namespace) -> dict[str, Any]:
    stopped = {"cap": "the directory reached its cap (max_size): raise max_size, or choose with --program"}.get(
        outcome.stopped or "", outcome.stopped)
    return {"dir": vdir, "sources": dirs, "jobs": jobs, "dry_run": bool(args.dry_run), "program": args.program,
            "records": len(gathered.found), "rebuilt": outcome.rebuilt, "present": outcome.present,
            "would_rebuild": outcome.would, "failed": dict(sorted(outcome.failed.items(), key=lambda kv: -kv[1])),
            "refused": dict(sorted(gathered.refused.items(), key=lambda kv: -kv[1])),
            "other_programs": gathered.other_programs, "bytes": outcome.bytes,
            "compile_secs": round(outcome.compile_secs, 3), "secs": round(outcome.seconds, 3), "stopped": stopped}


def summary_text(data: dict[str, Any], dry_run: bool) -> str:
    from_dirs = " and ".join(os.path.basename(d) for d in data["sources"])
    if not data["records"] and not data["refused"]:
        other = f" ({plural(data['other_programs'], 'record')} of other programs)" if data["other_programs"] else ""
        return f"rebuild: no records to rebuild from in {from_dirs}{other}; nothing done"
    done = (f"would rebuild {data['would_rebuild']}" if dry_run
            else f"rebuilt {plural(data['rebuilt'], 'entry', 'entries')} ({human_bytes(data['bytes'])}, "
                 f"{human_secs(data['compile_secs'])} compile CPU, {data['secs']:.1f} s on {data['jobs']} "
                 f"{'thread' if data['jobs'] == 1 else 'threads'})")
    lines = [f"rebuild from the records of {from_dirs} into {os.path.basename(data['dir'])}: {done}, "
             f"{data['present']} already there"]
    if data["failed"]:
        lines.append(f"could not be rebuilt ({sum(data['failed'].values())}):")
        lines += [f"  {n:6d}  {why}" for why, n in data["failed"].items()]
    if data["refused"]:
        lines.append(f"records not read ({sum(data['refused'].values())}):")
        lines += [f"  {n:6d}  {why}" for why, n in data["refused"].items()]
    if data["other_programs"]:
        lines.append(f"{plural(data['other_programs'], 'record')} of other programs left (--program)")
    if data["stopped"]:
        lines.append(f"stopped: {data['stopped']}")
    return "\n".join(lines)
