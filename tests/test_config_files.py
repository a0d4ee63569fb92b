"""``config set`` leaves a valid file that says exactly what it reported, keeping comments and
layout, or changes nothing and says why (SPEC §10, amended 2026-12-06; issue 61). In-process,
through the command line's ``main``, on the user's file (``XDG_CONFIG_HOME``)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

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
     '# my cache\ndir = "/new"\nmax_size = "1GiB"\n'),
    ("'dir' = '/old'\n", 'dir = "/new"\n'),
    ('report = true\n[tool]\ndir = "/theirs"  # another tool\'s\n',
     'report = true\ndir = "/new"\n[tool]\ndir = "/theirs"  # another tool\'s\n'),
    ('note = """\ndir = "/in a string"\n"""\n', 'note = """\ndir = "/in a string"\n"""\ndir = "/new"\n'),
    ('dir = """\n/old"""\nreport = true\n', 'dir = "/new"\nreport = true\n'),
    ("paths = [\n  'dir = 1',\n]\n# end\n", "paths = [\n  'dir = 1',\n]\n# end\ndir = \"/new\"\n"),
], ids=["quoted key", "literal quotes", "a [tool] table", "inside a multi-line string", "a multi-line value",
        "an array over lines"])
def test_set_edits_the_top_level_key_and_nothing_else(user_file: Path, before: str, after: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Each file is valid TOML that line-based editing broke or silently changed: a quoted key got
    a second `dir` (the file no longer parsed, so every setting in it was ignored); a `dir` under
    `[tool]` or inside a multi-line string was rewritten while `config set` reported success."""
    user_file.write_text(before)
    assert main(["config", "set", "--user", "dir", "/new"]) == 0, capsys.readouterr().err
    assert user_file.read_text() == after
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
