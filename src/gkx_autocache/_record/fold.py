"""The fold (at exit, SPEC §7): the ledgers of finished processes summed into ``summary.json``
(totals, runs, recent misses, the size account) and the index, and the directory kept under the cap.
Loaded at exit or by a command, never on ``import jax``."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from gkx_autocache import _files
from gkx_autocache._diagnostics import logger
from gkx_autocache._layout import META_DIR, SUMMARY_FILE
from gkx_autocache._record import ledger as _ledger
from gkx_autocache._record import locks as _locks
from gkx_autocache._record.ledger import RECENT, Ledger, Totals

FORMAT = 2
RESCAN_SECS = 3600.0
PRUNE_TO = 0.9
SUMMARY_LIMIT = 64 << 20
BOOKKEEPING_SHARE = 0.05  # of the cap, at most, is charged for the package's own files...
BOOKKEEPING_FLOOR = 64 << 10  # ...or this much, where that is more (a cap of a few hundred KB)
MAX_RUNS = 20  # runs kept for `explain`


# -- the summary --------------------------------------------------------------------------------


class Summary:
    """``summary.json``: what the ledgers of finished processes came to."""

    def __init__(self) -> None:
        self.totals = Totals()
        self.size = 0  # the directory's bytes on disk at the last fold: the account the cap is kept by
        self.scanned_at = 0.0  # the last full scan (a fold without one leaves it)
        self.folded: list[str] = []  # the ledgers folded last: not counted twice if deleting them failed
        self.recent: list[dict[str, Any]] = []  # the latest misses and uncached compiles, for `explain`
        self.runs: dict[str, dict[str, Any]] = {}  # run -> when, what, its totals (the last MAX_RUNS)
        self.reset_at = 0.0  # the last `stats --reset`
        self.offsets: dict[str, Any] = {}  # ledger -> where it stood at the last reset (its process running)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "totals": self.totals.to_json(), "size": self.size,
                "scanned_at": self.scanned_at, "folded": self.folded, "recent": self.recent, "runs": self.runs,
                "reset_at": self.reset_at, "offsets": self.offsets}

    @classmethod
    def from_json(cls, data: Any) -> Summary:
        summary = cls()
        if not isinstance(data, dict) or data.get("format") not in (1, FORMAT):
            return summary
        summary.totals = Totals.from_json(data.get("totals"))
        summary.size = _ledger.as_count(data.get("size")) or 0
        summary.scanned_at = _ledger.as_number(data.get("scanned_at")) or 0.0
        summary.reset_at = _ledger.as_number(data.get("reset_at")) or 0.0
        folded = data.get("folded")
        summary.folded = [n for n in folded if isinstance(n, str)] if isinstance(folded, list) else []
        recent = data.get("recent")
        if isinstance(recent, list):
            summary.recent = [r for item in recent[-RECENT:] if (r := _recent(item))]
        offsets = data.get("offsets")
        if isinstance(offsets, dict):
            summary.offsets = {k: v for k, v in list(offsets.items())[:10_000] if isinstance(k, str) and isinstance(v, dict)}
        runs = data.get("runs")
        if isinstance(runs, dict):
            for run, entry in list(runs.items())[-MAX_RUNS:]:
                if isinstance(run, str) and isinstance(entry, dict):
                    summary.runs[run[:40]] = _run_entry(entry)
        return summary


def _run_entry(entry: dict[str, Any]) -> dict[str, Any]:
    return {"start": _ledger.as_number(entry.get("start")) or 0.0, "end": _ledger.as_number(entry.get("end")) or 0.0,
            "label": str(entry.get("label") or "")[:200], "processes": _ledger.as_count(entry.get("processes")) or 0,
            "totals": Totals.from_json(entry.get("totals")).to_json(functions=False)}


def add_run(runs: dict[str, dict[str, Any]], ledger: Ledger) -> None:
    """Count a ledger's process into its run (the last ``MAX_RUNS`` runs are kept)."""
    run = ledger.run
    if not run:
        return
    start = ledger.start or {}
    entry = runs.pop(run, None) or {"start": start.get("t", 0.0), "end": 0.0, "label": start.get("label", ""),
                                     "processes": 0, "totals": Totals().to_json(functions=False)}
    totals = Totals.from_json(entry["totals"])
    totals.merge(ledger.totals)
    entry["totals"] = totals.to_json(functions=False)
    entry["processes"] += 0 if start.get("more") else 1  # a process's next ledger is not another process
    entry["start"] = min(entry["start"] or start.get("t", 0.0), start.get("t", 0.0) or entry["start"])
    entry["end"] = max(entry["end"], ledger.mtime, *(r.get("t", 0.0) for r in ledger.records[-1:]))
    if start.get("label") and not entry["label"]:
        entry["label"] = start["label"]
    runs[run] = entry  # latest last
    while len(runs) > MAX_RUNS:
        del runs[min(runs, key=lambda r: runs[r]["end"])]


def _recent_key(record: dict[str, Any]) -> tuple[Any, ...]:
    return record["e"], record.get("key"), record.get("cause"), record.get("reason")


def _remember(recent: dict[tuple[Any, ...], dict[str, Any]], record: dict[str, Any]) -> None:
    """Add a miss or uncached compile to the recent ones (kept in order, by key and cause),
    replacing an older one of the same, which takes the later run and time: a run that misses the
    same way every time adds nothing. O(1), and cut to ``RECENT`` as it goes."""
    same = _recent_key(record)
    recent.pop(same, None)
    recent[same] = {k: v for k, v in record.items() if k != "rec"}
    if len(recent) > RECENT:
        del recent[next(iter(recent))]


def _recent(item: Any) -> dict[str, Any] | None:
    record = _ledger.parse_record(json.dumps(item)) if isinstance(item, dict) else None
    return record if record and record["e"] in ("miss", "uncached") else None


def summary_path(version_dir: str) -> str:
    return os.path.join(version_dir, META_DIR, SUMMARY_FILE)


def read_summary(version_dir: str) -> Summary:
    data = _files.read(summary_path(version_dir), SUMMARY_LIMIT)
    if not data:
        return Summary()
    try:
        return Summary.from_json(json.loads(data))
    except (ValueError, RecursionError):
        logger.debug("%s is not valid JSON: starting a new summary", summary_path(version_dir))
        return Summary()


def prefetch_room(version_dir: str, cap: int, unfolded: bool = False) -> int:
    """The bytes a prefetch may land under ``cap``: the fold's target less the summary's size and
    the bookkeeping's share (the ledger and the index grow as entries land); with ``unfolded``,
    less what the ledgers no fold has taken yet added too (it reads them: off the compile path)."""
    room = int(cap * PRUNE_TO) - read_summary(version_dir).size - int(cap * BOOKKEEPING_SHARE)
    return room - unfolded_disk(version_dir) if unfolded else room


def unfolded_disk(version_dir: str) -> int:
    """The bytes the ledgers no fold has taken yet say their processes added: a live process's, and
    a killed one's until the next fold. On disk, and outside the summary's size."""
    summary = read_summary(version_dir)
    already = set(summary.folded)
    return sum(_ledger.read_ledger(path).disk for path in _ledger.ledger_files(version_dir)
               if os.path.basename(path) not in already)


def write_summary(version_dir: str, summary: Summary, team: bool) -> bool:
    data = json.dumps(summary.to_json(), separators=(",", ":")).encode()
    return _files.write_atomic(summary_path(version_dir), data, _files.file_mode(team))


# -- the fold and the cap ----------------------------------------------------------------------


def fold(version_dir: str, cap: int, team: bool) -> None:
    """Fold the ledgers of finished processes into the summary and the index, and keep the
    directory under ``cap`` (0: no cap). At exit, under the non-blocking lock: a process that finds
    it taken skips (its ledger is folded by the next). Never raises."""
    try:
        lock = _locks.acquire(version_dir, team)
    except Exception as exc:  # bookkeeping: never a failure at exit
        logger.debug("fold skipped: %s", exc)
        return
    if lock is None:
        return
    try:
        fold_now(version_dir, cap, team)
    except Exception as exc:
        logger.debug("fold failed: %s", exc)
    finally:
        _locks.release(lock)


def fold_now(version_dir: str, cap: int, team: bool, zero: bool = False) -> int:
    """Fold under the lock (see ``fold``); with ``zero``, then forget the totals, the recent
    misses and the runs, keeping the index and the size account. The count of ledgers folded."""
    summary = read_summary(version_dir)
    already = set(summary.folded)
    done: list[str] = []
    live_disk = 0
    lines: list[str] = []
    pending: list[str] = []  # live processes' index lines: a compaction keeps the tables they refer to
    recent = {_recent_key(r): r for r in summary.recent}
    offsets, summary.offsets = summary.offsets, {}
    for path in _ledger.ledger_files(version_dir):
        if os.path.basename(path) in already:
            done.append(path)  # folded before; its removal failed
            continue
        ledger = _ledger.read_ledger(path)
        if not _ledger.finished(ledger):  # a live process: its writes count for the decision, not the record
            if zero:  # a reset: only what it records from now on counts
                summary.offsets[os.path.basename(path)] = ledger.offset(False, offsets.get(os.path.basename(path)))
            elif os.path.basename(path) in offsets:
                summary.offsets[os.path.basename(path)] = offsets[os.path.basename(path)]
            live_disk += ledger.disk
            pending.extend(line for r in ledger.records if r["e"] in ("put", "index")
                           for line in str(r.get("rec", "")).split("\n") if line.startswith("E\t"))
            continue
        if os.path.basename(path) in offsets:
            ledger.since(offsets[os.path.basename(path)])
        done.append(path)
        summary.totals.merge(ledger.totals)
        summary.size += ledger.disk
        add_run(summary.runs, ledger)
        lines.extend(ledger.index_lines())
        for record in ledger.records[ledger.counted:]:
            if record["e"] in ("miss", "uncached"):
                _remember(recent, {**record, "run": ledger.run})
    if lines:  # a run where every lookup hit has none: the index module is not even imported
        from gkx_autocache._record import index as _index

        _index.append(version_dir, lines, team)
    summary.recent = list(recent.values())
    if zero:
        summary.totals, summary.recent, summary.runs, summary.reset_at = Totals(), [], {}, time.time()
    # A full scan hourly, with or without a cap (it compacts the index), and whenever over the cap.
    # Not at a reset: ``stats --reset`` keeps the index and the size account as they are.
    if not zero and ((cap and summary.size + live_disk > cap) or time.time() - summary.scanned_at > RESCAN_SECS):
        try:
            summary.size, summary.scanned_at = _keep_under(version_dir, cap, team, pending), time.time()
        except Exception as exc:  # an untagged directory: nothing is pruned, the fold goes on
            logger.debug("not pruned: %s", exc)
            summary.scanned_at = time.time()
    summary.folded = [os.path.basename(p) for p in done]
    if not write_summary(version_dir, summary, team):
        if zero:
            raise OSError(f"stats not reset: {summary_path(version_dir)} cannot be written")
        return 0
    from gkx_autocache import _remove

    removed = _remove.remove_files(version_dir, done)
    if removed.failed or len(done) > 64:  # the names of removed ledgers never come back (pid and ns):
        summary.folded = [os.path.basename(p) for p in removed.failed]  # a few may stay listed, which
        write_summary(version_dir, summary, team)  # saves a second write at most exits
    return removed.files


def _keep_under(version_dir: str, cap: int, team: bool, pending: list[str] | None = None) -> int:
    """A full scan; the index rewritten for what is there (and the tables ``pending``, live
    processes' index lines, refer to); above the cap (0: none), prune to 90 % of it, least recently
    used first. The bookkeeping is charged at most ``BOOKKEEPING_SHARE`` of the cap, so a small cap
    still holds entries. The bytes the directory holds after it."""
    from gkx_autocache import _entries, _remove
    from gkx_autocache._record import index as _index

    found = _entries.scan(version_dir)
    made = _entries.made_here(version_dir)  # else a directory that existed (a framework's): its other files stay
    temporary = found.temporary
    stale = [t for t in temporary if time.time() - t[2] > _entries.STALE_TMP_SECS]  # writers killed mid-write
    if stale and (made or cap):
        _remove.remove_files(version_dir, [t[0] for t in stale])
        temporary = [t for t in temporary if t not in stale]
    units = _entries.ours(version_dir, list(found.units.values()), made or not cap)  # another tool's: not counted
    entries = sum(u.bytes for u in units) + sum(t[1] for t in temporary)
    bookkeeping = _entries.bookkeeping_bytes(version_dir)
    charged = min(bookkeeping, max(int(cap * BOOKKEEPING_SHARE), BOOKKEEPING_FLOOR))
    if cap and entries + charged > cap:
        removed = _entries.select_over(units, max(int(cap * PRUNE_TO) - charged, 0))
        freed = _remove.remove_files(version_dir, [p for u in removed for p in u.files]).bytes
        entries -= sum(u.bytes for u in removed) if freed else 0
        for unit in removed:
            found.units.pop(unit.key, None)
        _index.append(version_dir, _index.removed_lines([u.key for u in removed if u.has_entry], "max_size"), team)
        logger.debug("pruned %d entries (%d bytes) from %s", len(removed), freed, version_dir)
    present = {_index.split_key(key) for key, unit in found.units.items() if unit.has_entry}
    _index.compact(version_dir, present, team, pending=pending)
    return entries + _entries.bookkeeping_bytes(version_dir)
