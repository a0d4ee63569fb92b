"""The pytest plugin (entry point ``pytest11``, name ``gkx_autocache``; ``-p no:gkx_autocache``
turns it off): one line in pytest's terminal summary with the totals of the whole session,
pytest-xdist workers included, instead of one ``report`` line per process.

Loading it costs a session that never imports JAX nothing measurable: it imports neither ``jax``
nor the package's configuration path; it only looks, at the end, for the counts of a process
where JAX was configured (``gkx_autocache._process`` is then in ``sys.modules``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest  # already imported: pytest is what loads this module

_sessions: list[Any] = []  # the configs of this process's sessions, outermost first (pytester nests them)
_counted: list[dict[str, Any]] = []  # this process's parts that a session's line counted (or a worker sent)
KEY = "gkx_autocache"
RUN = "GKX_JAX_CACHE_RUN"  # "<start>-<pid>", as gkx_autocache._record.recorder reads it: a session is one run


class _Session:
    """One session's part: its workers' counts, and this process's counts when it began (a process
    may run several sessions: pytest.main() in a loop, ipytest in a notebook)."""

    def __init__(self, set_start: bool, previous: str | None) -> None:
        self.workers: list[dict[str, Any]] = []
        self.said: list[str] = []  # workers' warnings that their filters turned into errors
        self.before = _snapshot()
        self.set_start = set_start
        self.previous = previous  # the run this process was in before the session (put back after it)


def _snapshot() -> dict[str, Any] | None:
    # pytester's in-process runs take the modules they imported out of sys.modules afterwards; the
    # package keeps its own reference to the submodule.
    process = sys.modules.get("gkx_autocache._process") or getattr(sys.modules.get("gkx_autocache"), "_process", None)
    try:
        return process.snapshot() if process is not None else None
    except Exception:
        return None


def _swallowed() -> list[str]:
    """This process's warnings that the user's filters (``filterwarnings = error``) turned into
    errors, which the package logged instead: without this, a cache refused in CI goes unseen."""
    return list(getattr(sys.modules.get("gkx_autocache._diagnostics"), "swallowed", []))


def uncounted(now: dict[str, Any]) -> dict[str, Any] | None:
    """What of this process's counts ``now`` no session's line counted, for its `report` line at
    exit (None: nothing, once a session spoke for this process)."""
    if not _counted:
        return now
    from gkx_autocache._record.show import merge, since

    rest = since(now, merge(_counted))
    return rest if rest["hits"] or rest["misses"] or rest["not_cached"] else None


def pytest_configure(config: Any) -> None:
    """Before any worker starts: the session is one run (SPEC §13.1), so that every process of the
    session counts a hit of an entry written since as this run's own compile, whichever worker
    wrote it, and `explain` shows the session as its last run."""
    if config.pluginmanager.is_blocked("terminal"):
        return  # -p no:terminal: no summary to speak in, so each process keeps its `report` line
    previous = os.environ.get(RUN)
    # A run begun by a parent process (this session is one of its processes) goes on; one this
    # process began itself (it imported jax before pytest.main()) gives way to the session's.
    set_start = not hasattr(config, "workerinput") and (previous is None or _began_here(previous))
    if set_start:
        import time

        now = time.time()
        os.environ[RUN] = f"{now:.3f}-{os.getpid()}"
        current = getattr(sys.modules.get("gkx_autocache._process"), "current", None)
        if current is not None:  # JAX configured in an earlier session of this process: its run is not this one
            recording = sys.modules["gkx_autocache._record.recorder"]
            current.recorder.begin(recording.Run(os.environ[RUN], now))
    config._gkx_autocache = _Session(set_start, previous)
    _sessions.append(config)


def _began_here(run: str) -> bool:
    return run.rpartition("-")[2] == str(os.getpid())


@pytest.hookimpl(tryfirst=True)  # before another plugin's unconfigure, which may raise
def pytest_unconfigure(config: Any) -> None:
    session = getattr(config, "_gkx_autocache", None)
    if session is None:
        return
    if config in _sessions:
        _sessions.remove(config)
    if session.set_start:  # the next session in this process (pytest.main() again) starts anew
        if session.previous is None:
            os.environ.pop(RUN, None)
        else:
            os.environ[RUN] = session.previous


def pytest_sessionfinish(session: Any) -> None:
    """In a pytest-xdist worker: hand this process's counts to the controller."""
    output = getattr(session.config, "workeroutput", None)
    if output is None or getattr(session.config, "_gkx_autocache", None) is None:
        return  # not a worker, or one whose summary is off (-p no:terminal): it keeps its `report` line
    snap = _own(session.config)
    if snap is not None:
        output[KEY] = snap
        _counted.append(snap)
    output[KEY + ":said"] = _swallowed()


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown, and fatal, where xdist is not loaded
def pytest_testnodedown(node: Any, error: Any) -> None:
    """In the controller: a worker's counts (only with pytest-xdist, which calls this hook)."""
    output = getattr(node, "workeroutput", {})
    session = getattr(getattr(node, "config", None), "_gkx_autocache", None)
    if session is None:
        return
    if isinstance(output.get(KEY), dict):
        session.workers.append(output[KEY])
    said = output.get(KEY + ":said")
    session.said.extend(text for text in said if isinstance(text, str)) if isinstance(said, list) else None


def _own(config: Any) -> dict[str, Any] | None:
    """This process's counts since ``config``'s session began."""
    from_session = getattr(config, "_gkx_autocache", None)
    now = _snapshot()
    if now is None or from_session is None or from_session.before is None:
        return now
    from gkx_autocache._record.show import since

    return since(now, from_session.before)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    config = terminalreporter.config
    session = getattr(config, "_gkx_autocache", None)
    if getattr(config, "workeroutput", None) is not None or session is None:
        return  # a worker: the controller speaks for the session
    if _sessions and _sessions[0] is not config:
        return  # a session inside another (pytester): the process's counts are the outer one's
    for text in dict.fromkeys([*session.said, *_swallowed()]):  # each once, in order
        terminalreporter.write_line(text)
    own = _own(config)
    if own is not None:
        _counted.append(own)  # this session speaks for this process's part (no `report` line for it)
    snapshots = [*session.workers, *([own] if own is not None else [])]
    if not snapshots:
        return  # JAX was not imported in this session, or not configured
    from gkx_autocache._record.show import merge, summary_line

    total = merge(snapshots)
    if not (total["hits"] or total["misses"] or total["not_cached"]):
        return  # nothing compiled (pytest --collect-only): no line
    terminalreporter.write_line(summary_line(total))
    from gkx_autocache._settings import is_ci

    if is_ci() and total["store"] and total["hits"] == total["own_hits"] and total["misses"]:
        terminalreporter.write_line(
            "gkx-autocache: the cache was cold (no entry from an earlier run): keep "
            f"{total['dirs'][0]} between CI runs (actions/cache keyed on `gkx-autocache ci-key`: see the README, In CI)")
