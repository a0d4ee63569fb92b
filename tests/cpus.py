"""Other CPUs for the tests (SPEC §12, §15): what the package reads of a CPU, its CPUID
(``/dev/cpu/0/cpuid``) and its kernel's flags (``/proc/cpuinfo``), replaced in a private mount
namespace (``unshare -m``, as root) by files made here. XLA still compiles for the real CPU: a fake
decides what the package believes, which is what these tests judge.

A CPUID file is served by a FUSE file system (``cpuidfs.py``) with the driver's layout: the four
registers of ``(leaf, subleaf)`` at offset ``leaf | subleaf << 32``. Fakes are the real CPU less some
features (``without``), or a CPU of either vendor made from a list of LLVM's names (``made``), so the
machine running the tests decides nothing.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gkx_autocache import _cpuid, _isa

Registers = dict[tuple[int, int], tuple[int, int, int, int]]
REAL_CPUINFO = Path("/proc/cpuinfo").read_text(errors="replace")
KERNEL = {llvm: flag for flag, llvm in _isa.X86.items()}  # LLVM's name -> the kernel's flag


def real() -> Registers:
    """This machine's CPUID registers, as the package reads them."""
    got = _cpuid._device(_cpuid.DEVICE) or _cpuid._helper()
    assert got is not None, "this machine's CPUID cannot be read"
    return dict(got[0])


def _bits(name: str) -> list[tuple[int, int, int, int]]:
    found = [(leaf, subleaf, register, bit) for leaf, subleaf, register, bit, n, _ in _cpuid.BITS if n == name]
    return found or ([_cpuid.AVX10] if name.startswith("avx10.") else [])


def without(regs: Registers, names: set[str]) -> Registers:
    """``regs`` with the bits of ``names`` (LLVM's) cleared; every AVX10 version goes with ``avx10.1``."""
    out = dict(regs)
    for name in names:
        for leaf, subleaf, register, bit in _bits(name):
            values = list(out.get((leaf, subleaf), (0, 0, 0, 0)))
            values[register] &= ~(1 << bit)
            out[leaf, subleaf] = (values[0], values[1], values[2], values[3])
    return out


def made(vendor: str, features: set[str], avx10: int = 0) -> Registers:
    """A CPU of ``vendor`` ("GenuineIntel", "AuthenticAMD") with exactly ``features`` (LLVM's names),
    whose OS saves every state they need, and AVX10 of version ``avx10`` (0: none)."""
    regs: Registers = {}

    def set_bit(leaf: int, subleaf: int, register: int, bit: int) -> None:
        values = list(regs.get((leaf, subleaf), (0, 0, 0, 0)))
        values[register] |= 1 << bit
        regs[leaf, subleaf] = (values[0], values[1], values[2], values[3])

    name = vendor.encode()
    regs[0, 0] = (0x24, int.from_bytes(name[0:4], "little"), int.from_bytes(name[8:12], "little"),
                  int.from_bytes(name[4:8], "little"))
    regs[0x80000000, 0] = (0x80000008, 0, 0, 0)
    regs[7, 0] = (1, 0, 0, 0)  # leaf 7 has subleaf 1
    for feature in features:
        for leaf, subleaf, register, bit in _bits(feature):
            set_bit(leaf, subleaf, register, bit)
    set_bit(1, 0, _cpuid.ECX, 27)  # OSXSAVE
    if features & {"avx", "avx2", "fma", "f16c"} or any(f.startswith("avx") for f in features):
        set_bit(1, 0, _cpuid.ECX, 28)
    saves = 0x7 | (0xE0 if any(f.startswith("avx512") for f in features) or avx10 else 0)
    saves |= (3 << 17) if any(f.startswith("amx") for f in features) else 0
    regs[0xD, 0] = (saves, 0, 0, 0)
    if avx10:
        set_bit(*_cpuid.AVX10)
        regs[0x24, 0] = (0, avx10, 0, 0)
    return regs


def serve(regs: Registers, folder: Path) -> Path:
    """``regs`` as the cpuid driver shows them, in a file served until this process ends."""
    from cpuidfs import Served, unavailable

    if (missing := unavailable()) is not None:
        import pytest

        if os.environ.get("CI"):
            pytest.fail(f"FUSE cannot be mounted here: {missing} (.ci/run installs libfuse2)")
        pytest.skip(f"FUSE cannot be mounted here: {missing}")
    return Served(regs, folder).path


def cpuinfo(flags: set[str] | None = None, lacking: frozenset[str] | set[str] = frozenset(), vendor: str | None = None) -> str:
    """``/proc/cpuinfo`` with the real one's blocks, its flags lines less ``lacking`` (the kernel's
    names), or replaced by ``flags``; ``vendor_id`` replaced by ``vendor``."""
    lines = []
    for line in REAL_CPUINFO.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            kept = sorted(flags) if flags is not None else [f for f in value.split() if f not in lacking]
            line = f"{key}: {' '.join(kept)}"
        elif sep and key.strip() == "vendor_id" and vendor:
            line = f"{key}: {vendor}"
        lines.append(line)
    return "\n".join(lines) + "\n"


@dataclass
class Cpu:
    """Another CPU: its CPUID file and its kernel's ``/proc/cpuinfo`` (None: this machine's)."""

    cpuid: Path | None = None
    cpuinfo: Path | None = None

    def mounts(self) -> list[str]:
        binds = []
        if self.cpuinfo is not None:
            binds.append(f"mount --bind {shlex.quote(str(self.cpuinfo))} /proc/cpuinfo")
        if self.cpuid is not None:
            binds.append(f"mount --bind {shlex.quote(str(self.cpuid))} {_cpuid.DEVICE}")
        return binds


def real_less(tmp_path: Path, names: set[str], kernel_too: bool = True, tag: str = "less") -> Cpu:
    """This CPU less ``names`` (LLVM's): its CPUID, and its kernel's flags unless ``kernel_too`` is false
    (a kernel that lists them though the CPU lacks them never happens; the other way, an older kernel)."""
    cpuid = serve(without(real(), names), tmp_path / f"cpuid-{tag}")
    lacking = {KERNEL[n] for n in names if n in KERNEL} | ({"avx10"} if "avx10.1" in names else set())
    info = tmp_path / f"cpuinfo-{tag}"
    info.write_text(cpuinfo(lacking=lacking if kernel_too else set()))
    return Cpu(cpuid, info)


def kernel_hiding(tmp_path: Path, flags: set[str], tag: str = "hiding") -> Cpu:
    """This CPU, whose kernel's flags do not list ``flags`` (the kernel's names): its CPUID as it is."""
    info = tmp_path / f"cpuinfo-{tag}"
    info.write_text(cpuinfo(lacking=flags))
    return Cpu(None, info)


def of_vendor(tmp_path: Path, vendor: str, features: set[str], avx10: int = 0, hidden: frozenset[str] | set[str] = frozenset(),
              tag: str = "vendor") -> Cpu:
    """A CPU ``made`` of ``vendor``, whose kernel lists its features less ``hidden`` (LLVM's names)."""
    cpuid = serve(made(vendor, features, avx10), tmp_path / f"cpuid-{tag}")
    shown = {KERNEL[f] for f in features - hidden if f in KERNEL}
    info = tmp_path / f"cpuinfo-{tag}"
    info.write_text(cpuinfo(flags=shown, vendor=vendor))
    return Cpu(cpuid, info)


def unshared() -> bool:
    return os.path.exists(_cpuid.DEVICE) and \
        subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


def host_flags() -> set[str]:
    block = REAL_CPUINFO.split("\n\n")[0]
    match = re.search(r"^(?:flags|Features)\s*:(.*)$", block, re.M)
    return set(match[1].split()) if match else set()
