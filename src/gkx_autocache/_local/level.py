"""The local level (SPEC §7, §14): the entries of the version directory the store serves, in JAX's
format. One trusted read (no link followed, its owner and mode checked), one check of whether bytes
may be given to JAX (this environment's compression; they decompress, where JAX's loading is not
guarded; under a ``cpu_target``, no feature this host lacks), and one write path: the entry
atomically, then its compile-time sidecar and the seal kept beside it. Built first, with JAX's
codec, and given to the shared level behind it, which lands prefetched entries here, claims the
ones it fetches, and reads the ones it uploads; the chain (``_chain``) asks it first.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from gkx_autocache import _cpu_target, _files, _formats, _trust
from gkx_autocache._diagnostics import logger
from gkx_autocache._entry import Entry
from gkx_autocache._formats import SEAL_LIMIT, compression_of, read_sidecar
from gkx_autocache._layout import COMPILE_SIDECAR, ENTRY_SUFFIX, META_DIR, RECORD_SIDECAR, SEAL_SIDECAR, TMP_SUFFIX
from gkx_autocache._local.landing import Landings, Receipt


class LocalLevel:
    """The version directory ``path``'s entries, for one compression format (``decompress``'s);
    ``check_payload()``: whether bytes are decompressed before they are given to JAX (where its
    loading is not guarded, or its settings ask: read at each lookup); ``team``: a team directory
    (§8); ``whole``: a bucket mount (``_mount``); ``signs``: a signing key keeps a seal beside each
    entry it vouches for; ``account(disk)``: told of each prefetched entry's blocks as it lands (the
    cap's account, which a killed process's landings must not escape: the recorder's ``landed``);
    ``target``: this process's ``cpu_target``, whose entries are checked against this CPU where this
    thread's key held it (``keyed()``: the key's seam says so)."""

    def __init__(self, path: str, *, compression: str, decompress: Callable[[bytes], Any], team: bool,
                 writable: bool, check_payload: Callable[[], bool], whole: bool, signs: bool,
                 account: Callable[[int], None] = lambda disk: None,
                 target: _cpu_target.Target = _cpu_target.NONE, keyed: Callable[[], bool] = lambda: False) -> None:
        self.path = path
        self.meta = os.path.join(path, META_DIR)
        self.compression = compression
        self.writable = writable  # a baked cache, read-only for this user: hits only
        self.team = team  # a team directory (§8): group-writable files
        self.landings = Landings()  # what a prefetch landed here that no lookup used yet
        self._decompress = decompress
        self._check_payload = check_payload  # decompress before serving (``_store.install``)
        self._file_mode = _files.file_mode(team)
        self._whole = whole  # a bucket mount (``_mount``): each file made whole in one create, no times set
        self._signs = signs  # a signing key keeps a seal beside each entry it vouches for
        self._account = account
        self._target = target
        self._keyed = keyed

    def entry(self, key: str) -> str:
        return os.path.join(self.path, key + ENTRY_SUFFIX)

    # -- reading ---------------------------------------------------------------------------------

    def read(self, key: str) -> tuple[bytes | None, str | None]:
        """The entry's bytes and why they must not be given to JAX (None: a hit, its recency set);
        ``(None, None)`` where there is none."""
        path = self.entry(key)
        # The directory again (one stat): given to another user since it was checked (a chown), its
        # entries, still yours, can be renamed by the new owner: a swapped pair passes every check below.
        if (moved := _trust.directory_problem(self.path, self.team)) is not None:
            return None, f"its directory fails the trust rules now ({moved.split('; ', 1)[0]}): not read"
        refused: list[str] = []

        def trusted(st: os.stat_result) -> str | None:  # one fstat: an entry is code
            why = _trust.entry_problem(st, self.team)
            if why:
                refused.append(why)
            return why

        data = _files.read(path, check=trusted)
        why = refused[0] if refused else (self._unusable(path, data) if data is not None else None)
        if data is not None and why is None:
            why = self.foreign(data, landing=False)
        if data is not None and why is None and not self._whole:  # (a bucket mount keeps no recency)
            try:
                os.utime(path)  # recency for pruning, on noatime mounts too
            except OSError:
                pass
        return data, why

    def _unusable(self, path: str, data: bytes) -> str | None:
        """Why these bytes cannot be given to JAX, or None. Where the loading guard is installed
        (``_loading_guard``), bytes that do not decompress are JAX's failure to load them, a miss
        like any other, and decompressing them here first would double the cost of every hit."""
        kind = compression_of(data)
        if kind not in (self.compression, None):
            logger.debug("%s is in another compression format: a miss, left alone", path)
            return f"written by an environment that compresses with {kind}: left alone"
        if not self._check_payload():
            return None
        try:
            self._decompress(data)
        except Exception as exc:
            logger.debug("%s is corrupt (%s): removed, it will be compiled again", path, exc)
            if self.writable:
                _files.remove(path)
            return f"does not decompress ({type(exc).__name__}): compiled again and replaced"
        return None

    def unusable_shared(self, data: bytes, landing: bool) -> str | None:
        """Why a shared entry's bytes cannot be given to JAX (the checks a local entry gets);
        ``landing``: a prefetched entry, whose key this thread did not compute."""
        kind = compression_of(data)
        if kind not in (self.compression, None):
            return f"the shared entry is compressed with {kind}, this environment with {self.compression}"
        if self._check_payload():
            try:
                self._decompress(data)
            except Exception as exc:
                return f"the shared entry does not decompress ({type(exc).__name__})"
        return self.foreign(data, landing)

    def foreign(self, data: bytes, landing: bool) -> str | None:
        """Under a ``cpu_target``, why an entry must not run on this CPU (it lists a feature this
        host lacks: another host at the target wrote it), or None. One more decompression a hit,
        only for a key that holds the target (this thread's last), or a prefetched entry, which
        may be one (``_cpu_target``)."""
        target = self._target
        if target.level is None or not (landing or self._keyed()):
            return None
        try:
            payload = self._decompress(data)
        except Exception:
            return None  # JAX's loading meets it, as any entry that does not decompress
        return target.foreign(payload)

    def decompresses(self, data: bytes) -> bool:
        try:
            self._decompress(data)
        except Exception:
            return False
        return True

    def compile_secs(self, key: str, data: bytes) -> tuple[float, float, str, bool]:
        """What the entry cost to compile, when it was written (0.0: unknown), by which run (""), and
        whether a rebuild compiled it (SPEC §18)."""
        recorded, written, by, rebuilt = read_sidecar(os.path.join(self.path, key + COMPILE_SIDECAR))
        if recorded is not None:
            return recorded, written, by, rebuilt
        try:  # JAX's own record: whole seconds, in the first 4 bytes of the payload
            return float(int.from_bytes(self._decompress(data)[:4], "big")), written, by, rebuilt
        except Exception:
            return 0.0, written, by, rebuilt

    def uploadable(self, key: str) -> Entry | None:
        """A writer's entry to heal the shared level with or to pack (SPEC §14), read as a hit
        reads it (trusted, in this environment's compression; in a team directory only this user's
        own), with the seal kept beside it (where a signing key vouched for it) or its compile time
        and when it was written (to seal it with no key): the shared level decides what it may go
        up with. None where there is none to upload."""
        def signable(st: os.stat_result) -> str | None:  # in a team directory, only what this user wrote
            mine = not self.team or not hasattr(os, "geteuid") or st.st_uid == os.geteuid()
            return _trust.entry_problem(st, self.team) or (None if mine else "another user's")

        data = _files.read(self.entry(key), check=signable)
        if data is None or compression_of(data) != self.compression:
            return None
        kept = _files.read(self._seal(key), SEAL_LIMIT, check=signable) if self._signs else None
        # The compile time as recorded (0.0 is a time: a compile the clock's ticks could not see), else none.
        compile_secs, written = None, 0.0
        if kept is None:
            compile_secs, written, _, _ = read_sidecar(os.path.join(self.path, key + COMPILE_SIDECAR))
        return Entry(data, compile_secs, written, kept)

    # -- writing ---------------------------------------------------------------------------------

    def other_format(self, key: str) -> bool:
        """Whether the entry there belongs to another environment's compression: never overwritten."""
        existing = _files.read(self.entry(key), limit=4)
        return existing is not None and compression_of(existing) not in (self.compression, None)

    def write(self, key: str, data: bytes, beside: Callable[[], None] | None = None) -> None:
        """The entry, atomically (a temporary file, then a replace, which heals a bad one); raises
        OSError (disk full, a name too long for the file system). ``beside``: run once the bytes are
        in the temporary file, before the replace (what goes beside the entry)."""
        with _files.atomic(self.entry(key), self._file_mode, whole=self._whole) as f:
            f.write(data)
            if beside is not None:
                f.flush()  # a disk full raises here: nothing beside the entry touched yet
                beside()

    def write_sidecar(self, key: str, compile_secs: float, by: str = "", dated: float = 0.0,
                      rebuilt: bool = False) -> int:
        """The compile time beside the entry (``dated``: when another run wrote it; ``rebuilt``: a
        rebuild compiled it); its bytes, 0 where it could not be written."""
        path = os.path.join(self.path, key + COMPILE_SIDECAR)
        sidecar = _formats.sidecar(compile_secs, by, rebuilt)
        if not _files.write_atomic(path, sidecar, self._file_mode, self._whole):
            return 0
        if dated and not self._whole:
            try:
                os.utime(path, (dated, dated))
            except OSError:
                pass
        return len(sidecar)

    def _seal(self, key: str) -> str:
        """The seal kept beside a local entry (``<key>-gkx-shared``), where a signing key vouched for
        its bytes: this process's compile, or a shared entry verified under the key."""
        return os.path.join(self.path, key + SEAL_SIDECAR)

    def keep_seal(self, key: str, seal: bytes | None) -> int:
        """Write (or, with none, remove) the seal beside a local entry just written; its bytes."""
        path = self._seal(key)
        if seal is None:
            if self._signs:
                _files.remove(path)  # (bytes it did not vouch for replaced the entry: never a stale seal)
            return 0
        return len(seal) if _files.write_atomic(path, seal, self._file_mode, self._whole) else 0

    def remove_corrupt(self, key: str) -> bool:
        """Whether the entry there does not decompress; removed where this level takes writes."""
        data = _files.read(self.entry(key))
        if data is None or self.decompresses(data):
            return False
        if self.writable:
            _files.remove(self.entry(key))
        return True

    # -- what the chain writes here ----------------------------------------------------------------

    def put(self, key: str, data: bytes, compile_secs: float | None, by: str, seal: bytes | None,
            rebuilt: bool = False) -> int:
        """A compile's entry, its compile time (None: not measured) and the seal this process's key
        made for it (``rebuilt``: a rebuild compiled it); the bytes written. Raises OSError (disk
        full, a name too long)."""
        # The entry's bytes staged first (where a disk full fails), then what goes beside it, then
        # the replace: a lookup that finds the entry finds with it who wrote it.
        sidecar = os.path.join(self.path, key + COMPILE_SIDECAR)
        ours: dict[str, bytes] = {}
        written = len(data)

        def beside() -> None:
            nonlocal written
            kept = self.keep_seal(key, seal)
            if kept and seal is not None:
                ours[self._seal(key)] = seal
            written += kept
            if compile_secs is not None:
                done = self.write_sidecar(key, compile_secs, by=by, rebuilt=rebuilt)
                if done:
                    ours[sidecar] = _formats.sidecar(compile_secs, by, rebuilt)
                written += done

        try:
            self.write(key, data, beside)
        except OSError:  # (the replace failed: what this write put beside it, and only that, goes)
            for path, mine in ours.items():
                if _files.read(path, len(mine) + 1) == mine:
                    _files.remove(path)
            raise
        return written

    def keep_record(self, key: str, data: bytes) -> int:
        """The entry's record (``<key>-gkx-record``, SPEC §18), atomically, in the entries' mode
        (0600 in a private directory); its bytes, 0 where it could not be written (a disk full:
        the entry is served, and rebuild cannot make it again)."""
        if not _files.write_atomic(os.path.join(self.path, key + RECORD_SIDECAR), data, self._file_mode, self._whole):
            return 0
        return len(data)

    def believed(self, entry: Entry) -> Entry:
        """The shared entry with a compile time this process can stand behind: a claim no key of its
        verified (an unsigned seal, a directory's sidecar: anyone's) is held to JAX's own record in
        the payload (whole seconds) plus one, so that a level claiming 250 s for a 0.1 s compile is
        never counted 250 s avoided at each hit (issue 67's L10). A decompression only where the
        claim is over a second."""
        claimed = entry.compile_secs
        if entry.seal is not None or claimed is None or claimed <= 1.0:
            return entry
        try:
            recorded = float(int.from_bytes(self._decompress(entry.data)[:4], "big"))
        except Exception:
            recorded = 0.0
        return Entry(entry.data, min(claimed, recorded + 1.0), entry.written, entry.seal)

    def backfill(self, key: str, entry: Entry) -> int | None:
        """A shared hit written here, with its compile time (dated when it was written, so that it
        counts as an earlier run's entry) and its verified seal; the bytes written, None where it
        was not (another environment's entry there, a disk full)."""
        if self.other_format(key):
            return None
        try:
            self.write(key, entry.data)
        except OSError as exc:  # disk full: served without the backfill
            logger.debug("cannot write %s: %s", self.entry(key), exc)
            return None
        written = len(entry.data) + self.keep_seal(key, entry.seal)
        if entry.compile_secs is not None:
            written += self.write_sidecar(key, entry.compile_secs, dated=entry.written)
        return written

    # -- what a prefetch lands here (SPEC §14) ----------------------------------------------------

    def land(self, key: str, entry: Entry) -> tuple[bool, str | None]:
        """A prefetched entry, checked as a shared hit is, then written (``backfill``) and booked:
        ``(landed, why not)``, why None where this level took no write (read-only, disk full)."""
        if not self.writable:
            return False, None
        why = self.unusable_shared(entry.data, landing=True)
        if why is not None:
            return False, why
        written = self.backfill(key, self.believed(entry))
        if written is None:
            return False, None
        self._account(written)
        # Dated once written: a later mtime is another process's hit (``touched_since``).
        self.landings.book(key, Receipt(len(entry.data), written, entry.compile_secs or 0.0, time.time()))
        return True, None

    def has(self, key: str) -> bool:
        """Whether the entry is there (landed by another process, or compiled meanwhile)."""
        return os.path.exists(self.entry(key))

    def touched_since(self, key: str, when: float) -> bool:
        """Whether another process used the entry since ``when`` (a hit sets its mtime: recency)."""
        try:
            return os.stat(self.entry(key)).st_mtime > when
        except OSError:
            return False

    def claim(self, key: str, stale: float) -> str | None:
        """The claim file that keeps another process from fetching ``key`` here too, or None where
        it is here already or being fetched by another."""
        if self.has(key):
            return None
        claim = f".{key}{ENTRY_SUFFIX}.prefetch{TMP_SUFFIX}"
        return claim if _files.claim(self.path, claim, stale=stale) else None

    def unclaim(self, claim: str) -> None:
        _files.unclaim(self.path, claim)
