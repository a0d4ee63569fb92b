"""``gkx-autocache [--json] COMMAND``: the user's window into the cache. Never imports ``jax``
(except ``demo``, which runs it in child processes)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gkx_autocache import _bundle, _cache, _entries, _policy, _settings, _stats, _store

OK, FAILED, USAGE = 0, 1, 2
JSON_VERSION = 1


class CliError(Exception):
    """A failure to report as one line; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = FAILED) -> None:
        super().__init__(message)
        self.code = code


# -- what every command looks at ---------------------------------------------------------------


@dataclass
class Context:
    settings: _settings.Settings
    jax_version: str | None
    choice: _cache.Choice | None

    @property
    def version_dir(self) -> str:
        if self.choice is None or self.choice.version_dir is None:
            raise CliError(self.why_no_dir())
        return self.choice.version_dir

    def why_no_dir(self) -> str:
        if not self.settings["enabled"]:
            return f"the cache is disabled ({self.settings.origin('enabled')})"
        if self.jax_version is None:
            return "JAX is not installed in this environment, so there is no version directory"
        if self.choice is not None and self.choice.problems:
            return self.choice.problems[0][1]
        return "no cache directory"

    @property
    def root(self) -> str | None:
        return self.choice.root if self.choice else None


def distribution_version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_context() -> Context:
    settings = _settings.resolve(jax_explicit=_settings.jax_explicit(os.environ))
    jax_version = distribution_version("jax")
    choice = None
    if jax_version is not None and settings["enabled"]:
        if settings.from_jax("dir"):
            own = str(settings["dir"])  # the user's JAX_COMPILATION_CACHE_DIR: used as is, not checked
            choice = _cache.Choice(version_dir=own, writable=_cache.is_url(own) or os.access(own, os.W_OK))
        else:
            choice = _cache.choose(settings, jax_version, create=False)
    return Context(settings, jax_version, choice)


def version_dirs(root: str) -> list[str]:
    """The ``jax-*`` directories under ``root``."""
    if _cache.is_url(root):
        from gkx_autocache import _remote

        return _remote.version_dirs(root)
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith("jax-"))
    except OSError:
        return []
    return [os.path.join(root, n) for n in names if os.path.isdir(os.path.join(root, n))]


def emit(args: argparse.Namespace, human: str, data: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps({"version": JSON_VERSION, "command": args.command, **data}, default=str))
    else:
        print(human)


def progress(message: str) -> None:
    """A progress line on a terminal's stderr; never mixed into stdout (or --json)."""
    if sys.stderr.isatty():
        print(f"\r{message}", end="", file=sys.stderr, flush=True)


def human_secs(secs: float) -> str:
    return f"{secs:.1f} s" if secs < 120 else f"{secs / 60:.1f} min"


# -- status ------------------------------------------------------------------------------------


def start_files() -> dict[str, str | None]:
    """Where ``gkx_autocache.pth`` and ``.start`` are installed in this environment."""
    import site
    import sysconfig

    folders = [sysconfig.get_paths()["purelib"], *getattr(site, "getsitepackages", list)()]
    found: dict[str, str | None] = {"gkx_autocache.pth": None, "gkx_autocache.start": None}
    for folder in folders:
        for name in found:
            path = os.path.join(folder, name)
            if found[name] is None and os.path.isfile(path):
                found[name] = path
    return found


def hook_live() -> bool:
    from gkx_autocache import is_finder

    return any(is_finder(f) for f in sys.meta_path)


def cmd_status(args: argparse.Namespace) -> int:
    ctx = load_context()
    files = start_files()
    attention: list[str] = []
    settings = {k: {"value": r.value, "origin": r.origin} for k, r in ctx.settings.values.items()}
    for key, resolved in ctx.settings.values.items():
        if resolved.origin.startswith("JAX ("):
            attention.append(f"{resolved.origin} decides {key}: gkx-autocache leaves it as you set it; unset it to use ours")
    for _cause, message in ctx.settings.problems:
        attention.append(message.removeprefix("gkx-autocache: "))
    file_verdicts = {path: v.status + (f": {v.problem}" if v.problem else "") for path, v in ctx.settings.files.items()}
    if files["gkx_autocache.pth"] is None:
        attention.append("gkx_autocache.pth is not installed in this environment: reinstall gkx-autocache")
    live = hook_live()
    if not live and ctx.settings["enabled"] and os.environ.get("GKX_JAX_CACHE", "").strip():
        attention.append("the hook is off in this interpreter (GKX_JAX_CACHE)")

    directory: dict[str, Any] = {"root": None, "version_dir": None, "usable": False}
    present: list[dict[str, Any]] = []
    store = None
    totals = None
    if ctx.choice is not None:
        for root, why in ctx.choice.tried:
            directory.setdefault("refused", []).append({"path": root, "why": why})
        for _cause, message in ctx.choice.problems:
            attention.append(message)
        if ctx.choice.version_dir:
            vdir = ctx.choice.version_dir
            # Our checks ran (and passed) only on a local directory the package chose.
            checked = not ctx.settings.from_jax("dir") and not _cache.is_url(vdir)
            directory.update(root=ctx.choice.root, version_dir=vdir, usable=True, writable=ctx.choice.writable,
                             trusted=True if checked else None, exists=_cache.is_url(vdir) or os.path.isdir(vdir))
            if ctx.settings.from_jax("dir"):
                store = {"store": "jax", "reason": "the directory is the user's own (JAX_COMPILATION_CACHE_DIR)"}
            elif _cache.is_url(vdir):
                store = {"store": "jax", "reason": "remote directories use JAX's stock cache, uncapped; "
                                                  "their trust is the bucket's access policy"}
            else:
                store = _store.read_verdict(vdir) or {"store": None, "reason": "no process has used it yet"}
            try:  # a bucket may be unreachable from here: status still reports the rest
                if not ctx.settings.from_jax("dir"):
                    totals = _stats.read_ledger(vdir)
                for path in version_dirs(ctx.choice.root) if ctx.choice.root else []:
                    found = _entries.scan(path)
                    name = os.path.basename(path)
                    present.append({"version": name, "entries": found.entries, "bytes": found.bytes,
                                    "installed": name == _cache.version_name(ctx.jax_version or "")})
            except OSError as exc:
                attention.append(f"cannot list the cache: {exc}")
    elif not ctx.settings["enabled"]:
        attention.append(f"the cache is disabled by {ctx.settings.origin('enabled')}")
    elif ctx.jax_version is None:
        attention.append("JAX is not installed here: pip install 'gkx-autocache[jax]'")

    stats = _totals_dict(totals) if totals else None
    data = {
        "package": distribution_version("gkx-autocache"), "python": sys.version.split()[0],
        "jax": ctx.jax_version, "jaxlib": distribution_version("jaxlib"),
        "start_files": files, "hook_live": live, "settings": settings, "files": file_verdicts,
        "directory": directory, "versions_present": present, "store": store, "stats": stats, "attention": attention,
    }
    lines = [
        f"gkx-autocache {data['package']}  Python {data['python']}  JAX {ctx.jax_version or '(not installed)'}"
        f"  jaxlib {data['jaxlib'] or '(not installed)'}",
        f"hook        {'live in this interpreter' if live else 'not live in this interpreter'}; "
        f"{files['gkx_autocache.pth'] or 'gkx_autocache.pth NOT installed'}"
        f"{' (+ .start)' if files['gkx_autocache.start'] else ''}",
        "settings",
    ]
    for key, entry in settings.items():
        value = entry["value"]
        shown = _settings.format_size(value) if key == "max_size" and isinstance(value, int) else value
        lines.append(f"  {key:<22} {str(shown):<28} {entry['origin']}")
    for path, verdict in file_verdicts.items():
        lines.append(f"  file {path}: {verdict}")
    lines.append("directory")
    if directory["version_dir"]:
        trust = {True: "trusted", None: "trust not checked: not chosen by gkx-autocache"}[directory["trusted"]]
        if _cache.is_url(directory["version_dir"]):
            trust = "remote: trust is the bucket's access policy"
        state = ("writable" if directory.get("writable") else "read-only") + f", {trust}"
        if directory["root"]:
            lines.append(f"  root     {directory['root']}")
        lines.append(f"  version  {directory['version_dir']}  ({state}{'' if directory['exists'] else ', not created yet'})")
    for refused in directory.get("refused", []):
        lines.append(f"  refused  {refused['path']}: {refused['why']}")
    if store:
        lines.append(f"  store    {store['store'] or 'not recorded yet'}{': ' + store['reason'] if store.get('reason') else ''}")
    for version in present:
        mark = " (installed)" if version["installed"] else ""
        lines.append(f"  {version['version']:<18} {version['entries']:>7} entries  "
                     f"{_stats.human_bytes(version['bytes']):>10}{mark}")
    lines.append(f"stats       {_stats_line(totals) if totals else 'no ledger yet (no process has used this directory)'}")
    if attention:
        lines.append("attention")
        lines.extend(f"  - {a}" for a in attention)
    emit(args, "\n".join(lines), data)
    return OK


def _totals_dict(t: _stats.Totals) -> dict[str, Any]:
    lookups = t.hits + t.misses
    return {"hits": t.hits, "misses": t.misses, "hit_rate": t.hits / lookups if lookups else None,
            "saved_secs": round(t.saved_secs, 3), "bytes_read": t.bytes_read, "bytes_written": t.bytes_written,
            "writes": t.writes}


def _stats_line(t: _stats.Totals) -> str:
    lookups = t.hits + t.misses
    rate = f" ({t.hits / lookups:.0%} hit rate)" if lookups else ""
    return (f"{t.hits} hits, {t.misses} misses{rate}, {human_secs(t.saved_secs)} compile time saved, "
            f"{_stats.human_bytes(t.bytes_read)} read, {_stats.human_bytes(t.bytes_written)} written")


# -- dir, stats --------------------------------------------------------------------------------


def cmd_dir(args: argparse.Namespace) -> int:
    vdir = load_context().version_dir
    emit(args, vdir, {"dir": vdir})
    return OK


def function_name(key: str) -> str:
    """JAX's keys begin with the module name: ``jit_step-<sha256>``."""
    return key.rsplit("-", 1)[0]


def cmd_stats(args: argparse.Namespace) -> int:
    vdir = load_context().version_dir
    if args.reset:
        removed = _stats.remove_ledger(vdir)
        emit(args, f"stats reset ({removed} ledger files removed)", {"reset": True, "removed": removed})
        return OK
    totals = _stats.read_ledger(vdir)
    if totals is None:
        emit(args, f"no ledger yet in {vdir}: no process has used the cache since the last reset",
             {"dir": vdir, "stats": None})
        return OK
    by_function: dict[str, float] = {}
    for key, secs in totals.compile_secs.items():
        by_function[function_name(key)] = by_function.get(function_name(key), 0.0) + secs
    top = sorted(by_function.items(), key=lambda kv: -kv[1])[:10]
    lines = [_stats_line(totals), f"directory {vdir}"]
    if top:
        lines.append("costliest compiles (seconds, summed over shapes):")
        lines.extend(f"  {secs:8.3f}  {name}" for name, secs in top)
    emit(args, "\n".join(lines), {"dir": vdir, "stats": _totals_dict(totals),
                                   "top_functions": [{"name": n, "compile_secs": round(s, 3)} for n, s in top]})
    return OK


# -- clear, prune, verify ----------------------------------------------------------------------


@dataclass
class Removal:
    files: list[str]
    units: int
    bytes: int
    compile_secs: float


def _removal(units: list[_entries.Unit], extra: list[tuple[str, int, float]], compile_secs: dict[str, float]) -> Removal:
    files = [p for u in units for p in u.files] + [t[0] for t in extra]
    return Removal(files, sum(1 for u in units if u.has_entry), sum(u.bytes for u in units) + sum(t[1] for t in extra),
                   sum(compile_secs.get(u.key, 0.0) for u in units))


def _report_removal(args: argparse.Namespace, verb: str, where: str, removal: Removal, extra: dict[str, Any]) -> None:
    would = "would remove" if args.dry_run else verb
    secs = f", {human_secs(removal.compile_secs)} of compile time" if removal.compile_secs else ""
    emit(args, f"{would} {removal.units} entries ({len(removal.files)} files, {_stats.human_bytes(removal.bytes)}{secs})"
               f" from {where}",
         {"dry_run": args.dry_run, "entries": removal.units, "files": len(removal.files), "bytes": removal.bytes,
          "compile_secs": round(removal.compile_secs, 3), "dir": where, **extra})


def _execute(vdir: str, removal: Removal, dry_run: bool) -> None:
    if dry_run or not removal.files:
        return
    try:
        _entries.remove_files(vdir, removal.files)
    except _cache.Refused as exc:
        raise CliError(str(exc)) from None
    _entries.forget_size(vdir)


def _require_tag(vdir: str) -> None:
    """A cache is recognised by its tag before anything is deleted (see ``_cache.has_tag``)."""
    if _cache.has_tag(vdir):
        return
    if not os.path.isdir(vdir):
        raise CliError(f"{vdir} does not exist: nothing to remove")
    raise CliError(f"{vdir} has no gkx-autocache {_cache.TAG_NAME}, so it is not known to be a cache: nothing removed")


def _compile_secs(vdir: str) -> dict[str, float]:
    totals = _stats.read_ledger(vdir)
    return totals.compile_secs if totals else {}


def cmd_clear(args: argparse.Namespace) -> int:
    ctx = load_context()
    targets = [ctx.version_dir]
    if args.all_versions and ctx.root:
        targets = [d for d in version_dirs(ctx.root) if _cache.has_tag(d)] or targets
    if not args.dry_run and not args.yes and sys.stdin.isatty():
        answer = input(f"remove every cache entry in {', '.join(targets)}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            raise CliError("nothing removed")
    for vdir in targets:
        _require_tag(vdir)
        found = _entries.scan(vdir)
        removal = _removal(list(found.units.values()), found.temporary, _compile_secs(vdir))
        _execute(vdir, removal, args.dry_run)
        _report_removal(args, "removed", vdir, removal, {})
    return OK


_AGE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([smhdw])\s*$", re.IGNORECASE)
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> float:
    match = _AGE.match(text)
    if match is None:
        raise CliError(f"--older-than: expected an age like 30d, 12h, 45m, got {text!r}", USAGE)
    return float(match[1]) * _AGE_UNITS[match[2].lower()]


def cmd_prune(args: argparse.Namespace) -> int:
    ctx = load_context()
    vdir = ctx.version_dir
    try:
        cap = _settings.parse_size(args.max_size) if args.max_size is not None else ctx.settings["max_size"]
    except _settings.BadValue as exc:
        raise CliError(f"--max-size: {exc}", USAGE) from None
    older = parse_age(args.older_than) if args.older_than else None
    if os.path.isdir(vdir):  # a directory that exists must carry the tag (a URL always does)
        _require_tag(vdir)
    found = _entries.scan(vdir)
    units = list(found.units.values())
    chosen: list[_entries.Unit] = []
    if older is not None:
        cutoff = time.time() - older
        chosen = [u for u in units if u.last_used < cutoff]
    rest = [u for u in units if u not in chosen]
    if cap:
        chosen += _entries.select_over(rest, cap)
    stale_tmp = [t for t in found.temporary if time.time() - t[2] > _entries.STALE_TMP_SECS]
    removal = _removal(chosen, stale_tmp, _compile_secs(vdir))
    _execute(vdir, removal, args.dry_run)
    stale_versions: list[str] = []
    if args.stale_versions and ctx.root:
        for other in version_dirs(ctx.root):
            if other != vdir and _cache.has_tag(other):
                stale_versions.append(other)
                if not args.dry_run:
                    _remove_version_dir(other)
    _report_removal(args, "removed", vdir, removal, {"max_size": cap, "stale_versions": stale_versions})
    if stale_versions and not args.json:
        would = "would remove" if args.dry_run else "removed"
        print(f"{would} directories of JAX versions not installed: {', '.join(stale_versions)}")
    return OK


def _remove_version_dir(vdir: str) -> None:
    """Everything the package put there, then the directory itself if nothing else is left."""
    found = _entries.scan(vdir)
    _entries.remove_files(vdir, [p for u in found.units.values() for p in u.files] + [t[0] for t in found.temporary])
    if _cache.is_url(vdir):
        _stats.remove_ledger(vdir)
        return
    import shutil

    shutil.rmtree(os.path.join(vdir, _cache.META_DIR), ignore_errors=True)  # rmtree does not follow links
    try:
        os.unlink(os.path.join(vdir, _cache.TAG_NAME))
        os.rmdir(vdir)
    except OSError:
        pass


def check_entry(path: str) -> str | None:
    """Why the entry cannot be loaded, or None. Decompresses without importing JAX."""
    from gkx_autocache._store import _read, compression_of

    if _cache.is_url(path):
        from gkx_autocache import _remote

        data = _remote.read_bytes(path)
    else:
        data = _read(path)
    if data is None:
        return "unreadable"
    kind = compression_of(data)
    try:
        if kind == "zlib":
            import zlib

            payload = zlib.decompress(data)
        elif kind == "zstd":
            try:
                import zstandard  # type: ignore[import-not-found]
            except ImportError:
                return None  # cannot check here; JAX with zstandard will
            payload = zstandard.ZstdDecompressor().decompress(data)
        else:
            return "not a compressed JAX entry"
    except Exception as exc:
        return f"does not decompress ({exc})"
    return None if len(payload) > 4 else "empty executable"


def cmd_verify(args: argparse.Namespace) -> int:
    vdir = load_context().version_dir
    found = _entries.scan(vdir)
    corrupt, orphans = [], []
    units = list(found.units.values())
    for i, unit in enumerate(units):
        if i % 1000 == 0:
            progress(f"verify: {i}/{len(units)} entries checked")
        entry = next((p for p in unit.files if p.endswith(_cache.ENTRY_SUFFIX)), None)
        if entry is None:
            orphans.extend(unit.files)
            continue
        why = check_entry(entry)
        if why:
            corrupt.append((unit, why))
    progress("")
    stale = [t[0] for t in found.temporary if time.time() - t[2] > _entries.STALE_TMP_SECS]
    doomed = [p for u, _ in corrupt for p in u.files] + orphans + stale + found.links
    if args.repair and doomed:
        _require_tag(vdir)
        _entries.remove_files(vdir, doomed)
    lines = [f"verified {len(units) - len(orphans)} entries in {vdir}: {len(corrupt)} corrupt, "
             f"{len(orphans)} orphan sidecars, {len(stale)} stale temporary files, {len(found.links)} links"]
    lines += [f"  corrupt  {os.path.basename(u.key)}: {why}" for u, why in corrupt]
    lines += [f"  orphan   {os.path.basename(p)}" for p in orphans]
    lines += [f"  stale    {os.path.basename(p)}" for p in stale]
    lines += [f"  link     {os.path.basename(p)} (never read)" for p in found.links]
    if doomed:
        lines.append("removed them" if args.repair else "run verify --repair to remove them")
    emit(args, "\n".join(lines), {
        "dir": vdir, "entries": len(units) - len(orphans), "repaired": bool(args.repair and doomed),
        "corrupt": [{"key": u.key, "why": why} for u, why in corrupt], "orphans": orphans,
        "stale_temporary": stale, "links": found.links,
    })
    return FAILED if doomed and not args.repair else OK


# -- export, import: warm bundles ---------------------------------------------------------------


def _environment(ctx: Context) -> dict[str, Any]:
    return _bundle.environment(ctx.jax_version, distribution_version("jaxlib"))


def _local(vdir: str, command: str) -> str:
    if _cache.is_url(vdir):
        raise CliError(f"{command} works on local directories; {vdir} is remote (copy objects with your bucket's tools)")
    return vdir


def cmd_export(args: argparse.Namespace) -> int:
    ctx = load_context()
    vdir = _local(ctx.version_dir, "export")
    if not os.path.isdir(vdir):
        raise CliError(f"{vdir} does not exist: nothing to export")
    archive = os.path.abspath(args.file)
    try:
        done = _bundle.export(vdir, archive, _environment(ctx))
    except OSError as exc:
        raise CliError(f"{archive} not written: {exc.strerror or exc}") from None
    emit(args, f"exported {done.entries} entries ({done.files} files, {_stats.human_bytes(done.bytes)}) from {vdir}"
               f" to {archive}\nsha256 {done.sha256}",
         {"file": archive, "dir": vdir, "entries": done.entries, "files": done.files, "bytes": done.bytes,
          "sha256": done.sha256, **_environment(ctx)})
    return OK


def _import_target(ctx: Context) -> str:
    """The version directory, created (with its tag, trust-checked) if need be."""
    if ctx.settings.from_jax("dir"):
        vdir = _local(ctx.version_dir, "import")
        if not os.path.isdir(vdir):
            raise CliError(f"{vdir} does not exist")
        return vdir
    if ctx.jax_version is None or not ctx.settings["enabled"]:
        raise CliError(ctx.why_no_dir())
    _local(ctx.version_dir, "import")
    choice = _cache.choose(ctx.settings, ctx.jax_version, create=True)
    if choice.version_dir is None:
        raise CliError(choice.problems[0][1] if choice.problems else "no usable cache directory")
    if not choice.writable:
        raise CliError(f"{choice.version_dir} is read-only here: nothing imported")
    return choice.version_dir


def cmd_import(args: argparse.Namespace) -> int:
    ctx = load_context()
    vdir = _import_target(ctx)
    try:
        done = _bundle.import_bundle(args.file, vdir, _environment(ctx), sha256=args.sha256, force=args.force,
                                     shared=bool(ctx.settings["trust_shared"]))
    except _bundle.Refused as exc:
        raise CliError(f"{args.file} refused: {exc}; nothing imported") from None
    except OSError as exc:
        raise CliError(f"{args.file}: {exc.strerror or exc}; nothing imported") from None
    _entries.forget_size(vdir)
    emit(args, f"imported {done.entries} entries ({done.files} files, {_stats.human_bytes(done.bytes)}) into {vdir}"
               f"{f'; {done.present} already present, kept' if done.present else ''}",
         {"file": args.file, "dir": vdir, "entries": done.entries, "present": done.present, "files": done.files,
          "bytes": done.bytes})
    return OK


# -- config ------------------------------------------------------------------------------------


def _config_file(args: argparse.Namespace) -> str:
    return _policy.user_path() if args.user else _policy.policy_path()


def _key(name: str) -> _settings.Key:
    if name not in _settings.KEYS:
        raise CliError(f"unknown key {name!r}; known keys: {', '.join(_settings.KEYS)}", USAGE)
    return _settings.KEYS[name]


def cmd_config(args: argparse.Namespace) -> int:
    if args.action == "list" or args.action == "get":
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
    path = _config_file(args)
    if args.action == "unset":
        _policy.set_key(path, key.name, None)
        emit(args, f"{key.name} removed from {path}", {"key": key.name, "file": path})
        return OK
    raw: str = args.value
    try:
        value = _settings.validate(key.name, raw, os.getcwd())
    except _settings.BadValue as exc:
        raise CliError(f"{key.name}: {exc}; {path} left as it was", USAGE) from None
    literal = _policy.format_value(raw.strip() if key.name == "max_size" else value)
    _policy.set_key(path, key.name, literal)
    emit(args, f"{key.name} = {literal} written to {path}", {"key": key.name, "value": value, "file": path})
    return OK


# -- demo --------------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    from gkx_autocache import _demo

    code = _demo.demo(as_json=args.json)
    if code == OK and not args.json:
        ctx = load_context()
        where = ctx.choice.version_dir if ctx.choice and ctx.choice.version_dir else ctx.why_no_dir()
        print(f"a normal run in this environment caches in: {where}")
    return code


# -- the parser --------------------------------------------------------------------------------


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

    add("status", cmd_status, "versions, hook, settings with origins, directory, store, stats (the default)")
    add("dir", cmd_dir, "print the version directory, bare")
    add("stats", cmd_stats, "hits, misses, time saved across processes").add_argument("--reset", action="store_true")
    clear = add("clear", cmd_clear, "remove every entry")
    clear.add_argument("--all-versions", action="store_true", help="every JAX version's directory")
    clear.add_argument("--dry-run", action="store_true")
    clear.add_argument("--yes", action="store_true", help="do not ask")
    prune = add("prune", cmd_prune, "remove least recently used entries")
    prune.add_argument("--max-size", metavar="SIZE", help="keep the directory under SIZE (default: max_size)")
    prune.add_argument("--older-than", metavar="AGE", help="remove entries unused for AGE (30d, 12h)")
    prune.add_argument("--stale-versions", action="store_true", help="remove directories of JAX versions not installed")
    prune.add_argument("--dry-run", action="store_true")
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
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args.command, args.func = "status", cmd_status
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"gkx-autocache {args.command}: {' '.join(str(exc).split())}", file=sys.stderr)
        return exc.code
    except OSError as exc:  # a remote directory's failures arrive as one line (_remote.RemoteError)
        print(f"gkx-autocache {args.command}: {exc}", file=sys.stderr)
        return FAILED
    except KeyboardInterrupt:
        return FAILED
