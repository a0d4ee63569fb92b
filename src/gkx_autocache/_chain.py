"""The levels in order (SPEC §14), after sccache's ``MultiLevelStorage``: the local level, then the
shared one behind it (``NoLevel`` where none is set). A lookup reads the local level first, then
the shared one; a shared hit is written into the local level (the backfill); a write goes to the
local level, then is handed to the shared one; each level keeps its own numbers. The store
(``_store``) is JAX's cache interface over it, and tells the recorder what each lookup came to.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, NamedTuple

from gkx_autocache import _fork
from gkx_autocache._entry import MISS, Answer, Entry
from gkx_autocache._formats import compression_of

if TYPE_CHECKING:  # (types only: nothing to compile on import jax)
    from typing import Protocol

    from gkx_autocache._local.landing import Receipt
    from gkx_autocache._local.level import LocalLevel

    class Shared(Protocol):
        """What the chain asks of the shared level (``_shared.level.Level``)."""

        url: str

        @property
        def off_note(self) -> str | None: ...

        @property
        def signs(self) -> bool: ...

        def before_lookup(self, key: str) -> None: ...

        def local_hit(self, key: str, nbytes: int, prefetched: bool = False) -> None: ...

        def local_miss(self, key: str = "") -> None: ...

        def read(self, key: str) -> Answer: ...

        def count(self, **add: float) -> None: ...

        def vouch(self, key: str, data: bytes, compile_secs: float | None, written: float) -> bytes | None: ...

        def put(self, key: str, data: bytes, compile_secs: float | None, seal: bytes | None = None,
                written: float = 0.0) -> None: ...

        def snapshot(self) -> dict[str, float] | None: ...

        def finish(self) -> None: ...


class NoLevel:
    """No shared level behind the local one: every question answered as a level that has nothing."""

    url = ""
    off_note: str | None = None
    signs = False

    def before_lookup(self, key: str) -> None:
        pass

    def local_hit(self, key: str, nbytes: int, prefetched: bool = False) -> None:
        pass

    def local_miss(self, key: str = "") -> None:
        pass

    def read(self, key: str) -> Answer:
        return MISS

    def count(self, **add: float) -> None:
        pass

    def vouch(self, key: str, data: bytes, compile_secs: float | None, written: float) -> bytes | None:
        return None

    def put(self, key: str, data: bytes, compile_secs: float | None, seal: bytes | None = None,
            written: float = 0.0) -> None:
        pass

    def snapshot(self) -> dict[str, float] | None:
        return None

    def finish(self) -> None:
        pass


class Lookup(NamedTuple):
    """What a lookup came to: the entry served and the level that served it (``local``,
    ``shared``), the run that wrote a local one (and whether a rebuild compiled it), the receipt of a prefetched entry's first use, a
    shared hit's bytes written into the local level; or why an entry there could not be served,
    or that the shared level was off (it may have held it)."""

    entry: Entry | None = None
    level: str = ""
    run: str = ""
    receipt: Receipt | None = None
    rebuilt: bool = False
    backfilled: int | None = None
    refused: str | None = None
    shared_off: str | None = None


def local_zero() -> dict[str, float]:
    """The local level's numbers, named as the shared level's (``_shared.channel.COUNTS``)."""
    return {"hits": 0, "misses": 0, "bytes_read": 0, "read_secs": 0.0, "reads": 0}


class Chain:
    """``local``, then ``shared``."""

    def __init__(self, local: LocalLevel, shared: Shared | NoLevel) -> None:
        self.local = local
        self.shared = shared
        self._local_counts = local_zero()
        self._lock = threading.Lock()
        _fork.in_child(self._forked)

    def _forked(self) -> None:
        self._lock = threading.Lock()
        self._local_counts = local_zero()

    @property
    def url(self) -> str:
        return self.shared.url

    @property
    def signs(self) -> bool:
        return self.shared.signs

    def lookup(self, key: str, again: bool = False) -> Lookup:
        """``again``: the same request of JAX's looked up a second time, in the local level only (a
        rebuild here compiled its key meanwhile, ``Store.get``): one request, one hit or one miss of
        the local level, and the shared level not asked twice (an empty answer where it misses)."""
        shared, local = self.shared, self.local
        shared.before_lookup(key)  # its prefetch, if in flight, lands first
        started = time.perf_counter()
        data, why = local.read(key)
        if data is not None and why is None:
            compile_secs, written, run, rebuilt = local.compile_secs(key, data)
            receipt = local.landings.take(key)
            # A prefetched entry's first use is the shared level's hit, and the local level's miss.
            self._tally(len(data) if receipt is None else None, time.perf_counter() - started, was_miss=again)
            shared.local_hit(key, len(data), prefetched=receipt is not None)
            return Lookup(Entry(data, compile_secs, written), "local", run, receipt, rebuilt)
        if again:  # (its miss counted once, by the first lookup)
            return Lookup()
        self._tally(None)
        shared.local_miss(key)
        if not why or compression_of(data or b"") is None:  # another environment's entry is left alone
            answer = shared.read(key)
            refused = answer.refused
            if answer.found is not None:
                refused = local.unusable_shared(answer.found.data, landing=False)
                if refused is None:
                    return self._backfilled(key, answer.found)
            if refused is not None:
                why = refused
        if why:  # the entry was there but cannot be used: named, not "evicted" on every run
            return Lookup(refused=why)
        return Lookup(shared_off=shared.off_note)

    def _backfilled(self, key: str, found: Entry) -> Lookup:
        """A shared hit: written into the local level first (the backfill, atomic) where it takes
        writes, so that the next run reads it there; served either way."""
        found = self.local.believed(found)
        written = self.local.backfill(key, found) if self.local.writable else None
        if written is not None:
            self.shared.count(backfills=1)
        return Lookup(found, "shared", backfilled=written)

    def write(self, key: str, data: bytes, compile_secs: float | None, run: str, rebuilt: bool = False) -> int:
        """A compile's entry (``compile_secs``: measured, or None; ``rebuilt``: a rebuild's), into
        the local level with the seal this process's key makes for it, then handed to the shared
        level (queued: off the compile path); the bytes written locally. Raises OSError where the
        local level cannot take it."""
        now = time.time()  # what this process compiled, its key vouches for: kept beside it
        seal = self.shared.vouch(key, data, compile_secs, now)
        written = self.local.put(key, data, compile_secs, run, seal, rebuilt)
        self.shared.put(key, data, compile_secs, seal, now)
        return written

    def waited(self, nbytes: int, secs: float) -> None:
        """A lookup the local level missed whose entry another process wrote while this one waited
        for it (``Store._settle``): served from the local level after all, so counted as its hit."""
        self._tally(nbytes, secs, was_miss=True)

    def unserved(self) -> None:
        """A local hit JAX could not load (``Store.reject``): the run counts it a miss, and so does the level."""
        with self._lock:
            self._local_counts["hits"] -= 1
            self._local_counts["misses"] += 1

    def _tally(self, hit_bytes: int | None, secs: float = 0.0, was_miss: bool = False) -> None:
        """One lookup's count (``hit_bytes`` None: a miss); ``was_miss``: a hit of a lookup already
        counted a miss (looked at again, waited for), in its place in one step: a snapshot never
        sees it in neither column, or in both."""
        with self._lock:
            counts = self._local_counts
            if was_miss:
                counts["misses"] -= 1
            if hit_bytes is None:
                counts["misses"] += 1
                return
            counts["hits"] += 1
            counts["bytes_read"] += hit_bytes
            counts["read_secs"] += secs
            counts["reads"] += 1

    def numbers(self) -> dict[str, dict[str, float]]:
        """Both levels' numbers (SPEC §14), where there is a shared level; else none."""
        shared = self.shared.snapshot()
        if shared is None:
            return {}
        with self._lock:
            return {"local": dict(self._local_counts), "shared": shared}

    def finish(self) -> list[tuple[str, Receipt]]:
        """At exit: the shared level's pending uploads, manifest and pack; then the entries a
        prefetch landed that no lookup used (the prefetch's waste, still entries written here)."""
        self.shared.finish()
        return self.local.landings.rest() if self.local.writable else []
