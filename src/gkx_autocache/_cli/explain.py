"""``gkx-autocache explain``: why the last run's compiles missed or were not cached, then older
ones, with each cause's fix; the human text of ``_explain.report``'s document."""

from __future__ import annotations

import argparse
from typing import Any

from gkx_autocache import _adopted, _mount, _settings, _slow_import
from gkx_autocache._cli.output import OK, USAGE, CliError, emit, local_time
from gkx_autocache._context import load_context
from gkx_autocache._diagnostics import plural
from gkx_autocache._explain import report as _report
from gkx_autocache._record import ledger as _ledger
from gkx_autocache._record import show as _show


def cmd_explain(args: argparse.Namespace) -> int:
    ctx = load_context()
    vdir = ctx.store_dir("explain")
    try:
        since = _settings.parse_age(args.since) if args.since else None
    except _settings.BadValue as exc:
        raise CliError(f"--since: {exc}", USAGE) from None
    moved = _adopted.moved_since(vdir)
    if moved is not None:  # a framework gave JAX another directory after import jax: its runs are there
        vdir = moved["dir"]
    data = {"dir": vdir, "moved": moved, **_report.explain(ctx, version_dir=vdir, since=since, function=args.function)}
    lines = []
    if moved is not None:
        lines.append(f"JAX's directory is {vdir}, set by {moved['by']} ({local_time(moved['t'])}): the runs since "
                     "are recorded there")
    if data["read_only"]:
        lines.append("this cache is read-only for you: your runs are served from it but keep no records here"
                     + (": what follows is what the runs of those who write it recorded" if data["last_run"] else ""))
    if data["unavailable"]:
        lines.append(f"explanations unavailable here: {data['unavailable']}")
    last = data["last_run"]
    if last is None and ctx.location is not None and ctx.location.mount is not None:
        lines.append(_mount.UNKEPT.format(dir=vdir))
        data["kept"] = False
    elif last is None:
        lines.append(f"no run has recorded its use of {vdir} since the last reset")
    else:
        counts = [plural(last["hits"], "hit"), plural(last["misses"], "miss", "misses") + _show.by_cause(last["misses_by_cause"])]
        if last["not_cached"]:
            counts.append(f"{last['not_cached']} not cached{_show.by_cause(last['not_cached_by_reason'])}")
        stale = last.get("stale")
        if stale is not None:  # runs since, served by JAX's own cache, keep no records
            served = "no cache served them" if stale["store"] == "none" else "JAX's own cache served them"
            lines.append(f"the runs since {local_time(stale['since'])} are not recorded here: {served}"
                         + (f": {stale['why']}" if stale.get("why") else ""))
        lines.append(f"{'last recorded run' if stale else 'last run'}: {local_time(last['started'])}, "
                     f"{last['label'] or 'a process'} ({plural(last['processes'], 'process', 'processes')}): "
                     f"{', '.join(counts)}")
        if (traced := tracing_line(last)) is not None:
            lines.append(f"  {traced}")
        if data["slow_import"]:  # where the time went too, and no cache skips it: said with its fix
            lines.append(f"  {_slow_import.said(data['slow_import'])}")
        lines.extend(_groups_text(data["groups"], "  ", with_time=False, every=args.all))
        if not data["groups"] and (last["misses"] or last["not_cached"]):
            lines.append("  (its misses are older than --since, or of other functions)")
    if data["earlier"]:
        lines.append("earlier" + (f" (since {args.since} ago)" if args.since else "") + ":")
        lines.extend(_groups_text(data["earlier"], "  ", with_time=True, every=args.all))
    if last is None and data["slow_import"]:
        lines.append(_slow_import.said(data["slow_import"]))
    filtered = " of " + args.function if args.function else ""
    if last is not None and not last.get("stale") and not data["groups"] and not data["earlier"] \
            and not (last["misses"] or last["not_cached"]):
        lines.append(f"nothing missed{filtered}: every lookup was served")
    emit(args, "\n".join(lines), data)
    return OK


def _rows(functions: list[dict[str, Any]], merge: bool) -> list[dict[str, Any]]:
    """A line each, or (``merge``) one for the functions that missed for one reason (a size change
    gives every function of a simulation the same ``inputs f32[200] -> f32[240]``): three names
    and how many more, the user's functions first."""
    rows: list[dict[str, Any]] = []
    for fn in functions:
        name = fn["name"] + (f" x{fn['count']}" if fn["count"] > 1 else "")
        # Misses of one function that differ (several shapes) are not said as one: the latest, and how many kinds.
        detail = f"{fn['changes']} different details, the latest: {fn['detail']}" if fn.get("changes") else fn["detail"]
        same = next((r for r in rows if merge and r["detail"] == detail and r["helper"] == fn["helper"]
                     and not r.get("every_run") and not fn.get("every_run")), None)
        if same is not None:
            same["all"].append(name)
            continue
        rows.append({"all": [name], "detail": detail, "helper": fn["helper"], "last": fn.get("last"),
                     "every_run": fn.get("every_run")})
    for row in rows:
        names = row.pop("all")
        row["functions"] = len(names)
        row["names"] = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return rows


def tracing_line(run: dict[str, Any]) -> str | None:
    """Where a run's time went that no cache skips, beside the cache's own share: ``tracing and
    lowering 1.42 s (jit_step 0.80 s, jit_loss 0.31 s, ...); reading its 40 hits 0.05 s``."""
    if not run.get("tracing_secs"):
        return None
    slowest = run.get("tracing_by_function") or []
    named = sum(f["secs"] for f in slowest[:3])
    by = [f"{f['function']} {f['secs']:.2f} s" for f in slowest[:3]]
    if by and run["tracing_secs"] - named >= 0.005:
        by.append(f"the rest {run['tracing_secs'] - named:.2f} s")
    detail = f" ({', '.join(by)})" if by else ""
    reads = f"; reading its {plural(run['hits'], 'hit')} {run.get('reads_secs', 0.0):.2f} s" if run["hits"] else ""
    return f"tracing and lowering {run['tracing_secs']:.2f} s{detail}, which no cache skips{reads}"


SHOWN = 6  # functions listed for a cause, the user's first: a change of one size (200 -> 240 particles) stays a screen


def _groups_text(groups: list[dict[str, Any]], indent: str, with_time: bool, every: bool = False) -> list[str]:
    lines = []
    for group in groups:
        listed = (f"; {group['listed']} listed: the others repeat a compile listed, or are older than the latest "
                  f"{_ledger.RECENT} kept") if "listed" in group else ""
        lines.append(f"{indent}{group['cause']} ({group['count']}{listed})")
        rows = _rows(group["functions"], merge=not with_time)
        shown = rows if every else rows[:SHOWN]
        helpers = False
        for row in shown:
            if row["helper"] and not helpers:
                lines.append(f"{indent}  JAX's own helpers:")
                helpers = True
            when = f" (last {local_time(row['last'])})" if with_time else ""
            lines.append(f"{indent}  {row['names']}{when}: {row['detail']}")
            if row.get("every_run"):
                lines.append(f"{indent}    {row['every_run']}")
        if rest := rows[len(shown):]:
            count = sum(row["functions"] for row in rest)
            own = sum(row["functions"] for row in rest if row["helper"])
            of_jax = f", {own} of them JAX's own helpers" if own else ""
            lines.append(f"{indent}  ... and {count} more{of_jax} (explain --all lists them)")
        if group.get("fix"):
            lines.append(f"{indent}  fix: {group['fix']}")
    return lines
