"""The ledger on disk (SPEC §7): one append-only file per process, the summary they are folded into,
and the account of bytes that the cap is kept by. Shared by the processes that write it, the
at-exit fold and the commands that read it.

Why this shape:
- One file per process (``ledger/<pid>-<ns>.jsonl``), one ``write()`` per record with ``O_APPEND``,
  so a worker that ends by ``os._exit`` or is killed loses nothing it already recorded (appends of
  several processes to one shared file are not atomic on NFS).
- Each process holds an ``flock`` on its own ledger for as long as it lives, and the kernel drops
  it when the process ends, however it ends (exit, ``os._exit``, SIGKILL). A ledger whose lock is
  free belongs to a finished process: a fold may read and delete it without losing a record that
  a live process is about to append. A forked child opens a file of its own.
- At the exit of every process that kept a ledger (warm runs too), under a non-blocking lock
  (``prune.lock``, created with the cache's group mode, so every member of a team cache can take
  it), the ledgers of finished processes are folded into ``summary.json``: totals, per-function
  compile costs, misses by cause, the recent misses for ``explain``, and the size account. The
  bookkeeping then grows with the number of distinct functions and entries, never with runs.
- The size account: ``size`` is the directory's bytes (entries, sidecars, temporaries and this
  bookkeeping) as of the last fold. A fold adds the bytes of the writes it folds and, for its
  decision only, those of live processes' ledgers. A process that found the lock taken, ended by
  ``os._exit`` or was killed still has its writes in its ledger: the next fold, by any member,
  counts them, so the account does not drift low. Writers it cannot see (stock JAX on the same
  directory, files copied in by hand) are caught by a full scan at least hourly: ``scanned_at`` is
  refreshed by a scan only. When the account is over the cap, a full scan decides, and the
  directory is pruned to 90 % of it.

Everything read from these files is validated (a member of a team cache can write anything in
them): a bad line or field is skipped, never a crash.
"""

from __future__ import annotations

import json
import math
import os
import stat
import time
from collections.abc import Iterator
from typing import Any

from gkx_autocache import _files
from gkx_autocache._diagnostics import logger
from gkx_autocache._explain import Folding
from gkx_autocache._layout import (
    LEDGER_DIR,
    LEDGER_SUFFIX,
    LOCK_FILE,
    META_DIR,
    SUMMARY_FILE,
    function_name,
    is_url,
)

FORMAT = 1
RESCAN_SECS = 3600.0
PRUNE_TO = 0.9
READ_LIMIT = 64 << 20  # the most read of one ledger or summary file
RECENT = 500  # misses and uncached compiles kept for `explain`
MAX_FUNCTIONS = 5000  # function names whose compile costs `stats` lists
MAX_INT = 1 << 62
MAX_FLOAT = 1e12
KINDS = ("hit", "miss", "put", "uncached", "added", "evicted", "sum", "levels")


# -- records ------------------------------------------------------------------------------------

_FIELDS = {**dict.fromkeys(("bytes", "hits", "misses"), "count"), **dict.fromkeys(("saved", "compile", "t"), "number"),
           **dict.fromkeys(("key", "cause", "detail", "reason", "parts", "change", "off"), "text"), "own": "flag",
           "readable": "table", "local": "counts", "shared": "counts"}


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value) if abs(value) < MAX_FLOAT * 10 else math.inf
    return number if 0.0 <= number <= MAX_FLOAT else None


def _field(kind: str, value: Any) -> Any:
    """The value if it is well-formed for its kind of field, else None."""
    if kind == "count":
        return _count(value)
    if kind == "number":
        return _number(value)
    if kind == "text":
        return value if isinstance(value, str) and len(value) <= 4096 else None
    if kind == "flag":
        return True if value is True else None
    if kind == "counts":  # a level's numbers (SPEC §14)
        return add_levels({}, {"_": value})["_"] if isinstance(value, dict) else None
    if isinstance(value, dict):  # "table": the readable values of a key's parts
        return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str) and len(k) <= 64
                and len(v) <= 4096}
    return None


def parse_record(line: bytes | str) -> dict[str, Any] | None:
    """One ledger line as a record with only well-formed fields, or None: a torn last line, or
    anything a hostile writer put there. (One pass over the fields the line has: a fold of
    100 000 ledgers parses 300 000 lines.)"""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or record.get("e") not in KINDS:
        return None
    clean: dict[str, Any] = {"e": record["e"]}
    for name, value in record.items():
        kind = _FIELDS.get(name)
        if kind is not None and (good := _field(kind, value)) is not None:
            clean[name] = good
    return clean


def encode(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, separators=(",", ":")) + "\n").encode("utf-8")


# -- totals -------------------------------------------------------------------------------------


def add_levels(total: dict[str, dict[str, Any]], other: dict[str, Any], sign: int = 1) -> dict[str, dict[str, Any]]:
    """Add (``sign`` -1: subtract, never below 0) one set of per-level numbers to another: ``{level:
    {name: number}}``, the names and levels as they come (a bad one is skipped)."""
    for level, counts in other.items():
        if not isinstance(level, str) or len(level) > 32 or not isinstance(counts, dict):
            continue
        mine = total.setdefault(level, {})
        for name, n in counts.items():
            if isinstance(name, str) and len(name) <= 32 and (good := _number(n)) is not None:
                mine[name] = max(mine.get(name, 0) + sign * (n if isinstance(n, int) else good), 0)
    return total



class Totals:
    """Counts summed over records (a plain class: this module is imported on ``import jax``)."""

    def __init__(self) -> None:
        self.hits = 0
        self.own_hits = 0  # hits of entries written by the same process: not the cache being warm
        self.misses = 0
        self.saved_secs = 0.0
        self.bytes_read = 0
        self.bytes_written = 0
        self.writes = 0
        self.causes: dict[str, int] = {}  # misses by cause (SPEC §13)
        self.uncached: dict[str, int] = {}  # compiles JAX did not write, by reason
        self.functions: dict[str, list[float]] = {}  # function name -> [compile seconds, writes]
        self.levels: dict[str, dict[str, Any]] = {}  # local and shared level numbers (SPEC §14)

    def add(self, record: dict[str, Any]) -> None:
        """Count one record (as ``parse_record`` returns it)."""
        kind = record["e"]
        if kind == "hit":
            self.hits += 1
            self.own_hits += bool(record.get("own"))
            self.saved_secs += record.get("saved", 0.0)
            self.bytes_read += record.get("bytes", 0)
        elif kind == "miss":
            self.misses += 1
            cause = record.get("cause")
            if cause:
                self.causes[cause] = self.causes.get(cause, 0) + 1
        elif kind == "put":
            self.writes += 1
            self.bytes_written += record.get("bytes", 0)
            cost = self.functions.setdefault(function_name(record.get("key", "?-")), [0.0, 0])
            cost[0] += record.get("compile", 0.0)
            cost[1] += 1
            if len(self.functions) > MAX_FUNCTIONS:  # bounded: the oldest name goes
                del self.functions[next(iter(self.functions))]
        elif kind == "uncached":  # a miss JAX then did not write
            self.misses += 1
            reason = record.get("reason") or "unknown"
            self.uncached[reason] = self.uncached.get(reason, 0) + 1
            cause = record.get("cause")
            if cause:
                self.causes[cause] = self.causes.get(cause, 0) + 1
        elif kind == "levels":
            add_levels(self.levels, {k: v for k, v in record.items() if k != "e"})
        elif kind == "sum":  # a remote directory's process, at exit
            self.hits += record.get("hits", 0)
            self.misses += record.get("misses", 0)
            self.saved_secs += record.get("saved", 0.0)

    def merge(self, other: Totals) -> None:
        for name in ("hits", "own_hits", "misses", "saved_secs", "bytes_read", "bytes_written", "writes"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for mine, theirs in ((self.causes, other.causes), (self.uncached, other.uncached)):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n
        for name, (secs, writes) in other.functions.items():
            cost = self.functions.setdefault(name, [0.0, 0])
            cost[0] += secs
            cost[1] += writes
        add_levels(self.levels, other.levels)

    @property
    def empty(self) -> bool:
        return not (self.hits or self.misses or self.writes or self.uncached)

    def to_json(self) -> dict[str, Any]:
        return {"hits": self.hits, "own_hits": self.own_hits, "misses": self.misses,
                "saved_secs": round(self.saved_secs, 6), "bytes_read": self.bytes_read,
                "bytes_written": self.bytes_written, "writes": self.writes, "causes": self.causes,
                "uncached": self.uncached, "functions": self.functions, "levels": self.levels}

    @classmethod
    def from_json(cls, data: Any) -> Totals:
        totals = cls()
        if not isinstance(data, dict):
            return totals
        for name in ("hits", "own_hits", "misses", "bytes_read", "bytes_written", "writes"):
            setattr(totals, name, _count(data.get(name)) or 0)
        totals.saved_secs = _number(data.get("saved_secs")) or 0.0
        for name in ("causes", "uncached"):
            table = data.get(name)
            if isinstance(table, dict):
                setattr(totals, name, {k[:200]: n for k, v in table.items()
                                       if isinstance(k, str) and (n := _count(v)) is not None})
        if isinstance(data.get("levels"), dict):
            add_levels(totals.levels, data["levels"])
        functions = data.get("functions")
        if isinstance(functions, dict):
            for name, cost in functions.items():
                if isinstance(name, str) and isinstance(cost, list) and len(cost) == 2:
                    secs, writes = _number(cost[0]), _count(cost[1])
                    if secs is not None and writes is not None:
                        totals.functions[name[:200]] = [secs, writes]
        return totals


# -- the summary --------------------------------------------------------------------------------


class Summary:
    """``summary.json``: what the ledgers of finished processes came to."""

    def __init__(self) -> None:
        self.totals = Totals()
        self.size = 0  # the directory's bytes at the last fold: the account the cap is kept by
        self.scanned_at = 0.0  # the last full scan (a fold without one leaves it)
        self.folded: list[str] = []  # the ledgers folded last: not counted twice if deleting them failed
        self.recent: list[dict[str, Any]] = []  # the latest misses and uncached compiles, for `explain`
        self.explain: dict[str, Any] = {}  # what explaining the next miss needs (SPEC §13)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "totals": self.totals.to_json(), "size": self.size,
                "scanned_at": self.scanned_at, "folded": self.folded, "recent": self.recent,
                "explain": self.explain}

    @classmethod
    def from_json(cls, data: Any) -> Summary:
        summary = cls()
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return summary
        summary.totals = Totals.from_json(data.get("totals"))
        summary.size = _count(data.get("size")) or 0
        summary.scanned_at = _number(data.get("scanned_at")) or 0.0
        folded = data.get("folded")
        summary.folded = [n for n in folded if isinstance(n, str)] if isinstance(folded, list) else []
        recent = data.get("recent")
        if isinstance(recent, list):
            summary.recent = [r for item in recent[-RECENT:] if (r := _recent(item))]
        if isinstance(data.get("explain"), dict):
            summary.explain = data["explain"]
        return summary


def _recent_key(record: dict[str, Any]) -> tuple[Any, ...]:
    return record["e"], record.get("key"), record.get("cause"), record.get("reason")


def _remember(recent: dict[tuple[Any, ...], dict[str, Any]], record: dict[str, Any]) -> None:
    """Add a miss or uncached compile to the recent ones (kept in order, by key and cause),
    replacing an older one of the same key and cause: a run that misses the same way every time
    adds nothing. O(1), and cut to ``RECENT`` as it goes."""
    same = _recent_key(record)
    recent.pop(same, None)
    recent[same] = {k: v for k, v in record.items() if k != "readable"}
    if len(recent) > RECENT:
        del recent[next(iter(recent))]


def _recent(item: Any) -> dict[str, Any] | None:
    record = parse_record(json.dumps(item)) if isinstance(item, dict) else None
    return record if record and record["e"] in ("miss", "uncached") else None


def summary_path(version_dir: str) -> str:
    return os.path.join(version_dir, META_DIR, SUMMARY_FILE)


def read_summary(version_dir: str) -> Summary:
    data = _files.read(summary_path(version_dir), READ_LIMIT)
    if not data:
        return Summary()
    try:
        return Summary.from_json(json.loads(data))
    except (ValueError, RecursionError):
        logger.debug("%s is not valid JSON: starting a new summary", summary_path(version_dir))
        return Summary()


def _write_summary(version_dir: str, summary: Summary, shared: bool) -> bool:
    data = json.dumps(summary.to_json(), separators=(",", ":")).encode()
    return _files.write_atomic(summary_path(version_dir), data, _files.file_mode(shared))


# -- ledger files -------------------------------------------------------------------------------


def ledger_dir(version_dir: str) -> str:
    return os.path.join(version_dir, META_DIR, LEDGER_DIR)


def ledger_files(version_dir: str) -> list[str]:
    if is_url(version_dir):
        from gkx_autocache import _remote

        return _remote.ledger_files(version_dir)
    folder = ledger_dir(version_dir)
    try:
        with os.scandir(folder) as items:
            return sorted(os.path.join(folder, i.name) for i in items
                          if i.name.endswith(LEDGER_SUFFIX) and i.is_file(follow_symlinks=False))
    except OSError:
        return []


def read_records(path: str) -> Iterator[dict[str, Any]]:
    """The well-formed records of one ledger file (local or remote)."""
    if is_url(path):
        from gkx_autocache import _remote

        data = _remote.read_bytes(path) or b""
    else:
        data = _files.read(path, READ_LIMIT) or b""
    for line in data.splitlines():
        record = parse_record(line)
        if record is not None:
            yield record


def _finished(path: str) -> bool:
    """Whether the ledger's process has finished: its lock is free. Taken and let go at once (a
    finished process does not come back, and other folders wait for the bookkeeping lock), so a
    fold of 100 000 ledgers holds no more descriptors than one. Opened for writing: on NFS, Linux
    turns ``flock`` into a POSIX lock, and an exclusive one needs a descriptor open for writing."""
    import fcntl

    try:
        fd = _files.open_regular(path, write=True)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False  # its process is alive (or the file system has no locks: then it waits)
    finally:
        os.close(fd)


# -- reading, for the commands ------------------------------------------------------------------


def read_totals(version_dir: str) -> Totals | None:
    """Totals since the last reset: the summary plus every ledger not folded yet (finished or
    live). None when no process has used the directory since."""
    summary = None if is_url(version_dir) else read_summary(version_dir)
    totals = Totals()
    files = ledger_files(version_dir)
    folded = set(summary.folded) if summary else set()
    for path in files:
        if os.path.basename(path) not in folded:
            for record in read_records(path):
                totals.add(record)
    if summary is not None:
        totals.merge(summary.totals)
    return None if totals.empty and not files else totals


def recent(version_dir: str) -> list[dict[str, Any]]:
    """The latest misses and uncached compiles, oldest first: the summary's, then unfolded ones."""
    summary = read_summary(version_dir)
    found = list(summary.recent)
    folded = set(summary.folded)
    for path in ledger_files(version_dir):
        if os.path.basename(path) not in folded:
            found.extend(r for r in read_records(path) if r["e"] in ("miss", "uncached"))
    found.sort(key=lambda r: r.get("t", 0.0))
    return found[-RECENT:]


# -- the lock, folding and the cap --------------------------------------------------------------


def explain_state(version_dir: str, explain: Any) -> dict[str, Any]:
    """What explaining a miss needs (``_explain``): the summary's state, with the writes and
    evictions of ledgers not folded yet (another process's, a ``prune`` just run)."""
    summary = read_summary(version_dir)
    state = summary.explain
    folded = set(summary.folded)
    mine = f"{os.getpid()}-"  # never opened here: on NFS, closing a descriptor of it drops this process's lock
    for path in ledger_files(version_dir):
        name = os.path.basename(path)
        if name not in folded and not name.startswith(mine):
            for record in read_records(path):
                explain.fold(state, record)
    return state


def record_evicted(version_dir: str, keys: list[str], reason: str, shared: bool) -> None:
    """Remember keys a command removed, so that their next miss is named "evicted": a ledger of
    their records, folded like any other."""
    folder = _files.bookkeeping_dir(version_dir, shared, LEDGER_DIR)
    if folder is not None and keys:
        name = f"{os.getpid()}-{time.time_ns()}{LEDGER_SUFFIX}"
        data = b"".join(encode({"e": "evicted", "key": key, "reason": reason}) for key in keys)
        _files.write_atomic(os.path.join(folder, name), data, _files.file_mode(shared))


def _lock(version_dir: str, shared: bool, wait: float = 0.0) -> int | None:
    """The bookkeeping lock, taken; None when another process holds it (after ``wait`` seconds)
    or it cannot be opened. Opened for writing (an exclusive lock on NFS needs it): the file has
    the cache's group mode, so every member of a team cache can open it."""
    import fcntl

    meta = _files.bookkeeping_dir(version_dir, shared)
    if meta is None:
        return None
    try:
        meta_fd = _files.open_dir(meta)
    except OSError:
        return None
    try:
        flags = os.O_RDWR | os.O_CREAT | _files.NOFOLLOW | _files.NONBLOCK  # a planted FIFO must not hang the exit
        fd = os.open(LOCK_FILE, flags, _files.file_mode(shared), dir_fd=meta_fd)
    except OSError as exc:
        logger.debug("bookkeeping lock not opened: %s", exc)
        return None
    finally:
        os.close(meta_fd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    try:
        os.fchmod(fd, _files.file_mode(shared))  # the umask masked the open mode; only its owner can do this
    except OSError:
        pass
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)


def fold(version_dir: str, cap: int, shared: bool, explain: Any = None) -> None:
    """Fold the ledgers of finished processes into the summary and keep the directory under
    ``cap`` (0: no cap). At exit, under the non-blocking lock: a process that finds it taken skips
    (its ledger is folded by the next). Never raises."""
    try:
        lock = _lock(version_dir, shared)
    except Exception as exc:  # bookkeeping: never a failure at exit
        logger.debug("fold skipped: %s", exc)
        return
    if lock is None:
        return
    try:
        _fold(version_dir, cap, shared, explain)
    except Exception as exc:
        logger.debug("fold failed: %s", exc)
    finally:
        os.close(lock)


def _fold(version_dir: str, cap: int, shared: bool, explain: Any, zero: bool = False) -> int:
    """Fold under the lock (see ``fold``); with ``zero``, then forget the totals and the recent
    misses, keeping what explains the next miss and the size account. The count of ledgers folded."""
    summary = read_summary(version_dir)
    already = set(summary.folded)
    done: list[str] = []
    live_bytes = 0
    recent = {_recent_key(r): r for r in summary.recent}
    for path in ledger_files(version_dir):
        if os.path.basename(path) in already:
            done.append(path)  # folded before; its removal failed
            continue
        finished = _finished(path)
        records = list(read_records(path))
        if not finished:  # a live process: its writes count for the decision, not the record
            live_bytes += sum(r.get("bytes", 0) for r in records if r["e"] in ("put", "added"))
            continue
        done.append(path)
        for record in records:
            summary.totals.add(record)
            if record["e"] in ("put", "added"):
                summary.size += record.get("bytes", 0)
            if record["e"] in ("miss", "uncached"):
                _remember(recent, record)
            if explain is not None:
                explain.fold(summary.explain, record)
    summary.recent = list(recent.values())
    if zero:
        summary.totals, summary.recent = Totals(), []
    if cap and (summary.size + live_bytes > cap or time.time() - summary.scanned_at > RESCAN_SECS):
        try:
            _keep_under(version_dir, cap, summary, explain)
        except Exception as exc:  # an untagged directory: nothing is pruned, the fold goes on
            logger.debug("not pruned: %s", exc)
            summary.scanned_at = time.time()
    summary.folded = [os.path.basename(p) for p in done]
    if not _write_summary(version_dir, summary, shared):
        if zero:
            raise OSError(f"stats not reset: {summary_path(version_dir)} cannot be written")
        return 0
    from gkx_autocache import _entries

    removed = _entries.remove_files(version_dir, done)
    if removed.failed or len(done) > 64:  # the names of removed ledgers never come back (pid and ns):
        summary.folded = [os.path.basename(p) for p in removed.failed]  # a few may stay listed, which
        _write_summary(version_dir, summary, shared)  # saves a second write at most exits
    return removed.files


def _keep_under(version_dir: str, cap: int, summary: Summary, explain: Any) -> None:
    """A full scan; above the cap, prune to 90 % of it, least recently used first."""
    from gkx_autocache import _entries

    found = _entries.scan(version_dir)
    bookkeeping = _entries.bookkeeping_bytes(version_dir)
    actual = found.bytes + bookkeeping
    stale = [t for t in found.temporary if time.time() - t[2] > _entries.STALE_TMP_SECS]  # writers killed mid-write
    if stale:
        actual -= _entries.remove_files(version_dir, [t[0] for t in stale]).bytes
    if actual > cap:
        removed = _entries.select_over(list(found.units.values()), max(int(cap * PRUNE_TO) - bookkeeping, 0))
        freed = _entries.remove_files(version_dir, [p for u in removed for p in u.files]).bytes
        actual -= freed
        if explain is not None:
            explain.evicted(summary.explain, [u.key for u in removed if u.has_entry], "max_size")
        logger.debug("pruned %d entries (%d bytes) from %s", len(removed), freed, version_dir)
    summary.size = actual
    summary.scanned_at = time.time()


def reset(version_dir: str, shared: bool = False, forget: bool = False) -> int:
    """Start the totals again (``stats --reset``): finished ledgers are folded, then the totals and
    recent misses are zeroed; what explains the next miss and the size account stay. With
    ``forget`` (``clear``, a fresh start), the summary and the finished ledgers go. A running
    process keeps its ledger (deleting it would lose what it records next). The count of files
    folded or removed. Raises OSError when a fold in progress holds the lock past a few seconds."""
    from gkx_autocache import _entries

    files = ledger_files(version_dir)
    if is_url(version_dir):
        return _entries.remove_files(version_dir, files).files
    present = [p for p in [*files, summary_path(version_dir)] if os.path.lexists(p)]
    if not present:
        return 0
    lock = _lock(version_dir, shared, wait=5.0)
    if lock is None:
        raise OSError("the cache is busy (a process is folding its ledger, or the lock cannot be taken): try again")
    try:
        if not forget:
            return _fold(version_dir, 0, shared, Folding(), zero=True)
        finished = [path for path in files if _finished(path)]
        removed = _entries.remove_files(version_dir, [*finished, summary_path(version_dir)])
        if removed.failed:
            raise OSError(f"stats not reset: {removed.why()}")
        return removed.files
    finally:
        os.close(lock)


def record_added(version_dir: str, nbytes: int, shared: bool) -> None:
    """Count bytes added outside a process's store (a bundle import) in the account: a ledger of
    one record, folded like any other."""
    folder = _files.bookkeeping_dir(version_dir, shared, LEDGER_DIR)
    if folder is not None:
        name = f"{os.getpid()}-{time.time_ns()}{LEDGER_SUFFIX}"
        _files.write_atomic(os.path.join(folder, name), encode({"e": "added", "bytes": nbytes}),
                            _files.file_mode(shared))
