"""The Python API (SPEC §10): what ``gkx-autocache --json stats``, ``explain`` and ``status`` print,
as dicts, for a notebook or a pytest fixture, without a subprocess. In a process where JAX was
configured, its own counts are written to its ledger first (the tally of what repeated, and a miss
still waiting for its compile's fate), so that they are in what is read back.

Reached through ``gkx_autocache.stats()`` and the others, which import this module when first
called: nothing of it is imported at start-up or on ``import jax``.
"""

from __future__ import annotations

import sys
from typing import Any

from gkx_autocache import _context, _status
from gkx_autocache._context import JSON_VERSION
from gkx_autocache._explain import report as _report
from gkx_autocache._record import show as _show


class AutocacheError(Exception):
    """A call of the API failed: ``error`` is the JSON object the command would print (``version``,
    ``command``, ``error``, ``exit``)."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error["error"])
        self.error = error


AutocacheError.__module__ = "gkx_autocache"


def _call(command: str, build: Any) -> dict[str, Any]:
    try:
        data = build()
    except (_context.NoDirectory, OSError, ValueError) as exc:
        from gkx_autocache._diagnostics import one_line

        raise AutocacheError({"version": JSON_VERSION, "command": command, "error": one_line(str(exc)),
                              "exit": 1}) from None
    return {"version": JSON_VERSION, "command": command, **data}


def _directory() -> str:
    """The directory this process's JAX uses, where the package configured it; else the one a
    process of this environment would use."""
    recorder = _recorder()
    if recorder is not None and recorder.store_serving:
        recorder.flush()
        return str(recorder.directory)
    return _context.load_context().version_dir


def _recorder() -> Any:
    """This process's recorder, where the package configured its JAX (``_process``), else None."""
    process = sys.modules.get("gkx_autocache._process")
    current = getattr(process, "current", None)
    return None if current is None else current.recorder


def stats() -> dict[str, Any]:
    """``gkx-autocache --json stats``: under ``"stats"``, the directory's totals since the last reset
    (every process's, this one's included); and under ``"process"``, this process's own (None where
    the package did not configure JAX here: JAX not imported yet, or the cache off)."""

    def build() -> dict[str, Any]:
        vdir = _directory()
        data = _show.stats_data(vdir)
        data["size"] = _show.cache_size(vdir, _context.load_context().settings["max_size"])
        recorder = _recorder()
        if recorder is not None and recorder.store_serving:
            data["process"] = _show.totals_dict(recorder.totals)
        else:
            data["process"] = None
        return data

    return _call("stats", build)


def explain(since: float | str | None = None, function: str | None = None) -> dict[str, Any]:
    """``gkx-autocache --json explain``: the last run and the misses, grouped by cause. ``since``:
    seconds, or an age like ``"30m"``; ``function``: ``"step"`` or ``"jit_step"``."""

    def build() -> dict[str, Any]:
        from gkx_autocache import _settings

        seconds = _settings.parse_age(since) if isinstance(since, str) else since
        vdir = _directory()
        ctx = _context.load_context()
        return {"dir": vdir, **_report.explain(ctx, since=seconds, function=function, version_dir=vdir)}

    return _call("explain", build)


def status() -> dict[str, Any]:
    """``gkx-autocache --json status``: versions, hook, settings with origins, the directory, the
    store, the totals and what needs attention."""
    if (recorder := _recorder()) is not None:
        recorder.flush()
    return _call("status", lambda: _status.gather(_context.load_context()))
