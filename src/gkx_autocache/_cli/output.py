"""What every command prints through: the exit codes, the one failure a command raises, its
output (human text, or one versioned JSON object with ``--json``), progress on a terminal, times."""

from __future__ import annotations

import argparse
import json
import sys
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
    else:
        print(printable(human))


def progress(message: str) -> None:
    """A progress line on a terminal's stderr; never mixed into stdout (or --json)."""
    if sys.stderr.isatty():
        print(f"\r{printable(message)}", end="", file=sys.stderr, flush=True)


def local_time(t: float | None) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "?"
