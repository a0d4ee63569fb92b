"""What a forked child resets, in one place: each object that holds a process's own state (a
ledger's descriptor, threads, connections, counts) registers what its child must do, and one
``os.register_at_fork`` hook runs them in the order they were registered. A handler that fails
costs the child nothing (it is logged, and the next runs).
"""

from __future__ import annotations

import os
from collections.abc import Callable

_handlers: list[Callable[[], None]] = []


def in_child(handler: Callable[[], None]) -> None:
    """Run ``handler`` in every child this process forks from now on (nothing where ``os.fork``
    does not exist)."""
    if not _handlers and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_run)
    _handlers.append(handler)


def _run() -> None:
    for handler in list(_handlers):
        try:
            handler()
        except Exception as exc:  # a fork handler's error would be printed by Python, not raised
            from gkx_autocache._diagnostics import logger

            logger.debug("after fork: %s failed: %s", getattr(handler, "__qualname__", handler), exc)
