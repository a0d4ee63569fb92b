"""The shared level (SPEC §14): a second store behind the local one, in a bucket (``s3://``,
``gs://``, through fsspec), an HTTP(S) cache or a directory (a team directory, or a read-only one baked into an
image). The store asks it on a local miss and hands it each local write; it knows nothing of the
CLI. Nothing here runs at interpreter start or on ``import jax`` beyond building the object: the
first shared access is the first local miss. Here: lookups and the listing, the off-switch, the
numbers of both levels, and what a run leaves at exit (its manifest and pack). Reading one entry and
the seals are ``reads``'; the upload queue, its worker and healing, ``uploads``'; the settings into a
level, ``setup``'s. The design (bounded calls, the listing, healing, seals, uploads, ``fork``):
docs/how-it-works.md.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from gkx_autocache import _autotune, _fork, _jax
from gkx_autocache._diagnostics import NOTED, human_bytes, logger, warn
from gkx_autocache._layout import ENTRY_SUFFIX
from gkx_autocache._shared import manifest, pack, prefetch
from gkx_autocache._shared.calls import ShuttingDown, Stalled, TooSlow, bounded, describe
from gkx_autocache._shared.reads import Found, Reader
from gkx_autocache._shared.seal import EntryRefused
from gkx_autocache._shared.uploads import QUEUE_BYTES, Uploads

LIST_TTL = 60.0
MAX_ENTRY = 8 << 30  # without a cap, the most read of one shared entry (a lying seal cannot ask for more)

# The per-level numbers, the same names for both levels (SPEC §14). Summed over processes by the
# ledger as they are; ``shown`` turns read_secs and reads into the mean read time.
COUNTS = ("hits", "misses", "backfills", "uploads", "errors", "timeouts", "slow", "rejected", "skipped", "dropped",
          "requests", "bytes_read", "bytes_written", "read_secs", "reads",
          "prefetched", "prefetched_bytes", "prefetch_used", "prefetch_wasted_bytes")


def zero() -> dict[str, float]:
    return dict.fromkeys(COUNTS, 0)


class Local(Protocol):
    """What the shared level asks of the local level in front of it (``_store.Store``)."""

    @property
    def writable(self) -> bool: ...

    def land(self, key: str, found: Found) -> tuple[bool, str | None]:
        """A prefetched entry, checked as a shared hit is, written: ``(landed, why not)``, why None
        where the local level took no write (disk full)."""

    def record_landed(self) -> None:
        """At exit: the prefetched entries no lookup used, recorded as written."""

    def uploadable(self, key: str) -> tuple[bytes, bytes] | None:
        """A local entry and the seal it may be uploaded with (healing, a pack), or None."""


class Level:
    """The shared level of this process: lookups, the listing, the off-switch, and the numbers of
    both levels (the store reports its local hits and misses); its ``reader``, its ``uploads``."""

    def __init__(self, url: str, backend: Any, *, local: str, timeout: float, writes: str | None,
                 secret: bytes | None, max_entry: int = MAX_ENTRY, origin: str = "shared",
                 queue_bytes: int = QUEUE_BYTES, room: Callable[[bool], int] | None = None, local_team: bool = False,
                 tunes: bool = False) -> None:
        self.url = url  # as the user wrote it, for messages
        self.backend = backend
        self.local_dir = local
        self.local_team = local_team  # the local level is a team directory (§8): group-writable files
        self.tunes = tunes  # XLA keeps GPU autotune results in the local level (``_autotune``): they travel
        self.timeout = timeout
        self.reader = Reader(backend, secret=secret, max_entry=max_entry, timeout=timeout,
                             count=functools.partial(self.count, "shared"))
        self.origin = origin
        self.room = room  # the room under the local level's cap (``fold.prefetch_room``): a prefetch stays in it
        self.local: Local | None = None  # the local level in front of this one, once JAX made it (``attach``)
        self._prefetch: prefetch.Prefetch | None = None  # the Prefetch of this process, from its first local miss on
        self._prefetch_tried = False
        self._seen: dict[str, int] = {}  # the keys this run looked up (hits and writes): its manifest
        self._forked_child = False
        self.counts = {"local": zero(), "shared": zero()}
        self.off: tuple[str, float] | None = None  # (why, when) once turned off
        self._prepared: bool | None = None  # None: not yet; else whether it may be written
        self._listing: dict[str, int] | None = None
        self._listed_at = -LIST_TTL
        self._reset_locks()
        self.uploads = Uploads(self, writes, queue_bytes)  # writes: None, uploads on; else why not
        _fork.in_child(self._forked)

    def _reset_locks(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Lock()  # one thread prepares and lists; the others wait for it

    def _forked(self) -> None:
        self._reset_locks()
        self.counts = {"local": zero(), "shared": zero()}
        self.backend.forget()
        self._prefetch, self._prefetch_tried = None, True  # the parent's threads are not here; its prefetch lands still
        self._seen = {}
        self._forked_child = True  # its run is part of its parent's: no manifest of its own

    def attach(self, local: Local) -> None:
        """The local level in front of this one, once JAX has made it (at its first compile): where a
        prefetched entry lands, and what healing and packs read."""
        self.local = local

    # -- counting --------------------------------------------------------------------------------

    def count(self, level: str, **add: float) -> None:
        with self._lock:
            counts = self.counts[level]
            for name, n in add.items():
                counts[name] += n

    def local_hit(self, nbytes: int, secs: float, key: str | None = None) -> None:
        ahead = self._prefetch
        if key is not None and ahead is not None and ahead.used(key):  # the shared level's hit, fetched ahead
            self.count("local", misses=1)
            self.count("shared", hits=1, prefetch_used=1)
            self._saw(key, nbytes)
            return
        self.count("local", hits=1, bytes_read=nbytes, read_secs=secs, reads=1)
        if key is not None:
            self._saw(key, nbytes)
            self.uploads.heal(key)

    def _saw(self, key: str, nbytes: int) -> None:
        if self.writes is None and len(self._seen) < manifest.MANIFEST_KEYS:
            self._seen.setdefault(key, nbytes)

    def local_miss(self, key: str = "") -> None:
        self.count("local", misses=1)
        if not self._prefetch_tried:
            self._start_prefetch(key)

    def _start_prefetch(self, key: str) -> None:
        """At the first local miss: the local level is not warm for this program, so its manifest
        is worth a request. Also the upload worker of a writer: at exit it takes the manifest
        (Python 3.12 starts no thread there). Never raises: this is JAX's compile path."""
        with self._lock:
            if self._prefetch_tried:
                return
            self._prefetch_tried = True
        try:
            self._begin(key)
        except Exception as exc:  # no thread (RLIMIT_NPROC), the package's files gone: no prefetch
            logger.debug("no prefetch: %s", describe(exc))

    def _begin(self, key: str) -> None:
        """The upload worker of a writer, and the prefetch where entries can land."""
        if self.off is not None or self.closed:
            return
        if self.writes is None and _jax.process_id() == 0:
            self.uploads.start()
        if self.local is None or not self.local.writable:  # the local level takes no writes: nothing can land
            return
        budget = prefetch.BUDGET if self.room is None else min(prefetch.BUDGET, self.room(False))  # under the cap
        if budget <= 0:
            return
        ahead = prefetch.Prefetch(self, self.reader, self.local.land, budget)
        ahead.asked.add(key)  # this lookup's: fetched by it
        self._prefetch = ahead
        ahead.start()

    def before_lookup(self, key: str) -> None:
        """A lookup about to read the local level: a prefetch of its key in flight is waited for."""
        if self._prefetch is not None:
            self._prefetch.wait(key)

    def record(self) -> dict[str, Any]:
        """Both levels' numbers as a ledger record: the ledger sums them over processes."""
        with self._lock:
            return {"e": "levels", **{level: {k: round(v, 6) if isinstance(v, float) else v
                                              for k, v in counts.items() if v}
                                      for level, counts in self.counts.items()}}

    def snapshot(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {level: dict(counts) for level, counts in self.counts.items()}

    @property
    def off_note(self) -> str | None:
        """For a miss while the level is off: what turned it off, and when."""
        if self.off is None:
            return None
        why, when = self.off
        return f"{why} at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(when))}"

    @property
    def closed(self) -> bool:
        """At exit: nothing more is fetched or queued."""
        return self.uploads.closed

    @property
    def listed(self) -> bool:
        """Whether the listing was taken (a directory and an HTTP cache: whether the level was
        prepared), not only being taken now."""
        return self._listed_at != -LIST_TTL

    @property
    def writable(self) -> bool:
        """Whether the level, prepared, may be written (a shared directory may be read-only here)."""
        return bool(self._prepared)

    @property
    def writes(self) -> str | None:
        """None where this process uploads, else why not (``shared_write = never``, ...)."""
        return self.uploads.writes

    @property
    def listing(self) -> dict[str, int] | None:
        """A bucket's version prefix as last listed (object name -> bytes), or None (a directory, an
        HTTP cache, a listing beyond one page, or not listed yet)."""
        return self._listing

    def turn_off(self, why: str, timed_out: bool = False) -> None:
        """The first stall or error: the level is off for the rest of the process, one warning."""
        def off() -> None:
            self.off = (why, time.time())

        with self._lock:  # (then the uploads' lock: never the other way round)
            if self.off is not None:
                return
            self.counts["shared"]["timeouts" if timed_out else "errors"] += 1
            self.counts["shared"]["dropped"] += self.uploads.drop(off)  # this run's own entries
        fix = f"raise shared_timeout ({self.origin})" if timed_out else "check its endpoint and credentials"
        warn("shared:off", f"the shared level {self.url} is off for the rest of this process after {why}; the run "
                           f"goes on with the local level {self.local_dir}; fix: `gkx-autocache status` probes it, "
                           f"or {fix}")

    def too_large(self, size: int, why: str) -> None:
        """An upload the server refused for its size (HTTP 413): that entry skipped, the level on,
        one warning a process with the setting that raises the limit."""
        warn("shared:too-large", f"the shared level {self.url} refused an entry of {human_bytes(size)} as too large "
                                 f"({why}); entries that large are not uploaded, the others are, and the level stays on; "
                                 "fix: raise the server's limit on a request's body (nginx: client_max_body_size, 1 MiB "
                                 "by default: client_max_body_size 0 takes any size)")

    def too_slow(self, key: str, why: str) -> None:
        """A read past what its entry is worth (``calls.worth``): that entry is compiled here; the
        level stays on (it moved, it did not stall), with one warning a process."""
        self.count("shared", slow=1)
        logger.debug("shared entry %s not read on: %s", key, why)
        warn("shared:slow", f"a read from the shared level {self.url} was slower than compiling: {why}; the "
                            "entry is compiled here, and the level stays on for later lookups; fix: where every "
                            "large entry is this slow, check the network path to it (`gkx-autocache status` "
                            "probes it)", NOTED)

    # -- reading ---------------------------------------------------------------------------------

    def ensure(self, quiet: bool = False) -> bool:
        """Prepare the level (trust, the version directory) and list a bucket's version prefix, once
        (and the listing again after LIST_TTL); whether it is usable. ``quiet``: for healing alone
        (a run of local hits), a failure stops the healing with a debug line and leaves the level
        on: such a run needs nothing of the bucket, and a later miss says what is wrong."""
        if (self._prepared is not None and self._listed_at != -LIST_TTL  # (another thread may be listing now: wait)
                and (self._listing is None or time.monotonic() - self._listed_at < LIST_TTL)):
            return self.off is None
        with self._ready:
            if self.off is not None:
                return False
            try:
                if self._prepared is None:
                    self._prepared = bool(bounded(self.backend.prepare, self.timeout))
                if time.monotonic() - self._listed_at >= LIST_TTL:
                    names = bounded(self.backend.listing, self.timeout)
                    self._listing = names if isinstance(names, dict) else None
                    self._listed_at = time.monotonic()
                    if self.backend.kind == "bucket":
                        self.count("shared", requests=1)  # (an HTTP cache's HEAD, where it has no listing)
                        self.uploads.sweep()
                    else:
                        self._listed_at = float("inf")  # a directory is never listed
            except ShuttingDown:  # at exit: the listing stays as it is; nothing is wrong with the level
                return self.off is None and self._prepared is not None
            except Exception as exc:
                if quiet:
                    logger.debug("the shared level %s is not healed: %s", self.url, describe(exc))
                    return False
                if isinstance(exc, Stalled):
                    self.turn_off(str(exc), timed_out=True)
                else:
                    self.turn_off(describe(exc))
        return self.off is None

    def get(self, key: str) -> Found | str | None:
        """The entry from the shared level (``Found``), why it must not be served (a string), or
        None for a miss. Never raises. Before a miss goes to XLA to compile, the GPU autotune
        results of a prefetch (``_autotune``) are in place, or a timeout has passed."""
        found = self._get(key)
        if not isinstance(found, Found) and (ahead := self._prefetch) is not None:
            ahead.tuned.wait(self.timeout)
        return found

    def _get(self, key: str) -> Found | str | None:
        ahead = self._prefetch
        if ahead is not None:
            ahead.take(key)  # this lookup's own: never the prefetch's too
            if (why := ahead.refused.pop(key, None)) is not None:
                self.count("shared", rejected=1, misses=1)  # the prefetch read it: refused, not read twice
                return why
            if ahead.slow.pop(key, None) is not None:  # slower than its compile: not read twice either
                self.count("shared", misses=1)
                return None
        if self.off is not None or not self.ensure():
            self.count("shared", misses=1)
            return None
        listing = self._listing
        if listing is not None and key + ENTRY_SUFFIX not in listing:
            self.count("shared", misses=1)  # answered by the listing: no round trip
            return None
        started = time.perf_counter()
        try:
            found: Found | None = bounded(lambda progress: self.reader.fetch(key, progress), self.timeout)
        except ShuttingDown:  # a compile while the interpreter exits: a miss, nothing wrong with the level
            self.count("shared", misses=1)
            return None
        except EntryRefused as exc:
            self.count("shared", rejected=1, misses=1)
            logger.debug("shared entry %s not served: %s", key, exc)
            return str(exc)
        except Stalled as exc:
            self.count("shared", misses=1)
            self.turn_off(str(exc), timed_out=True)
            return None
        except TooSlow as exc:
            self.count("shared", misses=1)
            self.too_slow(key, str(exc))
            return None
        except Exception as exc:
            self.count("shared", misses=1)
            self.turn_off(describe(exc))
            return None
        if found is None:
            self.count("shared", misses=1)
            return None
        self.count("shared", hits=1, bytes_read=len(found.data), read_secs=time.perf_counter() - started, reads=1)
        self._saw(key, len(found.data))
        return found

    # -- writing ---------------------------------------------------------------------------------

    def put(self, key: str, data: bytes, compile_secs: float | None, seal: bytes | None = None,
            written: float = 0.0) -> None:
        """Queue the entry (just written to the local level, with ``seal`` where ``vouch`` made
        one) for upload; never blocks."""
        self._saw(key, len(data))
        self.uploads.put(key, data, seal, compile_secs, written)

    def finish(self, recorder: Any = None) -> None:
        """At exit: what is pending gets one ``shared_timeout`` in all; the rest is dropped,
        counted, with one warning. Then both levels' numbers go to the ledger."""
        deadline = time.monotonic() + self.timeout
        if self._prefetch is not None:
            wasted = self._prefetch.stop(min(1.0, self.timeout))
            if wasted:
                self.count("shared", prefetch_wasted_bytes=wasted)
            if self.local is not None and self.local.writable:
                self.local.record_landed()
        try:
            objects = self._manifest_items()
        except Exception as exc:  # pragma: no cover - never costs the exit
            logger.debug("no manifest: %s", exc)
            objects = []
        left_over = self.uploads.finish(objects, deadline)
        if left_over:
            self.count("shared", dropped=left_over)
            warn("shared:exit", f"{left_over} uploads to the shared level {self.url} were dropped at exit: they did "
                                f"not finish within shared_timeout ({self.timeout:g} s, {self.origin}); they are "
                                "compiled again by a later run")
        if recorder is not None:
            try:
                recorder.levels_record(self.record())
            except Exception as exc:
                logger.debug("per-level numbers not recorded: %s", exc)

    def _manifest_items(self) -> list[tuple[str, bytes]]:
        """At exit, a writer's run that missed locally: its manifest and (to a bucket) its pack, as
        ``(object name, bytes)`` for the upload queue, for the next fresh runs of this program. Its
        keys come first, then those of the manifest it read that come after the last one it looked
        up: a run stopped early looked up a prefix of them, and must not cut a 154-key manifest to 5;
        keys it passed over belong to an earlier version of the program, and are dropped. None when
        that is what it read."""
        seen = self._seen
        if (self.writes is not None or self.off is not None or not seen or _jax.process_id() != 0
                or not self.counts["local"]["misses"] or not self.uploads.started or self._forked_child):
            return []
        keys = list(seen.items())
        ahead = self._prefetch
        own = ahead.own if ahead is not None else None
        tuned = _autotune.local(self.local_dir, self.local_team, signing=self.reader.signs) if self.tunes else []
        obj = _autotune.pack(tuned) if tuned else b""
        said = ahead.autotune[1:] if ahead is not None and ahead.autotune is not None else None
        # A process with no results of its own to vouch for (its XLA keeps none, its landing failed, or
        # they are another run's) names the object its manifest named: it never drops a writer's.
        autotune = (_autotune.digest(obj), len(obj)) if tuned else said
        if own is not None:
            last = max((at for at, (key, _) in enumerate(own) if key in seen), default=-1)
            keys = (keys + [item for item in own[last + 1:] if item[0] not in seen])[:manifest.MANIFEST_KEYS]
            if {key for key, _ in keys} == {key for key, _ in own} and autotune == said:
                return []  # (new results are written again)
        ident, part, _, _ = manifest.program()
        name = manifest.manifest_name(ident, part)
        data, packed = b"", list[str]()
        if self.backend.kind == "bucket" and self.local is not None and self.backend.streams():  # (not gcsfs)
            data, packed = pack.build(self._records(keys))
        inside = set(packed)
        keys = [item for item in keys if item[0] in inside] + [item for item in keys if item[0] not in inside]
        items = [(pack.name_for(name), data)] if packed else []  # the pack first: a reader of the manifest finds it
        items.append((name, self.reader.signed_manifest(keys, ident, len(packed), autotune)))
        if tuned and autotune != said:  # after the manifest, which an exit's one timeout must not lose to it
            items.append((manifest.autotune_name(name), obj))
        return items

    def _records(self, keys: list[tuple[str, int]]) -> Iterator[tuple[str, bytes, bytes]]:
        """The pack's records: each entry of ``keys`` this level holds with a seal it may be uploaded
        with (``Reader.seal_for``: with a key, only the one kept beside it, verified), until their sizes
        as looked up fill the pack (nothing beyond it is read)."""
        room = pack.LIMIT
        assert self.local is not None
        for key, size in keys:
            room -= size + pack.HEAD.size + len(key) + 512  # (a seal: about 300 bytes; ``build`` has the last word)
            if room < 0:
                return
            if (local := self.local.uploadable(key)) is not None:
                data, seal = local
                yield key, seal, data

    # -- what this process's key vouches for (``reads.Reader``) ------------------------------------

    @property
    def signs(self) -> bool:
        return self.reader.signs

    def vouch(self, key: str, data: bytes, compile_secs: float | None, written: float) -> bytes | None:
        """``Reader.vouch``, where this process uploads (else None: then nothing it wrote is healed or
        packed by it)."""
        return None if self.writes is not None else self.reader.vouch(key, data, compile_secs, written)

    def seal_for(self, key: str, data: bytes, raw_seal: bytes | None, compile_secs: float | None,
                 written: float) -> bytes | None:
        return self.reader.seal_for(key, data, raw_seal, compile_secs, written)
