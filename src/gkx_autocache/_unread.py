"""The lookups that read no cache entry (SPEC §7, amended 2026-12-04): where an XLA dump is asked
for (a hit would skip XLA, and its dump), and on a TPU device subset no fixed runtime is known to
load safely. Such a process still writes its compiles.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from gkx_autocache._diagnostics import NOTED, warn
from gkx_autocache._jax import caching as jax_caching

# The flags that make XLA dump: --xla_dump_to, or (to stdout) any format or filter; XLA's GPU dumps.
DUMP_FLAGS = ("--xla_dump_to", "--xla_dump_hlo_as_", "--xla_dump_hlo_module_re", "--xla_dump_hlo_pass_re",
              "--xla_dump_hlo_pipeline_re", "--xla_dump_hlo_snapshots", "--xla_dump_fusion_visualization",
              "--xla_gpu_dump_")


def dump_asked(env: Mapping[str, str], argv: list[str] | None = None) -> str | None:
    """Where an XLA dump is asked for (``XLA_FLAGS --xla_dump_to=/tmp/d``), or None. JAX leaves
    these flags out of its key, so a warm run hits and XLA, never run, dumps nothing (SPEC §7,
    amended 2026-12-04). JAX's own IR dumps (``jax_dump_ir_to``) are written before the lookup, on
    every line: a hit loses none of them."""
    sources = [(variable, env.get(variable, "").split()) for variable in ("XLA_FLAGS", "LIBTPU_INIT_ARGS")]
    sources.append(("the command line", [a for a in (sys.argv if argv is None else argv)[1:] if a.startswith("--xla")]))
    for where, words in sources:
        for word in words:
            name, equals, value = word.partition("=")
            if name.startswith(DUMP_FLAGS) and not (equals and value.strip().lower() in ("", "false", "0")):
                return f"{where} {word}"
    return None


def install(env: Mapping[str, str], not_read: Callable[..., Any]) -> None:
    """The outermost seam on JAX's lookup: after the store's and the callbacks' (SPEC §7); each
    lookup skipped goes to ``not_read`` (the recorder's). XLA reads XLA_FLAGS when its backend
    starts, which a program may set after import jax: read at the first lookup."""
    asked: list[str | None] = []

    def dumping() -> str | None:
        if not asked:
            asked.append(dump_asked(env))
            if asked[0] is not None:
                warn("xla:dump", f"{asked[0]} asks for an XLA dump: this process reads no cache entry, as a hit would "
                                 "skip XLA and its dump; it still writes them, and a run without the flag is served",
                     silence=NOTED)
        return asked[0]

    def skipped(platform: str, devices: Callable[[], list[int]]) -> tuple[str, str] | None:
        if (dump := dumping()) is not None:
            return "NOT_READ", dump
        if (subset := jax_caching.unsafe_subset(platform, devices)) is not None:
            warn("tpu:subset", f"{subset}: such lookups read no cache entry until a fixed runtime is known; their "
                               "compiles are still written", silence=NOTED)
            return "NOT_READ_SUBSET", subset
        return None

    unskipped = jax_caching.skip_lookups(skipped, not_read)
    if unskipped is not None and (dump := dump_asked(env)) is not None:
        warn("xla:dump", f"{dump} asks for an XLA dump, which a cache hit skips, and the cache cannot be left "
                         f"unread here ({unskipped}): set GKX_JAX_CACHE=0 while dumping")
