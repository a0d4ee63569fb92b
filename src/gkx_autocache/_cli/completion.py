"""``gkx-autocache completion SHELL``: a completion script for bash, zsh or fish, made from the
command line's own parser (its commands, their options, ``config``'s actions and the setting keys),
so it never falls behind a new option."""

from __future__ import annotations

import argparse
from typing import Any

from gkx_autocache import _settings
from gkx_autocache._cli.output import OK

FILES = ("export", "import")  # commands whose argument is a file: the shell completes paths too


def _tree() -> tuple[list[str], dict[str, list[str]], dict[str, str]]:
    """The top level's options, each command's options, and each command's one-line help."""
    from gkx_autocache._cli.main import build_parser

    parser = build_parser()
    top = [s for a in parser._actions for s in a.option_strings]
    commands: dict[str, list[str]] = {}
    helps: dict[str, str] = {}
    sub: Any = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for choice in sub._choices_actions:
        helps[choice.dest] = choice.help or ""
    for name, command in sub.choices.items():
        commands[name] = sorted({s for a in command._actions for s in a.option_strings})
    return top, commands, helps


def bash() -> str:
    top, commands, _ = _tree()
    keys = " ".join(_settings.KEYS)
    cases = []
    for name, options in commands.items():
        words = " ".join(options)
        if name == "config":
            cases.append(f"""    config)
      case "$action" in
        "") COMPREPLY=($(compgen -W "list get set unset {words}" -- "$cur")) ;;
        get|set|unset) [ "$argc" -le 1 ] && COMPREPLY=($(compgen -W "{keys} --user --venv --json -q -v" -- "$cur")) ;;
      esac ;;""")
        else:
            files = " -f" if name in FILES else ""
            words = f"bash zsh fish {words}" if name == "completion" else words
            cases.append(f'    {name}) COMPREPLY=($(compgen{files} -W "{words}" -- "$cur")) ;;')
    body = "\n".join(cases)
    return f"""# gkx-autocache completion for bash: eval "$(gkx-autocache completion bash)" in ~/.bashrc
_gkx_autocache() {{
  local cur=${{COMP_WORDS[COMP_CWORD]}} command="" action="" argc=0 i word
  for ((i = 1; i < COMP_CWORD; i++)); do
    word=${{COMP_WORDS[i]}}
    case "$word" in -*) continue ;; esac
    if [ -z "$command" ]; then command=$word
    elif [ "$command" = config ] && [ -z "$action" ]; then action=$word
    else argc=$((argc + 1)); fi
  done
  COMPREPLY=()
  case "$command" in
    "") COMPREPLY=($(compgen -W "{' '.join(commands)} {' '.join(top)}" -- "$cur")) ;;
{body}
  esac
}}
complete -o default -F _gkx_autocache gkx-autocache
"""


def zsh() -> str:
    return ('# gkx-autocache completion for zsh: eval "$(gkx-autocache completion zsh)" in ~/.zshrc\n'
            "autoload -U +X bashcompinit && bashcompinit\n" + bash().split("\n", 1)[1])


def fish() -> str:
    top, commands, helps = _tree()
    lines = ["# gkx-autocache completion for fish: gkx-autocache completion fish > ~/.config/fish/completions/gkx-autocache.fish",
             "complete -c gkx-autocache -f"]
    names = " ".join(commands)
    for name in commands:
        said = helps.get(name, "").replace("'", "\\'")
        lines.append(f"complete -c gkx-autocache -n 'not __fish_seen_subcommand_from {names}' -a {name} -d '{said}'")
    for name, options in commands.items():
        for option in options:
            flag = f"-l {option[2:]}" if option.startswith("--") else f"-s {option[1:]}"
            lines.append(f"complete -c gkx-autocache -n '__fish_seen_subcommand_from {name}' {flag}")
        if name in FILES:
            lines.append(f"complete -c gkx-autocache -n '__fish_seen_subcommand_from {name}' -F")
    lines.append("complete -c gkx-autocache -n '__fish_seen_subcommand_from config' -a 'list get set unset'")
    lines.append("complete -c gkx-autocache -n '__fish_seen_subcommand_from completion' -a 'bash zsh fish'")
    lines.append(f"complete -c gkx-autocache -n '__fish_seen_subcommand_from get set unset' -a '{' '.join(_settings.KEYS)}'")
    return "\n".join(lines) + "\n"


def cmd_completion(args: argparse.Namespace) -> int:
    print({"bash": bash, "zsh": zsh, "fish": fish}[args.shell](), end="")
    return OK
