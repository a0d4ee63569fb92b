"""Settings into a shared level (SPEC §14): whether ``shared`` can be used with this local level,
which storage speaks to it (an HTTP cache, S3 spoken directly, another bucket through fsspec, a
directory), whether this process uploads, and the hook that finishes its uploads at exit. Builds
objects only; ``status`` reads the same answers (``probe``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from gkx_autocache._backends import s3
from gkx_autocache._backends.bucket import Bucket
from gkx_autocache._backends.directory import Directory
from gkx_autocache._backends.http import HttpCache, withheld_note
from gkx_autocache._layout import is_url, version_name
from gkx_autocache._settings import no_uploads
from gkx_autocache._shared.level import MAX_ENTRY, Level


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
    if is_url(shared) and not is_http(shared):  # fsspec and its backend; not etils, which only JAX's own remote cache needs
        import importlib.util

        from gkx_autocache import _remote

        missing = [name for name in ("fsspec", _remote.BACKENDS[_remote.scheme(shared)])
                   if importlib.util.find_spec(name) is None]
        return f"{', '.join(missing)} not installed: pip install '{_remote.EXTRA}'" if missing else None
    return None


def level_for(settings: Any, location: Any, jax_version: str, env: Mapping[str, str], tunes: bool = False,
              room: Callable[[bool], int] | None = None) -> tuple[Level | None, list[tuple[str, str]]]:
    """The shared level for this process, or None; and the problems worth a warning (each one
    line: the run goes on with the local level). Builds objects only, and makes no request (an S3
    level reads ``~/.aws`` where the environment has no keys). ``tunes``: XLA keeps GPU autotune
    results in the local level (``_autotune``); ``room``, the room a prefetch has under the local
    cap (None: no cap)."""
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
    if isinstance(backend, HttpCache) and backend.withheld:
        problems.append(("shared:cleartext", f"{where}: {withheld_note(shared, backend.credentials)}"))
    cap = settings["max_size"]
    level = Level(shared, backend, local=location.version_dir, timeout=settings["shared_timeout"],
                  writes=no_uploads(settings["shared_write"], env), secret=signing_key(env),
                  max_entry=min(cap, MAX_ENTRY) if cap else MAX_ENTRY,
                  origin=settings.origin("shared_timeout"), room=room, local_team=location.team, tunes=tunes)
    return level, problems


def backend_for(shared: str, jax_version: str, team: bool, env: Mapping[str, str] = os.environ,
                over_http: bool = False) -> Bucket | HttpCache | Directory | s3.Deferred:
    """The level's storage: an HTTP cache (``over_http``: its credentials sent over plain
    ``http://`` to another machine too), an S3 bucket spoken directly (``s3.py``; s3fs where its
    settings are s3fs's), another bucket through fsspec, or a directory."""
    version_url = f"{shared.rstrip('/')}/{version_name(jax_version)}"
    if is_http(shared):
        return HttpCache(version_url, env, over_http)
    if is_url(shared) and shared.lower().startswith("s3://") and s3.route(env, shared[5:].split("/", 1)[0]) is None:
        return s3.Deferred(version_url, env)  # this package's client, or s3fs, chosen at the first request
    if is_url(shared):
        return Bucket(version_url)
    return Directory(shared, jax_version, team)


def is_http(shared: str) -> bool:
    return shared.split("://", 1)[0].lower() in ("http", "https") and "://" in shared


def signing_key(env: Mapping[str, str]) -> bytes | None:
    from gkx_autocache import _settings

    return _settings.signing_key(env)


def at_exit(level: Level, recorder: Any) -> None:
    """Finish the uploads while thread pools still take work (s3fs and gcsfs need them; by the
    time ``atexit`` runs, ``concurrent.futures`` refuses new futures), and before the ledger is
    closed. ``threading._register_atexit`` hooks run last-registered first, before ``atexit``."""
    import concurrent.futures.thread  # noqa: F401  (registers its hook before ours)

    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(level.finish, recorder)
            return
    except RuntimeError:  # already shutting down
        return
    import atexit

    atexit.register(level.finish, recorder)
