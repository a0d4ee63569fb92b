"""The `gkx-autocache` command against populated caches (SPEC §10): on planted caches in this
process (``here``: the settings, the directory, what each command does to the files), and, where
real runs fill the cache, in a test venv."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import InProcess, Venv, clean_env, planted_run
from test_activation import JAX_VERSION, VERSION_DIR

from gkx_autocache._cli import main as _cli
from gkx_autocache._cli.output import JSON_VERSION
from gkx_autocache._layout import TAG

pytestmark = pytest.mark.every_python  # the command line: argparse's messages differ between Pythons

DAY = 86400.0


def status(venv: Venv | InProcess, **env: str) -> dict[str, Any]:
    proc = venv.cli("--json", "status", env=env)
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


@pytest.mark.line  # what the command does to the cache, not argparse's words: each JAX line's first Python
def test_status_origins_for_every_source(here: InProcess, tmp_path: Path) -> None:
    """status --json names where each value came from: env, policy file, user file, JAX, default."""
    (here.path / "gkx-autocache.toml").write_text('max_size = "1GiB"\n')
    xdg = tmp_path / "xdg"
    (xdg / "gkx-autocache").mkdir(parents=True)
    (xdg / "gkx-autocache" / "config.toml").write_text("report = true\n")
    data = status(here, GKX_JAX_CACHE_TRUST_SHARED="0", XDG_CONFIG_HOME=str(xdg),
                  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="3")
    origins = {k: v["origin"] for k, v in data["settings"].items()}
    assert origins["trust_shared"] == "env GKX_JAX_CACHE_TRUST_SHARED"
    assert origins["max_size"] == str(here.path / "gkx-autocache.toml") and data["settings"]["max_size"]["value"] == 1024**3
    assert origins["report"] == str(xdg / "gkx-autocache" / "config.toml")
    assert origins["min_compile_time_secs"] == "JAX (JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS)"
    assert origins["dir"] == "default" and origins["min_entry_size_bytes"] == "default"
    assert data["jax"] == JAX_VERSION and data["start_files"]["gkx_autocache.pth"]
    assert data["directory"]["version_dir"] == str(here.default_cache / VERSION_DIR)
    assert any("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" in a for a in data["attention"])


def test_status_does_not_import_jax_and_reads_the_ledger(here: InProcess, tmp_path: Path) -> None:
    """status works without importing jax (nor NumPy or ml_dtypes, whose versions it reads), and
    shows the entries and stats of (planted) runs."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    planted_run(tmp_path / "c", warm=1)
    code = ("import sys; from gkx_autocache._cli.main import main; main(['status']); "
            "print('JAX IMPORTED' if {'jax', 'numpy', 'ml_dtypes'} & set(sys.modules) else 'no jax')")
    # A fresh process of this interpreter: whether it imports jax is the point (no venv needed).
    proc = subprocess.run([sys.executable, "-c", code], env=clean_env(HOME=str(here.home), **env), cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=600, check=True)
    assert proc.stdout.strip().endswith("no jax")
    assert "hits" in proc.stdout and "gkx-autocache" in proc.stdout
    data = status(here, **env)
    assert data["stats"]["hits"] >= 2 and data["store"]["store"] == "gkx-autocache"
    (present,) = data["versions_present"]
    assert present["installed"] and present["entries"] >= 2


@pytest.mark.line  # what the command does to the cache, not argparse's words: each JAX line's first Python
def test_status_vouches_for_jax_own_directory_only_where_it_is_trusted(here: InProcess, tmp_path: Path) -> None:
    """The user's JAX_COMPILATION_CACHE_DIR is used as set: the store serves it where the trust
    rules allow (SPEC §8); one others can write is read by no one, and said so (amended 2026-12-06),
    unless read_untrusted_dir lets JAX's stock cache read it unchecked."""
    own = tmp_path / "own"
    data = status(here, JAX_COMPILATION_CACHE_DIR=str(own))
    assert data["directory"]["version_dir"] == str(own) and data["directory"]["trusted"] is True
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    data = status(here, JAX_COMPILATION_CACHE_DIR=str(open_to_all))
    assert data["directory"]["trusted"] is None and data["store"]["store"] == "none"
    text = here.cli("status", env={"JAX_COMPILATION_CACHE_DIR": str(open_to_all)}).stdout
    assert "refused: no entry read" in text and "others can write to it" in text and "reads no entry" in text, text
    unchecked = {"JAX_COMPILATION_CACHE_DIR": str(open_to_all), "GKX_JAX_CACHE_READ_UNTRUSTED_DIR": "1"}
    assert status(here, **unchecked)["store"]["store"] == "jax"
    assert "read unchecked" in here.cli("status", env=unchecked).stdout


def test_dir_prints_the_bare_version_directory(here: InProcess) -> None:
    proc = here.cli("dir")
    assert proc.returncode == 0 and proc.stdout == f"{here.default_cache / VERSION_DIR}\n"


def test_config_set_validates_and_status_shows_it(here: InProcess) -> None:
    """A bad value exits 2 and leaves the file as it was; a good one shows up with its file."""
    policy = here.path / "gkx-autocache.toml"
    policy.write_text("# mine\nreport = true\n")
    proc = here.cli("config", "set", "min_compile_time_secs", "abc")
    assert proc.returncode == 2 and "min_compile_time_secs" in proc.stderr and len(proc.stderr.splitlines()) == 1
    assert policy.read_text() == "# mine\nreport = true\n"
    assert here.cli("config", "set", "min_compile_time_secs", "0.5").returncode == 0
    assert here.cli("config", "set", "--user", "max_size", "2GiB").returncode == 0
    data = status(here)
    assert data["settings"]["min_compile_time_secs"]["value"] == 0.5
    assert data["settings"]["min_compile_time_secs"]["origin"] == str(policy)
    assert data["settings"]["max_size"]["value"] == 2 * 1024**3
    assert data["settings"]["max_size"]["origin"].endswith("gkx-autocache/config.toml")
    assert policy.read_text().startswith("# mine\n")
    assert here.cli("config", "unset", "report").returncode == 0
    assert "report" not in policy.read_text()
    assert here.cli("config", "get", "nonsense").returncode == 2


def _plant(vdir: Path, n: int, size: int = 1000, start: float | None = None) -> list[Path]:
    vdir.mkdir(parents=True, exist_ok=True)
    (vdir / "CACHEDIR.TAG").write_text(TAG)
    now = time.time() if start is None else start
    paths = []
    for i in range(n):
        p = vdir / f"jit_p{i:03d}-{i:064x}-cache"
        import zlib

        p.write_bytes(zlib.compress(os.urandom(size)))
        os.utime(p, (now - 1000 + i, now - 1000 + i))
        paths.append(p)
    return paths


@pytest.mark.line  # what the command does to the cache, not argparse's words: each JAX line's first Python
def test_prune_max_size_least_recent_first_and_dry_run(here: InProcess) -> None:
    vdir = here.default_cache / VERSION_DIR
    planted = _plant(vdir, 20)
    size = sum(p.stat().st_size for p in planted)
    proc = here.cli("prune", "--max-size", str(size // 2), "--dry-run")
    assert proc.returncode == 0 and "would remove" in proc.stdout
    assert all(p.exists() for p in planted)
    proc = here.cli("--json", "prune", "--max-size", str(size // 2))
    assert json.loads(proc.stdout)["entries"] >= 10
    left = [p for p in planted if p.exists()]
    assert sum(p.stat().st_size for p in left) <= size // 2
    assert left == planted[-len(left):]  # the most recently used survive


@pytest.mark.line  # what the command does to the cache, not argparse's words: each JAX line's first Python
def test_prune_stale_versions_keeps_the_installed_one(here: InProcess) -> None:
    current = _plant(here.default_cache / VERSION_DIR, 2, start=time.time() - 60 * DAY)
    old = _plant(here.default_cache / "jax-0.0.1", 2, start=time.time() - 60 * DAY)
    (here.default_cache / "jax-0.0.2").mkdir()  # not ours: no tag
    assert here.cli("prune", "--stale-versions", "--max-size", "0").returncode == 0
    assert all(p.exists() for p in current)
    assert not (here.default_cache / "jax-0.0.1").exists() and not any(p.exists() for p in old)
    assert (here.default_cache / "jax-0.0.2").exists()


@pytest.mark.line  # what the command does to the cache, not argparse's words: each JAX line's first Python
def test_verify_repair_removes_only_the_corrupt(here: InProcess) -> None:
    here.run_program()
    vdir = here.default_cache / VERSION_DIR
    good = sorted(vdir.glob("*-cache"))
    bad = vdir / f"jit_bad-{'e' * 64}-cache"
    bad.write_bytes(b"not zlib at all")
    orphan = vdir / f"jit_gone-{'f' * 64}-gkx-compile"
    orphan.write_text("0.5")
    os.utime(orphan, (time.time() - 7200, time.time() - 7200))  # a killed writer's (a young one may be mid-put)
    proc = here.cli("verify")
    assert proc.returncode == 1 and "jit_bad" in proc.stdout and "jit_gone" in proc.stdout
    assert here.cli("verify", "--repair").returncode == 0
    assert not bad.exists() and not orphan.exists() and all(p.exists() for p in good)
    assert here.cli("verify").returncode == 0
    warm, _ = here.run_program()
    assert warm["hits"] == warm["requests"]


@pytest.mark.line  # what the command does to the cache, not argparse's words: each JAX line's first Python
def test_clear_needs_our_tag(here: InProcess, tmp_path: Path) -> None:
    """clear removes nothing from a directory without the package's CACHEDIR.TAG."""
    root = tmp_path / "untagged"
    vdir = root / VERSION_DIR
    planted = _plant(vdir, 3)
    (vdir / "CACHEDIR.TAG").unlink()
    proc = here.cli("clear", "--yes", env={"GKX_JAX_CACHE_DIR": str(root)})
    assert proc.returncode == 1 and "CACHEDIR.TAG" in proc.stderr
    assert all(p.exists() for p in planted)
    (vdir / "CACHEDIR.TAG").write_text(TAG)
    proc = here.cli("--json", "clear", "--yes", env={"GKX_JAX_CACHE_DIR": str(root)})
    assert json.loads(proc.stdout)["entries"] == 3 and not any(p.exists() for p in planted)


@pytest.mark.line  # what the command does to the cache, not argparse's words: each JAX line's first Python
def test_clear_on_home_or_root_deletes_nothing(here: InProcess) -> None:
    """dir pointed at a home directory or /: nothing deleted, and that said. A `jax-*` directory
    there that is not the package's (no tag) is refused."""
    keep = here.home / f"jit_mine-{'a' * 64}-cache"
    keep.write_text("precious")
    for target in (str(here.home), "/"):
        proc = here.cli("clear", "--yes", "--all-versions", env={"GKX_JAX_CACHE_DIR": target})
        assert proc.returncode == 0 and "removed 0 entries" in proc.stdout, proc
    mine = here.home / VERSION_DIR
    mine.mkdir()
    (mine / keep.name).write_text("precious too")
    proc = here.cli("clear", "--yes", "--all-versions", env={"GKX_JAX_CACHE_DIR": str(here.home)})
    assert proc.returncode == 1 and "CACHEDIR.TAG" in proc.stderr, proc
    assert keep.exists() and (mine / keep.name).exists()


@pytest.mark.line  # what the command does to the cache, not argparse's words: each JAX line's first Python
def test_clear_never_follows_a_symlink_out(here: InProcess, tmp_path: Path) -> None:
    """A symlink planted in the cache, named like an entry: the link goes, its target stays."""
    vdir = here.default_cache / VERSION_DIR
    _plant(vdir, 1)
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "precious"
    target.write_text("keep")
    (vdir / f"jit_link-{'d' * 64}-cache").symlink_to(target)
    (vdir / f"jit_dirlink-{'c' * 64}-cache").symlink_to(outside)
    assert here.cli("verify", "--repair").returncode == 0
    assert here.cli("clear", "--yes").returncode == 0
    assert target.read_text() == "keep" and outside.is_dir()


@pytest.mark.line  # what the command does to the cache, not argparse's words: each JAX line's first Python
def test_stats_reports_ledger_and_reset(here: InProcess) -> None:
    proc = here.cli("stats")
    assert proc.returncode == 0 and "none yet" in proc.stdout
    planted_run(here.default_cache, warm=1)  # a cold run of jit_f and jit_g, then a warm one
    data = json.loads(here.cli("--json", "stats").stdout)
    assert data["stats"]["hits"] >= 2 and data["stats"]["misses"] >= 2
    assert {f["name"] for f in data["top_functions"]} >= {"jit_f", "jit_g"}
    assert here.cli("stats", "--reset").returncode == 0
    assert "no lookups in" in here.cli("stats").stdout and "since the last reset" in here.cli("stats").stdout
    status = here.cli("status").stdout  # a directory used dozens of times is not "never used" after a reset
    assert "no lookups since the last reset" in status and "none yet" not in status, status


def test_usage_errors_exit_2(here: InProcess) -> None:
    assert here.cli("frobnicate").returncode == 2
    assert here.cli("prune", "--older-than", "soon").returncode == 2
    proc = here.cli("--json", "dir")
    assert json.loads(proc.stdout)["dir"].endswith(VERSION_DIR)


def _ledger(vdir: Path, age: float = 0.0) -> Path:
    folder = vdir / ".gkx-autocache" / "ledger"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "123-456.jsonl"
    path.write_text('{"e":"miss","key":"jit_x-0"}\n')
    os.utime(path, (time.time() - age, time.time() - age))
    return path


@pytest.mark.line  # what the command does to the cache, not argparse's words: each JAX line's first Python
def test_deleting_commands_never_pass_through_a_symlinked_directory(here: InProcess, tmp_path: Path) -> None:
    """A `jax-*` directory or a `.gkx-autocache` that is a symlink to somewhere else: no command
    deletes anything there (entries, sidecars, ledgers, tag)."""
    root = here.default_cache
    _plant(root / VERSION_DIR, 2)
    elsewhere = tmp_path / "elsewhere"
    precious = _plant(elsewhere, 3, start=time.time() - 60 * DAY)
    sidecar = elsewhere / f"jit_p000-{0:064x}-gkx-compile"
    sidecar.write_text("0.5")
    their_ledger = _ledger(elsewhere, age=60 * DAY)
    (root / "jax-0.0.1").symlink_to(elsewhere)
    meta = tmp_path / "meta"
    (meta / "ledger").mkdir(parents=True)
    meta_ledger = meta / "ledger" / "1-2.jsonl"
    meta_ledger.write_text('{"e":"miss","key":"k"}\n')
    meta_size = meta / "size"
    meta_size.write_text("1")
    (root / VERSION_DIR / ".gkx-autocache").symlink_to(meta)
    for command in (["prune", "--stale-versions", "--max-size", "0"], ["clear", "--all-versions", "--yes"],
                    ["stats", "--reset"], ["verify", "--repair"], ["prune", "--max-size", "1"]):
        proc = here.cli(*command)
        assert "Traceback" not in proc.stderr, proc.stderr
    assert all(p.exists() for p in precious) and sidecar.exists() and their_ledger.exists()
    assert (elsewhere / "CACHEDIR.TAG").read_text() == TAG
    assert meta_ledger.exists() and meta_size.exists()


@pytest.mark.line  # what the command does to the cache, not argparse's words: each JAX line's first Python
def test_stale_versions_are_unused_for_30_days_not_merely_not_installed(here: InProcess) -> None:
    """The user cache is shared by environments with other JAX versions: `--stale-versions`
    removes a version directory only when nothing used it (entry access, ledger write) for 30 days."""
    root = here.default_cache
    _plant(root / VERSION_DIR, 1)
    in_use = _plant(root / "jax-0.0.1", 2)  # another environment's JAX, used 1000 s ago
    old = _plant(root / "jax-0.0.2", 2, start=time.time() - 40 * DAY)
    old_entries = _plant(root / "jax-0.0.3", 2, start=time.time() - 40 * DAY)
    _ledger(root / "jax-0.0.3", age=2 * DAY)  # ...but a process wrote its ledger two days ago
    proc = here.cli("--json", "prune", "--stale-versions", "--max-size", "0")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["stale_versions"] == [str(root / "jax-0.0.2")]
    assert all(p.exists() for p in in_use + old_entries)
    assert not (root / "jax-0.0.2").exists() and not any(p.exists() for p in old)


@pytest.mark.line  # what the command does to the cache, not argparse's words: each JAX line's first Python
def test_another_tools_cachedir_tag_is_not_ours(here: InProcess, tmp_path: Path) -> None:
    """cargo, ccache and borg write the same generic signature: only the package's own tag text
    lets a command delete."""
    root = tmp_path / "target"
    vdir = root / VERSION_DIR
    planted = _plant(vdir, 3)
    (vdir / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n"
                                       "# This file is a cache directory tag created by cargo.\n")
    (vdir / f"jit_bad-{'e' * 64}-cache").write_bytes(b"\x78\x9c" + b"a zlib header, then rot")  # corrupt, JAX's format
    env = {"GKX_JAX_CACHE_DIR": str(root)}
    for command in (["clear", "--yes"], ["prune", "--max-size", "1"], ["verify", "--repair"]):
        proc = here.cli(*command, env=env)
        assert proc.returncode == 1 and "CACHEDIR.TAG" in proc.stderr, (command, proc.stderr)
    assert all(p.exists() for p in planted) and (vdir / f"jit_bad-{'e' * 64}-cache").exists()


def test_status_says_what_each_setting_comes_to(here: InProcess) -> None:
    """A newcomer's first `status` answers "where is my cache?" on the settings line itself; in
    --json, `value` stays as it is and `effective` says what it comes to."""
    data = status(here)
    assert data["settings"]["dir"]["value"] is None
    assert data["settings"]["dir"]["effective"] == f"{here.default_cache} (the environment's own)"
    assert data["settings"]["xla_caches"]["effective"] == "none (no GPU plugin installed)"
    assert data["settings"]["max_size"]["effective"] == "5.0 GiB"
    text = here.cli("status").stdout
    (line,) = [ln for ln in text.splitlines() if ln.strip().startswith("dir ")]
    assert str(here.default_cache) in line and "default" in line
    assert "none (no GPU plugin installed)" in text


def test_json_failure_carries_the_error(here: InProcess) -> None:
    """--json on a failing command still prints one JSON object on stdout, with the error."""
    proc = here.cli("--json", "dir", env={"GKX_JAX_CACHE": "0"})
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert data["command"] == "dir" and "disabled" in data["error"] and len(proc.stderr.splitlines()) == 1


def test_json_usage_errors_are_json_too(here: InProcess) -> None:
    """With --json, a usage error (unknown command, unknown option, missing or bad value) prints
    one JSON object with the error on stdout, one line on stderr, and exits 2."""
    cases = [(["--json", "bogus"], None), (["stats", "--json", "--bogus"], "stats"),
             (["prune", "--json", "--max-size", "lots"], "prune"), (["--json", "config"], "config"),
             (["--json", "config", "set", "dir"], "config"), (["--json", "import"], "import"),
             (["--js", "stats", "--reset", "extra"], "stats")]
    for argv, command in cases:
        proc = here.cli(*argv)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        data = json.loads(proc.stdout)
        assert data["version"] == JSON_VERSION and data["command"] == command and data["exit"] == 2, (argv, data)
        assert data["error"] and "\n" not in data["error"]
        (line,) = proc.stderr.strip().splitlines()
        assert line.startswith("gkx-autocache") and data["error"] in line, (argv, proc.stderr)
    proc = here.cli("bogus")  # without --json: argparse's usage and error, as before
    assert proc.returncode == 2 and proc.stdout == "" and "usage:" in proc.stderr


@pytest.mark.line  # what the command does to the cache, not argparse's words: each JAX line's first Python
def test_verify_names_what_is_not_a_regular_file_and_repair_removes_it(here: InProcess, monkeypatch: Any) -> None:
    """An entry replaced by a FIFO, a socket or a directory is reported as not a regular file (not
    as an orphan sidecar alone); --repair removes each without blocking or following a link,
    removes an empty directory and leaves one that holds something, saying so."""
    import signal
    import socket

    from conftest import in_a_child_as

    def within_120_s(call: Any) -> Any:  # in a child a 120 s alarm ends: a repair that blocks fails the test
        def bounded() -> Any:
            signal.alarm(120)
            return call()

        return in_a_child_as(0, (), bounded)

    here.run_program()
    vdir = here.default_cache / VERSION_DIR
    fifo, sock = sorted(vdir.glob("*-cache"))[:2]
    fifo.unlink()
    os.mkfifo(fifo)
    sock.unlink()
    monkeypatch.chdir(vdir)  # a socket's path is limited to 108 bytes: bind it by its name
    server = socket.socket(socket.AF_UNIX)
    server.bind(sock.name)
    device = vdir / f"jit_dev-{'d' * 64}-cache"
    os.mknod(device, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers
    empty, full = vdir / f"jit_empty-{'a' * 64}-cache", vdir / f"jit_full-{'b' * 64}-gkx-compile"
    empty.mkdir()
    full.mkdir()
    (full / "theirs").write_text("kept")
    elsewhere = vdir.parent / "elsewhere-fifo"
    os.mkfifo(elsewhere)
    link = vdir / f"jit_link-{'c' * 64}-cache"
    link.symlink_to(elsewhere)
    try:
        proc = here.cli("--json", "verify")
        assert proc.returncode == 1, proc.stderr
        data = json.loads(proc.stdout)
        kinds = {os.path.basename(item["path"]): item["kind"] for item in data["not_regular"]}
        assert kinds == {fifo.name: "a FIFO", sock.name: "a socket", device.name: "a character device",
                         empty.name: "a directory", full.name: "a directory"}, kinds
        text = here.cli("verify").stdout
        assert f"{fifo.name}: not a regular file: a FIFO" in text and f"{sock.name}: not a regular file: a socket" in text
        proc = within_120_s(lambda: here.cli("verify", "--repair"))
        assert proc.returncode == 1 and f"{full.name}" in proc.stdout and "not empty" in proc.stdout, proc
        assert not any(p.exists() or p.is_symlink() for p in (fifo, sock, device, empty, link))
        assert (full / "theirs").read_text() == "kept" and elsewhere.exists()
        (full / "theirs").unlink()
        assert here.cli("verify", "--repair").returncode == 0 and not full.exists()
        assert here.cli("verify").returncode == 0
    finally:
        server.close()
    warm, _ = here.run_program()
    assert warm["hits"] == warm["requests"] - 2


def test_a_skipped_dir_is_said_and_clear_and_prune_refuse(here: InProcess, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An explicit ``dir`` that is skipped (an unset ``$VAR`` in it; relative, with the current
    directory deleted) is said in one line on stderr; ``clear`` and ``prune`` then remove nothing
    from the directory the user did not name, and exit 1; ``dir`` says it and prints the directory
    a process uses now."""
    vdir = here.default_cache / VERSION_DIR
    _plant(vdir, 3)  # the default directory holds entries
    before = sorted(p.name for p in vdir.iterdir())
    unset = {"GKX_JAX_CACHE_DIR": "$NOPE/jax"}
    for command in (["clear", "--yes"], ["prune", "--max-size", "0"], ["prune", "--older-than", "0s"]):
        proc = here.cli(*command, env=unset)
        assert proc.returncode == 1, (command, proc.returncode, proc.stdout, proc.stderr)
        assert len(proc.stderr.splitlines()) == 1 and "'$NOPE' is not set" in proc.stderr, proc.stderr
        assert "nothing removed" in proc.stderr, proc.stderr
        assert sorted(p.name for p in vdir.iterdir()) == before, command
    proc = here.cli("dir", env=unset)
    assert proc.returncode == 0 and proc.stdout == f"{vdir}\n", proc
    assert len(proc.stderr.splitlines()) == 1 and "'$NOPE' is not set" in proc.stderr, proc.stderr
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    proc = here.cli("clear", "--yes", env={"GKX_JAX_CACHE_DIR": "rel/jax"})
    assert proc.returncode == 1 and "current directory no longer exists" in proc.stderr, proc
    assert sorted(p.name for p in vdir.iterdir()) == before


def test_config_get_shows_a_files_dir_as_written_where_its_variable_is_unset(
        tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    """A settings file's ``dir = "$SCRATCH/jax"``, read by a user without ``$SCRATCH``: ``config get
    dir`` shows ``$SCRATCH/jax`` and the file, with a note that ``$SCRATCH`` is unset here (and what
    applies instead), not ``unset``."""
    import sys

    config = tmp_path / "xdg" / "gkx-autocache" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('dir = "$SCRATCH/jax"\n')
    for name in [n for n in os.environ if n.startswith("GKX_JAX_CACHE") or n.startswith("JAX_")] + ["SCRATCH"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))  # no environment policy file
    assert _cli.main(["config", "get", "dir"]) == 0
    out, err = capsys.readouterr()
    assert out == "$SCRATCH/jax\n", out
    assert "$SCRATCH is not set here" in err and str(config) in err and len(err.splitlines()) == 1, err
    assert _cli.main(["--json", "config", "get", "dir"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["written"] == "$SCRATCH/jax" and data["origin"] == str(config), data
    assert "$SCRATCH is not set here" in data["note"] and data["effective"]["origin"] == "default", data
    monkeypatch.setenv("SCRATCH", str(tmp_path / "scratch"))
    assert _cli.main(["config", "get", "dir"]) == 0
    out, err = capsys.readouterr()
    assert out == "$SCRATCH/jax\n" and err == "", (out, err)


def planted_distributions(folder: Path, **versions: str) -> Path:
    """A folder of bare ``.dist-info`` metadata for ``versions`` (``ml_dtypes="0.7.0"``), as pip
    leaves it: put first on ``sys.path``, ``importlib.metadata`` finds these before the real ones."""
    folder.mkdir(exist_ok=True)
    for name, version in versions.items():
        info = folder / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return folder


@pytest.mark.parametrize(("ml_dtypes", "numpy", "slow"), [("0.7.0", "2.4.6", True), ("0.7.1", "1.26.4", True),
                                                         ("0.6.0", "2.4.6", False), ("0.7.0", "2.5.0", False)])
def test_status_and_explain_name_a_slow_import_jax_and_its_fix(
        here: InProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ml_dtypes: str, numpy: str, slow: bool) -> None:
    """ml_dtypes 0.7 with a NumPy before 2.5 adds about 0.6 s of CPU to every ``import jax`` (issue
    71): ``status`` says so among what needs attention, with the fix, and ``explain`` where the
    run's time went; both from the distributions' metadata, in ``--json`` too. Not for 0.6, nor
    with NumPy 2.5."""
    monkeypatch.syspath_prepend(str(planted_distributions(tmp_path / "dists", ml_dtypes=ml_dtypes, numpy=numpy)))
    planted_run(here.default_cache)
    text = here.cli("status").stdout
    said = [line for line in text.splitlines() if "import jax is slow" in line]
    data = status(here)
    explained = here.cli("explain")
    explain = json.loads(here.cli("--json", "explain").stdout)
    if not slow:
        assert not said and data["slow_import"] is None and explain["slow_import"] is None, text
        assert "import jax is slow" not in explained.stdout
        return
    (line,) = said
    assert f"ml_dtypes {ml_dtypes} with NumPy {numpy}" in line and "pip install 'ml_dtypes<0.7'" in line, line
    assert "0.6 s" in line, line
    assert data["slow_import"]["ml_dtypes"] == ml_dtypes and data["slow_import"]["numpy"] == numpy
    assert explain["slow_import"] == data["slow_import"]
    assert explained.returncode == 0 and f"ml_dtypes {ml_dtypes} with NumPy {numpy}" in explained.stdout, explained.stdout


@pytest.mark.parametrize(("python", "held"), [("3.11", True), ("3.12", False), ("3.13", False)])
def test_the_jax_extra_holds_ml_dtypes_where_numpy_cannot_be_fast(python: str, held: bool) -> None:
    """``pip install 'gkx-autocache[jax]'`` on Python 3.11 resolved ml_dtypes 0.7.0 with NumPy 2.4
    (3.11's newest; NumPy 2.5 needs 3.12): about 0.6 s more CPU at every ``import jax`` (issue 71).
    The extra holds ml_dtypes below 0.7 there, and only there: 3.12 resolves NumPy 2.5."""
    import tomllib

    from packaging.requirements import Requirement

    extra = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]["optional-dependencies"]["jax"]
    environment = {"python_version": python, "python_full_version": f"{python}.0"}
    applies = [Requirement(line) for line in extra]
    applies = [r for r in applies if r.marker is None or r.marker.evaluate(environment)]
    holds = [r for r in applies if r.name.replace("-", "_") == "ml_dtypes"]
    assert any(r.name == "jax" for r in applies)
    if held:
        (hold,) = holds
        assert "0.7.0" not in hold.specifier and "0.6.0" in hold.specifier, hold
    else:
        assert not holds, holds
