"""A cache directory someone else gives JAX after ``import jax`` (SPEC §5, §7, amended 2026-12-04):
a framework's ``jax.config.update("jax_compilation_cache_dir", ...)`` or ``set_cache_dir`` (MaxText,
vLLM's TPU backend, AlphaFold 3's flag, many a training script). JAX reads the setting once, at its
first compile after it changed; where the directory is local and may be trusted (SPEC §8), the
package's store serves it then, as it is: no version folder, no tag in a directory that already
existed, so stock JAX reads it as before. The recorder, the explanations and the report line move
there with it, and the directory the package chose keeps a pointer to it (``POINTER_FILE``), so
that ``gkx-autocache explain`` finds the run. Who set it is the file and line of the call.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

from gkx_autocache._diagnostics import logger, user_frame
from gkx_autocache._layout import META_DIR

OPTION = "jax_compilation_cache_dir"
POINTER_FILE = "moved.json"  # in the package's own directory's bookkeeping: where JAX's directory went
_who: dict[str, str] = {}  # a directory, canonical -> who set it ("train.py:42")


def watch(config: Any, on_set: Callable[[str], None] | None = None) -> None:
    """Note who sets ``jax_compilation_cache_dir`` from now on: ``config.update`` wrapped on the
    instance, once (``set_cache_dir`` calls it too); ``on_set(path)`` is told of each new value,
    once JAX has it."""
    original = config.update
    if getattr(original, "__gkx_watch__", False):
        return

    def update(name: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        if name == OPTION and isinstance(value, str) and value:
            try:  # as written (a relative name is resolved when JAX reads it), and as it is now
                _who[value] = _who[os.path.realpath(value)] = caller()
            except Exception:  # never in the way of the user's setting
                pass
        done = original(name, value, *args, **kwargs)
        if name == OPTION and isinstance(value, str) and value and on_set is not None:
            try:
                on_set(value)
            except Exception as exc:  # never in the way of the user's setting
                logger.debug("%s=%r not judged: %s", OPTION, value, exc)
        return done

    update.__gkx_watch__ = True  # type: ignore[attr-defined]

    update.__wrapped__ = original  # type: ignore[attr-defined]
    from gkx_autocache._jax import runtime as jax_runtime

    unwatched = jax_runtime.replace_config_update(config, update)
    if unwatched is not None:  # a JAX whose config takes no attribute: the directory is still served, its setter unnamed
        logger.debug("who sets %s is not known on this JAX: %s", OPTION, unwatched)


def caller() -> str:
    """The user's line that made the call (the framework's, where a framework made it)."""
    frame = user_frame()
    if frame is None:
        return "an unknown caller"
    path = frame.f_code.co_filename
    shown = os.path.relpath(path) if os.path.isabs(path) and path.startswith(os.getcwd() + os.sep) else path
    return f"{shown}:{frame.f_lineno}"


def who(path: str, env_value: str | None) -> str:
    """Who set ``path``: the call's line, else the variable JAX read it from at import."""
    found = _who.get(path) or _who.get(os.path.realpath(path))
    if found is not None:
        return found
    if env_value and os.path.realpath(env_value) == os.path.realpath(path):
        return "env JAX_COMPILATION_CACHE_DIR"
    return "jax.config"


def point(version_dir: str, moved_to: str, by: str) -> None:
    """Leave in the package's directory where JAX's went, and who moved it (for ``explain``)."""
    from gkx_autocache import _files

    folder = _files.bookkeeping_dir(version_dir, False)
    if folder is None:
        return
    text = json.dumps({"dir": moved_to, "by": by, "t": round(time.time(), 3)}).encode()
    if not _files.write_atomic(os.path.join(folder, POINTER_FILE), text, 0o600):
        logger.debug("no pointer to %s left in %s", moved_to, version_dir)


def moved_since(version_dir: str) -> dict[str, Any] | None:
    """Where JAX's directory went from ``version_dir`` (``point``), where no run has used
    ``version_dir`` itself since; else None. For the commands: ``explain`` and ``status`` follow it."""
    from gkx_autocache import _trust
    from gkx_autocache._record import show as _show

    moved = pointer(version_dir)  # its directory is judged as any cache directory: it is read and shown
    if moved is None or not os.path.isdir(moved["dir"]) or _trust.directory_problem(moved["dir"]) is not None:
        return None
    if moved["t"] > time.time() + 60:  # from the future: it would be followed for good
        return None
    last = next(reversed(_show.Reading(version_dir).runs().values()), None)
    return moved if last is None or last["end"] < moved["t"] else None


def pointer(version_dir: str) -> dict[str, Any] | None:
    """Where JAX's directory went from ``version_dir``, as ``point`` left it, or None."""
    from gkx_autocache import _files

    data = _files.read(os.path.join(version_dir, META_DIR, POINTER_FILE), 8192)
    try:
        found = json.loads(data) if data else None
    except ValueError:
        return None
    if not isinstance(found, dict) or not isinstance(found.get("dir"), str) or not isinstance(found.get("t"), (int, float)):
        return None
    by = "".join(c if c.isprintable() else "?" for c in str(found.get("by", "?")))[:200]  # shown as it is
    return {"dir": found["dir"], "by": by, "t": float(found["t"])}
