"""The records a process keeps (SPEC §18): at each entry the store writes (a miss's compile, never a
hit), what it takes to compile it again without the program, written beside the entry
(``<key>-gkx-record``), and a line in its program's list (``.gkx-autocache/programs/<program>``)
naming the key and the context it was compiled in (the XLA flags, the CPU), which tells a later
start of the same program whether it meets a cold start that is not a code change (``ahead``).
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gkx_autocache import _files, _fork
from gkx_autocache._diagnostics import logger
from gkx_autocache._layout import PROGRAMS_DIR

PROGRAM_LIMIT = 1 << 20  # a program's list is compacted past this (the keys of entries still there)
TEAM_UNSIGNED = "a team directory, without GKX_JAX_CACHE_SIGNING_KEY: its records would not be read"
LOCAL_ENV = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")


def context(isa: str, env: Any = os.environ) -> str:
    """What, beside a program's code, makes its keys: the XLA flags (``XLA_FLAGS``,
    ``LIBTPU_INIT_ARGS``, ``--xla`` arguments) and the CPU or ``cpu_target`` (``isa``), hashed. A
    program that starts in a context none of its records was made in meets a cold start that is
    not a code change."""
    flags = [f"{name}={env.get(name, '')}" for name in LOCAL_ENV]
    flags += sorted(a for a in sys.argv if isinstance(a, str) and a.startswith("--xla"))
    return hashlib.sha256("\0".join([*flags, isa]).encode("utf-8", "surrogatepass")).hexdigest()[:16]


class Program:
    """This process's program as records name it: its hashed identity (a shared level's manifest
    names it the same way), its label (``train.py``), and the context its keys are made in."""

    def __init__(self, ident: str, label: str, context: str) -> None:
        self.ident = ident
        self.label = label
        self.context = context


def this_program(isa: Callable[[], str]) -> Program:
    from gkx_autocache._diagnostics import label
    from gkx_autocache._shared import manifest

    return Program(manifest.identity(), label(), context(isa()))


class Keeper:
    """The records of the package's own directory ``version_dir``: written through ``write(key,
    bytes)`` (the local level's trusted write, ``LocalLevel.keep_record``), signed with ``secret``
    where one is set; ``team``: a team directory, whose records are read only when signed;
    ``program()``: this process's program, made at the first record (a run that only hits makes none)."""

    def __init__(self, version_dir: str, write: Callable[[str, bytes], int], team: bool, secret: bytes | None,
                 program: Callable[[], Program], jax_version: str) -> None:
        self.version_dir = version_dir
        self._write = write
        self._team = team
        self._secret = secret
        self._program_of = program
        self._program: Program | None = None
        self._jax_version = jax_version
        self._lock = threading.Lock()
        self._listed: set[str] = set()  # the keys this process put in its program's list
        _fork.in_child(self._forked)

    def _forked(self) -> None:  # a lock a thread of the parent held at the fork (a rebuild's note) stays held
        self._lock = threading.Lock()

    def program(self) -> Program:
        if self._program is None:
            self._program = self._program_of()
        return self._program

    def noted(self) -> set[str]:
        """The keys this process put in its program's list (its own records: not an earlier run's)."""
        with self._lock:
            return set(self._listed)

    def keep(self, key: str, compile_secs: float | None) -> tuple[int, str | None]:
        """This thread's compile, just written as ``key``: its record kept; the bytes written, and
        why no record was (None where one was). Never raises: it runs in JAX's compile path."""
        try:
            if self._team and self._secret is None:
                return 0, TEAM_UNSIGNED
            from gkx_autocache._jax import recipes as jax_recipes
            from gkx_autocache._rebuild import record

            found = jax_recipes.recipe()
            if isinstance(found, str):
                return 0, found
            fields, module = found
            program = self.program()
            fields.update(program=program.ident, label=program.label, key=key, jax=self._jax_version,
                          compile=round(compile_secs or 0.0, 6), written=round(time.time(), 3))
            data = record.encode(fields, module, self._secret)
            if len(data) > record.KEEP_LIMIT:
                return 0, f"its module is over {record.KEEP_LIMIT >> 20} MiB compressed"
            written = self._write(key, data)
            if not written:
                return 0, "the record could not be written (a disk full?)"
            self.note(key, program)
            return written, None
        except Exception as exc:  # a record must never cost a compile
            logger.debug("no record of %s: %s", key, exc)
            return 0, f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:200]

    def copy(self, key: str, data: bytes) -> int:
        """A rebuilt entry's record: the one it was rebuilt from (its fields name the program that
        compiled it first), listed for this process's context. Never raises."""
        try:
            written = self._write(key, data)
            if written:
                from gkx_autocache._rebuild import record

                fields = record.fields_of(data)
                program = self.program()
                self.note(key, Program(str(fields.get("program", "")), str(fields.get("label", "")), program.context))
            return written
        except Exception as exc:
            logger.debug("no record of %s: %s", key, exc)
            return 0

    def note(self, key: str, program: Program) -> None:
        """``<context> <key>`` appended to the program's list (one ``write``, ``O_APPEND``: whole
        lines), once a process; past ``PROGRAM_LIMIT``, the list is rewritten with the keys whose
        records are still there."""
        if not program.ident or key in self._listed:
            return
        folder = _files.bookkeeping_dir(self.version_dir, self._team, PROGRAMS_DIR)
        if folder is None:
            return
        with self._lock:
            self._listed.add(key)
        line = f"{program.context} {key}\n".encode()
        path = os.path.join(folder, program.ident)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _files.NOFOLLOW | _files.NONBLOCK,
                         _files.file_mode(self._team))
        except OSError as exc:
            logger.debug("%s not written: %s", path, exc)
            return
        try:
            os.write(fd, line)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if size > PROGRAM_LIMIT:
            compact(self.version_dir, path, self._team)


def compact(version_dir: str, path: str, team: bool) -> None:
    """A program's list rewritten with its lines whose records are still there, each once (a line
    another process appends meanwhile may be lost: ``rebuild`` reads every record anyway)."""
    from gkx_autocache._layout import RECORD_SIDECAR

    data = _files.read(path, 4 * PROGRAM_LIMIT) or b""
    kept: dict[bytes, None] = {}
    for line in data.splitlines():
        words = line.split(b" ")
        if len(words) == 2 and os.path.exists(os.path.join(version_dir, words[1].decode("ascii", "replace") + RECORD_SIDECAR)):
            kept[line] = None
    _files.write_atomic(path, b"".join(line + b"\n" for line in kept), _files.file_mode(team))


def listed(version_dir: str, program: str, team: bool = False) -> list[tuple[str, str]]:
    """A program's list in ``version_dir``: ``(context, key)`` in the order they were written; none
    where the list is not this user's to trust."""
    from gkx_autocache import _trust
    from gkx_autocache._layout import META_DIR, key_match

    path = os.path.join(version_dir, META_DIR, PROGRAMS_DIR, program)
    data = _files.read(path, 4 * PROGRAM_LIMIT, check=lambda st: _trust.entry_problem(st, team))
    found = []
    for line in (data or b"").splitlines():
        words = line.decode("ascii", "replace").split(" ")
        if len(words) == 2 and len(words[0]) == 16 and key_match(words[1] + "-cache") is not None:
            found.append((words[0], words[1]))
    return found
