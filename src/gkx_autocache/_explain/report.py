"""What ``gkx-autocache explain`` (and ``gkx_autocache.explain()``) reports: the last run and its
counts, its misses and uncached compiles grouped by cause then function, older ones after; and each
cause's fix (``causes.FIXES``), naming where the setting it names is set. Never imports ``jax``."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any, Protocol

from gkx_autocache import _cache, _formats, _settings
from gkx_autocache import _causes as causes
from gkx_autocache._layout import function_name
from gkx_autocache._record import ledger as _ledger
from gkx_autocache._record import show as _show


class Context(Protocol):
    """What the report reads of a command's context (``_cli.context.Context``)."""

    @property
    def settings(self) -> _settings.Settings: ...

    @property
    def location(self) -> _cache.Location | None: ...

    @property
    def version_dir(self) -> str: ...


def fix_for(cause: str, ctx: Context, by: str | None = None, detail: str = "",
            env: Mapping[str, str] = os.environ, origin: str | None = None) -> str:
    """The fix for a cause, naming the source of every setting it names (SPEC §13.1): ``origin``,
    where the run recorded the source it used, else this command's."""
    short = cause.removeprefix(causes.NOT_CACHED)
    if short == causes.REJECTED and detail.startswith("not signed"):
        return not_signed_fix(ctx, env)
    if short == causes.EVICTED:
        return causes.EVICTED_BY.get(by or "max_size", causes.EVICTED_BY["outside"]).format(
            how=setting_fix(ctx, "max_size", "20GiB"))
    if short == causes.BELOW_MIN_COMPILE_TIME:
        return f"lower min_compile_time_secs ({setting_fix(ctx, 'min_compile_time_secs', '0', origin)})"
    if short == causes.BELOW_MIN_ENTRY_SIZE:
        return f"lower min_entry_size_bytes ({setting_fix(ctx, 'min_entry_size_bytes', '-1', origin)})"
    if short == causes.HOST_CALLBACKS:
        return causes.callbacks_fix(by, detail)
    if short == causes.CHANGED_JAX or (short == causes.CANNOT_TELL and by == "jax"):
        return upgrade_fix(ctx, causes.FIXES.get(f"{short}:{by}", causes.FIXES.get(short, "")))
    return causes.FIXES.get(f"{short}:{by}", causes.FIXES.get(short, ""))


def upgrade_fix(ctx: Context, fix: str) -> str:
    """After a JAX upgrade: entries never carry across JAX versions, and what the other versions'
    directories hold, which ``prune --stale-versions`` frees once each is unused for 30 days."""
    from gkx_autocache import _entries
    from gkx_autocache._diagnostics import human_bytes

    location = ctx.location
    if location is None or location.root is None or location.version_dir is None:
        return fix
    others = [d for d in _entries.version_dirs(location.root) if d != location.version_dir]
    held = [f"{os.path.basename(d)}/ ({human_bytes(_entries.count(d)[1])})" for d in others[-3:]]
    if not held:
        return fix
    frees = (f"entries never carry across JAX versions; gkx-autocache prune --stale-versions frees {', '.join(held)} "
             "once unused for 30 days")
    return f"expected after an upgrade: {frees}" if fix == causes.FIXES[causes.CHANGED_JAX] else f"{fix}; if you upgraded: {frees}"


def not_signed_fix(ctx: Context, env: Mapping[str, str]) -> str:
    """A shared entry without a valid signature for this key: compiled here, and replaced on the
    shared level only where ``shared_write`` uploads (``ci``: where CI is set, as here or not)."""

    write, origin = ctx.settings["shared_write"], ctx.settings.origin("shared_write")
    same_key = "every writer and reader of the shared level must use the same GKX_JAX_CACHE_SIGNING_KEY"
    off = _settings.no_uploads(str(write), env)
    if off is None:
        return (f"compiled here; this process uploads its signed replacement (shared_write = {write}, {origin}); "
                f"{same_key}")
    ci = " (a run with CI set uploads it)" if write == "ci" else ""
    return (f"compiled here and kept in the local level; the shared entry (unsigned, or signed with another key) "
            f"stays, and is rejected again on every machine with this key: {off} ({origin}), so this process uploads "
            f"nothing{ci}; a run with shared_write = always and the key replaces it; {same_key}")


def setting_fix(ctx: Context, key: str, example: str, origin: str | None = None) -> str:
    """How to change a setting where it is set (``origin``: as the run found it, else as this
    command does): an environment variable outranks the files, JAX's own setting outranks both;
    ``config set`` writes the environment's policy file, which outranks the user's."""
    from gkx_autocache import _policy

    origin = origin or ctx.settings.origin(key)
    if origin.startswith("env "):
        return f"it is set by {origin.removeprefix('env ')}, which outranks config set: change it there"
    if origin.startswith(("JAX", "jax.config")):
        return f"it is set by {origin}: change it there"
    policy = _policy.policy_path()
    where = ("" if origin in ("default", policy) else
             f"; now set in {origin}, which the policy file outranks")
    return f"gkx-autocache config set {key} {example} (writes {policy}){where}"


def explain(ctx: Context, since: float | None = None, function: str | None = None,
            version_dir: str | None = None) -> dict[str, Any]:
    """The last run (when, what, its counts by cause), its misses and uncached compiles grouped by
    cause then function, then older ones with their time. ``since``: seconds back; ``function``: a
    name (``step`` or ``jit_step``)."""
    vdir = version_dir or ctx.version_dir
    location = ctx.location
    unavailable = None
    verdict = None
    if location is not None and not location.local:
        unavailable = "misses are explained for a local directory gkx-autocache resolved (not a bucket or JAX's own)"
    elif (verdict := _formats.read_verdict(vdir)) is not None and verdict.get("explain"):
        unavailable = str(verdict["explain"])
    local = location is not None and location.local
    reading = _show.Reading(vdir) if local else None
    runs = reading.runs() if reading else {}
    last = next(reversed(runs.items()), None)
    last_run = None
    if last is not None:
        run, entry = last
        totals = _ledger.Totals.from_json(entry["totals"])
        last_run = {"run": run, "started": entry["start"], "ended": entry["end"], "label": entry["label"],
                    "processes": entry["processes"], **_show.totals_dict(totals)}
        # Runs JAX's own cache served since keep no records: the last one recorded is not the last run.
        if verdict is not None and verdict.get("store") != "gkx-autocache" and \
                (since_then := _formats.verdict_written(vdir)) > float(entry["end"] or entry["start"] or 0.0):
            last_run["stale"] = {"since": since_then, "store": verdict.get("store"), "why": verdict.get("reason")}
    wanted = None if function is None else {function, f"jit_{function}"}
    cutoff = time.time() - since if since is not None else 0.0
    recent = reading.recent() if reading else []
    records = [r for r in recent
               if r.get("t", 0.0) >= cutoff and (wanted is None or function_name(r.get("key") or "?-") in wanted)]
    # Over the last runs whatever the window (--since) or the function asked: a window that holds
    # the last run alone still shows a function that misses on every run.
    every_run = _every_run(recent, list(runs)[-3:])
    in_last = [r for r in records if last is not None and r.get("run") == last[0]]
    earlier = [r for r in records if last is None or r.get("run") != last[0]]
    groups = _grouped(in_last, ctx, every_run)
    if last_run is not None and since is None and function is None:
        groups = _whole_run(groups, last_run, ctx)
    # A cache this user cannot write (a baked image) serves their runs but keeps no record of them:
    # what is here is its writers' runs, never this user's last one.
    read_only = local and location is not None and not location.writable
    for group in groups if unavailable else []:  # the misses JAX's key parts were not seen for: why not
        if group["cause"] == causes.UNEXPLAINED:
            group["fix"] = f"none here: explanations are unavailable ({unavailable})"
    from gkx_autocache._slow_import import slow_import

    return {"unavailable": unavailable, "read_only": read_only, "last_run": last_run, "groups": groups,
            "earlier": _grouped(earlier, ctx, every_run), "since": since, "function": function,
            "slow_import": slow_import()}


def _whole_run(groups: list[dict[str, Any]], last_run: dict[str, Any], ctx: Context) -> list[dict[str, Any]]:
    """Each group of the last run counts what the run counted: a compile repeated in a loop is a
    record once (its repeats are tallied), and only the latest ``RECENT`` records are kept, so the
    records listed by function may be fewer; ``listed`` says how many are."""
    counted = {**last_run["misses_by_cause"],
               **{causes.not_cached(reason): n for reason, n in last_run["not_cached_by_reason"].items()}}
    by_cause = {group["cause"]: group for group in groups}
    for cause, n in counted.items():
        group = by_cause.get(cause)
        if group is None:
            group = by_cause[cause] = {"cause": cause, "count": 0, "functions": [], "fix": fix_for(cause, ctx)}
        if n > group["count"]:
            group["listed"], group["count"] = group["count"], n
    return sorted(by_cause.values(), key=lambda g: (g["cause"].startswith(causes.NOT_CACHED), -g["count"]))


def _every_run(records: list[dict[str, Any]], runs: list[str]) -> set[str]:
    """Functions that missed with a changed computation in each of the last three runs with the
    same inputs and nothing changed between the runs (the files of its code, the command line, the
    environment: the miss's ``rerun`` digest): a value that differs on every run is closed over. An
    edit between the runs, or another shape each time (a test's random choice), is not that."""
    if len(runs) < 3:
        return set()
    seen: dict[str, dict[str, set[str]]] = {}  # function -> rerun digest -> the runs that missed so
    for record in records:
        if (record["e"] == "miss" and record.get("cause") == causes.CHANGED_COMPUTATION and record.get("run") in runs
                and record.get("rerun")):
            by = seen.setdefault(function_name(record.get("key") or "?-"), {})
            by.setdefault(record["rerun"], set()).add(record["run"])
    return {name for name, by in seen.items() if any(len(found) == len(runs) for found in by.values())}


def _grouped(records: list[dict[str, Any]], ctx: Context, every_run: set[str]) -> list[dict[str, Any]]:
    """Records grouped by cause, then function (the user's functions first, JAX's own helpers
    after): the latest detail of each, how often, when last, and the fix."""
    groups: dict[str, dict[str, Any]] = {}

    def add(cause: str, record: dict[str, Any], detail: str) -> None:
        group = groups.setdefault(cause, {"cause": cause, "count": 0, "functions": {}, "fixes": {}})
        group["fixes"][fix_for(cause, ctx, record.get("by"), detail, origin=record.get("origin"))] = True  # each that fits
        group["count"] += 1
        name = function_name(record.get("key") or "?-")
        fn = group["functions"].setdefault(name, {"name": name, "count": 0, "detail": "", "helper": False})
        fn["count"] += 1
        fn["detail"] = detail
        # One function's misses of a cause may each differ (several shapes, two dtypes): the detail
        # is the latest's, and ``changes`` says how many different ones there were.
        if record["e"] == "miss":
            fn.setdefault("_details", set()).add(detail)
        fn["last"] = record.get("t")
        fn["helper"] = fn["helper"] or bool(record.get("helper"))
        if cause == causes.CHANGED_COMPUTATION and name in every_run:
            fn["every_run"] = causes.EVERY_RUN

    for record in records:
        if record["e"] == "miss":
            off = f"; may have been served by the shared level, which was off after {record['off']}" \
                if record.get("off") else ""
            add(record.get("cause") or causes.UNEXPLAINED, record, record.get("detail", "") + off)
        else:
            change = f"; its key differs from the entries here: {record['cause']}: {record.get('change', '')}" \
                if record.get("cause") else ""
            add(causes.not_cached(record.get('reason') or 'unknown'), record, record.get("detail", "") + change)
    ordered = sorted(groups.values(), key=lambda g: (g["cause"].startswith(causes.NOT_CACHED), -g["count"]))
    for group in ordered:
        group["fix"] = "; ".join(fix for fix in group.pop("fixes") if fix)
        for fn in group["functions"].values():
            if len(details := fn.pop("_details", ())) > 1:
                fn["changes"] = len(details)
        group["functions"] = sorted(group["functions"].values(), key=lambda f: (f["helper"], -f["count"], f["name"]))
    return ordered
