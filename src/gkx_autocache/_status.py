"""What ``status`` reports, as one document (its ``--json``; the CLI draws its text from it, and
``gkx_autocache.status()`` returns it): versions, hook, settings with origins, the directory and
its verdicts, the store, the totals, both levels, what needs attention. Never imports ``jax``."""

from __future__ import annotations

import os
import sys
from typing import Any

from gkx_autocache import _adopted, _cache, _entries, _formats, _settings
from gkx_autocache._context import Context, cpu_target, distribution_version, hook_live, start_files
from gkx_autocache._diagnostics import human_bytes
from gkx_autocache._formats import UNKEYED
from gkx_autocache._jax import versions as jax_versions
from gkx_autocache._layout import is_url, version_name
from gkx_autocache._record import locks as _locks
from gkx_autocache._record import show as _show


def effective(ctx: Context) -> dict[str, str]:
    """What each setting comes to in this environment, where its value alone does not say
    (``dir`` unset means a default directory; ``xla_caches`` unset depends on the GPU plugins)."""
    from gkx_autocache._jax_config import gpu_plugin_installed

    settings, location = ctx.settings, ctx.location
    shown = {key: settings.values[key].shown() for key in _settings.KEYS}
    if location is not None and location.version_dir:  # the directory set (or chosen); its version dir is below
        place = location.root or location.version_dir
        default = location.rule.startswith("default: ")  # the origin column says "default"; the value says which
        shown["dir"] = f"{place} ({location.rule.removeprefix('default: ')})" if default else place
    elif location is not None:  # refused: what was set, and that it is not used
        shown["dir"] = f"{settings['dir']} (not used: running uncached)" if settings["dir"] else "none: running uncached"
    cap = settings["max_size"]
    shown["max_size"] = human_bytes(cap) if isinstance(cap, int) and cap else "0 (no cap)"
    if settings["shared"] is None:
        shown["shared"] = "none: one level"
        shown["shared_write"] += " (unused: no shared level)"
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
    if files["gkx_autocache.pth"] is None and not live:  # never "reinstall" what is running
        attention.append("gkx_autocache.pth is not installed in this environment: reinstall gkx-autocache")
    if not live and settings["enabled"] and os.environ.get("GKX_JAX_CACHE", "").strip():
        attention.append("the hook is off in this interpreter (GKX_JAX_CACHE)")
    from gkx_autocache import _isa

    if (target := cpu_target(settings["cpu_target"])).why_host is not None:
        attention.append(target.why_host)
    host = _isa.read()
    cpu = {"isa": host.text(), "source": host.source, "kernel_hides": _isa.kernel_hides(host)}
    unread = host.unread
    if unread is not None:
        attention.append(f"the CPU's instruction set cannot be read here ({unread}): CPU entries are keyed by this host "
                         f"alone ({host.text()}), so no other host loads them, and they are compiled again where the "
                         "host name or machine id changes")

    directory: dict[str, Any] = {"root": None, "version_dir": None, "usable": False}
    present: list[dict[str, Any]] = []
    store = None
    totals = None
    reset_at = 0.0
    location = ctx.location
    if location is not None:
        directory["refused"] = [{"path": root, "why": why} for root, why in location.tried]
        directory["unread"] = location.refused  # JAX's own directory, refused: no entry of it is read
        attention.extend(message for _cause, message in location.problems)
        if location.version_dir:
            vdir = location.version_dir
            directory.update(root=location.root, version_dir=vdir, kind=location.kind, rule=location.rule, usable=True,
                             writable=location.writable, trusted=True if location.local else None,
                             exists=is_url(vdir) or os.path.isdir(vdir))
            store = _store_verdict(location)
            if location.mount is not None:
                directory["mount"] = location.mount.describe()
            if location.packages and (moved := _adopted.moved_since(vdir)) is not None:
                directory["moved"] = moved
            if location.stock:
                attention.append(_cache.STOCK_NOTE.format(dir=vdir))
            if location.local and store.get("explain"):
                attention.append(f"misses are not explained here: {store['explain']}")
            if location.local and store.get("isa"):
                attention.append(str(store["isa"]))
            if location.local and (note := _locks.flock_note(vdir)):
                attention.append(note)
            try:  # a bucket may be unreachable from here: status still reports the rest
                if location.local or location.remote:
                    reading = _show.Reading(vdir)
                    totals = reading.totals()
                    reset_at = reading.summary.reset_at if reading.summary else 0.0
                    if totals is not None and totals.empty and reset_at:
                        totals = None  # "no lookups since the last reset", not a line of zeros
                    if reading.skipped:
                        attention.append(f"{human_bytes(reading.skipped)} of oversized ledgers were not read (a ledger "
                                         "is at most 1 MiB unless someone wrote it by hand)")
                own = [] if is_url(vdir) else [vdir]  # the user's own directory: its entries are in it
                for path in _entries.version_dirs(location.root) if location.root not in (None, vdir) else own:
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
    if ctx.jax_version is not None and (old := jax_versions.unsupported(ctx.jax_version)) is not None:
        attention.append(old)
    from gkx_autocache import _slow_import

    slow = _slow_import.slow_import()
    if slow is not None:
        attention.append(_slow_import.said(slow))
    from gkx_autocache._shared import probe as _probe

    signing = "set (env GKX_JAX_CACHE_SIGNING_KEY)" if _settings.signing_key() else "not set"
    if signing != "not set" and location is not None and location.remote:
        signing = ("set, but it protects nothing here: dir is a bucket, which JAX's stock cache reads without "
                   "checking signatures")
        attention.append(_settings.remote_signing_note(str(location.root)))
    elif os.environ.get(_settings.SIGNING_KEY_ENV) == "":
        # Set but empty: a bad setting, whose attention line is among settings.problems.
        signing = "empty (env GKX_JAX_CACHE_SIGNING_KEY): skipped, as if not set"
    levels = _probe.describe_levels(settings, location, ctx.jax_version, os.environ, probe)
    if levels is not None and levels["shared"]["signing"] == _probe.UNCHECKED:
        attention.append(f"shared {levels['shared']['url']}: signing key {_probe.UNCHECKED}")
    if levels is not None and levels["shared"].get("unused"):
        attention.append(f"{levels['shared']['origin']}: shared {levels['shared']['url']} not used, "
                         f"{levels['shared']['unused']}")
    return {
        "package": distribution_version("gkx-autocache"), "python": sys.version.split()[0],
        "levels": levels, "signing_key": signing,
        "jax": ctx.jax_version, "jaxlib": distribution_version("jaxlib"),
        "start_files": files, "hook_live": live, "cpu": cpu, "settings": values,
        "files": {path: v.status + (f": {v.problem}" if v.problem else "") for path, v in settings.files.items()},
        "directory": directory, "versions_present": present, "store": store,
        "features": features(store) if store and location is not None and location.local else None,
        "stats": _show.totals_dict(totals) if totals else None, "stats_reset_at": reset_at or None,
        "sizes": "on disk: allocated blocks, as du counts them (what max_size caps)", "slow_import": slow,
        "attention": attention,
    }


def features(store: dict[str, Any]) -> dict[str, str | None] | None:
    """What this JAX line gives here, as the last process that configured it found (SPEC §16): each
    feature and why it is missing, None where it works; None before any process recorded it."""
    if not store.get("store"):
        return None
    serving = store["store"] == "gkx-autocache"
    needs = None if serving else "they need the store"
    isa = str(store.get("isa") or "")
    return {"store": None if serving else str(store.get("reason") or "JAX's stock cache serves"),
            "cap": needs, "explain": store.get("explain") or needs,
            "ISA key": isa.removeprefix(UNKEYED) if isa.startswith(UNKEYED) else None, "levels": needs,
            "host callbacks": needs or (store.get("callbacks") if "callbacks" in store
                                        else "not known: recorded by an older gkx-autocache"),
            "rebuild": needs or (store.get("rebuild") if "rebuild" in store
                                 else "not known: recorded by an older gkx-autocache")}


def line_features(ctx: Any) -> tuple[dict[str, str | None] | None, str]:
    """What this JAX line gives here (``--version``), without importing JAX: as the last process
    that configured it with this directory found; or why that is not known."""
    if ctx.jax_version is None:
        return None, "JAX is not installed"
    if (old := jax_versions.unsupported(ctx.jax_version)) is not None:
        return None, old
    location = ctx.location
    if location is None or location.version_dir is None:
        return None, f"not known here: {ctx.why_no_dir()}"
    found = features(_store_verdict(location))
    if found is None:  # no process has recorded them: ask this JAX's seams, in a child (the CLI never imports jax)
        import json
        import subprocess

        try:
            child = subprocess.run([sys.executable, "-c", "import json; from gkx_autocache._jax import probe; "
                                    "print(json.dumps(probe.probe()))"], capture_output=True, text=True, timeout=60,
                                   env={**os.environ, "GKX_JAX_CACHE": "0", "JAX_PLATFORMS": "cpu"})
            found = json.loads(child.stdout.strip().splitlines()[-1])
        except Exception as exc:
            return None, f"not known: this JAX's seams could not be probed ({type(exc).__name__})"
        return found, features_said(found, "this JAX's seams, probed")
    if not location.local:  # a bucket, or a directory the store does not serve: JAX's stock cache, whatever ran
        return found, features_said(found, "for this directory")
    return found, features_said(found)


def features_said(found: dict[str, str | None], source: str = "as the last process here found this JAX") -> str:
    have = [name for name, why in found.items() if why is None]
    lacking: dict[str, list[str]] = {}
    for name, why in found.items():
        if why is not None:
            lacking.setdefault(why, []).append(name)
    said = [", ".join(have)] if have else []
    said += [f"no {', '.join(names)} ({why})" for why, names in lacking.items()]
    return f"{'; '.join(said)} ({source})"


def _store_verdict(location: _cache.Location) -> dict[str, Any]:
    if (reason := location.stock_reason) is not None:
        return {"store": "none" if location.refused else "jax", "reason": reason}
    assert location.version_dir is not None
    if location.mount is not None:
        return {"store": None, "reason": "a bucket mount keeps no records (each run's report line names the "
                                         "directory its store served)"}
    return _formats.read_verdict(location.version_dir) or {"store": None, "reason": "no process has configured JAX with it yet"}


# -- the human text ------------------------------------------------------------------------------
