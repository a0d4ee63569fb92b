"""Across machines (SPEC §15): CPU entries are keyed by the host's instruction set, so an entry is
never loaded on a CPU that cannot run it. Another CPU is a fake CPUID and ``/proc/cpuinfo``,
bind-mounted in a private mount namespace (``unshare -m``, as root: ``cpus.py``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
import zlib
from pathlib import Path
from typing import Any

import cpus
import pytest
from conftest import Venv, run_program
from platforms import INTEL_MAC, M_SERIES, fake_sysctl
from test_activation import VERSION_DIR

from gkx_autocache import _cpuid, _isa, _key

REAL = cpus.REAL_CPUINFO
needs_unshare = pytest.mark.skipif(not cpus.unshared(), reason="another CPU needs root (unshare -m) and a cpuid driver")
host_flags = cpus.host_flags


def on_cpu(venv: Venv, cpu: cpus.Cpu, *args: str, env: dict[str, str],
           user: int | None = None) -> subprocess.CompletedProcess[str]:
    """``python args`` in the venv, on ``cpu`` (its CPUID and its kernel's flags), as ``user`` (root: None)."""
    import shlex

    from conftest import as_user

    command = [venv.python, *args]
    if user is not None:
        command = as_user(user, command)
    script = " && ".join([*cpu.mounts(), f"exec {shlex.join(command)}"])
    return subprocess.run(["unshare", "-m", "sh", "-c", script], env={**venv.env, **env}, capture_output=True,
                          text=True, cwd=str(venv.home), timeout=600)


# -- reading the ISA ---------------------------------------------------------------------------------


def test_only_instruction_set_flags_count_and_only_the_first_processor(tmp_path: Path) -> None:
    """Flags that are not instruction sets do not change the ISA; the first processor's block is
    the only one read (the rest of the file may be anything)."""
    text = ("processor\t: 0\nflags\t\t: fpu sse sse2 pni abm sha_ni pclmulqdq avx512f hypervisor constant_tsc rep_good "
            "nopl cpuid arat ibrs ibpb stibp ssbd md_clear nonstop_tsc\n\nprocessor\t: 1\nflags\t\t: amx_tile\n")
    (tmp_path / "a").write_text(text)
    features = _isa.from_cpuinfo(_isa._first_block(str(tmp_path / "a")), "x86_64")
    assert features == sorted(["x87", "sse", "sse2", "sse3", "lzcnt", "sha", "pclmul", "avx512f"])
    (tmp_path / "b").write_text(text.replace(" hypervisor constant_tsc rep_good nopl cpuid arat", ""))
    assert _isa.from_cpuinfo(_isa._first_block(str(tmp_path / "b")), "x86_64") == features


def test_the_difference_of_two_isas_names_the_features() -> None:
    assert _isa.difference("x86_64:avx,avx512f,avx512bw", "x86_64:avx,amx-tile") == \
        "this CPU lacks avx512bw, avx512f; has amx-tile more"
    assert _isa.difference("x86_64:avx", "aarch64:neon") == "x86_64 -> aarch64"


# -- the hook -----------------------------------------------------------------------------------------


class StandIn:
    """``jax._src.cache_key`` as far as the hook needs it."""

    def __init__(self, hook: Any = None) -> None:
        self.custom_hook = hook or (lambda: "")

    def _log_cache_key_hash(self, hash_obj: Any, last_serialized: str, hashfn: Any) -> None:
        pass


def test_the_hook_chains_a_users_hook_and_adds_the_isa(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every key gets the ISA after the user's own hook's string (GPU and TPU entries can hold host
    code: see docs/isa.md); a user's hook that raises raises as it would without the package."""
    import jax._src as jax_src  # the real package: only its cache_key attribute is stood in for

    stand_in = StandIn(lambda: "theirs|")
    monkeypatch.setattr(jax_src, "cache_key", stand_in, raising=False)
    assert _key.install(types.SimpleNamespace())[1] is None
    assert stand_in.custom_hook() == "theirs|" + _key.isa_suffix()
    assert _key.isa_of(stand_in.custom_hook()) == _isa.isa()

    def raising() -> str:
        raise KeyError("their bug")

    stand_in = StandIn(raising)
    monkeypatch.setattr(jax_src, "cache_key", stand_in, raising=False)
    _key.install(types.SimpleNamespace())
    with pytest.raises(KeyError, match="their bug"):
        stand_in.custom_hook()


def test_without_the_hook_part_cpu_entries_are_said_to_be_unkeyed(monkeypatch: pytest.MonkeyPatch) -> None:
    import jax._src as jax_src

    stand_in = types.SimpleNamespace()
    monkeypatch.setattr(jax_src, "cache_key", stand_in, raising=False)
    assert _key.install(types.SimpleNamespace())[1] == "jax._src.cache_key.custom_hook is missing"


# -- CPUID: what the CPU says it has, as LLVM reads it (issue 67) ----------------------------------------

GRANITE_RAPIDS = {"64bit", "x87", "adx", "aes", "avx", "avx2", "avx512bf16", "avx512bitalg", "avx512bw", "avx512cd", "avx512dq",
                  "avx512f", "avx512fp16", "avx512ifma", "avx512vbmi", "avx512vbmi2", "avx512vl", "avx512vnni",
                  "avx512vpopcntdq", "amx-bf16", "amx-int8", "amx-tile", "amx-fp16", "avxvnni", "bmi", "bmi2", "cmov",
                  "crc32", "cx16", "cx8", "f16c", "fma", "fxsr", "gfni", "lzcnt", "mmx", "movbe", "pclmul", "popcnt",
                  "prefetchi", "sahf", "sha", "sse", "sse2", "sse3", "sse4.1", "sse4.2", "ssse3", "vaes", "vpclmulqdq",
                  "xsave", "rdseed", "serialize"}
ZEN4 = {"64bit", "x87", "adx", "aes", "avx", "avx2", "avx512bf16", "avx512bitalg", "avx512bw", "avx512cd", "avx512dq", "avx512f",
        "avx512ifma", "avx512vbmi", "avx512vbmi2", "avx512vl", "avx512vnni", "avx512vpopcntdq", "bmi", "bmi2", "clzero",
        "cmov", "crc32", "cx16", "cx8", "f16c", "fma", "fxsr", "gfni", "lzcnt", "mmx", "movbe", "pclmul", "popcnt",
        "prfchw", "rdseed", "sahf", "sha", "sse", "sse2", "sse3", "sse4.1", "sse4.2", "sse4a", "ssse3", "vaes",
        "vpclmulqdq", "xsave", "mwaitx", "wbnoinvd"}
VENDORS = {"Intel Xeon 6, its kernel older than AVX10": ("GenuineIntel", GRANITE_RAPIDS, 1, {"avx10.1", "prefetchi"}),
           "AMD EPYC 9004, rdseed hidden": ("AuthenticAMD", ZEN4, 0, {"rdseed"})}


@pytest.mark.parametrize("cpu", VENDORS)
def test_the_key_holds_what_cpuid_shows_whatever_the_kernel_lists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  cpu: str) -> None:
    """Issue 67: on an Intel Xeon whose kernel lists no avx10* and no prefetchi, LLVM sees both
    (CPUID) and every entry lists them, so the key must hold them; on an AMD EPYC whose kernel hides
    rdseed likewise. Read from each vendor's CPUID as the driver shows it, beside its kernel's flags."""
    vendor, features, avx10, hidden = VENDORS[cpu]
    info = tmp_path / "cpuinfo"
    info.write_text(cpus.cpuinfo(flags={cpus.KERNEL[f] for f in features - hidden if f in cpus.KERNEL}, vendor=vendor))
    regs = cpus.made(vendor, features, avx10)
    monkeypatch.setattr(_cpuid, "_device", lambda path: (regs, regs[0xD, 0][0]))  # the driver's registers, as read
    monkeypatch.setattr(_cpuid, "_helper", lambda: (regs, regs[0xD, 0][0]))  # and its OS's XGETBV: all it can save
    monkeypatch.setattr(_isa, "CPUINFO", str(info))
    monkeypatch.setattr(os, "uname", lambda: types.SimpleNamespace(machine="x86_64", nodename="h"))
    host = _isa.read()
    assert host.unread is None and host.source == f"CPUID, through {_cpuid.DEVICE}", host
    expected = features | ({"avx10.1"} if avx10 else set())
    assert set(host.features) == expected, sorted(set(host.features) ^ expected)
    assert _isa.kernel_hides(host) == sorted(hidden), _isa.kernel_hides(host)
    assert host.text().startswith("x86_64:cpuid,") and all(f in host.text().split(",") for f in hidden)
    kernel_only = _isa.Host("x86_64", _isa.from_cpuinfo(_isa._first_block(str(info)), "x86_64") or [], None,
                            "the kernel's flags")
    assert not hidden & set(kernel_only.features)  # (what the key held before: it missed them)
    assert "compiled once again" in _isa.difference(kernel_only.text(), host.text())


def test_cpuid_is_read_as_llvm_reads_it() -> None:
    """LLVM's rules: a feature whose registers the OS does not save is off (AVX-512 without its state
    in XCR0, AMX without its tiles), leaf 7's subleaf 1 only where leaf 7 says it has one, AVX10 by its
    version leaf, and the extended leaves only up to the highest the CPU names."""
    regs = cpus.made("GenuineIntel", GRANITE_RAPIDS, avx10=2)
    everything = set(_cpuid.features(regs, 0xE7 | 3 << 17))
    assert {"avx10.1", "avx10.2", "amx-tile", "avx512f", "prefetchi"} <= everything
    no_avx512_state = set(_cpuid.features(regs, 0x7))
    assert not {f for f in no_avx512_state if f.startswith("avx512") or f.startswith("amx")}, no_avx512_state
    assert {"avx2", "fma", "avxvnni", "gfni"} <= no_avx512_state  # (AVX10's bit needs no state of its own in LLVM)
    no_xsave = set(_cpuid.features(regs, None))  # no XSAVE: no AVX (AVX10's bit alone, as in LLVM, needs none)
    assert not {f for f in no_xsave if f.startswith("avx") and not f.startswith("avx10") or f == "fma"}, no_xsave
    no_subleaf = {**regs, (7, 0): (0, *regs[7, 0][1:])}
    assert not {"prefetchi", "avxvnni", "avx10.1", "sha512"} & set(_cpuid.features(no_subleaf, 0xE7))
    short_ext = {**regs, (0x80000000, 0): (0x80000000, 0, 0, 0)}
    assert "64bit" not in _cpuid.features(short_ext, 0xE7) and "64bit" in everything
    assert _cpuid.features({}, 0xE7) == []


@pytest.mark.skipif(not os.path.exists(_cpuid.DEVICE) or os.uname().machine != "x86_64",
                    reason="needs the kernel's cpuid driver on x86-64")
def test_the_driver_and_the_helper_read_the_same_cpu() -> None:
    """The two ways of asking CPUID (the kernel's driver, the instructions run in this process) give
    one answer, the one LLVM's own detection gives XLA (``test_every_feature_an_entry_lists_...``)."""
    device, helper = _cpuid._device(_cpuid.DEVICE), _cpuid._helper()
    assert device is not None and helper is not None
    assert _cpuid.features(*device) == _cpuid.features(*helper) != []


# -- real JAX on this host and on a fake one ----------------------------------------------------------


KEY_ISA = "from gkx_autocache import _isa; print(_isa.isa())"
# What a kernel older than its CPU, or clearcpuid, keeps out of its flags while CPUID shows it: every
# flag beyond x86-64-v1 that this host lists (issue 67: an Intel Xeon's kernel listed no avx10.1, prefetchi).
BASELINE = {"fpu", "lm", "cx8", "cmov", "mmx", "fxsr", "sse", "sse2"}


@pytest.mark.parametrize("kernel", ["as it is", "hiding features"])
def test_every_feature_an_entry_lists_is_covered_by_the_key(venv: Venv, tmp_path: Path, kernel: str) -> None:
    """An entry written here, decompressed, lists the target features XLA built it for: each `+`
    feature is in the ISA the key holds (or is tuning, which never restricts where code runs), also
    where the kernel's flags do not list them: XLA reads CPUID, and so does the key (issue 67)."""
    if kernel != "as it is" and not cpus.unshared():
        pytest.skip("a kernel's flags are replaced in a private mount namespace (root, unshare -m)")
    cpu = cpus.kernel_hiding(tmp_path, {f for f in host_flags() if f in _isa.X86} - BASELINE) \
        if kernel != "as it is" else cpus.Cpu()
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    proc = on_cpu(venv, cpu, "-c", __import__("conftest").PROGRAM, env=env)
    assert proc.returncode == 0, proc.stderr
    key_isa = _isa.parse(on_cpu(venv, cpu, "-c", KEY_ISA, env=env).stdout.strip())
    assert key_isa is not None
    entries = list((tmp_path / "c" / VERSION_DIR).glob("jit_f-*-cache"))
    assert entries
    listed: set[str] = set()
    for entry in entries:
        payload = zlib.decompress(entry.read_bytes())
        for found in re.findall(rb"(?:[+-][a-z0-9][a-z0-9_.-]*,){8,}[+-][a-z0-9][a-z0-9_.-]*", payload):
            listed |= {f[1:] for f in found.decode().split(",") if f.startswith("+")}
    assert {"sse2", "64bit"} <= listed, listed  # the feature list was found
    uncovered = sorted(f for f in listed if not _isa.covers(key_isa[1], f))
    assert uncovered == [], f"features the key does not cover: {uncovered}"


@needs_unshare
def test_a_cpu_without_avx512_loads_no_entry_of_this_host(venv: Venv, tmp_path: Path) -> None:
    """A warm cache, read on a CPU without AVX-512 (its CPUID and its kernel's flags): no entry of
    the real host is loaded, the run finishes, and explain says `changed CPU` naming avx512."""
    avx512 = {f for f in _isa.read().features if f.startswith("avx512")}
    if not avx512:
        pytest.skip("this host has no AVX-512 to take away")
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    cold, _ = run_program(venv, env=env)
    warm, _ = run_program(venv, env=env)
    assert warm["hits"] == warm["requests"] > 0
    assert venv.cli("stats", "--reset", env=env).returncode == 0
    off = {**env, "GKX_JAX_CACHE_REBUILD_AHEAD": "0"}  # (on, it would compile them for that CPU from their records)
    proc = on_cpu(venv, cpus.real_less(tmp_path, avx512), "-c", __import__("conftest").PROGRAM, env=off)
    assert proc.returncode == 0, proc.stderr
    other = json.loads(proc.stdout.strip().splitlines()[-1])
    assert other["hits"] == 0 and other["result"] == cold["result"]
    data = json.loads(venv.cli("--json", "explain", env=env).stdout)
    causes = {g["cause"]: g for g in data["groups"]}
    assert set(causes) == {"changed CPU"}, causes
    detail = causes["changed CPU"]["functions"][0]["detail"]
    assert "avx512f" in detail and "lacks" in detail, detail
    again = on_cpu(venv, cpus.real_less(tmp_path, avx512), "-c", __import__("conftest").PROGRAM, env=env)
    assert json.loads(again.stdout.strip().splitlines()[-1])["hits"] == other["requests"]  # that CPU's own


@needs_unshare
def test_flags_that_are_not_instruction_sets_change_nothing(venv: Venv, tmp_path: Path) -> None:
    """Another host of this CPU model with other hypervisor or microcode flags: every entry is a
    hit, and `ci-key` is the same."""
    not_isa = {"hypervisor", "constant_tsc", "nonstop_tsc", "rep_good", "nopl", "cpuid", "arat", "ibrs", "ibpb",
               "stibp", "ssbd", "md_clear", "tsc_known_freq", "xtopology", "umip"}
    fake = tmp_path / "cpuinfo"
    fake.write_text(cpus.cpuinfo(lacking=not_isa).replace("flags\t\t:", "flags\t\t: flush_l1d", 1))  # one flag more
    assert fake.read_text() != REAL
    other = cpus.Cpu(None, fake)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    run_program(venv, env=env)
    proc = on_cpu(venv, other, "-c", __import__("conftest").PROGRAM, env=env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["hits"] == result["requests"] > 0
    assert on_cpu(venv, other, "-m", "gkx_autocache", "ci-key", env=env).stdout == venv.cli("ci-key", env=env).stdout


def test_a_directory_written_before_cpu_keying_gets_the_migration_text(venv: Venv, tmp_path: Path) -> None:
    """Entries written without the ISA in their key (by stock JAX, or the package before this
    change) are each compiled once more, and explain says so: not `changed CPU`."""
    vdir = tmp_path / "c" / VERSION_DIR
    vdir.mkdir(parents=True)
    stock = {"GKX_JAX_CACHE": "0", "JAX_COMPILATION_CACHE_DIR": str(vdir), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
             "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1", "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none"}
    run_program(venv, env=stock)
    assert len(list(vdir.glob("*-cache"))) >= 2
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    first, _ = run_program(venv, env=env)
    assert first["hits"] == 0
    data = json.loads(venv.cli("--json", "explain", env=env).stdout)
    causes = {g["cause"] for g in data["groups"]}
    assert causes == {"before CPU keying"}, data
    second, _ = run_program(venv, env=env)
    assert second["hits"] == second["requests"]


@needs_unshare
def test_a_hook_replaced_after_import_is_noticed_and_cpu_keys_keep_the_isa(venv: Venv, tmp_path: Path) -> None:
    """A user's code replaces JAX's custom hook after `import jax`: CPU keys still hold the ISA (a
    fake CPU gets no hit), and `status` names the replacement."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    program = "import jax\nfrom jax._src import cache_key\ncache_key.custom_hook = lambda: 'mine'\n" + \
        __import__("conftest").PROGRAM
    run_program(venv, env=env, program=program)
    warm, _ = run_program(venv, env=env, program=program)
    assert warm["hits"] == warm["requests"] > 0
    status = json.loads(venv.cli("--json", "status", env=env).stdout)
    assert any("custom_hook was replaced" in a and "<lambda>" in a for a in status["attention"]), status["attention"]
    avx = {f for f in _isa.read().features if f.startswith(("avx", "sse4"))}
    off = {**env, "GKX_JAX_CACHE_REBUILD_AHEAD": "0"}  # (on, it would compile them for that CPU from their records)
    proc = on_cpu(venv, cpus.real_less(tmp_path, avx), "-c", program, env=off)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["hits"] == 0


# -- a host whose ISA cannot be read (SPEC §15, amended 2026-12-02) ----------------------------------

UNREADABLE = ("empty", "no flags line", "unreadable")


def unreadable_cpuinfo(tmp_path: Path, how: str) -> Path:
    """A ``/proc/cpuinfo`` stand-in that gives no ISA: empty, a block without its flags line, or one
    that cannot be read (mode 0; reading it is refused to a non-root user, and ``_isa`` reads a
    folder in its place in-process, as root reads past any mode)."""
    path = tmp_path / f"cpuinfo-{how.replace(' ', '-')}"
    if how == "empty":
        path.write_text("")
    elif how == "no flags line":
        path.write_text("\n".join(line for line in REAL.split("\n\n")[0].splitlines()
                                  if not line.startswith(("flags", "Features"))) + "\n")
    else:
        path.write_text(REAL)
        path.chmod(0)
    return path


def no_cpuid(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """CPUID cannot be read in this process: no cpuid driver, and executable memory refused."""
    monkeypatch.setattr(_cpuid, "DEVICE", str(tmp_path / "no-cpuid-driver"))
    monkeypatch.setattr(_cpuid, "_helper", lambda: None)


@pytest.mark.parametrize("how", UNREADABLE)
def test_an_unreadable_isa_keys_cpu_entries_by_this_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         how: str) -> None:
    """Where neither CPUID nor /proc/cpuinfo gives the ISA, the key holds this host's own identity,
    never ``<machine>:unknown`` (which every such host would share); another host gets another."""
    path = unreadable_cpuinfo(tmp_path, how)
    if how == "unreadable":
        path = tmp_path / "a-folder"
        path.mkdir()
    monkeypatch.setattr(_isa, "CPUINFO", str(path))
    no_cpuid(monkeypatch, tmp_path)
    machine, features, why, _ = _isa.read()
    assert why, "the reason the ISA was not read"
    text = f"{machine}:{','.join(features)}"
    assert text != f"{machine}:unknown" and "unknown" not in features, text
    assert any(f.startswith("host=") for f in features), text
    monkeypatch.setattr(_isa, "MACHINE_ID_FILES", (str(tmp_path / "none"),))
    other_name = types.SimpleNamespace(machine=machine, nodename="another-host")
    alone = _isa.read().features
    monkeypatch.setattr(os, "uname", lambda: other_name)
    assert _isa.read().features != alone  # another host name, another key
    (tmp_path / "id").write_text("0123456789abcdef0123456789abcdef\n")
    monkeypatch.setattr(_isa, "MACHINE_ID_FILES", (str(tmp_path / "id"),))
    with_id = _isa.read().features
    (tmp_path / "id").write_text("fedcba9876543210fedcba9876543210\n")
    assert _isa.read().features != with_id  # another machine id (one host name), another key
    assert "0123456789abcdef" not in ",".join(with_id)  # the machine id is never shown as it is
    assert "could not be read" in _isa.difference(f"{machine}:{','.join(alone)}", f"{machine}:avx,sse2")


@needs_unshare
@pytest.mark.parametrize("how", UNREADABLE)
def test_a_real_run_where_proc_cpuinfo_gives_nothing_keys_its_entries_on_cpuid(venv: Venv, public: Path,
                                                                                how: str) -> None:
    """A real JAX run where /proc/cpuinfo is empty, has no flags line, or cannot be read (as a user
    who may not read the cpuid driver either: CPUID is then asked in the process): it completes, its
    entries are keyed on the CPU's own CPUID as root's would be, a second such run hits them, and
    ``status`` raises nothing. Where CPUID cannot be read either, the host keys them
    (``test_an_unreadable_isa_keys_cpu_entries_by_this_host``)."""
    cpuinfo = unreadable_cpuinfo(public, how)
    user = 65534 if how == "unreadable" else None
    cache = public / "c"
    cache.mkdir()
    if user is not None:
        os.chown(cache, user, user)
    env = {"GKX_JAX_CACHE_DIR": str(cache)}
    cpu = cpus.Cpu(None, cpuinfo)
    proc = on_cpu(venv, cpu, "-c", __import__("conftest").PROGRAM, env=env, user=user)
    assert proc.returncode == 0, proc.stderr
    first = json.loads(proc.stdout.strip().splitlines()[-1])
    assert first["requests"] > 0
    index = cache / VERSION_DIR / ".gkx-autocache" / "index"
    from gkx_autocache._record import index as _index

    keyed = _index.isa_of_entries(index.read_text().splitlines())
    assert keyed, index.read_text()
    assert set(keyed.values()) == {_isa.isa()}, keyed  # root's reading, through the driver
    assert _isa.isa().startswith(f"{os.uname().machine}:{_isa.CPUID_MARK},"), _isa.isa()
    again = on_cpu(venv, cpu, "-c", __import__("conftest").PROGRAM, env=env, user=user)
    assert json.loads(again.stdout.strip().splitlines()[-1])["hits"] == first["requests"], again.stderr
    status = on_cpu(venv, cpu, "-m", "gkx_autocache", "--json", "status", env=env, user=user)
    data = json.loads(status.stdout)
    assert not any("instruction set cannot be read" in a for a in data["attention"]), data["attention"]
    assert data["cpu"]["source"] == ("CPUID" if user else f"CPUID, through {_cpuid.DEVICE}"), data["cpu"]


@pytest.mark.parametrize("names", [("gpu node 1", "gpu_node_1"), ("wörker-1", "würker-1"), ("a:b,c", "a_b_c")],
                         ids=["space", "non-ascii", "separators"])
def test_two_containers_of_one_image_whose_host_names_differ_only_in_unusual_characters_get_two_keys(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: tuple[str, str]) -> None:
    """Containers of one image share its machine id; where the ISA cannot be read, their host names
    are all that tells them apart. Names that differ only in characters the key text cannot hold
    (a space, non-ASCII, `:` or `,`) must still give two keys, and the key text stays parseable."""
    path = unreadable_cpuinfo(tmp_path, "empty")
    monkeypatch.setattr(_isa, "CPUINFO", str(path))
    (tmp_path / "id").write_text("0123456789abcdef0123456789abcdef\n")
    monkeypatch.setattr(_isa, "MACHINE_ID_FILES", (str(tmp_path / "id"),))
    no_cpuid(monkeypatch, tmp_path)
    found = []
    for name in names:
        monkeypatch.setattr(os, "uname", lambda name=name: types.SimpleNamespace(machine="x86_64", nodename=name))
        machine, features, _, _ = _isa.read()
        text = f"{machine}:{','.join(features)}"
        assert _isa.parse(text) == (machine, frozenset(features)), text
        assert all(c.isascii() and c.isprintable() and c not in " :,\t" for f in features for c in f), text
        found.append(features)
    assert found[0] != found[1], found


@pytest.mark.parametrize("mac", [M_SERIES, INTEL_MAC], ids=["M-series", "Intel"])
def test_a_macs_instruction_set_is_read_from_sysctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     mac: dict[str, str]) -> None:
    """Issue 46: on an M-series Mac, asking `machdep.cpu.*` first stopped Apple's sysctl before
    `hw.optional`, and every key fell back to the host name. Each group is asked on its own."""
    monkeypatch.setenv("PATH", f"{fake_sysctl(tmp_path, mac)}:{os.environ['PATH']}")
    monkeypatch.setattr(sys, "platform", "darwin")
    machine, features, why, _ = _isa.read()
    assert why is None and not any(f.startswith(_isa.HOST_MARK) for f in features), (features, why)
    if mac is M_SERIES:
        assert {"aes", "sha2", "sha3", "lse", "lse2", "dotprod", "fullfp16", "rcpc", "neon"} <= set(features), features
        assert "bf16" not in features and "i8mm" not in features and "breakpoint" not in features, features
    else:
        assert {"avx2", "avx", "sse4.2", "bmi", "bmi2", "fma", "aes", "lzcnt", "64bit", "sahf"} <= set(features), features
        # CPUID's other flags are not instruction sets: a microcode update (ibrs, mdclear) keeps the key
        assert not {"acpi", "apic", "vmx", "ibrs", "mdclear", "ssbd", "avx1_0", "avx1.0", "x86_64"} & set(features), features
    mac2 = {**mac, "hw.optional": mac["hw.optional"].replace("FEAT_BF16: 0", "FEAT_BF16: 1")
            .replace("avx512f: 0", "avx512f: 1")}
    (tmp_path / "sysctl.json").write_text(json.dumps(mac2))
    assert _isa.read().features != features  # another CPU of the family: another key


def test_sysctl_is_found_where_macos_keeps_it_when_path_lacks_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """cron's PATH is /usr/bin:/bin, and macOS keeps sysctl in /usr/sbin: such runs fell back to the
    host name, and keyed their entries apart from the shell's."""
    import shutil

    ran: list[list[str]] = []

    def run(command: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        ran.append(command)
        return subprocess.CompletedProcess(command, 0, "")

    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(subprocess, "run", run)
    _isa._sysctl(("hw.optional",))
    assert ran == [["/usr/sbin/sysctl", "hw.optional"]]


def test_windows_names_its_cpu_in_one_word_a_key_can_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows' processor text ("Intel64 Family 6 Model 158 Stepping 10, GenuineIntel") held a comma
    and spaces, which split it into two features, one beginning with a space."""
    import platform

    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(platform, "processor", lambda: "Intel64 Family 6 Model 158 Stepping 10, GenuineIntel")
    machine, features, why, _ = _isa.read()
    assert why is None and features == ["Intel64_Family_6_Model_158_Stepping_10__GenuineIntel"], features
    assert _isa.parse(f"{machine}:{','.join(features)}") == (machine, frozenset(features))
