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
NOTED = "filter gkx_autocache.AutocacheWarning to hide it"


class AutocacheWarning(UserWarning):
    """Something changed what gkx-autocache gives you: a setting skipped, a directory refused."""


AutocacheWarning.__module__ = "gkx_autocache"

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_said: set[str] = set()
swallowed: list[str] = []  # warnings the user's filters turned into errors: the pytest summary shows them


def warn(cause: str, message: str, silence: str = SILENCE) -> None:
    """Warn once per ``cause`` per process, pointing at the user's line that led to it (the
    ``import jax``, the call that compiled): from a thread of the package's (the shared level's
    reader, an upload), the line the main thread is on; where no thread is on a line of the user's
    (an at-exit hook), the ``import jax`` configuration noted. Never at threading.py, JAX's own
    code or the package's (``gkx_autocache:0``, issue 71).

    ``message`` is one line; it gets the ``gkx-autocache:`` prefix and the way to silence it
    (``silence``: ``NOTED`` where there is nothing to fix, and where the message says its fix
    already: the fix is said once). A warning that the user's filters turn into an exception is
    logged instead.
    """
    if cause in _said:
        return
    _said.add(cause)
    if silence is SILENCE and any(word.strip(":;,.()") == "fix" for word in message.split()):
        silence = NOTED
    text = f"gkx-autocache: {one_line(message)} ({silence})"
    frame = user_frame() or main_thread_frame()
    try:
        if frame is not None:
            found = frame.f_globals  # (no module_globals: a loader's get_source raises for `python -c`)
            warnings.warn_explicit(text, AutocacheWarning, frame.f_code.co_filename, frame.f_lineno,
                                   module=found.get("__name__"), registry=found.setdefault("__warningregistry__", {}))
        else:  # the interpreter's exit: no line of the user's runs, and the import of jax is theirs
            filename, lineno = _import_site[0] if _import_site else (getattr(sys.modules.get("__main__"), "__file__", None) or "<string>", 0)
            warnings.warn_explicit(text, AutocacheWarning, filename, lineno, module="gkx_autocache", registry=_registry)
    except Exception:  # -W error: a cache must not cost the user their run
        swallowed.append(text)
        logger.warning("%s", text)


_import_site: list[tuple[str, int]] = []  # the user's ``import jax`` (file, line), for warnings at exit (as ``_said``)


def note_import_site() -> None:
    """Keep where the user imported jax (configuration runs there): what a warning with no line of
    the user's on any thread points at."""
    frame = user_frame()
    if frame is not None:
        _import_site[:] = [(frame.f_code.co_filename, frame.f_lineno)]


def main_thread_frame() -> types.FrameType | None:
    """From another thread, the user's frame the main thread is on (the call that waits for this
    thread's work); None on the main thread itself, or where it is on no line of the user's."""
    threading = sys.modules.get("threading")  # (a thread of the package's exists: threading is imported)
    if threading is None or threading.current_thread() is threading.main_thread():
        return None
    frame: types.FrameType | None = sys._current_frames().get(threading.main_thread().ident or -1)
    return _first_users(frame)


_registry: dict[str | tuple[str, type[Warning], int], int] = {}  # (the annotation is never evaluated)
_STDLIB = os.path.dirname(os.path.abspath(os.__file__)) + os.sep
# The stdlib's frames between a thread's start, an import or an at-exit hook and the package
_PLUMBING = tuple(_STDLIB + name for name in ("threading.py", "concurrent" + os.sep, "importlib" + os.sep,
                                              "contextlib.py", "functools.py", "asyncio" + os.sep))


def user_frame() -> types.FrameType | None:
    """The first frame outside this package, JAX (jax, jaxlib: the compile path runs through
    them) and the stdlib's plumbing (threading, importlib, ...): the user's; None when there is
    none."""
    return _first_users(sys._getframe(2))


def _first_users(frame: types.FrameType | None) -> types.FrameType | None:
    """``frame`` or the first frame it was called from that is the user's (``user_frame``)."""
    skipped = [_PACKAGE_DIR + os.sep, *_PLUMBING]
    for name in ("jax", "jaxlib"):  # already imported wherever a warning can come from a compile
        where = getattr(sys.modules.get(name), "__file__", None)
        if where:
            skipped.append(os.path.dirname(os.path.abspath(where)) + os.sep)
    prefixes = tuple(skipped)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(prefixes) and not filename.startswith("<frozen"):
            return frame
        frame = frame.f_back
    return None


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
    an environment variable) must not break a warning or an error into several lines, nor a
    server's text (an S3 error's message, a reason phrase) write terminal escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


def printable(text: str) -> str:
    """``text`` of several lines for a terminal: every control character but the newline escaped
    (``\x1b`` shown as ``\x1b``, a right-to-left override as ``\u202e``): what a server, a
    ledger or a file name put in it never drives the user's terminal."""
    return "\n".join(one_line(part) for part in text.split("\n"))


def label() -> str:
    """What this process is, for `explain`'s runs and a shared level's manifests: the script (or
    ``-c``, the module run with ``-m``: ``pytest -q``, not its ``__main__.py``); a pytest-xdist
    worker (``python -c``) is its session's."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return "pytest session (pytest-xdist workers)"
    argv = sys.argv or [""]
    script = os.path.basename(argv[0]) if argv[0] not in ("", "-c") else argv[0] or "python"
    orig = list(getattr(sys, "orig_argv", []))
    if script == "__main__.py" and "-m" in orig[1:]:
        script = orig[orig.index("-m", 1) + 1] if orig.index("-m", 1) + 1 < len(orig) else script
    # Two arguments, and the value of an option that ends them (``pytest -q -p no:cacheprovider``).
    shown = argv[1:3]
    while shown and len(argv) > len(shown) + 1 and shown[-1].startswith("-") and "=" not in shown[-1] \
            and not argv[len(shown) + 1].startswith("-") and len(shown) < 6:
        shown = argv[1:len(shown) + 2]
    text = " ".join([script, *shown])
    return text if len(text) <= 120 else text[:117].rsplit(" ", 1)[0] + " ..."
