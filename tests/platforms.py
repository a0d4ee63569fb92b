"""macOS and Windows as the package would see them, simulated on Linux (issue 46): no machine here
runs either, so a child process deletes what the platform lacks before the package is imported,
then says it is that platform (``sys.platform``, ``os.name``). What the shim cannot remove, it
makes fail loudly: on Windows an ``os.open`` of a directory is refused (as Windows refuses it), a
file opened without ``O_BINARY`` is an error (Windows would translate its bytes), and ``os.kill``
(which on Windows ends the process it names) is an error.

``run(platform, code, env)`` runs ``code`` under the shim in a child of this Python. JAX is imported
before the shim (its own start-up reads the platform), with the package's hook off; ``code``
configures through ``gkx_autocache._configure.configure(jax)`` (``CONFIGURE``), as the hook
would, and JAX then compiles with the platform's API still missing (``unshim`` gives back only its
name): a POSIX call of the package's on the compile path fails there as it would on the platform.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")

# What macOS's sysctl prints, as data (Apple's documented names: "Determining Instruction Set
# Characteristics"): an M-series Mac's `sysctl hw.optional`, and an Intel Mac's.
M_SERIES = {
    "hw.optional": """hw.optional.arm.FEAT_FlagM: 1
hw.optional.arm.FEAT_FlagM2: 1
hw.optional.arm.FEAT_FHM: 1
hw.optional.arm.FEAT_DotProd: 1
hw.optional.arm.FEAT_SHA3: 1
hw.optional.arm.FEAT_RDM: 1
hw.optional.arm.FEAT_LSE: 1
hw.optional.arm.FEAT_SHA256: 1
hw.optional.arm.FEAT_SHA512: 1
hw.optional.arm.FEAT_SHA1: 1
hw.optional.arm.FEAT_AES: 1
hw.optional.arm.FEAT_PMULL: 1
hw.optional.arm.FEAT_SPECRES: 0
hw.optional.arm.FEAT_SB: 1
hw.optional.arm.FEAT_FRINTTS: 1
hw.optional.arm.FEAT_LRCPC: 1
hw.optional.arm.FEAT_LRCPC2: 1
hw.optional.arm.FEAT_FCMA: 1
hw.optional.arm.FEAT_JSCVT: 1
hw.optional.arm.FEAT_PAuth: 1
hw.optional.arm.FEAT_DPB: 1
hw.optional.arm.FEAT_DPB2: 1
hw.optional.arm.FEAT_BF16: 0
hw.optional.arm.FEAT_I8MM: 0
hw.optional.arm.FEAT_LSE2: 1
hw.optional.arm.FEAT_FP16: 1
hw.optional.arm.FEAT_SSBS: 1
hw.optional.arm.FEAT_BTI: 1
hw.optional.arm.FEAT_SME: 0
hw.optional.floatingpoint: 1
hw.optional.AdvSIMD: 1
hw.optional.armv8_crc32: 1
hw.optional.breakpoint: 6
hw.optional.watchpoint: 4
hw.optional.neon: 1
hw.optional.arm64: 1
"""}
INTEL_MAC = {
    "hw.optional": """hw.optional.floatingpoint: 1
hw.optional.mmx: 1
hw.optional.sse: 1
hw.optional.sse2: 1
hw.optional.sse3: 1
hw.optional.supplementalsse3: 1
hw.optional.sse4_1: 1
hw.optional.sse4_2: 1
hw.optional.x86_64: 1
hw.optional.aes: 1
hw.optional.avx1_0: 1
hw.optional.avx2_0: 1
hw.optional.avx512f: 0
""",
    "machdep.cpu.features": "machdep.cpu.features: FPU VME DE PSE TSC MSR PAE MCE CX8 APIC SEP MTRR PGE MCA CMOV PAT "
                            "PSE36 CLFSH DS ACPI MMX FXSR SSE SSE2 SS HTT TM PBE SSE3 PCLMULQDQ DTES64 MON DSCPL VMX "
                            "EST TM2 SSSE3 FMA CX16 TPR PDCM SSE4.1 SSE4.2 x2APIC MOVBE POPCNT AES PCID XSAVE OSXSAVE "
                            "SEGLIM64 TSCTMR AVX1.0 RDRAND F16C",
    "machdep.cpu.leaf7_features": "machdep.cpu.leaf7_features: RDWRFSGS TSC_THREAD_OFFSET SGX BMI1 AVX2 SMEP BMI2 "
                                  "ERMS INVPCID FPU_CSDS MPX RDSEED ADX SMAP CLFSOPT IPT MDCLEAR TSXFA IBRS STIBP L1DF "
                                  "SSBD",
    "machdep.cpu.extfeatures": "machdep.cpu.extfeatures: SYSCALL XD 1GBPAGE EM64T LAHF LZCNT PREFETCHW RDTSCP TSCI",
}
FAKE_SYSCTL = r"""#!/usr/bin/env python3
import json, sys
data = json.load(open(sys.argv[0] + ".json"))
for name in sys.argv[1:]:  # as Apple's: the first unknown name ends the run
    if name not in data:
        print(f"sysctl: unknown oid '{name}'", file=sys.stderr)
        sys.exit(1)
    print(data[name].rstrip("\n"))
"""


_COMMON = """
import os, sys, errno, stat, subprocess, tempfile, pathlib, shutil, json, warnings, argparse, sysconfig
import importlib.metadata, platformdirs
sysconfig.get_paths(), tempfile.gettempdir()  # read once as this platform has them: both are kept
def unshim():  # before JAX compiles: see _WINDOWS
    pass
"""

_MACOS = """
# macOS: no O_PATH, no /proc; `sysctl` is the fake one on PATH.
del os.O_PATH
_real_open, _real_os_open = open, os.open
def _no_proc(path):
    return isinstance(path, str) and (path == "/proc" or path.startswith("/proc/"))
def _open(file, *a, **k):
    if _no_proc(file):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", file)
    return _real_open(file, *a, **k)
def _os_open(path, *a, **k):
    if _no_proc(path):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
    return _real_os_open(path, *a, **k)
import builtins; builtins.open, os.open = _open, _os_open
sys.platform = "darwin"
import platformdirs.macos
platformdirs.PlatformDirs = platformdirs.macos.MacOS
"""

_WINDOWS = """
# Windows: what the os module lacks there, deleted; what it does differently, made to fail.
_real = {"open": os.open, "platform": sys.platform, "name": os.name, "WindowsPath": pathlib.WindowsPath}
_gone = ["O_PATH", "O_NOFOLLOW", "O_DIRECTORY", "O_NONBLOCK", "O_CLOEXEC", "getuid", "geteuid", "getgid",
         "getegid", "getgroups", "fstatvfs", "statvfs", "fchown", "chown", "lchown", "fork", "getpgid",
         "sync", "fdatasync", "mkfifo", "getloadavg", "sched_getaffinity"]
if sys.version_info < (3, 13):
    _gone.append("fchmod")
for _name in _gone:
    if hasattr(os, _name):
        delattr(os, _name)
os.O_BINARY = 0x8000
tempfile._bin_openflags |= os.O_BINARY  # as tempfile sets it on Windows
os.supports_dir_fd = set()
for _module in ("fcntl", "pwd", "grp", "resource", "termios"):
    sys.modules[_module] = None
def _os_open(path, flags, mode=0o777, *, dir_fd=None):
    if dir_fd is not None:
        raise NotImplementedError("open: dir_fd unavailable on this platform")
    if os.path.isdir(path):
        raise PermissionError(errno.EACCES, "Permission denied", path)
    if not flags & os.O_BINARY:
        raise AssertionError(f"os.open({path!r}) without O_BINARY: Windows would translate its bytes")
    return _real["open"](path, flags & ~os.O_BINARY, mode)
def _kill(pid, sig):
    raise AssertionError(f"os.kill({pid}, {sig}): on Windows this ends the process")
os.open, os.kill = _os_open, _kill
shutil._use_fd_functions = False  # as on Windows
pathlib.WindowsPath = pathlib.PosixPath  # paths keep POSIX syntax: the shim is Windows' API, not its paths
sys.platform, os.name = "win32", "nt"
import platformdirs.windows
platformdirs.windows._RESOLVE_WIN_FOLDER = lambda name: os.environ["LOCALAPPDATA"]  # the shell's answer
platformdirs.PlatformDirs = platformdirs.windows.Windows
def unshim():  # the platform's name only: JAX, told it runs on Windows, writes Windows' paths; the API stays
    sys.platform, os.name = _real["platform"], _real["name"]  # Windows', so a POSIX call of the package's
    pathlib.WindowsPath = _real["WindowsPath"]                 # on JAX's compile path still fails
"""

SHIMS = {"macos": _MACOS, "windows": _WINDOWS}


def fake_sysctl(folder: Path, mac: dict[str, str]) -> str:
    """A folder holding a ``sysctl`` that answers as ``mac``'s does (``FAKE_SYSCTL``), for PATH."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sysctl").write_text(FAKE_SYSCTL)
    (folder / "sysctl").chmod(0o755)
    (folder / "sysctl.json").write_text(json.dumps(mac))
    return str(folder)


def script(platform: str, code: str, *, jax: bool = True) -> str:
    """``code`` under ``platform``'s shim, as ``python -c`` runs it (``run``)."""
    prelude = "import jax\n" if jax else ""
    return (f"{prelude}{_COMMON}{SHIMS[platform]}\n"
            "_asked = os.environ.pop('GKX_JAX_ASKED', None)\n"
            "os.environ.pop('GKX_JAX_CACHE', None)\n"
            "if _asked is not None: os.environ['GKX_JAX_CACHE'] = _asked\n"
            f"{code}")


def run(platform: str, code: str, env: dict[str, str], *, jax: bool = True,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``code`` in a child of this Python, as ``platform`` would run it. Its ``GKX_JAX_CACHE`` is
    0 while JAX is imported (the hook off: the shim configures), and what ``env`` says after."""
    child = {**env, "GKX_JAX_CACHE": "0", **({"GKX_JAX_ASKED": env["GKX_JAX_CACHE"]} if "GKX_JAX_CACHE" in env else {})}
    return subprocess.run([sys.executable, "-c", script(platform, code, jax=jax)], capture_output=True, text=True,
                          timeout=timeout, env=child if jax else env)


CONFIGURE = """
from gkx_autocache import _configure
_configure.configure(jax)
unshim()
import jax.numpy as jnp
print("DIR", jax.config.jax_compilation_cache_dir)
print(jax.jit(lambda x: jnp.sin(x) * 2 + 1)(jnp.arange(3.0)).sum())
"""

CLI = """
from gkx_autocache._cli.main import main
code = main(ARGS)
sys.stdout.flush()
print(f"exit {code}")
"""


def cli(platform: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``gkx-autocache ARGS`` as ``platform`` would run it (no JAX imported: the CLI never does)."""
    return run(platform, f"ARGS = {args!r}\n{CLI}", env, jax=False)


