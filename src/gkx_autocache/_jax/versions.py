"""The shape of a JAX line (SPEC §16): the oldest supported, a version read, a seam's parameters,
and the three moves every seam makes: find a loaded module of ``jax._src``, read an attribute that
may be missing, patch one. The other modules of ``_jax`` are the seams themselves."""

from __future__ import annotations

import sys
from typing import Any

OLDEST = (0, 4, 30)  # the oldest JAX line supported (SPEC §16); each seam is probed, on every line

def unsupported(version: str) -> str | None:
    """Why this JAX is left as it is (older than ``OLDEST``), or None (a local build's too: probed)."""
    line = version_tuple(version)
    if line is None or line >= OLDEST:
        return None
    return (f"JAX {version} is not supported (gkx-autocache supports JAX {'.'.join(map(str, OLDEST))} and later): "
            "JAX is left as it is")

def version_tuple(version: str) -> tuple[int, int, int] | None:
    """``(0, 4, 30)`` of ``"0.4.30"``, or None where it does not read as a version."""
    import re

    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    return None if found is None else (int(found[1]), int(found[2]), int(found[3] or 0))

def parameters(func: Any) -> list[str]:
    import inspect

    try:
        return list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return []

def signature_text(func: Any) -> str:
    import inspect

    try:
        return str(inspect.signature(func))
    except (TypeError, ValueError):
        return ""

def loaded(name: str) -> Any:
    """``jax._src.<name>`` where JAX has imported it, else None: never imports."""
    return sys.modules.get(f"jax._src.{name}")

def attr(owner: Any, name: str) -> Any:
    """``owner.name``, or None where it is missing or reading it raises (a later JAX's deprecation
    shim, which ``-W error`` turns into an exception): such a seam is missing."""
    try:
        return getattr(owner, name, None)
    except Exception:
        return None

def patch(owner: Any, name: str, new: Any) -> None:
    new.__wrapped__ = getattr(owner, name)
    setattr(owner, name, new)

def jaxlib_version() -> str:
    return str(getattr(loaded("cache_key"), "jaxlib_version_str", "?"))
