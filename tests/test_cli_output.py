"""What a newcomer reads (issue 71): columns that line up, advice said once, a warning that points
at the user's code, plain words, the cache's size against its cap, a declined ``clear`` that fails,
and ``status`` that does not recount a directory the package did not make."""

from __future__ import annotations

import io
import json
import os
import re
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from conftest import InProcess, planted_run

from gkx_autocache import _diagnostics, _entries

pytestmark = pytest.mark.every_python  # the command line's text


def columns(text: str, section: str, values: dict[str, str], origins: dict[str, str],
            longer: str) -> set[tuple[int, int]]:
    """Where each setting's value and origin begin in ``text`` (after the line ``section``, where
    one is given), each on its row; the row of ``longer``, whose value is too long for any column,
    gives where its value begins only."""
    lines = text.splitlines()
    if section:
        lines = lines[lines.index(section) + 1:]
    found = set()
    for key, value in values.items():
        line = next(line for line in lines if line.split()[:1] == [key])
        start = line.index(value, line.index(key) + len(key))
        assert line.endswith(f"{value}  {origins[key]}") or line.endswith(origins[key]), line  # one line
        found.add((start, -1 if key == longer else line.rindex(origins[key])))
    return found


def test_status_and_config_list_columns_line_up(here: InProcess, tmp_path: Path) -> None:
    """The longest key (``shared_credentials_over_http``) pushed its row's value and origin out of
    line, and so did a ``dir`` longer than the fixed value column (issue 71): each column is as wide
    as its widest cell, one line a setting, and a value too long for any column (a deep path) runs
    on in its own row rather than pushing every row's origin to the right."""
    root = tmp_path / "a-cache-folder-with-a-rather-long-name" / "for-the-columns"
    env = {"GKX_JAX_CACHE_DIR": str(root)}
    planted_run(root)
    data = json.loads(here.cli("--json", "status", env=env).stdout)
    settings = data["settings"]
    text = here.cli("status", env=env).stdout
    found = columns(text, "settings", {k: v["effective"] for k, v in settings.items()},
                    {k: v["origin"] for k, v in settings.items()}, "dir")
    assert len(found) == 2 and len({start for start, _ in found}) == 1, text
    listed = json.loads(here.cli("--json", "config", "list", env=env).stdout)["settings"]
    text = here.cli("config", "list", env=env).stdout
    found = columns(text, "", {k: v["written"] for k, v in listed.items()},
                    {k: v["origin"] for k, v in listed.items()}, "dir")
    assert len(found) == 2 and len({start for start, _ in found}) == 1, text
    assert max(len(line) for line in text.splitlines() if not line.startswith("file ") and str(root) not in line) < 80, text


def test_a_setting_skipped_gives_its_fix_once(here: InProcess) -> None:
    """A bad value's warning said "fix or remove it (fix it, or filter ...)" (issue 71): the fix is
    said once, and how to hide the warning after it."""
    (here.path / "gkx-autocache.toml").write_text('max_size = "bad"\n[')  # broken TOML: the file is skipped
    _, err = here.configure({"GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS": "soon"})
    said = _diagnostics_lines(err)
    assert len(said) == 2, err
    for line in said:
        assert len(re.findall(r"\bfix\b", line)) == 1, line
        assert line.endswith("(filter gkx_autocache.AutocacheWarning to hide it)"), line


def _diagnostics_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "AutocacheWarning" in line]


def test_a_warning_from_a_worker_thread_points_at_the_users_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """A warning raised in a thread of the package's (the shared level turned off by its reader)
    was located at ``gkx_autocache:0`` (issue 71): it points at the line of the user's that the main
    thread is on (the call that compiled, waiting for that read), as SPEC §6 asks."""
    monkeypatch.setattr(_diagnostics, "_said", set())
    worker = threading.Thread(target=_diagnostics.warn, args=("test:thread", "the level is off"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        worker.start()
        worker.join()  # (the user's line: the main thread waits here)
    (warning,) = caught
    assert warning.filename == __file__, (warning.filename, warning.lineno)
    assert warning.lineno == sys._getframe().f_lineno - 4


def test_a_warning_with_no_user_frame_points_at_the_import_of_jax(monkeypatch: pytest.MonkeyPatch) -> None:
    """At exit, no frame of the user's is on any thread: the warning points at the line that
    imported jax, which configuration noted, not at ``gkx_autocache:0``."""
    monkeypatch.setattr(_diagnostics, "_said", set())
    monkeypatch.setattr(_diagnostics, "_import_site", [])
    _diagnostics.note_import_site()  # what configuration does, on the user's import jax
    site = (__file__, sys._getframe().f_lineno - 1)
    monkeypatch.setattr(_diagnostics, "user_frame", lambda: None)
    monkeypatch.setattr(_diagnostics, "main_thread_frame", lambda: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _diagnostics.warn("test:exit", "uploads dropped at exit")
    (warning,) = caught
    assert (warning.filename, warning.lineno) == site


def test_stats_reset_and_the_store_are_said_in_plain_words(here: InProcess, tmp_path: Path) -> None:
    """No "0 ledgers folded and removed" and no "(gkx-autocache; what it gives on this JAX:
    features)" (issue 71)."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    planted_run(tmp_path / "c", warm=1)
    status = here.cli("status", env=env).stdout
    (store,) = [line for line in status.splitlines() if line.strip().startswith("store ")]
    assert "the package's own" in store and "features)" not in store and "gkx-autocache;" not in store, store
    said = here.cli("stats", "--reset", env=env).stdout
    assert "ledger" not in said and "folded" not in said and said.startswith("stats reset"), said
    assert json.loads(here.cli("--json", "stats", "--reset", env=env).stdout)["reset"] is True


def test_stats_says_the_cache_size_against_the_cap(here: InProcess, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``stats`` has ccache's "size / cap (%)" line, and ``--json`` (and ``gkx_autocache.stats()``)
    its figures (issue 71): what the cap counts (allocated blocks), the cap, and the share of it."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_MAX_SIZE": "1MiB"}
    vdir = planted_run(tmp_path / "c", warm=1)
    entries, size = _entries.count(str(vdir))
    text = here.cli("stats", env=env).stdout
    (line,) = [ln for ln in text.splitlines() if ln.startswith("cache size ")]
    share = round(100 * size / (1 << 20))
    assert re.fullmatch(rf"cache size \d+\.\d KiB of 1\.0 MiB \({share} %\), 2 entries", line), line
    data = json.loads(here.cli("--json", "stats", env=env).stdout)
    assert data["size"] == {"bytes": size, "entries": entries, "max_size": 1 << 20, "percent": round(100 * size / (1 << 20), 1)}
    for name, value in env.items():  # (the API reads the process's own environment)
        monkeypatch.setenv(name, value)
    from gkx_autocache import _api

    assert _api.stats()["size"] == data["size"]
    uncapped = here.cli("stats", env={**env, "GKX_JAX_CACHE_MAX_SIZE": "0"}).stdout
    assert re.search(r"^cache size \d+\.\d KiB, 2 entries \(no cap: max_size 0\)$", uncapped, re.M), uncapped


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("stdin", "answer"), [(Terminal, "n\n"), (Terminal, ""), (io.StringIO, "n\n"),
                                                (io.StringIO, "")],
                         ids=["no at a terminal", "end of input at a terminal", "no through a pipe", "no input"])
def test_a_clear_not_agreed_to_removes_nothing_and_fails(here: InProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          stdin: Any, answer: str) -> None:
    """``clear`` without ``--yes`` asks, and removes only on a yes, as apt and pip do: a "no"
    through a pipe was not read (it cleared, exit 0: issue 71), and the end of input at the prompt
    was "EOFError ... please report it". Each declines: exit 1, one line, every entry kept."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    vdir = planted_run(tmp_path / "c")
    before = sorted(p.name for p in vdir.iterdir())
    monkeypatch.setattr(sys, "stdin", stdin(answer))
    proc = here.cli("clear", env=env)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    said = [line for line in proc.stderr.splitlines() if "nothing removed" in line]
    assert len(said) == 1 and "report" not in proc.stderr and "--yes" in said[0], proc.stderr
    assert sorted(p.name for p in vdir.iterdir()) == before
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    assert here.cli("clear", env=env).returncode == 0 and not list(vdir.glob("*-cache"))


def foreign(folder: Path, n: int) -> Path:
    """A directory of ``n`` entries in JAX's format that the package did not make (stock JAX's, a
    copy): no ``.gkx-autocache`` in it, last written a while ago."""
    folder.mkdir(mode=0o700)
    for i in range(n):
        (folder / f"jit_f{i % 7}-{i:064x}-cache").write_bytes(b"x" * 100)
    past = time.time() - 60
    for path in [*folder.iterdir(), folder]:
        os.utime(path, (past, past))
    return folder


def test_status_keeps_the_count_of_a_directory_the_package_did_not_make(
        here: InProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory the package did not make has no ``.gkx-autocache/`` to keep its count in, and
    ``status`` wrote nothing there, so it counted every entry every time (3.3-5.7 s at 100 000,
    issue 71). The count is kept in the user's own cache instead, beside nothing of the directory's:
    a second ``status`` lists it no more, and a change to the directory is counted again."""
    own = foreign(tmp_path / "own", 50)
    env = {"JAX_COMPILATION_CACHE_DIR": str(own)}
    listed: list[int] = []
    real = _entries._count_in

    def counting(fd: int) -> tuple[int, int, float]:
        listed.append(fd)
        return real(fd)

    monkeypatch.setattr(_entries, "_count_in", counting)
    # (a count is kept only of a directory quiet for QUIET_SECS: its change time, made just now, cannot be set back)
    monkeypatch.setattr(_entries, "QUIET_SECS", -1.0)
    for _ in range(2):
        (present,) = json.loads(here.cli("--json", "status", env=env).stdout)["versions_present"]
        assert present["entries"] == 50
    assert len(listed) == 1, "the second status counted the directory again"
    assert sorted(p.name for p in own.iterdir() if not p.name.endswith("-cache")) == []  # nothing written in it
    (own / f"jit_new-{0:064x}-cache").write_bytes(b"x")
    (present,) = json.loads(here.cli("--json", "status", env=env).stdout)["versions_present"]
    assert present["entries"] == 51 and len(listed) == 2
