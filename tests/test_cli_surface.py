"""The command line's everyday surface, as pip, uv and ccache users expect it (issue 61): progress on a
terminal for `prune`, `clear --shared`, `export` and `import` of large caches; a variable that names
the one settings file, or ignores them all (as ``PIP_CONFIG_FILE``); shell completion; ``-q`` and
``-v``. In-process through ``main`` (a terminal is a stream that says it is one), and bash for
real."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_activation import JAX_VERSION

from gkx_autocache import _cache, _settings
from gkx_autocache._cli.main import main


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def filled(root: Path, n: int) -> Path:
    """A version directory the package made (tagged), with ``n`` entries of 100 bytes."""
    vdir = Path(_cache.prepare(str(root), JAX_VERSION).version_dir or "")
    for i in range(n):
        (vdir / f"jit_f{i}-{i:064x}-cache").write_bytes(b"\x78\x01" + b"x" * 98)
    return vdir


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in [n for n in os.environ if n.startswith("GKX_JAX_CACHE")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("GKX_JAX_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("GKX_JAX_CACHE_CONFIG_FILE", os.devnull)
    return filled(tmp_path / "c", 1200)


def test_prune_export_and_import_say_their_progress_on_a_terminal_and_only_there(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["export", str(tmp_path / "b.tar")], ["prune", "--max-size", "1"],
                    ["import", str(tmp_path / "b.tar")]):
        screen = Terminal()
        monkeypatch.setattr(sys, "stderr", screen)
        assert main(command) == 0, screen.getvalue()
        drawn = screen.getvalue()
        assert f"\r{command[0]}: " in drawn and "/1200 files" in drawn and drawn.endswith("\r"), (command, drawn[-200:])
        assert capsys.readouterr().out  # the command's own line, on stdout as before
    pipe = io.StringIO()
    monkeypatch.setattr(sys, "stderr", pipe)  # not a terminal (a pipe, CI's log): no progress
    assert main(["prune", "--max-size", "1"]) == 0 and pipe.getvalue() == ""


def test_clear_shared_says_its_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared directory level's clear, on a terminal."""
    for name in [n for n in os.environ if n.startswith("GKX_JAX_CACHE")]:
        monkeypatch.delenv(name)
    shared = tmp_path / "team"
    shared.mkdir(mode=0o755)
    filled(shared, 700)
    monkeypatch.setenv("GKX_JAX_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("GKX_JAX_CACHE_SHARED", str(shared))
    monkeypatch.setenv("GKX_JAX_CACHE_CONFIG_FILE", os.devnull)
    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    assert main(["clear", "--shared", "--yes"]) == 0, screen.getvalue()
    assert "\rclear: " in screen.getvalue() and "/700 files" in screen.getvalue(), screen.getvalue()[-200:]


@pytest.fixture
def logger_kept() -> Iterator[None]:
    """The package's logger as it was: `-v` in this process adds a handler on the test's captured
    stderr (closed after it) and sets the level; a later test's log line would meet that stream."""
    from gkx_autocache._diagnostics import logger

    handlers, level = logger.handlers[:], logger.level
    yield
    logger.handlers = handlers
    logger.setLevel(level)


def test_quiet_prints_nothing_but_errors_and_verbose_says_the_steps(
        cache: Path, capsys: pytest.CaptureFixture[str], logger_kept: None) -> None:
    assert main(["-q", "prune", "--max-size", "1"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["prune", "-q", "--max-size", "bad"]) != 0
    assert "max-size" in capsys.readouterr().err  # an error is still said
    assert main(["-v", "dir"]) == 0
    said = capsys.readouterr()
    assert said.out.strip() == str(cache) and "the version directory:" in said.err, said
    assert main(["status", "-vv", "--no-probe"]) == 0
    assert "setting dir = " in capsys.readouterr().err


def test_one_variable_names_the_settings_file_or_ignores_them_all(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``GKX_JAX_CACHE_CONFIG_FILE``: that file in place of the environment's and the user's (as
    ``PIP_CONFIG_FILE``), which `config set` then writes; ``/dev/null``: none."""
    policy, user, named = tmp_path / "gkx-autocache.toml", tmp_path / "user.toml", tmp_path / "ci.toml"
    policy.write_text('max_size = "1GiB"\n')
    user.write_text('shared_write = "never"\n')
    named.write_text('max_size = "2GiB"\n')
    every = _settings.resolve(env={}, prefix=str(tmp_path), user_file=str(user))
    assert every["max_size"] == 1 << 30 and every["shared_write"] == "never"
    only = _settings.resolve(env={"GKX_JAX_CACHE_CONFIG_FILE": str(named)}, prefix=str(tmp_path), user_file=str(user))
    assert only["max_size"] == 2 << 30 and only["shared_write"] == "always" and list(only.files) == [str(named)]
    none = _settings.resolve(env={"GKX_JAX_CACHE_CONFIG_FILE": os.devnull}, prefix=str(tmp_path), user_file=str(user))
    assert none.origin("max_size") == "default" and not none.files
    monkeypatch.setenv("GKX_JAX_CACHE_CONFIG_FILE", str(named))
    assert main(["config", "set", "report", "true"]) == 0
    assert named.read_text() == 'max_size = "2GiB"\nreport = true\n' and policy.read_text() == 'max_size = "1GiB"\n'
    monkeypatch.setenv("GKX_JAX_CACHE_CONFIG_FILE", os.devnull)
    assert main(["config", "set", "report", "true"]) != 0


def test_bash_completes_commands_options_actions_and_keys() -> None:
    script = subprocess.run([sys.executable, "-m", "gkx_autocache", "completion", "bash"], capture_output=True,
                            text=True, check=True).stdout
    probe = script + r"""
for line in "gkx-autocache pr" "gkx-autocache prune --ma" "gkx-autocache config u" "gkx-autocache config set shared_t" \
            "gkx-autocache completion f"; do
  read -ra COMP_WORDS <<< "$line"; COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _gkx_autocache; echo "${COMPREPLY[*]}"
done
"""
    said = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout.splitlines()
    assert said == ["prune", "--max-size", "unset", "shared_timeout", "fish"], said
    for shell in ("zsh", "fish"):
        text = subprocess.run([sys.executable, "-m", "gkx_autocache", "completion", shell], capture_output=True,
                              text=True, check=True).stdout
        assert "prune" in text and "--max-size" in text.replace("-l max-size", "--max-size"), shell
