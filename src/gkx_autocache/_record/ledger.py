"""The ledger on disk (SPEC §7): one append-only file per process, the summary they are folded into,
the runs, and the account of bytes that the cap is kept by. Shared by the processes that write it,
the at-exit fold and the commands that read it.

Why this shape:
- One file per process (``ledger/<pid>-<ns>.jsonl``), one ``write()`` per record with ``O_APPEND``,
  so a worker that ends by ``os._exit`` or is killed loses nothing it already recorded (appends of
  several processes to one shared file are not atomic on NFS). A forked child opens its own.
- A ledger grows with the process's distinct keys, never with its lookups: the first hit of a key,
  the first miss of a key (by cause), the first uncached compile (by reason) and each write are
  records; what repeats is counted in memory and appended as a ``tally`` (the counts not written
  as records, cumulative) at most every ``TALLY_SECS`` and at the end. A ledger past
  ``LIVE_LIMIT`` ends with its tally and the process begins another: no one ever reads more than
  that of a live process's ledger, and a process that runs for weeks leaves foldable ledgers
  behind as it goes (100 keys looked up 1 000 000 times: a few KB).
- Liveness: each process holds an ``flock`` on its own ledger for as long as it writes it, and the
  kernel drops it when the process ends, however it ends. A ledger whose lock is free, or that
  ends with a final tally, belongs to a finished process: a fold may read and delete it. Where
  ``flock`` does not work (Lustre, NFS mounted without locks), the ledger's first line says which
  host, process and process start time wrote it: a ledger of this host whose process is gone (or
  whose pid now belongs to a process started at another time) is finished; one of another host is
  once untouched for ``STALE_SECS``.
- The bookkeeping lock: an ``flock`` on ``prune.lock``; where ``flock`` does not work, ``fold.lock``
  created with ``O_EXCL``, stale after ``LOCK_STALE_SECS`` (taken over by renaming it away, which
  only one process can do). The package says once per directory that ``flock`` does not work there
  (the file ``no-flock`` remembers it; ``status`` shows it).
- At the exit of every process that kept a ledger, under the lock (a process that finds it taken
  skips), the ledgers of finished processes are folded: into ``summary.json`` (totals, per-function
  compile costs, the recent misses, the last runs, the size account) and into the index of entries
  (``_index``). The bookkeeping grows with distinct functions and entries, never with runs.
- A reset (``stats --reset``, ``clear``) cannot fold a running process's ledger: the summary keeps
  where each stood (``offsets``: its records and last tally then), so only what it records after
  counts, and after ``clear`` only that is indexed.
- The size account: ``size`` is the directory's bytes on disk (allocated blocks, as ``du`` counts
  them: entries, sidecars, temporaries and this bookkeeping) as of the last full scan, plus the
  writes folded since. A fold adds, for its decision only, those of live processes' ledgers. A
  process that skipped the fold, was killed or ended by ``os._exit`` still has its writes in its
  ledger, counted by the next fold. Writers it cannot see (stock JAX on the same directory, files
  copied in) are caught by a full scan at least hourly, with or without a cap (the scan compacts the
  index too, so ``max_size = 0`` does not let it grow). Over the cap, a full scan decides and the
  directory is pruned to 90 % of it. The bookkeeping is charged at most ``BOOKKEEPING_SHARE`` of it
  (or ``BOOKKEEPING_FLOOR``, for a cap of a few hundred KB), so a small cap still holds entries.

Everything read from these files is validated (a member of a team cache can write anything in
them): a bad line or field is skipped, never a crash.
"""

from __future__ import annotations

import errno
import json
import math
import os
import socket
import stat
import time
from typing import Any

from gkx_autocache import _files
from gkx_autocache._diagnostics import logger
from gkx_autocache._layout import (
    EXCL_LOCK_FILE,
    LEDGER_DIR,
    LEDGER_SUFFIX,
    LOCK_FILE,
    META_DIR,
    NO_FLOCK_FILE,
    SUMMARY_FILE,
    function_name,
    is_url,
)

FORMAT = 2
RESCAN_SECS = 3600.0
PRUNE_TO = 0.9
LIVE_LIMIT = 1 << 20  # a process begins a new ledger past this
READ_LIMIT = 16 << 20  # the most read of one ledger (a hostile one: the rest is said to be skipped)
SUMMARY_LIMIT = 64 << 20
TALLY_SECS = 2.0
STALE_SECS = 86400.0  # another host's ledger, untouched this long, is finished (where flock fails)
LOCK_STALE_SECS = 600.0  # a fold.lock this old was left by a process that died folding
BOOKKEEPING_SHARE = 0.05  # of the cap, at most, is charged for the package's own files...
BOOKKEEPING_FLOOR = 64 << 10  # ...or this much, where that is more (a cap of a few hundred KB)
RECENT = 500  # misses and uncached compiles kept for `explain`
MAX_RUNS = 20  # runs kept for `explain`
MAX_FUNCTIONS = 5000  # function names whose compile costs `stats` lists
MAX_INT = 1 << 62
MAX_FLOAT = 1e12
KINDS = ("start", "hit", "miss", "put", "uncached", "tally", "added", "evicted", "index", "sum", "levels")
UNSUPPORTED = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL)  # flock: no locks here


# -- records ------------------------------------------------------------------------------------

_FIELDS = {**dict.fromkeys(("bytes", "hits", "misses", "own_hits", "uncached", "pid", "born", "disk", "bytes_read"),
                           "count"),
           **dict.fromkeys(("saved", "compile", "t"), "number"),
           **dict.fromkeys(("key", "cause", "detail", "reason", "change", "run", "host", "label", "by", "off"), "text"),
           "own": "flag", "end": "flag", "helper": "flag", "more": "flag", "rec": "long", "causes": "counts",
           "reasons": "counts", "local": "level", "shared": "level"}


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
    if kind in ("text", "long"):
        return value if isinstance(value, str) and len(value) <= (4096 if kind == "text" else 1 << 20) else None
    if kind == "flag":
        return True if value is True else None
    if kind == "level":  # a level's numbers (SPEC §14)
        return add_levels({}, {"_": value})["_"] if isinstance(value, dict) else None
    if isinstance(value, dict):  # "counts": a name -> count table
        return {k[:200]: n for k, v in list(value.items())[:1000] if isinstance(k, str) and (n := _count(v)) is not None}
    return None


def parse_record(line: bytes | str) -> dict[str, Any] | None:
    """One ledger line as a record with only well-formed fields, or None: a torn last line, or
    anything a hostile writer put there."""
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
    return (json.dumps(record, separators=(",", ":")) + "\n").encode("utf-8", "surrogatepass")


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


def _add_counts(mine: dict[str, int], theirs: dict[str, int], sign: int = 1) -> None:
    for key, n in theirs.items():
        mine[key] = mine.get(key, 0) + sign * n
        if mine[key] <= 0:
            del mine[key]


class Totals:
    """Counts summed over records (a plain class: this module is imported on ``import jax``).

    The arithmetic (SPEC §13.1): lookups not served are ``misses`` (cacheable compiles) plus
    ``not_cached`` (compiles JAX does not write); each has its breakdown in full, ``causes`` and
    ``reasons``; the hit rate is over cacheable lookups."""

    COUNTS = ("hits", "own_hits", "misses", "not_cached", "bytes_read", "bytes_written", "writes")

    def __init__(self) -> None:
        self.hits = 0
        self.own_hits = 0  # hits of entries written in the same run: not the cache being warm
        self.misses = 0
        self.not_cached = 0
        self.saved_secs = 0.0
        self.bytes_read = 0
        self.bytes_written = 0
        self.writes = 0
        self.causes: dict[str, int] = {}  # misses by cause (SPEC §13)
        self.reasons: dict[str, int] = {}  # compiles JAX did not write, by reason
        self.functions: dict[str, list[float]] = {}  # function name -> [compile seconds, writes]
        self.helpers: set[str] = set()  # of those, JAX's own helpers (listed after the user's functions)
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
            cause = record.get("cause") or "unexplained"
            self.causes[cause] = self.causes.get(cause, 0) + 1
        elif kind == "uncached":
            self.not_cached += 1
            reason = record.get("reason") or "unknown"
            self.reasons[reason] = self.reasons.get(reason, 0) + 1
        elif kind == "put":
            self.writes += 1
            self.bytes_written += record.get("bytes", 0)
            cost = self.functions.setdefault(function_name(record.get("key", "?-")), [0.0, 0])
            cost[0] += record.get("compile", 0.0)
            cost[1] += 1
            if record.get("helper"):
                self.helpers.add(function_name(record.get("key", "?-")))
            if len(self.functions) > MAX_FUNCTIONS:  # bounded: the oldest name goes
                self.helpers.discard(oldest := next(iter(self.functions)))
                del self.functions[oldest]
        elif kind == "levels":
            add_levels(self.levels, {k: v for k, v in record.items() if k != "e"})
        elif kind in ("sum", "tally"):  # a remote directory's process at exit; the repeats of a ledger
            self.hits += record.get("hits", 0)
            self.own_hits += record.get("own_hits", 0)
            self.misses += record.get("misses", 0)
            self.not_cached += record.get("uncached", 0)
            self.saved_secs += record.get("saved", 0.0)
            self.bytes_read += record.get("bytes_read", 0)
            _add_counts(self.causes, record.get("causes", {}))
            _add_counts(self.reasons, record.get("reasons", {}))

    def tally(self) -> dict[str, Any]:
        """These counts as a ``tally`` record (what was counted but not written as records)."""
        return {"e": "tally", "hits": self.hits, "own_hits": self.own_hits, "misses": self.misses,
                "uncached": self.not_cached, "saved": round(self.saved_secs, 6), "bytes_read": self.bytes_read,
                "causes": dict(self.causes), "reasons": dict(self.reasons)}

    def merge(self, other: Totals, sign: int = 1) -> None:
        for name in (*self.COUNTS, "saved_secs"):
            setattr(self, name, getattr(self, name) + sign * getattr(other, name))
        _add_counts(self.causes, other.causes, sign)
        _add_counts(self.reasons, other.reasons, sign)
        add_levels(self.levels, other.levels, sign)
        if sign > 0:
            for name, (secs, writes) in other.functions.items():
                cost = self.functions.setdefault(name, [0.0, 0])
                cost[0] += secs
                cost[1] += writes
            self.helpers |= other.helpers

    @property
    def empty(self) -> bool:
        return not (self.hits or self.misses or self.writes or self.not_cached)

    def to_json(self, functions: bool = True) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.COUNTS}
        data.update(saved_secs=round(self.saved_secs, 6), causes=self.causes, reasons=self.reasons, levels=self.levels)
        if functions:
            data["functions"] = self.functions
            data["helpers"] = sorted(self.helpers)
        return data

    @classmethod
    def from_json(cls, data: Any) -> Totals:
        totals = cls()
        if not isinstance(data, dict):
            return totals
        for name in cls.COUNTS:
            setattr(totals, name, _count(data.get(name)) or 0)
        totals.saved_secs = _number(data.get("saved_secs")) or 0.0
        totals.causes = _field("counts", data.get("causes")) or {}
        totals.reasons = _field("counts", data.get("reasons")) or {}
        if isinstance(data.get("levels"), dict):
            add_levels(totals.levels, data["levels"])
        functions = data.get("functions")
        if isinstance(functions, dict):
            for name, cost in list(functions.items())[-MAX_FUNCTIONS:]:
                if isinstance(name, str) and isinstance(cost, list) and len(cost) == 2:
                    secs, writes = _number(cost[0]), _count(cost[1])
                    if secs is not None and writes is not None:
                        totals.functions[name[:200]] = [secs, writes]
        helpers = data.get("helpers")
        if isinstance(helpers, list):
            totals.helpers = {h for h in helpers if isinstance(h, str) and h in totals.functions}
        return totals


# -- one ledger file ------------------------------------------------------------------------------


class Ledger:
    """One ledger file, read: its records, its counts, who wrote it and whether it ended."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        self.totals = Totals()
        self.start: dict[str, Any] | None = None
        self.ended = False
        self.disk = 0  # the bytes on disk its writes added (entries and sidecars)
        self.mtime = 0.0
        self.skipped = 0  # bytes beyond READ_LIMIT: said, not dropped silently
        self.size = 0
        self.tally: dict[str, Any] | None = None  # its last tally (cumulative: what repeated)
        self.counted = 0  # records before this one were made before the last reset (``since``)
        self.tables: list[str] = []  # index table lines of records forgotten by ``clear`` (``since``)

    @property
    def run(self) -> str:
        return str((self.start or {}).get("run") or "")

    def offset(self, forget: bool, earlier: Any = None) -> dict[str, Any]:
        """Where this ledger stands now, for a reset that cannot fold it (its process is running):
        only what it records after this counts; with ``forget`` (a ``clear``) only that is indexed,
        and a ``stats --reset`` after a ``clear`` keeps what the clear forgot (``earlier``)."""
        forgotten = len(self.records) if forget else 0
        if isinstance(earlier, dict) and (known := _count(earlier.get("forget_n"))) is not None:
            forgotten = max(forgotten, known)
        return {"n": len(self.records), "tally": self.tally or {"e": "tally"}, "forget_n": forgotten}

    def since(self, offset: Any) -> None:
        """Count only what this ledger recorded after ``offset`` (see ``offset``); a malformed one
        (a hostile summary) counts everything."""
        if not isinstance(offset, dict) or _count(offset.get("n")) is None:
            return
        before = parse_record(json.dumps(offset.get("tally"))) if isinstance(offset.get("tally"), dict) else None
        self.counted = min(offset["n"], len(self.records))
        self.totals = Totals()
        for record in self.records[self.counted:]:
            self.totals.add(record)
        if self.tally is not None:
            repeats = Totals()
            repeats.add(self.tally)
            if before is not None and before["e"] == "tally":
                earlier = Totals()
                earlier.add(before)
                repeats.merge(earlier, -1)
            self.totals.merge(repeats)
        forgotten = min(_count(offset.get("forget_n")) or 0, len(self.records))
        if forgotten:  # ``clear``: what it wrote before is gone, and forgotten...
            # ...but for the tables its later entries' lines refer to (a process gives each once)
            self.tables = [line for r in self.records[:forgotten] if r["e"] in ("put", "index")
                           for line in str(r.get("rec", "")).split("\n") if line and not line.startswith("E\t")]
            self.records = self.records[forgotten:]
            self.counted = max(self.counted - forgotten, 0)
            self.disk = sum(r.get("disk", r.get("bytes", 0)) for r in self.records if r["e"] in ("put", "added"))


def read_ledger(path: str) -> Ledger:
    """The well-formed records of one ledger file (local or remote), and what they come to: the
    records summed, and the last tally (the counts of what repeated)."""
    ledger = Ledger(path)
    if is_url(path):
        from gkx_autocache import _remote

        data = _remote.read_bytes(path) or b""
    else:
        stat_seen: list[os.stat_result] = []
        data = _files.read(path, READ_LIMIT, check=lambda st: stat_seen.append(st)) or b""
        if stat_seen:
            ledger.mtime, ledger.size = stat_seen[0].st_mtime, stat_seen[0].st_size
            ledger.skipped = max(stat_seen[0].st_size - READ_LIMIT, 0)
    tally: dict[str, Any] | None = None
    for line in data.splitlines():
        record = parse_record(line)
        if record is None:
            continue
        kind = record["e"]
        if kind == "start":
            ledger.start = ledger.start or record
        elif kind == "tally":
            tally = record
            ledger.ended = ledger.ended or bool(record.get("end"))
        else:
            ledger.records.append(record)
            ledger.totals.add(record)
            if kind in ("put", "added"):
                ledger.disk += record.get("disk", record.get("bytes", 0))
    if tally is not None:
        ledger.totals.add(tally)
        ledger.tally = tally
    return ledger


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


# -- liveness -----------------------------------------------------------------------------------


def host() -> str:
    return socket.gethostname()[:100]


def born(pid: int) -> int | None:
    """When the process started, in the kernel's clock ticks since boot (Linux), or None: with the
    pid, it tells a live process from one that reused its pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read(4096).rsplit(b")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int, started: int | None) -> bool:
    """Whether the process ``pid`` (started at ``started``, where known) is running on this host."""
    if pid <= 0:
        return False
    now = born(pid)
    if now is not None:
        return started is None or now == started
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: it exists
    return True


def _flock(fd: int, blocking: bool = False) -> bool | None:
    """Take an exclusive flock: True, False when another holds it, None when flock does not work
    on this file system (Lustre, NFS without locks)."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        return True
    except OSError as exc:
        if exc.errno in UNSUPPORTED:
            return None
        return False
    except Exception:  # a flock replaced by something broken: as if there were none
        return None


def finished(ledger: Ledger) -> bool:
    """Whether the ledger's process has finished writing it (see the module's docstring). Its lock
    is taken and let go at once (a finished process does not come back), so a fold of 100 000
    ledgers holds no more descriptors than one. Opened for writing: on NFS, Linux turns ``flock``
    into a POSIX lock, and an exclusive one needs a descriptor open for writing."""
    if ledger.ended:
        return True
    try:
        fd = _files.open_regular(ledger.path, write=True)
    except OSError:
        return False
    try:
        free = _flock(fd)
    finally:
        os.close(fd)
    if free is not None:
        return free
    start = ledger.start
    if start is None:  # a command's ledger (prune, import: written whole), or a process's just created
        return ledger.size > 0 or time.time() - ledger.mtime > LOCK_STALE_SECS  # (empty until its start line)
    if start.get("host") != host():
        return time.time() - ledger.mtime > STALE_SECS
    return not alive(start.get("pid", 0), start.get("born"))


def no_flock(version_dir: str, shared: bool, why: str) -> bool:
    """Remember that this directory's file system has no working flock; True the first time (the
    caller warns then, once per directory)."""
    folder = _files.bookkeeping_dir(version_dir, shared)
    if folder is None:
        return False
    try:
        fd = _files.open_in(folder, NO_FLOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _files.NOFOLLOW,
                            _files.file_mode(shared))
    except OSError:
        return False
    try:
        os.write(fd, f"{time.strftime('%Y-%m-%d %H:%M:%S')} {why}\n".encode())
    finally:
        os.close(fd)
    return True


def flock_note(version_dir: str) -> str | None:
    """What ``status`` says where flock was found not to work, or None."""
    data = _files.read(os.path.join(version_dir, META_DIR, NO_FLOCK_FILE), 512)
    if data is None:
        return None
    return (f"this file system has no working flock (seen {data.decode('utf-8', 'replace').strip()[:19]}): "
            f"gkx-autocache uses a lock file ({EXCL_LOCK_FILE}, stale after {LOCK_STALE_SECS / 60:.0f} min) and "
            "tells live processes by their pid")


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
        summary.size = _count(data.get("size")) or 0
        summary.scanned_at = _number(data.get("scanned_at")) or 0.0
        summary.reset_at = _number(data.get("reset_at")) or 0.0
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
    return {"start": _number(entry.get("start")) or 0.0, "end": _number(entry.get("end")) or 0.0,
            "label": str(entry.get("label") or "")[:200], "processes": _count(entry.get("processes")) or 0,
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
    record = parse_record(json.dumps(item)) if isinstance(item, dict) else None
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


def _write_summary(version_dir: str, summary: Summary, shared: bool) -> bool:
    data = json.dumps(summary.to_json(), separators=(",", ":")).encode()
    return _files.write_atomic(summary_path(version_dir), data, _files.file_mode(shared))


# -- reading, for the commands ------------------------------------------------------------------


class Reading:
    """What the commands show of a directory: the summary and every ledger not folded yet (live
    ones included: each is at most ``LIVE_LIMIT`` long)."""

    def __init__(self, version_dir: str) -> None:
        self.summary = None if is_url(version_dir) else read_summary(version_dir)
        folded = set(self.summary.folded) if self.summary else set()
        self.ledgers = [read_ledger(p) for p in ledger_files(version_dir) if os.path.basename(p) not in folded]
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
            add_run(runs, ledger)
        return dict(sorted(runs.items(), key=lambda kv: kv[1]["end"]))

    @property
    def skipped(self) -> int:
        return sum(ledger.skipped for ledger in self.ledgers)


# -- the lock, folding and the cap --------------------------------------------------------------


def _lock(version_dir: str, shared: bool, wait: float = 0.0) -> int | None:
    """The bookkeeping lock, taken: a descriptor to close to let it go (-1 for the lock file of a
    file system without flock, let go by ``_unlock``); None when another process holds it (after
    ``wait`` seconds) or it cannot be taken."""
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
        os.close(meta_fd)
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        os.close(meta_fd)
        return None
    try:
        os.fchmod(fd, _files.file_mode(shared))  # the umask masked the open mode; only its owner can do this
    except OSError:
        pass
    deadline = time.monotonic() + wait
    try:
        while True:
            taken = _flock(fd)
            if taken is None:  # no flock here: the lock file instead
                os.close(fd)
                return _excl_lock(meta_fd, version_dir, shared, deadline)
            if taken:
                return fd
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)
    finally:
        os.close(meta_fd)


def _excl_lock(meta_fd: int, version_dir: str, shared: bool, deadline: float) -> int | None:
    """``fold.lock``, created with ``O_EXCL``: -1 once taken. One older than ``LOCK_STALE_SECS`` was
    left by a process that died folding (or one naming a process of this host that is gone):
    renamed away, then taken. Two processes can both see it
    stale; the one whose rename comes second moves the other's fresh lock, sees that it is not the
    file it looked at, and puts it back."""
    no_flock(version_dir, shared, "flock() fails here")
    while True:
        try:
            fd = os.open(EXCL_LOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _files.NOFOLLOW, _files.file_mode(shared),
                         dir_fd=meta_fd)
        except FileExistsError:
            try:
                st = os.stat(EXCL_LOCK_FILE, dir_fd=meta_fd, follow_symlinks=False)
                if time.time() - st.st_mtime > LOCK_STALE_SECS or _holder_gone(meta_fd):
                    away = f".{EXCL_LOCK_FILE}.{os.getpid()}.stale.tmp"
                    os.rename(EXCL_LOCK_FILE, away, src_dir_fd=meta_fd, dst_dir_fd=meta_fd)
                    moved = os.stat(away, dir_fd=meta_fd, follow_symlinks=False)
                    if (moved.st_ino, moved.st_mtime_ns) != (st.st_ino, st.st_mtime_ns):
                        # Another process took the stale lock over between our look and our
                        # rename: what we moved is its fresh lock. Put it back; it holds it.
                        try:
                            os.link(away, EXCL_LOCK_FILE, src_dir_fd=meta_fd, dst_dir_fd=meta_fd)
                        except OSError:
                            pass
                        os.unlink(away, dir_fd=meta_fd)
                        raise FileExistsError(EXCL_LOCK_FILE)
                    os.unlink(away, dir_fd=meta_fd)
                    continue
            except OSError:
                pass
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)
            continue
        except OSError as exc:
            from gkx_autocache._diagnostics import warn

            warn(f"lock:{version_dir}", f"{version_dir}: neither flock nor a lock file works here ({exc.strerror}); "
                                        "max_size is not kept and stats are not folded")
            return None
        try:
            os.write(fd, f"{host()} {os.getpid()} {time.time():.0f}\n".encode())
        finally:
            os.close(fd)
        _excl_held.append(os.path.join(version_dir, META_DIR, EXCL_LOCK_FILE))
        return -1


def _holder_gone(meta_fd: int) -> bool:
    """Whether ``fold.lock`` names a process of this host that is no longer running (killed while
    folding): then it is stale at once, not after ``LOCK_STALE_SECS``."""
    try:
        fd = _files.open_regular(EXCL_LOCK_FILE, dir_fd=meta_fd)
        try:
            fields = os.read(fd, 256).decode("utf-8", "replace").split()
        finally:
            os.close(fd)
    except OSError:
        return False
    return len(fields) == 3 and fields[0] == host() and fields[1].isdigit() and not alive(int(fields[1]), None)


_excl_held: list[str] = []


def _unlock(lock: int) -> None:
    if lock >= 0:
        os.close(lock)
    elif _excl_held:
        _files.remove(_excl_held.pop())


def fold(version_dir: str, cap: int, shared: bool) -> None:
    """Fold the ledgers of finished processes into the summary and the index, and keep the
    directory under ``cap`` (0: no cap). At exit, under the non-blocking lock: a process that finds
    it taken skips (its ledger is folded by the next). Never raises."""
    try:
        lock = _lock(version_dir, shared)
    except Exception as exc:  # bookkeeping: never a failure at exit
        logger.debug("fold skipped: %s", exc)
        return
    if lock is None:
        return
    try:
        _fold(version_dir, cap, shared)
    except Exception as exc:
        logger.debug("fold failed: %s", exc)
    finally:
        _unlock(lock)


def _fold(version_dir: str, cap: int, shared: bool, zero: bool = False) -> int:
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
    for path in ledger_files(version_dir):
        if os.path.basename(path) in already:
            done.append(path)  # folded before; its removal failed
            continue
        ledger = read_ledger(path)
        if not finished(ledger):  # a live process: its writes count for the decision, not the record
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
        lines.extend(ledger.tables)
        for i, record in enumerate(ledger.records):
            kind = record["e"]
            if kind in ("miss", "uncached"):
                if i >= ledger.counted:
                    _remember(recent, {**record, "run": ledger.run})
            elif kind in ("put", "index") and record.get("rec"):
                lines.extend(record["rec"].split("\n"))
            elif kind == "evicted" and record.get("key"):
                from gkx_autocache._explain import index as _index

                lines.extend(_index.removed_lines([record["key"]], record.get("reason") or "prune", record.get("t")))
    if lines:  # a run where every lookup hit has none: the index module is not even imported
        from gkx_autocache._explain import index as _index

        _index.append(version_dir, lines, shared)
    summary.recent = list(recent.values())
    if zero:
        summary.totals, summary.recent, summary.runs, summary.reset_at = Totals(), [], {}, time.time()
    # A full scan hourly, with or without a cap (it compacts the index), and whenever over the cap.
    # Not at a reset: ``stats --reset`` keeps the index and the size account as they are.
    if not zero and ((cap and summary.size + live_disk > cap) or time.time() - summary.scanned_at > RESCAN_SECS):
        try:
            _keep_under(version_dir, cap, summary, shared, pending)
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


def _keep_under(version_dir: str, cap: int, summary: Summary, shared: bool, pending: list[str] | None = None) -> None:
    """A full scan; the index rewritten for what is there (and the tables ``pending``, live
    processes' index lines, refer to); above the cap (0: none), prune to 90 % of it, least recently
    used first. The bookkeeping is charged at most ``BOOKKEEPING_SHARE`` of the cap, so a small cap
    still holds entries."""
    from gkx_autocache import _entries
    from gkx_autocache._explain import index as _index

    found = _entries.scan(version_dir)
    stale = [t for t in found.temporary if time.time() - t[2] > _entries.STALE_TMP_SECS]  # writers killed mid-write
    if stale:
        _entries.remove_files(version_dir, [t[0] for t in stale])
        found.temporary = [t for t in found.temporary if t not in stale]
    entries = found.bytes
    bookkeeping = _entries.bookkeeping_bytes(version_dir)
    charged = min(bookkeeping, max(int(cap * BOOKKEEPING_SHARE), BOOKKEEPING_FLOOR))
    if cap and entries + charged > cap:
        removed = _entries.select_over(list(found.units.values()), max(int(cap * PRUNE_TO) - charged, 0))
        freed = _entries.remove_files(version_dir, [p for u in removed for p in u.files]).bytes
        entries -= sum(u.bytes for u in removed) if freed else 0
        for unit in removed:
            found.units.pop(unit.key, None)
        _index.append(version_dir, _index.removed_lines([u.key for u in removed if u.has_entry], "max_size"), shared)
        logger.debug("pruned %d entries (%d bytes) from %s", len(removed), freed, version_dir)
    present = {_index.split_key(key) for key, unit in found.units.items() if unit.has_entry}
    _index.compact(version_dir, present, shared, pending=pending)
    summary.size = entries + _entries.bookkeeping_bytes(version_dir)
    summary.scanned_at = time.time()


def reset(version_dir: str, shared: bool = False, forget: bool = False) -> int:
    """Start the totals again (``stats --reset``): finished ledgers are folded, then the totals,
    recent misses and runs are zeroed; the index and the size account stay. With ``forget``
    (``clear``, a fresh start), the summary, the index and the finished ledgers go. A running
    process keeps its ledger (deleting it would lose what it records next). The count of files
    folded or removed. Raises OSError when a fold in progress holds the lock past a few seconds."""
    from gkx_autocache import _entries
    from gkx_autocache._explain import index as _index

    files = ledger_files(version_dir)
    if is_url(version_dir):
        return _entries.remove_files(version_dir, files).files
    extra = [summary_path(version_dir), _index.index_path(version_dir)]
    present = [p for p in [*files, *extra] if os.path.lexists(p)]
    if not present:
        return 0
    lock = _lock(version_dir, shared, wait=5.0)
    if lock is None:
        raise OSError("the cache is busy (a process is folding its ledger, or the lock cannot be taken): try again")
    try:
        if not forget:
            return _fold(version_dir, 0, shared, zero=True)
        fresh = Summary()  # a fresh start: a running process's records so far are forgotten too
        done = []
        for path in files:
            ledger = read_ledger(path)
            if finished(ledger):
                done.append(path)
            else:
                fresh.offsets[os.path.basename(path)] = ledger.offset(forget=True)
        removed = _entries.remove_files(version_dir, [*done, *extra])
        if removed.failed:
            raise OSError(f"stats not reset: {removed.why()}")
        if fresh.offsets:
            fresh.reset_at = time.time()
            _write_summary(version_dir, fresh, shared)
        return removed.files
    finally:
        _unlock(lock)


def _command_ledger(version_dir: str, records: list[dict[str, Any]], shared: bool) -> None:
    """A ledger of a command's records (no process writes it after: it is finished at once)."""
    folder = _files.bookkeeping_dir(version_dir, shared, LEDGER_DIR)
    if folder is not None and records:
        name = f"{os.getpid()}-{time.time_ns()}{LEDGER_SUFFIX}"
        _files.write_atomic(os.path.join(folder, name), b"".join(encode(r) for r in records), _files.file_mode(shared))


def _to_index(version_dir: str, lines: list[str], shared: bool) -> bool:
    """Append a command's index lines at once, under the lock (waiting a little), so that the next
    miss knows them; False when the lock cannot be had (then a ledger carries them)."""
    from gkx_autocache._explain import index as _index

    lock = _lock(version_dir, shared, wait=5.0)
    if lock is None:
        return False
    try:
        return _index.append(version_dir, lines, shared)
    finally:
        _unlock(lock)


def record_evicted(version_dir: str, keys: list[str], reason: str, shared: bool) -> None:
    """Remember keys a command removed (``prune``, ``verify --repair``), so that their next miss is
    named ``evicted`` with who removed them."""
    if not keys:
        return
    from gkx_autocache._explain import index as _index

    now = round(time.time(), 3)
    if not _to_index(version_dir, _index.removed_lines(keys, reason, now), shared):
        _command_ledger(version_dir, [{"e": "evicted", "key": key, "reason": reason, "t": now} for key in keys], shared)


def record_added(version_dir: str, nbytes: int, shared: bool, lines: list[str] | None = None) -> None:
    """Count bytes added outside a process's store (a bundle import) in the account, and index the
    entries it brought (their records travel in the bundle)."""
    records: list[dict[str, Any]] = [{"e": "added", "bytes": nbytes}]
    if lines and not _to_index(version_dir, lines, shared):
        records.append({"e": "index", "rec": "\n".join(lines)})
    _command_ledger(version_dir, records, shared)
