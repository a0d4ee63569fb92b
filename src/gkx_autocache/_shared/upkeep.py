"""``prune --shared`` and ``clear --shared`` (SPEC §14): the shared level's objects listed, grouped
into entries with their sidecars, chosen, and removed through the backend a run uses (its client,
credentials and proxies: ``names``, ``remove``), each call bounded by ``shared_timeout`` as a
run's. Entries and sidecars only (and a directory's temporary files): never a manifest or a pack.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from gkx_autocache._backends.port import Failure
from gkx_autocache._entries import STALE_TMP_SECS, Removal, Unit, select_over
from gkx_autocache._layout import ENTRY_SUFFIX, is_temporary, key_match
from gkx_autocache._shared.calls import bounded, describe

# Removals in flight on an object store (one round trip each, kept-alive connections); a directory's
# are unlinks, one at a time.
WORKERS = 8


class Failed(Exception):
    """The shared level did not answer as asked: one line for the user."""


def plan(backend: Any, timeout: float, cap: int = 0, older_than: float | None = None,
         everything: bool = False) -> Removal:
    """What to remove: ``everything`` (``clear``), or the entries unused for ``older_than`` seconds,
    then the least recently written until the rest fits in ``cap`` bytes, and temporary files over
    an hour old. Raises Failed."""
    try:
        listed = bounded(backend.names, timeout)
    except Exception as exc:
        raise Failed(said(exc)) from None
    units: dict[str, Unit] = {}
    temporary: list[tuple[str, int, float]] = []
    for name, size, written in listed:
        match = key_match(name)
        if match is None:
            if is_temporary(name):
                temporary.append((name, size, written))
            continue
        key, suffix = match
        unit = units.get(key)
        if unit is None:
            unit = units[key] = Unit(key)
        unit.files.append(name)
        unit.bytes += size
        if suffix == ENTRY_SUFFIX:
            unit.has_entry = True
            unit.last_used = max(unit.last_used, written)
    now = time.time()
    chosen: list[Unit] = []
    rest: list[Unit] = []
    if everything:
        chosen = list(units.values())
    else:
        for unit in units.values():
            (chosen if older_than is not None and unit.last_used < now - older_than else rest).append(unit)
        if cap:
            chosen += select_over(rest, cap)
        temporary = [t for t in temporary if now - t[2] > STALE_TMP_SECS]
    secs = sum(backend.compile_secs(u.key) or 0.0 for u in chosen) if not backend.lists else 0.0
    return Removal(backend.where, chosen, temporary, secs)


def execute(backend: Any, removal: Removal, timeout: float,
            progress: Callable[[int, int], None] | None = None) -> int:
    """Remove what ``removal`` names, each object one bounded call (``WORKERS`` at a time on an object
    store), ``progress(done, total)`` as they finish; how many. The first failure stops it: Failed,
    saying how many were removed."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    names = removal.files
    done, failure = 0, None
    with ThreadPoolExecutor(WORKERS if backend.lists else 1, thread_name_prefix="gkx-autocache-remove") as pool:
        futures = [pool.submit(bounded, functools.partial(_remove, backend, name), timeout) for name in names]
        for future in as_completed(futures):
            if future.cancelled():
                continue
            if (exc := future.exception()) is None:
                done += 1
                if progress is not None:
                    progress(done, len(names))
            elif failure is None:
                failure = exc
                for other in futures:
                    other.cancel()
    if failure is not None:
        raise Failed(f"removed {done} of {len(names)} files from {removal.version_dir}; {said(failure)}")
    return done


def _remove(backend: Any, name: str, progress: Any) -> None:
    backend.remove(name)


def said(exc: BaseException) -> str:
    """A backend's typed failure says itself; anything else (a stall, a client's error) is described."""
    return str(exc) if isinstance(exc, Failure) and not isinstance(exc, OSError) else describe(exc)
