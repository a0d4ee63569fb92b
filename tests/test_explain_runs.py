"""Whose run an entry is (SPEC §13.1), on real programs: an entry is "this run's" only when this run
wrote it, whoever else is running beside it (a sweep's jobs, two notebooks, a test session beside a
training job); and the records of a process that is still running, or was killed, are evidence for
the next process at once, not once some later process exits cleanly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import InProcess, Project, Venv, causes, planted_run

SWEEP = r"""
import os, sys, time, pathlib
sync = pathlib.Path(os.environ["SYNC"])
def wait(name):
    deadline = time.monotonic() + 300
    while not (sync / name).exists():
        assert time.monotonic() < deadline, name
        time.sleep(0.05)
import jax, jax.numpy as jnp
@jax.jit
def step(x):
    return jnp.tanh(x * 2.0).sum()
role = sys.argv[1]
if role == "B":  # begun (jax imported, configured): now job A fills the cold directory
    (sync / "b-begun").touch()
    wait("a-filled")
    sizes = range(1, 7)  # five of A's shapes, and one more
else:
    wait("b-begun")
    sizes = range(1, 6)
total = sum(float(step(jnp.ones(n))) for n in sizes)
if role == "B":
    (sync / "b-compiled").touch()
    wait("a-gone")
else:
    (sync / "a-filled").touch()
    wait("b-compiled")  # alive while B trains: its ledger is not folded
print(total)
"""


def report_line(stderr: str) -> str:
    (line,) = [ln for ln in stderr.splitlines() if ln.startswith("gkx-autocache:")]
    return line


def test_a_sweeps_overlapping_jobs_are_not_each_others_run(project: Project, venv: Venv, tmp_path: Path) -> None:
    """Job B begins, job A fills the cold directory and stays alive, then B trains: B's hits are of
    another run's compiles (not "this run's own"), and its one further shape is compared with A's
    entries, as it would be had A finished first (not "every entry here was written by this run")."""
    project.write("main.py", SWEEP)
    sync = tmp_path / "sync"
    sync.mkdir()
    env = {**venv.env, **project.env, "SYNC": str(sync)}
    command = [venv.python, str(project.folder / "main.py")]
    b = subprocess.Popen([*command, "B"], env=env, cwd=str(project.folder), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    a = subprocess.Popen([*command, "A"], env=env, cwd=str(project.folder), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    a_out, a_err = a.communicate(timeout=600)
    assert a.returncode == 0, a_err
    (sync / "a-gone").touch()
    b_out, b_err = b.communicate(timeout=600)
    assert b.returncode == 0, b_err
    line = report_line(b_err)
    assert "this run's own" not in line, line
    assert re.match(r"gkx-autocache: [1-9]\d* hits?, ", line), line
    found = causes(project.explain()["groups"])
    details = {name: detail for by_name in found.values() for name, detail in by_name.items()}
    assert "written by this run" not in " ".join(details.values()), found
    assert found.get("changed computation", {}).get("jit_step") == "inputs f32[5] -> f32[6]", found


KILLED = r"""
import os, signal, sys
import jax, jax.numpy as jnp
@jax.jit
def step(x):
    return jnp.tanh(x * 2.0).sum()
print(float(step(jnp.ones(int(sys.argv[1])))))
if len(sys.argv) > 2:
    os.kill(os.getpid(), signal.SIGKILL)  # as a kernel restarted by force, or one that crashed
"""


def test_a_killed_processs_records_explain_the_next_process(project: Project) -> None:
    """A process compiles `step` at N=48 and is killed (no exit, no fold); the next, at N=40, has
    its records at once: the input shapes are named, not "has no record"."""
    project.write("main.py", KILLED)
    proc = project.venv.run(str(project.folder / "main.py"), "48", "kill", env=project.env, cwd=str(project.folder))
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    proc = project.venv.run(str(project.folder / "main.py"), "40", env=project.env, cwd=str(project.folder))
    assert proc.returncode == 0, proc.stderr
    found = project.last()
    assert found.get("changed computation", {}).get("jit_step") == "inputs f32[48] -> f32[40]", found


CELL = r"""
import jax, jax.numpy as jnp
@jax.jit
def step(x):
    return jnp.tanh(x * 2.0).sum() + 1.0
N = {n}
print(float(step(jnp.linspace(0.0, 1.0, N))))
"""


class Notebook:
    """A real Jupyter kernel (ipykernel, driven by jupyter_client) in the test environment."""

    def __init__(self, venv: Venv, env: dict[str, str], folder: Path) -> None:
        from jupyter_client.manager import KernelManager

        spec = folder / "kernels" / "gkx"
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [venv.python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "gkx test", "language": "python"}))
        os.environ["JUPYTER_PATH"] = str(folder)  # this test's process only (xdist: a worker each)
        self.manager = KernelManager(kernel_name="gkx")
        self.env = {**venv.env, **env, "JUPYTER_PATH": str(folder), "JUPYTER_RUNTIME_DIR": str(folder / "runtime")}
        self.manager.start_kernel(env=self.env, cwd=str(folder))
        self._connect()

    def _connect(self) -> None:
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=300)

    def run(self, code: str) -> str:
        """Run a cell; what it printed."""
        out: list[str] = []

        def collect(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))

        reply = self.client.execute_interactive(code, timeout=300, output_hook=collect)
        assert reply["content"]["status"] == "ok", "".join(out)
        return "".join(out)

    def restart(self, now: bool) -> None:
        """A restart: graceful, or by force (``now``: the kernel is killed, as a restart that times
        out or a crashed kernel is)."""
        self.client.stop_channels()
        self.manager.restart_kernel(now=now, env=self.env)
        self._connect()

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


@pytest.mark.parametrize("now", [False, True], ids=["graceful", "killed"])
def test_a_notebook_restarted_between_runs_has_its_misses_explained(venv: Venv, tmp_path: Path, now: bool) -> None:
    """A jitted `step` in a cell at N=48; the kernel restarted (gracefully, or killed), run again
    (every lookup a hit); restarted, run at N=40. `explain` in the notebook and on the command line
    say the same, and it is true: the cell has no module, so it cannot tell a new function from
    `step` changed, but it names what differs from the closest entry (the input shape), for the
    cell's function and JAX's helpers alike; never "has no record" for the killed kernel's entries."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    notebook = Notebook(venv, env, tmp_path / "nb")
    try:
        first = notebook.run(CELL.format(n=48))
        notebook.restart(now)
        assert notebook.run(CELL.format(n=48)) == first
        warm = notebook.run("import json, gkx_autocache; print(json.dumps(gkx_autocache.stats()))")
        notebook.restart(now)
        notebook.run(CELL.format(n=40))
        inside = json.loads(notebook.run("import json, gkx_autocache; print(json.dumps(gkx_autocache.explain()))"))
    finally:
        notebook.close()
    proc = venv.cli("--json", "explain", env=env)
    assert proc.returncode == 0, proc.stderr
    outside = json.loads(proc.stdout)
    found = causes(outside["groups"])
    everything = json.dumps(found)
    assert "no record" not in everything, found
    assert "f32[48] -> f32[40]" in found["cannot tell"]["jit_step"], found
    assert causes(inside["groups"]) == found, (inside, outside)
    assert json.loads(warm)["process"]["misses"] == 0, warm


# -- where a warm run's time goes (SPEC §13.1, amended 2026-12-04; issue 45 part 3) -----------------

UNROLLED = r"""
import jax, jax.numpy as jnp

@jax.jit
def unrolled(x):  # 400 operations in a Python loop: slow to trace and lower, quick to compile
    for i in range(400):
        x = jnp.sin(x) * (1.0 + i / 400)
    return x

@jax.jit
def small(x):
    return x + 1

print(float(unrolled(jnp.ones(8)).sum() + small(jnp.ones(8)).sum()))
"""


def test_a_warm_runs_tracing_and_lowering_time_is_reported_by_function(project: Project) -> None:
    """Tracing and lowering are the largest cost left in a warm run, and no cache skips them: the
    report line gives the run's total, and `explain` the functions that took most of it, beside the
    cache's own share (reading its hits). On 79a6036 neither said it."""
    project.write("main.py", UNROLLED)
    project.run()
    line = project.run()
    found = re.search(r", (\d+\.\d+) s tracing and lowering,", line)
    assert found is not None and float(found.group(1)) > 0.05, line
    assert re.match(r"gkx-autocache: \d+ hits, 0 misses", line), line
    last = project.explain()["last_run"]
    assert last["tracing_secs"] >= float(found.group(1)) - 0.01, last
    slowest = last["tracing_by_function"]
    assert slowest[0]["function"] == "jit_unrolled" and slowest[0]["secs"] > 0.8 * sum(f["secs"] for f in slowest[1:]), slowest
    assert 0 < last["reads_secs"] < last["tracing_secs"], last
    text = project.venv.cli("explain", env=project.env).stdout
    assert re.search(r"tracing and lowering \d+\.\d+ s \(jit_unrolled \d+\.\d+ s, .*which no cache skips; "
                     r"reading its \d+ hits \d+\.\d+ s", text), text


def test_explain_never_calls_a_stale_run_the_last(here: InProcess, tmp_path: Path) -> None:
    """Issue 67: runs that JAX's own cache served since (the user's jax_compilation_cache_max_size,
    with filelock installed) keep no records, and `explain` called the package's older run "last
    run ... nothing missed". It says the runs since are not recorded, and why, and calls the one it
    has the last recorded run."""
    import time

    from gkx_autocache import _formats

    root = tmp_path / "c"
    env = {"GKX_JAX_CACHE_DIR": str(root)}
    vdir = planted_run(root, warm=1)
    for n, ledger in enumerate(sorted((vdir / ".gkx-autocache" / "ledger").iterdir())):  # each its own run
        start = json.dumps({"e": "start", "run": f"run{n}", "pid": 100 + n, "t": time.time() - 100 + n})
        ledger.write_text(start + "\n" + ledger.read_text())
    text = here.cli("explain", env=env).stdout
    assert "last run:" in text and "not recorded" not in text, text
    reason = "jax_compilation_cache_max_size is set by the user: JAX's own LRU cache serves"
    _formats.write_verdict(str(vdir), "jax", reason)
    later = time.time() + 60
    os.utime(vdir / ".gkx-autocache" / "store.json", (later, later))
    text = here.cli("explain", env=env).stdout
    assert "last recorded run:" in text and "last run:" not in text and "nothing missed" not in text, text
    assert f"are not recorded here: JAX's own cache served them: {reason}" in text, text
    data = json.loads(here.cli("--json", "explain", env=env).stdout)
    assert data["last_run"]["stale"]["store"] == "jax", data["last_run"]


def test_a_rerun_s_digest_leaves_out_the_package_s_own_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a process runs is digested once, at its first miss, over the modules imported by then:
    the package's own threads import some of its modules about then (rebuild ahead, at that very
    miss), a race that made two runs of one command differ and "misses on every run" go unsaid under
    load. Its modules are left out, as JAX's and the standard library's are."""
    import types

    import gkx_autocache
    from gkx_autocache._explain import facts

    monkeypatch.setattr(facts, "_process", [])
    before = facts._program()
    late = types.ModuleType("gkx_autocache._imported_late")
    late.__file__ = os.path.join(os.path.dirname(gkx_autocache.__file__), "_layout.py")
    monkeypatch.setitem(__import__("sys").modules, late.__name__, late)
    assert facts._program() == before
    mine = types.ModuleType("a_users_module_imported_late")
    mine.__file__ = __file__
    monkeypatch.setitem(__import__("sys").modules, mine.__name__, mine)
    assert facts._program() != before  # (a user's module still counts)
