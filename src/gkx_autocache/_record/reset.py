"""What the commands change in the record: a reset (``stats --reset``, ``clear``), and the
entries a command removed (``prune``, ``verify --repair``) or added (a bundle's import)."""

from __future__ import annotations

import os
import time
from typing import Any

from gkx_autocache import _files
from gkx_autocache._layout import LEDGER_DIR, LEDGER_SUFFIX, is_url
from gkx_autocache._record import fold as _fold
from gkx_autocache._record import ledger as _ledger
from gkx_autocache._record import locks as _locks


def reset(version_dir: str, team: bool = False, forget: bool = False) -> int:
    """Start the totals again (``stats --reset``): finished ledgers are folded, then the totals,
    recent misses and runs are zeroed; the index and the size account stay. With ``forget``
    (``clear``, a fresh start), the summary, the index and the finished ledgers go. A running
    process keeps its ledger (deleting it would lose what it records next). The count of files
    folded or removed. Raises OSError when a fold in progress holds the lock past a few seconds."""
    from gkx_autocache import _remove
    from gkx_autocache._record import index as _index

    files = _ledger.ledger_files(version_dir)
    if is_url(version_dir):
        return _remove.remove_files(version_dir, files).files
    extra = [_fold.summary_path(version_dir), _index.index_path(version_dir)]
    present = [p for p in [*files, *extra] if os.path.lexists(p)]
    if not present:
        return 0
    lock = _locks.acquire(version_dir, team, wait=5.0)
    if lock is None:
        raise OSError("the cache is busy (a process is folding its ledger, or the lock cannot be taken): try again")
    try:
        if not forget:
            return _fold.fold_now(version_dir, 0, team, zero=True)
        fresh = _fold.Summary()  # a fresh start: a running process's records so far are forgotten too
        done = []
        for path in files:
            ledger = _ledger.read_ledger(path)
            if _ledger.finished(ledger):
                done.append(path)
            else:
                fresh.offsets[os.path.basename(path)] = ledger.offset(forget=True)
        removed = _remove.remove_files(version_dir, [*done, *extra])
        if removed.failed:
            raise OSError(f"stats not reset: {removed.why()}")
        if fresh.offsets:
            fresh.reset_at = time.time()
            _fold.write_summary(version_dir, fresh, team)
        return removed.files
    finally:
        _locks.release(lock)


def _command_ledger(version_dir: str, records: list[dict[str, Any]], team: bool) -> None:
    """A ledger of a command's records (no process writes it after: it is finished at once)."""
    folder = _files.bookkeeping_dir(version_dir, team, LEDGER_DIR)
    if folder is not None and records:
        name = f"{os.getpid()}-{time.time_ns()}{LEDGER_SUFFIX}"
        data = b"".join(_ledger.encode(r) for r in records)
        _files.write_atomic(os.path.join(folder, name), data, _files.file_mode(team))


def _to_index(version_dir: str, lines: list[str], team: bool) -> bool:
    """Append a command's index lines at once, under the lock (waiting a little), so that the next
    miss knows them; False when the lock cannot be had (then a ledger carries them)."""
    from gkx_autocache._record import index as _index

    lock = _locks.acquire(version_dir, team, wait=5.0)
    if lock is None:
        return False
    try:
        return _index.append(version_dir, lines, team)
    finally:
        _locks.release(lock)


def record_evicted(version_dir: str, keys: list[str], reason: str, team: bool) -> None:
    """Remember keys a command removed (``prune``, ``verify --repair``), so that their next miss is
    named ``evicted`` with who removed them."""
    if not keys:
        return
    from gkx_autocache._record import index as _index

    now = round(time.time(), 3)
    if not _to_index(version_dir, _index.removed_lines(keys, reason, now), team):
        _command_ledger(version_dir, [{"e": "evicted", "key": key, "reason": reason, "t": now} for key in keys], team)


def record_added(version_dir: str, nbytes: int, team: bool, lines: list[str] | None = None) -> None:
    """Count bytes added outside a process's store (a bundle import) in the account, and index the
    entries it brought (their records travel in the bundle)."""
    records: list[dict[str, Any]] = [{"e": "added", "bytes": nbytes}]
    if lines and not _to_index(version_dir, lines, team):
        records.append({"e": "index", "rec": "\n".join(lines)})
    _command_ledger(version_dir, records, team)
