"""The documentation (README and docs/) keeps up with the package: every command, option and setting
appears in it, every relative link resolves, and the README stays a user's guide."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from conftest import ROOT, Venv

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


SIM = """
import jax, jax.numpy as jnp

@jax.jit
def energy(x):
    return jnp.sum(x ** 2)

@jax.jit
def step(x):
    return x - 0.1 * jax.grad(lambda y: jnp.sum(y ** 2))(x)

x = jnp.linspace(0.0, 1.0, 16)
for _ in range(3):
    x = step(x)
print(float(energy(x)))
"""


def example(heading: str) -> list[str]:
    """The lines of the README's first code block after ``heading``."""
    readme = (ROOT / "README.md").read_text()
    found = re.search(rf"^## {re.escape(heading)}\n.*?```\n(.*?)```", readme, re.S | re.M)
    assert found is not None, heading
    return found[1].splitlines()


def outputs(lines: list[str]) -> dict[str, list[str]]:
    """Each ``$ command`` of an example and the lines it printed, as the example shows them."""
    said: dict[str, list[str]] = {}
    for line in lines:
        if line.startswith("$ "):
            command = line[2:].split("  #")[0].strip()
            said[command] = []
        else:
            said[command].append(line)
    return said


def normal(line: str) -> str:
    """A line with what differs from run to run and machine to machine masked: times, durations,
    sizes, the cache's path and JAX's version, which functions' tracing took longest."""
    line = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "<time>", line)
    line = re.sub(r"/\S*/jax-\d[\w.]*", "<dir>", line)
    line = re.sub(r"\d+\.\d+ s\b", "<s>", line)
    line = re.sub(r"\d+(\.\d+)? (B|KiB|MiB|GiB)\b", "<size>", line)
    return re.sub(r"\((?:(?:jit_\w+|the rest) <s>(?:, )?)+\)", "(<by function>)", line)


def matches(shown: list[str], printed: list[str]) -> bool:
    """Whether the example's lines are what was printed, masked alike; a line ``...`` stands for any
    number of printed lines (the rest of the output, or up to the next line shown)."""
    if not shown:
        return not printed
    if shown[0].strip() == "...":
        return any(matches(shown[1:], printed[i:]) for i in range(len(printed) + 1))
    return bool(printed) and normal(shown[0]) == normal(printed[0]) and matches(shown[1:], printed[1:])


def test_the_readme_explain_example_is_what_explain_prints(venv: Venv, tmp_path: Path) -> None:
    """The README's "When a warm run misses" example, run as it says (a cold run, a warm one, one
    with ``XLA_FLAGS`` changed, then ``explain --since 1m``) on a program like the one it names:
    the report line and ``explain``'s text are the example's, line by line, times, sizes and paths
    aside (issue 71: the example showed a format explain no longer printed)."""
    said = outputs(example("When a warm run misses"))
    venv.env.pop("PYTEST_XDIST_WORKER", None)  # (the runs are a script's, not an xdist worker's)
    (tmp_path / "sim.py").write_text(SIM)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "cache"), "GKX_JAX_CACHE_REPORT": "1"}
    printed: dict[str, list[str]] = {}
    for command in said:
        words = command.split()
        extra = dict(word.split("=", 1) for word in words if "=" in word.split("/")[0])
        words = [word for word in words if "=" not in word.split("/")[0]]
        if words[0] == "python":
            runs = 2 if not extra and not printed else 1  # "cold, then warm"
            for _ in range(runs):
                proc = venv.run(str(tmp_path / words[1]), env={**env, **extra}, cwd=str(tmp_path))
                assert proc.returncode == 0, proc.stderr
            printed[command] = [line for line in proc.stderr.splitlines() if line.startswith("gkx-autocache:")]
        else:
            assert words[0] == "gkx-autocache", command
            proc = venv.cli(*words[1:], env=env)
            assert proc.returncode == 0, proc.stderr
            printed[command] = proc.stdout.splitlines()
    for command, shown in said.items():
        if command.startswith("python") and not shown:
            continue  # (the cold and warm runs: the example shows no output of theirs)
        assert matches(shown, printed[command]), (command, shown, printed[command])
