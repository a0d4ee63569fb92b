"""``gkx-autocache [--json] COMMAND``: the user's window into the cache. Argparse, one thin
function per command (parse, call one function of the core, print), and the human text. Never
imports ``jax`` (except ``demo``, which runs it in child processes)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from gkx_autocache import _bundle, _cache, _entries, _ledger, _policy, _settings, _stats, _status
from gkx_autocache._diagnostics import human_bytes, human_secs, one_line, shown
from gkx_autocache._status import Context, load_context

OK, FAILED, USAGE = 0, 1, 2
JSON_VERSION = 1


class CliError(Exception):
    """A failure to report as one line; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = FAILED) -> None:
        super().__init__(message)
        self.code = code


def emit(args: argparse.Namespace, human: str, data: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps({"version": JSON_VERSION, "command": args.command, **data}, default=str))
    else:
        print(human)


def progress(message: str) -> None:
    """A progress line on a terminal's stderr; never mixed into stdout (or --json)."""
    if sys.stderr.isatty():
        print(f"\r{message}", end="", file=sys.stderr, flush=True)


def causes_lines(t: dict[str, Any]) -> list[str]:
    lines = []
    if t["causes"]:
        lines.append("misses by cause:")
        lines.extend(f"  {n:8d}  {cause}" for cause, n in t["causes"].items())
    if t["uncached"]:
        lines.append("compiles not cached, by reason:")
        lines.extend(f"  {n:8d}  {reason}" for reason, n in t["uncached"].items())
    return lines


# -- status, dir, stats ---------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    data = _status.gather(load_context(), probe=not getattr(args, "no_probe", False))
    emit(args, _status.text(data), data)
    return OK


def cmd_dir(args: argparse.Namespace) -> int:
    vdir = load_context().version_dir
    emit(args, vdir, {"dir": vdir})
    return OK


def cmd_stats(args: argparse.Namespace) -> int:
    ctx = load_context()
    vdir = ctx.version_dir
    if args.reset:
        removed = _ledger.reset(vdir, bool(ctx.settings["trust_shared"]))
        emit(args, f"stats reset ({removed} ledgers folded and removed)", {"reset": True, "removed": removed})
        return OK
    totals = _ledger.read_totals(vdir)
    if args.written:  # bare, for a CI step's output: save the cache only when this run wrote entries
        written = totals.writes if totals is not None else 0
        emit(args, str(written), {"dir": vdir, "written": written})
        return OK
    if totals is None:
        emit(args, f"no ledger yet in {vdir}: no process has used the cache since the last reset",
             {"dir": vdir, "stats": None})
        return OK
    top = _stats.top_functions(totals)
    data = _stats.totals_dict(totals)
    lines = [_status.stats_line(data), f"directory {vdir}", *causes_lines(data)]
    levels = {}
    if totals.levels:  # the local and shared levels' numbers (SPEC §14)
        from gkx_autocache import _levels

        levels = {name: _levels.shown(totals.levels.get(name, {})) for name in ("local", "shared")}
        lines.insert(1, f"levels      {_levels.line(totals.levels)}")
    if top:
        lines.append("costliest compiles (seconds, summed over shapes):")
        lines.extend(f"  {secs:8.3f}  {name}" for name, secs in top)
    emit(args, "\n".join(lines), {"dir": vdir, "stats": data, "levels": levels or None,
                                   "top_functions": [{"name": n, "compile_secs": round(s, 3)} for n, s in top]})
    return OK


def cmd_explain(args: argparse.Namespace) -> int:
    ctx = load_context()
    vdir = ctx.version_dir
    data = _status.explain(ctx)
    lines = [f"why recent compiles were not served from {vdir}"]
    if data["unavailable"]:
        lines.append(f"  explanations unavailable here: {data['unavailable']}")
    if not data["groups"]:
        lines.append("  no misses and no uncached compiles recorded since the last reset")
    for group in data["groups"]:
        lines.append(f"{group['cause']}  ({group['count']})")
        for fn in group["functions"]:
            times = f" x{fn['count']}" if fn["count"] > 1 else ""
            lines.append(f"  {fn['name']}{times}: {fn['detail']}")
        if group.get("fix"):
            lines.append(f"  fix: {group['fix']}")
    emit(args, "\n".join(lines), {"dir": vdir, **data})
    return OK


def cmd_ci_key(args: argparse.Namespace) -> int:
    key, parts = _status.ci_key()
    emit(args, key, {"key": key, "parts": parts})
    return OK


# -- clear, prune, verify -------------------------------------------------------------------------


def _carry_out(args: argparse.Namespace, removal: _entries.Removal, extra: dict[str, Any] | None = None) -> None:
    """Remove (unless ``--dry-run``) and report one version directory's removal."""
    if not args.dry_run:
        try:
            done = _entries.execute(removal)
        except _entries.Refused as exc:
            raise CliError(str(exc)) from None
        if done.failed:  # never claim a removal that did not happen (a read-only cache)
            raise CliError(f"removed {done.files} of {len(removal.files)} files from {removal.version_dir}; {done.why()}")
    would = "would remove" if args.dry_run else "removed"
    secs = f", {human_secs(removal.compile_secs)} of compile time" if removal.compile_secs else ""
    emit(args, f"{would} {removal.entries} entries ({len(removal.files)} files, {human_bytes(removal.bytes)}{secs})"
               f" from {removal.version_dir}",
         {"dry_run": args.dry_run, "entries": removal.entries, "files": len(removal.files), "bytes": removal.bytes,
          "compile_secs": round(removal.compile_secs, 3), "dir": removal.version_dir, **(extra or {})})


def _require_tag(vdir: str) -> None:
    """A cache is recognised by its tag before anything is deleted (see ``_entries.has_tag``)."""
    if _entries.has_tag(vdir):
        return
    if not os.path.isdir(vdir):
        raise CliError(f"{vdir} does not exist: nothing to remove")
    raise CliError(f"{vdir} has no gkx-autocache CACHEDIR.TAG, so it is not known to be a cache: nothing removed")


def _shared(ctx: Context, command: str) -> str:
    """The shared level's version directory (SPEC §14), for ``--shared``."""
    from gkx_autocache import _levels

    shared = ctx.settings["shared"]
    if shared is None:
        raise CliError(f"{command} --shared: no shared level is set (GKX_JAX_CACHE_SHARED, or shared in a settings file)")
    if ctx.jax_version is None:
        raise CliError(ctx.why_no_dir())
    return str(_levels.backend_for(shared, ctx.jax_version, bool(ctx.settings["trust_shared"])).where)


def cmd_clear(args: argparse.Namespace) -> int:
    ctx = load_context()
    if args.shared:  # entries and their sidecars only; the shared level keeps no bookkeeping
        vdir = _shared(ctx, "clear")
        asked = not args.dry_run and not args.yes and sys.stdin.isatty()
        if asked and input(f"remove every cache entry in {vdir}? [y/N] ").strip().lower() not in ("y", "yes"):
            raise CliError("nothing removed")
        if os.path.isdir(vdir):
            _require_tag(vdir)
        _carry_out(args, _entries.plan_clear(vdir), {"shared": True})
        return OK
    targets = [ctx.version_dir]
    if args.all_versions and ctx.root:
        targets = [d for d in _entries.version_dirs(ctx.root) if _entries.has_tag(d)] or targets
    if not args.dry_run and not args.yes and sys.stdin.isatty():
        answer = input(f"remove every cache entry in {', '.join(targets)}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            raise CliError("nothing removed")
    for vdir in targets:
        if os.path.isdir(vdir):  # one never used has nothing to remove (a URL is always tagged)
            _require_tag(vdir)
        _carry_out(args, _entries.plan_clear(vdir), {"totals_reset": not args.dry_run})
        if not args.dry_run:  # a fresh start: the totals of what was cleared go too
            _ledger.reset(vdir, bool(ctx.settings["trust_shared"]), forget=True)
            if not args.json:
                print(f"stats of {vdir} reset")
    return OK


def cmd_prune(args: argparse.Namespace) -> int:
    ctx = load_context()
    if args.shared:
        return _prune_shared(args, ctx)
    vdir = ctx.version_dir
    try:
        cap = _settings.parse_size(args.max_size) if args.max_size is not None else ctx.settings["max_size"]
    except _settings.BadValue as exc:
        raise CliError(f"--max-size: {exc}", USAGE) from None
    try:
        older = _settings.parse_age(args.older_than) if args.older_than else None
    except _settings.BadValue as exc:
        raise CliError(f"--older-than: {exc}", USAGE) from None
    if os.path.isdir(vdir):  # a directory that exists must carry the tag (a URL always does)
        _require_tag(vdir)
    stale: list[str] = []
    if args.stale_versions and ctx.root:
        installed = os.path.basename(vdir)
        stale = [d for d in _entries.version_dirs(ctx.root) if _entries.has_tag(d) and _entries.stale(d, installed)]
    plan = _entries.plan_prune(vdir, cap, older)
    _carry_out(args, plan, {"max_size": cap, "stale_versions": stale})
    if not args.dry_run and os.path.isdir(vdir):  # their next miss is then named "evicted"
        _ledger.record_evicted(vdir, [u.key for u in plan.units if u.has_entry], "prune", bool(ctx.settings["trust_shared"]))
    if not args.dry_run:
        for other in stale:
            _entries.remove_version_dir(other)
    if stale and not args.json:
        would = "would remove" if args.dry_run else "removed"
        print(f"{would} directories of JAX versions not installed here and unused for 30 days: {', '.join(stale)}")
    return OK


def _prune_shared(args: argparse.Namespace, ctx: Context) -> int:
    """``prune --shared``: the shared level has no cap of its own (``max_size`` is the local
    level's, and a team's bucket is no one process's to cap), so the limit is said each time."""
    vdir = _shared(ctx, "prune")
    if args.max_size is None and args.older_than is None or args.stale_versions:
        raise CliError("prune --shared: the shared level has no cap of its own (max_size is the local level's); give "
                       "--max-size or --older-than (not --stale-versions), or let a bucket lifecycle rule expire old "
                       "objects", USAGE)
    try:
        cap = _settings.parse_size(args.max_size) if args.max_size is not None else 0
        older = _settings.parse_age(args.older_than) if args.older_than else None
    except _settings.BadValue as exc:
        raise CliError(f"prune --shared: {exc}", USAGE) from None
    if os.path.isdir(vdir):
        _require_tag(vdir)
    _carry_out(args, _entries.plan_prune(vdir, cap, older), {"max_size": cap, "shared": True})
    return OK


def cmd_verify(args: argparse.Namespace) -> int:
    vdir = load_context().version_dir
    result = _entries.verify(vdir, progress)
    doomed = result.doomed
    if args.repair and doomed:
        _require_tag(vdir)
        try:
            done = _entries.remove_files(vdir, doomed)
        except _entries.Refused as exc:
            raise CliError(str(exc)) from None
        if done.failed:
            raise CliError(f"verify --repair: {done.why()}")
    lines = [f"verified {result.checked} entries in {vdir}: {len(result.corrupt)} corrupt, "
             f"{len(result.orphans)} orphan sidecars, {len(result.stale)} stale temporary files, {len(result.links)} links"]
    lines += [f"  corrupt  {u.key}: {why}" for u, why in result.corrupt]
    lines += [f"  orphan   {os.path.basename(p)}" for p in result.orphans]
    lines += [f"  stale    {os.path.basename(p)}" for p in result.stale]
    lines += [f"  link     {os.path.basename(p)} (never read)" for p in result.links]
    if doomed:
        lines.append("removed them" if args.repair else "run verify --repair to remove them")
    emit(args, "\n".join(lines), {
        "dir": vdir, "entries": result.checked, "repaired": bool(args.repair and doomed),
        "corrupt": [{"key": u.key, "why": why} for u, why in result.corrupt], "orphans": result.orphans,
        "stale_temporary": result.stale, "links": result.links,
    })
    return FAILED if doomed and not args.repair else OK


# -- export, import: warm bundles -----------------------------------------------------------------


def _environment(ctx: Context) -> dict[str, Any]:
    return _bundle.environment(ctx.jax_version, _status.distribution_version("jaxlib"))


def _local(ctx: Context, command: str) -> str:
    vdir = ctx.version_dir
    if ctx.location is not None and ctx.location.kind == _cache.REMOTE:
        raise CliError(f"{command} works on local directories; {vdir} is remote (copy objects with your bucket's tools)")
    return vdir


def cmd_export(args: argparse.Namespace) -> int:
    ctx = load_context()
    vdir = _local(ctx, "export")
    if not os.path.isdir(vdir):
        raise CliError(f"{vdir} does not exist: nothing to export")
    archive = os.path.abspath(args.file)
    try:
        done = _bundle.export(vdir, archive, _environment(ctx))
    except OSError as exc:
        raise CliError(f"{archive} not written: {exc.strerror or exc}") from None
    emit(args, f"exported {done.entries} entries ({done.files} files, {human_bytes(done.bytes)}) from {vdir}"
               f" to {archive}\nsha256 {done.sha256}",
         {"file": archive, "dir": vdir, "entries": done.entries, "files": done.files, "bytes": done.bytes,
          "sha256": done.sha256, **_environment(ctx)})
    return OK


def cmd_import(args: argparse.Namespace) -> int:
    ctx = load_context(create=True)  # the version directory, created (with its tag, trust-checked) if need be
    vdir = _local(ctx, "import")
    if not os.path.isdir(vdir):
        raise CliError(f"{vdir} does not exist")
    if ctx.location is not None and not ctx.location.writable:
        raise CliError(f"{vdir} is read-only here: nothing imported")
    try:
        done = _bundle.import_bundle(args.file, vdir, _environment(ctx), sha256=args.sha256, force=args.force,
                                     shared=bool(ctx.settings["trust_shared"]), cap=ctx.settings["max_size"])
    except _bundle.Refused as exc:
        raise CliError(f"{args.file} refused: {exc}; nothing imported") from None
    except OSError as exc:
        raise CliError(f"{args.file}: {exc.strerror or exc}; nothing imported") from None
    _ledger.record_added(vdir, done.bytes, bool(ctx.settings["trust_shared"]))
    emit(args, f"imported {done.entries} entries ({done.files} files, {human_bytes(done.bytes)}) into {vdir}"
               f"{f'; {done.present} already present, kept' if done.present else ''}",
         {"file": args.file, "dir": vdir, "entries": done.entries, "present": done.present, "files": done.files,
          "bytes": done.bytes})
    return OK


# -- config ---------------------------------------------------------------------------------------


def _key(name: str) -> _settings.Key:
    if name.lower() in ("signing_key", _settings.SIGNING_KEY_ENV.lower()):  # its value is never echoed
        raise CliError(f"the signing key is a secret: it is read from {_settings.SIGNING_KEY_ENV} in the environment "
                       "only, never written to a settings file", USAGE)
    if name not in _settings.KEYS:
        raise CliError(f"unknown key {shown(name)}; known keys: {', '.join(_settings.KEYS)}", USAGE)
    return _settings.KEYS[name]


def cmd_config(args: argparse.Namespace) -> int:
    if args.action in ("list", "get"):
        settings = load_context().settings
        if args.action == "get":
            name = _key(args.key).name
            emit(args, str(settings[name]), {"key": name, "value": settings[name], "origin": settings.origin(name)})
            return OK
        lines = [f"{k:<22} {str(r.value):<28} {r.origin}" for k, r in settings.values.items()]
        lines += [f"file {p}: {v.status}" for p, v in settings.files.items()]
        emit(args, "\n".join(lines), {"settings": {k: {"value": r.value, "origin": r.origin}
                                                   for k, r in settings.values.items()},
                                      "files": {p: v.status for p, v in settings.files.items()}})
        return OK
    key = _key(args.key)
    path = _policy.user_path() if args.user else _policy.policy_path()
    if args.action == "unset":
        try:
            _policy.set_key(path, key.name, None)
        except _policy.Unwritable as exc:
            raise CliError(str(exc)) from None
        emit(args, f"{key.name} removed from {path}", {"key": key.name, "file": path})
        return OK
    raw: str = args.value
    try:
        value = _settings.validate(key.name, raw, os.getcwd())
        literal = _policy.format_value(_policy.as_typed(key.name, raw, value, os.getcwd()))
    except (_settings.BadValue, _policy.Unwritable) as exc:
        raise CliError(f"{key.name}: {exc}; {path} left as it was", USAGE) from None
    try:
        _policy.set_key(path, key.name, literal)
    except _policy.Unwritable as exc:
        raise CliError(str(exc)) from None
    emit(args, f"{key.name} = {literal} written to {path}", {"key": key.name, "value": value, "file": path})
    return OK


# -- demo -----------------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from gkx_autocache import _demo

    code = _demo.demo(as_json=args.json)
    if code == OK and not args.json:
        ctx = load_context()
        where = ctx.location.version_dir if ctx.location and ctx.location.version_dir else ctx.why_no_dir()
        print(f"a normal run in this environment caches in: {where}")
    return code


# -- the parser -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gkx-autocache", description="JAX's persistent compilation cache, on by default.")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    json_flag = argparse.ArgumentParser(add_help=False)
    json_flag.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="one JSON object on stdout")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, func: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[json_flag], help=help, description=help)
        sub.set_defaults(func=func)
        return sub

    add("status", cmd_status, "versions, hook, settings with origins, directory, store, stats (the default)").add_argument(
        "--no-probe", action="store_true", help="do not ask the shared level whether it answers")
    add("dir", cmd_dir, "print the version directory, bare")
    stats = add("stats", cmd_stats, "hits, misses by cause, time saved across processes")
    stats.add_argument("--reset", action="store_true", help="start the totals again from zero")
    stats.add_argument("--written", action="store_true",
                       help="print only how many entries were written since the last reset (for CI: save when not 0)")
    add("explain", cmd_explain, "why recent compiles missed or were not cached, function by function")
    add("ci-key", cmd_ci_key, "a key for a CI cache: changes whenever the entries could stop being valid")
    clear = add("clear", cmd_clear, "remove every entry")
    clear.add_argument("--all-versions", action="store_true", help="every JAX version's directory")
    clear.add_argument("--dry-run", action="store_true")
    clear.add_argument("--yes", action="store_true", help="do not ask")
    clear.add_argument("--shared", action="store_true", help="the shared level's entries, not the local level's")
    prune = add("prune", cmd_prune, "remove least recently used entries")
    prune.add_argument("--max-size", metavar="SIZE", help="keep the directory under SIZE (default: max_size)")
    prune.add_argument("--older-than", metavar="AGE", help="remove entries unused for AGE (30d, 12h)")
    prune.add_argument("--stale-versions", action="store_true", help="remove directories of JAX versions not installed")
    prune.add_argument("--dry-run", action="store_true")
    prune.add_argument("--shared", action="store_true",
                       help="the shared level (it has no cap of its own: give --max-size or --older-than)")
    add("verify", cmd_verify, "read back every entry; --repair removes the bad ones").add_argument(
        "--repair", action="store_true")
    config = add("config", cmd_config, "show or edit the settings files")
    actions = config.add_subparsers(dest="action", metavar="ACTION", required=True)
    where = argparse.ArgumentParser(add_help=False)
    group = where.add_mutually_exclusive_group()
    group.add_argument("--venv", action="store_true", help="the environment's policy file (the default)")
    group.add_argument("--user", action="store_true", help="your user config file")
    actions.add_parser("list", parents=[where, json_flag])
    actions.add_parser("get", parents=[where, json_flag]).add_argument("key")
    setter = actions.add_parser("set", parents=[where, json_flag])
    setter.add_argument("key")
    setter.add_argument("value")
    actions.add_parser("unset", parents=[where, json_flag]).add_argument("key")
    add("export", cmd_export, "write the entries to one archive (a warm bundle)").add_argument(
        "file", help="the archive to write (a tar)")
    bundle_in = add("import", cmd_import, "merge a warm bundle's entries into the cache")
    bundle_in.add_argument("file", help="the archive to read")
    bundle_in.add_argument("--sha256", metavar="HASH", help="refuse unless the archive has this sha256 (from its author)")
    bundle_in.add_argument("--force", action="store_true", help="import a bundle made for another JAX or platform")
    add("demo", cmd_demo, "run a compile-heavy JAX program cold, then warm")
    return parser


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a path that is not UTF-8, a hostile ledger: escaped, never a traceback
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args.command, args.func = "status", cmd_status
    try:
        return int(args.func(args))
    except CliError as exc:
        return fail(args, str(exc), exc.code)
    except _status.NoDirectory as exc:
        return fail(args, str(exc), FAILED)
    except BrokenPipeError:  # `gkx-autocache status | head`: the reader left; no traceback at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return FAILED
    except OSError as exc:  # a remote directory's failures arrive as one line (_remote.RemoteError)
        return fail(args, str(exc), FAILED)
    except KeyboardInterrupt:
        return FAILED


def fail(args: argparse.Namespace, message: str, code: int) -> int:
    """The one place an error becomes a message: one line on stderr, and with ``--json`` one
    object on stdout that carries it."""
    line = one_line(message)
    print(f"gkx-autocache {args.command}: {line}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"version": JSON_VERSION, "command": args.command, "error": line, "exit": code}))
    return code
