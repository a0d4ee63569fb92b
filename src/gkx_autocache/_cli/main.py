"""``gkx-autocache [--json] COMMAND``: the user's window into the cache. Argparse, one thin
function per command (parse, call one function of the core, print), and the human text. Never
imports ``jax`` (except ``demo``, which runs it in child processes)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from gkx_autocache import _bundle, _cache, _entries, _policy, _settings
from gkx_autocache._cli import status as _status
from gkx_autocache._cli.status import Context, load_context
from gkx_autocache._diagnostics import human_bytes, human_secs, one_line, plural, shown
from gkx_autocache._record import ledger as _ledger
from gkx_autocache._record import reset as _reset
from gkx_autocache._record import show as _show

OK, FAILED, USAGE = 0, 1, 2
JSON_VERSION = _status.JSON_VERSION


class CliError(Exception):
    """A failure to report as one line; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = FAILED) -> None:
        super().__init__(message)
        self.code = code


class UsageError(Exception):
    """argparse's complaint, raised rather than printed, so that ``--json`` can carry it."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser


class Parser(argparse.ArgumentParser):
    commands: tuple[str, ...] = ()  # the top level's, for a usage error to name its command

    def error(self, message: str) -> NoReturn:
        raise UsageError(self, message)


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
    if t["misses_by_cause"]:
        lines.append("misses by cause:")
        lines.extend(f"  {n:8d}  {cause}" for cause, n in t["misses_by_cause"].items())
    if t["not_cached_by_reason"]:
        lines.append("compiles not cached, by reason:")
        lines.extend(f"  {n:8d}  {reason}" for reason, n in t["not_cached_by_reason"].items())
    return lines


# -- status, dir, stats ---------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    data = _status.gather(load_context(), probe=not getattr(args, "no_probe", False))
    emit(args, _status.text(data), data)
    return OK


def cmd_version(args: argparse.Namespace) -> int:
    """From the distributions' metadata: no ``import jax``."""
    found = {name: _status.distribution_version(dist) for name, dist in
             (("gkx-autocache", "gkx-autocache"), ("jax", "jax"), ("jaxlib", "jaxlib"))}
    found["python"] = sys.version.split()[0]
    emit(args, "  ".join(f"{name} {version or '(not installed)'}" for name, version in found.items()), found)
    return OK


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


def cmd_dir(args: argparse.Namespace) -> int:
    """The directory a process of this environment uses now; where the ``dir`` it was given is
    skipped, that said first (on stderr: stdout stays one bare path, as scripts read it)."""
    ctx = load_context()
    vdir = ctx.version_dir
    message = skipped_dir(ctx)
    if message is not None:
        print(f"gkx-autocache dir: {one_line(message)}; processes use {vdir}", file=sys.stderr)
    emit(args, vdir, {"dir": vdir, **({"warning": one_line(message)} if message is not None else {})})
    return OK


def cmd_stats(args: argparse.Namespace) -> int:
    ctx = load_context()
    vdir = ctx.version_dir
    if args.reset:
        removed = _reset.reset(vdir, bool(ctx.settings["trust_shared"]))
        emit(args, f"stats reset ({plural(removed, 'ledger')} folded and removed)", {"reset": True, "removed": removed})
        return OK
    data = _status.stats_data(vdir)
    if args.written:  # bare, for a CI step's output: save the cache only when this run wrote entries
        written = data["stats"]["writes"] if data["stats"] else 0
        emit(args, str(written), {"dir": vdir, "written": written})
        return OK
    stats = data["stats"]
    if stats is None and data["reset_at"]:
        emit(args, f"no lookups in {vdir} since the last reset (stats --reset, {_when(data['reset_at'])})", data)
        return OK
    if stats is None:
        emit(args, f"none yet: no process has used {vdir}", data)
        return OK
    lines = [_status.stats_line(stats), f"directory {vdir}", *causes_lines(stats)]
    if data["levels"]:  # the local and shared levels' numbers (SPEC §14)
        from gkx_autocache._shared import level as _levels

        lines.insert(1, f"levels      {_levels.line(data['levels'])}")
    if data["top_functions"]:
        lines.append("costliest compiles (seconds, summed over shapes; JAX's own helpers last):")
        lines.extend(f"  {f['compile_secs']:8.3f}  {f['name']}{'  (JAX)' if f['helper'] else ''}"
                     for f in data["top_functions"])
    emit(args, "\n".join(lines), data)
    return OK


def cmd_explain(args: argparse.Namespace) -> int:
    ctx = load_context()
    vdir = ctx.version_dir
    try:
        since = _settings.parse_age(args.since) if args.since else None
    except _settings.BadValue as exc:
        raise CliError(f"--since: {exc}", USAGE) from None
    data = {"dir": vdir, **_status.explain(ctx, since=since, function=args.function)}
    lines = []
    if data["read_only"]:
        lines.append("this cache is read-only for you: your runs are served from it but keep no records here"
                     + (": what follows is what the runs of those who write it recorded" if data["last_run"] else ""))
    if data["unavailable"]:
        lines.append(f"explanations unavailable here: {data['unavailable']}")
    last = data["last_run"]
    if last is None:
        lines.append(f"no run has recorded its use of {vdir} since the last reset")
    else:
        counts = [plural(last["hits"], "hit"), plural(last["misses"], "miss", "misses") + _show.by_cause(last["misses_by_cause"])]
        if last["not_cached"]:
            counts.append(f"{last['not_cached']} not cached{_show.by_cause(last['not_cached_by_reason'])}")
        lines.append(f"last run: {_when(last['started'])}, {last['label'] or 'a process'} "
                     f"({plural(last['processes'], 'process', 'processes')}): {', '.join(counts)}")
        lines.extend(_groups_text(data["groups"], "  ", with_time=False))
        if not data["groups"] and (last["misses"] or last["not_cached"]):
            lines.append("  (its misses are older than --since, or of other functions)")
    if data["earlier"]:
        lines.append("earlier" + (f" (since {args.since} ago)" if args.since else "") + ":")
        lines.extend(_groups_text(data["earlier"], "  ", with_time=True))
    filtered = " of " + args.function if args.function else ""
    if last is not None and not data["groups"] and not data["earlier"] and not (last["misses"] or last["not_cached"]):
        lines.append(f"nothing missed{filtered}: every lookup was served")
    emit(args, "\n".join(lines), data)
    return OK


def _when(t: float | None) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "?"


def _groups_text(groups: list[dict[str, Any]], indent: str, with_time: bool) -> list[str]:
    lines = []
    for group in groups:
        listed = (f"; {group['listed']} listed: the others repeat a compile listed, or are older than the latest "
                  f"{_ledger.RECENT} kept") if "listed" in group else ""
        lines.append(f"{indent}{group['cause']} ({group['count']}{listed})")
        helpers = False
        for fn in group["functions"]:
            if fn["helper"] and not helpers:
                lines.append(f"{indent}  JAX's own helpers:")
                helpers = True
            times = f" x{fn['count']}" if fn["count"] > 1 else ""
            when = f" (last {_when(fn.get('last'))})" if with_time else ""
            lines.append(f"{indent}  {fn['name']}{times}{when}: {fn['detail']}")
            if fn.get("every_run"):
                lines.append(f"{indent}    {fn['every_run']}")
        if group.get("fix"):
            lines.append(f"{indent}  fix: {group['fix']}")
    return lines


def cmd_ci_key(args: argparse.Namespace) -> int:
    key, parts = _status.ci_key()
    emit(args, key, {"key": key, "parts": parts})
    return OK


# -- clear, prune, verify -------------------------------------------------------------------------


def _carry_out(args: argparse.Namespace, removal: _entries.Removal, extra: dict[str, Any] | None = None,
               remains: bool = False) -> None:
    """Remove (unless ``--dry-run``) and report one version directory's removal; with ``remains``,
    what is left (or would be) too."""
    if not args.dry_run:
        try:
            done = _entries.execute(removal)
        except _entries.Refused as exc:
            raise CliError(str(exc)) from None
        if done.failed:  # never claim a removal that did not happen (a read-only cache)
            raise CliError(f"removed {done.files} of {len(removal.files)} files from {removal.version_dir}; {done.why()}")
    would = "would remove" if args.dry_run else "removed"
    secs = f", {human_secs(removal.compile_secs)} of compile time" if removal.compile_secs else ""
    data = {"dry_run": args.dry_run, "entries": removal.entries, "files": len(removal.files), "bytes": removal.bytes,
            "compile_secs": round(removal.compile_secs, 3), "dir": removal.version_dir, **(extra or {})}
    left = ""
    if remains:  # from the plan's own scan where it has one (a recount of 100 000 entries is 1.5 s)
        if removal.before is not None:
            entries, on_disk = removal.before[0] - removal.entries, removal.before[1] - removal.bytes
        else:
            entries, on_disk = _entries.count(removal.version_dir)
            if args.dry_run:
                entries, on_disk = entries - removal.entries, on_disk - removal.bytes
        data.update(remaining_entries=entries, remaining_bytes=on_disk)
        left = (f"; {plural(entries, 'entry', 'entries')} ({human_bytes(on_disk)} on disk, bookkeeping included) "
                f"{'would remain' if args.dry_run else 'remain'}")
    emit(args, f"{would} {plural(removal.entries, 'entry', 'entries')} ({plural(len(removal.files), 'file')}, "
               f"{human_bytes(removal.bytes)}{secs}) from {removal.version_dir}{left}", data)


def _require_tag(vdir: str) -> None:
    """A cache is recognised by its tag before anything is deleted (see ``_entries.has_tag``)."""
    if _entries.has_tag(vdir):
        return
    if not os.path.isdir(vdir):
        raise CliError(f"{vdir} does not exist: nothing to remove")
    raise CliError(f"{vdir} has no gkx-autocache CACHEDIR.TAG, so it is not known to be a cache: nothing removed")


def _shared(ctx: Context, command: str) -> str:
    """The shared level's version directory (SPEC §14), for ``--shared``."""
    from gkx_autocache._shared import level as _levels

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
    refuse_skipped_dir(ctx, "clear")
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
            _reset.reset(vdir, bool(ctx.settings["trust_shared"]), forget=True)
            if not args.json:
                print(f"stats of {vdir} reset")
    return OK


def cmd_prune(args: argparse.Namespace) -> int:
    ctx = load_context()
    if args.shared:
        return _prune_shared(args, ctx)
    refuse_skipped_dir(ctx, "prune")
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
    _carry_out(args, plan, {"max_size": cap, "stale_versions": stale}, remains=True)
    if not args.dry_run and os.path.isdir(vdir):  # their next miss is then named "evicted"
        _reset.record_evicted(vdir, [u.key for u in plan.units if u.has_entry], "prune", bool(ctx.settings["trust_shared"]))
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
    ctx = load_context()
    if args.repair:
        refuse_skipped_dir(ctx, "verify --repair")
    vdir = ctx.version_dir
    result = _entries.verify(vdir, progress)
    doomed = result.doomed
    left: list[str] = []  # directories named like entries that hold something: the user's to remove
    if args.repair and (doomed or result.doomed_dirs):
        _require_tag(vdir)
        try:
            done = _entries.remove_files(vdir, doomed)
            left = _entries.remove_empty_dirs(vdir, result.doomed_dirs)
        except _entries.Refused as exc:
            raise CliError(str(exc)) from None
        if done.failed:
            raise CliError(f"verify --repair: {done.why()}")
        # their next miss is then named "evicted", by verify --repair
        _reset.record_evicted(vdir, [u.key for u, _ in result.corrupt if u.has_entry], "verify",
                               bool(load_context().settings["trust_shared"]))
    lines = [f"verified {result.checked} entries in {vdir}: {len(result.corrupt)} corrupt, "
             f"{len(result.orphans)} orphan sidecars, {len(result.stale)} stale temporary files, {len(result.links)} links"
             f", {len(result.not_regular)} not regular files"]
    lines += [f"  corrupt  {u.key}: {why}" for u, why in result.corrupt]
    lines += [f"  orphan   {os.path.basename(p)}" for p in result.orphans]
    lines += [f"  stale    {os.path.basename(p)}" for p in result.stale]
    lines += [f"  link     {os.path.basename(p)} (never read)" for p in result.links]
    lines += [f"  odd      {os.path.basename(p)}: not a regular file: {kind} (never read)" for p, kind in result.not_regular]
    if doomed or result.doomed_dirs:
        lines.append(("removed them, but:" if left else "removed them") if args.repair else "run verify --repair to remove them")
    lines += [f"  left     {os.path.basename(p)}: a directory that is not empty; look inside, and remove it yourself"
              for p in left]
    emit(args, "\n".join(lines), {
        "dir": vdir, "entries": result.checked, "repaired": bool(args.repair and (doomed or result.doomed_dirs)),
        "corrupt": [{"key": u.key, "why": why} for u, why in result.corrupt], "orphans": result.orphans,
        "stale_temporary": result.stale, "links": result.links,
        "not_regular": [{"path": p, "kind": kind} for p, kind in result.not_regular], "left": left,
    })
    return FAILED if ((doomed or result.doomed_dirs) and not args.repair) or left else OK


# -- export, import: warm bundles -----------------------------------------------------------------


def _environment(ctx: Context) -> dict[str, Any]:
    return _bundle.environment(ctx.jax_version, _status.distribution_version("jaxlib"))


def _absolute(path: str) -> str:
    """A path argument made absolute, or one line when it is relative to a deleted directory."""
    if os.path.isabs(path):
        return path
    cwd = _settings.current_dir()
    if cwd is None:
        raise CliError(f"{shown(path)} is relative and the current directory no longer exists (it was deleted): "
                       "give an absolute path, or cd to a directory that exists")
    return os.path.join(cwd, path)


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
    archive = _absolute(args.file)
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
    archive = _absolute(args.file)
    ctx = load_context(create=True)  # the version directory, created (with its tag, trust-checked) if need be
    vdir = _local(ctx, "import")
    if not os.path.isdir(vdir):
        raise CliError(f"{vdir} does not exist")
    if ctx.location is not None and not ctx.location.writable:
        raise CliError(f"{vdir} is read-only here: nothing imported")
    try:
        done = _bundle.import_bundle(archive, vdir, _environment(ctx), sha256=args.sha256, force=args.force,
                                     shared=bool(ctx.settings["trust_shared"]), cap=ctx.settings["max_size"])
    except _bundle.Refused as exc:
        raise CliError(f"{args.file} refused: {exc}; nothing imported") from None
    except OSError as exc:
        raise CliError(f"{args.file}: {exc.strerror or exc}; nothing imported") from None
    _reset.record_added(vdir, done.bytes, bool(ctx.settings["trust_shared"]), lines=done.records)
    other = (f"; {plural(done.other_cpu, 'entry was', 'entries were')} built for another CPU: kept with their old "
             "access time, never loaded here") if done.other_cpu else ""
    unknown = (f"; {plural(done.unknown_cpu, 'entry does', 'entries do')} not say for which CPU (no record): "
               "each is loaded only where its key holds this CPU's instruction set") if done.unknown_cpu else ""
    emit(args, f"imported {plural(done.entries, 'entry', 'entries')} ({plural(done.files, 'file')}, "
               f"{human_bytes(done.bytes)}) into {vdir}"
               f"{f'; {done.present} already present, kept' if done.present else ''}{other}{unknown}",
         {"file": args.file, "dir": vdir, "entries": done.entries, "present": done.present, "files": done.files,
          "bytes": done.bytes, "other_cpu": done.other_cpu, "unknown_cpu": done.unknown_cpu})
    return OK


# -- config ---------------------------------------------------------------------------------------


def _key(name: str) -> _settings.Key:
    if name.lower() in ("signing_key", _settings.SIGNING_KEY_ENV.lower()):  # its value is never echoed
        raise CliError(f"the signing key is a secret: it is read from {_settings.SIGNING_KEY_ENV} in the environment "
                       "only, never written to a settings file", USAGE)
    if name not in _settings.KEYS:
        raise CliError(f"unknown key {shown(name)}; known keys: {', '.join(_settings.KEYS)}", USAGE)
    return _settings.KEYS[name]


def _config_get_skipped(args: argparse.Namespace, name: str, resolved: _settings.Resolved, origin: str, written: str,
                        why: str) -> int:
    """``config get`` of a value skipped here: as written, where written, and a note (on stderr) of
    why it does not apply for this user, and what does."""
    unset = _settings.unset_variables(written) if name == "dir" else []
    if unset:
        names = ", ".join(f"${n}" for n in unset)
        why = f"{names} {'is' if len(unset) == 1 else 'are'} not set here"
    instead = f"{resolved.shown()} ({resolved.origin})" if resolved.origin != "default" else "the default"
    note = f"note: {why}, so {name} from {origin} is skipped for you; {instead} applies"
    print(f"gkx-autocache config: {one_line(note)}", file=sys.stderr)
    emit(args, written, {"key": name, "value": resolved.value, "written": written, "origin": origin, "note": note,
                         "effective": {"value": resolved.value, "written": resolved.shown(), "origin": resolved.origin}})
    return OK


def cmd_config(args: argparse.Namespace) -> int:
    if args.action in ("list", "get"):
        settings = load_context().settings
        if args.action == "get":
            name = _key(args.key).name
            resolved = settings.values[name]
            skipped = settings.skipped.get(name)
            if skipped is not None:  # a file shared by users who set its $VARS: shown as written, and why not here
                return _config_get_skipped(args, name, resolved, *skipped)
            emit(args, resolved.shown(), {"key": name, "value": resolved.value, "written": resolved.shown(),
                                          "origin": resolved.origin})
            return OK
        lines = [f"{k:<22} {r.shown():<28} {r.origin}" for k, r in settings.values.items()]
        lines += [f"file {p}: {v.status}" for p, v in settings.files.items()]
        emit(args, "\n".join(lines), {"settings": {k: {"value": r.value, "written": r.shown(), "origin": r.origin}
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
    # Written as typed, so a $VAR the setter lacks is no reason to refuse: other users of the
    # file may set it. Checked with a stand-in for it, so every other fault is still refused.
    unset = _settings.unset_variables(raw) if key.name == "dir" else []
    try:
        cwd = _settings.current_dir()
        value = _settings.validate(key.name, raw, cwd, {**os.environ, **{name: f"/{name}" for name in unset}})
        typed = _policy.as_typed(key.name, raw, value, cwd)
        literal = _policy.format_value(typed)
    except (_settings.BadValue, _policy.Unwritable) as exc:
        raise CliError(f"{key.name}: {exc}; {path} left as it was", USAGE) from None
    try:
        _policy.set_key(path, key.name, literal)
    except _policy.Unwritable as exc:
        raise CliError(str(exc)) from None
    note = None
    if unset:
        names = ", ".join(f"${name}" for name in unset)
        note = (f"note: {names} {'is' if len(unset) == 1 else 'are'} not set for you now, so {key.name} will be a bad "
                f"value for anyone without {'it' if len(unset) == 1 else 'them'} (written as typed)")
        print(f"gkx-autocache config: {note}", file=sys.stderr)
        value = typed  # what was written: its expansion is each reader's
    emit(args, f"{key.name} = {literal} written to {path}",
         {"key": key.name, "value": value, "file": path, **({"note": note} if note else {})})
    return OK


# -- demo -----------------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from gkx_autocache._cli import demo as _demo

    code = _demo.demo(as_json=args.json)
    if code == OK and not args.json:
        ctx = load_context()
        where = ctx.location.version_dir if ctx.location and ctx.location.version_dir else ctx.why_no_dir()
        print(f"a normal run in this environment caches in: {where}")
    return code


# -- the parser -----------------------------------------------------------------------------------


def build_parser() -> Parser:
    parser = Parser(prog="gkx-autocache", description="JAX's persistent compilation cache, on by default.")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--version", action="store_true", help="the versions of gkx-autocache, JAX, jaxlib and Python")
    json_flag = Parser(add_help=False)
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
    explain = add("explain", cmd_explain, "why the last run's compiles missed or were not cached, then older ones")
    explain.add_argument("--since", metavar="AGE", help="only what happened in the last AGE (30m, 12h, 2d)")
    explain.add_argument("--function", metavar="NAME", help="only this function (step, or jit_step)")
    add("ci-key", cmd_ci_key, "a key for a CI cache: changes whenever the entries could stop being valid")
    clear = add("clear", cmd_clear, "remove every entry (a fresh start: the stats and the history of misses too)")
    clear.add_argument("--all-versions", action="store_true", help="every JAX version's directory, not only this one's")
    clear.add_argument("--dry-run", action="store_true", help="say what would be removed, and remove nothing")
    clear.add_argument("--yes", action="store_true", help="do not ask")
    clear.add_argument("--shared", action="store_true", help="the shared level's entries, not the local level's")
    prune = add("prune", cmd_prune, "remove least recently used entries, and say what remains")
    prune.add_argument("--max-size", metavar="SIZE", help="keep the directory under SIZE (default: max_size)")
    prune.add_argument("--older-than", metavar="AGE", help="remove entries unused for AGE (30d, 12h)")
    prune.add_argument("--stale-versions", action="store_true",
                       help="remove directories of JAX versions not installed here and unused for 30 days")
    prune.add_argument("--dry-run", action="store_true", help="say what would be removed, and remove nothing")
    prune.add_argument("--shared", action="store_true",
                       help="the shared level (it has no cap of its own: give --max-size or --older-than)")
    add("verify", cmd_verify, "read back every entry; --repair removes the bad ones").add_argument(
        "--repair", action="store_true", help="remove the corrupt entries, orphan sidecars and stale temporaries found")
    config = add("config", cmd_config, "show or edit the settings files (actions: list, get, set, unset)")
    actions = config.add_subparsers(dest="action", metavar="ACTION", required=True)
    where = Parser(add_help=False)
    group = where.add_mutually_exclusive_group()
    group.add_argument("--venv", action="store_true", help="the environment's policy file (the default)")
    group.add_argument("--user", action="store_true", help="your user config file")
    keys = ", ".join(_settings.KEYS)

    def action(name: str, text: str, writes: bool = True) -> argparse.ArgumentParser:
        """An action; one that writes a file takes --venv or --user (list and get read them all)."""
        return actions.add_parser(name, parents=[where, json_flag] if writes else [json_flag], help=text,
                                  description=text)

    action("list", "every setting: its value as written, and where it comes from", writes=False)
    action("get", "one setting: its value as written", writes=False).add_argument("key", help=f"one of: {keys}")
    setter = action("set", "write a setting into a settings file (validated first; a $VAR kept as typed)")
    setter.add_argument("key", help=f"one of: {keys}")
    setter.add_argument("value", help="the value, as you would write it (5GiB, $SCRATCH/jax, true)")
    action("unset", "remove a setting from a settings file").add_argument("key", help=f"one of: {keys}")
    add("export", cmd_export, "write the entries to one archive (a warm bundle)").add_argument(
        "file", help="the archive to write (a tar)")
    bundle_in = add("import", cmd_import, "merge a warm bundle's entries into the cache")
    bundle_in.add_argument("file", help="the archive to read")
    bundle_in.add_argument("--sha256", metavar="HASH", help="refuse unless the archive has this sha256 (from its author)")
    bundle_in.add_argument("--force", action="store_true", help="import a bundle made for another JAX or platform")
    add("demo", cmd_demo, "run a compile-heavy JAX program cold, then warm")
    parser.commands = tuple(commands.choices)
    return parser


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a path that is not UTF-8, a hostile ledger: escaped, never a traceback
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        return usage_error(parser, exc, sys.argv[1:] if argv is None else argv)
    if args.version:
        args.command = "version"
        return cmd_version(args)
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
        gone = "" if _settings.current_dir() else " (the current directory no longer exists: cd to one that does)"
        return fail(args, f"{exc}{gone}", FAILED)
    except KeyboardInterrupt:
        return FAILED


def usage_error(parser: Parser, exc: UsageError, argv: list[str]) -> int:
    """Bad usage: argparse's usage and message, exit 2; with ``--json`` (spotted among the words,
    since parsing failed), the message as one line and one JSON object instead."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    if not any(len(word) >= 3 and "--json".startswith(word) for word in words):  # argparse takes --js for --json
        argparse.ArgumentParser.error(exc.parser, str(exc))  # prints the usage, exits 2
    command = next((word for word in words if word in parser.commands), None)
    hint = f"gkx-autocache {command} --help" if command else "gkx-autocache --help"
    return fail(argparse.Namespace(command=command, json=True), f"{exc} (see {hint})", USAGE)


def fail(args: argparse.Namespace, message: str, code: int) -> int:
    """The one place an error becomes a message: one line on stderr, and with ``--json`` one
    object on stdout that carries it."""
    line = one_line(message)
    print(f"gkx-autocache {args.command}: {line}" if args.command else f"gkx-autocache: {line}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"version": JSON_VERSION, "command": args.command, "error": line, "exit": code}))
    return code
