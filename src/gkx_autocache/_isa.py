"""The host's instruction set (SPEC §15), read once: what XLA:CPU compiles for.

XLA:CPU compiles for the host CPU (LLVM's ``-mcpu=host``), and its executables list the target
features they were built with (``+avx512f,+amx-tile,...``). JAX's key says only ``cpu``, so an entry
written on one CPU would be loaded on another that cannot run it (SIGILL, SIGSEGV). The key gets the
host's ISA, under LLVM's names, so that what a key says and what an entry lists can be compared
(``tests/test_isa.py`` decompresses an entry written on the test host and checks that every
``+feature`` it lists is covered).

- x86-64 Linux: the CPU's own CPUID, as LLVM reads it (``_cpuid``): a kernel older than its CPU
  lists no flag it does not know, and may hide one it distrusts, while XLA's code uses them (issue
  67: ``avx10.1`` and ``prefetchi`` on an Intel Xeon). The key's ISA then says ``cpuid`` first.
- Elsewhere on Linux, or where CPUID cannot be read: the first processor's ``flags`` (x86) or
  ``Features`` (ARM) line of ``/proc/cpuinfo``, and no further (the file is ~400 KB on a 256-core
  host). Only the flags in the tables below count: the rest are not instruction sets
  (``hypervisor``, ``constant_tsc``, ``rep_good``, the mitigation flags...), so two hosts of one CPU
  model with other microcode or hypervisor flags share entries.
- macOS: ``sysctl hw.optional`` (``arm.FEAT_*`` on Apple silicon) and, on Intel, ``machdep.cpu.*``.
- Elsewhere: the machine and ``platform.processor()``, as they are.
- Where none of these gives the ISA, the host itself stands in (``host_id``): never
  ``<machine>:unknown``, which every such host would share, and one of them would load another's entries.

A leaf: stdlib and ``_cpuid``, imported on ``import jax`` (where the package is enabled).
"""

from __future__ import annotations

import os
import sys
from typing import NamedTuple

from gkx_autocache import _cpuid

CPUINFO = "/proc/cpuinfo"
# systemd's and D-Bus's file of this host's id (machine-id(5)); read only where the ISA cannot be.
MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
HOST_MARK = "host="  # what the stand-in for an ISA that cannot be read begins with
TARGET_MARK = "target="  # what a key under a ``cpu_target`` holds in place of the features (``_cpu_target``)
CPUID_MARK = "cpuid"  # the first word of an ISA read from CPUID (no feature has the name): keys before it read the flags

# x86: the kernel's flag -> LLVM's target feature, for every flag that is an instruction set (or a
# register state XLA's code may use). Where the names are equal the entry maps to itself.
X86 = {
    "lm": "64bit", "fpu": "x87", "cx8": "cx8", "cmov": "cmov", "mmx": "mmx", "fxsr": "fxsr",
    "sse": "sse", "sse2": "sse2", "pni": "sse3", "ssse3": "ssse3", "sse4_1": "sse4.1", "sse4_2": "sse4.2",
    "sse4a": "sse4a", "pclmulqdq": "pclmul", "vpclmulqdq": "vpclmulqdq", "fma": "fma", "fma4": "fma4",
    "cx16": "cx16", "movbe": "movbe", "popcnt": "popcnt", "abm": "lzcnt", "aes": "aes", "vaes": "vaes",
    "xsave": "xsave", "xsaveopt": "xsaveopt", "xsavec": "xsavec", "xsaves": "xsaves", "avx": "avx",
    "avx2": "avx2", "f16c": "f16c", "rdrand": "rdrnd", "rdseed": "rdseed", "lahf_lm": "sahf",
    "3dnowprefetch": "prfchw", "xop": "xop", "tbm": "tbm", "lwp": "lwp", "mwaitx": "mwaitx",
    "fsgsbase": "fsgsbase", "bmi1": "bmi", "bmi2": "bmi2", "adx": "adx", "invpcid": "invpcid",
    "rtm": "rtm", "hle": "hle", "mpx": "mpx", "sha_ni": "sha", "clflushopt": "clflushopt", "clwb": "clwb",
    "clzero": "clzero", "wbnoinvd": "wbnoinvd", "rdpru": "rdpru", "rdpid": "rdpid", "pku": "pku",
    "waitpkg": "waitpkg", "gfni": "gfni", "cldemote": "cldemote", "movdiri": "movdiri",
    "movdir64b": "movdir64b", "enqcmd": "enqcmd", "serialize": "serialize", "tsxldtrk": "tsxldtrk",
    "pconfig": "pconfig", "sgx": "sgx", "user_shstk": "shstk", "hreset": "hreset", "uintr": "uintr",
    "ptwrite": "ptwrite", "cmpccxadd": "cmpccxadd", "prefetchi": "prefetchi", "raoint": "raoint",
    "sha512": "sha512", "sm3": "sm3", "sm4": "sm4", "wrmsrns": "wrmsrns", "avx_vnni": "avxvnni",
    "avx_ifma": "avxifma", "avx_ne_convert": "avxneconvert", "avx_vnni_int8": "avxvnniint8",
    "avx_vnni_int16": "avxvnniint16", "avx512f": "avx512f", "avx512dq": "avx512dq", "avx512cd": "avx512cd",
    "avx512bw": "avx512bw", "avx512vl": "avx512vl", "avx512ifma": "avx512ifma", "avx512vbmi": "avx512vbmi",
    "avx512_vbmi2": "avx512vbmi2", "avx512_vnni": "avx512vnni", "avx512_bitalg": "avx512bitalg",
    "avx512_vpopcntdq": "avx512vpopcntdq", "avx512_bf16": "avx512bf16", "avx512_fp16": "avx512fp16",
    "avx512_vp2intersect": "avx512vp2intersect", "avx512pf": "avx512pf", "avx512er": "avx512er",
    "avx512_4vnniw": "avx5124vnniw", "avx512_4fmaps": "avx5124fmaps", "amx_tile": "amx-tile",
    "amx_bf16": "amx-bf16", "amx_int8": "amx-int8", "amx_fp16": "amx-fp16", "amx_complex": "amx-complex",
    "amx_fp8": "amx-fp8", "amx_tf32": "amx-tf32", "amx_transpose": "amx-transpose",
    "amx_avx512": "amx-avx512", "amx_movrs": "amx-movrs", "movrs": "movrs", "avx10": "avx10.1",
    "apx": "egpr", "keylocker": "kl", "widekl": "widekl",
}
# Features LLVM lists for the host that no kernel flag shows and that never restrict where code runs:
# tuning (how to schedule, not which instructions exist) and the shadow stack, whose instructions are
# no-ops on a CPU without it (LLVM reads it from CPUID; the kernel lists it as user_shstk only where
# it enables it for programs). The test of coverage passes over these, and only these.
UNRESTRICTED = ("shstk",)
TUNING_PREFIXES = ("prefer-", "fast-", "slow-", "tuning-", "false-deps-", "idivl-", "idivq-", "lea-",
                   "macrofusion", "branchfusion", "pad-short-functions", "sbb-dep-breaking", "use-",
                   "allow-light-256-bit", "ermsb", "fsrm")

# ARM (AArch64): the kernel's HWCAP name -> LLVM's target feature. Not verified on an ARM host here.
ARM = {
    "fp": "fp-armv8", "asimd": "neon", "aes": "aes", "pmull": "aes", "sha1": "sha2", "sha2": "sha2",
    "crc32": "crc", "atomics": "lse", "fphp": "fullfp16", "asimdhp": "fullfp16", "asimdrdm": "rdm",
    "jscvt": "jsconv", "fcma": "complxnum", "lrcpc": "rcpc", "dcpop": "ccpp", "sha3": "sha3",
    "sm3": "sm4", "sm4": "sm4", "asimddp": "dotprod", "sha512": "sha3", "sve": "sve", "asimdfhm": "fp16fml",
    "uscat": "lse2", "ilrcpc": "rcpc-immo", "flagm": "flagm", "sb": "sb", "paca": "pauth", "pacg": "pauth",
    "dcpodp": "ccdp", "sve2": "sve2", "sveaes": "sve-aes", "svepmull": "sve-aes", "svebitperm": "sve-bitperm",
    "svesha3": "sve-sha3", "svesm4": "sve-sm4", "flagm2": "altnzcv", "frint": "fptoint", "svei8mm": "i8mm",
    "svef32mm": "f32mm", "svef64mm": "f64mm", "svebf16": "bf16", "i8mm": "i8mm", "bf16": "bf16",
    "rng": "rand", "bti": "bti", "mte": "mte", "mte3": "mte", "ecv": "ecv", "afp": "fpac", "rpres": "rcpc3",
    "sme": "sme", "smei16i64": "sme-i16i64", "smef64f64": "sme-f64f64", "sme2": "sme2", "sve2p1": "sve2p1",
    "cssc": "cssc", "rprfm": "rprfm", "mops": "mops", "hbc": "hbc", "lrcpc3": "rcpc3", "lse128": "lse128",
    "fpmr": "fpmr", "faminmax": "faminmax", "f8cvt": "fp8", "f8fma": "fp8fma", "f8dp4": "fp8dot4",
    "f8dp2": "fp8dot2", "lut": "lut", "ebf16": "bf16", "sveebf16": "bf16", "wfxt": "wfxt",
}


# What the kernel's flags can show, under LLVM's names: a feature an entry lists outside it (a newer
# extension, APX's ``ndd``, ``usermsr``) can be neither confirmed nor ruled out from the flags.
KNOWN = frozenset(X86.values()) | frozenset(ARM.values()) | {"crc32"}
# What CPUID shows: every feature LLVM reads of an x86-64 host.
KNOWN_CPUID = frozenset(name for *_, name, _state in _cpuid.BITS) | {"avx10.1", "avx10.2"}


def _first_block(path: str) -> list[str]:
    """The lines of the first processor's block: read until its blank line, no further."""
    lines: list[str] = []
    with open(path, encoding="ascii", errors="replace") as f:
        for line in f:
            if not line.strip():
                if lines:
                    break
                continue
            lines.append(line)
    return lines


def from_cpuinfo(lines: list[str], machine: str) -> list[str] | None:
    """LLVM's names for the instruction-set flags of one ``/proc/cpuinfo`` block, sorted; None when
    the block has no flags line."""
    for line in lines:
        name, _, value = line.partition(":")
        name = name.strip()
        if name == "flags":
            table = X86
        elif name == "Features":
            table = ARM
        else:
            continue
        found = {table[flag] for flag in value.split() if flag in table}
        if name == "flags" and "sse4.2" in found:
            found.add("crc32")
        return sorted(found)
    return None


# Apple silicon's ``hw.optional.arm.FEAT_*`` (Arm's feature names) -> LLVM's target feature, as ARM above;
# a name not here is kept, lower case. Intel Macs list CPUID's names in ``machdep.cpu.*`` (X86 above).
MAC_ARM = {
    "AES": "aes", "PMULL": "aes", "SHA1": "sha2", "SHA256": "sha2", "SHA512": "sha3", "SHA3": "sha3",
    "CRC32": "crc", "LSE": "lse", "LSE2": "lse2", "RDM": "rdm", "DotProd": "dotprod", "FHM": "fp16fml",
    "FP16": "fullfp16", "FCMA": "complxnum", "JSCVT": "jsconv", "LRCPC": "rcpc", "LRCPC2": "rcpc-immo",
    "FlagM": "flagm", "FlagM2": "altnzcv", "FRINTTS": "fptoint", "SB": "sb", "PAuth": "pauth", "DPB": "ccpp",
    "DPB2": "ccdp", "BF16": "bf16", "I8MM": "i8mm", "BTI": "bti", "SME": "sme", "SME2": "sme2", "ECV": "ecv",
    "WFxT": "wfxt", "SSBS": "ssbs", "DIT": "dit", "FPAC": "fpac",
}
# Intel Macs name CPUID's flags as Apple does (``machdep.cpu.*``: ``AVX1.0``, ``SSE4.1``, ``LZCNT``;
# ``hw.optional.*``: ``avx1_0``, ``supplementalsse3``): lower case, ``.`` as ``_``, then these
# spellings, give the kernel's flag (X86 above). A flag in neither is not an instruction set (``acpi``,
# ``vmx``, ``ibrs``, ``mdclear``) and is left out, as on Linux: a microcode update keeps the key.
MAC_X86 = {
    "sse3": "pni", "supplementalsse3": "ssse3", "avx1_0": "avx", "avx2_0": "avx2", "rdwrfsgs": "fsgsbase",
    "clfsopt": "clflushopt", "em64t": "lm", "x86_64": "lm", "lahf": "lahf_lm", "lzcnt": "abm",
    "prefetchw": "3dnowprefetch", "sha": "sha_ni", "floatingpoint": "fpu", "avx512vnni": "avx512_vnni",
    "avx512vbmi2": "avx512_vbmi2", "avx512bitalg": "avx512_bitalg", "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16", "avx512vp2intersect": "avx512_vp2intersect",
}
# Each group asked on its own: Apple's sysctl stops at the first name it does not know, and Apple
# silicon has no ``machdep.cpu.*`` (asked first, they hid ``hw.optional`` there).
SYSCTL_GROUPS = (("hw.optional",), ("machdep.cpu.features", "machdep.cpu.leaf7_features", "machdep.cpu.extfeatures"))


def _sysctl(names: tuple[str, ...]) -> str:
    """``sysctl names...``: found on PATH, else where macOS keeps it (cron's PATH lacks /usr/sbin)."""
    import shutil
    import subprocess

    command = shutil.which("sysctl") or "/usr/sbin/sysctl"
    try:
        return subprocess.run([command, *names], capture_output=True, text=True, timeout=5, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _from_sysctl() -> list[str] | None:
    """macOS's CPU features under LLVM's names: Apple silicon's ``hw.optional.*`` set to 1
    (``arm.FEAT_*`` through MAC_ARM); an Intel Mac's (it has ``machdep.cpu.*``) CPUID flags and
    ``hw.optional.*``, through MAC_X86 and X86, the rest left out."""
    lines = [line for names in SYSCTL_GROUPS for line in _sysctl(names).splitlines()]
    intel = any(line.startswith("machdep.cpu.") for line in lines)
    found: set[str] = set()

    def x86(flag: str) -> None:
        flag = flag.lower().replace(".", "_")
        if (kernel := MAC_X86.get(flag, flag)) in X86:
            found.add(X86[kernel])

    for line in lines:
        name, _, value = line.partition(":")
        if name.startswith("machdep.cpu."):
            for flag in value.split():
                x86(flag)
        elif name.startswith("hw.optional.arm.FEAT_") and value.strip() == "1":
            feature = name.removeprefix("hw.optional.arm.FEAT_")
            found.add(MAC_ARM.get(feature, feature.lower()))
        elif name.startswith("hw.optional.") and value.strip() == "1":
            flag = name.removeprefix("hw.optional.").removeprefix("arm.")
            if intel:
                x86(flag)
            else:
                found.add(flag)
    if intel and "sse4.2" in found:
        found.add("crc32")
    return sorted(found) or None


def _machine_id() -> str | None:
    """This host's machine id (32 hex digits), where a file holds one."""
    for path in MACHINE_ID_FILES:
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                text = f.read(64).strip().lower()
        except (OSError, ValueError):
            continue
        if len(text) == 32 and text.strip("0123456789abcdef") == "" and text.strip("0"):
            return text
    return None


def host_id() -> list[str]:
    """What stands in for an ISA that cannot be read: this host's name, and a digest of its machine
    id where one is readable. Each alone is shared somewhere: a machine id by every container of an
    image that ships one and every clone of a VM image (and a chroot without ``/proc`` sees its
    image's), a host name by hosts left at ``localhost``. Two hosts share a key only when both are the
    same. The machine id is hashed with this package's own prefix, as machine-id(5) asks: it is never
    shown as it is (a key's hook text is kept in the index, in bundles and in ``ci-key``)."""
    import hashlib

    node = os.uname().nodename if hasattr(os, "uname") else os.environ.get("COMPUTERNAME", "")  # Windows: no uname
    safe = "".join(c if c.isascii() and (c.isalnum() or c in ".-_") else "_" for c in node)[:64] or "unnamed"
    if safe != node:  # a character the key text cannot hold: the name's digest tells such names apart
        safe = f"{safe[:55]}-{hashlib.sha256(node.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"
    node = safe
    found = [HOST_MARK + node]
    machine_id = _machine_id()
    if machine_id is not None:
        found.append("machine-id=" + hashlib.sha256(b"gkx-autocache isa\0" + machine_id.encode()).hexdigest()[:16])
    return found


class Host(NamedTuple):
    """This host's ISA as read: its machine, its features (LLVM's names where CPUID or the kernel's
    flags were read; ``host_id()`` where nothing was), why it could not be read, and how it was."""

    machine: str
    features: list[str]
    unread: str | None
    source: str

    def known(self) -> frozenset[str]:
        """The features this reading can confirm or rule out (an entry may list others)."""
        return KNOWN_CPUID if self.source.startswith("CPUID") else KNOWN

    def text(self) -> str:
        """The ISA as a key holds it: ``x86_64:cpuid,64bit,adx,...`` (``x86_64:64bit,...`` from the flags)."""
        marked = [CPUID_MARK, *self.features] if self.source.startswith("CPUID") else self.features
        return f"{self.machine}:{','.join(marked)}"


def read() -> Host:
    """This host's ISA, read now: CPUID on x86-64 Linux, else the system's view (SPEC §15)."""
    machine = os.uname().machine if hasattr(os, "uname") else sys.platform
    features: list[str] | None = None
    why: str | None = None
    source = ""
    try:
        if sys.platform.startswith("linux"):
            features, how = _cpuid.read(machine) if machine in ("x86_64", "AMD64") else (None, "")
            if features:
                return Host(machine, features, None, how)
            block = _first_block(CPUINFO)
            features, source = from_cpuinfo(block, machine), f"the kernel's flags ({CPUINFO})" + (f"; {how}" if how else "")
            why = f"{CPUINFO} is empty" if not block else f"{CPUINFO} has no flags line with an instruction set"
        elif sys.platform == "darwin":
            features, why, source = _from_sysctl(), "sysctl gives no CPU features", "sysctl"
        else:
            import platform

            # Windows: "Intel64 Family 6 Model 158 Stepping 10, GenuineIntel", as one name a key holds
            processor = "".join(c if c.isascii() and (c.isalnum() or c in ".-_") else "_" for c in platform.processor())
            features, why, source = [processor] if processor else None, "platform.processor() is empty", "platform.processor()"
    except OSError as exc:
        features, why = None, f"{CPUINFO} cannot be read ({exc.strerror or exc})"
    except ValueError as exc:
        features, why = None, f"{CPUINFO} cannot be read ({exc})"
    if not features:  # none, or a flags line without one instruction set: nothing that tells CPUs apart
        return Host(machine, host_id(), why, "this host's name and machine id")
    return Host(machine, features, None, source)


def kernel_hides(host: Host) -> list[str]:
    """What CPUID shows that the kernel's flags do not list (an older kernel, ``clearcpuid``): the
    key holds them all the same, as XLA's code may use them. Empty where the ISA is not CPUID's."""
    if not host.source.startswith("CPUID"):
        return []
    try:
        flags = from_cpuinfo(_first_block(CPUINFO), host.machine)
    except (OSError, ValueError):
        return []
    if flags is None:
        return []
    return sorted(f for f in host.features if f not in flags and f in KNOWN)


_cached: list[str] = []


def isa() -> str:
    """This host's ISA as one string, read once per process: ``x86_64:cpuid,64bit,adx,aes,avx,...``."""
    if not _cached:
        _cached.append(read().text())
    return _cached[0]


def unread() -> str | None:
    """Why this host's ISA cannot be read, read now (for ``status``), or None where it can."""
    return read().unread


def parse(text: str) -> tuple[str, frozenset[str]] | None:
    """``(machine, features)`` of a string ``isa()`` made (a key's hook value), or None."""
    machine, sep, features = text.partition(":")
    return (machine, frozenset(f for f in features.split(",") if f)) if sep else None


def difference(before: str, after: str) -> str:
    """What a person needs to know of two ISAs: ``x86_64 -> aarch64``, or the features one has and
    the other lacks (``lacks avx512bw, avx512f; adds amx-tile``), in full."""
    old, new = parse(before), parse(after)
    if old is None or new is None:
        return f"{before or 'unknown'} -> {after or 'unknown'}"
    if old[0] != new[0]:
        return f"{old[0]} -> {new[0]}"
    targets = [next((f for f in isa if f.startswith(TARGET_MARK)), None) for isa in (old[1], new[1])]
    if targets[0] is not None and targets[0] == targets[1]:  # one level, other features XLA's code may use
        lacks, adds = sorted(old[1] - new[1]), sorted(new[1] - old[1])
        parts = ([f"this CPU lacks {', '.join(lacks)}"] if lacks else []) + ([f"has {', '.join(adds)} more"] if adds else [])
        return f"cpu_target {targets[0].removeprefix(TARGET_MARK)}: {'; '.join(parts)}"
    if targets != [None, None]:  # one side keyed on a cpu_target: its entries are the target's
        named = [f"cpu_target {t.removeprefix(TARGET_MARK)}" if t else "a host's own ISA (cpu_target host)" for t in targets]
        return f"{named[0]} -> {named[1]}"
    hosts = [next((f for f in sorted(isa) if f.startswith(HOST_MARK)), None) for isa in (old[1], new[1])]
    if hosts != [None, None]:  # one side's ISA could not be read: its entries are its host's alone
        named = [f"host {host.removeprefix(HOST_MARK)} (its ISA could not be read)" if host else "a CPU whose ISA was read"
                 for host in hosts]
        return f"{named[0]} -> {named[1]}" if named[0] != named[1] else f"{named[0]}, with another machine id"
    marked = [CPUID_MARK in isa for isa in (old[1], new[1])]
    if marked[0] != marked[1]:  # the same CPU read two ways: gkx-autocache before and after issue 67
        named = ["its CPUID" if m else "the kernel's flags" for m in marked]
        return (f"the key's ISA read from {named[0]} -> from {named[1]} (gkx-autocache reads CPUID since 2026-12: "
                "each CPU entry is compiled once again)")
    lacks, adds = sorted(old[1] - new[1]), sorted(new[1] - old[1])
    parts = ([f"this CPU lacks {', '.join(lacks)}"] if lacks else []) + ([f"has {', '.join(adds)} more"] if adds else [])
    return "; ".join(parts) or "the same features in another order"


def covers(features: frozenset[str], wanted: str) -> bool:
    """Whether an entry's ``+wanted`` feature is covered by a key that holds ``features``."""
    return wanted in features or wanted in UNRESTRICTED or wanted.startswith(TUNING_PREFIXES)
