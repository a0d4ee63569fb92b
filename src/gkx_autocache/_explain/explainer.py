"""The explainer of a process: the recorder asks it the cause of each miss, and the index lines of
each entry written (for the ledger, so that later processes can compare). Made at the first miss
or write (``_explain.seam.Watch.explainer``); a hit never imports it."""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any

from gkx_autocache import _causes as causes
from gkx_autocache import _key
from gkx_autocache._diagnostics import logger
from gkx_autocache._explain.classify import classify
from gkx_autocache._explain.facts import HELPER_PLACE, PART_DIGITS, Facts, measure
from gkx_autocache._layout import ENTRY_SUFFIX, function_name
from gkx_autocache._record import index as _index
from gkx_autocache._record import ledger as _ledger
from gkx_autocache._record.index import Evidence

if TYPE_CHECKING:
    from gkx_autocache._record.recorder import Run


class Explainer:
    """Names the cause of each miss in this process (the recorder asks), and gives each written
    entry its index lines (for the ledger, so that later processes can compare)."""

    def __init__(self, version_dir: str, load: Any = None, thread: Any = None) -> None:
        self.version_dir = version_dir
        self._read = load or (lambda: _index.load(version_dir, _ledger.unfolded_lines(version_dir)))
        # The key being computed on each thread, its parts as the seam saw them (_explain_seam.Watch).
        self._thread = thread if thread is not None else threading.local()
        self._evidence: Evidence | None = None  # the directory as seen at this process's first miss
        self._lock = threading.Lock()
        self._written: set[str] = set()  # table lines this process gave the ledger already
        # A table line is given only where the index lacked it: the index read at the first miss or
        # write holds it, and is still the file there (a compaction or `clear` may have dropped it).
        self._own: set[str] = set()  # table lines this process added to its evidence, the index lacking them
        self._read_as: tuple[int, int, int, str] | None = None  # the index's identity when read (_index.identity)
        self._trusted = True  # the index read is still the file there

    # -- the recorder's questions -------------------------------------------------------------------

    def cause(self, key: str, run: Run) -> dict[str, Any]:
        """``{"cause": ..., "detail": ...}`` for a miss of ``key`` in ``run``; never raises."""
        try:
            facts = self._facts(key)
            if facts is None:
                return {"cause": causes.UNEXPLAINED, "detail": "its key was not computed on this thread"}
            before = self._before_cpu_keying(key)
            with self._lock:
                evidence = self._load()
                if before is not None and not _known(key, evidence):
                    return before  # not when this very key was written since, and removed
                found = classify(key, facts, evidence, run.id)
            if facts.place == HELPER_PLACE:
                found["helper"] = True  # grouped after the user's functions
            if facts.rerun:
                found["rerun"] = facts.rerun  # "misses on every run": only where nothing changed between runs
            return found
        except Exception as exc:  # an explanation must never cost a compile
            logger.debug("miss of %s not explained: %s", key, exc)
            return {"cause": causes.UNEXPLAINED, "detail": f"{type(exc).__name__}: {exc}"[:200]}

    def _before_cpu_keying(self, key: str) -> dict[str, Any] | None:
        """The migration (SPEC §15): the entry stock JAX, or the package before it keyed CPU entries
        by ISA, wrote for exactly this compile is here, under the key without the ISA."""
        pending = self._thread
        before_hook, text = getattr(pending, "before_hook", None), getattr(pending, "hook", None)
        if before_hook is None or text is None or _key.isa_of(text) is None:
            return None
        legacy = before_hook.copy()
        legacy.update(text[:text.rfind(_key.ISA_MARK)].encode())
        name = f"{function_name(key)}-{legacy.hexdigest()}"
        if not os.path.lexists(os.path.join(self.version_dir, name + ENTRY_SUFFIX)):
            return None
        return {"cause": causes.BEFORE_CPU_KEYING,
                "detail": "its entry was written by stock JAX or before gkx-autocache keyed CPU entries by the "
                          "CPU's instruction set: compiled once more under the new key"}

    def ingredients(self, key: str, run: Run) -> dict[str, Any]:
        """What a written entry's ledger record carries: its index lines (a table line only where the
        index lacks it, and once a ledger); and the entry joins this process's evidence at once."""
        try:
            facts = self._facts(key)
            if facts is None:
                return {}
            name, hex_ = _index.split_key(key)
            lines = _index.lines_for(name, hex_, time.time(), run.id, facts.parts, facts.readable,
                                     facts.signature, facts.place, facts.config)
            with self._lock:
                evidence = self._load()
                indexed = self._still_read()
                tables = [ln for ln in lines if not ln.startswith("E\t")]
                self._own.update(ln for ln in tables if not evidence.holds(ln))
                fresh = [ln for ln in lines if ln.startswith("E\t")
                         or (ln not in self._written and (ln in self._own or not indexed))]
                self._written.update(ln for ln in fresh if not ln.startswith("E\t"))
                evidence.add(lines)
                evidence.wrote(name, hex_)
            return {"rec": "\n".join(fresh), **({"helper": True} if facts.place == HELPER_PLACE else {})}
        except Exception as exc:
            logger.debug("ingredients of %s not kept: %s", key, exc)
            return {}

    def after_fork(self) -> None:
        """A lock another thread of the parent held at the fork stays held in the child."""
        self._lock = threading.Lock()

    def forget_given(self) -> None:
        """This process begins another ledger (or, forked, its own): give the tables again."""
        with self._lock:
            self._written = set()

    def _facts(self, key: str) -> Facts | None:
        pending = self._thread
        final = getattr(pending, "final", None)
        if final is None and getattr(pending, "parts", None):  # no part named as the last of PARTS
            final = pending.final = pending.key_hash.digest().hex()
        if final is None or not key.endswith(final):
            return None
        if pending.facts is None:
            if not pending.parts:
                return None
            pending.facts = measure(pending.parts, pending.computation.hex()[:PART_DIGITS], getattr(pending, "hook", None),
                                    function_name(key), getattr(pending, "package", None))
            pending.parts = None  # what the put needs is measured: the functions can go
        facts: Facts = pending.facts
        return facts

    def _still_read(self) -> bool:
        """Whether the index this process read is still the file there, only appended to since (one
        ``stat``, at a write); once not, this process gives every table line again, once a ledger."""
        if self._trusted and self._read_as is not None:
            now = _index.identity(self.version_dir)
            self._trusted = (now is not None and now[:2] == self._read_as[:2] and now[2] >= self._read_as[2]
                             and now[3] == self._read_as[3])
            if self._trusted and now is not None:
                self._read_as = now
        return self._trusted

    def _load(self) -> Evidence:
        if self._evidence is None:
            started = time.perf_counter()
            self._read_as = _index.identity(self.version_dir)  # before reading: a file replaced meanwhile is not trusted
            self._evidence = self._read()
            logger.debug("index of %s read in %.1f ms", self.version_dir, (time.perf_counter() - started) * 1e3)
        return self._evidence


def _known(key: str, evidence: Evidence) -> bool:
    """Whether the directory has a record of this very key, or of its removal."""
    name, hex_ = _index.split_key(key)
    return (name, hex_) in evidence.removed or any(r.hex == hex_ for r in evidence.records(name))


