"""What every command starts from (the settings, the installed JAX, the directory and its kind),
and what ``gkx-autocache status`` reports, gathered into one document: ``status --json`` prints it
as it is, and the human text is drawn from it. Never imports ``jax``."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from gkx_autocache import _cache, _entries, _settings, _store
from gkx_autocache._diagnostics import human_bytes, human_secs, plural
from gkx_autocache._layout import is_url, version_name
from gkx_autocache._record import ledger as _ledger
from gkx_autocache._record import locks as _locks
from gkx_autocache._record import show as _show

JSON_VERSION = 2  # 2: misses and compiles not cached are two counts (misses_by_cause, not_cached_by_reason)


class NoDirectory(Exception):
    """There is no cache directory to act on; the message says why."""


class Context(NamedTuple):
    settings: _settings.Settings
    jax_version: str | None
    location: _cache.Location | None  # None when disabled or JAX is not installed

    @property
    def version_dir(self) -> str:
        if self.location is None or self.location.version_dir is None:
            raise NoDirectory(self.why_no_dir())
        return self.location.version_dir

    @property
    def root(self) -> str | None:
        return self.location.root if self.location else None

    def why_no_dir(self) -> str:
        if not self.settings["enabled"]:
            return f"the cache is disabled ({self.settings.origin('enabled')})"
        if self.jax_version is None:
            return "JAX is not installed in this environment, so there is no version directory"
        if self.location is not None and self.location.problems:
            return self.location.problems[0][1]
        return "no cache directory"


def distribution_version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_context(create: bool = False) -> Context:
    """The settings as a process of this environment would resolve them (from the ``JAX_*``
    variables: the commands do not import jax), and the directory it would use."""
    settings = _settings.resolve(jax_explicit=_settings.jax_explicit(os.environ))
    jax_version = distribution_version("jax")
    location = None
    if jax_version is not None and settings["enabled"]:
        location = _cache.locate(settings, jax_version, create=create)
    return Context(settings, jax_version, location)


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
    """Whether the hook is live in this interpreter: a finder is in place, ``jax`` is not imported
    yet (a finder put in place after it, by a ``.pth`` line that ran late, never fires), and
    ``GKX_JAX_CACHE`` does not say off (the .pth line puts its finder in place either way, and the
    finder reads the variable when ``jax`` is imported)."""
    from gkx_autocache import TARGET, _off, is_finder

    return (not _off(os.environ.get("GKX_JAX_CACHE")) and TARGET not in sys.modules
            and any(is_finder(f) for f in sys.meta_path))


def effective(ctx: Context) -> dict[str, str]:
    """What each setting comes to in this environment, where its value alone does not say
    (``dir`` unset means a default directory; ``xla_caches`` unset depends on the GPU plugins)."""
    from gkx_autocache._configure import gpu_plugin_installed

    settings, location = ctx.settings, ctx.location
    shown = {key: settings.values[key].shown() for key in _settings.KEYS}
    if location is not None and location.version_dir:
        shown["dir"] = f"{location.version_dir} ({location.rule})"
    elif location is not None:
        shown["dir"] = "none: running uncached"
    cap = settings["max_size"]
    shown["max_size"] = human_bytes(cap) if isinstance(cap, int) and cap else "0 (no cap)"
    if settings["shared"] is None:
        shown["shared"] = "none: one level"
    if settings["xla_caches"] is None and not settings.from_jax("xla_caches"):
        if location is not None and location.version_dir and is_url(location.version_dir):
            shown["xla_caches"] = "none (a bucket: XLA's caches cannot open it)"
        elif gpu_plugin_installed():
            shown["xla_caches"] = "JAX's default (a GPU plugin is installed)"
        else:
            shown["xla_caches"] = "none (no GPU plugin installed)"
    return shown


def gather(ctx: Context, probe: bool = True) -> dict[str, Any]:
    """The whole ``status`` document (its ``--json``): versions, hook, settings with origins,
    the directory and its verdicts, the versions present, the store, the totals, both levels
    (``probe``: whether the shared one answers, bounded by its timeout), and what needs attention,
    each a line for the user."""
    settings = ctx.settings
    files = start_files()
    live = hook_live()
    attention: list[str] = []
    shown = effective(ctx)
    values = {k: {"value": r.value, "origin": r.origin, "effective": shown[k]} for k, r in settings.values.items()}
    for key, resolved in settings.values.items():
        if settings.from_jax(key):
            attention.append(f"{resolved.origin} decides {key}: gkx-autocache leaves it as you set it; unset it to use ours")
    attention.extend(message for _cause, message in settings.problems)
    if files["gkx_autocache.pth"] is None:
        attention.append("gkx_autocache.pth is not installed in this environment: reinstall gkx-autocache")
    if not live and settings["enabled"] and os.environ.get("GKX_JAX_CACHE", "").strip():
        attention.append("the hook is off in this interpreter (GKX_JAX_CACHE)")
    from gkx_autocache import _isa

    unread = _isa.unread()
    if unread is not None:
        attention.append(f"the CPU's instruction set cannot be read here ({unread}): CPU entries are keyed by this host "
                         f"alone ({_isa.isa()}), so no other host loads them, and they are compiled again where the "
                         "host name or machine id changes")

    directory: dict[str, Any] = {"root": None, "version_dir": None, "usable": False}
    present: list[dict[str, Any]] = []
    store = None
    totals = None
    reset_at = 0.0
    location = ctx.location
    if location is not None:
        directory["refused"] = [{"path": root, "why": why} for root, why in location.tried]
        attention.extend(message for _cause, message in location.problems)
        if location.version_dir:
            vdir = location.version_dir
            directory.update(root=location.root, version_dir=vdir, kind=location.kind, rule=location.rule, usable=True,
                             writable=location.writable, trusted=True if location.kind == _cache.LOCAL else None,
                             exists=is_url(vdir) or os.path.isdir(vdir))
            store = _store_verdict(location)
            if location.kind == _cache.LOCAL and store.get("explain"):
                attention.append(f"misses are not explained here: {store['explain']}")
            if location.kind == _cache.LOCAL and store.get("isa"):
                attention.append(str(store["isa"]))
            if location.kind == _cache.LOCAL and (note := _locks.flock_note(vdir)):
                attention.append(note)
            try:  # a bucket may be unreachable from here: status still reports the rest
                if location.kind != _cache.OWN:
                    reading = _show.Reading(vdir)
                    totals = reading.totals()
                    reset_at = reading.summary.reset_at if reading.summary else 0.0
                    if totals is not None and totals.empty and reset_at:
                        totals = None  # "no lookups since the last reset", not a line of zeros
                    if reading.skipped:
                        attention.append(f"{human_bytes(reading.skipped)} of oversized ledgers were not read (a ledger "
                                         "is at most 1 MiB unless someone wrote it by hand)")
                for path in _entries.version_dirs(location.root) if location.root else []:
                    found = _entries.count(path)
                    name = os.path.basename(path)
                    present.append({"version": name, "entries": found[0], "bytes": found[1],
                                    "installed": name == version_name(ctx.jax_version or "")})
            except OSError as exc:
                attention.append(f"cannot list the cache: {exc}")
    elif not settings["enabled"]:
        attention.append(f"the cache is disabled by {settings.origin('enabled')}")
    elif ctx.jax_version is None:
        attention.append("JAX is not installed here: pip install 'gkx-autocache[jax]'")
    from gkx_autocache._shared import level as _levels

    signing = "set (env GKX_JAX_CACHE_SIGNING_KEY)" if _settings.signing_key() else "not set"
    if signing != "not set" and location is not None and location.kind == _cache.REMOTE:
        signing = ("set, but it protects nothing here: dir is a bucket, which JAX's stock cache reads without "
                   "checking signatures")
        attention.append(_settings.remote_signing_note(str(location.root)))
    levels = _levels.describe_levels(settings, location, ctx.jax_version, os.environ, probe)
    if levels is not None and levels["shared"]["signing"] == _levels.UNCHECKED:
        attention.append(f"shared {levels['shared']['url']}: signing key {_levels.UNCHECKED}")
    if levels is not None and levels["shared"].get("unused"):
        attention.append(f"{levels['shared']['origin']}: shared {levels['shared']['url']} not used, "
                         f"{levels['shared']['unused']}")
    return {
        "package": distribution_version("gkx-autocache"), "python": sys.version.split()[0],
        "levels": levels, "signing_key": signing,
        "jax": ctx.jax_version, "jaxlib": distribution_version("jaxlib"),
        "start_files": files, "hook_live": live, "settings": values,
        "files": {path: v.status + (f": {v.problem}" if v.problem else "") for path, v in settings.files.items()},
        "directory": directory, "versions_present": present, "store": store,
        "stats": _show.totals_dict(totals) if totals else None, "stats_reset_at": reset_at or None,
        "sizes": "on disk: allocated blocks, as du counts them (what max_size caps)", "attention": attention,
    }


def stats_data(vdir: str) -> dict[str, Any]:
    """What ``stats --json`` prints (less its version and command): the totals since the last reset,
    live processes included (None when there are none), and the costliest functions."""
    reading = _show.Reading(vdir)
    totals = reading.totals()
    reset_at = reading.summary.reset_at if reading.summary else 0.0
    if totals is None or (totals.empty and reset_at):
        return {"dir": vdir, "stats": None, "levels": None, "top_functions": [], "reset_at": reset_at or None}
    top = [{"name": n, "compile_secs": round(s, 3), "helper": h} for n, s, h in _show.top_functions(totals)]
    stats = _show.totals_dict(totals)  # (its levels also at the top of the object: SPEC §14)
    return {"dir": vdir, "stats": stats, "levels": stats["levels"], "top_functions": top,
            "reset_at": reset_at or None}


def _store_verdict(location: _cache.Location) -> dict[str, Any]:
    if location.kind == _cache.OWN:
        return {"store": "jax", "reason": "the directory is the user's own (JAX_COMPILATION_CACHE_DIR)"}
    if location.kind == _cache.REMOTE:
        return {"store": "jax", "reason": "remote directories use JAX's stock cache, uncapped; "
                                          "their trust is the bucket's access policy"}
    assert location.version_dir is not None
    return _store.read_verdict(location.version_dir) or {"store": None, "reason": "no process has used it yet"}


# -- explain ------------------------------------------------------------------------------------------

FIXES = {
    "new": "nothing to fix: its first entry here; the next run is served",
    "changed computation": "nothing to fix when you changed the code, the shapes or jax.config; a value that differs "
                           "on every run (a time, a seed, an id()) closed over by the function makes it miss every "
                           "time: pass it as an argument",
    "changed XLA_FLAGS": "keep XLA_FLAGS (and --xla arguments) the same between runs: every entry depends on them",
    "changed jaxlib": "entries of another jaxlib are never hit: expected after an upgrade",
    "changed JAX": "expected after an upgrade; gkx-autocache prune --stale-versions removes the old directory once "
                   "unused for 30 days",
    "changed backend": "entries of another backend version are never hit: expected after a driver or plugin upgrade",
    "changed devices": "the device kinds or count differ (CUDA_VISIBLE_DEVICES, "
                       "--xla_force_host_platform_device_count, jax_num_cpu_devices): each set has its own entries",
    "changed device assignment": "expected for ranks other than 0 of a multi-process run on CPU (JAX keys the device "
                                 "assignment there; on GPU it does not)",
    "changed compile options": "compile options set in code or jax.config differ between runs",
    "changed compression": "installing or removing zstandard changes every key: keep it the same",
    "changed custom hook": "jax._src.cache_key.custom_hook() returns something else",
    "changed CPU": "expected on another CPU: its entries are built for the CPU that compiled them, and are never "
                   "loaded where they could not run; each CPU keeps its own",
    "before CPU keying": "nothing to fix: once per entry after upgrading to a gkx-autocache that keys CPU entries by "
                         "the CPU's instruction set (or after stock JAX wrote the directory)",
    "cannot tell": "the evidence cannot decide: run your code from a module file (not a notebook cell or python -c) "
                   "to tell functions of one name apart",
    "cannot tell:record": "the evidence cannot decide: entries without a record (stock JAX, an older gkx-autocache, a "
                          "process not finished) are compared once a gkx-autocache process has recorded them",
    "cannot tell:alias": "the evidence cannot decide: import a module one way (model.core), not also by putting its "
                         "folder on sys.path (core), so that its functions have one place",
    "cannot tell:lambda": "the evidence cannot decide: give the function a name (def) to tell it from the file's "
                          "other lambdas",
    "cannot tell:jax": "the evidence cannot decide: nothing to fix if you upgraded JAX; if not, its first entry here",
    "rejected": "the entry could not be loaded; it was compiled again and replaced (gkx-autocache verify checks the rest)",
    "unexplained": "JAX's key parts were not seen for this compile",
    "not process 0": "expected: only process 0 of a multi-process run writes (JAX's rule)",
    "host callbacks": "JAX 0.10 does not write functions with host callbacks (jax.debug.print, pure_callback): keep "
                      "them out of hot functions, or upgrade JAX",
    "read-only directory": "expected: the cache is read-only for you (a baked image)",
}
EVICTED = {"max_size": "the cap is smaller than the working set: raise max_size ({how})",
           "prune": "removed by gkx-autocache prune: nothing to fix (prune less, or raise --max-size)",
           "verify": "removed by gkx-autocache verify --repair because it did not load: nothing to fix",
           "outside": "someone or something outside gkx-autocache removed it (a person, a cleanup job, another tool)"}
EVERY_RUN = ("misses on every run: a value that differs on every run (a time, a seed, an id()) is closed over by the "
             "function or passed as a static argument: pass it as an ordinary (traced) argument")


def fix_for(cause: str, ctx: Context, by: str | None = None, detail: str = "",
            env: Mapping[str, str] = os.environ) -> str:
    """The fix for a cause, naming the source of every setting it names (SPEC §13.1)."""
    short = cause.removeprefix("not cached: ")
    if short == "rejected" and detail.startswith("not signed"):
        return not_signed_fix(ctx, env)
    if short == "evicted":
        return EVICTED.get(by or "max_size", EVICTED["outside"]).format(how=setting_fix(ctx, "max_size", "20GiB"))
    if short == "below min_compile_time_secs":
        return f"lower min_compile_time_secs ({setting_fix(ctx, 'min_compile_time_secs', '0')})"
    if short == "below min_entry_size_bytes":
        return f"lower min_entry_size_bytes ({setting_fix(ctx, 'min_entry_size_bytes', '-1')})"
    return FIXES.get(f"{short}:{by}", FIXES.get(short, ""))


def not_signed_fix(ctx: Context, env: Mapping[str, str]) -> str:
    """A shared entry without a valid signature for this key: compiled here, and replaced on the
    shared level only where ``shared_write`` uploads (``ci``: where CI is set, as here or not)."""
    from gkx_autocache._shared.level import uploads

    write, origin = ctx.settings["shared_write"], ctx.settings.origin("shared_write")
    same_key = "every writer and reader of the shared level must use the same GKX_JAX_CACHE_SIGNING_KEY"
    off = uploads(str(write), env)
    if off is None:
        return (f"compiled here; this process uploads its signed replacement (shared_write = {write}, {origin}); "
                f"{same_key}")
    ci = " (a run with CI set uploads it)" if write == "ci" else ""
    return (f"compiled here and kept in the local level; the shared entry (unsigned, or signed with another key) "
            f"stays, and is rejected again on every machine with this key: {off} ({origin}), so this process uploads "
            f"nothing{ci}; a run with shared_write = always and the key replaces it; {same_key}")


def setting_fix(ctx: Context, key: str, example: str) -> str:
    """How to change a setting where it is set: an environment variable outranks the files, JAX's
    own setting outranks both."""
    origin = ctx.settings.origin(key)
    if origin.startswith("env "):
        return f"it is set by {origin.removeprefix('env ')}, which outranks config set: change it there"
    if origin.startswith("JAX"):
        return f"it is set by {origin}: change it there"
    where = "" if origin == "default" else f"; now set in {origin}"
    return f"gkx-autocache config set {key} {example}{where}"


def explain(ctx: Context, since: float | None = None, function: str | None = None,
            version_dir: str | None = None) -> dict[str, Any]:
    """The last run (when, what, its counts by cause), its misses and uncached compiles grouped by
    cause then function, then older ones with their time. ``since``: seconds back; ``function``: a
    name (``step`` or ``jit_step``)."""
    from gkx_autocache._layout import function_name

    vdir = version_dir or ctx.version_dir
    location = ctx.location
    unavailable = None
    if location is not None and location.kind != _cache.LOCAL:
        unavailable = "misses are explained for a local directory gkx-autocache resolved (not a bucket or JAX's own)"
    elif (verdict := _store.read_verdict(vdir)) is not None and verdict.get("explain"):
        unavailable = str(verdict["explain"])
    local = location is not None and location.kind == _cache.LOCAL
    reading = _show.Reading(vdir) if local else None
    runs = reading.runs() if reading else {}
    last = next(reversed(runs.items()), None)
    last_run = None
    if last is not None:
        run, entry = last
        totals = _ledger.Totals.from_json(entry["totals"])
        last_run = {"run": run, "started": entry["start"], "ended": entry["end"], "label": entry["label"],
                    "processes": entry["processes"], **_show.totals_dict(totals)}
    wanted = None if function is None else {function, f"jit_{function}"}
    cutoff = time.time() - since if since is not None else 0.0
    records = [r for r in (reading.recent() if reading else [])
               if r.get("t", 0.0) >= cutoff and (wanted is None or function_name(r.get("key") or "?-") in wanted)]
    recent_runs = list(runs)[-3:]
    every_run = _every_run(records, recent_runs)
    in_last = [r for r in records if last is not None and r.get("run") == last[0]]
    earlier = [r for r in records if last is None or r.get("run") != last[0]]
    groups = _grouped(in_last, ctx, every_run)
    if last_run is not None and since is None and function is None:
        groups = _whole_run(groups, last_run, ctx)
    # A cache this user cannot write (a baked image) serves their runs but keeps no record of them:
    # what is here is its writers' runs, never this user's last one.
    read_only = local and location is not None and not location.writable
    return {"unavailable": unavailable, "read_only": read_only, "last_run": last_run, "groups": groups,
            "earlier": _grouped(earlier, ctx, every_run), "since": since, "function": function}


def _whole_run(groups: list[dict[str, Any]], last_run: dict[str, Any], ctx: Context) -> list[dict[str, Any]]:
    """Each group of the last run counts what the run counted: a compile repeated in a loop is a
    record once (its repeats are tallied), and only the latest ``RECENT`` records are kept, so the
    records listed by function may be fewer; ``listed`` says how many are."""
    counted = {**last_run["misses_by_cause"],
               **{f"not cached: {reason}": n for reason, n in last_run["not_cached_by_reason"].items()}}
    by_cause = {group["cause"]: group for group in groups}
    for cause, n in counted.items():
        group = by_cause.get(cause)
        if group is None:
            group = by_cause[cause] = {"cause": cause, "count": 0, "functions": [], "fix": fix_for(cause, ctx)}
        if n > group["count"]:
            group["listed"], group["count"] = group["count"], n
    return sorted(by_cause.values(), key=lambda g: (g["cause"].startswith("not cached"), -g["count"]))


def _every_run(records: list[dict[str, Any]], runs: list[str]) -> set[str]:
    """Functions that missed with a changed computation in each of the last three runs."""
    from gkx_autocache._layout import function_name

    if len(runs) < 3:
        return set()
    seen: dict[str, set[str]] = {}
    for record in records:
        if record["e"] == "miss" and record.get("cause") == "changed computation" and record.get("run") in runs:
            seen.setdefault(function_name(record.get("key") or "?-"), set()).add(record["run"])
    return {name for name, found in seen.items() if len(found) == len(runs)}


def _grouped(records: list[dict[str, Any]], ctx: Context, every_run: set[str]) -> list[dict[str, Any]]:
    """Records grouped by cause, then function (the user's functions first, JAX's own helpers
    after): the latest detail of each, how often, when last, and the fix."""
    from gkx_autocache._layout import function_name

    groups: dict[str, dict[str, Any]] = {}

    def add(cause: str, record: dict[str, Any], detail: str) -> None:
        group = groups.setdefault(cause, {"cause": cause, "count": 0, "functions": {}, "fixes": {}})
        group["fixes"][fix_for(cause, ctx, record.get("by"), detail)] = True  # each fix that fits one of its records
        group["count"] += 1
        name = function_name(record.get("key") or "?-")
        fn = group["functions"].setdefault(name, {"name": name, "count": 0, "detail": "", "helper": False})
        fn["count"] += 1
        fn["detail"] = detail
        fn["last"] = record.get("t")
        fn["helper"] = fn["helper"] or bool(record.get("helper"))
        if cause == "changed computation" and name in every_run:
            fn["every_run"] = EVERY_RUN

    for record in records:
        if record["e"] == "miss":
            off = f"; may have been served by the shared level, which was off after {record['off']}" \
                if record.get("off") else ""
            add(record.get("cause") or "unexplained", record, record.get("detail", "") + off)
        else:
            change = f"; its key differs from the entries here: {record['cause']}: {record.get('change', '')}" \
                if record.get("cause") else ""
            add(f"not cached: {record.get('reason') or 'unknown'}", record, record.get("detail", "") + change)
    ordered = sorted(groups.values(), key=lambda g: (g["cause"].startswith("not cached"), -g["count"]))
    for group in ordered:
        group["fix"] = "; ".join(fix for fix in group.pop("fixes") if fix)
        group["functions"] = sorted(group["functions"].values(), key=lambda f: (f["helper"], -f["count"], f["name"]))
    return ordered


# -- the CI key ---------------------------------------------------------------------------------------

def accelerator_plugins() -> str:
    """JAX's accelerator plugins installed here, from metadata (nothing is imported): each changes
    what an entry is built for. ``jax-cuda12-plugin 0.10.2, libtpu 0.0.30``."""
    import importlib.metadata
    import re

    found = set()
    for dist in importlib.metadata.distributions():
        name = str(dist.metadata["Name"] or "")
        if re.fullmatch(r"(?i)(jax[-_](cuda|rocm)\d*[-_](plugin|pjrt)|libtpu([-_]nightly)?)", name):
            found.add(f"{name.lower().replace('_', '-')} {dist.version}")
    return ", ".join(sorted(found)) or "none"


def ci_key() -> tuple[str, dict[str, str]]:
    """A short key that changes whenever the entries could stop being valid, and no more often: the
    host's ISA (the instruction-set flags of the CPU, not every flag: microcode and hypervisor flags
    do not change what an entry runs on), the Python minor version, JAX, jaxlib and accelerator
    plugins, platform and machine, the compression library, XLA_FLAGS and LIBTPU_INIT_ARGS. And its parts."""
    import hashlib

    from gkx_autocache import _isa

    parts = {
        "jax": distribution_version("jax") or "nojax", "jaxlib": distribution_version("jaxlib") or "nojaxlib",
        "plugins": accelerator_plugins(),
        "python": f"{sys.implementation.name} {sys.version_info[0]}.{sys.version_info[1]}", "platform": sys.platform,
        "machine": os.uname().machine if hasattr(os, "uname") else sys.platform, "isa": _isa.isa(),
        "compression": "zstandard" if distribution_version("zstandard") else "zlib",
        # JAX leaves the dump flags out of its key; so does this.
        "xla_flags": " ".join(sorted(f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_dump"))),
    }
    if os.environ.get("LIBTPU_INIT_ARGS"):  # in JAX's key on TPU, as XLA_FLAGS are (a part only where set:
        parts["libtpu_init_args"] = os.environ["LIBTPU_INIT_ARGS"]  # the keys of every other CI stay as they were)
    digest = hashlib.sha256(json_dumps(parts).encode()).hexdigest()[:16]
    return f"{parts['jax']}-{digest}", parts


def json_dumps(data: Any) -> str:
    import json

    return json.dumps(data, sort_keys=True)


# -- the human text ------------------------------------------------------------------------------


def stats_line(t: dict[str, Any]) -> str:
    """One line of totals, as ``stats --json`` names them; misses and compiles not cached are the
    lookups not served, each with its breakdown."""
    rate = f" ({t['hit_rate']:.0%} hit rate)" if t["hit_rate"] is not None else ""
    own = f", {t['own_hits']} of them of a run's own compiles" if t["own_hits"] else ""
    not_cached = f", {t['not_cached']} not cached" if t["not_cached"] else ""
    return (f"{plural(t['hits'], 'hit')}{own}, {plural(t['misses'], 'miss', 'misses')}{rate}{not_cached}, "
            f"{human_secs(t['saved_secs'])} compile CPU time avoided, {human_bytes(t['bytes_read'])} read, "
            f"{human_bytes(t['bytes_written'])} written")


def text(data: dict[str, Any]) -> str:
    files, directory = data["start_files"], data["directory"]
    lines = [
        f"gkx-autocache {data['package']}  Python {data['python']}  JAX {data['jax'] or '(not installed)'}"
        f"  jaxlib {data['jaxlib'] or '(not installed)'}",
        f"hook        {'live in this interpreter' if data['hook_live'] else 'not live in this interpreter'}; "
        f"{files['gkx_autocache.pth'] or 'gkx_autocache.pth NOT installed'}"
        f"{' (+ .start)' if files['gkx_autocache.start'] else ''}",
        "settings",
    ]
    for key, entry in data["settings"].items():
        if len(entry["effective"]) <= 40:
            lines.append(f"  {key:<22} {entry['effective']:<40} {entry['origin']}")
        else:  # a long path: the origin on a line of its own, in its column
            lines += [f"  {key:<22} {entry['effective']}", f"  {'':<22} {'':<40} {entry['origin']}"]
    for path, verdict in data["files"].items():
        lines.append(f"  file {path}: {verdict}")
    lines.append("directory")
    if directory["version_dir"]:
        kind = directory["kind"]
        trust = {_cache.LOCAL: "trusted", _cache.OWN: "trust not checked: not chosen by gkx-autocache",
                 _cache.REMOTE: "remote: trust is the bucket's access policy"}[kind]
        state = ("writable" if directory["writable"] else "read-only") + f", {trust}"
        if directory["root"]:
            lines.append(f"  root     {directory['root']}")
        lines.append(f"  version  {directory['version_dir']}  ({state}{'' if directory['exists'] else ', not created yet'})")
    for refused in directory.get("refused", []):
        lines.append(f"  refused  {refused['path']}: {refused['why']}")
    store = data["store"]
    if store:
        lines.append(f"  store    {store['store'] or 'not recorded yet'}{': ' + store['reason'] if store.get('reason') else ''}")
    for version in data["versions_present"]:
        mark = " (installed)" if version["installed"] else ""
        lines.append(f"  {version['version']:<18} {plural(version['entries'], 'entry', 'entries'):>13}  "
                     f"{human_bytes(version['bytes']):>10} on disk{mark}")
    levels = data.get("levels")
    if levels:
        from gkx_autocache._shared.level import level_lines

        lines.extend(level_lines(levels))
    stats = data["stats"]
    if stats:
        lines.append(f"stats       {stats_line(stats)}")
        if stats.get("levels"):
            from gkx_autocache._shared.level import line

            lines.append(f"            {line(stats['levels'])}")
    elif data.get("stats_reset_at"):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(data["stats_reset_at"]))
        lines.append(f"stats       no lookups since the last reset (stats --reset, {when})")
    else:
        lines.append("stats       none yet: no process has used this directory")
    if data["attention"]:
        lines.append("attention")
        lines.extend(f"  - {a}" for a in data["attention"])
    return "\n".join(lines)
