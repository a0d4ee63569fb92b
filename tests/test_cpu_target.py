"""One CPU target for a mixed fleet (SPEC §15, amended 2026-12-04): under ``cpu_target`` XLA's CPU
code is capped at the level and CPU keys hold the level, so hosts at or above it share entries; a
host below it keys on its own ISA; an entry that lists a feature the reader lacks is never loaded.
Another CPU is a fake CPUID and ``/proc/cpuinfo`` bind-mounted in a private mount namespace (SPEC §12,
``cpus.py``): the real one less some features, or one of either vendor, so the test machine's decides nothing."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import cpus
import pytest
from conftest import PROGRAM, Venv, autocache_warnings, run_program
from test_activation import VERSION_DIR
from test_isa import needs_unshare, on_cpu

from gkx_autocache import _cpu_target, _isa, _settings

V3 = {"GKX_JAX_CACHE_CPU_TARGET": "x86-64-v3"}
HOST = set(_isa.read().features)
AVX512 = {f for f in HOST if f.startswith("avx512")}
needs_avx512 = pytest.mark.skipif(not AVX512 or "avx2" not in HOST,
                                  reason="the mixed pair needs an AVX-512 host to play both hosts")


def listed(vdir: Path) -> set[str]:
    """Every ``+`` feature the CPU entries of a version directory list."""
    found: set[str] = set()
    for entry in vdir.glob("jit_*-cache"):
        found |= _cpu_target.features_of(zlib.decompress(entry.read_bytes()))
    return found


def counts(proc: object) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr  # type: ignore[attr-defined]
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[attr-defined,no-any-return]


# -- deciding, without JAX -----------------------------------------------------------------------------


def test_a_level_is_taken_only_where_this_host_and_this_xla_can_take_it() -> None:
    v3 = list(_cpu_target.LEVELS["x86-64-v3"][1])
    assert _cpu_target.choose("host", "x86_64", v3, None, (0, 10, 2), "") is _cpu_target.NONE
    plain = _cpu_target.choose("x86-64-v3", "x86_64", [*v3, "rdseed", "aes", "avx512f", "amx-tile"], None, (0, 10, 2), "")
    assert plain.isa_text() == "x86_64:target=x86-64-v3"  # what the cap turns off, and what only intrinsics emit
    taken = _cpu_target.choose("x86-64-v3", "x86_64", [*v3, "gfni", "avxvnni", "rdseed"], None, (0, 10, 2), "")
    assert taken.level == "x86-64-v3" and taken.why_host is None
    assert taken.isa_text() == "x86_64:target=x86-64-v3,avxvnni,gfni"  # the key says what else XLA's code may use
    assert _cpu_target.choose("x86-64-v4", "x86_64", [*_cpu_target.LEVELS["x86-64-v4"][1], "avx512vnni", "avx512vbmi"],
                              None, (0, 10, 2), "").extras == ("avx512vbmi",)
    refusals = {
        "lacks avx2": _cpu_target.choose("x86-64-v3", "x86_64", [f for f in v3 if f != "avx2"], None, (0, 10, 2), ""),
        "lacks avx512f, avx512bw": _cpu_target.choose("x86-64-v4", "x86_64", v3, None, (0, 12, 0), ""),
        "this CPU is aarch64": _cpu_target.choose("x86-64-v3", "aarch64", ["neon"], None, (0, 10, 2), ""),
        "needs jaxlib 0.8.2 or later": _cpu_target.choose("x86-64-v3", "x86_64", v3, None, (0, 7, 2), ""),
        "cannot be read": _cpu_target.choose("x86-64-v3", "x86_64", ["host=a"], "/proc/cpuinfo is empty", (0, 10, 2), ""),
        "already sets --xla_cpu_max_isa=AVX512": _cpu_target.choose("x86-64-v3", "x86_64", v3, None, (0, 10, 2),
                                                                    "--xla_cpu_max_isa=AVX512"),
    }
    for said, target in refusals.items():
        assert target.level is None and target.why_host is not None and said in target.why_host, (said, target.why_host)
    environ = {"XLA_FLAGS": "--xla_foo=1"}
    _cpu_target.add_flag("x86-64-v2", environ)
    assert environ["XLA_FLAGS"] == "--xla_foo=1 --xla_cpu_max_isa=SSE4_2"
    _cpu_target.add_flag("x86-64-v3", environ)  # once: a flag already there stays as it is
    assert environ["XLA_FLAGS"] == "--xla_foo=1 --xla_cpu_max_isa=SSE4_2"
    _cpu_target.release(environ)  # XLA has read it: a process started now never inherits it
    assert environ == {"XLA_FLAGS": "--xla_foo=1"}
    mine = {"XLA_FLAGS": "--xla_cpu_max_isa=AVX2"}
    _cpu_target.release(mine)  # the user's own flag is theirs
    assert mine == {"XLA_FLAGS": "--xla_cpu_max_isa=AVX2"}


def test_a_bad_target_is_one_line_and_the_host_keys() -> None:
    settings = _settings.resolve(env={"GKX_JAX_CACHE_CPU_TARGET": "haswell"}, prefix="/nonexistent", user_file="/nonexistent")
    assert settings["cpu_target"] == "host"
    assert [m for _, m in settings.problems] == ["env GKX_JAX_CACHE_CPU_TARGET: cpu_target skipped, expected one of host, "
                                                 "x86-64-v2, x86-64-v3, x86-64-v4, got 'haswell'; fix or remove it"]


def llvm_list(*plus: str) -> bytes:
    """A target-feature list as XLA:CPU keeps it: every feature LLVM knows, on or off."""
    off = [f"-pad{i}" for i in range(20)]
    return ",".join([f"+{f}" for f in plus] + off).encode()


def test_the_features_an_entry_lists_are_read_from_its_code() -> None:
    payload = b"\x00junk" + llvm_list("avx", "avx2", "sse2", "gfni", "x87") + b"\x00more\x7f" + llvm_list("64bit", "sse2", "vaes")
    assert _cpu_target.features_of(payload) == {"avx", "avx2", "sse2", "gfni", "x87", "64bit", "vaes"}
    assert _cpu_target.features_of(b"no list here") == frozenset()
    assert _cpu_target.features_of(b"\x00+sse2,+amx-tile\x00") == frozenset()  # a short list: a user's constant
    target = _cpu_target.Target("x86-64-v3", "x86_64", frozenset(_cpu_target.LEVELS["x86-64-v3"][1]))
    why = target.foreign(payload)
    assert why is not None and "built for gfni, which" in why and "x86-64-v3" in why, why  # (vaes: intrinsics only)
    assert target.foreign(llvm_list("sse2", "avx2", "prefer-256-bit", "shstk")) is None  # tuning never restricts
    # Features no kernel flag shows (APX's parts, usermsr) are never held against an entry: only egpr says APX.
    assert target.foreign(llvm_list("sse2", "avx2", "ndd", "ccmp", "usermsr")) is None
    assert "egpr" in str(target.foreign(llvm_list("sse2", "egpr", "ndd")))
    # What only an intrinsic emits, and which a kernel may hide (rdseed on some AMD parts), is never held
    # against an entry: the host that wrote it loads it (issue 57's H, an AMD EPYC VM).
    assert target.foreign(llvm_list("sse2", "avx2", "rdseed", "adx", "sha", "aes", "vpclmulqdq")) is None


def test_avx10_under_a_level_is_neither_keyed_nor_held_against_an_entry() -> None:
    """Issue 67: under x86-64-v3 every entry an AVX10 host (an Intel Xeon 6) writes lists +avx10.1,
    and a host without AVX-512 rejected one of them (`built for avx10.1`). XLA's list turns AVX-512's
    VNNI, BF16 and FP16 off under every level's cap, and LLVM turns off what implies a feature it turns
    off: AVX10 is off too. So it is not in the key (hosts of the level share entries) nor held against one."""
    from test_isa import GRANITE_RAPIDS

    alder_lake = {f for f in GRANITE_RAPIDS if not f.startswith(("avx512", "amx"))}
    xeon = _cpu_target.choose("x86-64-v3", "x86_64", sorted(GRANITE_RAPIDS | {"avx10.1"}), None, (0, 10, 2), "",
                              known=_isa.KNOWN_CPUID)
    laptop = _cpu_target.choose("x86-64-v3", "x86_64", sorted(alder_lake), None, (0, 10, 2), "", known=_isa.KNOWN_CPUID)
    assert xeon.isa_text() == laptop.isa_text(), (xeon.isa_text(), laptop.isa_text())
    written = llvm_list(*_cpu_target.LEVELS["x86-64-v3"][1], "avx10.1", "gfni", "avxvnni", "sha", "prefetchi")
    assert laptop.foreign(written) is None
    assert "avx10.1" not in str(xeon.extras) and all(not _cpu_target.xla_keeps("avx10.1", cap) for cap in ("SSE4_2", "AVX2", "AVX512"))
    assert "gfni" in str(_cpu_target.choose("x86-64-v3", "x86_64", sorted(alder_lake - {"gfni"}), None, (0, 10, 2), "",
                                            known=_isa.KNOWN_CPUID).foreign(written))  # (what XLA's code may use still counts)


def protobuf(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field."""
    def varint(n: int) -> bytes:
        out = b""
        while True:
            out += bytes([n & 0x7F | (0x80 if n > 0x7F else 0)])
            n >>= 7
            if not n:
                return out
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def executable(record: bytes, constant: bytes) -> bytes:
    """A decompressed entry as XLA:CPU lays it out: JAX's compile time, a header, then the executable,
    whose target-machine record (triple, CPU, features) sits beside its module, and ``constant`` as
    the bytes of an instruction's literal inside that module."""
    header = protobuf(2, b"pjrt_ifrt")
    module = protobuf(1, protobuf(3, protobuf(2, protobuf(8, constant))))
    rest = protobuf(1, module + protobuf(9, record)) + protobuf(2, b"layout")
    return b"\0\0\0\1" + bytes([len(header)]) + header + rest


def test_only_xlas_own_record_says_what_an_entry_was_built_for() -> None:
    """Issue 67's M1: the features an entry lists were read from any run of names in its bytes, so a
    constant of the program's that spells a list (a model file's bytes) counted as XLA's record.
    Only the shallowest target-machine record counts: XLA's; a list in the data, or a whole record
    framed as XLA frames it inside a literal, adds nothing."""
    real = protobuf(1, b"x86_64-unknown-linux-gnu") + protobuf(2, b"znver4") + protobuf(3, llvm_list("sse2", "avx2", "gfni"))
    planted = llvm_list("sse2", "avx2", "xop", "fma4", "tbm")
    framed = protobuf(1, b"x86_64-unknown-linux-gnu") + protobuf(2, b"bdver4") + protobuf(3, planted)
    for constant in (planted * 4, framed, b"\x00" * 64 + framed + planted):
        assert _cpu_target.features_of(executable(real, constant)) == {"sse2", "avx2", "gfni"}, constant[:40]
    target = _cpu_target.Target("x86-64-v3", "x86_64", frozenset(_cpu_target.LEVELS["x86-64-v3"][1]) | {"gfni"})
    assert target.foreign(executable(real, planted * 4)) is None  # the program's data never refuses its own entry
    # Where no record is found (another jaxlib's layout), every list counts: it can only refuse an entry.
    assert "xop" in _cpu_target.features_of(b"\0\0\0\0\x05hello" + planted)


def test_explain_names_the_target_of_a_cpu_miss() -> None:
    assert _isa.difference("x86_64:target=x86-64-v3", "x86_64:avx,avx2,sse2") == \
        "cpu_target x86-64-v3 -> a host's own ISA (cpu_target host)"
    assert _isa.difference("x86_64:target=x86-64-v3,gfni", "x86_64:target=x86-64-v3,sse4a") == \
        "cpu_target x86-64-v3: this CPU lacks gfni; has sse4a more"
    assert _isa.difference("x86_64:avx,sse2", "x86_64:target=x86-64-v4") == \
        "a host's own ISA (cpu_target host) -> cpu_target x86-64-v4"


# -- real JAX, two CPUs -----------------------------------------------------------------------------


@needs_unshare
@needs_avx512
def test_a_mixed_pair_shares_entries_under_a_target_and_none_without(venv: Venv, tmp_path: Path) -> None:
    """An AVX-512 host writes under x86-64-v3: XLA built no AVX-512 code (its entries list none), and
    an AVX2 host (the same CPU with its AVX-512 flags taken away) is served every entry, with the same
    result. Without the target the AVX2 host gets none: the fleet shares nothing."""
    avx2_host = cpus.real_less(tmp_path, AVX512)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), **V3}
    cold, _ = run_program(venv, env=env)
    built = listed(tmp_path / "c" / VERSION_DIR)
    assert {"avx2", "sse2"} <= built and not {f for f in built if f.startswith("avx512")}, sorted(built)
    other = counts(on_cpu(venv, avx2_host, "-c", PROGRAM, env=env))
    assert other["hits"] == other["requests"] == cold["requests"] > 0 and other["result"] == cold["result"]
    key = venv.cli("ci-key", env=env).stdout
    assert on_cpu(venv, avx2_host, "-m", "gkx_autocache", "ci-key", env=env).stdout == key  # one CI cache too

    host_env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "h"), "GKX_JAX_CACHE_REBUILD_AHEAD": "0"}  # (on: rebuilt for it)
    run_program(venv, env=host_env)
    assert {f for f in listed(tmp_path / "h" / VERSION_DIR) if f.startswith("avx512")}  # the host's own code
    assert counts(on_cpu(venv, avx2_host, "-c", PROGRAM, env=host_env))["hits"] == 0
    status = json.loads(venv.cli("--json", "status", env=env).stdout)
    assert status["settings"]["cpu_target"] == {"value": "x86-64-v3", "origin": "env GKX_JAX_CACHE_CPU_TARGET",
                                                "effective": "x86-64-v3"}
    # A warm bundle of the target's entries: loaded under the target, "another CPU" without it.
    bundle = str(tmp_path / "warm.tar")
    assert venv.cli("export", bundle, env=env).returncode == 0
    imported = {}
    for name, extra in (("target", V3), ("host", {})):
        proc = venv.cli("--json", "import", bundle, env={"GKX_JAX_CACHE_DIR": str(tmp_path / f"i-{name}"), **extra})
        assert proc.returncode == 0, proc.stderr
        imported[name] = json.loads(proc.stdout)
    assert imported["target"]["entries"] > 0 and imported["target"]["other_cpu"] == 0, imported
    assert imported["host"]["other_cpu"] == imported["target"]["entries"], imported


@needs_unshare
def test_the_host_that_wrote_a_targets_entries_loads_them_though_its_kernel_hides_a_feature(venv: Venv,
                                                                                           tmp_path: Path) -> None:
    """An AMD EPYC VM lists avx512f and adx but not rdseed in /proc/cpuinfo (Linux hides it where it is
    unreliable), while CPUID, which XLA reads, shows it: every entry lists +rdseed. Under x86-64-v3 its
    warm run was `0 hits (8 rejected)`, "built for rdseed, which this CPU lacks", on every run (issue
    57). Here: this machine with rdseed taken out of /proc/cpuinfo writes and reads its own entries."""
    if "rdseed" not in HOST:
        pytest.skip("this host's CPU has no rdseed for its kernel to hide")
    epyc = cpus.kernel_hiding(tmp_path, {"rdseed"})
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), **V3}
    cold = counts(on_cpu(venv, epyc, "-c", PROGRAM, env=env))
    assert "rdseed" in listed(tmp_path / "c" / VERSION_DIR)
    warm = counts(on_cpu(venv, epyc, "-c", PROGRAM, env=env))
    assert warm["hits"] == warm["requests"] == cold["requests"] > 0 and warm["result"] == cold["result"], warm


@needs_unshare
def test_a_host_below_the_target_loads_nothing_of_it_and_says_so(venv: Venv, tmp_path: Path) -> None:
    """A CPU without AVX2 under x86-64-v3: one warning, its own ISA keys its entries (uncapped), no
    entry of the target is loaded, `status` says why, and `explain` names the target."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), **V3}
    cold, _ = run_program(venv, env=env)
    below = cpus.real_less(tmp_path, {"avx2"})
    proc = on_cpu(venv, below, "-c", PROGRAM, env={**env, "GKX_JAX_CACHE_REBUILD_AHEAD": "0"})  # (on: rebuilt for it)
    other = counts(proc)
    assert other["hits"] == 0 and other["result"] == cold["result"]
    said = autocache_warnings(proc.stderr)
    assert len(said) == 1 and "cpu_target x86-64-v3 not used, this CPU is below it (it lacks avx2)" in said[0], said
    status = json.loads(on_cpu(venv, below, "-m", "gkx_autocache", "--json", "status", env=env).stdout)
    assert any("below it (it lacks avx2)" in line for line in status["attention"]), status["attention"]
    data = json.loads(venv.cli("--json", "explain", env=env).stdout)
    causes = {g["cause"]: g for g in data["groups"]}
    assert set(causes) == {"changed CPU"}, causes
    detail = causes["changed CPU"]["functions"][0]["detail"]
    assert "cpu_target x86-64-v3 -> a host's own ISA" in detail, detail


@needs_unshare
def test_an_entry_that_lists_a_feature_the_reader_lacks_is_never_loaded(venv: Venv, tmp_path: Path) -> None:
    """XLA's cap leaves on the host's features that are not newer than the level (gfni, avxvnni here;
    gfni, sse4a on an AVX-512 EPYC), and its code uses them (an int8 shift is GFNI's): the key says
    so, so a reader at the target without one of them has another key, compiles its own, and never
    loads the writer's; `explain` names the feature. An entry under its own key that lists it all
    the same is refused, never loaded (``test_the_features_an_entry_lists_are_read_from_its_code``)."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), **V3}
    run_program(venv, env=env)
    vdir = tmp_path / "c" / VERSION_DIR
    level = set(_cpu_target.LEVELS["x86-64-v3"][1]) | _cpu_target.INSTRUCTION_ONLY
    extra = sorted(f for f in listed(vdir) if f not in level and f in _isa.KNOWN_CPUID and _cpu_target.xla_keeps(f, "AVX2"))
    if not extra:
        pytest.skip("this host's capped entries list no feature beyond x86-64-v3 that XLA's code may use")
    reader = cpus.real_less(tmp_path, {extra[0]})
    first = counts(on_cpu(venv, reader, "-c", PROGRAM, env=env))
    assert first["hits"] == 0
    data = json.loads(venv.cli("--json", "explain", env=env).stdout)
    changed = {g["cause"]: g for g in data["groups"]}["changed CPU"]["functions"][0]["detail"]
    assert f"cpu_target x86-64-v3: this CPU lacks {extra[0]}" in changed, changed
    # XLA reads the real CPUID, which the fake hides: the reader's own entries list the feature under
    # its own key (as another host's could), and are refused: the CPU is asked, never an entry.
    again = counts(on_cpu(venv, reader, "-c", PROGRAM, env=env))
    assert again["hits"] == 0 and again["result"] == first["result"], again
    assert counts(venv.run("-c", PROGRAM, env=env))["hits"] == first["requests"]  # the writer's host loads its own


PLANTED = r"""
import numpy as np, jax, jax.numpy as jnp
listed = b"+64bit,+sse,+sse2,+sse3,+ssse3,+sse4.1,+sse4.2,+avx,+avx2,+bmi,+bmi2,+fma,+f16c,+lzcnt,+movbe,+popcnt,+xop,+fma4,+tbm,"
data = np.frombuffer(listed * 4, np.uint8)  # a model file's bytes that spell a feature list
print(int(jax.jit(lambda x: (jnp.asarray(data) + x).sum())(jnp.uint8(1))))
"""


def test_a_list_in_a_programs_data_teaches_the_host_nothing(venv: Venv, tmp_path: Path) -> None:
    """Issue 67's M1, as found: under x86-64-v3, a `jit` closing over bytes that spell a feature list
    with +xop taught a host without XOP that it has it (kept for good in the bookkeeping), and an
    entry whose record lists +xop, refused before, was loaded after. Nothing is learned from an
    entry now: the record-listed +xop is refused before and after, the program's own entry loads."""
    if "xop" in HOST:
        pytest.skip("this CPU has XOP")
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), **V3}
    cold, _ = run_program(venv, env=env)
    vdir = tmp_path / "c" / VERSION_DIR
    entry = sorted(vdir.glob("jit_f-*-cache"))[0]
    payload = zlib.decompress(entry.read_bytes())
    assert b",-xop," in payload and "xop" not in _cpu_target.features_of(payload)
    entry.write_bytes(zlib.compress(payload.replace(b",-xop,", b",+xop,")))  # as an XOP host at v3 writes it
    for _ in range(2):  # the program's own entry, written then read
        proc = venv.run("-c", PLANTED, env=env)
        assert proc.returncode == 0 and autocache_warnings(proc.stderr) == [], proc.stderr
    assert not [p.name for p in (vdir / ".gkx-autocache").iterdir() if p.name.startswith("cpu-")]  # nothing kept
    warm, _ = run_program(venv, env=env)
    assert warm["hits"] == warm["requests"] - 1 == cold["requests"] - 1 and warm["result"] == cold["result"], warm
    data = json.loads(venv.cli("--json", "explain", env=env).stdout)
    rejected = [f for g in data["groups"] if g["cause"] == "rejected" for f in g["functions"]]
    assert rejected and "built for xop, which this CPU lacks" in rejected[0]["detail"], data["groups"]


# -- what the attack found (2026-12-05) ----------------------------------------------------------------

AVX2_PLAIN = {"gfni", "vaes", "vpclmulqdq"}  # an AVX2 CPU without AVX-512's generation of extras either

ADOPTED = r"""
import os, jax
jax.config.update("jax_compilation_cache_dir", os.environ["ELSEWHERE"])
""" + PROGRAM


@needs_unshare
@needs_avx512
def test_where_jaxs_own_cache_serves_cpu_keys_keep_the_hosts_isa(venv: Venv, tmp_path: Path) -> None:
    """A directory a framework sets after import jax that the store refuses (group-writable), which
    read_untrusted_dir lets JAX's stock cache read: it checks no feature, so its CPU keys hold the
    host's ISA even under the target (one warning says the target is not used there), and another
    CPU loads none of them."""
    elsewhere = tmp_path / "group"
    elsewhere.mkdir()
    elsewhere.chmod(0o775)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "ELSEWHERE": str(elsewhere), **V3,
           "GKX_JAX_CACHE_READ_UNTRUSTED_DIR": "1"}
    out, err = run_program(venv, env=env, program=ADOPTED)
    assert out["dir"] == str(elsewhere) and list(elsewhere.glob("jit_f-*")), err
    other = counts(on_cpu(venv, cpus.real_less(tmp_path, AVX512 | AVX2_PLAIN), "-c", ADOPTED, env=env))
    assert other["hits"] == 0 and other["result"] == out["result"]


LATE = r"""
import sys
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "GkxAutocacheFinder" and getattr(f, "__name__", "") != "GkxAutocacheFinder"]
import jax
jax.devices()  # XLA's backend starts, and reads XLA_FLAGS, before the package configures
import gkx_autocache
gkx_autocache.install()
""" + PROGRAM

REPLACED = r"""
import os, jax
os.environ["XLA_FLAGS"] = ""  # the program's own flags, after import jax: the cap is gone
""" + PROGRAM


@pytest.mark.parametrize("program", [LATE, REPLACED], ids=["backend started first", "XLA_FLAGS replaced"])
def test_where_xla_did_not_take_the_cap_the_host_keys_and_it_is_said(venv: Venv, tmp_path: Path, program: str) -> None:
    """The backend started before the package configured, or the program replaced XLA_FLAGS after
    import jax: XLA builds for the host, so the target is not used (one warning naming why), and the
    entries, which list AVX-512 code where the host has it, are keyed on the host."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), **V3}
    proc = venv.run("-c", program, env=env)
    out = counts(proc)
    said = autocache_warnings(proc.stderr)
    assert len(said) == 1 and "cpu_target x86-64-v3 not used" in said[0], said
    assert ("backend started" in said[0]) if program is LATE else ("did not take its cap" in said[0]), said
    built = listed(tmp_path / "c" / VERSION_DIR)
    assert built and (not AVX512 or {f for f in built if f.startswith("avx512")}), sorted(built)
    index = "".join(p.read_text(errors="replace") for p in (tmp_path / "c" / VERSION_DIR).rglob("index*"))
    assert "target=x86-64-v3" not in index and out["requests"] > 0


CHILDREN = r"""
import json, os, subprocess, sys
early = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('XLA_FLAGS', ''))"],
                       capture_output=True, text=True).stdout.strip()
import jax, jax.numpy as jnp
before = os.environ.get("XLA_FLAGS", "")
float(jax.jit(lambda x: x * 2)(jnp.ones(3)).sum())
after = os.environ.get("XLA_FLAGS", "")
child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('XLA_FLAGS', ''))"],
                       capture_output=True, text=True).stdout.strip()
print(json.dumps({"early": early, "before": before, "after": after, "child": child}))
"""


def test_the_cap_leaves_xla_flags_once_xla_has_read_it(venv: Venv, tmp_path: Path) -> None:
    """The cap is in XLA_FLAGS from import jax until the first compile (XLA's backend has read it
    then), never after: a process started later (another Python, JAX 0.4.30, whose XLA stops on the
    flag) does not inherit it; the user's own flags stay as they were."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "XLA_FLAGS": "--xla_cpu_enable_fast_math=false", **V3}
    seen = counts(venv.run("-c", CHILDREN, env=env))
    assert seen["early"] == "--xla_cpu_enable_fast_math=false"
    assert seen["before"] == "--xla_cpu_enable_fast_math=false --xla_cpu_max_isa=AVX2", seen
    assert seen["after"] == seen["child"] == "--xla_cpu_enable_fast_math=false", seen


INHERITED = r"""
import json, os, subprocess, sys
import jax
env = dict(os.environ, GKX_JAX_CACHE_CPU_TARGET="host", GKX_JAX_CACHE_DIR=os.environ["CHILD_DIR"])
child = subprocess.run([sys.executable, "-c", "import os, jax; print(os.environ.get('XLA_FLAGS', ''))"],
                       env=env, capture_output=True, text=True)
print(json.dumps({"child": child.stdout.strip(), "rc": child.returncode}))
"""


def test_a_child_started_before_the_first_compile_decides_its_own_cap(venv: Venv, tmp_path: Path) -> None:
    """A child started between import jax and the first compile inherits the cap in XLA_FLAGS; with
    the package (and cpu_target = host) it takes it out before its XLA reads it."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "CHILD_DIR": str(tmp_path / "child"), **V3}
    seen = counts(venv.run("-c", INHERITED, env=env))
    assert seen["rc"] == 0 and seen["child"] == "", seen


@needs_unshare
def test_a_host_whose_kernel_hides_a_feature_xlas_code_uses_loads_its_own_entries_or_says_why_not(venv: Venv,
                                                                                                  tmp_path: Path) -> None:
    """SPEC §15 (amended 2026-12-06): entries under a cpu_target load on every host of the level, the
    host that wrote them included. This machine with gfni taken out of /proc/cpuinfo (a kernel older
    than the CPU lists no flag it does not know; clearcpuid hides one) while CPUID, which XLA reads,
    shows it: its warm run hits its own entries, with no warning: the package reads CPUID too."""
    if "gfni" not in HOST or "gfni" not in listed_under_v3(venv, tmp_path):
        pytest.skip("XLA's code on this host uses no GFNI under x86-64-v3")
    hidden = cpus.kernel_hiding(tmp_path, {"gfni"})
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), **V3}
    cold = counts(on_cpu(venv, hidden, "-c", PROGRAM, env=env))
    warm_proc = on_cpu(venv, hidden, "-c", PROGRAM, env=env)
    warm = counts(warm_proc)
    assert warm["hits"] == warm["requests"] == cold["requests"], (warm, warm_proc.stderr)
    assert autocache_warnings(warm_proc.stderr) == [], warm_proc.stderr


def listed_under_v3(venv: Venv, tmp_path: Path) -> set[str]:
    """What XLA's code lists under x86-64-v3 on this host (its CPUID)."""
    run_program(venv, env={"GKX_JAX_CACHE_DIR": str(tmp_path / "probe"), **V3})
    return listed(tmp_path / "probe" / VERSION_DIR)
