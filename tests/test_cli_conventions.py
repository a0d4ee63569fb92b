"""The command line's conventions (SPEC §10) and the Python API: `--version`, help on every command
and option, values shown as written, counts that agree in number, `prune` saying what remains,
warnings that say how to silence them (SPEC §6), and `gkx_autocache.stats()`, `explain()` and
`status()` returning what the `--json` commands print."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from conftest import InProcess, Venv, autocache_warnings, clean_env
from test_activation import JAX_VERSION, VERSION_DIR

from gkx_autocache._cli import main as _cli
from gkx_autocache._cli.output import JSON_VERSION

pytestmark = pytest.mark.every_python  # the command line: argparse's messages differ between Pythons


def test_version_names_the_package_jax_jaxlib_and_python_without_importing_jax(tmp_path: Path) -> None:
    # A fresh process of this interpreter (whether it imports jax is the point; no venv needed), and
    # a directory of its own, which no process has used.
    env = clean_env(HOME=str(tmp_path), GKX_JAX_CACHE_DIR=str(tmp_path / "c"))
    proc = subprocess.run([sys.executable, "-c", "import sys; from gkx_autocache._cli.main import main; "
                           "main(['--version']); print('jax' in sys.modules)"], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=600)
    words = proc.stdout.split()
    assert proc.returncode == 0 and words[-1] == "False", proc.stdout + proc.stderr
    assert f"jax {JAX_VERSION}" in proc.stdout and "gkx-autocache 0." in proc.stdout and "python 3." in proc.stdout
    data = json.loads(subprocess.run([sys.executable, "-m", "gkx_autocache", "--json", "--version"], env=env,
                                     cwd=str(tmp_path), capture_output=True, text=True, timeout=600).stdout)
    assert data["jax"] == JAX_VERSION and data["jaxlib"] and data["gkx-autocache"] and data["command"] == "version"
    # SPEC §16: the JAX line's features; here no process has recorded them, so this JAX's seams are probed
    assert data["features"] == {"store": None, "cap": None, "explain": None, "ISA key": None, "levels": None,
                                "host callbacks": None, "rebuild": None}, data
    assert "features store, cap, explain, ISA key, levels, host callbacks, rebuild (this JAX's seams, probed)" in proc.stdout, proc.stdout


def test_every_command_and_option_says_what_it_does() -> None:
    """`--help` of every command and option has words; `config --help` lists its actions."""
    parser = _cli.build_parser()
    missing = []

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        for act in p._actions:
            if isinstance(act, argparse._SubParsersAction):
                helps = {c.dest: c.help for c in act._choices_actions}
                for name, sub in act.choices.items():
                    if not helps.get(name):
                        missing.append(f"{path} {name}")
                    walk(sub, f"{path} {name}")
            elif not isinstance(act, argparse._HelpAction) and not act.help:
                missing.append(f"{path} {'/'.join(act.option_strings) or act.dest}")

    walk(parser, "gkx-autocache")
    assert missing == []
    text = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)][0].choices["config"].format_help()
    assert all(action in text for action in ("list", "get", "set", "unset")), text


def test_config_shows_values_as_written(here: InProcess) -> None:
    """`config list` and `config get` show what the user wrote (`800MB`, `5GiB`), `unset` for a
    value never set, never `5368709120` or `None`."""
    assert here.cli("config", "get", "max_size").stdout.strip() == "5GiB"
    assert here.cli("config", "get", "dir").stdout.strip() == "unset"
    assert here.cli("config", "set", "max_size", "800MB").returncode == 0
    assert here.cli("config", "get", "max_size").stdout.strip() == "800MB"
    listing = here.cli("config", "list").stdout
    assert "800MB" in listing and "800000000" not in listing and "None" not in listing, listing
    got = json.loads(here.cli("--json", "config", "get", "max_size").stdout)
    assert got["written"] == "800MB" and got["value"] == 800_000_000
    # list and get read every file: a --user or --venv there was taken and ignored; now a usage error
    for action in (["list"], ["get", "max_size"]):
        proc = here.cli("config", *action, "--user")
        assert proc.returncode == 2 and "--user" in proc.stderr, proc.stderr


@pytest.mark.line  # what a run and a command say of the cache, not argparse's words: each JAX line's first Python
def test_counts_agree_in_number_and_prune_says_what_remains(here: InProcess, tmp_path: Path) -> None:
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_REPORT": "1"}
    _, err = here.run_program(env, ("f",))
    assert "1 miss (1 unexplained)" in err and "0 hits" in err, err  # (a process here explains nothing)
    _, err = here.run_program(env, ("f",))
    assert "gkx-autocache: 1 hit, 0 misses" in err, err
    proc = here.cli("prune", "--max-size", "0", env=env)  # 0: no cap, nothing to remove
    assert proc.returncode == 0 and "0 entries" in proc.stdout and "1 entry (" in proc.stdout and "remain" in proc.stdout, proc.stdout
    for path in (tmp_path / "c" / VERSION_DIR).iterdir():  # the entry's last use more than the 1 s below ago
        os.utime(path, (time.time() - 10, time.time() - 10), follow_symlinks=False)
    data = json.loads(here.cli("--json", "prune", "--dry-run", "--older-than", "1s", env=env).stdout)
    assert data["remaining_entries"] == 0 and data["entries"] == 1, data


def test_a_bad_setting_says_how_to_silence_it_without_turning_the_cache_off(here: InProcess) -> None:
    _, err = here.configure({"GKX_JAX_CACHE_MAX_SIZE": "lots"})
    (warning,) = autocache_warnings(err)
    assert "GKX_JAX_CACHE=0" not in warning and "filter gkx_autocache.AutocacheWarning" in warning, warning


@pytest.mark.line  # what a run and a command say of the cache, not argparse's words: each JAX line's first Python
def test_a_corrupt_entry_is_called_one(here: InProcess, tmp_path: Path) -> None:
    """`rejected` says "corrupt entry" in words before zlib's own message."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    here.run_program(env)
    victim = max((tmp_path / "c" / VERSION_DIR).glob("jit_f-*-cache"), key=lambda p: p.stat().st_size)
    victim.write_bytes(zlib.compress(b"x" * 100)[:-6] + b"garbage")
    out, _ = here.run_program(env)
    assert out["requests"] - out["hits"] == 1
    data = json.loads(here.cli("--json", "explain", env=env).stdout)
    (group,) = [g for g in data["groups"] if g["cause"] == "rejected"]
    assert group["functions"][0]["detail"].startswith("corrupt entry: it does not decompress"), group


def test_status_keeps_its_columns_for_a_long_directory(here: InProcess, tmp_path: Path) -> None:
    deep = tmp_path / ("a-rather-long-folder-name-" * 4) / "cache"
    lines = here.cli("status", env={"GKX_JAX_CACHE_DIR": str(deep)}).stdout.splitlines()
    row = next(i for i, ln in enumerate(lines) if ln.startswith("  dir "))
    assert lines[row].split() == ["dir", str(deep), "env", "GKX_JAX_CACHE_DIR"], lines[row]  # one line, as set
    assert lines[row + 1].index("default") == lines[row - 1].index("default")  # the other rows' column holds


API = r"""
import json
import jax, jax.numpy as jnp
import gkx_autocache
for n in (3, 4):
    jax.jit(lambda v: (v * 2.0).sum())(jnp.ones(n)).block_until_ready()
stats, explain, status = gkx_autocache.stats(), gkx_autocache.explain(since="1h"), gkx_autocache.status()
print(json.dumps({"stats": stats, "explain": explain, "status": status}))
"""


def test_the_python_api_returns_what_the_json_commands_print(venv: Venv, tmp_path: Path) -> None:
    """In-process, right after a `jit`: the dicts `--json` prints, with their version, this
    process's own counts in them; a failure raises AutocacheError carrying the JSON error."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    proc = venv.run("-c", API, env=env)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["stats"]["version"] == JSON_VERSION and got["stats"]["command"] == "stats"
    assert got["stats"]["stats"]["misses"] >= 2 and got["stats"]["stats"]["misses_by_cause"]["new"] >= 2, got["stats"]
    assert got["explain"]["last_run"]["misses"] >= 2 and got["explain"]["groups"], got["explain"]
    assert got["status"]["directory"]["version_dir"] == str(tmp_path / "c" / VERSION_DIR)
    cli = json.loads(venv.cli("--json", "stats", env=env).stdout)
    assert set(cli) | {"process"} == set(got["stats"]) and set(cli["stats"]) == set(got["stats"]["stats"])  # + this process
    off = venv.run("-c", "import gkx_autocache\ntry:\n    gkx_autocache.stats()\nexcept gkx_autocache.AutocacheError as e:\n"
                   "    import json; print(json.dumps(e.error))", env={"GKX_JAX_CACHE": "0"})
    error = json.loads(off.stdout)
    assert error["command"] == "stats" and error["exit"] == 1 and "disabled" in error["error"], off.stdout + off.stderr
