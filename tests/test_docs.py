"""The documentation (README and docs/) keeps up with the package: every command, option and setting
appears in it, every relative link resolves, and the README stays a user's guide."""

from __future__ import annotations

import argparse
import re

from conftest import ROOT

from gkx_autocache import _settings
from gkx_autocache._cli import main as _cli

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def text() -> str:
    return "\n".join(path.read_text() for path in DOCS)


def commands_and_options() -> list[str]:
    """Every command (`config list` too) and every option of the command line."""
    found: list[str] = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found.append(" ".join([*path, name]))
                    walk(sub, [*path, name])
            else:
                found.extend(option for option in action.option_strings if option.startswith("--"))

    walk(_cli.build_parser(), [])
    return sorted(set(found) - {"--help"})


def test_every_command_option_and_setting_is_documented() -> None:
    docs = text()
    missing = [c for c in commands_and_options() if not re.search(rf"(?<![\w-]){re.escape(c)}(?![\w-])", docs)]
    missing += [f"{key.name} / {key.env}" for key in _settings.KEYS.values()
                if f"`{key.name}`" not in docs or f"`{key.env}`" not in docs]
    assert missing == [], missing


def test_every_relative_link_resolves() -> None:
    broken = []
    for path in DOCS:
        for target in re.findall(r"\]\(([^)]+)\)", path.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            if not resolved.exists():
                broken.append(f"{path.name}: {target}")
            elif anchor and resolved.suffix == ".md":
                headings = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                            for h in re.findall(r"^#+ (.+)$", resolved.read_text(), re.M)}
                if anchor not in headings:
                    broken.append(f"{path.name}: {target} (no such heading)")
    assert broken == [], broken


def test_the_readme_is_a_users_guide_with_the_two_commands_first() -> None:
    """At most ~350 lines; its first block holds the install-and-demo command and the test command,
    labelled for contributors; it speaks of the package's contract, not of SPEC sections."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 360, len(readme.splitlines())
    first = re.search(r"```sh\n(.*?)```", readme, re.S)
    assert first is not None and "gkx-autocache demo" in first[1] and "bash .ci/run" in first[1]
    assert "contributor" in first[1].lower()
    assert "SPEC" not in readme
