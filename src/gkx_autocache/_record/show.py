"""What the commands and the pytest plugin show of the record: a directory's totals, runs and
recent misses (``Reading``), a process's counts as ``report`` and the pytest summary print them,
the totals as ``stats --json`` names them, and both levels' numbers as ``stats`` and ``status``
show them (``shown``, ``line``)."""

from __future__ import annotations

import os
from typing import Any

from gkx_autocache._diagnostics import human_bytes, plural
from gkx_autocache._layout import is_url
from gkx_autocache._record import fold as _fold
from gkx_autocache._record import ledger as _ledger
from gkx_autocache._record.ledger import RECENT, Totals

# -- a directory's record, for the commands ----------------------------------------------------


class Reading:
    """What the commands show of a directory: the summary and every ledger not folded yet (live
    ones included: each is at most ``LIVE_LIMIT`` long)."""

    def __init__(self, version_dir: str) -> None:
        self.summary = None if is_url(version_dir) else _fold.read_summary(version_dir)
        folded = set(self.summary.folded) if self.summary else set()
        self.ledgers = [_ledger.read_ledger(p) for p in _ledger.ledger_files(version_dir)
                        if os.path.basename(p) not in folded]
        for ledger in self.ledgers:
            if self.summary is not None and os.path.basename(ledger.path) in self.summary.offsets:
                ledger.since(self.summary.offsets[os.path.basename(ledger.path)])

    def totals(self) -> Totals | None:
        """Totals since the last reset; None when no process has used the directory."""
        totals = Totals()
        for ledger in self.ledgers:
            totals.merge(ledger.totals)
        if self.summary is not None:
            totals.merge(self.summary.totals)
        used = self.ledgers or (self.summary is not None and (self.summary.runs or self.summary.reset_at))
        return None if totals.empty and not used else totals

    def recent(self) -> list[dict[str, Any]]:
        """The latest misses and uncached compiles, oldest first, each with its run."""
        found = list(self.summary.recent) if self.summary else []
        for ledger in self.ledgers:
            found.extend({**r, "run": ledger.run} for r in ledger.records[ledger.counted:]
                         if r["e"] in ("miss", "uncached"))
        found.sort(key=lambda r: r.get("t", 0.0))
        return found[-RECENT:]

    def runs(self) -> dict[str, dict[str, Any]]:
        """The last runs, oldest first, live ones (of ledgers not folded yet) included."""
        runs = {k: dict(v) for k, v in (self.summary.runs if self.summary else {}).items()}
        for ledger in self.ledgers:
            _fold.add_run(runs, ledger)
        return dict(sorted(runs.items(), key=lambda kv: kv[1]["end"]))

    @property
    def skipped(self) -> int:
        return sum(ledger.skipped for ledger in self.ledgers)


# -- a process's counts, as `report` and the pytest summary print them -------------------------

NUMBERS = ("hits", "own_hits", "misses", "not_cached", "not_cached_secs", "saved_secs", "bytes_read", "bytes_written",
           "tracing_secs", "rebuilt_hits", "rebuilt")
TABLES = ("causes", "reasons")


def empty() -> dict[str, Any]:
    return {"dirs": [], "store": False, **dict.fromkeys(NUMBERS, 0), "saved_secs": 0.0, "not_cached_secs": 0.0,
            "tracing_secs": 0.0, "causes": {}, "reasons": {},
            "levels": {}}


def merge(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """The counts of several processes (pytest-xdist workers), summed."""
    total = empty()
    for snap in snapshots:
        _ledger.add_levels(total["levels"], snap.get("levels") or {})
        total["dirs"] += [d for d in snap["dirs"] if d not in total["dirs"]]
        total["store"] = total["store"] or snap["store"]
        total["shared"] = total.get("shared") or snap.get("shared")  # where the uploads went: one level a session
        for name in NUMBERS:
            total[name] += snap.get(name, 0)
        for table in TABLES:
            for key, n in snap.get(table, {}).items():
                total[table][key] = total[table].get(key, 0) + n
    return total


def since(now: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The counts of ``now`` that were not yet in ``before``: one process's part of one pytest
    session, where the process ran others before it."""
    part = dict(now)
    for name in NUMBERS:
        # never below 0: the store's figures are 0 in ``now`` when JAX's directory changed since
        part[name] = max(now.get(name, 0) - before.get(name, 0), 0)
    for table in TABLES:
        part[table] = {key: n - before.get(table, {}).get(key, 0) for key, n in now.get(table, {}).items()
                       if n - before.get(table, {}).get(key, 0) > 0}
    part["levels"] = _ledger.add_levels(_ledger.add_levels({}, now.get("levels") or {}), before.get("levels") or {}, -1)
    return part


def summary_line(snap: dict[str, Any]) -> str:
    """``gkx-autocache: 1480 hits (1045 from earlier runs, 435 of this run's own compiles), 12
    misses (8 new, 3 changed XLA_FLAGS, 1 evicted), 1 not cached (host callbacks), 2.31 s compile
    CPU time avoided, ..., dir``. Misses and compiles not cached add up to the lookups not served."""
    if snap.get("uncached"):  # JAX had no cache: a directory the trust rules refuse
        return f"gkx-autocache: this run was uncached: {snap['uncached']}"
    hits = plural(snap["hits"], "hit")
    shared_level = (snap.get("levels") or {}).get("shared", {})
    shared, ahead = int(shared_level.get("hits", 0)), int(shared_level.get("prefetch_used", 0))
    within = ([f"{snap['hits'] - shared} local, {shared} shared{f': {ahead} prefetched' if ahead else ''}"]
              if snap.get("levels") and snap["hits"] else [])
    rebuilt_hits = int(snap.get("rebuilt_hits") or 0)  # entries a rebuild compiled from records (SPEC §18)
    # A hit of an entry this run's rebuild ahead compiled is a rebuilt one, not one of its own compiles.
    own = max(snap["own_hits"] - min(rebuilt_hits, int(snap.get("rebuilt") or 0)), 0)
    if own:
        within.append(f"{snap['hits'] - snap['own_hits']} from earlier runs, {own} of this run's own compiles")
    if rebuilt_hits:
        within.append(f"{rebuilt_hits} rebuilt")
    if within:
        hits += f" ({'; '.join(within)})"
    parts = [hits, f"{plural(snap['misses'], 'miss', 'misses')}{by_cause(snap['causes'])}"]
    if snap.get("rebuilt"):
        by = f"by the {snap['command']} command" if snap.get("command") else "ahead"
        parts.append(f"{plural(snap['rebuilt'], 'entry', 'entries')} rebuilt {by}")
    if snap["not_cached"]:
        cost = f": {snap['not_cached_secs']:.2f} s compile" if snap.get("not_cached_secs") else ""
        parts.append(f"{snap['not_cached']} not cached{by_cause(snap['reasons'], cost)}")
    if snap.get("tracing_secs"):  # what no cache skips: the warm run's largest cost (explain: by function)
        parts.append(f"{snap['tracing_secs']:.2f} s tracing and lowering")
    if snap["store"]:
        parts.append(f"{snap['saved_secs']:.2f} s compile CPU time avoided")
        parts.append(f"{human_bytes(snap['bytes_read'])} read, {human_bytes(snap['bytes_written'])} written")
    uploads = int((snap.get("levels") or {}).get("shared", {}).get("uploads", 0))
    if uploads and snap.get("shared"):  # a writer to the shared level (CI): what it gave the others
        shared = snap["shared"]
        parts.append(f"{uploads} uploaded to {shared['url']}{' (signed)' if shared.get('signed') else ''}")
    dirs = snap["dirs"]
    where = dirs[0] if len(dirs) == 1 else f"{len(dirs)} directories"
    if snap.get("set_by") and len(dirs) == 1:  # JAX's directory, given it by someone else (``_adopted``)
        where += f" (set by {snap['set_by']})"
    return f"gkx-autocache: {', '.join(parts)}, {where}"


# -- the totals, as the commands print them ----------------------------------------------------


def by_cause(causes: dict[str, int], after: str = "") -> str:
    """``" (8 new, 3 changed XLA_FLAGS, 1 evicted)"``, most frequent first, then ``after``."""
    if not causes:
        return f" ({after.removeprefix(': ')})" if after else ""
    ordered = sorted(causes.items(), key=lambda kv: (-kv[1], kv[0]))
    return " (" + ", ".join(f"{n} {cause}" for cause, n in ordered) + after + ")"


def totals_dict(t: _ledger.Totals) -> dict[str, Any]:
    """The totals as ``stats --json`` and ``explain --json`` (``last_run``) name them."""
    lookups = t.hits + t.misses
    return {"hits": t.hits, "own_hits": t.own_hits, "misses": t.misses, "rebuilt_hits": t.rebuilt_hits,
            "rebuilt": t.rebuilt, "unrecorded": dict(sorted(t.unrecorded.items(), key=lambda kv: -kv[1])),
            "misses_by_cause": dict(sorted(t.causes.items(), key=lambda kv: -kv[1])),
            "not_cached": t.not_cached, "not_cached_secs": round(t.not_cached_secs, 3), "not_cached_by_reason": dict(sorted(t.reasons.items(), key=lambda kv: -kv[1])),
            "hit_rate": t.hits / lookups if lookups else None, "saved_secs": round(t.saved_secs, 3),
            "bytes_read": t.bytes_read, "bytes_written": t.bytes_written, "writes": t.writes,
            "levels": levels_dict(t.levels), "tracing_secs": round(t.tracing_secs, 3), "reads_secs": round(t.reads_secs, 3),
            "tracing_by_function": [{"function": name, "secs": round(secs, 3)} for name, secs in
                                    _ledger.slowest(t.traced, 10).items()]}


def levels_dict(levels: dict[str, Any]) -> dict[str, Any] | None:
    """Both levels' numbers as the JSON shows them (SPEC §14); None where no level was used."""
    if not levels:
        return None
    return {name: shown(levels.get(name, {})) for name in ("local", "shared")}


def top_functions(t: _ledger.Totals, n: int = 10) -> list[tuple[str, float, bool, bool]]:
    """The functions that cost most compile time, summed over their shapes: the user's first, then
    JAX's own helpers (``jit_broadcast_in_dim``...), each with whether it is one and whether it was
    ever written (a function never cached is compiled on every run)."""
    costs = sorted(((name, cost[0], name in t.helpers, cost[1] > 0) for name, cost in t.functions.items()),
                   key=lambda kv: -kv[1])
    return sorted(costs[:n], key=lambda kv: kv[2])


def cache_size(vdir: str, cap: Any) -> dict[str, Any] | None:
    """What ``ccache -s`` says as "cache size": the bytes the cap counts (allocated blocks, with the
    bookkeeping), the entries, the cap and its share (``--json``'s ``size``); None for a directory
    not on this machine (a bucket, not listed for a figure) or not made yet."""
    from gkx_autocache import _entries
    from gkx_autocache._layout import is_url

    if is_url(vdir) or not os.path.isdir(vdir):
        return None
    entries, used = _entries.count(vdir)
    cap = cap if isinstance(cap, int) and cap > 0 else 0
    return {"bytes": used, "entries": entries, "max_size": cap,
            "percent": round(100 * used / cap, 1) if cap else None}


def stats_data(vdir: str) -> dict[str, Any]:
    """What ``stats --json`` prints (less its version and command): the totals since the last reset,
    live processes included (None when there are none), and the costliest functions."""
    reading = Reading(vdir)
    totals = reading.totals()
    reset_at = reading.summary.reset_at if reading.summary else 0.0
    if totals is None or (totals.empty and reset_at):
        return {"dir": vdir, "stats": None, "levels": None, "top_functions": [], "reset_at": reset_at or None}
    top = [{"name": n, "compile_secs": round(s, 3), "helper": h, "cached": c} for n, s, h, c in top_functions(totals)]
    stats = totals_dict(totals)  # (its levels also at the top of the object: SPEC §14)
    return {"dir": vdir, "stats": stats, "levels": stats["levels"], "top_functions": top,
            "reset_at": reset_at or None}


def shown(counts: dict[str, Any]) -> dict[str, Any]:
    """One level's numbers as ``stats --json`` and ``status`` show them: the sums, and the mean
    read time in place of its two parts."""
    from gkx_autocache._shared.channel import COUNTS  # (the names, the same for both levels)

    out = {name: counts.get(name, 0) for name in COUNTS if name not in ("read_secs", "reads")}
    reads = counts.get("reads", 0)
    out["mean_read_secs"] = round(counts.get("read_secs", 0.0) / reads, 6) if reads else None
    return out


def line(levels: dict[str, Any]) -> str:
    """``local 9 hits, 2 misses, 0.3 ms a read; shared 3 hits (3 backfilled), 4 uploads, ...``, from
    the levels as ``shown`` gives them."""
    parts = []
    for level in ("local", "shared"):
        c = levels.get(level) or {}
        mean = c.get("mean_read_secs")
        text = f"{level} {plural(int(c.get('hits', 0)), 'hit')}, {plural(int(c.get('misses', 0)), 'miss', 'misses')}"
        if level == "shared":
            text += (f" ({int(c.get('backfills', 0))} backfilled, {int(c.get('rejected', 0))} rejected), "
                     f"{int(c.get('uploads', 0))} uploads")
            for name in ("skipped", "dropped", "errors", "timeouts", "slow"):
                if c.get(name):
                    said = {"skipped": "uploads skipped", "dropped": "uploads dropped", "slow": "reads slower than a compile"}
                    text += f", {int(c[name])} {said.get(name, name)}"
            if c.get("prefetched"):
                text += (f", {int(c['prefetched'])} prefetched ({int(c.get('prefetch_used', 0))} used, "
                         f"{human_bytes(int(c.get('prefetch_wasted_bytes', 0)))} wasted)")
        if mean is not None:
            text += f", {mean * 1000:.1f} ms a read"
        parts.append(text)
    return "; ".join(parts)
