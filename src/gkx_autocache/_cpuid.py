"""What an x86-64 CPU says it has (SPEC §15, amended 2026-12-06): its CPUID, under LLVM's names, as
XLA's code generator reads it (LLVM's ``sys::getHostCPUFeatures``), whatever the kernel's flags say.

A kernel older than its CPU lists no flag it does not know (``avx10.1`` and ``prefetchi`` on an
Intel Xeon, issue 67), and one may hide a flag it distrusts (``rdseed`` on some AMD parts); LLVM
asks the CPU, so an entry lists them. Two ways to ask it, neither touching the program's data:

- ``/dev/cpu/0/cpuid`` (the kernel's cpuid driver; readable by root): a read at offset
  ``leaf | subleaf << 32`` is the four registers;
- a 45-byte helper in this process's memory, mapped writable, then executable and never both:
  the two instructions LLVM runs, CPUID and XGETBV (XGETBV only where CPUID says the OS enabled it),
  which tells the state the OS saves (XCR0) also where the driver gives the registers.

Where neither can be read (another machine, a kernel that refuses executable memory), None: the
kernel's flags stand in (``_isa``). A leaf: stdlib only, imported on ``import jax`` where the ISA is read.
"""

from __future__ import annotations

import os
import sys

DEVICE = "/dev/cpu/0/cpuid"
EAX, EBX, ECX, EDX = range(4)
Registers = dict[tuple[int, int], tuple[int, int, int, int]]

# (leaf, subleaf, register, bit, LLVM's name, the OS state it needs: "" none, "avx", "avx512", "amx"),
# as LLVM's getHostCPUFeatures reads them (llvm/lib/TargetParser/Host.cpp, 2026).
BITS = (
    (1, 0, EDX, 0, "x87", ""),  # (LLVM implies it of every x86-64 CPU, and lists it of none: the levels name it)
    (1, 0, EDX, 8, "cx8", ""), (1, 0, EDX, 15, "cmov", ""), (1, 0, EDX, 23, "mmx", ""), (1, 0, EDX, 24, "fxsr", ""),
    (1, 0, EDX, 25, "sse", ""), (1, 0, EDX, 26, "sse2", ""), (1, 0, ECX, 0, "sse3", ""), (1, 0, ECX, 1, "pclmul", ""),
    (1, 0, ECX, 9, "ssse3", ""), (1, 0, ECX, 13, "cx16", ""), (1, 0, ECX, 19, "sse4.1", ""),
    (1, 0, ECX, 20, "sse4.2", ""), (1, 0, ECX, 20, "crc32", ""), (1, 0, ECX, 22, "movbe", ""),
    (1, 0, ECX, 23, "popcnt", ""), (1, 0, ECX, 25, "aes", ""), (1, 0, ECX, 30, "rdrnd", ""),
    (1, 0, ECX, 28, "avx", "avx"), (1, 0, ECX, 12, "fma", "avx"), (1, 0, ECX, 26, "xsave", "avx"),
    (1, 0, ECX, 29, "f16c", "avx"),
    (0x80000001, 0, ECX, 0, "sahf", ""), (0x80000001, 0, ECX, 5, "lzcnt", ""), (0x80000001, 0, ECX, 6, "sse4a", ""),
    (0x80000001, 0, ECX, 8, "prfchw", ""), (0x80000001, 0, ECX, 11, "xop", "avx"), (0x80000001, 0, ECX, 15, "lwp", ""),
    (0x80000001, 0, ECX, 16, "fma4", "avx"), (0x80000001, 0, ECX, 21, "tbm", ""),
    (0x80000001, 0, ECX, 29, "mwaitx", ""), (0x80000001, 0, EDX, 29, "64bit", ""),
    (0x80000008, 0, EBX, 0, "clzero", ""), (0x80000008, 0, EBX, 4, "rdpru", ""), (0x80000008, 0, EBX, 9, "wbnoinvd", ""),
    (7, 0, EBX, 0, "fsgsbase", ""), (7, 0, EBX, 2, "sgx", ""), (7, 0, EBX, 3, "bmi", ""), (7, 0, EBX, 5, "avx2", "avx"),
    (7, 0, EBX, 8, "bmi2", ""), (7, 0, EBX, 10, "invpcid", ""), (7, 0, EBX, 11, "rtm", ""),
    (7, 0, EBX, 16, "avx512f", "avx512"), (7, 0, EBX, 17, "avx512dq", "avx512"), (7, 0, EBX, 18, "rdseed", ""),
    (7, 0, EBX, 19, "adx", ""), (7, 0, EBX, 21, "avx512ifma", "avx512"), (7, 0, EBX, 23, "clflushopt", ""),
    (7, 0, EBX, 24, "clwb", ""), (7, 0, EBX, 28, "avx512cd", "avx512"), (7, 0, EBX, 29, "sha", ""),
    (7, 0, EBX, 30, "avx512bw", "avx512"), (7, 0, EBX, 31, "avx512vl", "avx512"),
    (7, 0, ECX, 1, "avx512vbmi", "avx512"), (7, 0, ECX, 4, "pku", ""), (7, 0, ECX, 5, "waitpkg", ""),
    (7, 0, ECX, 6, "avx512vbmi2", "avx512"), (7, 0, ECX, 7, "shstk", ""), (7, 0, ECX, 8, "gfni", ""),
    (7, 0, ECX, 9, "vaes", "avx"), (7, 0, ECX, 10, "vpclmulqdq", "avx"), (7, 0, ECX, 11, "avx512vnni", "avx512"),
    (7, 0, ECX, 12, "avx512bitalg", "avx512"), (7, 0, ECX, 14, "avx512vpopcntdq", "avx512"),
    (7, 0, ECX, 22, "rdpid", ""), (7, 0, ECX, 23, "kl", ""), (7, 0, ECX, 25, "cldemote", ""),
    (7, 0, ECX, 27, "movdiri", ""), (7, 0, ECX, 28, "movdir64b", ""), (7, 0, ECX, 29, "enqcmd", ""),
    (7, 0, EDX, 5, "uintr", ""), (7, 0, EDX, 8, "avx512vp2intersect", "avx512"), (7, 0, EDX, 14, "serialize", ""),
    (7, 0, EDX, 16, "tsxldtrk", ""), (7, 0, EDX, 18, "pconfig", ""), (7, 0, EDX, 22, "amx-bf16", "amx"),
    (7, 0, EDX, 23, "avx512fp16", "avx512"), (7, 0, EDX, 24, "amx-tile", "amx"), (7, 0, EDX, 25, "amx-int8", "amx"),
    (7, 1, EAX, 0, "sha512", ""), (7, 1, EAX, 1, "sm3", ""), (7, 1, EAX, 2, "sm4", ""), (7, 1, EAX, 3, "raoint", ""),
    (7, 1, EAX, 4, "avxvnni", "avx"), (7, 1, EAX, 5, "avx512bf16", "avx512"), (7, 1, EAX, 7, "cmpccxadd", ""),
    (7, 1, EAX, 21, "amx-fp16", "amx"), (7, 1, EAX, 22, "hreset", ""), (7, 1, EAX, 23, "avxifma", "avx"),
    (7, 1, EAX, 31, "movrs", ""), (7, 1, EDX, 4, "avxvnniint8", "avx"), (7, 1, EDX, 5, "avxneconvert", "avx"),
    (7, 1, EDX, 8, "amx-complex", "amx"), (7, 1, EDX, 10, "avxvnniint16", "avx"), (7, 1, EDX, 14, "prefetchi", ""),
    (7, 1, EDX, 15, "usermsr", ""),
    *((7, 1, EDX, 21, apx, "") for apx in ("egpr", "push2pop2", "ppx", "ndd", "ccmp", "nf", "cf", "zu")),
    (0xD, 1, EAX, 0, "xsaveopt", "avx"), (0xD, 1, EAX, 1, "xsavec", "avx"), (0xD, 1, EAX, 3, "xsaves", "avx"),
    (0x14, 0, EBX, 4, "ptwrite", ""), (0x19, 0, EBX, 2, "widekl", ""),
    (0x1E, 1, EAX, 4, "amx-fp8", "amx"), (0x1E, 1, EAX, 5, "amx-transpose", "amx"), (0x1E, 1, EAX, 6, "amx-tf32", "amx"),
    (0x1E, 1, EAX, 7, "amx-avx512", "amx"), (0x1E, 1, EAX, 8, "amx-movrs", "amx"),
)
AVX10 = (7, 1, EDX, 19)  # AVX10 at all; its version is leaf 0x24's EBX, low byte
# Every (leaf, subleaf) read: the maxima, the bits above, AVX10's version, and what the CPU can save (0xD).
LEAVES = sorted({(0, 0), (1, 0), (7, 0), (0xD, 0), (0x24, 0), (0x80000000, 0), *((b[0], b[1]) for b in BITS)})


def features(regs: Registers, xcr0: int | None) -> list[str]:
    """LLVM's names for what the registers of CPUID show (``regs``: ``{(leaf, subleaf): (eax, ebx,
    ecx, edx)}``), where the OS saves the state each needs (``xcr0``: the XCR0 register, None where
    the OS enabled no XSAVE), sorted."""
    def get(leaf: int, subleaf: int = 0) -> tuple[int, int, int, int]:
        return regs.get((leaf, subleaf), (0, 0, 0, 0))

    max_level, max_ext, leaf1 = get(0)[EAX], get(0x80000000)[EAX], get(1)
    if max_level < 1:
        return []
    saved = xcr0 if xcr0 is not None and leaf1[ECX] >> 27 & 1 else 0
    avx = saved & 0x6 == 0x6 and bool(leaf1[ECX] >> 28 & 1)
    states = {"": True, "avx": avx, "avx512": avx and saved & 0xE0 == 0xE0, "amx": saved & (3 << 17) == 3 << 17}

    def present(leaf: int, subleaf: int) -> bool:
        if (leaf, subleaf) == (7, 1):  # leaf 7's EAX is its last subleaf: some CPUs answer garbage past it
            return max_level >= 7 and get(7)[EAX] >= 1
        return leaf <= (max_ext if leaf >= 0x80000000 else max_level)

    found = {name for leaf, subleaf, register, bit, name, state in BITS
             if states[state] and present(leaf, subleaf) and get(leaf, subleaf)[register] >> bit & 1}
    leaf, subleaf, register, bit = AVX10
    if present(leaf, subleaf) and get(leaf, subleaf)[register] >> bit & 1 and present(0x24, 0):
        found.update(f"avx10.{n}" for n in (1, 2) if get(0x24)[EBX] & 0xFF >= n)
    return sorted(found)


def _device(path: str) -> tuple[Registers, int | None] | None:
    """The kernel's cpuid driver, where this process may read it: its registers, and as XCR0 the
    state the CPU can save (leaf 0xD, which Linux enables, though not always all of it: ``read``
    asks XGETBV where it can). Only a character device (or, for tests, a file) is read: a FIFO put
    there must not hold ``import jax``."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    regs: Registers = {}
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISCHR(mode) or stat.S_ISREG(mode)):
            return None
        for leaf, subleaf in LEAVES:
            data = os.pread(fd, 16, leaf | subleaf << 32)
            if len(data) != 16:
                raise OSError(f"{path} gave {len(data)} bytes for leaf {leaf:#x}")
            regs[leaf, subleaf] = (int.from_bytes(data[0:4], "little"), int.from_bytes(data[4:8], "little"),
                                   int.from_bytes(data[8:12], "little"), int.from_bytes(data[12:16], "little"))
    finally:
        os.close(fd)
    can_save = regs[0xD, 0][EAX] | regs[0xD, 0][EDX] << 32 if regs[0, 0][EAX] >= 0xD else 0
    return regs, can_save


# x86-64 System V: cpuid(leaf: edi, subleaf: esi, out: rdx -> four uint32), rbx kept; xgetbv(index:
# edi) -> rax (edx:eax).
_CPUID = bytes.fromhex("53" "4989d0" "89f8" "89f1" "0fa2" "418900" "41895804" "41894808" "4189500c" "5b" "c3")
_XGETBV = bytes.fromhex("89f9" "0f01d0" "48c1e220" "4809d0" "c3")


def _helper() -> tuple[Registers, int | None] | None:
    """CPUID and XGETBV run in this process (x86-64 Linux), or None where executable memory is
    refused (SELinux's execmem, a hardened kernel: where XLA's own JIT cannot run either)."""
    import ctypes  # (numpy, and so JAX, has imported it already)
    import mmap

    libc = ctypes.CDLL(None)
    pointer, size_t, int_ = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    map_ = ctypes.CFUNCTYPE(pointer, pointer, size_t, int_, int_, int_, ctypes.c_long)(("mmap", libc))
    protect = ctypes.CFUNCTYPE(int_, pointer, size_t, int_)(("mprotect", libc))
    unmap = ctypes.CFUNCTYPE(int_, pointer, size_t)(("munmap", libc))
    size = mmap.PAGESIZE
    page = map_(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if page is None or page == ctypes.c_void_p(-1).value:
        return None
    try:
        ctypes.memmove(page, _CPUID + _XGETBV, len(_CPUID) + len(_XGETBV))
        if protect(page, size, mmap.PROT_READ | mmap.PROT_EXEC) != 0:  # written, then executable: never both
            return None
        out = (ctypes.c_uint32 * 4)()
        cpuid = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p)(page)
        regs: Registers = {}
        for leaf, subleaf in LEAVES:
            cpuid(leaf, subleaf, ctypes.addressof(out))
            regs[leaf, subleaf] = (out[0], out[1], out[2], out[3])
        xcr0 = None
        if regs[0, 0][EAX] >= 1 and regs[1, 0][ECX] >> 27 & 1:  # OSXSAVE: XGETBV is there (else it faults)
            xcr0 = int(ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint32)(page + len(_CPUID))(0))
    finally:
        unmap(page, size)
    return regs, xcr0


def read(machine: str, device: str | None = None) -> tuple[list[str] | None, str]:
    """``(LLVM's names for this CPU's features, how they were read)``, or ``(None, why not)``. The
    driver's registers where it can be read, with the state the OS enabled as XGETBV says it (LLVM's
    question: a kernel may enable less than the CPU can save, AMX before Linux 5.16); else both
    from the helper."""
    device = device or DEVICE
    if machine not in ("x86_64", "AMD64") or not sys.platform.startswith("linux"):
        return None, f"CPUID is read on x86-64 Linux only (this is {machine}, {sys.platform})"
    why = "no readable cpuid driver, and executable memory refused"
    helper: tuple[Registers, int | None] | None = None
    try:
        helper = _helper()
    except (OSError, ValueError, AttributeError, TypeError, ImportError) as exc:
        why = f"CPUID failed ({exc})"
    try:
        driver = _device(device)
    except (OSError, ValueError) as exc:
        driver, why = None, f"CPUID, through {device}, failed ({exc})"
    if driver is not None and (found := features(driver[0], helper[1] if helper is not None else driver[1])):
        return found, f"CPUID, through {device}"
    if helper is not None and (found := features(*helper)):
        return found, "CPUID"
    return None, f"CPUID cannot be read here ({why})"
