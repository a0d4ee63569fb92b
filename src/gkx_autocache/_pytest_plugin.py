"""The pytest plugin (entry point ``pytest11``, name ``gkx_autocache``; ``-p no:gkx_autocache``
turns it off): one line in pytest's terminal summary with the totals of the whole session,
pytest-xdist workers included, instead of one ``report`` line per process.

Loading it costs a session that never imports JAX nothing measurable: it imports neither ``jax``
nor the package's configuration path; it only looks, at the end, for the counts of a process
where JAX was configured (``gkx_autocache._stats`` is then in ``sys.modules``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest  # already imported: pytest is what loads this module

active = False  # set once pytest configured this process: its `report` line gives way to the summary
_workers: list[dict[str, Any]] = []
KEY = "gkx_autocache"


def _snapshot() -> dict[str, Any] | None:
    stats = sys.modules.get("gkx_autocache._stats")
    try:
        return stats.snapshot() if stats is not None else None
    except Exception:
        return None


SESSION_START = "GKX_JAX_CACHE_SESSION_START"  # as gkx_autocache._stats reads it


def pytest_configure(config: Any) -> None:
    """Before any worker starts: the session's start, so that every process of the session counts
    a hit of an entry written since as this run's own compile, whichever worker wrote it."""
    global active
    active = True
    if not hasattr(config, "workerinput"):
        import time

        os.environ.setdefault(SESSION_START, str(time.time()))


def pytest_sessionfinish(session: Any) -> None:
    """In a pytest-xdist worker: hand this process's counts to the controller."""
    output = getattr(session.config, "workeroutput", None)
    snap = _snapshot()
    if output is not None and snap is not None:
        output[KEY] = snap


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown, and fatal, where xdist is not loaded
def pytest_testnodedown(node: Any, error: Any) -> None:
    """In the controller: a worker's counts (only with pytest-xdist, which calls this hook)."""
    snap = getattr(node, "workeroutput", {}).get(KEY)
    if isinstance(snap, dict):
        _workers.append(snap)


def _ci() -> bool:
    """``CI`` set to anything but a false spelling (``CI=false`` is not CI), the spellings that
    turn the package off (``GKX_JAX_CACHE=0``)."""
    from gkx_autocache import _off

    value = os.environ.get("CI", "").strip()
    return bool(value) and not _off(value)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if getattr(terminalreporter.config, "workeroutput", None) is not None:
        return  # a worker: the controller speaks for the session
    own = _snapshot()
    snapshots = [*_workers, *([own] if own is not None else [])]
    if not snapshots:
        return  # JAX was not imported in this session
    from gkx_autocache._stats import merge, summary_line

    total = merge(snapshots)
    terminalreporter.write_line(summary_line(total))
    if _ci() and total["store"] and total["hits"] == total["own_hits"] and total["misses"]:
        terminalreporter.write_line(
            "gkx-autocache: the cache was cold (no entry from an earlier run): keep "
            f"{total['dirs'][0]} between CI runs (actions/cache keyed on `gkx-autocache ci-key`: see the README, In CI)")
