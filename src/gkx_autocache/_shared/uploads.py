"""The shared level's uploads (SPEC §14): this run's entries, the entries it heals, and at exit its
manifest and pack, queued in memory and written by one worker thread, one at a time, each bounded
like a read. The compile path never waits on them: beyond the queue's bound an entry is skipped,
counted. At exit what is pending gets one ``shared_timeout`` in all (``finish``). Healing puts back
an entry the bucket lost, from a writer's local hit (docs/how-it-works.md, "Healing").
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import NamedTuple

from gkx_autocache import _fork, _formats
from gkx_autocache._backends.port import TimedOut, TooLarge
from gkx_autocache._diagnostics import logger
from gkx_autocache._layout import COMPILE_SIDECAR, ENTRY_SUFFIX, PACK_SUFFIX, SEAL_SIDECAR
from gkx_autocache._shared.calls import Progress, ShuttingDown, bounded, describe
from gkx_autocache._shared.channel import Channel
from gkx_autocache._shared.local import LocalPort
from gkx_autocache._shared.reads import Reader

QUEUE_BYTES = 256 << 20  # entries waiting to be uploaded, held in memory
HEAL_KEYS = 20_000  # the most local hits a run remembers for healing, until a miss takes the listing


class Item(NamedTuple):
    """One upload: an entry this run wrote, an entry to heal, or a manifest or its pack."""

    name: str  # the entry's key, or the manifest's or pack's object name
    data: bytes  # an entry to heal is read from the local level by the worker: b"" here
    seal: bytes | None  # this run's entry's seal where its key signed it at the compile
    compile_secs: float | None
    written: float
    heal: bool  # uploaded only where the listing lacks it, with the seal kept beside it locally
    manifest: bool


class Uploads:
    """The queue of uploads through ``channel`` and its worker; ``reader`` seals what goes up, and
    ``local`` holds the entries it heals (``LocalPort.uploadable``). ``writes``: None where this
    process uploads, else why not (``shared_write = never``, a read-only shared directory)."""

    def __init__(self, channel: Channel, reader: Reader, local: LocalPort, writes: str | None,
                 queue_bytes: int = QUEUE_BYTES) -> None:
        self.channel = channel
        self.reader = reader
        self.local = local
        self.writes = writes
        self.queue_bytes = queue_bytes
        self._closed = False
        self._dropped = False  # what was left queued is counted, once: by ``drop`` (the level off) or ``finish``
        self._healing = True  # off after a failure of the worker's own listing (quietly: see Level.ensure)
        self._refused_at: int | None = None  # the smallest upload the server refused for its size: larger ones skipped
        self._healed: set[str] = set()  # keys queued to heal the bucket, once each
        self._to_heal: list[str] = []  # local hits before a miss took the listing: checked when one does
        self._reset_threads()
        _fork.in_child(self._reset_threads)
        channel.when_off(self.drop)  # the queue dropped as the switch turns, under this lock
        channel.when_listed(self.sweep)

    def _reset_threads(self) -> None:
        """Also in a forked child: the parent's worker is not there, nor are its locks' holders."""
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._queue: deque[Item] = deque()  # this run's entries, its manifest and pack
        self._heals: deque[Item] = deque()  # entries to heal: only when the queue is empty, never at exit
        self._queued = 0  # bytes in the queue and in flight
        self._in_flight: Item | None = None  # the item the worker is uploading
        self._worker: threading.Thread | None = None

    @property
    def closed(self) -> bool:
        """At exit: nothing more is queued."""
        return self._closed

    @property
    def started(self) -> bool:
        """Whether the worker was started (a writer's first local miss starts it, so that at exit it
        takes the manifest: Python 3.12 starts no thread there)."""
        return self._worker is not None

    def _taking(self) -> bool:
        return self.writes is None and self.channel.off is None and not self._closed and self.channel.rank() == 0

    def put(self, key: str, data: bytes, seal: bytes | None, compile_secs: float | None, written: float) -> None:
        """Queue an entry this run wrote; never blocks."""
        if self._taking():
            self._enqueue(Item(key, data, seal, compile_secs, written or time.time(), heal=False, manifest=False))

    def heal(self, key: str) -> None:
        """A writer's local hit: uploaded where the bucket's listing lacks it (a warm local level
        never reads the bucket, so nothing else would ever put an entry back that was lost there).
        Only in a run that asks the bucket anyway: a hit before the first miss is remembered, and
        checked when that miss takes the listing (``sweep``); a run of local hits costs no request,
        no import and no thread (it cost a warm writer 1.29 x its run). The worker reads the entry
        and the seal kept beside it; never a round trip here."""
        if not self._taking() or not self._healing or not self.channel.backend.lists or key in self._healed:
            return
        if not self.channel.listed:  # not listed yet (or being listed now: ``sweep`` follows)
            if len(self._to_heal) < HEAL_KEYS:
                self._to_heal.append(key)
            return
        listing = self.channel.listing
        if listing is None or key + ENTRY_SUFFIX in listing:
            return
        self._healed.add(key)
        self._enqueue(Item(key, b"", None, None, 0.0, heal=True, manifest=False))

    def sweep(self) -> None:
        """Once the listing is taken: the local hits before it, healed where it lacks them."""
        waiting, self._to_heal = self._to_heal, []
        for key in waiting:
            self.heal(key)

    def _enqueue(self, item: Item) -> None:
        with self._lock:
            if self.channel.off is not None:
                return
            skipped = self._queued + len(item.data) > self.queue_bytes  # the compile path never waits
            if not skipped:
                (self._heals if item.heal else self._queue).append(item)
                self._queued += len(item.data)
                self._start_worker()
                self._changed.notify_all()
        if skipped:
            self.channel.count(skipped=1)

    def _start_worker(self) -> None:
        """Under the lock: the upload worker, once."""
        if self._worker is None:
            self._worker = threading.Thread(target=self._drain, name="gkx-autocache-upload", daemon=True)
            self._worker.start()

    def start(self) -> None:
        """A writer's first local miss: the worker now, for what it takes at exit."""
        with self._lock:
            self._start_worker()

    def drop(self, turn_off: Callable[[], None]) -> int:
        """``turn_off()`` the level and drop everything queued, at once: the worker takes nothing
        between the two. This run's own entries dropped, the one in flight too."""
        with self._lock:
            turn_off()
            if self._dropped:
                return 0
            self._dropped = True
            flying = self._in_flight
            dropped = sum(not item.manifest for item in self._queue) + bool(
                flying is not None and not flying.heal and not flying.manifest)
            self._queue.clear()
            self._heals.clear()
            self._queued = 0
            self._changed.notify_all()
        return dropped

    def _pending(self) -> bool:
        """Under the lock: whether an upload of this run's, its manifest or its pack is queued or in
        flight (entries to heal are never waited for at exit)."""
        flying = self._in_flight
        return (flying is not None and not flying.heal) or any(not item.heal for item in self._queue)

    def _drain(self) -> None:
        """The upload worker: one entry at a time, each bounded like a read."""
        while True:
            with self._lock:  # (not once the level is off: what is queued is ``drop``'s to count)
                while (not self._queue and (self._closed or not self._heals)) or self.channel.off is not None:
                    self._changed.wait()
                item = self._in_flight = (self._queue or self._heals).popleft()
            try:
                self._upload(item)
            except BaseException:  # pragma: no cover - _upload never raises; nothing reaches excepthook
                pass
            finally:
                with self._lock:
                    self._in_flight = None
                    self._queued = max(self._queued - len(item.data), 0) if self.channel.off is None else 0
                    self._changed.notify_all()

    def _upload(self, item: Item) -> None:
        channel = self.channel
        key, data, seal = item.name, item.data, item.seal
        if item.manifest:
            self._upload_manifest(key, data)
            return
        if item.heal and not self._healing:
            return
        if not channel.ensure(quiet=item.heal):
            if item.heal and channel.off is None:  # the worker's own listing failed: no more healing this run
                self._healing = False
            return
        if item.heal:
            if channel.listing is None or key + ENTRY_SUFFIX in channel.listing:
                return  # the bucket has it, or there is no listing to tell
            entry = self.local.uploadable(key)
            seal = None if entry is None else self.reader.seal_for(key, entry.data, entry.seal, entry.compile_secs,
                                                                   entry.written)
            if entry is None or seal is None:  # gone, another user's, or not vouched for by this key: never signed here
                return
            data = entry.data
        if not channel.writable:  # a read-only shared directory is never written
            with self._lock:
                self.writes = "the shared directory is read-only here"
                self._queue.clear()
                self._heals.clear()
            return
        if self._refused_at is not None and len(data) >= self._refused_at:
            channel.count(skipped=1)  # as large as one the server refused: not sent again
            return
        compile_secs = item.compile_secs
        sealed = seal if seal is not None else self.reader.seal(key, data, compile_secs, item.written)
        backend = channel.backend

        def upload(progress: Progress) -> None:
            backend.write(key + SEAL_SIDECAR, sealed)  # before the entry: a reader that sees it sees its seal
            progress.tick()
            if not backend.lists and compile_secs is not None:
                backend.write(key + COMPILE_SIDECAR, _formats.sidecar(compile_secs))
            backend.write(key + ENTRY_SUFFIX, data)
            progress.tick()

        try:
            try:
                bounded(upload, channel.timeout)
            except ShuttingDown:  # at exit this worker uploads itself: ``finish``'s deadline bounds it
                upload(Progress())
        except TimedOut as exc:
            channel.turn_off(f"an upload made {exc}", timed_out=True)
            return
        except TooLarge as exc:
            # The server's limit on a body (nginx's client_max_body_size: 1 MiB by default): that
            # entry is skipped, and the level stays on for the others (it turned off before).
            self._refused_at = min(self._refused_at or len(data), len(data))
            channel.count(skipped=1)
            channel.too_large(len(data), describe(exc), exc.fix)
            return
        except Exception as exc:
            channel.turn_off(describe(exc))
            return
        channel.count(uploads=1, bytes_written=len(data) + len(sealed),
                    requests=2 if backend.lists else 0)
        listing = channel.listing
        if listing is not None:
            listing[key + ENTRY_SUFFIX] = len(data)

    def _upload_manifest(self, name: str, data: bytes) -> None:
        """At exit: one write, bounded like an upload; a failure is a debug line (and a pack's
        failure drops its manifest: it would name a pack that is not there)."""
        channel = self.channel
        try:
            try:
                bounded(lambda progress: channel.backend.write(name, data), channel.timeout)
            except ShuttingDown:  # at exit: ``finish``'s deadline bounds the worker
                channel.backend.write(name, data)
        except Exception as exc:  # of no use to this run
            logger.debug("the manifest %s is not written: %s", name, describe(exc))
            if name.endswith(PACK_SUFFIX):
                with self._lock:
                    self._queue = deque(item for item in self._queue if not item.manifest)
            return
        channel.count(requests=1 if channel.backend.lists else 0)

    def finish(self, objects: list[tuple[str, bytes]], deadline: float) -> int:
        """At exit: ``objects`` (the manifest and pack) queued after this run's entries, then all of
        them given until ``deadline``; entries to heal are dropped (a later run that misses heals
        them). This run's own entries left over, dropped (0 where the level turned off: ``drop``
        counted them)."""
        with self._lock:
            self._heals.clear()
            if objects and self.channel.off is None:
                self._queue.extend(Item(name, data, None, None, 0.0, heal=False, manifest=True) for name, data in objects)
                self._changed.notify_all()
            self._closed = True
            while self._pending() and self.channel.off is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            flying = self._in_flight
            entries = [item for item in self._queue if not item.manifest]
            own = len(entries) + (flying is not None and not flying.heal and not flying.manifest)
            self._queue.clear()
            if self._dropped:
                return 0
            self._dropped = True
            return own
