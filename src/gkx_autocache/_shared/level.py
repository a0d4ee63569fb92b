"""The shared level (SPEC §14): a second store behind the local one, in a bucket (``s3://``,
``gs://``, through fsspec), an HTTP(S) cache or a directory (a team directory, or a read-only one baked into an
image). The store asks it on a local miss and hands it each local write; it knows nothing of the
CLI. Nothing here runs at interpreter start or on ``import jax`` beyond building the object: the
first shared access is the first local miss. Here: lookups, the prefetch's start, the numbers of
both levels, and what a run leaves at exit (its manifest and pack). The backend, the listing and the
off-switch are the ``channel``'s; reading one entry and the seals, ``reads``'; the upload queue, its
worker and healing, ``uploads``'; the settings into a level, ``setup``'s. The design (bounded calls, the listing, healing, seals, uploads, ``fork``):
docs/how-it-works.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from gkx_autocache import _autotune, _fork
from gkx_autocache._backends.port import Backend, TimedOut
from gkx_autocache._diagnostics import NOTED, logger, warn
from gkx_autocache._entry import MISS, Answer, Entry
from gkx_autocache._jax import runtime as jax_runtime
from gkx_autocache._layout import ENTRY_SUFFIX
from gkx_autocache._shared import manifest, pack, prefetch
from gkx_autocache._shared.calls import LEAST_SECS, ShuttingDown, TooSlow, bounded, describe
from gkx_autocache._shared.channel import Channel
from gkx_autocache._shared.local import LocalPort
from gkx_autocache._shared.reads import Reader
from gkx_autocache._shared.seal import EntryRefused
from gkx_autocache._shared.uploads import QUEUE_BYTES, Uploads

MAX_ENTRY = 8 << 30  # without a cap, the most read of one shared entry (a lying seal cannot ask for more)


class Level:
    """The shared level of this process, as the chain asks it: lookups, the prefetch, its numbers,
    and what a run leaves at exit. Its ``channel`` (the backend, the listing, the off-switch) is
    what its ``reader``, its ``uploads`` and its prefetch are given; ``local``, the local level in
    front of it (``LocalPort``: where a prefetch lands, what uploads read), built before it."""

    def __init__(self, url: str, backend: Backend, local: LocalPort, *, timeout: float, writes: str | None,
                 secret: bytes | None, max_entry: int = MAX_ENTRY, origin: str = "shared",
                 queue_bytes: int = QUEUE_BYTES, room: Callable[[bool], int] | None = None,
                 tunes: bool = False, rank: Callable[[], int] = jax_runtime.process_id) -> None:
        self.channel = channel = Channel(url, backend, timeout=timeout, rank=rank, origin=origin, local_dir=local.path)
        self.url = url  # as the user wrote it, for messages
        self.local = local
        self.tunes = tunes  # XLA keeps GPU autotune results in the local level (``_autotune``): they travel
        self.reader = Reader(channel, secret=secret, max_entry=max_entry)
        self.room = room  # the room under the local level's cap (``fold.prefetch_room``): a prefetch stays in it
        self._prefetch: prefetch.Prefetch | None = None  # the Prefetch of this process, from its first local miss on
        self._prefetch_tried = False
        self._seen: dict[str, int] = {}  # the keys this run looked up (hits and writes): its manifest
        self._forked_child = False
        self._missed = False  # a lookup missed the local level: a writer's run then leaves a manifest
        self._compiled: dict[str, float] = {}  # function -> the longest compile of it this process measured
        self._lock = threading.Lock()
        self.uploads = Uploads(channel, self.reader, local, writes, queue_bytes)  # writes: None, uploads on; else why not
        _fork.in_child(self._forked)

    def _forked(self) -> None:
        self._lock = threading.Lock()
        self._missed = False
        self._prefetch, self._prefetch_tried = None, True  # the parent's threads are not here; its prefetch lands still
        self._seen = {}
        self._forked_child = True  # its run is part of its parent's: no manifest of its own

    # -- counting --------------------------------------------------------------------------------

    def count(self, **add: float) -> None:
        """The shared level's numbers (the channel's); the local level's are the recorder's."""
        self.channel.count(**add)

    def local_hit(self, key: str, nbytes: int, prefetched: bool = False) -> None:
        """``prefetched``: the first use of an entry the prefetch landed (``Landing.take``): the
        shared level's hit, fetched ahead. Else a writer's hit may heal the bucket."""
        self._saw(key, nbytes)
        if prefetched:
            self._missed = True
            self.channel.count(hits=1, prefetch_used=1)
        else:
            self.uploads.heal(key)

    def _saw(self, key: str, nbytes: int) -> None:
        if self.writes is None and len(self._seen) < manifest.MANIFEST_KEYS:
            self._seen.setdefault(key, nbytes)

    def local_miss(self, key: str = "") -> None:
        self._missed = True
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
        channel = self.channel
        if channel.off is not None or channel.closed:
            return
        if self.writes is None and channel.rank() == 0:
            self.uploads.start()
        if not self.local.writable:  # the local level takes no writes: nothing can land
            return
        budget = prefetch.BUDGET if self.room is None else min(prefetch.BUDGET, self.room(False))  # under the cap
        if budget <= 0:
            return
        ahead = prefetch.Prefetch(channel, self.reader, self.local, budget, tunes=self.tunes, room=self.room)
        ahead.claim(key)  # this lookup's: fetched by it
        self._prefetch = ahead
        ahead.start()

    def before_lookup(self, key: str) -> None:
        """A lookup about to read the local level: a prefetch of its key in flight is waited for."""
        if self._prefetch is not None:
            self._prefetch.wait(key)

    def snapshot(self) -> dict[str, float]:
        """The shared level's numbers."""
        return self.channel.snapshot()

    @property
    def off_note(self) -> str | None:
        return self.channel.off_note

    @property
    def writes(self) -> str | None:
        """None where this process uploads, else why not (``shared_write = never``, ...)."""
        return self.uploads.writes

    # -- reading ---------------------------------------------------------------------------------

    def read(self, key: str) -> Answer:
        """The entry from the shared level (``found``), why it must not be served (``refused``), or
        neither for a miss. Never raises. Before a miss goes to XLA to compile, the GPU autotune
        results of a prefetch (``_autotune``) are in place, or a timeout has passed."""
        answer = self._get(key)
        if answer.found is None and (ahead := self._prefetch) is not None:
            ahead.tuned.wait(self.channel.timeout)
        return answer

    def _get(self, key: str) -> Answer:
        ahead = self._prefetch
        if ahead is not None:
            why, slow = ahead.claim(key)  # this lookup's own: never the prefetch's too
            if why is not None:
                self.channel.count(rejected=1, misses=1)  # the prefetch read it: refused, not read twice
                return Answer(refused=why)
            if slow:  # slower than its compile: not read twice either
                self.channel.count(misses=1)
                return MISS
        channel = self.channel
        if channel.off is not None or not channel.ensure():
            self.channel.count(misses=1)
            return MISS
        listing = channel.listing
        if listing is not None and key + ENTRY_SUFFIX not in listing:
            self.channel.count(misses=1)  # answered by the listing: no round trip
            return MISS
        started = time.perf_counter()
        try:
            found: Entry | None = bounded(lambda progress: self.reader.fetch(key, progress), channel.timeout)
        except ShuttingDown:  # a compile while the interpreter exits: a miss, nothing wrong with the level
            self.channel.count(misses=1)
            return MISS
        except EntryRefused as exc:
            self.channel.count(rejected=1, misses=1)
            logger.debug("shared entry %s not served: %s", key, exc)
            return Answer(refused=str(exc))
        except TimedOut as exc:  # a stall (``calls.Stalled``) or the client's own timeout
            self.channel.count(misses=1)
            channel.turn_off(str(exc), timed_out=True)
            return MISS
        except TooSlow as exc:
            self.channel.count(misses=1)
            channel.too_slow(key, str(exc))
            return MISS
        except Exception as exc:
            self.channel.count(misses=1)
            channel.turn_off(describe(exc))
            return MISS
        if found is None:
            self.channel.count(misses=1)
            return MISS
        took = time.perf_counter() - started
        self.channel.count(hits=1, bytes_read=len(found.data), read_secs=took, reads=1)
        self._saw(key, len(found.data))
        name = key.rpartition("-")[0]
        if (compiled := self._compiled.get(name)) is not None and took > max(compiled, LEAST_SECS):
            warn("shared:slower", f"reading {name} from the shared level {channel.url} took {took:.1f} s, where this "
                                  f"process compiles {name} in {compiled:.2f} s: the level is slower than compiling "
                                  "here; fix: check the network path to it (`gkx-autocache status` probes it), or "
                                  "lower shared_timeout", NOTED)
        return Answer(found)

    # -- writing ---------------------------------------------------------------------------------

    def put(self, key: str, data: bytes, compile_secs: float | None, seal: bytes | None = None,
            written: float = 0.0) -> None:
        """Queue the entry (just written to the local level, with ``seal`` where ``vouch`` made
        one) for upload; never blocks."""
        self._saw(key, len(data))
        if compile_secs:
            name = key.rpartition("-")[0]
            self._compiled[name] = max(compile_secs, self._compiled.get(name, 0.0))
        self.uploads.put(key, data, seal, compile_secs, written)

    def finish(self) -> None:
        """At exit: what is pending gets one ``shared_timeout`` in all; the rest is dropped,
        counted, with one warning. The entries a prefetch landed that no lookup used are the local
        level's to say (``Chain.finish``); what the prefetch fetched that no process used, its waste."""
        channel = self.channel
        deadline = time.monotonic() + channel.timeout
        channel.close()
        if self._prefetch is not None:
            wasted = self._prefetch.stop(min(1.0, channel.timeout))
            if wasted:
                channel.count(prefetch_wasted_bytes=wasted)
        try:
            objects = self._manifest_items()
        except Exception as exc:  # pragma: no cover - never costs the exit
            logger.debug("no manifest: %s", exc)
            objects = []
        left_over = self.uploads.finish(objects, deadline)
        if left_over:
            channel.count(dropped=left_over)
            warn("shared:exit", f"{left_over} uploads to the shared level {channel.url} were dropped at exit: they did "
                                f"not finish within shared_timeout ({channel.timeout:g} s, {channel.origin}); they are "
                                "compiled again by a later run")

    def _manifest_items(self) -> list[tuple[str, bytes]]:
        """At exit, a writer's run that missed locally: its manifest and (to a bucket) its pack, as
        ``(object name, bytes)`` for the upload queue, for the next fresh runs of this program. Its
        keys come first, then those of the manifest it read that come after the last one it looked
        up: a run stopped early looked up a prefix of them, and must not cut a 154-key manifest to 5;
        keys it passed over belong to an earlier version of the program, and are dropped. None when
        that is what it read."""
        seen = self._seen
        if (self.writes is not None or self.channel.off is not None or not seen or self.channel.rank() != 0
                or not self._missed or not self.uploads.started or self._forked_child):
            return []
        keys = list(seen.items())
        ahead = self._prefetch
        own = ahead.own if ahead is not None else None
        tuned = _autotune.local(self.local.path, self.local.team, signing=self.reader.signs) if self.tunes else []
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
        if self.channel.backend.streams():  # (not a directory, nor gcsfs)
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
        for key, size in keys:
            room -= size + pack.HEAD.size + len(key) + 512  # (a seal: about 300 bytes; ``build`` has the last word)
            if room < 0:
                return
            if (entry := self.local.uploadable(key)) is not None and \
                    (seal := self.reader.seal_for(key, entry.data, entry.seal, entry.compile_secs, entry.written)):
                yield key, seal, entry.data

    # -- what this process's key vouches for (``reads.Reader``) ------------------------------------

    @property
    def signs(self) -> bool:
        return self.reader.signs

    def vouch(self, key: str, data: bytes, compile_secs: float | None, written: float) -> bytes | None:
        """``Reader.vouch``, where this process uploads (else None: then nothing it wrote is healed or
        packed by it)."""
        return None if self.writes is not None else self.reader.vouch(key, data, compile_secs, written)
