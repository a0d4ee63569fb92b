"""``config set`` leaves a valid file that says exactly what it reported, keeping comments and
layout, or changes nothing and says why (SPEC §10, amended 2026-12-06; issue 61). In-process,
through the command line's ``main``, on the user's file (``XDG_CONFIG_HOME``)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from conftest import InProcess

from gkx_autocache._cli.main import main


@pytest.fixture
def user_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("GKX_JAX_CACHE_CONFIG", "GKX_JAX_CACHE_NO_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "config" / "gkx-autocache" / "config.toml"
    path.parent.mkdir(parents=True)
    return path


@pytest.mark.parametrize(("before", "after"), [
    ('# my cache\n"dir" = "/old"  # was\nmax_size = "1GiB"\n',
     '# my cache\ndir = "/new"  # was\nmax_size = "1GiB"\n'),
    ("'dir' = '/old'\n", 'dir = "/new"\n'),
    ('report = true\n[tool]\ndir = "/theirs"  # another tool\'s\n',
     'report = true\ndir = "/new"\n[tool]\ndir = "/theirs"  # another tool\'s\n'),
    ('note = """\ndir = "/in a string"\n"""\n', 'note = """\ndir = "/in a string"\n"""\ndir = "/new"\n'),
    ('dir = """\n/old"""\nreport = true\n', 'dir = "/new"\nreport = true\n'),
    ("paths = [\n  'dir = 1',\n]\n# end\n", "paths = [\n  'dir = 1',\n]\n# end\ndir = \"/new\"\n"),
    ('dir = """\n/old # not a comment\n"""  # a comment\n', 'dir = "/new"  # a comment\n'),
    ('dir = "/a#b"\t# mine # and more\n', 'dir = "/new"\t# mine # and more\n'),
    ("dir = 'c:\\x' # raw\r\nreport = true  # noisy\r\n", 'dir = "/new" # raw\r\nreport = true  # noisy\r\n'),
], ids=["quoted key", "literal quotes", "a [tool] table", "inside a multi-line string", "a multi-line value",
        "an array over lines", "a comment after a multi-line value", "a # inside the value", "CRLF lines"])
def test_set_edits_the_top_level_key_and_nothing_else(user_file: Path, before: str, after: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Each file is valid TOML that line-based editing broke or silently changed: a quoted key got
    a second `dir` (the file no longer parsed, so every setting in it was ignored); a `dir` under
    `[tool]` or inside a multi-line string was rewritten while `config set` reported success; the
    edited line's own comment was dropped (issue 71), and a CRLF file got one LF line."""
    user_file.write_text(before)
    assert main(["config", "set", "--user", "dir", "/new"]) == 0, capsys.readouterr().err
    assert user_file.read_bytes().decode() == after  # (read_text would turn CRLF into LF)
    data = tomllib.loads(after)
    assert data["dir"] == "/new"


def test_unset_removes_the_whole_statement(user_file: Path) -> None:
    user_file.write_text('# keep\ndir = """\n/old\n"""\n[tool]\ndir = 1\n')
    assert main(["config", "unset", "--user", "dir"]) == 0
    assert user_file.read_text() == "# keep\n[tool]\ndir = 1\n"


@pytest.mark.parametrize("before", ["dir.sub = 1\n", "max_size = [\n", 'dir = "/a"\ndir = "/b"\n'],
                         ids=["a dotted table of that name", "not valid TOML", "a key written twice"])
def test_an_edit_that_cannot_do_exactly_that_changes_nothing_and_says_why(
        user_file: Path, before: str, capsys: pytest.CaptureFixture[str]) -> None:
    user_file.write_text(before)
    assert main(["config", "set", "--user", "dir", "/new"]) != 0
    err = capsys.readouterr().err
    assert "left as it was" in err and len(err.strip().splitlines()) == 1, err
    assert user_file.read_text() == before


def test_set_keeps_the_comment_of_the_line_it_edits(user_file: Path) -> None:
    """``report = true  # noisy`` set to false keeps ``# noisy``, as the README says comments stay
    (issue 71: the edited line lost its comment)."""
    user_file.write_text("# mine\nreport = true  # noisy\nmax_size = '1GiB' # small\n")
    assert main(["config", "set", "--user", "report", "false"]) == 0
    assert main(["config", "set", "--user", "max_size", "2GiB"]) == 0
    assert user_file.read_text() == '# mine\nreport = false  # noisy\nmax_size = "2GiB" # small\n'


@pytest.mark.parametrize("before", [None, "", "# only a comment\n", "report = true\n[tool]\ndir = 1\n"],
                         ids=["no file", "an empty file", "a comment", "another table's key of that name"])
def test_unset_of_a_key_not_set_fails_and_changes_nothing(user_file: Path, before: str | None,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``config unset`` of a key the file does not set exits 1 with one line saying so, as pip's
    ``config unset`` and git's ``config --unset`` fail (issue 71: it said "removed" and exited 0),
    and writes nothing: no file, no folder made for it."""
    if before is None:
        user_file.parent.rmdir()
    else:
        user_file.write_text(before)
    assert main(["config", "unset", "--user", "dir"]) == 1
    err = capsys.readouterr().err
    assert f"dir is not set in {user_file}" in err and len(err.strip().splitlines()) == 1, err
    if before is None:
        assert not user_file.parent.exists()
    else:
        assert user_file.read_text() == before
    assert main(["--json", "config", "unset", "--user", "dir"]) == 1
    assert "is not set in" in json.loads(capsys.readouterr().out)["error"]


@pytest.mark.parametrize("action", [["config", "set", "--user", "report", "true"],
                                    ["config", "set", "--venv", "report", "true"], ["config", "unset", "--user", "report"]])
def test_editing_a_file_the_config_file_variable_hides_says_so(
        here: InProcess, user_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], action: list[str]) -> None:
    """With ``GKX_JAX_CACHE_CONFIG_FILE`` set, processes read the file it names in place of the
    user's and the policy file: ``config set --user`` (or ``--venv``) still writes the file asked
    for (the value may be meant for later, the variable unset), and says in one line that no process
    with this environment reads it, and which file they do (issue 71: it wrote it silently)."""
    named = tmp_path / "named.toml"
    monkeypatch.setenv("GKX_JAX_CACHE_CONFIG_FILE", str(named))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # (here's environment has none)
    user_file.write_text("report = false\n")
    assert main(action) == 0, capsys.readouterr().err
    err = capsys.readouterr().err
    assert "GKX_JAX_CACHE_CONFIG_FILE" in err and str(named) in err and len(err.strip().splitlines()) == 1, err
    assert not named.exists() and not (here.path / "gkx-autocache.toml").exists() or "--venv" in action
    user_file.write_text("report = false\n")
    assert main(["--json", *action]) == 0
    assert str(named) in json.loads(capsys.readouterr().out)["note"]
    # Without a flag, the file the variable names is the one written, and nothing needs saying.
    assert main(["config", "set", "report", "true"]) == 0
    assert capsys.readouterr().err == "" and named.read_text() == "report = true\n"
