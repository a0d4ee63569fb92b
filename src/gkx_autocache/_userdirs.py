"""The user's own folders, as platformdirs names them, always absolute, never taken against the
current directory: where the package's cache (``_cache``) and the user's config file (``_policy``)
live by default. A leaf: it imports nothing of the package but its diagnostics.
"""

from __future__ import annotations

import os
import sys

from gkx_autocache._diagnostics import logger

_XDG = {"cache": ("XDG_CACHE_HOME", ".cache"), "config": ("XDG_CONFIG_HOME", ".config")}
_MACOS = {"cache": "Library/Caches", "config": "Library/Application Support"}


def user_dir(kind: str, app: str) -> str | None:
    """platformdirs' ``user_cache_dir(app)`` or ``user_config_dir(app)``, always absolute; None for
    a user without a home (no absolute XDG value, HOME or passwd entry's home): never ``~``.

    Where platformdirs follows XDG (Linux and the other Unixes, not Android), the XDG rule is
    computed here: importing platformdirs costs about 7 ms of every ``import jax``. A relative
    ``XDG_CACHE_HOME`` or ``XDG_CONFIG_HOME`` is ignored, as the XDG spec says: taken against the
    current directory, it would let a cloned repository choose the cache and ship the
    executables in it (they pass every trust check: the user owns the checkout). Elsewhere,
    platformdirs itself; its releases before tox-dev/platformdirs#540 (2026) take a relative XDG
    value as it is (macOS reads XDG too), so a relative answer there is replaced by macOS's own
    place. Windows and Android
    read no XDG variable."""
    android = os.environ.get("ANDROID_DATA") == "/data" and os.environ.get("ANDROID_ROOT") == "/system"
    if os.name == "posix" and sys.platform not in ("darwin", "ios") and not android:
        variable, fallback = _XDG[kind]
        value = os.environ.get(variable, "").strip()
        if value and not os.path.isabs(value):
            logger.debug("%s=%r is relative: ignored, as the XDG spec says", variable, value)
        if os.path.isabs(value):
            return os.path.join(value, app)
        found = home()
        return None if found is None else os.path.join(found, fallback, app)
    import platformdirs

    path = str(platformdirs.user_cache_dir(app) if kind == "cache" else platformdirs.user_config_dir(app))
    if os.path.isabs(path) or sys.platform != "darwin":
        return path
    logger.debug("platformdirs answered %r, a relative path: %s ignored", path, _XDG[kind][0])
    found = home()
    return None if found is None else os.path.join(found, _MACOS[kind], app)


def home() -> str | None:
    """The user's home: ``HOME`` when it is absolute, else the password database's; None when
    neither gives an absolute one (a relative ``HOME`` would move with the current directory, as
    platformdirs also holds)."""
    value = os.environ.get("HOME", "")
    if os.path.isabs(value):
        return value
    try:
        import pwd

        found = pwd.getpwuid(os.getuid()).pw_dir
    except ImportError:
        found = os.path.expanduser("~")
    except KeyError:
        # A uid the password database does not know (docker run --user 12345): expanduser would
        # answer a relative "~".
        logger.debug("HOME is %r and uid %d has no passwd entry: no home directory", value, os.getuid())
        return None
    return found if os.path.isabs(found) else None
