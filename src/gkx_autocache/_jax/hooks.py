"""The key's seams (``jax._src.cache_key``): its custom hook, where the package adds the host's ISA,
and the parts each key is hashed from, which explaining a miss reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gkx_autocache._diagnostics import logger
from gkx_autocache._jax.versions import attr, loaded, parameters, patch

HOOK = "jax._src.cache_key.custom_hook"  # the key's part meant for additions, as messages name it

WRITE = ["cache_key", "compile_time_secs", "module_name", "backend", "executable"]  # _cache_write's first five

def install_hook(wrap: Callable[[Callable[[], Any]], Callable[[], Any]]) -> str | None:
    """Make ``wrap(previous)`` the key's custom hook (the package's, chaining the one set before);
    why not, or None."""
    try:
        from jax._src import cache_key
    except Exception as exc:
        return f"jax._src.cache_key cannot be imported ({exc})"
    previous = attr(cache_key, "custom_hook")
    if not callable(previous):
        return f"{HOOK} is missing"
    patch(cache_key, "custom_hook", wrap(previous))
    _hooked[:] = [cache_key]
    return None

_hooked: list[Any] = []  # the key's module whose hook is the package's

def current_hook() -> Any:
    """The key's custom hook now (the user's code may replace the package's after ``import jax``)."""
    return attr(_hooked[0] if _hooked else None, "custom_hook")

def parts_logger(cache_key: Any) -> Any:
    """JAX's ``_log_cache_key_hash(hash_obj, last_serialized, hashfn)``, or None where it differs."""
    log_part = attr(cache_key, "_log_cache_key_hash")
    return log_part if log_part is not None and parameters(log_part) == ["hash_obj", "last_serialized", "hashfn"] else None

def write_seam(compiler: Any) -> Any:
    """JAX's ``_cache_write`` whose first five parameters are ``WRITE``, or None where it differs."""
    write = attr(compiler, "_cache_write")
    return write if write is not None and parameters(write)[:5] == WRITE else None

WRITE_CHANGED = "jax._src.compiler._cache_write has changed"

def watch_key_parts(on_part: Callable[[Any, str, Any], None]) -> bool:
    """Call ``on_part(hash_obj, name, hashfn)`` after each part of each key, where JAX's
    ``_log_cache_key_hash(hash_obj, last_serialized, hashfn)`` (called by ``get`` after each
    part) has the shape it had from JAX 0.4.30 to 0.12; whether it is watched. The parts are
    watched with or without the package's hook in place."""
    try:
        from jax._src import cache_key
    except Exception:
        return False
    log_part = parts_logger(cache_key)
    if log_part is None:
        logger.debug("jax._src.cache_key._log_cache_key_hash has changed: a replaced hook is not noticed")
        return False

    def _log_cache_key_hash(hash_obj: Any, last_serialized: str, hashfn: Any) -> None:
        log_part(hash_obj, last_serialized, hashfn)
        try:
            on_part(hash_obj, last_serialized, hashfn)
        except Exception:
            pass

    patch(cache_key, "_log_cache_key_hash", _log_cache_key_hash)
    return True

def key_platform(hashfn: Any) -> str | None:
    """The platform a key is for (``cpu``, ``cuda``...), from its "backend version" part's function,
    a closure over ``backend`` (JAX 0.4.30 to 0.12); None where it is not one."""
    try:
        cells = dict(zip(hashfn.__code__.co_freevars, hashfn.__closure__ or (), strict=True))
        return str(contents(cells["backend"]).platform)
    except Exception:
        return None

def exclude_xla_flag(flag: str) -> None:
    """Leave ``flag`` out of the key's XLA-flags part, as JAX leaves its dump flags (its list,
    ``xla_flags_to_exclude_from_cache_key``, is read at every key, JAX 0.4.30 to 0.12)."""
    excluded = attr(loaded("cache_key"), "xla_flags_to_exclude_from_cache_key")
    if isinstance(excluded, list) and flag not in excluded:
        excluded.append(flag)

PARTS_CHANGED = "jax._src.cache_key._log_cache_key_hash(hash_obj, last_serialized, hashfn) is missing or has changed"

def part_values(hashfn: Any) -> dict[str, Any]:
    """What one part of JAX's key hashed: the values its ``hashfn`` closes over (``cache_key.get``
    builds each as a lambda over the module, the options, the backend...), by their names there."""
    return dict(zip(hashfn.__code__.co_freevars, (c.cell_contents for c in hashfn.__closure__ or ()), strict=False))

def contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not yet filled
        return None

def excluded_xla_flags() -> set[str]:
    """The XLA flags JAX leaves out of its key."""
    return set(getattr(loaded("cache_key"), "xla_flags_to_exclude_from_cache_key", ()))

def excluded_env_overrides() -> set[str]:
    """The compile options' environment overrides JAX leaves out of its key."""
    return set(getattr(loaded("cache_key"), "env_override_flags_to_exclude_from_cache_key", ()))

def cleared_debug_options() -> frozenset[str]:
    """The debug options JAX clears before hashing the compile options, read from its source."""
    import inspect
    import re

    source = inspect.getsource(loaded("cache_key")._hash_serialized_compile_options)
    return frozenset(re.findall(r"debug_options\.(\w+)\s*=", source))

def hash_compile_options(hash_obj: Any, options: Any, strip_device_assignment: bool) -> None:
    """JAX's own hashing of the compile options (it serialises them, cleared, into ``hash_obj``)."""
    loaded("cache_key")._hash_serialized_compile_options(hash_obj, options,
                                                          strip_device_assignment=strip_device_assignment)

def config_holders(jax: Any) -> dict[str, Any]:
    """``jax.config``'s value holders by option name (each ``.value`` the thread's own)."""
    return getattr(jax.config, "_value_holders", {})
