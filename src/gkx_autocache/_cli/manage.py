"""The commands that change the cache: ``clear``, ``prune``, ``verify`` (``--repair``), and warm
bundles (``export``, ``import``). A directory is recognised by its tag before anything is removed,
and a removal is reported only once it happened."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

from gkx_autocache import _bundle, _context, _entries, _isa, _remove, _settings
from gkx_autocache._cli.output import FAILED, OK, USAGE, CliError, counter, emit, progress
from gkx_autocache._context import Context, load_context, refuse_skipped_dir
from gkx_autocache._diagnostics import human_bytes, human_secs, plural, shown
from gkx_autocache._layout import key_match
from gkx_autocache._record import reset as _reset


def _carry_out(args: argparse.Namespace, removal: _entries.Removal, extra: dict[str, Any] | None = None,
               remains: bool = False, level: Level | None = None) -> None:
    """Remove (unless ``--dry-run``) and report one version directory's removal, or with ``level``
    the shared level's (through its backend); with ``remains``, what is left (or would be) too."""
    if not args.dry_run and level is not None:
        from gkx_autocache._shared import upkeep

        try:
            upkeep.execute(level.backend, removal, level.timeout, counter(args, args.command))
        except upkeep.Failed as exc:
            raise CliError(f"{args.command} --shared: {exc}") from None
    elif not args.dry_run:
        try:
            done = _entries.execute(removal, counter(args, args.command))
        except _remove.RemovalRefused as exc:
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
    """A cache is recognised by its tag before anything is deleted (see ``_remove.has_tag``)."""
    if _remove.has_tag(vdir):
        return
    if not os.path.isdir(vdir):
        raise CliError(f"{vdir} does not exist: nothing to remove")
    raise CliError(f"{vdir} has no gkx-autocache CACHEDIR.TAG, so it is not known to be a cache: nothing removed")


class Level(NamedTuple):
    """The shared level as ``--shared`` acts on it: the backend a run uses, and its bound."""

    backend: Any
    timeout: float


@contextlib.contextmanager
def _shared(ctx: Context, command: str) -> Iterator[Level]:
    """The shared level (SPEC §14), for ``--shared``: the backend a run would use (its client,
    credentials and proxies), its connections closed after."""
    from gkx_autocache._backends.choose import backend_for, row_for

    shared = ctx.settings["shared"]
    if shared is None:
        raise CliError(f"{command} --shared: no shared level is set (GKX_JAX_CACHE_SHARED, or shared in a settings file)")
    if ctx.jax_version is None:
        raise CliError(ctx.why_no_dir())
    ctx.store_dir(f"{command} --shared")  # levels are the store's: none on Windows
    if (why := row_for(shared).upkeep) is not None:
        raise CliError(f"{command} --shared: {shared} is {why}")
    backend = backend_for(shared, ctx.jax_version, bool(ctx.settings["trust_shared"]), os.environ,
                          bool(ctx.settings["shared_credentials_over_http"]))
    try:
        yield Level(backend, ctx.settings["shared_timeout"])
    finally:
        backend.forget()  # its kept connections closed


def _planned(command: str, level: Level, **how: Any) -> _entries.Removal:
    from gkx_autocache._shared import upkeep

    try:
        return upkeep.plan(level.backend, level.timeout, **how)
    except upkeep.Failed as exc:
        raise CliError(f"{command} --shared: {exc}") from None


def cmd_clear(args: argparse.Namespace) -> int:
    ctx = load_context()
    if args.shared:  # entries and their sidecars only; the shared level keeps no bookkeeping
        with _shared(ctx, "clear") as level:
            _confirm(args, level.backend.where)
            _carry_out(args, _planned("clear", level, everything=True), {"shared": True}, level=level)
        return OK
    refuse_skipped_dir(ctx, "clear")
    if ctx.location is not None and ctx.location.stock:
        every = [d for d in _entries.version_dirs(ctx.root) if _remove.has_tag(d)] if args.all_versions and ctx.root else []
        return _clear_stock(args, every or [ctx.version_dir])
    targets = [ctx.version_dir]
    if args.all_versions and ctx.root:
        targets = [d for d in _entries.version_dirs(ctx.root) if _remove.has_tag(d)] or targets
    _confirm(args, ", ".join(targets))
    kept = ctx.location is None or ctx.location.mount is None  # a bucket mount keeps no totals to reset
    for vdir in targets:
        if os.path.isdir(vdir):  # one never used has nothing to remove (a URL is always tagged)
            _require_tag(vdir)
        _carry_out(args, _entries.plan_clear(vdir), {"totals_reset": kept and not args.dry_run})
        if kept and not args.dry_run:  # a fresh start: the totals of what was cleared go too
            _reset.reset(vdir, bool(ctx.settings["trust_shared"]), forget=True)
            if not args.json:
                print(f"stats of {vdir} reset")
    return OK


def _confirm(args: argparse.Namespace, where: str) -> None:
    """``clear`` asks first, unless ``--yes`` or ``--dry-run``, and goes on only on a yes, as apt and
    pip do: from a terminal or a pipe (``echo n |`` was not read, and cleared, exit 0: issue 71); the
    end of input, or none (``< /dev/null``, a CI step), is a no. The question goes to stderr, so
    that ``--json`` keeps stdout one object."""
    if args.dry_run or args.yes:
        return
    print(f"remove every cache entry in {where}? [y/N] ", end="", file=sys.stderr, flush=True)
    try:
        answer = sys.stdin.readline() if sys.stdin is not None else ""
    except (OSError, ValueError):  # no standard input at all (closed)
        answer = ""
    if not answer.endswith("\n") or not _isatty(sys.stdin):
        print(file=sys.stderr)  # (no terminal echoed the answer's newline: what follows starts a line of its own)
    if answer.strip().lower() not in ("y", "yes"):
        raise CliError("nothing removed: answer y, or give --yes")


def _isatty(stream: object) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False


def _clear_stock(args: argparse.Namespace, targets: list[str]) -> int:
    """Windows, where JAX's own cache serves the directory (``_cache.windows``): its entries are
    JAX's files, named by key; nothing else in it is touched, and no records are kept to reset."""
    for vdir in targets:
        if os.path.isdir(vdir):
            _require_tag(vdir)
    _confirm(args, ", ".join(targets))
    lines, done = [], []
    for vdir in targets:
        files = total = 0
        entries: set[str] = set()
        with contextlib.suppress(FileNotFoundError), os.scandir(vdir) as found:
            for item in found:
                match = key_match(item.name)
                if match is None or not item.is_file(follow_symlinks=False):
                    continue
                size = item.stat(follow_symlinks=False).st_size
                if not args.dry_run:
                    try:
                        os.unlink(item.path)
                    except OSError as exc:
                        raise CliError(f"{item.path} not removed: {exc.strerror or exc}") from None
                files, total = files + 1, total + size
                entries.add(match[0])
        verb = "would remove" if args.dry_run else "removed"
        lines.append(f"{verb} {plural(len(entries), 'entry', 'entries')} ({plural(files, 'file')}, {human_bytes(total)}) "
                     f"from {vdir}")
        done.append({"dir": vdir, "entries": len(entries), "files": files, "bytes": total})
    emit(args, "\n".join(lines), {**done[0], "dirs": done, "dry_run": bool(args.dry_run)})
    return OK


def cmd_prune(args: argparse.Namespace) -> int:
    ctx = load_context()
    if args.shared:
        return _prune_shared(args, ctx)
    refuse_skipped_dir(ctx, "prune")
    vdir = ctx.store_dir("prune")
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
        stale = [d for d in _entries.version_dirs(ctx.root) if _remove.has_tag(d) and _entries.stale(d, installed)]
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
    if args.max_size is None and args.older_than is None or args.stale_versions:
        raise CliError("prune --shared: the shared level has no cap of its own (max_size is the local level's); give "
                       "--max-size or --older-than (not --stale-versions), or let a bucket lifecycle rule expire old "
                       "objects", USAGE)
    try:
        cap = _settings.parse_size(args.max_size) if args.max_size is not None else 0
        older = _settings.parse_age(args.older_than) if args.older_than else None
    except _settings.BadValue as exc:
        raise CliError(f"prune --shared: {exc}", USAGE) from None
    with _shared(ctx, "prune") as level:
        _carry_out(args, _planned("prune", level, cap=cap, older_than=older), {"max_size": cap, "shared": True},
                   level=level)
    return OK


def cmd_verify(args: argparse.Namespace) -> int:
    ctx = load_context()
    if args.repair:
        refuse_skipped_dir(ctx, "verify --repair")
    vdir = ctx.store_dir("verify")
    result = _entries.verify(vdir, None if getattr(args, "quiet", False) else progress)
    doomed = result.doomed
    left: list[str] = []  # directories named like entries that hold something: the user's to remove
    if args.repair and (doomed or result.doomed_dirs):
        _require_tag(vdir)
        try:
            done = _remove.remove_files(vdir, doomed)
            left = _remove.remove_empty_dirs(vdir, result.doomed_dirs)
        except _remove.RemovalRefused as exc:
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
    return _bundle.environment(ctx.jax_version, _context.distribution_version("jaxlib"))


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
    vdir = ctx.store_dir(command)
    if ctx.location is not None and ctx.location.remote:
        raise CliError(f"{command} works on local directories; {vdir} is remote (copy objects with your bucket's tools)")
    return vdir


def cmd_export(args: argparse.Namespace) -> int:
    ctx = load_context()
    vdir = _local(ctx, "export")
    if not os.path.isdir(vdir):
        raise CliError(f"{vdir} does not exist: nothing to export")
    archive = _absolute(args.file)
    try:
        done = _bundle.export(vdir, archive, _environment(ctx), counter(args, "export"))
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
    target = _context.cpu_target(ctx.settings["cpu_target"])
    try:
        done = _bundle.import_bundle(archive, vdir, _environment(ctx), sha256=args.sha256, force=args.force,
                                     team=bool(ctx.settings["trust_shared"]), cap=ctx.settings["max_size"],
                                     loads=(_isa.isa(), *([target.isa_text()] if target.level else [])),
                                     progress=counter(args, "import"))
    except _bundle.BundleRefused as exc:
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

