"""What this JAX's seams give (``--version``, ``status``), read without patching anything."""

from __future__ import annotations

from gkx_autocache._jax.caching import store_problem
from gkx_autocache._jax.callbacks import callbacks_problem
from gkx_autocache._jax.hooks import HOOK, PARTS_CHANGED, WRITE_CHANGED, parts_logger, write_seam
from gkx_autocache._jax.versions import attr


def probe() -> dict[str, str | None]:
    """What this JAX's seams give, each feature and why it is missing (None where it works), read
    without patching anything; ``--version`` asks it in a child process where no process here has
    recorded it. Settings can still take a feature away (``max_size`` of JAX's own, a bucket)."""
    import jax
    from jax._src import cache_key, compilation_cache, compiler

    store = store_problem(compilation_cache)
    explain = (PARTS_CHANGED if parts_logger(cache_key) is None
               else WRITE_CHANGED if write_seam(compiler) is None else None)
    needs = "they need the store" if store else None
    return {"store": store, "cap": needs, "explain": needs or explain,
            "ISA key": None if callable(attr(cache_key, "custom_hook")) else f"{HOOK} is missing", "levels": needs,
            "host callbacks": needs or callbacks_problem(jax, compiler, compilation_cache),
            "rebuild": needs or rebuild_problem()}


def rebuild_problem() -> str | None:
    """Why entries cannot be recorded and compiled again here (SPEC §18), or None."""
    from gkx_autocache._jax.rebuild import Rebuilder
    from gkx_autocache._jax.recipes import COMPILE_CHANGED
    from gkx_autocache._jax.versions import loaded, parameters

    compile_ = attr(loaded("compiler"), "compile_or_get_cached")
    if compile_ is None or parameters(compile_)[:5] != ["backend", "computation", "devices", "compile_options",
                                                        "host_callbacks"]:
        return COMPILE_CHANGED
    return Rebuilder().problem
