"""Attacks on `explain` (SPEC §7, §13, §13.1, §15): histories and programs a JAX user has, each of
which made `explain`, the report line or `stats` say something false, and defects of the
bookkeeping (index, ledgers, liveness without flock). Real JAX where the cause depends on it; the
bookkeeping in-process where a real program cannot reach the state deterministically."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import PEAK_RSS, Project, Venv, causes

CONFIG_TOGGLE = r"""
import json, os
import jax, jax.numpy as jnp
if os.environ.get("X64"):
    jax.config.update("jax_enable_x64", True)  # in code, after import: how most programs set it
K = float(os.environ.get("K", "2.0"))
@jax.jit
def f(x):
    return jnp.sin(x) * K
print(json.dumps({"result": float(f(jnp.arange(8.0)).sum())}))
"""


def only(found: dict[str, dict[str, str]], function: str) -> tuple[str, str]:
    """The one cause and detail of ``function``'s miss in the last run."""
    hits = [(cause, fns[function]) for cause, fns in found.items() if function in fns]
    assert len(hits) == 1, found
    return hits[0]


def test_a_changed_constant_is_not_blamed_on_the_config_of_a_later_variant(project: Project) -> None:
    """x64 off, on, off again (all hits), then a changed constant with x64 off: an entry with this
    very jax.config is there, so the miss is never "jax_enable_x64: True -> False"."""
    project.write("main.py", CONFIG_TOGGLE)
    project.run()
    project.run(X64="1")
    project.run()
    project.run(K="3.0")
    cause, detail = only(project.last(), "jit_f")
    assert cause == "changed computation" and "jax_enable_x64" not in detail, detail
    assert detail.startswith("same input"), detail


def test_a_config_value_that_may_change_nothing_is_not_named_as_the_sure_cause(project: Project) -> None:
    """Entries written under JAX_DEBUG_NANS=1 only, then a run without it and with a changed
    constant: jax_debug_nans differs, but the evidence cannot tell whether it changed what was
    compiled, so the code (or a constant) is named beside it."""
    project.write("main.py", CONFIG_TOGGLE)
    project.run(JAX_DEBUG_NANS="1")
    project.run(K="3.0")
    cause, detail = only(project.last(), "jit_f")
    assert cause == "changed computation" and "jax_debug_nans: True -> False" in detail, detail
    assert "closed-over constant" in detail, detail


STATIC_OR_WEAK = r"""
import functools, json, os
import jax, jax.numpy as jnp
@functools.partial(jax.jit, static_argnums=1)
def power(x, n):
    return x ** n
@jax.jit
def scale(x, y):
    return x * y + 1.0
y = 2.0 if os.environ.get("PYTHON_SCALAR") else jnp.float32(2.0)  # a Python float is weakly typed
print(json.dumps({"result": float(power(jnp.ones(5), int(os.environ.get("N", "2"))).sum() + scale(jnp.ones(5), y).sum())}))
"""


def test_same_shapes_name_a_static_argument_and_a_weak_type_among_the_causes(project: Project) -> None:
    """Another static argument, and a Python scalar where an array was, change the computation
    without changing the input shapes or any code: the detail names them among what may have
    changed (never "its code or a closed-over constant" alone, which excludes the real cause)."""
    project.write("main.py", STATIC_OR_WEAK)
    project.run()
    project.run(N="3", PYTHON_SCALAR="1")
    found = project.last()
    for function in ("jit_power", "jit_scale"):
        cause, detail = only(found, function)
        assert cause == "changed computation", found
        assert "static argument" in detail and "weak type" in detail, detail


TWO_METHODS = r"""
import functools, json, os
import jax, jax.numpy as jnp
class Adam:
    @functools.partial(jax.jit, static_argnums=0)
    def step(self, x):
        return jnp.sin(x) * 2.0
class Sgd:
    @functools.partial(jax.jit, static_argnums=0)
    def step(self, x):
        return jnp.cos(x) - 5.0
optimizer = Adam() if os.environ.get("OPT", "adam") == "adam" else Sgd()
print(json.dumps({"result": float(optimizer.step(jnp.ones(8)).sum())}))
"""


def test_another_method_of_one_name_in_one_module_is_named_by_its_class(project: Project) -> None:
    """`Adam.step` then `Sgd.step`, in one module: `new (another jit_step ...)` names the two
    functions apart, never "in main.py (its entries here are in main.py)", two identical places."""
    project.write("main.py", TWO_METHODS)
    project.run()
    project.run(OPT="sgd")
    cause, detail = only(project.last(), "jit_step")
    assert cause == "new" and "Sgd.step" in detail and "Adam.step" in detail, detail


UNICODE_AND_PMAP = r"""
import json, os
import jax, jax.numpy as jnp
K = float(os.environ.get("K", "2.0"))
@jax.jit
def σ(x):  # a Greek letter, as scientific code names things
    return jnp.sin(x) * K
def h(x):
    return jnp.cos(x) * K
x = jnp.ones((jax.device_count(), 3))
print(json.dumps({"result": float(σ(x).sum() + jax.pmap(h)(x).sum())}))
"""


def test_a_users_function_is_never_called_jaxs_own_helper(project: Project) -> None:
    """A function named `σ` (JAX keeps the letter: `jit_σ`) and one under `jax.pmap` (compiled as
    `jit__fun`) are the user's code: a changed constant is their `changed computation`, not "a
    further variant of JAX's own jit_σ", and they are not listed among JAX's own helpers."""
    project.write("main.py", UNICODE_AND_PMAP)
    project.run(JAX_NUM_CPU_DEVICES="2")  # two devices: the pmapped code is inside a shard_map's region
    project.run(JAX_NUM_CPU_DEVICES="2", K="3.0")
    data = project.explain()
    for function in ("jit_σ", "jit__fun"):
        cause, detail = only(project.last(), function)
        assert cause == "changed computation", (function, detail)
        helper = [fn["helper"] for g in data["groups"] for fn in g["functions"] if fn["name"] == function]
        assert helper == [False], (function, data["groups"])


def test_a_key_written_again_after_a_prune_and_then_deleted_by_hand_is_not_the_prunes(project: Project) -> None:
    """`prune` removes an entry, the next run writes it again, then a person deletes it: the
    miss is "removed outside gkx-autocache", never "removed by gkx-autocache prune" (whose
    record is older than the entry it would explain)."""
    project.write("main.py", CONFIG_TOGGLE)
    project.run()
    assert project.venv.cli("prune", "--older-than", "0s", env=project.env).returncode == 0
    index = project.vdir / ".gkx-autocache" / "index"
    lines = index.read_text().splitlines()
    backdated = ["\t".join([*ln.split("\t")[:3], str(int(ln.split("\t")[3]) - 60), ln.split("\t")[4]])
                 if ln.startswith("X\t") else ln for ln in lines]  # the prune a minute ago
    index.write_text("\n".join(backdated) + "\n")
    project.run()  # evicted by prune: written again
    for entry in project.vdir.glob("jit_f-*-cache"):
        entry.unlink()  # by hand
    project.run()
    cause, detail = only(project.last(), "jit_f")
    assert cause == "evicted" and detail.startswith("removed outside gkx-autocache"), detail


OTHER_F = r"""
import json
import jax, jax.numpy as jnp
@jax.jit
def f(x, y):  # another program's f: other code, other inputs, another module
    return x @ y
print(json.dumps({"result": float(f(jnp.ones((3, 3)), jnp.ones((3, 3))).sum())}))
"""


def test_another_programs_function_of_an_old_jax_versions_name_is_not_a_jax_upgrade(project: Project) -> None:
    """A directory of another JAX version holds an `f` of another program (main.py): a new
    program's first `f` (in other.py) is `new`, not "changed JAX ... the entries of 0.0.1 are in
    jax-0.0.1/" (the same program after an upgrade still is: test_a_jax_upgrade_says_so)."""
    project.write("main.py", CONFIG_TOGGLE)
    project.write("other.py", OTHER_F)
    project.run()
    project.vdir.rename(project.vdir.parent / "jax-0.0.1")  # what the previous JAX wrote
    project.run("other.py")
    cause, detail = only(project.last(), "jit_f")
    assert cause == "new", detail


WAITING = r"""
import json, os, sys
import jax, jax.numpy as jnp
@jax.jit
def f(x):
    return jnp.tanh(x).sum()
f(jnp.ones(int(os.environ["N"])))
if os.environ.get("WAIT"):
    print("ready", flush=True)
    sys.stdin.readline()
print(json.dumps({"result": 1.0}))
"""


def test_a_shape_another_process_of_the_run_compiled_first_is_new_on_a_cold_run(project: Project) -> None:
    """Two processes of one run (pytest-xdist workers, a pool), cold: one compiles f for 3 and is
    still running (its entries not recorded yet), the other compiles f for 4. Every entry of f
    was written by this run, so the second is `new`, not "cannot tell: new, or changed: 1
    entries of jit_f here have no record", and its fix is not about notebook cells."""
    import subprocess
    import time

    project.write("main.py", WAITING)
    run = {"GKX_JAX_CACHE_RUN": f"{time.time():.3f}-{12345}"}  # what a run's processes inherit
    env = {**project.venv.env, **project.env, **run, "N": "3", "WAIT": "1"}
    live = subprocess.Popen([project.venv.python, str(project.folder / "main.py")], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=str(project.folder))
    try:
        assert live.stdout is not None and live.stdout.readline().strip() == "ready"
        project.run(N="4", **run)
        data = project.explain()
    finally:
        assert live.stdin is not None and live.stdout is not None
        live.stdin.write("\n")
        live.stdin.close()
        live.wait(timeout=120)
        live.stdout.close()
    found = causes(data["groups"])
    assert "jit_f" in found.get("new", {}) and "cannot tell" not in found, found


LOOP_BELOW_THRESHOLD = r"""
import json
import jax, jax.numpy as jnp
x = jnp.ones(3)
for i in range(5):
    jax.jit(lambda v: v * 3.0)(x)  # a new function object each time: the same key, looked up 5 times
print(json.dumps({"result": 1.0}))
"""


def test_the_last_runs_groups_count_every_lookup_the_run_counted(project: Project) -> None:
    """A lambda jitted in a loop under a high min_compile_time_secs is not cached 5 times: the
    report line says so, and the last run's group counts them all (naming how many are listed by
    function), never "(3)" under "7 not cached"."""
    project.write("main.py", LOOP_BELOW_THRESHOLD)
    line = project.run(GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS="100")
    data = project.explain()
    last = data["last_run"]
    assert f"{last['not_cached']} not cached" in line, (line, last)
    (group,) = data["groups"]
    assert group["count"] == last["not_cached"] == last["not_cached_by_reason"]["below min_compile_time_secs"], group


def test_more_misses_than_explain_keeps_are_said_to_be_more(project: Project) -> None:
    """A run with 600 misses (a ledger as a process writes it): `explain` keeps the latest 500,
    and says the group's whole count with how many are listed, never "new (500)" under "600
    misses (600 new)"."""
    import json
    import time

    folder = project.vdir / ".gkx-autocache" / "ledger"
    folder.mkdir(parents=True)
    now = time.time()
    records = [{"e": "start", "run": f"{now:.3f}-1", "host": "h", "pid": 1, "t": now, "label": "big.py"}]
    records += [{"e": "miss", "key": f"jit_f{i}-{i:064x}", "cause": "new", "detail": "first", "t": now + i / 1000}
                for i in range(600)]
    (folder / "1-1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    data = project.explain()
    (group,) = data["groups"]
    assert data["last_run"]["misses"] == 600 and group["count"] == 600, (data["last_run"], group["count"])
    assert group["listed"] == 500 and len(group["functions"]) == 500, group["listed"]
    text = project.venv.cli("explain", env=project.env).stdout
    assert "new (600; 500 listed" in text, text[:300]


LIVE = r"""
import json, os, sys
import jax, jax.numpy as jnp
@jax.jit
def f(x):
    return jnp.tanh(x).sum()
n = int(os.environ.get("N", "3"))
f(jnp.ones(n))
print("ready", flush=True)
sys.stdin.readline()  # a notebook kernel, idle while its user runs a command
f(jnp.ones(n + 1))
print(json.dumps({"result": 1.0}))
"""


class Live:
    """A process of the project that compiled, and waits until told to go on."""

    def __init__(self, project: Project, **extra: str) -> None:
        import subprocess

        project.write("live.py", LIVE)
        env = {**project.venv.env, **project.env, **extra}
        self.proc = subprocess.Popen([project.venv.python, str(project.folder / "live.py")], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=str(project.folder))
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def finish(self) -> str:
        """Go on, and end: its report line."""
        _, err = self.proc.communicate("\n", timeout=120)
        assert self.proc.returncode == 0, err
        (line,) = [ln for ln in err.splitlines() if ln.startswith("gkx-autocache:")]
        return line


def stats(project: Project) -> dict[str, int]:
    import json

    proc = project.venv.cli("--json", "stats", env=project.env)
    assert proc.returncode == 0, proc.stderr
    found: dict[str, int] = json.loads(proc.stdout)["stats"] or {"hits": 0, "misses": 0}
    return found


def test_stats_reset_while_a_process_runs_counts_only_what_it_does_after(project: Project) -> None:
    """`stats --reset` while a notebook kernel that has compiled is still running: `stats` right
    after shows no lookup, and once it ends, only those it made after the reset (its ledger was
    live, so the reset could not fold it)."""
    from test_explain_real import misses

    live = Live(project)
    before = stats(project)["misses"]
    assert before > 0
    assert project.venv.cli("stats", "--reset", env=project.env).returncode == 0
    now = stats(project)
    assert (now["hits"], now["misses"]) == (0, 0), now
    line = live.finish()
    assert stats(project)["misses"] == misses(line) - before, (line, before, stats(project))


def test_clear_while_a_process_runs_is_a_fresh_start(project: Project) -> None:
    """`clear` while a process that wrote entries is still running: when it ends, its records of
    the entries `clear` removed do not come back, so the next run's misses are not "evicted:
    removed outside gkx-autocache (by hand, or another tool)"; what it wrote after the clear is
    recorded (with the index tables it gave before the clear)."""
    from gkx_autocache._record import index as _index

    live = Live(project)
    assert project.venv.cli("clear", "--yes", env=project.env).returncode == 0
    live.finish()
    recorded = _index.load(str(project.vdir)).records("jit_f")  # what it wrote after the clear
    assert [r.signature for r in recorded] == ["f32[4]"], recorded
    project.write("main.py", LIVE.replace("sys.stdin.readline()", "pass"))
    project.run("main.py")
    found = project.last()
    assert "evicted" not in found, found


# -- the bookkeeping: ledgers, liveness without flock, the index ---------------------------------


def script(source: str, *args: str) -> str:
    """Run ``source`` in a fresh interpreter (the package's modules, no JAX); its stdout."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", source, *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


NO_FLOCK = "_ledger.take_flock = lambda fd, blocking=False: None  # Lustre, NFS without locks\n"


def test_without_flock_a_ledger_being_begun_is_not_taken_for_a_finished_one(tmp_path: Path) -> None:
    """Without flock, a process creates its ledger and then writes its first line: a fold that
    reads it in between (empty: no start line, no host, no pid) must not take it for a command's
    finished ledger and delete it, which loses every record the process writes after."""
    from test_longlived import tagged

    vdir = tagged(tmp_path / "c")
    out = script("from gkx_autocache._record import ledger as _ledger\nfrom gkx_autocache._record import fold as _fold\n" + NO_FLOCK + r"""
import os, sys
folder = os.path.join(sys.argv[1], ".gkx-autocache", "ledger")
os.makedirs(folder)
path = os.path.join(folder, f"{os.getpid()}-1.jsonl")
open(path, "w").close()  # created: its start line is being written
print(_ledger.finished(_ledger.read_ledger(path)))
_fold.fold(sys.argv[1], 0, False)
print(os.path.exists(path))
""", str(vdir))
    assert out.split() == ["False", "True"], out


def test_without_flock_a_live_ledger_folded_as_stale_loses_nothing(tmp_path: Path) -> None:
    """Without flock, another host's ledger untouched for a day is taken as finished, folded and
    deleted (a notebook kernel idle overnight on another node). When that process looks up keys
    again, its records must not go to the deleted file: every miss is counted."""
    from test_longlived import tagged

    vdir = tagged(tmp_path / "c")
    out = script("from gkx_autocache._record import ledger as _ledger\nfrom gkx_autocache._record import fold as _fold\n"
                 "from gkx_autocache._record import recorder as _stats\nfrom gkx_autocache._record import show as _show\n" + NO_FLOCK + r"""
import os, sys, time
vdir = sys.argv[1]
rec = _stats.Recorder(vdir, ledger=True, run=_stats.begin_run())
rec.miss("jit_f-" + "1" * 64); rec.put("jit_f-" + "1" * 64, 100, 0.01)
folder = os.path.join(vdir, ".gkx-autocache", "ledger")
(name,) = os.listdir(folder)
old = time.time() - 2 * _ledger.STALE_SECS
os.utime(os.path.join(folder, name), (old, old))  # idle for two days
real = _ledger.host
_ledger.host = lambda: "another-node"  # the fold runs on another node of the cluster
_fold.fold(vdir, 0, False)
_ledger.host = real
rec.miss("jit_f-" + "2" * 64); rec.put("jit_f-" + "2" * 64, 100, 0.01)  # the kernel goes on
_stats.finish(rec, 0)
print(_show.Reading(vdir).totals().misses)
""", str(vdir))
    assert out.strip() == "2", out


def test_a_process_that_begins_a_second_ledger_is_still_one_process_of_its_run(tmp_path: Path) -> None:
    """A long-lived process ends a ledger past its limit and begins another: `explain`'s last run
    is still "(1 process)", not one process per ledger."""
    from test_longlived import tagged

    vdir = tagged(tmp_path / "c")
    out = script(r"""
import sys
from gkx_autocache._record import ledger as _ledger
from gkx_autocache._record import recorder as _stats
from gkx_autocache._record import show as _show
_ledger.LIVE_LIMIT = 20_000
rec = _stats.Recorder(sys.argv[1], ledger=True, run=_stats.begin_run())
for i in range(500):
    rec.miss(f"jit_g{i}-" + f"{i:064x}")
    rec.put(f"jit_g{i}-" + f"{i:064x}", 100, 0.01)
_stats.finish(rec, 0)
(run,) = _show.Reading(sys.argv[1]).runs().values()
print(run["processes"], run["totals"]["misses"])
""", str(vdir))
    assert out.split() == ["1", "500"], out


def test_a_planted_removal_time_of_infinity_neither_breaks_compaction_nor_explains(tmp_path: Path) -> None:
    """A group member of a team cache plants `X <name> <hex> inf prune` in the index: the full
    scan's compaction (which keeps the index bounded and the size account true) must not fail on
    it every time, and a miss of that key is not explained by a removal at time infinity."""
    from test_longlived import tagged

    vdir = tagged(tmp_path / "c")
    meta = vdir / ".gkx-autocache"
    meta.mkdir()
    (meta / "index").write_text("X\tjit_f\t" + "1" * 20 + "\tinf\tprune\nX\tjit_g\t" + "2" * 20 + "\t1e308\tprune\n")
    out = script(r"""
import sys, time
from gkx_autocache._record import index as _index
from gkx_autocache._explain import classify as _explain
vdir = sys.argv[1]
_index.compact(vdir, set(), False)
evidence = _index.load(vdir)
print(sorted(evidence.removed))
""", str(vdir))
    assert out.strip() == "[]", out


def test_each_miss_does_not_parse_the_whole_index_of_its_name_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A name with many entries (`jit__lambda`, `jit_broadcast_in_dim` in any long-used cache):
    every miss of it compared with all of them by parsing each record again, ~6 µs a record,
    120 ms a miss at 20 000 entries, growing with each entry this process adds (a lambda in a
    loop). The records of a name are parsed once; later misses parse only what was added."""
    from gkx_autocache import _key
    from gkx_autocache._explain import classify as _explain
    from gkx_autocache._explain import facts as _facts
    from gkx_autocache._record import index as _index

    parts = dict.fromkeys(_key.PARTS, "a" * 16)
    evidence = _index.Evidence()
    for i in range(2000):
        lines = _index.lines_for("jit_step", f"{i:020x}", 1e9, "r1", {**parts, "computation": f"{i:016x}"}, {},
                                 "f32[3]", "main.py:step", {"jax_enable_x64": "False"})
        evidence.add(lines)
        evidence.wrote("jit_step", f"{i:020x}")
    parsed: list[str] = []
    real = _index.Evidence._record

    def counting(self: _index.Evidence, name: str, fields: str) -> _index.Record | None:
        parsed.append(name)
        return real(self, name, fields)

    monkeypatch.setattr(_index.Evidence, "_record", counting)
    facts = _facts.Facts({**parts, "computation": "f" * 16}, {}, "f32[3]", "main.py:step",
                           {"jax_enable_x64": "False"})
    for n in range(10):
        found = _explain.classify(f"jit_step-{n:064x}f", facts, evidence, "r2")
        assert found["cause"] == "changed computation", found
    assert len(parsed) < 2 * 2000, len(parsed)


def test_an_entry_written_after_cpu_keying_and_then_removed_is_evicted_not_before_cpu_keying(project: Project) -> None:
    """Stock JAX wrote the directory; the first run with gkx-autocache compiles each entry once
    more under the key with the ISA ("before CPU keying"), and the stock entries stay. When a
    person later deletes one of the new entries, its miss is `evicted` (removed outside), not
    "before CPU keying" again: this very key was written, after CPU keying, and is gone."""
    project.write("main.py", CONFIG_TOGGLE)
    project.vdir.mkdir(parents=True)
    stock = {"GKX_JAX_CACHE": "0", "JAX_COMPILATION_CACHE_DIR": str(project.vdir),
             "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
             "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none"}
    proc = project.venv.run(str(project.folder / "main.py"), env=stock, cwd=str(project.folder))
    assert proc.returncode == 0, proc.stderr
    stock_entries = set(project.vdir.glob("jit_f-*-cache"))
    project.run()
    assert "before CPU keying" in project.last()
    for entry in set(project.vdir.glob("jit_f-*-cache")) - stock_entries:
        entry.unlink()  # by hand
    project.run()
    cause, detail = only(project.last(), "jit_f")
    assert cause == "evicted" and "removed outside" in detail, (cause, detail)


def test_a_module_imported_through_another_sys_path_entry_is_not_another_function(project: Project) -> None:
    """`model/core.py` imported as `model.core` by one script and as `core` (its folder put on
    sys.path) by another, with a changed constant: its place reads `core.py` then
    `model/core.py`, which may be one file; `explain` says it cannot tell, never "new
    (another jit_step, in core.py)"."""
    project.write("model/__init__.py", "")
    project.write("model/core.py", "import os, jax, jax.numpy as jnp\nK = float(os.environ.get('K', '2.0'))\n"
                                   "@jax.jit\ndef step(x):\n    return jnp.sin(x) * K\n")
    project.write("main.py", "import json, jax.numpy as jnp\nfrom model.core import step\n"
                             "print(json.dumps({'result': float(step(jnp.ones(8)).sum())}))\n")
    project.write("tool.py", "import json, os, sys\nimport jax.numpy as jnp\n"
                             "sys.path.insert(0, os.path.join(os.path.dirname(__file__), 'model'))\n"
                             "from core import step\nprint(json.dumps({'result': float(step(jnp.ones(8)).sum())}))\n")
    project.run()
    project.run("tool.py", K="3.0")
    cause, detail = only(project.last(), "jit_step")
    assert cause == "cannot tell" and "model/core.py" in detail, (cause, detail)


def test_two_processes_never_both_take_over_a_stale_fold_lock(tmp_path: Path) -> None:
    """Without flock, a `fold.lock` left by a process killed while folding is stale after
    LOCK_STALE_SECS, and taken over by renaming it away. A process that saw it stale but renames
    only after another has already taken it over (and written a fresh one) must not rename that
    fresh lock away too: two folds at once double-count ledgers."""
    from test_longlived import tagged

    vdir = tagged(tmp_path / "c")
    out = script("from gkx_autocache._record import ledger as _ledger\nfrom gkx_autocache._record import locks as _locks\n" + NO_FLOCK + r"""
import os, sys, time
vdir = sys.argv[1]
meta = os.path.join(vdir, ".gkx-autocache")
os.makedirs(meta)
lock = os.path.join(meta, "fold.lock")
with open(lock, "w") as f:
    f.write("elsewhere 1 0\n")  # left by a process killed while folding
old = time.time() - 2 * _ledger.LOCK_STALE_SECS
os.utime(lock, (old, old))
real_stat = os.stat
taken, began = [], []
def stat(path, *args, **kwargs):
    found = real_stat(path, *args, **kwargs)
    if path == "fold.lock" and not began:  # the other process takes over between our stat and our rename
        began.append(1)
        taken.append(_locks.acquire(vdir, False))
    return found
os.stat = stat
mine = _locks.acquire(vdir, False)
os.stat = real_stat
print(taken[0], mine)
""", str(vdir))
    assert out.split() == ["-1", "None"], out


SUITE = r"""
import jax, jax.numpy as jnp
def test_one():
    assert float(jax.jit(lambda v: (v * 2.0).sum())(jnp.ones(3))) == 6.0
def test_two():
    assert float(jax.jit(lambda v: (v * 3.0).sum())(jnp.ones(3))) == 9.0
"""


@pytest.mark.parametrize("flags", [(), ("-n", "2")])
def test_a_pytest_session_is_named_as_one(project: Project, flags: tuple[str, ...]) -> None:
    """`python -m pytest` (and with -n 2, whose workers run as `python -c`): `explain`'s last run
    names a pytest session, not "__main__.py -q -p" or "-c"."""
    project.write("test_suite.py", SUITE)
    proc = project.venv.run("-m", "pytest", "-q", "-p", "no:cacheprovider", *flags, str(project.folder),
                            env=project.env, cwd=str(project.folder), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    label = project.explain()["last_run"]["label"]
    assert label.startswith("pytest"), label


def test_the_first_miss_reads_a_large_index_without_holding_it_thrice(tmp_path: Path) -> None:
    """An index of 40 MB (200 000 entries; a hostile member can plant 256 MB): the first miss
    read it whole, decoded it whole and split it whole before keeping its lines, a peak of ~5
    times its size in the user's process (300 MB: +1.1 GB). Read in chunks of lines, the peak
    is what is kept, under 3 times its size."""
    from test_longlived import tagged

    vdir = tagged(tmp_path / "c")
    meta = vdir / ".gkx-autocache"
    meta.mkdir()
    line = "E\tjit_g\t" + "0" * 20 + "\t1796100000\trun\t" + "a" * 16 + "\t" + "b" * 12 + "\tsig\twhere\tcfg\n"
    (meta / "index").write_text(line * (40_000_000 // len(line)))
    out = script(r"""
import sys
from gkx_autocache._record import index as _index
def peak():  # this process's own peak (ru_maxrss keeps the forking parent's across exec)
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")) * 1024
before = peak()
evidence = _index.load(sys.argv[1])
print(len(evidence.entries["jit_g"]), peak() - before)
""", str(vdir))
    lines, grown = map(int, out.split())
    assert lines == 40_000_000 // len(line) and grown < 3 * 40_000_000, grown


def test_each_ledger_of_a_long_lived_process_carries_the_index_tables_its_entries_need(tmp_path: Path) -> None:
    """A process gives each index table line (the context of its keys, its place, its config)
    once. When it begins another ledger (past LIVE_LIMIT) the earlier one is folded on its own,
    and a full scan then drops tables no entry uses any more (the cap pruned those entries):
    the next ledger's entries must still carry their tables, else they are folded as lines that
    refer to nothing, and every later miss of them reads "entries without a record"."""
    from test_longlived import tagged

    vdir = tagged(tmp_path / "c")
    out = script(r"""
import json, os, sys
from gkx_autocache import _key
from gkx_autocache._explain import explainer as _explain
from gkx_autocache._explain import facts as _facts
from gkx_autocache._record import index as _index
from gkx_autocache._record import ledger as _ledger
from gkx_autocache._record import recorder as _stats
_ledger.LIVE_LIMIT = 20_000
vdir = sys.argv[1]
ex = _explain.Explainer(vdir, load=_index.Evidence)
rec = _stats.Recorder(vdir, ledger=True, run=_stats.begin_run(), explainer=ex)
parts = dict.fromkeys(_key.PARTS, "a" * 16)
for i in range(300):
    key = f"jit_g-{i:064x}"
    ex._thread.final, ex._thread.facts = key[-64:], _facts.Facts({**parts, "computation": f"{i:016x}"}, {},
                                                                    "f32[3]", "main.py:g", {})
    rec.miss(key)
    rec.put(key, 100, 0.01)
rec.close()
folder = os.path.join(vdir, ".gkx-autocache", "ledger")
for name in sorted(os.listdir(folder), key=lambda n: int(n.split("-")[1].split(".")[0])):
    puts = [r for r in _ledger.read_ledger(os.path.join(folder, name)).records if r["e"] == "put"]
    print(any(line.startswith("C\t") for line in puts[0]["rec"].split("\n")))
""", str(vdir))
    assert len(out.split()) > 1 and set(out.split()) == {"True"}, out


def test_without_flock_a_fold_lock_of_a_dead_process_of_this_host_is_taken_at_once(tmp_path: Path) -> None:
    """Without flock, a process killed while folding leaves `fold.lock`: stale only after
    LOCK_STALE_SECS (10 min), during which no exit folds, the cap is not kept, and `stats
    --reset` and `clear` fail with "the cache is busy". Its first line names this host and a
    process that is gone: it is stale at once."""
    import subprocess
    import sys

    from test_longlived import tagged

    vdir = tagged(tmp_path / "c")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    out = script("from gkx_autocache._record import ledger as _ledger\nfrom gkx_autocache._record import locks as _locks\n" + NO_FLOCK + r"""
import os, sys, time
meta = os.path.join(sys.argv[1], ".gkx-autocache")
os.makedirs(meta)
with open(os.path.join(meta, "fold.lock"), "w") as f:
    f.write(f"{_ledger.host()} {sys.argv[2]} {time.time():.0f}\n")  # killed a moment ago, folding
print(_locks.acquire(sys.argv[1], False))
""", str(vdir), gone.stdout.strip())
    assert out.strip() == "-1", out


def test_explain_in_a_cache_read_only_for_its_user_says_their_runs_keep_no_records(venv: Venv) -> None:
    """A baked cache (root populates it, `chmod -R a+rX`): another user's runs are served from it
    and keep no records there, so `explain` cannot show their last run; it must say so, not
    present the run that populated the image as "last run" (or say no run used the cache)."""
    import json
    import subprocess

    from conftest import public_tmp, run_program

    base = public_tmp()
    try:
        baked = base / "baked"
        run_program(venv, env={"GKX_JAX_CACHE_DIR": str(baked)})
        subprocess.run(["chmod", "-R", "a+rX", str(baked)], check=True)
        env = {"GKX_JAX_CACHE_DIR": str(baked)}
        warm, _ = run_program(venv, env=env, user=65534)
        assert warm["hits"] == warm["requests"] >= 2
        proc = venv.cli("--json", "explain", env=env, user=65534)
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)
        assert data["read_only"] is True, data
        text = venv.cli("explain", env=env, user=65534).stdout
        assert text.startswith("this cache is read-only for you"), text
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_first_compile_text_does_not_claim_a_30_day_horizon_the_index_no_longer_has(tmp_path: Path) -> None:
    """The index keeps removed keys for 30 days, but at most 10 000 (or as many as there are
    entries): a small cap that evicts more than that within the month forgets the older ones.
    A miss of a name with no entry must not then say "none removed in the last 30 days"; it
    says since when removals are known."""
    import time

    from gkx_autocache._explain import classify as _explain
    from gkx_autocache._record import index as _index

    evidence = _index.Evidence()
    evidence.version_dir = str(tmp_path / "jax-0.0.0")
    now = time.time()
    evidence.add(_index.removed_lines([f"jit_h{i}-{i:064x}" for i in range(_index.MAX_REMOVED)], "max_size", now - 3600))
    found = _explain.new_here("jit_f", evidence)
    assert found["cause"] == "new" and "30 days" not in found["detail"], found


def test_a_function_compiled_before_but_never_written_is_not_its_first_compile(project: Project) -> None:
    """A run under a high min_compile_time_secs compiles f without writing it (explain lists it
    as not cached); the next run, at 0, writes it: `new`, but not "first compile of jit_f here",
    which the same `explain` output contradicts one section below."""
    project.write("main.py", CONFIG_TOGGLE)
    project.run(GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS="100")
    project.run()
    data = project.explain()
    cause, detail = only(causes(data["groups"]), "jit_f")
    assert cause == "new" and "first compile" not in detail, detail
    assert "not cached: below min_compile_time_secs" in causes(data["earlier"]), data["earlier"]
    assert all("first compile" not in g["fix"] for g in data["groups"]), data["groups"]


TWO_LAMBDAS_ONE_FILE = r"""
import json, os
import jax, jax.numpy as jnp
x = jnp.ones(3)
total = float(jax.jit(lambda v: (v * 3.0).sum())(x))
if os.environ.get("BOTH"):
    total += float(jax.jit(lambda v: (v + 1.0).sum())(x))  # a second lambda, added in this file
print(json.dumps({"result": total}))
"""


def test_a_second_lambda_in_one_file_is_not_the_first_one_changed(project: Project) -> None:
    """Every lambda of a file has one place (`main.py:<lambda>`): a second lambda added beside an
    unchanged first one is not "changed computation: same input shapes: its code ... changed";
    the evidence cannot tell another lambda from a changed one, and says so."""
    project.write("main.py", TWO_LAMBDAS_ONE_FILE)
    project.run()
    project.run(BOTH="1")
    cause, detail = only(project.last(), "jit__lambda")
    assert cause == "cannot tell" and "another lambda" in detail, (cause, detail)


def test_a_project_under_a_non_ascii_path_is_the_same_project_when_moved(project: Project) -> None:
    """MLIR escapes the bytes of a non-ASCII path in its locations (`jos\\C3\\A9`): the module path
    was then never found under sys.path, the place was the absolute escaped path, and the same
    project checked out elsewhere (a CI path, another user's home) was another function's.
    Unescaped, it is the same `main.py:f`: a changed constant is its `changed computation`."""
    import shutil

    project.write("josé/main.py", CONFIG_TOGGLE)
    project.run("josé/main.py")
    shutil.copytree(project.folder / "josé", project.folder / "zoë")
    project.run("zoë/main.py", K="3.0")
    cause, detail = only(project.last(), "jit_f")
    assert cause == "changed computation", (cause, detail)


def test_stats_reset_after_clear_while_a_process_runs_keeps_the_clear(project: Project) -> None:
    """`clear`, then `stats --reset`, while a process that wrote entries is still running: the
    reset must not undo what the clear forgot, so when the process ends the next run's misses
    are still not "evicted: removed outside gkx-autocache"."""
    live = Live(project)
    assert project.venv.cli("clear", "--yes", env=project.env).returncode == 0
    assert project.venv.cli("stats", "--reset", env=project.env).returncode == 0
    live.finish()
    project.write("main.py", LIVE.replace("sys.stdin.readline()", "pass"))
    project.run("main.py")
    found = project.last()
    assert "evicted" not in found, found


COMPACT_100MB = r"""
import hashlib, json, os, resource, sys, time
from gkx_autocache._record import index as _index
vdir = sys.argv[1]
path = _index.index_path(vdir)
os.makedirs(os.path.dirname(path))
with open(path, "w") as f:
    f.write("G\tcfg\t" + json.dumps("x" * 5000) + "\n" + "C\tctx\t" + ",".join(["a" * 10] * 7) + "\n")
    n = 0
    while f.tell() < 100 << 20:
        f.write(f"E\tjit_f{n % 1000}\t{hashlib.sha256(str(n).encode()).hexdigest()}\t1700000000\trun\tcomp\tctx\tsig\twhere\tcfg\n")
        n += 1
before = """ + PEAK_RSS + r"""
started = time.monotonic()
_index.compact(vdir, set(), False)
print(json.dumps({"secs": time.monotonic() - started, "grew": """ + PEAK_RSS + r""" - before}))
"""


@pytest.mark.xfail(reason="known, not fixed (2026-12-02): compact() reads, decodes and splits the index whole; a "
                          "streaming two-pass rewrite is left for a later round", strict=True)
def test_the_hourly_compaction_of_a_100_mb_index_at_a_user_process_exit_holds_no_more_than_the_index(
        tmp_path: Path) -> None:
    """The index is read by streaming (a 300 MB index once cost a process 1.1 GB); its compaction,
    run at a user's process exit by the hourly full scan (with or without a cap), still reads it
    whole, decodes it and splits it: a 100 MB index grew the exiting process by some 700 MiB and
    took 9.6 s here (SPEC §13.1: an exit does not cost more as the index grows)."""
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", COMPACT_100MB, str(tmp_path / "v")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    print(f"compaction of a 100 MB index: {found['secs']:.1f} s, peak RSS +{found['grew'] >> 20} MiB")
    assert found["grew"] <= 100 << 20, found


def test_an_index_cleared_and_made_again_on_the_inode_it_had_is_not_taken_for_the_file_a_process_read(
        tmp_path: Path) -> None:
    """A long-lived process (a notebook kernel) read the index at its first miss; `clear` removed it
    and a later run made a new one, as large, which ext4 gives the freed inode. The process's next
    write must still give the table lines the new index lacks: its (dev, inode, size >=) identity
    check took the new file for the one it read, so the entry's record went without its context,
    signature, place and config, and a later `explain` had no record of it."""
    import os
    import types

    from gkx_autocache._explain import explainer as _explain
    from gkx_autocache._explain import facts as _facts
    from gkx_autocache._key import PARTS
    from gkx_autocache._record import index as _index
    from gkx_autocache._record.recorder import Run

    vdir = tmp_path / "v"
    (vdir / ".gkx-autocache").mkdir(parents=True)
    parts = {p: f"{i:010x}" for i, p in enumerate(PARTS)}
    facts = _facts.Facts(parts, {}, "f32[8]", "nb.py:f", {"jax_enable_x64": "False"})
    old = _index.lines_for("jit_f", "a" * 64, 1.7e9, "old-run", parts, {}, facts.signature, facts.place, facts.config)
    index = Path(_index.index_path(str(vdir)))
    index.write_text("\n".join(old) + "\n")
    explainer = _explain.Explainer(str(vdir))
    explainer._load()
    read_as = os.stat(index).st_ino
    index.unlink()  # gkx-autocache clear
    other = _index.lines_for("jit_g", "b" * 64, 1.7e9, "later-run", {**parts, "computation": "f" * 10}, {}, "i32[]",
                             "other.py:g", {"x": "y" * 400})
    assert _index.append(str(vdir), other, False)  # a later run's fold makes the index again
    if os.stat(index).st_ino != read_as or index.stat().st_size < len("\n".join(old)):
        pytest.skip("this file system gave the new index another inode")
    explainer._thread = types.SimpleNamespace(final="c" * 64, facts=facts)
    rec = explainer.ingredients("jit_f-" + "c" * 64, Run("kernel", 0.0))["rec"].split("\n")
    evidence = _index.load(str(vdir))
    evidence.add(rec)  # the fold appends the record's lines
    (record,) = evidence.records("jit_f")
    assert record.place == "nb.py:f" and record.signature == "f32[8]", (rec, record)
