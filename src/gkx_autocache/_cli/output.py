"""What every command prints through: the exit codes, the one failure a command raises, its
output (human text, or one versioned JSON object with ``--json``), progress on a terminal, times."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from gkx_autocache._context import JSON_VERSION as JSON_VERSION  # (the commands' names for them)
from gkx_autocache._context import CliError as CliError
from gkx_autocache._diagnostics import printable

OK, FAILED, USAGE = 0, 1, 2


def emit(args: argparse.Namespace, human: str, data: dict[str, Any]) -> None:
    """A command's output: one JSON object (which escapes every control character), or its human
    text with every control character but the newline escaped (a server's error message, a ledger's
    line, a file's name never write terminal escapes)."""
    if args.json:
        print(json.dumps({"version": JSON_VERSION, "command": args.command, **data}, default=str))
    elif not getattr(args, "quiet", False):  # -q: the exit status says it (errors are still said)
        print(printable(human))


VALUE_COLUMN = 44  # the widest a value column grows: a deeper path would push every row's origin right


def table(rows: list[tuple[str, str, str]], indent: str = "") -> list[str]:
    """Rows of a name, a value and where it comes from, one line each, in columns as wide as their
    widest cell (the values' at most ``VALUE_COLUMN``): a value too long for its column (a deep path)
    runs on in its own row, and pushes no other row's origin out of line."""
    names = max((len(name) for name, _, _ in rows), default=0)
    width = max((len(value) for _, value, _ in rows if len(value) <= VALUE_COLUMN), default=0)
    return [f"{indent}{name:<{names}}  {value:<{width}}  {origin}" for name, value, origin in rows]


def progress(message: str) -> None:
    """A progress line on a terminal's stderr; never mixed into stdout (or --json)."""
    if sys.stderr.isatty():
        print(f"\r{printable(message)}", end="", file=sys.stderr, flush=True)


def counter(args: argparse.Namespace, label: str) -> Callable[[int, int], None] | None:
    """For a long command on a terminal (prune, clear, export, import of 100 000 entries): a line on
    stderr, ``prune: 4000/100000 files``, redrawn at most ten times a second and cleared at the end;
    None off a terminal or with -q (nothing is printed there, as pip and uv do)."""
    if getattr(args, "quiet", False) or not sys.stderr.isatty():
        return None
    import time

    at, width = [0.0], [0]

    def count(done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - at[0] < 0.1:
            return
        at[0] = now
        line = f"{label}: {done}/{total} files"
        if done >= total:  # cleared: what follows (the command's own line) starts a clean line
            print("\r" + " " * max(len(line), width[0]) + "\r", end="", file=sys.stderr, flush=True)
            return
        width[0] = len(line)
        print(f"\r{printable(line)}", end="", file=sys.stderr, flush=True)

    return count


def local_time(t: float | None) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "?"
