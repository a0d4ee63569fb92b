"""``gkx-autocache config``: show the settings files' values as written and where they come from
(``list``, ``get``), and edit them (``set``, validated first; ``unset``)."""

from __future__ import annotations

import argparse
import os
import sys

from gkx_autocache import _policy, _settings
from gkx_autocache._cli.output import OK, USAGE, CliError, emit, table
from gkx_autocache._context import load_context
from gkx_autocache._diagnostics import one_line, shown


def _key(name: str) -> _settings.Key:
    if name.lower() in ("signing_key", _settings.SIGNING_KEY_ENV.lower()):  # its value is never echoed
        raise CliError(f"the signing key is a secret: it is read from {_settings.SIGNING_KEY_ENV} in the environment "
                       "only, never written to a settings file", USAGE)
    if name not in _settings.KEYS:
        raise CliError(f"unknown key {shown(name)}; known keys: {', '.join(_settings.KEYS)}", USAGE)
    return _settings.KEYS[name]


def _config_get_skipped(args: argparse.Namespace, name: str, resolved: _settings.Resolved, origin: str, written: str,
                        why: str) -> int:
    """``config get`` of a value skipped here: as written, where written, and a note (on stderr) of
    why it does not apply for this user, and what does."""
    unset = _settings.unset_variables(written) if name == "dir" else []
    if unset:
        names = ", ".join(f"${n}" for n in unset)
        why = f"{names} {'is' if len(unset) == 1 else 'are'} not set here"
    instead = f"{resolved.shown()} ({resolved.origin})" if resolved.origin != "default" else "the default"
    note = f"note: {why}, so {name} from {origin} is skipped for you; {instead} applies"
    print(f"gkx-autocache config: {one_line(note)}", file=sys.stderr)
    emit(args, written, {"key": name, "value": resolved.value, "written": written, "origin": origin, "note": note,
                         "effective": {"value": resolved.value, "written": resolved.shown(), "origin": resolved.origin}})
    return OK


def cmd_config(args: argparse.Namespace) -> int:
    if args.action in ("list", "get"):
        settings = load_context().settings
        if args.action == "get":
            name = _key(args.key).name
            resolved = settings.values[name]
            skipped = settings.skipped.get(name)
            if skipped is not None:  # a file shared by users who set its $VARS: shown as written, and why not here
                return _config_get_skipped(args, name, resolved, *skipped)
            emit(args, resolved.shown(), {"key": name, "value": resolved.value, "written": resolved.shown(),
                                          "origin": resolved.origin})
            return OK
        lines = table([(k, r.shown(), r.origin) for k, r in settings.values.items()])
        lines += [f"file {p}: {v.status}" for p, v in settings.files.items()]
        emit(args, "\n".join(lines), {"settings": {k: {"value": r.value, "written": r.shown(), "origin": r.origin}
                                                   for k, r in settings.values.items()},
                                      "files": {p: v.status for p, v in settings.files.items()}})
        return OK
    key = _key(args.key)
    named = _settings.config_files(os.environ, sys.prefix, None)
    hidden = None  # a note where the file edited is one no process of this environment reads
    if os.environ.get(_settings.CONFIG_FILE_ENV, "").strip() and not (args.user or args.venv):
        if not named:  # /dev/null: every file ignored
            raise CliError(f"{_settings.CONFIG_FILE_ENV} is {os.devnull}: no settings file is read, so none is "
                           "written; unset it, or give --user or --venv")
        path: str | None = named[0]  # the file processes read now (pip config does the same)
    else:
        path = _policy.user_path() if args.user else _policy.policy_path()
        if os.environ.get(_settings.CONFIG_FILE_ENV, "").strip():
            # The file asked for is written (the value may be meant for when the variable is unset),
            # and the user told, since processes with this environment read another one, or none.
            reads = f"read {named[0]}" if named else "read no settings file"
            hidden = (f"note: {_settings.CONFIG_FILE_ENV} is set, so processes with this environment {reads} in "
                      f"place of {path}: this applies only where the variable is unset")
    if path is None:
        raise CliError("this user has no config directory: HOME is not set (or not absolute) and the password "
                       "database does not know the uid; set HOME or XDG_CONFIG_HOME, or edit the policy file (--venv)")
    if args.action == "unset":
        try:
            _policy.set_key(path, key.name, None)
        except _policy.NotSet:
            # As pip's `config unset` and git's `config --unset` of a key that is not there: a failure.
            raise CliError(f"{key.name} is not set in {path}: nothing removed") from None
        except _policy.Unwritable as exc:
            raise CliError(str(exc)) from None
        if hidden:
            print(f"gkx-autocache config: {one_line(hidden)}", file=sys.stderr)
        emit(args, f"{key.name} removed from {path}", {"key": key.name, "file": path, **({"note": hidden} if hidden else {})})
        return OK
    raw: str = args.value
    # Written as typed, so a $VAR the setter lacks is no reason to refuse: other users of the
    # file may set it. Checked with a stand-in for it, so every other fault is still refused.
    unset = _settings.unset_variables(raw) if key.name == "dir" else []
    try:
        cwd = _settings.current_dir()
        value = _settings.validate(key.name, raw, cwd, {**os.environ, **{name: f"/{name}" for name in unset}})
        typed = _policy.as_typed(key.name, raw, value, cwd)
        literal = _policy.format_value(typed)
    except (_settings.BadValue, _policy.Unwritable) as exc:
        raise CliError(f"{key.name}: {exc}; {path} left as it was", USAGE) from None
    try:
        _policy.set_key(path, key.name, literal)
    except _policy.Unwritable as exc:
        raise CliError(str(exc)) from None
    note = hidden
    if hidden:
        print(f"gkx-autocache config: {one_line(hidden)}", file=sys.stderr)
    if unset:
        names = ", ".join(f"${name}" for name in unset)
        said = (f"note: {names} {'is' if len(unset) == 1 else 'are'} not set for you now, so {key.name} will be a bad "
                f"value for anyone without {'it' if len(unset) == 1 else 'them'} (written as typed)")
        print(f"gkx-autocache config: {said}", file=sys.stderr)
        note = f"{note}; {said}" if note else said
        value = typed  # what was written: its expansion is each reader's
    emit(args, f"{key.name} = {literal} written to {path}",
         {"key": key.name, "value": value, "file": path, **({"note": note} if note else {})})
    return OK
