"""The everyday surface agrees (SPEC §10): a run's warning and report line, `status`, `explain` and
the Python API tell one story about a directory that cannot be used; in a process the hook
configured, `status()` says the hook is live and `stats()` gives this process's numbers beside the
directory's, each named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import InProcess, Venv, planted_run

pytestmark = pytest.mark.every_python  # the public API as each interpreter imports it

PROGRAM = "import jax, jax.numpy as jnp; print(float(jax.jit(lambda v: v * 2.0)(jnp.ones(3)).sum()))"


def test_a_directory_that_cannot_be_made_is_one_story_everywhere(venv: Venv, public: Path) -> None:
    """A root-owned volume (0755) named by GKX_JAX_CACHE_DIR, used by another user: the run warns
    that it is not used and runs uncached, its report line says so, and `status`, `explain` and
    `stats()` say the same (not "read-only, trusted, not created yet", not "served from it")."""
    volume = public / "volume"
    volume.mkdir(mode=0o755)
    env = {"GKX_JAX_CACHE_DIR": str(volume), "GKX_JAX_CACHE_REPORT": "1"}
    run = venv.run("-c", PROGRAM, env=env, user=65534)
    assert run.returncode == 0 and run.stdout.strip() == "6.0", run.stderr
    why = "it cannot be created: Permission denied"
    assert f"dir {volume} not used, {why}" in run.stderr, run.stderr
    (line,) = [ln for ln in run.stderr.splitlines() if ln.startswith("gkx-autocache:")]
    assert line.startswith("gkx-autocache: this run was uncached:") and why in line, line
    assert f"{why} ({volume}/jax-" in line, line  # the directory it could not make, whole (not its last name alone)
    status = venv.cli("status", env=env, user=65534)
    assert why in status.stdout and "not created yet" not in status.stdout, status.stdout
    explain = venv.cli("explain", env=env, user=65534)
    assert why in explain.stdout + explain.stderr and "served from it" not in explain.stdout, explain
    api = venv.run("-c", "import gkx_autocache\ntry:\n    gkx_autocache.stats()\nexcept gkx_autocache.AutocacheError as e:"
                   "\n    print(e)", env=env, user=65534)
    assert why in api.stdout, api.stdout + api.stderr
    assert list(volume.iterdir()) == []


def test_the_api_in_a_configured_process(venv: Venv, tmp_path: Path) -> None:
    """After `import jax` in a process the hook configured: `status()["hook_live"]` is true (as the
    command says `live`), and `stats()` holds this process's numbers under "process" beside the
    directory's under "stats" (every process since the last reset)."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    assert venv.run("-c", PROGRAM, env=env).returncode == 0  # an earlier process: in the directory's numbers only
    code = (PROGRAM + "\nimport json, gkx_autocache\nprint(json.dumps({'status': gkx_autocache.status(), "
            "'stats': gkx_autocache.stats()}))")
    proc = venv.run("-c", code, env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["status"]["hook_live"] is True, data["status"]
    stats = data["stats"]
    assert stats["process"]["hits"] >= 1 and stats["process"]["misses"] == 0, stats
    assert stats["stats"]["misses"] >= 1 and stats["stats"]["hits"] >= stats["process"]["hits"], stats


def test_a_writers_line_names_its_uploads(venv: Venv, tmp_path: Path) -> None:
    """A CI job that writes the shared level: its report line says how many entries it uploaded, and
    where (a second job, reading, uploads nothing and says nothing of it)."""
    team = tmp_path / "team"
    team.mkdir()
    env = {"GKX_JAX_CACHE_SHARED": str(team), "GKX_JAX_CACHE_REPORT": "1"}
    lines = []
    for local in ("a", "b"):
        proc = venv.run("-c", PROGRAM, env={**env, "GKX_JAX_CACHE_DIR": str(tmp_path / local)})
        assert proc.returncode == 0, proc.stderr
        (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("gkx-autocache:")]
        lines.append(line)
    uploaded = len([p for p in team.rglob("*-cache")])
    assert uploaded and f", {uploaded} uploaded to {team}, " in lines[0], (lines, uploaded)
    assert "uploaded" not in lines[1], lines


def test_status_reads_for_a_newcomer(here: InProcess, tmp_path: Path) -> None:
    """`status` after one run, as someone new reads it: the dir row gives the directory they set,
    on one line, its origin once (the version directory is under "directory"); no bare "(+ .start)",
    "store gkx-autocache" or "(installed)"; shared_write says it is unused with one level; the
    measures say which they are; the totals say they are every process's since the last reset."""
    root = tmp_path / "c"
    env = {"GKX_JAX_CACHE_DIR": str(root)}
    planted_run(root)  # one (cold) run
    text = here.cli("status", env=env).stdout
    (dir_row,) = [ln for ln in text.splitlines() if ln.strip().startswith("dir ")]
    assert dir_row.split()[1] == str(root) and dir_row.split()[-1] == "GKX_JAX_CACHE_DIR", dir_row
    assert text.count("env GKX_JAX_CACHE_DIR") == 1, text
    assert "(+ .start)" not in text and "(installed)" not in text, text
    (store_row,) = [ln for ln in text.splitlines() if ln.strip().startswith("store ")]
    assert "the package's own" in store_row, store_row
    (write_row,) = [ln for ln in text.splitlines() if ln.strip().startswith("shared_write ")]
    assert "unused" in write_row, write_row
    (version_row,) = [ln for ln in text.splitlines() if "on disk" in ln]
    assert "this JAX's" in version_row, version_row
    (stats_row,) = [ln for ln in text.splitlines() if ln.startswith("stats ")]
    assert "every process since" in stats_row and "written (compressed)" in stats_row, stats_row


def test_status_when_nothing_is_used_says_so(public: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused dir keeps what was set in its row; a disabled cache says so on the hook and stats
    rows; a default dir names its origin once."""
    here = InProcess(public, monkeypatch)  # where uid 65534 reaches it
    volume = public / "volume"
    volume.mkdir(mode=0o755)
    text = here.cli("status", env={"GKX_JAX_CACHE_DIR": str(volume)}, user=65534).stdout
    (dir_row,) = [ln for ln in text.splitlines() if ln.strip().startswith("dir ")]
    assert f"{volume} (not used: running uncached)" in dir_row, dir_row
    (stats_row,) = [ln for ln in text.splitlines() if ln.startswith("stats ")]
    assert "no directory is used" in stats_row, stats_row
    off = here.cli("status", env={"GKX_JAX_CACHE": "0"}).stdout
    assert "the cache is disabled" in off.splitlines()[1], off
    default = here.cli("status").stdout
    (dir_row,) = [ln for ln in default.splitlines() if ln.strip().startswith("dir ")]
    assert dir_row.count("default") == 1, dir_row


def test_the_users_own_jax_directory_keeps_records(here: InProcess, tmp_path: Path) -> None:
    """JAX_COMPILATION_CACHE_DIR, left as the user set it, is served by the store (SPEC §5, amended
    2026-12-04): `status` and `stats` count its runs, and status its entries. One that others can
    write keeps none, and `status` and `stats` say that (not "no process has used it")."""
    env = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "j")}
    planted_run(tmp_path / "j", version=None)  # a run the store served there
    text = here.cli("status", env=env).stdout
    (stats_row,) = [ln for ln in text.splitlines() if ln.startswith("stats ")]
    assert "misses" in stats_row and "no process" not in stats_row, stats_row
    assert any("entries" in ln and "on disk" in ln for ln in text.splitlines()), text
    assert "misses" in here.cli("stats", env=env).stdout
    (tmp_path / "open").mkdir()
    (tmp_path / "open").chmod(0o777)
    env = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "open")}
    here.configure(env)  # a process's import jax there: refused, it records nothing
    text = here.cli("status", env=env).stdout
    (stats_row,) = [ln for ln in text.splitlines() if ln.startswith("stats ")]
    assert "your own JAX directory" in stats_row and "no process" not in stats_row, stats_row
    said = here.cli("stats", env=env).stdout
    assert "your own JAX directory" in said and "no process" not in said, said


def test_dir_lists_the_api_and_loads_nothing() -> None:
    """``dir(gkx_autocache)`` lists what ``__getattr__`` loads on first use (``stats``, ``explain``,
    ``status``, ``AutocacheError``, ``AutocacheWarning``: tab completion, ``help()``), not the
    modules it imports for itself (issue 71: it listed ``os``, ``sys`` and ``TYPE_CHECKING``, and no
    API); every name it lists resolves, and listing them imports nothing. In a fresh interpreter:
    what it imports is the point."""
    import subprocess
    import sys

    code = ("import json, sys, gkx_autocache; before = set(sys.modules); names = dir(gkx_autocache); "
            "after = set(sys.modules) - before; [getattr(gkx_autocache, n) for n in names]; "
            "print(json.dumps({'names': names, 'loaded': sorted(after), 'all': gkx_autocache.__all__}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    data = json.loads(proc.stdout)
    names = set(data["names"])
    assert {"stats", "explain", "status", "AutocacheError", "AutocacheWarning", "install"} <= names, names
    assert not {"os", "sys", "TYPE_CHECKING"} & names, names
    assert set(data["all"]) <= names and data["names"] == sorted(names)
    assert data["loaded"] == [], data["loaded"]
