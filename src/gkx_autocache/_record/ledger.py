"""The ledger on disk (SPEC §7): one append-only file per process. Its records and their codec,
the totals they sum to, one ledger read, and liveness: whether the process that wrote it is done.
The summary they are folded into is ``fold``'s; the bookkeeping lock is ``locks``'s.

Imported on ``import jax`` (the recorder writes ledgers): it imports little. The design:
docs/how-it-works.md, "The ledger: design notes". Everything read from these files is validated (a
member of a team cache can write anything in them): a bad line or field is skipped, never a crash.
"""

from __future__ import annotations

import errno
import json
import math
import os
import socket
import time
from typing import Any

from gkx_autocache import _files
from gkx_autocache._layout import LEDGER_DIR, LEDGER_SUFFIX, META_DIR, NO_FLOCK_FILE, function_name, is_url

LIVE_LIMIT = 1 << 20  # a process begins a new ledger past this
LEDGER_READ_LIMIT = 16 << 20  # the most read of one ledger (a hostile one: the rest is said to be skipped)
TALLY_SECS = 2.0
STALE_SECS = 86400.0  # another host's ledger, untouched this long, is finished (where flock fails)
LOCK_STALE_SECS = 600.0  # a fold.lock this old was left by a process that died folding
RECENT = 500  # misses and uncached compiles kept for `explain`
MAX_FUNCTIONS = 5000  # function names whose compile costs `stats` lists
MAX_TRACED = 200  # function names whose tracing and lowering a tally keeps (the slowest)
MAX_INT = 1 << 62
MAX_FLOAT = 1e12
KINDS = ("start", "hit", "miss", "put", "uncached", "tally", "added", "evicted", "index", "sum", "levels")
UNSUPPORTED = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL)  # flock: no locks here


# -- records ------------------------------------------------------------------------------------

_FIELDS = {**dict.fromkeys(("bytes", "hits", "misses", "own_hits", "uncached", "pid", "born", "disk", "bytes_read",
                            "rebuilt_hits"), "count"),
           **dict.fromkeys(("saved", "compile", "t", "uncached_secs", "read", "reads", "tracing"), "number"),
           **dict.fromkeys(("key", "cause", "detail", "reason", "change", "run", "host", "label", "by", "off",
                            "origin", "rerun", "norec"), "text"),
           "own": "flag", "rebuilt": "flag", "end": "flag", "helper": "flag", "more": "flag", "rec": "long", "causes": "counts",
           "reasons": "counts", "local": "level", "shared": "level", "traced": "seconds"}


def as_count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_INT else None


def as_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value) if abs(value) < MAX_FLOAT * 10 else math.inf
    return number if 0.0 <= number <= MAX_FLOAT else None


def _field(kind: str, value: Any) -> Any:
    """The value if it is well-formed for its kind of field, else None."""
    if kind == "count":
        return as_count(value)
    if kind == "number":
        return as_number(value)
    if kind in ("text", "long"):
        return value if isinstance(value, str) and len(value) <= (4096 if kind == "text" else 1 << 20) else None
    if kind == "flag":
        return True if value is True else None
    if kind == "level":  # a level's numbers (SPEC §14)
        return add_levels({}, {"_": value})["_"] if isinstance(value, dict) else None
    if kind == "seconds":  # a name -> seconds table
        return ({k[:200]: n for k, v in list(value.items())[:MAX_TRACED] if isinstance(k, str) and (n := as_number(v)) is not None}
                if isinstance(value, dict) else None)
    if isinstance(value, dict):  # "counts": a name -> count table
        return {k[:200]: n for k, v in list(value.items())[:1000] if isinstance(k, str) and (n := as_count(v)) is not None}
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
            if isinstance(name, str) and len(name) <= 32 and (good := as_number(n)) is not None:
                mine[name] = max(mine.get(name, 0) + sign * (n if isinstance(n, int) else good), 0)
    return total


def _add_seconds(mine: dict[str, float], theirs: dict[str, float], sign: int = 1) -> None:
    """Add (or take away) one name -> seconds table to another, bounded: past ``MAX_TRACED``
    names, the quickest go."""
    for key, secs in theirs.items():
        mine[key] = mine.get(key, 0.0) + sign * secs
        if mine[key] <= 1e-9:
            del mine[key]
    if len(mine) > 2 * MAX_TRACED:
        kept = slowest(mine)
        mine.clear()
        mine.update(kept)


def slowest(traced: dict[str, float], n: int = MAX_TRACED) -> dict[str, float]:
    """The ``n`` slowest names of a name -> seconds table, slowest first, rounded."""
    return {k: round(v, 6) for k, v in sorted(traced.items(), key=lambda kv: -kv[1])[:n]}


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

    COUNTS = ("hits", "own_hits", "misses", "not_cached", "bytes_read", "bytes_written", "writes", "rebuilt_hits",
              "rebuilt")

    def __init__(self) -> None:
        self.hits = 0
        self.own_hits = 0  # hits of entries written in the same run: not the cache being warm
        self.rebuilt_hits = 0  # hits of entries a rebuild compiled from a record (SPEC §18)
        self.rebuilt = 0  # entries a rebuild wrote (of ``writes``)
        self.unrecorded: dict[str, int] = {}  # entries written without a record, by why (SPEC §18)
        self.misses = 0
        self.not_cached = 0
        self.saved_secs = 0.0
        self.not_cached_secs = 0.0  # the compile time of the compiles not cached: paid again on every run
        self.bytes_read = 0
        self.bytes_written = 0
        self.writes = 0
        self.causes: dict[str, int] = {}  # misses by cause (SPEC §13)
        self.reasons: dict[str, int] = {}  # compiles JAX did not write, by reason
        self.functions: dict[str, list[float]] = {}  # function name -> [compile seconds, writes]
        self.helpers: set[str] = set()  # of those, JAX's own helpers (listed after the user's functions)
        self.levels: dict[str, dict[str, Any]] = {}  # local and shared level numbers (SPEC §14)
        self.reads_secs = 0.0  # JAX's time reading and loading the entries it hit
        self.tracing_secs = 0.0  # tracing and lowering, which no cache skips (JAX's duration events)
        self.traced: dict[str, float] = {}  # function name -> its tracing and lowering seconds

    def add(self, record: dict[str, Any]) -> None:
        """Count one record (as ``parse_record`` returns it)."""
        kind = record["e"]
        if kind == "hit":
            self.hits += 1
            self.own_hits += bool(record.get("own"))
            self.rebuilt_hits += bool(record.get("rebuilt"))
            self.saved_secs += record.get("saved", 0.0)
            self.bytes_read += record.get("bytes", 0)
            self.reads_secs += record.get("read", 0.0)
        elif kind == "trace":  # counted, never written one by one: in the tally
            self.tracing_secs += record["secs"]
            if record.get("name"):
                _add_seconds(self.traced, {record["name"]: record["secs"]})
        elif kind == "miss":
            self.misses += 1
            cause = record.get("cause") or "unexplained"
            self.causes[cause] = self.causes.get(cause, 0) + 1
        elif kind == "uncached":
            self.not_cached += 1
            self.not_cached_secs += record.get("compile", 0.0)
            reason = record.get("reason") or "unknown"
            self.reasons[reason] = self.reasons.get(reason, 0) + 1
            self._cost(record, written=False)
        elif kind == "put":
            self.writes += 1
            self.rebuilt += bool(record.get("rebuilt"))
            if record.get("norec"):
                _add_counts(self.unrecorded, {record["norec"][:200]: 1})
            self.bytes_written += record.get("bytes", 0)
            self._cost(record, written=True)
        elif kind == "levels":
            add_levels(self.levels, {k: v for k, v in record.items() if k != "e"})
        elif kind in ("sum", "tally"):  # a remote directory's process at exit; the repeats of a ledger
            self.hits += record.get("hits", 0)
            self.own_hits += record.get("own_hits", 0)
            self.rebuilt_hits += record.get("rebuilt_hits", 0)
            self.misses += record.get("misses", 0)
            self.not_cached += record.get("uncached", 0)
            self.not_cached_secs += record.get("uncached_secs", 0.0)
            self.saved_secs += record.get("saved", 0.0)
            self.bytes_read += record.get("bytes_read", 0)
            _add_counts(self.causes, record.get("causes", {}))
            _add_counts(self.reasons, record.get("reasons", {}))
            self.reads_secs += record.get("reads", 0.0)
            self.tracing_secs += record.get("tracing", 0.0)
            _add_seconds(self.traced, record.get("traced", {}))

    def _cost(self, record: dict[str, Any], written: bool) -> None:
        """Add a compile's time to its function's (a function never written was never cached)."""
        name = function_name(record.get("key", "?-"))
        cost = self.functions.setdefault(name, [0.0, 0])
        cost[0] += record.get("compile", 0.0)
        cost[1] += written
        if record.get("helper"):
            self.helpers.add(name)
        if len(self.functions) > MAX_FUNCTIONS:  # bounded: the oldest name goes
            self.helpers.discard(oldest := next(iter(self.functions)))
            del self.functions[oldest]

    def tally(self) -> dict[str, Any]:
        """These counts as a ``tally`` record (what was counted but not written as records)."""
        return {"e": "tally", "hits": self.hits, "own_hits": self.own_hits, "rebuilt_hits": self.rebuilt_hits,
                "misses": self.misses,
                "uncached": self.not_cached, "uncached_secs": round(self.not_cached_secs, 6), "saved": round(self.saved_secs, 6), "bytes_read": self.bytes_read,
                "causes": dict(self.causes), "reasons": dict(self.reasons), "reads": round(self.reads_secs, 6),
                "tracing": round(self.tracing_secs, 6), "traced": slowest(self.traced)}

    def merge(self, other: Totals, sign: int = 1) -> None:
        for name in (*self.COUNTS, "saved_secs", "not_cached_secs", "reads_secs", "tracing_secs"):
            setattr(self, name, getattr(self, name) + sign * getattr(other, name))
        _add_seconds(self.traced, other.traced, sign)
        _add_counts(self.causes, other.causes, sign)
        _add_counts(self.reasons, other.reasons, sign)
        _add_counts(self.unrecorded, other.unrecorded, sign)
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
        data.update(saved_secs=round(self.saved_secs, 6), not_cached_secs=round(self.not_cached_secs, 6), causes=self.causes, reasons=self.reasons, levels=self.levels,
                    unrecorded=self.unrecorded,
                    reads_secs=round(self.reads_secs, 6), tracing_secs=round(self.tracing_secs, 6), traced=slowest(self.traced))
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
            setattr(totals, name, as_count(data.get(name)) or 0)
        totals.saved_secs = as_number(data.get("saved_secs")) or 0.0
        totals.not_cached_secs = as_number(data.get("not_cached_secs")) or 0.0
        totals.reads_secs = as_number(data.get("reads_secs")) or 0.0
        totals.tracing_secs = as_number(data.get("tracing_secs")) or 0.0
        totals.traced = _field("seconds", data.get("traced")) or {}
        totals.causes = _field("counts", data.get("causes")) or {}
        totals.reasons = _field("counts", data.get("reasons")) or {}
        totals.unrecorded = _field("counts", data.get("unrecorded")) or {}
        if isinstance(data.get("levels"), dict):
            add_levels(totals.levels, data["levels"])
        functions = data.get("functions")
        if isinstance(functions, dict):
            for name, cost in list(functions.items())[-MAX_FUNCTIONS:]:
                if isinstance(name, str) and isinstance(cost, list) and len(cost) == 2:
                    secs, writes = as_number(cost[0]), as_count(cost[1])
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
        self.skipped = 0  # bytes beyond LEDGER_READ_LIMIT: said, not dropped silently
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
        if isinstance(earlier, dict) and (known := as_count(earlier.get("forget_n"))) is not None:
            forgotten = max(forgotten, known)
        return {"n": len(self.records), "tally": self.tally or {"e": "tally"}, "forget_n": forgotten}

    def since(self, offset: Any) -> None:
        """Count only what this ledger recorded after ``offset`` (see ``offset``); a malformed one
        (a hostile summary) counts everything."""
        if not isinstance(offset, dict) or as_count(offset.get("n")) is None:
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
        forgotten = min(as_count(offset.get("forget_n")) or 0, len(self.records))
        if forgotten:  # ``clear``: what it wrote before is gone, and forgotten...
            # ...but for the tables its later entries' lines refer to (a process gives each once)
            self.tables = [line for r in self.records[:forgotten] if r["e"] in ("put", "index")
                           for line in str(r.get("rec", "")).split("\n") if line and not line.startswith("E\t")]
            self.records = self.records[forgotten:]
            self.counted = max(self.counted - forgotten, 0)
            self.disk = sum(r.get("disk", r.get("bytes", 0)) for r in self.records if r["e"] in ("put", "added"))

    def index_lines(self) -> list[str]:
        """What this ledger gives the index: its entries' lines (and the tables they refer to), and
        the keys it removed (``X`` lines)."""
        lines = list(self.tables)
        for record in self.records:
            kind = record["e"]
            if kind in ("put", "index") and record.get("rec"):
                lines.extend(str(record["rec"]).split("\n"))
            elif kind == "evicted" and record.get("key"):
                from gkx_autocache._record import index as _index

                lines.extend(_index.removed_lines([record["key"]], record.get("reason") or "prune", record.get("t")))
        return lines


def unfolded_lines(version_dir: str, limit: int = 64 << 20) -> list[str]:
    """The index lines of the ledgers not folded yet, for the evidence of a first miss, after the
    index's own (the latest record of a key is the last): a process still running (a sweep's other
    job, a notebook beside a training job) or killed (a kernel restarted by force, a crash), whose
    records would otherwise reach the index only when some later process exits cleanly. At most
    ``limit`` bytes of ledgers are read."""
    lines: list[str] = []
    for path in ledger_files(version_dir):
        ledger = read_ledger(path)
        limit -= ledger.size
        if limit < 0:
            break
        lines.extend(ledger.index_lines())
    return lines


def read_ledger(path: str) -> Ledger:
    """The well-formed records of one ledger file (local or remote), and what they come to: the
    records summed, and the last tally (the counts of what repeated)."""
    ledger = Ledger(path)
    if is_url(path):
        from gkx_autocache import _remote

        data = _remote.read_bytes(path) or b""
    else:
        stat_seen: list[os.stat_result] = []
        data = _files.read(path, LEDGER_READ_LIMIT, check=lambda st: stat_seen.append(st)) or b""
        if stat_seen:
            ledger.mtime, ledger.size = stat_seen[0].st_mtime, stat_seen[0].st_size
            ledger.skipped = max(stat_seen[0].st_size - LEDGER_READ_LIMIT, 0)
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


def take_flock(fd: int, blocking: bool = False) -> bool | None:
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
    """Whether the ledger's process has finished writing it (see docs/how-it-works.md). Its lock
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
        free = take_flock(fd)
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


def no_flock(version_dir: str, team: bool, why: str) -> bool:
    """Remember that this directory's file system has no working flock; True the first time (the
    caller warns then, once per directory)."""
    folder = _files.bookkeeping_dir(version_dir, team)
    if folder is None:
        return False
    try:
        fd = _files.open_in(folder, NO_FLOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _files.NOFOLLOW,
                            _files.file_mode(team))
    except OSError:
        return False
    try:
        os.write(fd, f"{time.strftime('%Y-%m-%d %H:%M:%S')} {why}\n".encode())
    finally:
        os.close(fd)
    return True
