"""The TOML files of SPEC §3: where they are, reading them (trusted ones only), editing one key.

Both files are flat tables of the keys in ``_settings.KEYS``::

    dir = "/scratch/jax-cache"
    max_size = "20GiB"

Editing is line-based, so comments and the rest of the file survive ``config set``; the lines a key
spans are found by a small scan of TOML's syntax (strings on many lines, quoted keys, the tables
that end the top level), and the edited text is parsed again before it is written: an edit that does
not do exactly what it says (any other key or table changed, the file no longer valid) changes
nothing and says why (SPEC §10, amended 2026-12-06). No TOML library that keeps layout is a
dependency for this one command (tomlkit would be one more package in every environment).
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


def _statements(text: str) -> tuple[dict[str, tuple[int, int, str]], int]:
    """The top-level keys of a TOML text, each with the lines its statement spans (``[first,
    last]``: a value may run over several, a string of many lines or an array) and the comment that
    ends its last line, with the blanks before it (``"  # noisy"``, or ``""``), by the key's name
    as TOML reads it (``"dir"`` and ``'dir'`` are ``dir``); and the line where the top level ends
    (the first table header, or the end). A scan of the syntax, not a parser: what it gets wrong,
    the parse after the edit refuses."""
    lines = text.split("\n")
    found: dict[str, tuple[int, int, str]] = {}
    string: str | None = None  # the delimiter of a string running over lines: ''' or """
    depth = 0  # brackets and braces open in a value
    key: str | None = None
    begun = 0
    for number, line in enumerate(lines):
        at = 0
        comment = ""
        if string is None and depth == 0:
            stripped = line.lstrip()
            if stripped.startswith("["):
                return found, number
            match = re.match(r"""\s*("(?:[^"\\]|\\.)*"|'[^']*'|[A-Za-z0-9_-]+)\s*=""", line)
            if match:
                key, begun = match[1].strip("\"'") if match[1][0] in "\"'" else match[1], number
                at = match.end()
        while at < len(line):
            if string is not None:
                close = line.find(string, at)
                if close < 0:
                    break
                at, string = close + 3, None
                continue
            c = line[at]
            if c == "#":
                comment = line[len(line[:at].rstrip(" \t")):].removesuffix("\r")
                break
            if line.startswith(('"""', "'''"), at):
                string, at = line[at:at + 3], at + 3
                continue
            if c in "\"'":  # a string on one line: to its closing quote
                at += 1
                while at < len(line) and line[at] != c:
                    at += 2 if c == '"' and line[at] == "\\" else 1
            elif c in "[{":
                depth += 1
            elif c in "]}":
                depth = max(depth - 1, 0)
            at += 1
        if key is not None and string is None and depth == 0:
            found.setdefault(key, (begun, number, comment))
            key = None
    return found, len(lines)


class NotSet(LookupError):
    """``config unset`` of a key the file does not set."""


def edited(text: str, key: str, literal: str | None) -> str:
    """``text`` with ``key = literal`` at its top level (``None``: the key removed), every other
    line as it was, and the edited line's own comment kept; raises NotSet to remove a key the top
    level does not hold, and Unwritable where the result would not be exactly that (the text does
    not parse, or would not, or would differ in anything else)."""
    import tomllib

    try:
        before = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise Unwritable(f"it is not valid TOML ({exc}): fix it first") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    # A file of CRLF lines gets a CRLF line: one LF line among them is a diff on every edit.
    end = "\r" if lines and all(line.endswith("\r") for line in lines) else ""
    spans, top = _statements("\n".join(lines))
    span = spans.get(key)
    if span is None and literal is None:
        raise NotSet(key)
    if span is not None:
        first, last, comment = span
        lines[first:last + 1] = [] if literal is None else [f"{key} = {literal}{comment}{end}"]
    elif literal is not None:  # before the first [table], so that it stays at the top level
        lines.insert(top, f"{key} = {literal}{end}")
    after_text = "\n".join(lines) + ("\n" if lines else "")
    try:
        after = tomllib.loads(after_text)
    except tomllib.TOMLDecodeError:
        after = None
    wanted = dict(before)
    wanted.pop(key, None)
    if literal is not None:
        wanted[key] = tomllib.loads(f"v = {literal}")["v"]
    if after != wanted:
        raise Unwritable(f"a line edit of {key} would not do exactly that here (its layout: a dotted or inline "
                         f"table, a key written twice?); edit it by hand: {key} = {literal or '...'} at the top, "
                         "before any [table]")
    return after_text


def set_key(path: str, key: str, literal: str | None) -> None:
    """Write ``key = literal`` into the file (``None`` removes the key), keeping every other line
    (``edited``). Atomic: a temporary file beside it, then a rename. Raises Unwritable, or NotSet
    (``None`` for a key the file, or a file that is not there, does not set), the file left as it
    was."""
    try:
        with os.fdopen(open_regular(path), "rb") as f:  # never a FIFO: it would hang
            text = f.read(MAX_FILE).decode("utf-8")
    except FileNotFoundError:
        text = ""
    except (OSError, UnicodeDecodeError) as exc:
        raise Unwritable(f"{path} cannot be read as a settings file ({exc}); fix or remove it") from None
    try:
        new = edited(text, key, literal)
    except Unwritable as exc:
        raise Unwritable(f"{path} left as it was: {exc}") from None
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    with atomic(path, 0o644, follow=True) as f:  # the user's path; writable by its owner alone (SPEC §8)
        f.write(new.encode("utf-8"))
