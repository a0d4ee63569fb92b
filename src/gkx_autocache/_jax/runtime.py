"""What JAX's runtime shows the package: its config's ``update``, whether XLA's backends have
started (and read ``XLA_FLAGS``), the flags they took, this process's rank; and the backends kept
alive in a forked child."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from gkx_autocache._jax.versions import attr, loaded


def replace_config_update(config: Any, update: Callable[..., Any]) -> str | None:
    """``jax.config.update`` replaced by ``update`` (which calls the one it replaces): None, or why
    this JAX's config takes no such attribute. JAX's objects are patched here alone."""
    try:
        config.update = update
    except (AttributeError, TypeError) as exc:
        return str(exc)
    return None

def backends_started(jax: Any) -> bool:
    """Whether XLA's backends have started (and read ``XLA_FLAGS``): ``xla_bridge._backends``."""
    try:
        from jax._src import xla_bridge

        return bool(getattr(xla_bridge, "_backends", None))
    except Exception:
        return False

def keep_backends() -> None:
    """In a forked child (``os.register_at_fork``): JAX's backends are never destroyed. Their thread
    pools' threads were not forked, and destroying one waits on them for ever: a child that exits
    normally after a warm run hangs in ``~PjRtClient`` (stock JAX's own cache too, JAX 0.10 and
    0.12; JAX warns that fork is unsafe). One reference each that nothing owns; the child's memory
    is its parent's anyway."""
    xla_bridge = sys.modules.get("jax._src.xla_bridge")
    backends = getattr(xla_bridge, "_backends", None)
    if not isinstance(backends, dict) or not backends:
        return
    import ctypes

    for backend in list(backends.values()):
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(backend))

def took_xla_flag(value: str) -> bool | None:
    """Whether XLA's flags, as its backend read them, hold a string option of ``value`` (its
    compile options' debug options, serialised: the Python binding exposes few fields); None where
    that cannot be read."""
    try:
        from jax._src.lib import xla_client  # type: ignore[attr-defined]

        serialized = xla_client.CompileOptions().SerializeAsString()
    except Exception:
        return None
    return bytes([len(value)]) + value.encode() in serialized

def process_id() -> int:
    """This process's rank in a multi-process run (0 alone, or before ``jax.distributed`` starts)."""
    found = attr(attr(loaded("distributed"), "global_state"), "process_id")
    return found if isinstance(found, int) else 0
