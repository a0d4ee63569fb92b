"""Rebuild ahead (SPEC §18): at a process's first miss, where its program meets a cold start that
is not a code change (its records were all made in another context: another JAX version, other
XLA flags, another CPU or ``cpu_target``), the program's entries are rebuilt in this process's
threads while it traces; a lookup of a key being rebuilt waits for its entry instead of compiling
it again. Nothing happens on a run that only hits. Why it is on by default: docs/benchmarks.md.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable
from typing import Any

from gkx_autocache import _fork
from gkx_autocache._diagnostics import logger

EXIT_WAIT = 30.0  # at exit, the most waited for the rest of a rebuild (a compile running: to its end)


class Inflight:
    """The keys a rebuild in this process is compiling (``claim``, ``done``): a lookup of one waits
    for it, bounded by twice the compile time recorded for it, at least ``timeout`` seconds. A key
    looked up before the rebuild reached it is the lookup's to compile: the rebuild skips it. Where
    the program's last ``WINDOW`` misses are none of the keys the rebuild computed (``known``), its
    code changed too, and the rebuild is ``futile``: it stops."""

    WINDOW = 8

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._lock = threading.Lock()
        self._compiling: dict[str, tuple[threading.Event, float]] = {}
        self._looked: set[str] = set()
        self._recent: collections.deque[str] = collections.deque(maxlen=self.WINDOW)
        self._known: set[str] = set()
        self._keyed = False
        self._active = False
        _fork.in_child(self._forked)

    def _forked(self) -> None:  # the rebuild's threads are the parent's: nothing is being compiled here
        self._lock = threading.Lock()
        self._compiling, self._looked, self._active = {}, set(), False
        self._recent, self._known, self._keyed = collections.deque(maxlen=self.WINDOW), set(), False

    def begin(self) -> None:
        with self._lock:
            self._active = True

    def end(self) -> None:
        with self._lock:
            self._active = False
            self._looked, self._known, self._keyed = set(), set(), False
            self._recent.clear()
            for event, _ in self._compiling.values():
                event.set()
            self._compiling = {}

    def known(self, key: str) -> None:
        with self._lock:
            self._known.add(key)

    def keyed(self) -> None:
        with self._lock:
            self._keyed = True

    def futile(self) -> bool:
        with self._lock:
            recent = list(self._recent)
            return self._keyed and len(recent) == self.WINDOW and not any(k in self._known for k in recent)

    def claim(self, key: str, compile_secs: float) -> bool:
        with self._lock:
            if key in self._looked or key in self._compiling:
                return False
            self._compiling[key] = (threading.Event(), compile_secs)
            return True

    def done(self, key: str) -> None:
        with self._lock:
            found = self._compiling.pop(key, None)
        if found is not None:
            found[0].set()

    def wait(self, key: str) -> bool:
        """Whether a rebuild here compiled ``key`` while this lookup waited (look again)."""
        if not self._active:
            return False
        with self._lock:
            found = self._compiling.get(key)
            if found is None:
                self._looked.add(key)
                self._recent.append(key)
                return False
        event, secs = found
        return event.wait(max(2.0 * secs + 1.0, self._timeout))


class Ahead:
    """At the first miss of this process (``missed``), in a thread of its own: whether its program
    (``program()``, ``_rebuild.keeper.Program``) has records of ``version_dir`` or of the newest
    older version's directory, none made in its context (less the keys this process noted itself:
    ``noted()``); then their rebuild, ``jobs`` threads, under ``cap`` (0: none), signed records only
    where ``secret`` is set; ``enabled``: the ``rebuild_ahead`` setting (off: never)."""

    def __init__(self, version_dir: str, team: bool, secret: bytes | None, program: Callable[[], Any],
                 noted: Callable[[], set[str]], cap: int, jobs: int, timeout: float, enabled: bool) -> None:
        self.version_dir = version_dir
        self.inflight = Inflight(timeout)
        self._team = team
        self._secret = secret
        self._program = program
        self._noted = noted
        self._cap = cap
        self._jobs = jobs
        self._enabled = enabled
        self._lock = threading.Lock()
        self._started = False
        self._finished = False  # the program ended: no rebuild starts
        self._thread: threading.Thread | None = None
        self._rebuild: Any = None
        self._locked: tuple[int, int, int] | None = None  # the rebuild lock held: its descriptor, device, inode
        self.outcome: Any = None  # what the rebuild came to, once it ran
        _fork.in_child(self._forked)

    def _forked(self) -> None:
        self._lock = threading.Lock()
        self._started, self._thread, self._rebuild = False, None, None
        # An flock is its open file's: the child's copy of the descriptor would hold the rebuild lock
        # for the child's whole life (a worker pool), long after the parent's rebuild ended.
        locked, self._locked = self._locked, None
        if locked is not None:
            fd, device, inode = locked
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) == (device, inode):
                    os.close(fd)
            except OSError:
                pass

    def missed(self, key: str) -> bool:
        """A lookup missed ``key``: at the first, the check starts (in a thread); whether a rebuild
        here compiled the key meanwhile (look again)."""
        if not self._started and self._enabled:
            with self._lock:
                start, self._started = not self._started, True
            if start:
                self.inflight.begin()  # the lookups from now on are the program's own (the rebuild skips them)
                self._thread = threading.Thread(target=self._run, name="gkx-autocache rebuild ahead", daemon=True)
                self._thread.start()
        return self.inflight.wait(key)

    def _run(self) -> None:
        try:
            self._ahead()
        except Exception as exc:  # never the program's problem
            logger.debug("rebuild ahead: %s", exc)
        finally:
            self.inflight.end()

    def _ahead(self) -> None:
        from gkx_autocache._rebuild import engine, keeper

        program = self._program()
        mine = self._noted()
        here = [(context, key) for context, key in keeper.listed(self.version_dir, program.ident, self._team)
                if key not in mine]
        if any(context == program.context for context, _ in here):
            logger.debug("rebuild ahead: %s has records of this context here: a code change, nothing ahead", program.label)
            return
        keys = {self.version_dir: {key for _, key in here}}
        older = engine.older_dir(self.version_dir)
        if older is not None:
            keys[older] = {key for _, key in keeper.listed(older, program.ident, self._team)}
        if not any(keys.values()):
            return
        fd, holder = engine.take_lock(self.version_dir, self._team)
        if fd is None:
            logger.debug("rebuild ahead: %s rebuilds %s already", holder, self.version_dir)
            return
        if fd >= 0:
            st = os.fstat(fd)
            self._locked = (fd, st.st_dev, st.st_ino)
        try:
            self._rebuild_from(keys)
        finally:
            if fd >= 0:
                self._locked = None
                os.close(fd)

    def _rebuild_from(self, keys: dict[str, set[str]]) -> None:
        from gkx_autocache import _entries, _store
        from gkx_autocache._jax import rebuild as jax_rebuild
        from gkx_autocache._rebuild import engine

        store = _store.current()
        if store is None or os.path.realpath(store.path) != os.path.realpath(self.version_dir):
            return
        rebuilder = jax_rebuild.Rebuilder()
        if rebuilder.problem is not None:
            logger.debug("rebuild ahead: %s", rebuilder.problem)
            return
        gathered = engine.gather(keys, self._secret, keys=keys)
        if not gathered.found:
            return
        used = _entries.count(self.version_dir)[1] if self._cap else 0
        rebuild = engine.Rebuild(store, rebuilder, self._jobs, self.inflight, self._cap, used)
        with self._lock:
            if self._finished:  # (the program ended while the records were read)
                return
            self._rebuild = rebuild
        self.outcome = rebuild.run(gathered.found)
        out = self.outcome
        logger.info("rebuild ahead of %d records: %d rebuilt, %d already there, %d compiled by the program, %d failed "
                    "in %.2f s%s", len(gathered.found), out.rebuilt, out.present, out.taken, sum(out.failed.values()),
                    out.seconds, "; stopped: the program's compiles are none of the records' (its code changed)"
                    if out.stopped == "futile" else f"; stopped: {out.stopped}" if out.stopped else "")

    def finish(self) -> None:
        """At exit: no more records taken; the compiles running are waited for to their end, and
        the rest of the rebuild at most ``EXIT_WAIT``."""
        with self._lock:
            self._finished = True
            rebuild, thread = self._rebuild, self._thread
        if rebuild is not None:
            rebuild.stop("the program ended")
        if thread is None:
            return
        thread.join(EXIT_WAIT)
        # A compile cannot be interrupted, and a thread that comes back from XLA once the interpreter
        # finalizes aborts the process ("terminate called ... FATAL: exception not rethrown", exit 134).
        while thread.is_alive() and rebuild is not None and rebuild.compiling:
            thread.join(0.05)
