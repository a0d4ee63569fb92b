"""The TOML files of SPEC §3: where they are, reading them (trusted ones only), editing one key.

Both files are flat tables of the keys in ``_settings.KEYS``::

    dir = "/scratch/jax-cache"
    max_size = "20GiB"

Editing is line-based, so comments and the rest of the file survive ``config set``.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from gkx_autocache._diagnostics import shown
from gkx_autocache._files import atomic, open_regular
from gkx_autocache._trust import file_problem

POLICY_NAME = "gkx-autocache.toml"


def policy_path(prefix: str = sys.prefix) -> str:
    """The environment's policy file, beside pip's own per-environment config."""
    return os.path.join(prefix, POLICY_NAME)


def user_path() -> str | None:
    """The user's config file; None for a user without a home: then there is none."""
    from gkx_autocache._userdirs import user_dir

    folder = user_dir("config", "gkx-autocache")
    return None if folder is None else os.path.join(folder, "config.toml")


class FileVerdict:
    """A settings file: used, ignored (and why) or absent; its keys where used. A plain class: a
    NamedTuple costs ~0.3 ms to create, on the way of every `import jax`."""

    __slots__ = ("status", "data", "problem")

    def __init__(self, status: str, data: Mapping[str, Any] = MappingProxyType({}), problem: str | None = None) -> None:
        self.status = status  # "absent", "used", "ignored"
        self.data = data
        self.problem = problem  # one line, for a warning


MAX_FILE = 1 << 20  # a settings file is a few lines: more is a mistake or an attack


def read(path: str) -> FileVerdict:
    """The file's keys, or why it is not used. Never raises, never blocks (a FIFO, a device)."""
    import stat

    try:
        # A symlink is judged by its target; O_BINARY: Windows would otherwise translate line ends.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        return FileVerdict("absent")
    except OSError as exc:
        return FileVerdict("ignored", problem=f"{path}: file ignored, it cannot be read ({exc.strerror}); fix or remove it")
    try:
        st = os.fstat(fd)
        distrust = (None if stat.S_ISREG(st.st_mode) else "it is not a regular file") or file_problem(st)
        if distrust is None and st.st_size > MAX_FILE:
            distrust = f"it is larger than {MAX_FILE // 1024} KiB"
        if distrust:
            os.close(fd)
            return FileVerdict("ignored", problem=f"{path}: file ignored, {distrust}")
        with os.fdopen(fd, "rb") as f:
            text = f.read(MAX_FILE).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return FileVerdict("ignored", problem=f"{path}: file ignored, it cannot be read ({exc}); fix or remove it")
    import tomllib  # only when there is a file: its import compiles regular expressions

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return FileVerdict("ignored", problem=f"{path}: file ignored, it is not valid TOML ({exc}); fix or remove it")
    return FileVerdict("used", data)


class Unwritable(ValueError):
    """A value that cannot be written as one TOML string."""


def format_value(value: Any) -> str:
    """A TOML literal for a validated value; raises Unwritable for a string with a control
    character (a newline would break the file, and the whole file would then be ignored) or one
    that is not text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if not text.isprintable():  # control characters, and line separators (U+2028, U+0085) as well
        raise Unwritable(f"{shown(text)} holds a control character or line break and cannot be one TOML string")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise Unwritable(f"{shown(text)} is not text (undecodable bytes in the argument)") from None
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def as_typed(key: str, typed: str, value: Any, cwd: str | None) -> Any:
    """What ``config set`` writes: the user's own words for ``dir``, ``shared`` and ``max_size`` (a shared
    policy file keeps ``$SCRATCH/jax`` for everyone, not the setter's expansion), a relative path
    made absolute against ``cwd`` (what the user meant; in the file it would be relative to the
    file's folder); the parsed value for the rest."""
    text = typed.strip()
    if key == "max_size":
        return text
    if key in ("dir", "shared"):
        if "://" in text or text.startswith(("/", "~", "$")) or cwd is None:  # validated: then absolute
            return text
        return os.path.join(cwd, text)
    return value


def _key_line(key: str) -> re.Pattern[str]:
    return re.compile(rf"^\s*{re.escape(key)}\s*=")


def set_key(path: str, key: str, literal: str | None) -> None:
    """Write ``key = literal`` into the file (``None`` removes the key), keeping every other line.
    Atomic: a temporary file beside it, then a rename."""
    try:
        with os.fdopen(open_regular(path), "rb") as f:  # never a FIFO: it would hang
            lines = f.read(MAX_FILE).decode("utf-8").split("\n")
    except FileNotFoundError:
        lines = []
    except (OSError, UnicodeDecodeError) as exc:
        raise Unwritable(f"{path} cannot be read as a settings file ({exc}); fix or remove it") from None
    if lines and lines[-1] == "":
        lines.pop()
    pattern = _key_line(key)
    kept = [line for line in lines if not pattern.match(line)]
    if literal is not None:
        at = next((i for i, line in enumerate(lines) if pattern.match(line)), None)
        new = f"{key} = {literal}"
        if at is None:
            # Before the first [table], so the key stays at the top level.
            first_table = next((i for i, line in enumerate(kept) if line.lstrip().startswith("[")), len(kept))
            kept.insert(first_table, new)
        else:
            kept.insert(at - sum(1 for line in lines[:at] if pattern.match(line)), new)
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    with atomic(path, 0o644, follow=True) as f:  # the user's path; writable by its owner alone (SPEC §8)
        f.write(("\n".join(kept) + ("\n" if kept else "")).encode("utf-8"))
