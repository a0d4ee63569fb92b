"""``cpu_target`` (SPEC §15): one CPU target for a mixed fleet, in place of each host's own ISA.

XLA:CPU compiles for the host (``_isa``), so an AVX-512 runner and an AVX2 runner share no entry.
Under a target such as ``x86-64-v3`` the package caps what XLA builds (``--xla_cpu_max_isa``), and
CPU keys hold the level and what else XLA's code may use on this host (``extras``: the cap turns
off only what is newer than the level, and an int8 shift under the AVX2 cap is GFNI's), so hosts
of one level and one generation share entries. A target is checked twice:

- a host below the target never uses it: its CPU entries are keyed on its own ISA, uncapped, as
  without the setting, and one warning says so;
- an entry read under a target is decompressed first and the features it lists are checked
  against this host's (its CPUID, ``_isa``): one that lists a feature this host lacks is a miss,
  compiled again and replaced, never loaded; features whose instructions only an intrinsic emits
  (``rdseed``), and those the cap leaves XLA's code unable to use (``avx10.1``), are not held
  against it. What this host has is read from the CPU only, never from an entry.

Only CPU keys take the target. x86-64 levels only (XLA's AArch64 caps could not be checked here).
Entries list their features from jaxlib 0.8.2, so the target needs it. What was measured, and
why: docs/isa.md. A leaf at import (stdlib and ``_isa``); ``take``, on ``import jax``, reaches
``_jax`` and the files.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from typing import Any

from gkx_autocache import _isa

HOST = "host"
FLAG = "--xla_cpu_max_isa"
SINCE = (0, 8, 2)  # the first jaxlib seen to list an entry's features (0.7.2 lists none)

_V1 = ("64bit", "x87", "cmov", "cx8", "fxsr", "mmx", "sse", "sse2")
_V2 = _V1 + ("cx16", "sahf", "popcnt", "sse3", "sse4.1", "sse4.2", "ssse3", "crc32")
_V3 = _V2 + ("avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave")
_V4 = _V3 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
# level -> (XLA's cap, the LLVM features a host needs to run code built for it)
LEVELS = {"x86-64-v2": ("SSE4_2", _V2), "x86-64-v3": ("AVX2", _V3), "x86-64-v4": ("AVX512", _V4)}
NAMES = (HOST, *LEVELS)
# Features whose instructions LLVM emits only for their own intrinsics, which XLA's code never calls
# (random numbers, crypto, cache and system control). XLA lists them where CPUID shows them; code it
# builds runs without them.
INSTRUCTION_ONLY = frozenset({
    "adx", "aes", "vaes", "pclmul", "vpclmulqdq", "rdrnd", "rdseed", "sha", "sha512", "sm3", "sm4", "prfchw",
    "xsaveopt", "xsavec", "xsaves", "fsgsbase", "invpcid", "rtm", "hle", "mpx", "clflushopt", "clwb", "clzero",
    "wbnoinvd", "rdpru", "rdpid", "pku", "waitpkg", "cldemote", "movdiri", "movdir64b", "enqcmd", "serialize",
    "tsxldtrk", "pconfig", "sgx", "hreset", "uintr", "ptwrite", "cmpccxadd", "prefetchi", "raoint", "wrmsrns",
    "mwaitx", "lwp", "kl", "widekl", "shstk", "crc32"})
# The features XLA's cap turns off (``cpu_features.cc``'s ShouldEnableX86CpuFeature), newest last: a
# level's cap turns off its own row's successors.
_OFF_ABOVE: dict[str, Callable[[str], bool]] = {
    "SSE4_2": lambda f: f.startswith("avx") or f in ("f16c", "vpclmulqdq", "vaes", "fma") or f.startswith("fma"),
    "AVX2": lambda f: f.startswith("avx512") or f == "evex512",
    "AVX512": lambda f: f == "avx512vnni",
}
# AMX, which the AVX512_BF16 row turns off under every level's cap. APX (egpr, ndd...) is kept and held
# against an entry whatever the cap does with it: which XLA turns it off is not known, and a key that
# names a feature the code does not use costs a miss, while one that leaves out one it uses costs a crash.
_AMX = ("amx",)
# XLA's list turns features on before it turns any off (it sorts ``+`` before ``-``), and LLVM turning a
# feature off turns off every feature that implies it: AVX10 implies AVX-512's VNNI and BF16, which every
# level's cap turns off, so its code under a cap uses no AVX10, though the entry lists ``+avx10.1``.
_IMPLIES_OFF = ("avx10.",)


def xla_keeps(feature: str, cap: str) -> bool:
    """Whether XLA's code under ``--xla_cpu_max_isa=cap`` may use ``feature`` (where the host has it)."""
    order = list(_OFF_ABOVE)
    for row in order[order.index(cap):]:
        if _OFF_ABOVE[row](feature):
            return False
    return not (feature == "avx512bf16" or feature.startswith(_AMX) or feature.startswith(_IMPLIES_OFF))


def extras(level: str, features: frozenset[str]) -> tuple[str, ...]:
    """What code built under ``level`` on a host of ``features`` may use beyond the level: what the
    cap leaves on, less what only an intrinsic emits (``INSTRUCTION_ONLY``) and tuning (sorted)."""
    cap, needed = LEVELS[level]
    return tuple(sorted(f for f in features if f not in needed and f not in INSTRUCTION_ONLY
                        and not _isa.covers(frozenset(), f) and xla_keeps(f, cap)))


class Target:
    """What ``cpu_target`` came to in this process: the level CPU keys hold (None: the host's ISA),
    this host's features (what an entry read here may list) and those its reading can tell (``known``:
    CPUID's, or the kernel's flags'), why the host's ISA keys them where a level was asked for, and
    ``serves()``: whether the directory JAX uses now is the store's, which checks each entry's
    features before it is loaded (JAX's own cache checks nothing: there CPU keys keep the host's ISA)."""

    __slots__ = ("level", "machine", "host_features", "known", "why_host", "serves", "extras", "_lock", "_checked")

    def __init__(self, level: str | None, machine: str = "", host_features: frozenset[str] = frozenset(),
                 why_host: str | None = None, serves: Callable[[], bool] = lambda: False,
                 known: frozenset[str] = _isa.KNOWN) -> None:
        self.level = level
        self.machine = machine
        self.host_features = host_features
        self.known = known
        self.why_host = why_host
        self.serves = serves
        self.extras = extras(level, host_features) if level is not None else ()
        self._lock = threading.Lock()
        self._checked = False

    def isa_text(self) -> str:
        """What a CPU key holds in place of the host's ISA: the level, and what else XLA's code may
        use here (``x86_64:target=x86-64-v3,avxvnni,gfni``): hosts of one level share entries where
        those are the same."""
        return ",".join((f"{self.machine}:{_isa.TARGET_MARK}{self.level}", *self.extras))

    def forgo(self, why: str) -> None:
        """Not taken after all (``take``): CPU keys hold the host's ISA, and ``status`` says why."""
        self.level, self.why_host, self.extras = None, why, ()

    def keys(self, platform: str | None) -> bool:
        """Whether a key for ``platform`` holds the level: a CPU key, where the store serves, once XLA
        is known to have taken the cap (``took_cap``, at the first such key)."""
        if self.level is None or platform != "cpu" or not self.serves():
            return False
        if not self._checked:
            with self._lock:
                if not self._checked:
                    self._first_key()
                    self._checked = True
        return self.level is not None

    def _first_key(self) -> None:
        """At the first CPU key XLA's backend has read ``XLA_FLAGS``: the cap leaves them (children
        never see it), and where XLA did not take it (its backend started before ``import jax``
        ended, or ``XLA_FLAGS`` was replaced since) the host's ISA keys CPU entries, one warning."""
        from gkx_autocache._diagnostics import warn
        from gkx_autocache._jax import runtime as jax_runtime

        release()
        cap = LEVELS[str(self.level)][0]
        if jax_runtime.took_xla_flag(cap) is False:
            self.why_host = (f"cpu_target {self.level} not used, XLA did not take its cap ({FLAG}={cap}): its backend "
                             "started before gkx-autocache set it, or XLA_FLAGS was replaced after import jax; CPU "
                             "entries are keyed on this host's ISA, as with cpu_target = host")
            self.level = None
            warn("cpu_target", self.why_host)

    def foreign(self, payload: bytes) -> str | None:
        """Why an entry (decompressed) must not run here: the features it lists that this host lacks,
        among those this host's reading can tell (``known``: a newer feature it cannot is not held
        against an entry), but for those the cap turned off though the list names them (AVX10), or None."""
        capped = self.level is not None  # (what the cap turns off implicitly is listed on all the same)
        lacks = sorted(f for f in features_of(payload) if f in self.known and f not in INSTRUCTION_ONLY
                       and not _isa.covers(self.host_features, f) and not (capped and f.startswith(_IMPLIES_OFF)))
        if not lacks:
            return None
        return (f"built for {', '.join(lacks)}, which this CPU lacks (another host of cpu_target {self.level} "
                f"wrote it): compiled again here and replaced")


NONE = Target(None)  # no target (``host``): never taken, never changed
ADDED = "_GKX_AUTOCACHE_XLA_FLAG"  # the cap this package added to XLA_FLAGS, for a child to take out


def features_of(payload: bytes) -> frozenset[str]:
    """The ``+`` features of XLA's own target-machine record in an executable (decompressed: JAX's
    4-byte compile time, then the executable's protobuf, after a length-prefixed header from
    jaxlib 0.10), never of the program's data. XLA:CPU keeps LLVM's ``+64bit,+adx,...,-amx-tile,...``
    as the features field of a message that also names the target triple, two fields into the
    executable; a constant of the program's that spells such a list, or even such a message, lies
    deeper (in an instruction's literal), so the shallowest record is XLA's (issue 67's M1: a planted
    list taught a host a feature its CPU lacks). The fields are read breadth first, a depth at a
    time, each only where it holds a list: a large constant is passed over twice, not at every depth.
    Where no record is found (another jaxlib's layout), every list in the bytes counts: a list found
    that way can only refuse an entry, never admit one."""
    starts = [(4, len(payload))]  # jaxlib before 0.10: the executable at once
    try:
        size, at = _varint(payload, 4)
        starts.insert(0, (at + size, len(payload)))  # 0.10 and later: a header first
    except (ValueError, IndexError):
        pass
    found = _shallowest(payload, starts)
    return found if found is not None else _every_list(payload)


MAX_DEPTH = 8  # XLA's record is two fields down; a program's literal, five and more


def _shallowest(data: bytes, spans: list[tuple[int, int]]) -> frozenset[str] | None:
    """The features of the target-machine records at the shallowest depth under the messages
    ``spans`` (``data[at:end]``) that has any (a triple in field 1, the list in field 3), or None."""
    for _ in range(MAX_DEPTH):
        records: list[frozenset[str]] = []
        inner: list[tuple[int, int]] = []
        for at, end in spans:
            try:
                fields = _fields(data, at, end)
            except (ValueError, IndexError):
                continue
            triple, listed = fields.get(1), fields.get(3)
            if triple is not None and listed is not None and data.startswith(b"x86_64", triple[0], triple[1]) \
                    and data.count(b",", *listed) >= MIN_LIST and data[listed[0]:listed[0] + 1] in (b"+", b"-"):
                words = data[listed[0]:listed[1]].split(b",")
                records.append(frozenset(w[1:].decode() for w in words if w.startswith(b"+") and _FEATURE.fullmatch(w[1:])))
            else:
                inner.extend(span for span in fields.values() if data.find(b"+sse2,", *span) >= 0)
        if records:
            return frozenset().union(*records)
        if not inner:
            return None
        spans = inner
    return None


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(data: bytes, at: int, end: int) -> dict[int, tuple[int, int]]:
    """The length-delimited fields of the protobuf message in ``data[at:end]``, by number (the last
    of each), as ``(start, end)``; raises ValueError where those bytes are not one message."""
    fields = {}
    while at < end:
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if number == 0 or wire not in (0, 1, 2, 5):
            raise ValueError("not a message")
        if wire == 0:
            _, at = _varint(data, at)
        elif wire == 2:
            size, at = _varint(data, at)
            fields[number] = (at, at + size)
            at += size
        else:
            at += 8 if wire == 1 else 4
    if at != end:
        raise ValueError("a field past the end")
    return fields


def _every_list(payload: bytes) -> frozenset[str]:
    """The ``+`` features every target-feature list in the bytes names, found from ``+sse2,``, which
    every x86-64 list has, without a pattern run over megabytes."""
    found: set[str] = set()
    at = payload.find(b"+sse2,")  # (a list has dozens of names: fewer is other data, a constant of the user's)
    while at >= 0:
        start, end = at, at
        while start > 0 and payload[start - 1] in _LIST_BYTES:
            start -= 1
        while end < len(payload) and payload[end] in _LIST_BYTES:
            end += 1
        words = payload[start:end].split(b",")
        for word in words if len(words) >= MIN_LIST else ():
            word = word[word.rfind(b"+"):] if b"+" in word else b""  # a name holds no "+": the list's first, after text
            if _FEATURE.fullmatch(word[1:]):
                found.add(word[1:].decode())
        at = payload.find(b"+sse2,", end)
    return frozenset(found)


MIN_LIST = 16  # an x86-64 list names every feature LLVM knows, on or off: 200 and more
_LIST_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789_.-+,")
_FEATURE = re.compile(rb"[a-z0-9][a-z0-9_.-]*")


def choose(level: str, machine: str, features: list[str], unread: str | None, jaxlib: tuple[int, int, int] | None,
           xla_flags: str, serves: Callable[[], bool] = lambda: False, known: frozenset[str] = _isa.KNOWN) -> Target:
    """The target for this process: ``level`` where this host and this XLA can take it, else the
    host's ISA with the reason (one line for a warning and ``status``); ``serves``, ``known``: ``Target``'s."""
    if level == HOST:
        return NONE
    have = frozenset(features)
    why = None
    if machine not in ("x86_64", "AMD64"):
        why = f"it is an x86-64 level and this CPU is {machine}"
    elif unread is not None:
        why = f"this CPU's features cannot be read ({unread})"
    elif jaxlib is None or jaxlib < SINCE:
        why = (f"it needs jaxlib {'.'.join(map(str, SINCE))} or later, whose entries list the features they were "
               f"built for (this is jaxlib {'.'.join(map(str, jaxlib)) if jaxlib else 'unknown'})")
    elif lacks := [f for f in LEVELS[level][1] if f not in have]:
        why = f"this CPU is below it (it lacks {', '.join(lacks)})"
    elif (given := flag_in(xla_flags)) is not None and given.upper() != LEVELS[level][0]:
        why = f"XLA_FLAGS already sets {FLAG}={given}"
    if why is not None:
        return Target(None, machine, have, f"cpu_target {level} not used, {why}: CPU entries are keyed on this host's "
                                           "ISA, as with cpu_target = host", serves, known)
    return Target(level, machine, have, serves=serves, known=known)


def here(level: str, jaxlib: tuple[int, int, int] | None, xla_flags: str,
         serves: Callable[[], bool] = lambda: False) -> Target:
    """``choose`` for this host, its ISA read now."""
    host = _isa.read()
    return choose(level, host.machine, host.features, host.unread, jaxlib, xla_flags, serves, host.known())


def decide(level: str, serves: Callable[[], bool]) -> Target:
    """This process's target, chosen on ``import jax`` before any key (``here``: the host's ISA
    where it cannot take ``level``), not taken yet: ``take`` caps XLA once the store is known to serve."""
    from gkx_autocache._jax import versions as jax_versions

    if level == HOST:
        return Target(None)
    return here(level, jax_versions.version_tuple(jax_versions.jaxlib_version()), os.environ.get("XLA_FLAGS", ""), serves)


def take(jax: Any, target: Target, asked: str, serving: bool) -> None:
    """Cap XLA's CPU code at ``target``'s level and key CPU entries on it, where this host and this
    XLA can take it (``choose``) and the store serves (it checks each entry's features before JAX
    loads it); else one warning, and the host's ISA keys them (SPEC §15). On ``import jax``, once."""
    from gkx_autocache._diagnostics import logger, warn
    from gkx_autocache._jax import hooks as jax_hooks
    from gkx_autocache._jax import runtime as jax_runtime

    if asked == HOST:
        return
    why = None
    if not serving:
        why = (f"cpu_target {asked} not used, gkx-autocache's store does not serve the cache here (only it checks an "
               "entry's features before JAX loads it): CPU entries are keyed on this host's ISA")
    elif jax_runtime.backends_started(jax):
        why = (f"cpu_target {asked} not used, XLA's backend started before import jax finished, and it reads its "
               "cap then: CPU entries are keyed on this host's ISA")
    elif target.level is None:
        why = target.why_host
    if why is not None:
        warn("cpu_target", why)
        target.forgo(why)
        return
    jax_hooks.exclude_xla_flag(FLAG)  # the target is in the key's hook part; the flag leaves XLA_FLAGS
    add_flag(asked)
    logger.debug("cpu_target %s: XLA_FLAGS=%s", asked, os.environ["XLA_FLAGS"])


def strip_inherited(environ: Any = os.environ) -> None:
    """Take out of ``XLA_FLAGS`` the cap a parent process of this package added (it leaves them at its
    first compile; a child started before that has it): this process decides its own."""
    added = environ.pop(ADDED, None)
    flags = environ.get("XLA_FLAGS", "")
    if added and added in flags.split():
        environ["XLA_FLAGS"] = " ".join(w for w in flags.split() if w != added)


def add_flag(level: str, environ: Any = os.environ) -> None:
    """The level's cap into ``XLA_FLAGS``, read by XLA when its backend starts (``release`` takes it out)."""
    flags = environ.get("XLA_FLAGS", "")
    if flag_in(flags) is None:
        added = f"{FLAG}={LEVELS[level][0]}"
        environ["XLA_FLAGS"] = f"{flags} {added}".strip()
        environ[ADDED] = added


def release(environ: Any = os.environ) -> None:
    """XLA has read its flags: the cap this package added leaves ``XLA_FLAGS``, so that a process it
    starts (another Python, another JAX: 0.4.30's XLA stops on the flag) never inherits it. JAX's key
    leaves the flag out (``_jax.hooks.exclude_xla_flag``): keys stay the same."""
    strip_inherited(environ)


def flag_in(xla_flags: str) -> str | None:
    """The value of ``--xla_cpu_max_isa`` in an ``XLA_FLAGS`` string, or None."""
    value = None
    for word in xla_flags.split():
        name, _, given = word.partition("=")
        if name == FLAG:
            value = given
    return value


