"""Settings into a shared level (SPEC §14): whether ``shared`` can be used with this local level,
the storage that speaks to it (``_backends/choose``, from the table of schemes), whether this
process uploads, and the hook that finishes its uploads at exit. Builds objects only; ``status``
reads the same answers (``probe``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from gkx_autocache._backends.choose import backend_for, missing
from gkx_autocache._layout import is_url
from gkx_autocache._settings import no_uploads
from gkx_autocache._shared.level import MAX_ENTRY, Level
from gkx_autocache._shared.local import LocalPort


def same_place(shared: str, local_root: str | None) -> bool:
    return local_root is not None and not is_url(shared) and os.path.realpath(shared) == os.path.realpath(local_root)


def problem(settings: Any, location: Any) -> str | None:
    """Why the ``shared`` setting cannot be used with this local level, or None."""

    shared = settings["shared"]
    if location.remote:
        return ("dir is itself a bucket (JAX's stock cache serves it, uncapped); set dir to a local directory to "
                "keep a local level in front of the bucket")
    if location.users_own:
        return "JAX's own setting chose the directory (JAX's stock cache serves it)"
    if location.stock:
        return "on Windows JAX's own cache serves the directory, and levels need gkx-autocache's store (POSIX-only)"
    if same_place(shared, location.root):
        return "it is the same directory as dir"
    return missing(shared)  # the packages its row of the table needs (not etils: JAX's own remote cache's)


def level_for(settings: Any, location: Any, jax_version: str, env: Mapping[str, str], local: LocalPort,
              tunes: bool = False, room: Callable[[bool], int] | None = None) -> tuple[Level | None, list[tuple[str, str]]]:
    """The shared level behind ``local`` for this process, or None; and the problems worth a
    warning (each one line: the run goes on with the local level). Builds objects only, and makes
    no request (an S3 level reads ``~/.aws`` where the environment has no keys). ``tunes``: XLA
    keeps GPU autotune results in the local level (``_autotune``); ``room``, the room a prefetch
    has under the local cap (None: no cap)."""
    shared = settings["shared"]
    if shared is None or not location.version_dir:
        return None, []
    where = settings.origin("shared")
    why = problem(settings, location)
    if why is not None:
        return None, [(f"shared:{shared}", f"{where}: shared {shared} not used, {why}; running with the local level only")]
    backend = backend_for(shared, jax_version, bool(settings["trust_shared"]), env,
                          bool(settings["shared_credentials_over_http"]))
    problems = []
    if (caution := backend.caution()) is not None:
        problems.append(("shared:cleartext", f"{where}: {caution}"))
    cap = settings["max_size"]
    level = Level(shared, backend, local, timeout=settings["shared_timeout"],
                  writes=no_uploads(settings["shared_write"], env), secret=signing_key(env),
                  max_entry=min(cap, MAX_ENTRY) if cap else MAX_ENTRY,
                  origin=settings.origin("shared_timeout"), room=room, tunes=tunes)
    return level, problems


def signing_key(env: Mapping[str, str]) -> bytes | None:
    from gkx_autocache import _settings

    return _settings.signing_key(env)


def at_exit(finish: Callable[[], None]) -> None:
    """``finish`` the uploads while thread pools still take work (s3fs and gcsfs need them; by the
    time ``atexit`` runs, ``concurrent.futures`` refuses new futures), and before the ledger is
    closed. ``threading._register_atexit`` hooks run last-registered first, before ``atexit``."""
    import concurrent.futures.thread  # noqa: F401  (registers its hook before ours)

    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(finish)
            return
    except RuntimeError:  # already shutting down
        return
    import atexit

    atexit.register(finish)
