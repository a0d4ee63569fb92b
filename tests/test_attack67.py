"""Attacks on issue 67's fixes (SPEC §8, §15, amended 2026-12-06, second): CPU keys read from CPUID,
an entry's features read from XLA's own target-machine record, XLA's caches judged at each compile,
JAX's own cap without filelock. Each test fails where the attack works (each failed on c232bde)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import cpus
import pytest
from conftest import COUNTING, PROGRAM, Venv, autocache_warnings, run_program
from test_activation import VERSION_DIR
from test_cpu_target import executable, llvm_list, protobuf

from gkx_autocache import _cpu_target, _cpuid

x86_linux = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64") or not sys.platform.startswith("linux"),
                               reason="CPUID is read on x86-64 Linux only")

# XLA's own record, as jaxlib writes it (triple, CPU, LLVM's list), and a constant of the program's
# that spells a list with features this CPU lacks (a model file's bytes).
RECORD = protobuf(1, b"x86_64-unknown-linux-gnu") + protobuf(2, b"haswell") + protobuf(3, llvm_list("sse2", "avx2", "gfni"))
PLANTED = llvm_list("sse2", "avx2", "xop", "fma4", "tbm")


# -- M1 again: the record is found only where the executable has a header --------------------------------


def without_header(name: bytes, constant: bytes) -> bytes:
    """A decompressed entry as jaxlib 0.9.0 lays it out (measured: JAX 0.9.0, Python 3.11): JAX's
    compile time, then the executable's protobuf at once (no length-prefixed ``pjrt_ifrt`` header, which
    0.10.2 and 0.12 write): its module (named ``jit_<name>``, an instruction's literal holding
    ``constant``) and XLA's target-machine record beside it."""
    module = protobuf(1, protobuf(1, b"jit_" + name) + protobuf(3, protobuf(2, protobuf(8, constant))))
    return b"\0\0\0\0" + protobuf(1, module + protobuf(9, RECORD)) + protobuf(2, b"compile options")


@pytest.mark.parametrize("name", [b"train_step", b"loss_fn", b"model"])
def test_a_programs_data_never_decides_an_entrys_features_on_a_line_without_the_header(name: bytes) -> None:
    """`features_of` reads the first varint after the compile time as a header's length. jaxlib 0.9.0
    (cpu_target is used from 0.8.2) writes no header: that byte is the executable's first key (0x0a,
    10), so the walk starts 10 bytes into the module's name and, for most names, finds no record and
    falls back to the byte scan of every list, the program's constants included. Measured with JAX
    0.9.0 under x86-64-v3, the `planted list` program of test_cpu_target (a `jit` closing over bytes
    spelling `+xop`) named `train_step`, `model`, `loss_fn`, `update` or `apply`: its own entry is
    `rejected` on every warm run ("built for xop, which this CPU lacks"); named `f` or `g` it loads.
    With a 100 MB constant the fallback scan took 24 s a lookup (warm run 23.7 s and 32.2 s where
    `host` takes 2.3 s). Here: that layout, built by hand."""
    payload = without_header(name, PLANTED * 4)
    assert _cpu_target.features_of(payload) == {"sse2", "avx2", "gfni"}
    target = _cpu_target.Target("x86-64-v3", "x86_64", frozenset(_cpu_target.LEVELS["x86-64-v3"][1]) | {"gfni"})
    assert target.foreign(payload) is None  # the program's own entry, on the host that wrote it


def test_a_deeply_nested_field_never_raises_out_of_the_check() -> None:
    """`_records` recurses once per nested length-delimited field that holds `+sse2,`, with no depth
    bound, and `features_of` catches only ValueError and IndexError: 2,000 nested fields (6 KB) raise
    RecursionError out of `Target.foreign`, through the store's read, into JAX, which warns "Error reading
    persistent compilation cache entry for 'jit_f': RecursionError" (an error under `-W error`, or with
    jax_raise_persistent_cache_errors) and compiles; the lookup is counted neither as a hit nor as a miss.
    Reached by a changed entry in a team directory (measured: JAX 0.10.2, x86-64-v3), or by any string
    XLA keeps on the path the walk follows (debug options: XLA_FLAGS's --xla_gpu_cuda_data_dir)."""
    nested = b"+sse2,"
    for _ in range(2000):
        nested = protobuf(1, nested)
    payload = executable(RECORD, nested)
    assert _cpu_target.features_of(payload) == {"sse2", "avx2", "gfni"}
    target = _cpu_target.Target("x86-64-v3", "x86_64", frozenset(_cpu_target.LEVELS["x86-64-v3"][1]) | {"gfni"})
    assert target.foreign(payload) is None


# -- the key read from CPUID --------------------------------------------------------------------------


@x86_linux
def test_the_cpuid_driver_is_read_with_the_state_the_os_enabled(tmp_path: Path) -> None:
    """Read through /dev/cpu/0/cpuid (root), XCR0 is taken as what the CPU can save (leaf 0xD), while
    LLVM, and the helper every other user runs, ask XGETBV what the OS enabled. They differ wherever the
    kernel enables less than the CPU can save: AMX on Sapphire Rapids under Linux before 5.16 (Ubuntu
    22.04's 5.15), AVX-512 under clearcpuid=avx512f, AVX and everything above it under
    gather_data_sampling=force. Root's key then lists features XLA's code cannot use there (root and a
    user of one host key apart), and equals the key of a host that can: root loads that host's entries,
    whose instructions fault (SIGILL) where the OS has not enabled their state. Here: this CPU as the
    driver would show it if it could also save AMX state, which this OS (XGETBV) does not enable."""
    got = _cpuid._helper()
    if got is None:
        pytest.skip("CPUID cannot be run here")
    regs, os_xcr0 = dict(got[0]), got[1]
    if os_xcr0 is None or os_xcr0 & (3 << 17):
        pytest.skip("this OS enables AMX state (or no XSAVE): nothing to tell apart")
    eax, ebx, ecx, edx = regs[7, 0]
    regs[7, 0] = (eax, ebx, ecx, edx | 1 << 22 | 1 << 24 | 1 << 25)  # amx-bf16, amx-tile, amx-int8
    eax, ebx, ecx, edx = regs[0xD, 0]
    regs[0xD, 0] = (eax | 3 << 17, ebx, ecx, edx)  # the CPU can save the tile state; the OS did not enable it
    as_llvm_reads_it = _cpuid.features(regs, os_xcr0)
    assert "amx-tile" not in as_llvm_reads_it
    found, how = _cpuid.read("x86_64", device=str(cpus.serve(regs, tmp_path / "cpuid")))  # (FUSE: the driver's layout)
    assert how.startswith("CPUID, through"), how
    assert found == as_llvm_reads_it, sorted(set(found or []) ^ set(as_llvm_reads_it))


@x86_linux
def test_a_fifo_where_the_cpuid_driver_is_expected_does_not_hang_import_jax(tmp_path: Path) -> None:
    """`_device` opens the driver's path O_RDONLY, blocking, with no check that it is a character
    device: a FIFO there (bound over /dev/cpu/0/cpuid in a container, by root) makes every `import jax`
    with the package hang for good (measured: `unshare -m`, `mount --bind fifo /dev/cpu/0/cpuid`,
    `_isa.read()` still waiting after 8 s). Here: the same through `read`'s device argument."""
    fifo = tmp_path / "cpuid"
    os.mkfifo(fifo)
    code = f"from gkx_autocache import _cpuid; print(_cpuid.read('x86_64', device={str(fifo)!r})[1])"
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail("reading CPUID hung on a FIFO at the driver's path")
    assert proc.returncode == 0 and proc.stdout.strip() == "CPUID", proc.stdout + proc.stderr


# -- M2 again: the first compile's options, between the guard and the routing ----------------------------

RACE = r"""
import json, os
import jax, jax.numpy as jnp
from jax._src import cache_key, compiler

seen = []
name = "backend_compile_and_load" if hasattr(compiler, "backend_compile_and_load") else "backend_compile"
original = getattr(compiler, name)

def spy(*args, **kwargs):  # what XLA is handed: the options JAX's compile ends with
    options = next(a for a in (*args, *kwargs.values()) if hasattr(a, "executable_build_options"))
    debug = options.executable_build_options.debug_options
    seen.extend(os.path.abspath(p) for p in (debug.xla_gpu_kernel_cache_file, debug.xla_gpu_per_fusion_autotune_cache_dir) if p)
    return original(*args, **kwargs)

setattr(compiler, name, spy)
refused = os.environ["REFUSED"]
jax.config.update("jax_compilation_cache_dir", refused)
key = cache_key.get

def get(*args, **kwargs):  # another user's mkdir lands while JAX computes the first key
    if not os.path.exists(refused):
        os.mkdir(refused, 0o755)
        os.chown(refused, 1002, 1002)
    return key(*args, **kwargs)

cache_key.get = get
jax.jit(lambda x: x + 1.0)(jnp.ones(3)).block_until_ready()
jax.jit(lambda x: x * 2.0)(jnp.ones(3)).block_until_ready()
print(json.dumps(sorted(set(seen))))
"""


def test_xlas_caches_of_a_directory_made_while_the_first_key_is_computed(venv: Venv, tmp_path: Path) -> None:
    """The guard judges XLA's paths before JAX routes its directory, as the commit says (`is_cache_used`
    first), but `is_cache_used` routes nothing on JAX 0.10.2 or 0.12 (it only sets a flag): the directory
    is set up at the first lookup, after the key. A directory that does not exist yet passes the guard
    ("judged where it would be made", not remembered), and one another user makes while JAX computes
    the first key (for a large model, that hashing takes a while) is refused at routing, with the one
    warning, but that compile's options still send XLA's kernel cache file and autotune directory into
    it (measured on 0.10.2 and 0.12: both paths into uid 1002's directory). Later compiles are kept out.
    Fixed by making the directory where it is judged, as JAX would at its first use: the guard's,
    this user's, so that the other user's mkdir finds it there; and where the other's came first, no
    path into it."""
    refused = tmp_path / "jax_cache"
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "ours"), "GKX_JAX_CACHE_XLA_CACHES": "all", "REFUSED": str(refused)}
    proc = venv.run("-c", RACE, env=env)
    assert proc.returncode == 0, proc.stderr
    paths = json.loads(proc.stdout.strip().splitlines()[-1])
    if refused.stat().st_uid == 1002:  # the other's mkdir came first after all: refused, and no path into it
        assert len(autocache_warnings(proc.stderr)) == 1, proc.stderr
        assert not [p for p in paths if p.startswith(str(refused))], paths
    else:  # the guard made it, as JAX would have at its first use: this user's, private
        assert refused.stat().st_uid == os.getuid() and refused.stat().st_mode & 0o077 == 0, oct(refused.stat().st_mode)
        assert not autocache_warnings(proc.stderr), proc.stderr


# -- JAX's own cap ------------------------------------------------------------------------------------------

NO_FILELOCK = "import sys\nsys.modules['filelock'] = None  # (filelock is not installed)\n"


def test_a_negative_jax_cap_without_filelock_is_said_as_zero_is(venv: Venv, tmp_path: Path) -> None:
    """JAX's LRU cache caches nothing at any size but -1 that no entry fits (`len(val) > max_size`): a
    negative jax_compilation_cache_max_size, as 0. The package says so for 0 only; at -5 the store
    keeps "-5 bytes" as its cap (status: "it keeps jax_compilation_cache_max_size (-5 bytes) as its
    cap"): every run writes each entry and deletes it at exit (`0 hits, 4 misses (4 evicted)`), with
    no warning and no word that nothing is cached."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "JAX_COMPILATION_CACHE_MAX_SIZE": "-5"}
    proc = venv.run("-c", NO_FILELOCK + PROGRAM, env=env)
    assert proc.returncode == 0, proc.stderr
    said = autocache_warnings(proc.stderr)
    assert len(said) == 1 and "nothing is cached" in said[0], said
    status = json.loads(venv.cli("--json", "status", env=env).stdout)
    assert "nothing is cached" in status["store"]["reason"], status["store"]


CAP_AFTER_IMPORT = NO_FILELOCK + r"""
import json
import jax, jax.numpy as jnp
jax.config.update("jax_compilation_cache_max_size", 100000)  # as JAX's guide sets its options
""" + COUNTING + r"""
steps = [jax.jit(lambda v, i=i: jnp.sin(v) * i + jnp.cos(v @ v.T).sum()) for i in range(40)]
x = jnp.ones((16, 16))
print(json.dumps({**counts, "result": sum(float(f(x).sum()) for f in steps)}))
"""


def test_jaxs_own_cap_set_after_import_is_kept_by_the_store(venv: Venv, tmp_path: Path) -> None:
    """Without filelock the store serves JAX's directory "with that size as its cap", read once, at
    `import jax`, from JAX_COMPILATION_CACHE_MAX_SIZE. The same size set the way JAX's guide sets its
    options, `jax.config.update("jax_compilation_cache_max_size", 20000)` after import, is not seen:
    the store serves with its own 5 GiB default, and the directory stays over 20000 bytes (measured:
    44 KB of 4 entries, with 0 it caches everything too). Here 100000 bytes, which some 150 KB of
    entries exceed: the cap is kept with entries in it (the package's bookkeeping is charged up to
    64 KiB of a cap, so a cap of 20000 keeps none)."""
    cache = tmp_path / "c"
    env = {"GKX_JAX_CACHE_DIR": str(cache)}
    cold, _ = run_program(venv, env=env, program=CAP_AFTER_IMPORT)
    warm, _ = run_program(venv, env=env, program=CAP_AFTER_IMPORT)
    left = list((cache / VERSION_DIR).glob("*-cache"))
    assert left and sum(p.stat().st_size for p in left) <= 100000, sum(p.stat().st_size for p in left)


FAKE_FILELOCK = textwrap.dedent("""
    class FileLock:
        def __init__(self, path, *args, **kwargs):
            self.path = path
        def acquire(self, timeout=None):
            return self
        def release(self):
            pass
    SoftFileLock = FileLock
    class Timeout(Exception):
        pass
""")


def test_with_filelock_a_zero_cap_is_not_said_to_serve(venv: Venv, tmp_path: Path) -> None:
    """With filelock installed, jax_compilation_cache_max_size = 0 is handed to JAX's LRU cache, which
    caches nothing and warns at every compile ("exceeds the maximum cache size of 0 bytes": an error,
    a traceback, under -W error), while `status` says "JAX's own LRU cache serves" and the report line
    gives misses with no cause: the case issue 67 names ("say in one line, in status, the report and
    explain, that nothing is cached"), left where filelock is present."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "filelock.py").write_text(FAKE_FILELOCK)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "JAX_COMPILATION_CACHE_MAX_SIZE": "0", "PYTHONPATH": str(site),
           "GKX_JAX_CACHE_REPORT": "1"}
    out, err = run_program(venv, env=env)
    out, err = run_program(venv, env=env)
    assert out["hits"] == 0  # (JAX caches nothing at 0)
    status = json.loads(venv.cli("--json", "status", env=env).stdout)
    assert "nothing is cached" in status["store"]["reason"], status["store"]
    assert any("nothing is cached" in line for line in autocache_warnings(err)), err


# -- L10: what an unsigned seal still decides ------------------------------------------------------------


def test_an_unsigned_seals_compile_time_is_not_taken_as_the_entrys(venv: Venv, tmp_path: Path) -> None:
    """Since c232bde an unsigned seal (or a directory level's sidecar) no longer bounds a read, being
    "anyone's claim", but its compile time is still taken as the entry's: backfilled into the local
    level's sidecar and counted as compile time avoided at every hit. A level whose seals and sidecars
    claim 250 s (the entries compiled in 0.01-0.08 s): measured `999.81 s compile CPU time avoided` on
    the reader's run, again on each warm run, and `stats`: "33.3 min compile CPU time avoided",
    "costliest compiles: 250.000 jit_f ...". Here: the report line of the reader's two runs."""
    import re

    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    writer = {"GKX_JAX_CACHE_DIR": str(tmp_path / "w"), "GKX_JAX_CACHE_SHARED": str(shared)}
    run_program(venv, env=writer)
    claimed = 0
    for seal in (shared / VERSION_DIR).glob("*-gkx-shared"):
        seal.write_text(re.sub(r'"compile":\s*[0-9.e-]+', '"compile":250.0', seal.read_text()))
        claimed += 1
    for sidecar in (shared / VERSION_DIR).glob("*-gkx-compile"):
        sidecar.write_text("250.000000")
    assert claimed > 0
    reader = {"GKX_JAX_CACHE_DIR": str(tmp_path / "r"), "GKX_JAX_CACHE_SHARED": str(shared), "GKX_JAX_CACHE_REPORT": "1"}
    for _ in range(2):
        out, err = run_program(venv, env=reader)
        assert out["hits"] == out["requests"] > 0, out
        line = next(w for w in autocache_warnings(err) if "compile CPU time avoided" in w)
        avoided = float(re.search(r"([0-9.]+) s compile CPU time avoided", line)[1])  # type: ignore[index]
        assert avoided < 60, line


# -- AVX10 and APX under a level ----------------------------------------------------------------------------


@pytest.mark.parametrize("cap", ["AVX2", "AVX512"])
def test_what_xla_keeps_under_a_cap_is_what_its_cap_keeps(cap: str) -> None:
    """`xla_keeps` says APX's features (egpr, ndd, ccmp, nf, zu, ppx, push2pop2) are off under every
    cap (`_APX_AND_LATER`), but XLA's ShouldEnableX86CpuFeature (xla/backends/cpu/codegen/cpu_features.cc)
    turns off only AVX-512's generation, VNNI, BF16 and AMX: APX, which implies none of them in LLVM,
    stays on, and LLVM allocates r16-r31 where +egpr is on. Today an APX host's key differs all the same,
    by `cf`, which the list leaves out; with `cf` added as its siblings, an APX host and a host without
    APX would share a level's key and refuse each other's entries (`built for egpr`), each replacing
    the other's."""
    for feature in ("egpr", "ndd", "ccmp", "nf", "zu", "ppx", "push2pop2", "cf"):
        assert _cpu_target.xla_keeps(feature, cap), feature
