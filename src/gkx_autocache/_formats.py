"""The package's small on-disk formats as bytes: the compile-time sidecar beside an entry
(``<key>-gkx-compile``; also read from its file here, the one way every module reads it), the
store's verdict (``.gkx-autocache/store.json``) and the entry's compression, told by its magic bytes.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from typing import Any

from gkx_autocache import _files
from gkx_autocache._layout import META_DIR, VERDICT_FILE

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
MAX_COMPILE_SECS = 86400.0 * 7  # a sidecar claiming more was not written by a compile
SEAL_LIMIT = 4096  # the most read of a seal (``<key>-gkx-shared``): about 300 bytes are written
VERDICT_KEYS = ("store", "reason", "explain", "isa", "callbacks", "rebuild")
REBUILT_MARK = "rebuilt"  # a sidecar's third word where a rebuild compiled its entry (SPEC §18)
UNKEYED = "CPU entries are not keyed by ISA: "  # the verdict's "isa" where the ISA key is missing (then why)


def compression_of(data: bytes) -> str | None:
    """``"zstd"`` or ``"zlib"`` by the frame's magic bytes, None for neither."""
    if data[:4] == ZSTD_MAGIC:
        return "zstd"
    if len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0:
        return "zlib"
    return None


def sidecar(compile_secs: float, run: str = "", rebuilt: bool = False) -> bytes:
    """A compile-time sidecar's bytes: the compile time, and the run that compiled it (SPEC §13.1:
    an entry is "this run's" only when this run wrote it), where one did; ``rebuilt``: a rebuild
    compiled it from a record (SPEC §18), which ``stats`` counts the hits of."""
    if rebuilt:
        return f"{compile_secs:.6f} {run or '-'} {REBUILT_MARK}".encode()
    return f"{compile_secs:.6f} {run}".rstrip().encode()


def compile_secs_of(data: bytes | None) -> float | None:
    """The compile time a sidecar's bytes record, or None when there are none (or they are not a
    plausible number: a group member of a team cache can write anything there)."""
    try:
        value = float((data or b"").split(b" ", 1)[0])
    except ValueError:
        return None
    return value if 0.0 <= value <= MAX_COMPILE_SECS else None


def sidecar_run(data: bytes | None) -> str:
    """The run a sidecar's bytes name, or "" (none, or not a run's name: ``<start time>-<pid>``)."""
    words = (data or b"").split(b" ")
    run = words[1].decode("ascii", "replace") if len(words) > 1 else ""
    start, _, pid = run.partition("-")
    return run if len(run) <= 40 and pid.isdigit() and start.replace(".", "", 1).isdigit() else ""


def sidecar_rebuilt(data: bytes | None) -> bool:
    """Whether a sidecar's bytes say a rebuild compiled the entry (``sidecar``)."""
    return REBUILT_MARK.encode() in (data or b"").split(b" ")[2:3]


def read_compile_secs(sidecar: str) -> float | None:
    """The compile time a ``-gkx-compile`` sidecar records, or None when there is none (or it is
    not a plausible number: a group member of a team cache can write anything there)."""
    return read_sidecar(sidecar)[0]


def read_sidecar(sidecar: str) -> tuple[float | None, float, str, bool]:
    """``(compile seconds or None, when the entry was written, the run that wrote it or "", whether a
    rebuild compiled it)``: the sidecar is written with its entry and never touched after (hits touch
    the entry, for recency), so its mtime is the entry's write time; 0.0 when there is no sidecar."""
    written: list[float] = []

    def when(st: os.stat_result) -> None:
        written.append(st.st_mtime)

    data = _files.read(sidecar, 64, check=lambda st: when(st))
    return compile_secs_of(data), (written[0] if written else 0.0), sidecar_run(data), sidecar_rebuilt(data)


def verdict(store: str, reason: str | None, explain: str | None, isa: str | None,
            callbacks: str | None = None, rebuild: str | None = None) -> bytes:
    """``store.json``: which store serves the directory, why not the package's, whether misses are
    explained (None: they are; else why not), what to know of the ISA in CPU keys (None: nothing),
    whether compiles with host callbacks are cached (None: they are; else why not), whether entries
    are written with records a rebuild reads (None: they are; else why not)."""
    return (json.dumps({"store": store, "reason": reason, "explain": explain, "isa": isa,
                        "callbacks": callbacks, "rebuild": rebuild}) + "\n").encode()


def parse_verdict(data: bytes | None) -> dict[str, Any] | None:
    try:
        found = json.loads(data or b"")
    except (ValueError, RecursionError):
        return None
    if not isinstance(found, dict):
        return None
    return {k: v if isinstance(v, str) else None for k, v in found.items() if k in VERDICT_KEYS}


def write_verdict(version_dir: str, store: str, reason: str | None, team: bool = False,
                  explain: str | None = None, isa: str | None = None, callbacks: str | None = None,
                  rebuild: str | None = None) -> None:
    """Record which store serves the directory, whether misses are explained and what to know of
    the ISA in CPU keys (``verdict``), so ``status`` can say it without importing jax."""
    text = verdict(store, reason, explain, isa, callbacks, rebuild)
    path = os.path.join(version_dir, META_DIR, VERDICT_FILE)
    if _files.read(path) == text:
        return
    if _files.bookkeeping_dir(version_dir, team) is not None:
        _files.write_atomic(path, text, 0o644)


def read_verdict(version_dir: str) -> dict[str, Any] | None:
    return parse_verdict(_files.read(os.path.join(version_dir, META_DIR, VERDICT_FILE), 4096))


def verdict_written(version_dir: str) -> float:
    """When the verdict last changed (a process that configured JAX with another store than the one
    before), or 0.0."""
    try:
        return os.lstat(os.path.join(version_dir, META_DIR, VERDICT_FILE)).st_mtime
    except OSError:
        return 0.0


class Verdict:
    """The directory's verdict file (``write_verdict``): which store serves it, whether misses are
    explained, what to know of the ISA in CPU keys. Written once those are known, and again where
    the user's code replaces the package's key hook after ``import jax`` (the key's seam calls
    ``rewrite`` with what to say of it: ``_key.Seam.replaced_note``)."""

    def __init__(self) -> None:
        self._write: Callable[..., None] | None = None  # None: nothing written (a read-only directory)
        self._unkeyed: str | None = None
        self._replaced: str | None = None

    def write(self, version_dir: str, store: str, reason: str | None, team: bool, explain: str | None,
              unkeyed: str | None, callbacks: str | None, rebuild: str | None = None) -> None:
        self._write = functools.partial(write_verdict, version_dir, store, reason, team, explain=explain,
                                        callbacks=callbacks, rebuild=rebuild)
        self._unkeyed = unkeyed
        self.rewrite()

    def rewrite(self, replaced: str | None = None) -> None:
        """Write (again); ``replaced``: what to say of the key's hook the user's code replaced."""
        self._replaced = replaced or self._replaced
        if self._write is not None:
            self._write(isa=f"{UNKEYED}{self._unkeyed}" if self._unkeyed else self._replaced)
