"""Bad input and strict test suites (SPEC §3, §4, §5, §7, §10): one warning, never a lost run, never
a traceback. Real JAX in fresh processes, under `-W error` and `-X dev` where that is the point; the
commands on planted bookkeeping in this process (``here``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pytest
from conftest import PROGRAM, InProcess, Venv, autocache_warnings, cache_files, clean_env, planted_run, run_program
from test_activation import VERSION_DIR

pytestmark = pytest.mark.every_python  # fork, -W error, exits and signals: the interpreter's

JAX_READ_ERROR = "Error reading persistent compilation cache entry"
HUGE = "9" * 400


def test_undeserialisable_entry_under_w_error_costs_one_recompile(venv: Venv, tmp_path: Path) -> None:
    """An entry that decompresses but does not deserialise (bit rot, a rebuilt jaxlib): under
    -W error the run succeeds, with one recompile and no warning, and the entry is replaced."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    cold, _ = run_program(venv, env=env)
    victim = cache_files(tmp_path / "c" / VERSION_DIR)[0]
    payload = zlib.decompress(victim.read_bytes())
    victim.write_bytes(zlib.compress(payload[:4] + b"\x07rotten executable\x00" * 16))
    after, err = run_program(venv, "-W", "error", "-X", "dev", env=env)
    assert after["result"] == cold["result"] and after["requests"] - after["hits"] == 1
    assert JAX_READ_ERROR not in err and autocache_warnings(err) == [] and "Traceback" not in err, err
    healed, err = run_program(venv, "-W", "error", env=env)
    assert healed["hits"] == healed["requests"], err


@pytest.mark.parametrize("variable", ["GKX_JAX_CACHE_MAX_SIZE", "GKX_JAX_CACHE_MIN_ENTRY_SIZE_BYTES",
                                      "GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS"])
def test_a_huge_number_skips_that_key_only(here: InProcess, tmp_path: Path, variable: str) -> None:
    """A 400-digit value: that key is skipped with one warning naming it; the cache stays on."""
    out, err = here.configure({variable: HUGE, "GKX_JAX_CACHE_DIR": str(tmp_path / "c")}, w_error=True)
    assert out["dir"] == str(tmp_path / "c" / VERSION_DIR) and out["min_compile"] == 0.0 and out["min_entry"] == -1
    (warning,) = [line for line in err.splitlines() if "gkx-autocache:" in line]
    assert variable in warning and "Traceback" not in err, err


@pytest.mark.line  # the settings' parsing and config set, not the interpreter: each JAX line's first Python
def test_huge_numbers_in_toml_and_on_the_command_line(here: InProcess) -> None:
    """TOML integers too large for a float, and `prune --max-size` with 400 digits: one line each,
    no traceback; `status` still reports."""
    policy = here.path / "gkx-autocache.toml"
    policy.write_text(f"max_size = {HUGE}\nmin_compile_time_secs = {HUGE}\nmin_entry_size_bytes = {HUGE}\n")
    out, err = here.configure()
    assert out["dir"] == str(here.default_cache / VERSION_DIR) and out["min_compile"] == 0.0
    warnings = autocache_warnings(err)
    assert len(warnings) == 3 and all(str(policy) in w for w in warnings), err
    proc = here.cli("status")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "max_size" in proc.stdout
    proc = here.cli("prune", "--max-size", HUGE)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


@pytest.mark.line  # the settings' parsing and config set, not the interpreter: each JAX line's first Python
def test_unset_variable_in_dir_is_a_bad_value(here: InProcess, tmp_path: Path) -> None:
    """`$VAR` not set: one warning naming the variable and the source; the next source down (the
    default) applies; no literal `$VAR` directory anywhere."""
    out, err = here.configure({"GKX_JAX_CACHE_DIR": "$GKX_TEST_NOT_SET/jax"})
    assert out["dir"] == str(here.default_cache / VERSION_DIR)
    (warning,) = autocache_warnings(err)
    assert "GKX_JAX_CACHE_DIR" in warning and "GKX_TEST_NOT_SET" in warning
    assert not any("$" in p.name for p in here.home.rglob("*"))
    out, err = here.configure({"GKX_JAX_CACHE_DIR": "~no_such_user_here/jax"})
    assert out["dir"] == str(here.default_cache / VERSION_DIR) and "no_such_user_here" in autocache_warnings(err)[0]


@pytest.mark.line  # the settings' parsing and config set, not the interpreter: each JAX line's first Python
def test_config_set_writes_what_was_typed(here: InProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`~` and `$VARS` stay as typed in a shared policy file; a relative path is made absolute
    against the current directory; what cannot be one TOML string is refused with exit 2."""
    policy = here.path / "gkx-autocache.toml"
    env = {"SCRATCH": str(tmp_path / "scratch")}
    assert here.cli("config", "set", "dir", "$SCRATCH/jax", env=env).returncode == 0
    assert 'dir = "$SCRATCH/jax"' in policy.read_text()
    assert here.cli("config", "set", "dir", "~/jax-cache").returncode == 0
    assert 'dir = "~/jax-cache"' in policy.read_text()
    monkeypatch.chdir(tmp_path)
    proc = here.cli("config", "set", "dir", "rel/cache")
    assert proc.returncode == 0 and f'dir = "{tmp_path / "rel" / "cache"}"' in policy.read_text()
    before = policy.read_text()
    for bad in ("a\nb", "tab\there", "bell\x07"):
        proc = here.cli("config", "set", "dir", bad)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert policy.read_text() == before


OWN_DIR = PROGRAM.replace("import jax, jax.numpy as jnp", "import jax, jax.numpy as jnp, os\n"
                          "jax.config.update('jax_compilation_cache_dir', os.environ['MY_DIR'])")


def test_report_shows_the_directory_jax_used_and_who_set_it(venv: Venv, tmp_path: Path) -> None:
    """The user's own `jax.config.update("jax_compilation_cache_dir", ...)` in their code: `report`
    names that directory and the line that set it, with the store's figures (it served it)."""
    mine = tmp_path / "mine"
    env = {"MY_DIR": str(mine), "GKX_JAX_CACHE_REPORT": "1"}
    run_program(venv, env=env, program=OWN_DIR)
    out, err = run_program(venv, env=env, program=OWN_DIR)
    assert out["dir"] == str(mine) and out["hits"] == out["requests"]
    (line,) = [ln for ln in err.splitlines() if ln.startswith("gkx-autocache:")]
    assert line.endswith(f"{mine} (set by <string>:4)") and " read" in line, line  # the line of the update
    assert f"{out['hits']} hits" in line


def test_clear_on_a_never_used_directory_removes_nothing_and_succeeds(here: InProcess) -> None:
    proc = here.cli("--json", "clear", "--yes")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["entries"] == 0
    assert not here.default_cache.exists()


def test_w_error_and_dev_mode_print_nothing_from_the_package(venv: Venv, tmp_path: Path) -> None:
    """Under `-X dev -W error`, a cold and a warm run print nothing at all on stderr: no
    ResourceWarning for the ledger, no warning of JAX's caused by the store."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    for _ in range(2):
        proc = venv.run("-X", "dev", "-W", "error", "-c", PROGRAM, env=env)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr


# The multiprocessing pattern: the parent imports (and so configures) JAX, then forks workers
# before any compile (forking after XLA has started its threads is unsafe, JAX warns).
FORKS = r'''
import json, os, sys
import jax, jax.numpy as jnp
pid = os.fork()
if pid == 0:
    jax.jit(lambda v: jnp.sin(v) + 3.0)(jnp.ones(8)).block_until_ready()
    os._exit(0)
os.waitpid(pid, 0)
jax.jit(lambda v: v * 2.0)(jnp.ones(8)).block_until_ready()
ledger = os.path.join(jax.config.jax_compilation_cache_dir, ".gkx-autocache", "ledger")
files = {name: open(os.path.join(ledger, name)).read() for name in os.listdir(ledger)}  # before the fold at exit
print(json.dumps({"parent": os.getpid(), "child": pid, "ledgers": files}))
'''


def test_a_forked_child_keeps_its_own_ledger(venv: Venv, tmp_path: Path) -> None:
    """A worker forked from a configured parent writes its own ledger, not its parent's (one file
    per process, SPEC §7), and its records survive `os._exit`."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    proc = venv.run("-c", FORKS, env=env, check=True, timeout=120)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    owners = {int(name.split("-")[0]): text for name, text in out["ledgers"].items()}
    assert set(owners) == {out["parent"], out["child"]}, sorted(owners)
    child = [json.loads(line)["e"] for line in owners[out["child"]].splitlines()]
    parent = [json.loads(line)["e"] for line in owners[out["parent"]].splitlines()]
    assert child[0] == parent[0] == "start"  # who wrote it: host, pid and start time (liveness without flock)
    assert "put" in child and "put" in parent and "hit" in parent, (child, parent)  # the parent hits jnp.ones
    stats = json.loads(venv.cli("--json", "stats", env=env).stdout)["stats"]  # both, folded at the parent's exit
    assert stats["writes"] == child.count("put") + parent.count("put") and not list((tmp_path / "c" / VERSION_DIR / ".gkx-autocache" / "ledger").iterdir())


WARM_FORK = r'''
import json, os, sys
import jax, jax.numpy as jnp
fs = [jax.jit(lambda v, i=i: jnp.sin(v) * i + jnp.cos(v) ** i) for i in range(1, 5)]
parent = [float(f(jnp.ones(16)).sum()) for f in fs]
pid = os.fork()
if pid == 0:  # exits normally: the at-exit hooks, then the interpreter's finalisation
    sys.exit(0)
_, status = os.waitpid(pid, 0)
print(json.dumps({"parent": parent, "child": os.waitstatus_to_exitcode(status)}))
'''


def test_a_warm_run_s_forked_child_exits(venv: Venv, tmp_path: Path) -> None:
    """A child forked after a warm run (every function served from the cache) and exiting normally
    exits: JAX's backend is never destroyed in a forked child (its thread pool's threads are not
    there: the child hung in ``~PjRtClient`` for ever, or crashed in it, stock JAX's own cache too)."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    for run in ("cold", "warm", "warm again"):
        proc = venv.run("-c", WARM_FORK, env=env, timeout=120)
        assert proc.returncode == 0, (run, proc.stderr[-2000:])
        assert json.loads(proc.stdout.strip().splitlines()[-1])["child"] == 0, run


LATE_FORK = r'''
import json, os
pid = os.fork()
if pid == 0:
    import jax, jax.numpy as jnp
    jax.jit(lambda v: jnp.cos(v) * 5.0)(jnp.ones(4)).block_until_ready()
    os._exit(0)
os.waitpid(pid, 0)
import jax, jax.numpy as jnp
jax.jit(lambda v: jnp.cos(v) * 5.0)(jnp.ones(4)).block_until_ready()
ledger = os.path.join(jax.config.jax_compilation_cache_dir, ".gkx-autocache", "ledger")
files = {name: open(os.path.join(ledger, name)).read() for name in os.listdir(ledger)}
print(json.dumps({"parent": os.getpid(), "child": pid, "ledgers": files}))
'''


def test_a_child_that_imports_jax_after_the_fork_is_configured_alone(venv: Venv, tmp_path: Path) -> None:
    """A child that imports JAX after the fork configures itself, with its own ledger; the parent,
    importing JAX later, is served the child's entry."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    proc = venv.run("-c", LATE_FORK, env=env, check=True, timeout=120)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    records = {int(name.split("-")[0]): [e for x in text.splitlines() if (e := json.loads(x)["e"]) not in ("start", "tally")]
               for name, text in out["ledgers"].items()}
    assert "put" in records[out["child"]] and set(records[out["parent"]]) == {"hit"}, records


@pytest.mark.parametrize("line", ['{"e":"hit","saved":null}', "[1]", '{"e":"put","bytes":"lots"}', "null",
                                  '{"e":"hit","saved":1e999}', '{"e":"miss","key":{"a":1}}', "\x00\xff garbage"])
def test_a_hostile_ledger_line_is_skipped(here: InProcess, line: str) -> None:
    """A malformed ledger line (any member of a team cache can write one) never crashes `status`,
    `stats`, `clear` or `prune`; the good lines still count."""
    ledger = planted_run(here.default_cache) / ".gkx-autocache" / "ledger"
    # another live process's ledger (this process's parent's pid), as a running run's is
    (ledger / f"{os.getppid()}-1-hostile.jsonl").write_text(line + "\n")
    for command in (["status"], ["stats"], ["prune", "--dry-run"], ["clear", "--dry-run"]):
        proc = here.cli("--json", *command)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (command, proc.stderr)
    stats = json.loads(here.cli("--json", "stats").stdout)["stats"]
    assert stats["misses"] >= 2


def test_hostile_bookkeeping_text_is_escaped_not_a_traceback(tmp_path: Path) -> None:
    """A lone surrogate in a ledger line, a deeply nested or ill-typed store verdict: the commands
    still answer, with one line at most."""
    meta = planted_run(tmp_path / "c") / ".gkx-autocache"
    (meta / "ledger" / "9-9.jsonl").write_text('{"e":"miss","key":"jit_\\ud800-' + "a" * 64 + '","cause":"\\ud800"}\n')
    # A fresh interpreter (this one's, no venv needed) whose stdout refuses what is not UTF-8.
    env = clean_env(HOME=str(tmp_path), GKX_JAX_CACHE_DIR=str(tmp_path / "c"), PYTHONIOENCODING="utf-8:strict")
    for verdict in ("[" * 100000, '{"store": ["x"], "reason": {"a": 1}}'):
        (meta / "store.json").write_text(verdict)
        for command in (["status"], ["--json", "status"], ["stats"], ["explain"]):
            proc = subprocess.run([sys.executable, "-m", "gkx_autocache", *command], env=env, cwd=str(tmp_path),
                                  capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0 and "Traceback" not in proc.stderr, (command, proc.stderr)


def test_config_set_refuses_line_separators_and_unreadable_files(here: InProcess) -> None:
    """A value with a line separator is a usage error; a policy file that is not UTF-8 is one line;
    one that is a FIFO is refused, not waited on (60 s fail the test)."""
    policy = here.path / "gkx-autocache.toml"
    for bad in ("a\u2028b", "a\u0085b"):
        proc = here.cli("config", "set", "dir", "/x/" + bad)
        assert proc.returncode == 2 and not policy.exists(), proc.stderr
    policy.write_bytes(b"report = true\n\xff\xfe\n")
    proc = here.cli("config", "set", "max_size", "1GiB")
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    policy.unlink()
    os.mkfifo(policy)
    done: list[subprocess.CompletedProcess[str]] = []
    # A daemon thread: one stuck opening the FIFO must not keep pytest from ending.
    worker = threading.Thread(target=lambda: done.append(here.cli("config", "set", "max_size", "1GiB")), daemon=True)
    worker.start()
    worker.join(60)
    assert done, "config set waited on a FIFO as its policy file"
    assert done[0].returncode == 1, done[0].stderr


# -- a current directory that no longer exists (SPEC §3) ------------------------------------------


def leave_a_deleted_directory(monkeypatch: pytest.MonkeyPatch, where: Path) -> None:
    """This process's current directory made ``where``, then deleted (as ``cd``, ``rmdir`` in a
    shell); the one before is restored after the test."""
    where.mkdir()
    monkeypatch.chdir(where)
    where.rmdir()


def test_a_deleted_current_directory_leaves_an_absolute_dir_working(here: InProcess, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """With an absolute dir, a process whose current directory was deleted is cached as usual,
    cold then warm, with no warning, under -W error too."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    runs = []
    for i in range(2):
        leave_a_deleted_directory(monkeypatch, tmp_path / f"gone{i}")
        out, err = here.run_program(env, w_error=True)
        assert err == "", err
        runs.append(out)
    assert runs[0]["dir"] == runs[1]["dir"] == str(tmp_path / "c" / VERSION_DIR)
    assert runs[0]["hits"] == 0 and runs[1]["hits"] == runs[1]["requests"] > 0


def test_a_relative_dir_from_a_variable_needs_the_current_directory(here: InProcess, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative GKX_JAX_CACHE_DIR in a deleted current directory is a bad value: one warning
    naming the variable and why, and the next source down (here the default) applies."""
    leave_a_deleted_directory(monkeypatch, tmp_path / "gone")
    out, err = here.configure({"GKX_JAX_CACHE_DIR": "rel/cache"})
    assert "Traceback" not in err, err
    assert out["dir"] == str(here.default_cache / VERSION_DIR)
    (warning,) = autocache_warnings(err)
    assert "GKX_JAX_CACHE_DIR" in warning and "current directory" in warning and "please report" not in warning


def test_commands_in_a_deleted_current_directory_say_what_is_wrong(here: InProcess, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Every command works from a deleted current directory where nothing needs it; where a
    relative path needs it, one line says so (never a bare "[Errno 2]")."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    planted_run(tmp_path / "c")
    for i, command in enumerate((["status"], ["--json", "status"], ["dir"], ["stats"], ["verify"],
                                 ["config", "list"], ["config", "set", "max_size", "1GiB"])):
        leave_a_deleted_directory(monkeypatch, tmp_path / f"gone{i}")
        proc = here.cli(*command, env=env)
        assert proc.returncode == 0 and "Errno" not in proc.stdout + proc.stderr, (command, proc.stderr)
    leave_a_deleted_directory(monkeypatch, tmp_path / "gone-dir")
    proc = here.cli("dir", env={"GKX_JAX_CACHE_DIR": "rel"})
    assert proc.returncode == 0 and proc.stdout.strip() == str(here.default_cache / VERSION_DIR), proc.stderr
    for i, command in enumerate((["config", "set", "dir", "rel/cache"], ["export", "warm.tar"],
                                 ["import", "warm.tar"])):
        leave_a_deleted_directory(monkeypatch, tmp_path / f"bad{i}")
        proc = here.cli(*command, env=env)
        (line,) = proc.stderr.strip().splitlines()
        assert proc.returncode in (1, 2) and "current directory" in line and "Errno" not in line, (command, line)
    assert 'dir = "rel' not in (here.path / "gkx-autocache.toml").read_text()


@pytest.mark.line  # the settings' parsing and config set, not the interpreter: each JAX line's first Python
def test_config_set_keeps_a_variable_the_setter_has_not_set(here: InProcess, tmp_path: Path) -> None:
    """A policy file is shared by an environment's users: `config set dir '$SCRATCH/jax'` by one
    without `$SCRATCH` writes it as typed with a one-line note; each user's run expands their own
    `$SCRATCH`, and one without it gets the one warning of a bad value."""
    policy = here.path / "gkx-autocache.toml"
    proc = here.cli("config", "set", "dir", "$SCRATCH/jax")
    assert proc.returncode == 0, proc.stderr
    assert policy.read_text() == 'dir = "$SCRATCH/jax"\n'
    (note,) = proc.stderr.strip().splitlines()
    assert "$SCRATCH is not set for you now" in note and "bad value for anyone without it" in note
    proc = here.cli("--json", "config", "set", "dir", "${SCRATCH}/a/$OTHER_SCRATCH")
    data = json.loads(proc.stdout)
    assert proc.returncode == 0 and data["value"] == "${SCRATCH}/a/$OTHER_SCRATCH" and "$OTHER_SCRATCH" in data["note"]
    assert policy.read_text() == 'dir = "${SCRATCH}/a/$OTHER_SCRATCH"\n'
    out, _ = here.configure({"SCRATCH": str(tmp_path / "s"), "OTHER_SCRATCH": "o"})
    assert out["dir"] == str(tmp_path / "s" / "a" / "o" / VERSION_DIR)
    out, err = here.configure()
    assert out["dir"] == str(here.default_cache / VERSION_DIR) and len(autocache_warnings(err)) == 1
    before = policy.read_text()
    for bad in ("$SCRATCH/\x07", "$SCRATCH\nx", "ftp://$SCRATCH/x", "${NOT A NAME}/x", "$SCRATCH/a\u2028b"):
        proc = here.cli("config", "set", "dir", bad)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, (bad, proc.stderr)
    assert policy.read_text() == before


# The package's files go while the process runs (`pip uninstall` or `pip install -U` in a live
# notebook kernel): what it has not imported yet can no longer be imported.
GONE = r"""
import sys
import jax, jax.numpy as jnp
x = jnp.ones((8, 8))
jax.jit(lambda v: v * 2)(x)  # the warm part: hits only
class Gone:
    def find_spec(self, name, path=None, target=None):
        if name.startswith("gkx_autocache."):
            raise ImportError(f"{name}: the package was uninstalled")
sys.meta_path.insert(0, Gone())  # what was imported stays imported, as after a real uninstall
print(float(jax.jit(lambda v: jnp.sin(v) @ v)(x).sum()))  # a new compile: a miss, a write
"""


def test_a_package_removed_mid_run_never_fails_the_run(venv: Venv, tmp_path: Path) -> None:
    """After the package's files are gone, a new compile still succeeds, and the exit is clean:
    a module the package imports late (at the first miss, write or exit) may be missing."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_REPORT": "1"}
    venv.run("-c", GONE.split("class Gone")[0], env=env, check=True)  # the cache holds the warm part
    proc = venv.run("-W", "error", "-c", GONE, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Error" not in proc.stderr, proc.stderr
    assert re.search(r"^gkx-autocache: \d+ hits?, [1-9]\d* miss", proc.stderr, re.M), proc.stderr  # the report line
