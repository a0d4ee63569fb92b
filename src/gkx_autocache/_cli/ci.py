"""``gkx-autocache ci-key``: a key for a CI cache that changes whenever the entries could stop
being valid, and no more often, read from metadata and the environment (nothing is imported)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from gkx_autocache import _context
from gkx_autocache._cli.output import OK, emit


def cmd_ci_key(args: argparse.Namespace) -> int:
    key, parts = ci_key()
    emit(args, key, {"key": key, "parts": parts})
    return OK


def accelerator_plugins() -> str:
    """JAX's accelerator plugins installed here, from metadata (nothing is imported): each changes
    what an entry is built for. ``jax-cuda12-plugin 0.10.2, libtpu 0.0.30``."""
    import importlib.metadata
    import re

    found = set()
    for dist in importlib.metadata.distributions():
        name = str(dist.metadata["Name"] or "")
        if re.fullmatch(r"(?i)(jax[-_](cuda|rocm)\d*[-_](plugin|pjrt)|libtpu([-_]nightly)?)", name):
            found.add(f"{name.lower().replace('_', '-')} {dist.version}")
    return ", ".join(sorted(found)) or "none"


# What a TPU host says of its slice (Cloud TPU VMs and GKE set them; libtpu reads them): a v6e-1 CI
# cache read by v6e-4 jobs, or the other way round, is another topology's.
TPU_TOPOLOGY = ("TPU_ACCELERATOR_TYPE", "TPU_TOPOLOGY", "TPU_HOST_BOUNDS", "TPU_CHIPS_PER_HOST_BOUNDS",
                "TPU_PROCESS_BOUNDS", "TPU_VISIBLE_CHIPS")


def tpu_topology(env: Any, dev: str = "/dev") -> str | None:
    """The TPU slice and the chips this host sees (``v5litepod-4 2x2 ...; 1 chip``: a one-chip
    sandbox of a four-chip host), or None where neither is here (no part: other keys stay)."""
    import re

    said = [f"{name.removeprefix('TPU_').lower()}={env[name]}" for name in TPU_TOPOLOGY if env.get(name)]
    chips = 0
    for folder, pattern in ((dev, r"accel\d+"), (os.path.join(dev, "vfio"), r"\d+")):
        try:
            chips += sum(1 for name in os.listdir(folder) if re.fullmatch(pattern, name))
        except OSError:
            continue
    if not said and not chips:
        return None
    return " ".join(said) + (f"; {chips} chip{'s' if chips != 1 else ''} here" if chips else "")


def ci_key() -> tuple[str, dict[str, str]]:
    """A short key that changes whenever the entries could stop being valid, and no more often: the
    host's ISA (the instruction-set flags of the CPU, not every flag: microcode and hypervisor flags
    do not change what an entry runs on; the ``cpu_target`` where one is used), the Python minor version, JAX, jaxlib and accelerator
    plugins, platform and machine, the compression library, XLA_FLAGS and LIBTPU_INIT_ARGS; on a TPU
    host its topology. And its parts."""
    import hashlib

    from gkx_autocache import _isa, _settings

    target = _context.cpu_target(_settings.resolve()["cpu_target"])  # a fleet at one cpu_target shares one key
    parts = {
        "jax": _context.distribution_version("jax") or "nojax",
        "jaxlib": _context.distribution_version("jaxlib") or "nojaxlib",
        "plugins": accelerator_plugins(),
        "python": f"{sys.implementation.name} {sys.version_info[0]}.{sys.version_info[1]}", "platform": sys.platform,
        "machine": os.uname().machine if hasattr(os, "uname") else sys.platform, "isa": target.isa_text() if target.level else _isa.isa(),
        "compression": "zstandard" if _context.distribution_version("zstandard") else "zlib",
        "xla_flags": keyed_flags("XLA_FLAGS"),
    }
    if libtpu := keyed_flags("LIBTPU_INIT_ARGS"):  # in JAX's key on TPU, as XLA_FLAGS are (a part only where
        parts["libtpu_init_args"] = libtpu  # set: the keys of every other CI stay as they were)
    if (topology := tpu_topology(os.environ)) is not None:
        parts["tpu"] = topology
    digest = hashlib.sha256(json_dumps(parts).encode()).hexdigest()[:16]
    return f"{parts['jax']}-{digest}", parts


def keyed_flags(variable: str) -> str:
    """An environment variable's flags as JAX keys them: sorted, less the dump flags it leaves out."""
    return " ".join(sorted(f for f in os.environ.get(variable, "").split() if not f.startswith("--xla_dump")))


def json_dumps(data: Any) -> str:
    import json

    return json.dumps(data, sort_keys=True)

