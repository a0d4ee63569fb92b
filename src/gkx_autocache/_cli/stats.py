"""``gkx-autocache stats``: the totals since the last reset, live processes included, by cause,
and the costliest compiles; ``--reset`` starts them again, ``--written`` is CI's one number."""

from __future__ import annotations

import argparse
from typing import Any

from gkx_autocache import _adopted, _cache, _mount
from gkx_autocache._cli.output import OK, emit, local_time
from gkx_autocache._context import load_context
from gkx_autocache._diagnostics import human_bytes, human_secs, plural
from gkx_autocache._record import reset as _reset
from gkx_autocache._record import show as _show


def cmd_stats(args: argparse.Namespace) -> int:
    ctx = load_context()
    vdir = ctx.store_dir("stats")
    moved = _adopted.moved_since(vdir)  # a framework gave JAX another directory: its runs are counted there
    if moved is not None and not args.reset:
        vdir = moved["dir"]
    if args.reset:
        removed = _reset.reset(vdir, bool(ctx.settings["trust_shared"]))
        # (the count is of bookkeeping files, the finished processes' records: said in words, not as ledgers)
        emit(args, "stats reset: the totals count from zero now", {"reset": True, "removed": removed})
        return OK
    data = _show.stats_data(vdir)
    if args.written:  # bare, for a CI step's output: save the cache only when this run wrote entries
        written = data["stats"]["writes"] if data["stats"] else 0
        emit(args, str(written), {"dir": vdir, "written": written})
        return OK
    stats = data["stats"]
    data["size"] = _show.cache_size(vdir, ctx.settings["max_size"])
    sized = size_line(data["size"], "\n")
    if stats is None and data["reset_at"]:
        emit(args, f"no lookups in {vdir} since the last reset (stats --reset, {local_time(data['reset_at'])}){sized}",
             data)
        return OK
    if stats is None and ctx.location is not None and ctx.location.users_own and not ctx.location.local:
        emit(args, _cache.NOT_KEPT.format(dir=vdir), data)
        return OK
    if stats is None and ctx.location is not None and ctx.location.mount is not None:
        emit(args, _mount.UNKEPT.format(dir=vdir), {**data, "kept": False})
        return OK
    if stats is None:
        emit(args, f"none yet: no process has used {vdir}{sized}", data)
        return OK
    lines = [stats_line(stats), f"directory {vdir}", *causes_lines(stats)]
    if data["size"] is not None:
        lines.insert(1, size_line(data["size"]))
    if data["levels"]:  # the local and shared levels' numbers (SPEC §14)
        from gkx_autocache._record.show import line

        lines.insert(1, f"levels      {line(data['levels'])}")
    if data["top_functions"]:
        lines.append("costliest compiles (seconds, summed over shapes; JAX's own helpers last):")
        lines.extend(f"  {f['compile_secs']:8.3f}  {f['name']}{'  (JAX)' if f['helper'] else ''}"
                     f"{'' if f['cached'] else '  (not cached: compiled on every run)'}" for f in data["top_functions"])
    emit(args, "\n".join(lines), data)
    return OK


def size_line(found: dict[str, Any] | None, before: str = "") -> str:
    """``cache size 1.2 GiB of 5.0 GiB (24 %), 3 100 entries``; "" without a figure."""
    if found is None:
        return ""
    count = plural(found["entries"], "entry", "entries")
    if not found["max_size"]:
        return f"{before}cache size {human_bytes(found['bytes'])}, {count} (no cap: max_size 0)"
    share = round(100 * found["bytes"] / found["max_size"])
    return f"{before}cache size {human_bytes(found['bytes'])} of {human_bytes(found['max_size'])} ({share} %), {count}"


def stats_line(t: dict[str, Any]) -> str:
    """One line of totals, as ``stats --json`` names them; misses and compiles not cached are the
    lookups not served, each with its breakdown."""
    rate = f" ({t['hit_rate']:.0%} hit rate)" if t["hit_rate"] is not None else ""
    own = f", {t['own_hits']} of them of a run's own compiles" if t["own_hits"] else ""
    if t.get("rebuilt_hits"):  # entries a rebuild compiled from records (SPEC §18)
        own += f", {t['rebuilt_hits']} of entries rebuilt from records"
    cost = f" ({human_secs(t['not_cached_secs'])} compile, paid again every run)" if t.get("not_cached_secs") else ""
    not_cached = f", {t['not_cached']} not cached{cost}" if t["not_cached"] else ""
    return (f"{plural(t['hits'], 'hit')}{own}, {plural(t['misses'], 'miss', 'misses')}{rate}{not_cached}, "
            f"{human_secs(t['saved_secs'])} compile CPU time avoided, {human_bytes(t['bytes_read'])} read, "
            f"{human_bytes(t['bytes_written'])} written")


def causes_lines(t: dict[str, Any]) -> list[str]:
    lines = []
    if t["misses_by_cause"]:
        lines.append("misses by cause:")
        lines.extend(f"  {n:8d}  {cause}" for cause, n in t["misses_by_cause"].items())
    if t["not_cached_by_reason"]:
        lines.append("compiles not cached, by reason:")
        lines.extend(f"  {n:8d}  {reason}" for reason, n in t["not_cached_by_reason"].items())
    if t.get("rebuilt"):
        lines.append(f"rebuilt: {plural(t['rebuilt'], 'entry', 'entries')} compiled again from records "
                     f"(gkx-autocache rebuild, or ahead), {t.get('rebuilt_hits', 0)} hits of them")
    if t.get("unrecorded"):  # what rebuild cannot make again (SPEC §18)
        lines.append("entries written without a record (rebuild cannot make them again), by why:")
        lines.extend(f"  {n:8d}  {why}" for why, n in t["unrecorded"].items())
    return lines
