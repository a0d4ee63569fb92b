"""``gkx-autocache [--json] COMMAND``: the user's window into the cache. The parser, the one place
where errors become messages, and the smallest commands (``--version``, ``dir``, ``demo``); each
other command lives in the module of its group, imported only when it runs. Never imports ``jax``
(except ``demo``, which runs it in child processes)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import NoReturn

from gkx_autocache import _settings
from gkx_autocache._cli.output import FAILED, JSON_VERSION, OK, USAGE, CliError, emit
from gkx_autocache._context import NoDirectory, distribution_version, load_context, skipped_dir
from gkx_autocache._diagnostics import one_line


class UsageError(Exception):
    """argparse's complaint, raised rather than printed, so that ``--json`` can carry it."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser


class Parser(argparse.ArgumentParser):
    commands: tuple[str, ...] = ()  # the top level's, for a usage error to name its command

    def error(self, message: str) -> NoReturn:
        raise UsageError(self, message)


def cmd_version(args: argparse.Namespace) -> int:
    """From the distributions' metadata: no ``import jax``."""
    found = {name: distribution_version(dist) for name, dist in
             (("gkx-autocache", "gkx-autocache"), ("jax", "jax"), ("jaxlib", "jaxlib"))}
    found["python"] = sys.version.split()[0]
    line = "  ".join(f"{name} {version or '(not installed)'}" for name, version in found.items())
    from gkx_autocache import _status

    try:
        features, said = _status.line_features(load_context())
    except Exception as exc:  # a bad setting: --version still answers
        features, said = None, f"not known here: {exc}"
    emit(args, f"{line}\nfeatures {said}", {**found, "features": features, "features_said": said})
    return OK


def cmd_dir(args: argparse.Namespace) -> int:
    """The directory a process of this environment uses now; where the ``dir`` it was given is
    skipped, that said first (on stderr: stdout stays one bare path, as scripts read it)."""
    ctx = load_context()
    vdir = ctx.version_dir
    message = skipped_dir(ctx)
    if message is not None:
        print(f"gkx-autocache dir: {one_line(message)}; processes use {vdir}", file=sys.stderr)
    emit(args, vdir, {"dir": vdir, **({"warning": one_line(message)} if message is not None else {})})
    return OK


def cmd_demo(args: argparse.Namespace) -> int:
    from gkx_autocache._cli import demo as _demo

    code = _demo.demo(as_json=args.json)
    if code == OK and not args.json:
        ctx = load_context()
        where = ctx.location.version_dir if ctx.location and ctx.location.version_dir else ctx.why_no_dir()
        print(f"a normal run in this environment caches in: {where}")
    return code


# -- the other commands, each from its module, imported when it runs ------------------------------

ELSEWHERE = {  # command -> (its module in _cli, its function)
    "status": ("status", "cmd_status"), "stats": ("stats", "cmd_stats"), "explain": ("explain", "cmd_explain"),
    "ci-key": ("ci", "cmd_ci_key"), "clear": ("manage", "cmd_clear"), "prune": ("manage", "cmd_prune"),
    "verify": ("manage", "cmd_verify"), "export": ("manage", "cmd_export"), "import": ("manage", "cmd_import"),
    "config": ("config", "cmd_config"), "completion": ("completion", "cmd_completion"),
    "rebuild": ("rebuild", "cmd_rebuild"),
}


def elsewhere(command: str) -> Callable[[argparse.Namespace], int]:
    """The function of ``command``, importing its module only when it runs."""
    module, function = ELSEWHERE[command]

    def run(args: argparse.Namespace) -> int:
        import importlib

        return int(getattr(importlib.import_module(f"gkx_autocache._cli.{module}"), function)(args))

    return run


# -- the parser -----------------------------------------------------------------------------------


def build_parser() -> Parser:
    parser = Parser(prog="gkx-autocache", description="JAX's persistent compilation cache, on by default.")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--version", action="store_true", help="the versions of gkx-autocache, JAX, jaxlib and Python")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors (the exit status says it)")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="say what the package does on stderr (-v: its steps; -vv: every detail)")
    json_flag = Parser(add_help=False)
    json_flag.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="one JSON object on stdout")
    json_flag.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                           help="print nothing but errors (the exit status says it)")
    json_flag.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                           help="say what the package does on stderr (-v: its steps; -vv: every detail)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    def add(name: str, func: Callable[[argparse.Namespace], int], help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[json_flag], help=help, description=help)
        sub.set_defaults(func=func)
        return sub

    add("status", elsewhere("status"), "versions, hook, settings with origins, directory, store, stats (the default)").add_argument(
        "--no-probe", action="store_true", help="do not ask the shared level whether it answers")
    add("dir", cmd_dir, "print the version directory, bare")
    stats = add("stats", elsewhere("stats"), "hits, misses by cause, time saved across processes")
    stats.add_argument("--reset", action="store_true", help="start the totals again from zero")
    stats.add_argument("--written", action="store_true",
                       help="print only how many entries were written since the last reset (for CI: save when not 0)")
    explain = add("explain", elsewhere("explain"), "why the last run's compiles missed or were not cached, then older ones")
    explain.add_argument("--since", metavar="AGE", help="only what happened in the last AGE (30m, 12h, 2d)")
    explain.add_argument("--function", metavar="NAME", help="only this function (step, or jit_step)")
    explain.add_argument("--all", action="store_true", help="every function of each cause (else the first few)")
    add("ci-key", elsewhere("ci-key"), "a key for a CI cache: changes whenever the entries could stop being valid")
    clear = add("clear", elsewhere("clear"), "remove every entry (a fresh start: the stats and the history of misses too)")
    clear.add_argument("--all-versions", action="store_true", help="every JAX version's directory, not only this one's")
    clear.add_argument("--dry-run", action="store_true", help="say what would be removed, and remove nothing")
    clear.add_argument("--yes", action="store_true", help="do not ask")
    clear.add_argument("--shared", action="store_true", help="the shared level's entries, not the local level's")
    prune = add("prune", elsewhere("prune"), "remove least recently used entries, and say what remains")
    prune.add_argument("--max-size", metavar="SIZE", help="keep the directory under SIZE (default: max_size)")
    prune.add_argument("--older-than", metavar="AGE", help="remove entries unused for AGE (30d, 12h)")
    prune.add_argument("--stale-versions", action="store_true",
                       help="remove directories of JAX versions not installed here and unused for 30 days")
    prune.add_argument("--dry-run", action="store_true", help="say what would be removed, and remove nothing")
    prune.add_argument("--shared", action="store_true",
                       help="the shared level (it has no cap of its own: give --max-size or --older-than)")
    add("verify", elsewhere("verify"), "read back every entry; --repair removes the bad ones").add_argument(
        "--repair", action="store_true", help="remove the corrupt entries, orphan sidecars and stale temporaries found")
    config = add("config", elsewhere("config"), "show or edit the settings files (actions: list, get, set, unset)")
    actions = config.add_subparsers(dest="action", metavar="ACTION", required=True)
    where = Parser(add_help=False)
    group = where.add_mutually_exclusive_group()
    group.add_argument("--venv", action="store_true", help="the environment's policy file (the default)")
    group.add_argument("--user", action="store_true", help="your user config file")
    keys = ", ".join(_settings.KEYS)

    def action(name: str, text: str, writes: bool = True) -> argparse.ArgumentParser:
        """An action; one that writes a file takes --venv or --user (list and get read them all)."""
        return actions.add_parser(name, parents=[where, json_flag] if writes else [json_flag], help=text,
                                  description=text)

    action("list", "every setting: its value as written, and where it comes from", writes=False)
    action("get", "one setting: its value as written", writes=False).add_argument("key", help=f"one of: {keys}")
    setter = action("set", "write a setting into a settings file (validated first; a $VAR kept as typed)")
    setter.add_argument("key", help=f"one of: {keys}")
    setter.add_argument("value", help="the value, as you would write it (5GiB, $SCRATCH/jax, true)")
    action("unset", "remove a setting from a settings file").add_argument("key", help=f"one of: {keys}")
    add("export", elsewhere("export"), "write the entries to one archive (a warm bundle)").add_argument(
        "file", help="the archive to write (a tar)")
    bundle_in = add("import", elsewhere("import"), "merge a warm bundle's entries into the cache")
    bundle_in.add_argument("file", help="the archive to read")
    bundle_in.add_argument("--sha256", metavar="HASH", help="refuse unless the archive has this sha256 (from its author)")
    bundle_in.add_argument("--force", action="store_true", help="import a bundle made for another JAX or platform")
    rebuild = add("rebuild", elsewhere("rebuild"),
                  "compile again, in parallel, the entries recorded under another JAX version or other flags")
    rebuild.add_argument("--jobs", metavar="N", type=int, help="compile N at a time (default: the cores)")
    rebuild.add_argument("--program", metavar="NAME",
                         help="only the records of programs whose name contains NAME (train.py, pytest)")
    rebuild.add_argument("--from", dest="source", metavar="VERSION",
                         help="read the records of this JAX version's directory only (this: this one's); "
                              "default: this one's and the newest older one's")
    rebuild.add_argument("--dry-run", action="store_true", help="say what would be compiled, and compile nothing")
    add("demo", cmd_demo, "run a compile-heavy JAX program cold, then warm")
    add("completion", elsewhere("completion"), "print a shell's completion script (bash, zsh, fish)").add_argument(
        "shell", choices=("bash", "zsh", "fish"), help="the shell: eval \"$(gkx-autocache completion bash)\" in ~/.bashrc")
    parser.commands = tuple(commands.choices)
    return parser


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a path that is not UTF-8, a hostile ledger: escaped, never a traceback
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        return usage_error(parser, exc, sys.argv[1:] if argv is None else argv)
    if args.verbose:  # the package's own logger, on stderr (a user's logging set-up is left as it is)
        import logging

        from gkx_autocache._diagnostics import logger

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("gkx-autocache %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO if args.verbose == 1 else logging.DEBUG)
    if args.version:
        args.command = "version"
        return cmd_version(args)
    if args.command is None:
        args.command, args.func = "status", elsewhere("status")
    try:
        return int(args.func(args))
    except CliError as exc:
        return fail(args, str(exc), exc.code)
    except NoDirectory as exc:
        return fail(args, str(exc), FAILED)
    except BrokenPipeError:  # `gkx-autocache status | head`: the reader left; no traceback at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return FAILED
    except OSError as exc:  # a remote directory's failures arrive as one line (_remote.RemoteError)
        gone = "" if _settings.current_dir() else " (the current directory no longer exists: cd to one that does)"
        return fail(args, f"{exc}{gone}", FAILED)
    except KeyboardInterrupt:
        return FAILED
    except Exception as exc:  # a bug, or a platform a command was not made for: one line, never a traceback
        return fail(args, f"{type(exc).__name__}: {exc}; this is gkx-autocache's fault, please report it", FAILED)


def usage_error(parser: Parser, exc: UsageError, argv: list[str]) -> int:
    """Bad usage: argparse's usage and message, exit 2; with ``--json`` (spotted among the words,
    since parsing failed), the message as one line and one JSON object instead."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    if not any(len(word) >= 3 and "--json".startswith(word) for word in words):  # argparse takes --js for --json
        argparse.ArgumentParser.error(exc.parser, str(exc))  # prints the usage, exits 2
    command = next((word for word in words if word in parser.commands), None)
    hint = f"gkx-autocache {command} --help" if command else "gkx-autocache --help"
    return fail(argparse.Namespace(command=command, json=True), f"{exc} (see {hint})", USAGE)


def fail(args: argparse.Namespace, message: str, code: int) -> int:
    """The one place an error becomes a message: one line on stderr, and with ``--json`` one
    object on stdout that carries it."""
    line = one_line(message)
    print(f"gkx-autocache {args.command}: {line}" if args.command else f"gkx-autocache: {line}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"version": JSON_VERSION, "command": args.command, "error": line, "exit": code}))
    return code
