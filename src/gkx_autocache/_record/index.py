"""The index that explanations compare a miss with (SPEC §13.1): what every entry's key was made of,
and the keys removed lately, in one append-only file, ``<version dir>/.gkx-autocache/index``.

One line each, tab-separated; ids are short content hashes, so processes never coordinate them::

    E <name> <key hex> <written> <run> <computation> <context> <signature> <place> <config>
    C <context> <the other seven parts' hashes, comma-separated>
    V <part> <hash> <what the hash stands for, JSON>        the readable parts (XLA flags, devices, ...)
    S <id> <input signature, JSON>                          "f32[8,8], f32[]"
    P <id> <place, JSON>                                    "model/core.py:step"; "jax" (JAX's helper); "?"
    G <id> <jax.config values, JSON>
    X <name> <key hex> <removed> <by>                       by: max_size, prune, verify, outside
    N <random hex>                                          the first line: which file this is

``<key hex>`` is JAX's sha256, whole: whether an entry is still there is one ``lstat`` of its file.
An ``E`` line is about 170 bytes, and so is the index an entry (the tables are shared by the entries
that have the same values).

Who writes it (the fold, under the bookkeeping lock) and who reads it (a process at its first
miss, once): docs/how-it-works.md, "The index".
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from typing import NamedTuple

from gkx_autocache import _files
from gkx_autocache._diagnostics import logger
from gkx_autocache._formats import sidecar_rebuilt, sidecar_run
from gkx_autocache._key import PARTS
from gkx_autocache._layout import COMPILE_SIDECAR, ENTRY_SUFFIX, INDEX_FILE, META_DIR, function_name

KEY_DIGITS = 64  # digits of a key kept: all of them
REMOVED_SECS = 30 * 86400.0  # how long a removed key is remembered (for `evicted`)
MAX_REMOVED = 10_000  # ...and how many at least (more where the directory holds more entries)
INDEX_READ_LIMIT = 256 << 20  # the most read of an index (about 1.7 million entries)


def digest(text: str, n: int = 10) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:n]


def split_key(key: str) -> tuple[str, str]:
    """``jit_f-<64 hex>`` -> ``("jit_f", "<first 20 hex>")``."""
    name = function_name(key)
    return name, key[len(name) + 1:len(name) + 1 + KEY_DIGITS]


class Record(NamedTuple):
    """One entry's key, part by part, with what a person can read of it."""

    name: str
    hex: str
    written: float
    run: str
    parts: tuple[str, ...]  # the eight parts' hashes, in PARTS order
    signature: str
    place: str
    config: dict[str, str]


def _text(value: str) -> str:
    """A table value: one JSON string, so that no tab or newline in it splits a line."""
    return json.dumps(value, ensure_ascii=False)


def lines_for(name: str, hex_: str, written: float, run: str, parts: dict[str, str], readable: dict[str, str],
              signature: str, place: str, config: dict[str, str]) -> list[str]:
    """The index lines of one written entry: its ``E`` line after the table lines it refers to."""
    others = ",".join(parts[p] for p in PARTS[1:])
    context = digest(others, 12)
    config_text = json.dumps(config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    sig, where, cfg = digest(signature), digest(place), digest(config_text)
    lines = [f"C\t{context}\t{others}", f"S\t{sig}\t{_text(signature)}", f"P\t{where}\t{_text(place)}",
             f"G\t{cfg}\t{_text(config_text)}"]
    lines += [f"V\t{part}\t{parts[part]}\t{_text(value)}" for part, value in readable.items() if part in parts]
    run = "".join(c for c in run if c.isprintable() and c not in "\t ")[:40] or "-"
    lines.append(f"E\t{name}\t{hex_}\t{int(written)}\t{run}\t{parts[PARTS[0]]}\t{context}\t{sig}\t{where}\t{cfg}")
    return lines


class Evidence:
    """What a directory holds, as one process saw it at its first miss (and its own writes since)."""

    def __init__(self, version_dir: str = "") -> None:
        self.version_dir = version_dir
        self.entries: dict[str, list[str]] = {}  # name -> its E lines, unparsed (parsed on a miss of that name)
        self.removed: dict[tuple[str, str], tuple[float, str]] = {}  # (name, hex) -> (when, by whom)
        self.contexts: dict[str, tuple[str, ...]] = {}
        self.values: dict[tuple[str, str], str] = {}  # (part, hash) -> readable
        self.signatures: dict[str, str] = {}
        self.places: dict[str, str] = {}
        self.configs: dict[str, str] = {}
        self._parsed_configs: dict[str, dict[str, str]] = {}
        self._parsed: dict[str, dict[str, Record]] = {}  # name -> hex -> its record (``records``)
        self._present: dict[str, bool] = {}  # key -> whether its entry is there (an lstat, or this process wrote it)
        self._listing: dict[str, dict[str, str]] | None = None  # name -> hex -> key, where listed

    def add(self, lines: list[str]) -> None:
        for line in lines:
            self.line(line)

    def line(self, line: str) -> None:
        kind, _, rest = line.partition("\t")
        if kind == "E":
            name, _, fields = rest.partition("\t")
            self.entries.setdefault(name, []).append(fields)
            return
        parts = rest.split("\t")
        try:
            if kind == "X" and len(parts) == 4:
                if _when(parts[2]) is not None:
                    self.removed[(parts[0], parts[1])] = (float(parts[2]), parts[3][:40])
            elif kind == "C" and len(parts) == 2:
                self.contexts[parts[0]] = tuple(parts[1].split(","))
            elif kind == "V" and len(parts) == 3:
                self.values[(parts[0], parts[1])] = str(json.loads(parts[2]))
            elif kind in ("S", "P", "G") and len(parts) == 2:
                table = {"S": self.signatures, "P": self.places, "G": self.configs}[kind]
                table[parts[0]] = str(json.loads(parts[1]))
        except (ValueError, RecursionError):  # a hostile or torn line: skipped
            return

    def holds(self, line: str) -> bool:
        """Whether a table line's id is known here (its value is the id's: ids are content hashes)."""
        kind, _, rest = line.partition("\t")
        id_, _, rest = rest.partition("\t")
        if kind == "V":
            return (id_, rest.partition("\t")[0]) in self.values
        if kind == "C":
            return id_ in self.contexts
        tables = {"S": self.signatures, "P": self.places, "G": self.configs}
        return kind in tables and id_ in tables[kind]

    def records(self, name: str) -> list[Record]:
        """Every well-formed record of ``name``, the latest per key. Each line is parsed once (at
        the first miss of the name), then let go: a later miss parses only the lines added since
        (this process's own writes), so a name with 20 000 entries costs each miss a list, not
        20 000 parses. A line that does not parse (hostile, torn) is dropped."""
        found = self._parsed.setdefault(name, {})
        lines = self.entries.get(name)
        if lines:
            for fields in lines:
                record = self._record(name, fields)
                if record is not None:
                    found.pop(record.hex, None)  # in the order written: the latest last
                    found[record.hex] = record
            lines.clear()
        return list(found.values())

    def _record(self, name: str, fields: str) -> Record | None:
        parts = fields.split("\t")
        if len(parts) != 8:
            return None
        hex_, written, run, computation, context, sig, where, cfg = parts
        others = self.contexts.get(context)
        if others is None or len(others) != len(PARTS) - 1:
            return None
        when = _when(written)
        config = self._config(cfg)
        if config is None or when is None:
            return None
        return Record(name, hex_, when, run, (computation, *others), self.signatures.get(sig, "?"),
                      self.places.get(where, "?"), config)

    def _config(self, cfg: str) -> dict[str, str] | None:
        """The ``jax.config`` values of a ``G`` id, parsed once: records of one config share the
        dict (not to be changed), so comparing them costs one comparison per config."""
        found = self._parsed_configs.get(cfg)
        if found is None:
            if cfg not in self.configs:  # not known (yet): not kept, a later line may bring it
                return {}
            try:
                config = json.loads(self.configs[cfg])
            except (ValueError, RecursionError):
                return None
            found = {str(k): str(v) for k, v in config.items()} if isinstance(config, dict) else {}
            self._parsed_configs[cfg] = found
        return found

    def readable(self, part: str, hash_: str) -> str | None:
        return self.values.get((part, hash_))

    def present(self, name: str, hex_: str) -> bool:
        """Whether the entry is in the directory now: one ``lstat`` (remembered)."""
        key = f"{name}-{hex_}"
        if key not in self._present:
            self._present[key] = os.path.lexists(os.path.join(self.version_dir, key + ENTRY_SUFFIX))
        return self._present[key]

    def wrote(self, name: str, hex_: str) -> None:
        """This process wrote the entry."""
        self._present[f"{name}-{hex_}"] = True
        if self._listing is not None:
            self._listing.setdefault(name, {})[hex_] = f"{name}-{hex_}"

    def unrecorded(self, name: str, recorded: list[Record]) -> list[str]:
        """The keys of the entries of ``name`` in the directory that have no record: one listing of
        the directory, the first time a process needs it."""
        if self._listing is None:
            listing: dict[str, dict[str, str]] = {}
            try:
                names = os.listdir(self.version_dir)
            except OSError:
                names = []
            for entry in names:
                if entry.endswith(ENTRY_SUFFIX) and entry[0] != ".":
                    key = entry[:-len(ENTRY_SUFFIX)]
                    found, hex_ = split_key(key)
                    listing.setdefault(found, {})[hex_] = key
            self._listing = listing
        known = {r.hex for r in recorded}
        return sorted(key for hex_, key in self._listing.get(name, {}).items() if hex_ not in known)

    def rebuilt(self, key: str) -> bool:
        """Whether a rebuild compiled the entry from an earlier JAX's or context's record (its
        compile-time sidecar says so, SPEC §18)."""
        return sidecar_rebuilt(_files.read(os.path.join(self.version_dir, key + COMPILE_SIDECAR), 128))

    def written_by(self, key: str) -> str:
        """The run that wrote an entry without a record, as its compile-time sidecar names it; ""
        where none does (stock JAX writes no sidecar, a backfill from the shared level names none)."""
        return sidecar_run(_files.read(os.path.join(self.version_dir, key + COMPILE_SIDECAR), 128))


def _when(text: str) -> float | None:
    """A time in an index line, or None where it is not one (``inf``, ``nan``, ``1e308``: a
    hostile or torn line)."""
    try:
        when = float(text)
    except ValueError:
        return None
    return when if 0.0 <= when < 1e11 else None


def index_path(version_dir: str) -> str:
    return os.path.join(version_dir, META_DIR, INDEX_FILE)


CHUNK = 4 << 20


def _read_lines(path: str, evidence: Evidence) -> None:
    """The index's lines into ``evidence``, read in chunks of whole lines: what a process holds at
    its first miss is what it keeps, not also the file's bytes, their text and its split (a
    300 MB index cost the user's process 1.1 GB at once)."""
    try:
        fd = _files.open_regular(path)
    except OSError:
        return
    try:
        left, tail = INDEX_READ_LIMIT, b""
        while left > 0:
            chunk = os.read(fd, min(CHUNK, left))
            if not chunk:
                break
            left -= len(chunk)
            data = tail + chunk
            end = data.rfind(b"\n") + 1
            data, tail = data[:end], data[end:]
            for line in data.decode("utf-8", "replace").split("\n"):
                evidence.line(line)
        if left <= 0:
            logger.debug("%s is larger than %d bytes: read in part", path, INDEX_READ_LIMIT)
        elif tail:
            evidence.line(tail.decode("utf-8", "replace"))  # a last line without its newline (torn)
    except OSError as exc:
        logger.debug("cannot read %s: %s", path, exc)
    finally:
        os.close(fd)


def nonce_line() -> str:
    """An index file's first line, made afresh with each file: a file made again on the inode of
    one removed (ext4 gives a freed inode at once) is told from it by this line."""
    return f"N\t{os.urandom(8).hex()}"


def identity(version_dir: str) -> tuple[int, int, int, str] | None:
    """The index file's device, inode, size and first line where it is a ``nonce_line`` (None:
    there is none). Appends keep the inode and the first line and only grow the size; a compaction
    or ``clear`` replaces or removes the file, and the file made after has another first line."""
    try:
        fd = _files.open_regular(index_path(version_dir))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        head = os.pread(fd, 40, 0).split(b"\n", 1)[0].decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    return st.st_dev, st.st_ino, st.st_size, head if head.startswith("N\t") else ""


def load(version_dir: str, more: list[str] | None = None) -> Evidence:
    """The index, and ``more`` lines after it (the ledgers not folded yet): what a first miss
    compares with (100 000 entries, benchmarked)."""
    evidence = Evidence(version_dir)
    _read_lines(index_path(version_dir), evidence)
    evidence.add(more or [])
    return evidence


def append(version_dir: str, lines: list[str], team: bool) -> bool:
    """Append lines to the index (under the bookkeeping lock): one write."""
    if not lines:
        return True
    folder = _files.bookkeeping_dir(version_dir, team)
    if folder is None:
        return False
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
    try:
        fd = _files.open_in(folder, INDEX_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _files.NOFOLLOW
                            | _files.NONBLOCK, _files.file_mode(team))
    except OSError as exc:
        logger.debug("index not appended: %s", exc)
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device planted there
            return False
        if st.st_size == 0:  # a file made now (under the lock: one writer)
            data = (nonce_line() + "\n").encode() + data
        os.write(fd, data)
        return True
    except OSError as exc:
        logger.debug("index not appended: %s", exc)
        return False
    finally:
        os.close(fd)


def removed_lines(keys: list[str], by: str, when: float | None = None) -> list[str]:
    when = time.time() if when is None else when
    return [f"X\t{name}\t{hex_}\t{int(when)}\t{by}" for name, hex_ in map(split_key, keys)]


def compact(version_dir: str, present: set[tuple[str, str]], team: bool, now: float | None = None,
            pending: list[str] | None = None) -> int:
    """Rewrite the index for what the directory holds (at a full scan, under the lock): the bytes
    it holds after. ``pending``: the ``E`` lines of live processes' ledgers, not folded yet, whose
    tables are kept (a process appends a table line only where the index lacked it)."""
    now = time.time() if now is None else now
    data = _files.read(index_path(version_dir), INDEX_READ_LIMIT)
    if data is None:
        return 0
    entries: dict[tuple[str, str], str] = {}
    removed: dict[tuple[str, str], tuple[float, str]] = {}
    tables: dict[tuple[str, str], str] = {}  # (kind, id) -> line
    for line in data.decode("utf-8", "replace").split("\n"):
        kind, _, rest = line.partition("\t")
        fields = rest.split("\t")
        if kind == "E" and len(fields) == 9:
            entries[(fields[0], fields[1])] = line
        elif kind == "X" and len(fields) == 4:
            when = _when(fields[2])
            if when is not None:
                removed[(fields[0], fields[1])] = (when, fields[3])
        elif kind in ("C", "S", "P", "G") and len(fields) == 2:
            tables[(kind, fields[0])] = line
        elif kind == "V" and len(fields) == 3:
            tables[("V", f"{fields[0]}\t{fields[1]}")] = line
    kept: list[str] = []
    for key, line in entries.items():
        if key in present:
            kept.append(line)
            removed.pop(key, None)  # written again since
        elif key not in removed:
            removed[key] = (now, "outside")  # gone, and no command or cap of the package removed it
    keep_removed = max(MAX_REMOVED, len(present))
    recent = sorted(((t, by, key) for key, (t, by) in removed.items() if now - t < REMOVED_SECS), reverse=True)
    kept += [f"X\t{name}\t{hex_}\t{int(t)}\t{by}" for t, by, (name, hex_) in recent[:keep_removed]]
    used: set[tuple[str, str]] = set()
    for line in [*kept, *(pending or ())]:
        fields = line.split("\t")
        if fields[0] == "E" and len(fields) == 10:
            _, _, _, _, _, computation, context, sig, where, cfg = fields
            used.update({("C", context), ("S", sig), ("P", where), ("G", cfg), ("V", f"computation\t{computation}")})
    contexts = {key[1]: line.split("\t")[2].split(",") for key, line in tables.items() if key in used and key[0] == "C"}
    for others in contexts.values():
        used.update(("V", f"{part}\t{hash_}") for part, hash_ in zip(PARTS[1:], others, strict=False))
    lines = [nonce_line(), *(line for key, line in tables.items() if key in used), *kept]
    text = ("\n".join(lines) + "\n" if lines else "").encode("utf-8", "surrogatepass")
    if _files.write_atomic(index_path(version_dir), text, _files.file_mode(team)):
        return len(text)
    return len(data)


def lines_of(version_dir: str, keys: list[str]) -> list[str]:
    """The index lines of these entries (the latest ``E`` line of each, and the table lines they
    refer to), for a bundle to carry."""
    wanted = {split_key(key) for key in keys}
    data = _files.read(index_path(version_dir), INDEX_READ_LIMIT) or b""
    entries: dict[tuple[str, str], str] = {}
    tables: dict[tuple[str, str], str] = {}
    for line in data.decode("utf-8", "replace").split("\n"):
        fields = line.split("\t")
        if fields[0] == "E" and len(fields) == 10 and (fields[1], fields[2]) in wanted:
            entries[(fields[1], fields[2])] = line
        elif fields[0] in ("C", "S", "P", "G") and len(fields) == 3:
            tables[(fields[0], fields[1])] = line
        elif fields[0] == "V" and len(fields) == 4:
            tables[("V", f"{fields[1]}\t{fields[2]}")] = line
    used: set[tuple[str, str]] = set()
    for line in entries.values():
        _, _, _, _, _, computation, context, sig, where, cfg = line.split("\t")
        used.update({("C", context), ("S", sig), ("P", where), ("G", cfg), ("V", f"computation\t{computation}")})
        others = tables.get(("C", context), "").split("\t")[-1].split(",")
        used.update(("V", f"{part}\t{hash_}") for part, hash_ in zip(PARTS[1:], others, strict=False))
    return [line for key, line in tables.items() if key in used] + list(entries.values())


def places_of(version_dir: str, limit: int = 32 << 20) -> dict[str, set[str]]:
    """Where the code of each function name's recorded entries is (``model/core.py:step``), from
    an index (another JAX version's, read once by a process that misses a name only it holds);
    empty where it has no index, or one larger than ``limit``."""
    data = _files.read(index_path(version_dir), limit) or b""
    if len(data) >= limit:
        return {}
    places: dict[str, str] = {}
    wheres: dict[str, set[str]] = {}
    for line in data.decode("utf-8", "replace").split("\n"):
        fields = line.split("\t")
        if fields[0] == "P" and len(fields) == 3:
            try:
                places[fields[1]] = str(json.loads(fields[2]))
            except (ValueError, RecursionError):
                continue
        elif fields[0] == "E" and len(fields) == 10:
            wheres.setdefault(fields[1], set()).add(fields[8])
    return {name: {places[w] for w in ids if w in places} for name, ids in wheres.items()}


def isa_of_entries(lines: list[str]) -> dict[str, str | None]:
    """``name-hex -> the ISA its key holds`` (None: made without one), from index lines."""
    evidence = Evidence()
    evidence.add(lines)
    found: dict[str, str | None] = {}
    for name in evidence.entries:
        for record in evidence.records(name):
            hook = evidence.readable("custom_hook", record.parts[PARTS.index("custom_hook")])
            mark = "gkx-autocache-isa="
            found[f"{name}-{record.hex}"] = hook[hook.rfind(mark) + len(mark):] if hook and mark in hook else None
    return found
