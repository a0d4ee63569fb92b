"""How the package talks to people: one warning line per cause (never an exception, even under
``-W error``), the ``gkx_autocache`` logger, and the human forms of sizes and durations."""

from __future__ import annotations

import logging
import os
import sys
import types
import warnings

logger = logging.getLogger("gkx_autocache")

SILENCE = "fix it, or filter gkx_autocache.AutocacheWarning to hide it"


class AutocacheWarning(UserWarning):
    """Something changed what gkx-autocache gives you: a setting skipped, a directory refused."""


AutocacheWarning.__module__ = "gkx_autocache"

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_said: set[str] = set()
swallowed: list[str] = []  # warnings the user's filters turned into errors: the pytest summary shows them


def warn(cause: str, message: str) -> None:
    """Warn once per ``cause`` per process, pointing at the user's ``import jax`` line.

    ``message`` is one line; it gets the ``gkx-autocache:`` prefix and the way to silence it.
    A warning that the user's filters turn into an exception is logged instead.
    """
    if cause in _said:
        return
    _said.add(cause)
    text = f"gkx-autocache: {one_line(message)} ({SILENCE})"
    try:
        warnings.warn(text, AutocacheWarning, stacklevel=_user_stacklevel())
    except Exception:  # -W error: a cache must not cost the user their run
        swallowed.append(text)
        logger.warning("%s", text)


def _user_stacklevel() -> int:
    """The stacklevel of the first frame outside this package, as ``warnings`` counts it
    (it skips importlib's own frames)."""
    level = 2  # 1 is warn() itself
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if "importlib" in filename and "_bootstrap" in filename:
            frame = frame.f_back
            continue
        if not filename.startswith(_PACKAGE_DIR):
            return level
        level += 1
        frame = frame.f_back
    return 1


def human_bytes(n: float) -> str:
    """``1536 -> "1.5 KiB"``: the one byte formatter of every message and command."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def plural(n: int, one: str, many: str | None = None) -> str:
    """``1 hit``, ``2 hits``, ``0 misses``: counts that agree in number."""
    return f"{n} {one if n == 1 else many or one + 's'}"


def human_secs(secs: float) -> str:
    return f"{secs:.1f} s" if secs < 120 else f"{secs / 60:.1f} min"


def shown(raw: object) -> str:
    """``raw`` for a one-line message: its repr (which escapes newlines), cut short (a 400-digit
    number, a whole file)."""
    text = repr(raw)
    return text if len(text) <= 60 else f"{text[:45]}... ({len(text)} characters)"


def one_line(message: str) -> str:
    """``message`` with its control characters escaped: a path or value from outside (a newline in
    an environment variable) must not break a warning or an error into several lines."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)
