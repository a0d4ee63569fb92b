"""Why it missed, on real programs (SPEC §13.1): every cause printed is true, and where the evidence
cannot decide, `explain` says what it cannot tell apart. Real JAX compiling real programs, run as
module files in fresh processes, and read back as `explain --json` and the report line show them."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from conftest import Project, Venv, causes
from test_activation import JAX_VERSION

from gkx_autocache._causes import CHANGED_COMPUTATION

SHAPES = r"""
import json, os
import jax, jax.numpy as jnp
@jax.jit
def f(x):
    return jnp.tanh(x * 2.0).sum() + 1.0
total = 0.0
for n in range(1, int(os.environ.get("SHAPES", "30")) + 1):  # bucketed sequence lengths
    total += float(f(jnp.ones(n)))
print(json.dumps({"result": total}))
"""

MODEL = r"""
import json, os
import jax, jax.numpy as jnp
SCALE = float(os.environ.get("SCALE", "3.0"))
@jax.jit
def f(x):
    return jnp.tanh(x @ x.T).sum(axis=0) * SCALE
x = jnp.linspace(0.0, 1.0, 64).reshape(8, 8)
print(json.dumps({"result": float(f(x).sum())}))
"""


def misses(line: str) -> int:
    match = re.search(r", (\d+) miss(?:es)?\b", line)
    assert match, line
    return int(match[1])


def test_thirty_shapes_cold_are_new_and_then_each_names_the_changed_flag(project: Project) -> None:
    """A function compiled for 30 shapes: on its first run every miss is `new` (29 of them a new
    shape beside those this run compiled), never `changed computation`; after an XLA_FLAGS change
    each of the 30 shapes names the flag, before and after, the whole directory being the evidence."""
    project.write("main.py", SHAPES)
    line = project.run()
    found = project.last()
    assert set(found) == {"new"}, found
    assert found["new"]["jit_f"].startswith("new shape f32[30]"), found
    assert f"{misses(line)} new" in line, line
    line = project.run(XLA_FLAGS="--xla_cpu_enable_fast_math=true", GKX_JAX_CACHE_REBUILD_AHEAD="0")  # (each shape missed)
    data = project.explain()
    (group,) = [g for g in data["groups"] if g["cause"] == "changed XLA_FLAGS"]
    f = next(fn for fn in group["functions"] if fn["name"] == "jit_f")
    assert f["count"] == 30 and f["detail"].startswith("XLA_FLAGS: '' -> '--xla_cpu_enable_fast_math=true'"), f
    assert set(causes(data["groups"])) == {"changed XLA_FLAGS"}, data["groups"]
    assert data["last_run"]["misses_by_cause"] == {"changed XLA_FLAGS": misses(line)}


def test_the_closest_entry_decides_not_the_latest(project: Project) -> None:
    """A run, a run with other XLA_FLAGS, a plain run again (all hits), then a compile option and
    then a code change: each names its own change, compared with the closest entry (never "XLA_FLAGS
    '--xla_cpu_enable_fast_math=true' -> ''", never "also changed: XLA_FLAGS")."""
    project.write("main.py", MODEL)
    project.run()
    project.run(XLA_FLAGS="--xla_cpu_enable_fast_math=true")
    assert misses(project.run()) == 0
    project.run(JAX_OPTIMIZATION_LEVEL="O1")
    found = project.last()
    assert set(found) == {"changed compile options"}, found
    assert "optimization_level: 0 -> 1" in found["changed compile options"]["jit_f"], found
    project.run(SCALE="4.0")
    found = project.last()
    assert found == {"changed computation": {"jit_f": found["changed computation"]["jit_f"]}}, found
    assert found["changed computation"]["jit_f"].startswith(  # the constant itself, named (issue 45)
        "same input shapes (f32[8,8]): a constant in its code changed, 3.0 -> 4.0"), found


def test_exec_time_optimization_effort_is_named_with_its_values(project: Project, venv: Venv) -> None:
    """A compile option by name and values, after JAX's own clearing: never two identical strings."""
    has = venv.run("-c", "import jax; print(hasattr(jax.config, 'jax_exec_time_optimization_effort'))").stdout.strip()
    if has != "True":
        pytest.skip("this JAX has no jax_exec_time_optimization_effort")
    project.write("main.py", MODEL)
    project.run()
    project.run(JAX_EXEC_TIME_OPTIMIZATION_EFFORT="0.5")
    detail = project.last()["changed compile options"]["jit_f"]
    assert "exec_time_optimization_effort: 0.0 -> 0.5" in detail, detail


def test_two_devices_are_named_by_the_processs_devices(project: Project) -> None:
    """1 -> 2 CPU devices: `changed devices: 1 x cpu -> 2 x cpu`, the process's devices."""
    project.write("main.py", MODEL)
    project.run()
    project.run(JAX_NUM_CPU_DEVICES="2")
    found = project.last()
    assert set(found) == {"changed devices"}, found
    assert found["changed devices"]["jit_f"] == "devices: 1 x cpu -> 2 x cpu", found


@pytest.mark.parametrize(("variable", "value", "function", "named"), [
    ("JAX_ENABLE_X64", "1", "jit_f", "jax_enable_x64: False -> True"),
    ("JAX_DEFAULT_MATMUL_PRECISION", "highest", "jit_f", "jax_default_matmul_precision: None -> 'highest'"),
    ("JAX_DEFAULT_PRNG_IMPL", "rbg", "jit__uniform", "jax_default_prng_impl: 'threefry2x32' -> 'rbg'"),  # not named
])
def test_a_jax_config_value_is_named_before_and_after(project: Project, variable: str, value: str, function: str,
                                                       named: str) -> None:
    """x64, matmul precision and any other jax.config value: `changed computation`, naming the
    value before and after (not "its code, input shapes or dtypes, or a closed-over constant")."""
    project.write("main.py", MODEL.replace("x = jnp.linspace", "x = jax.random.uniform(jax.random.key(0), (8, 8)) + "
                                           "jnp.linspace"))
    project.run()
    project.run(**{variable: value})
    found = project.last()
    assert function in found.get("changed computation", {}), found
    assert named in found["changed computation"][function], found


TWO_LAMBDAS = {
    "a.py": "import jax\nscale = jax.jit(lambda v: v * 3.0)\n",
    "b.py": "import jax\nshift = jax.jit(lambda v: v + 1.0)\n",
    "model/core.py": "import jax\n@jax.jit\ndef step(x):\n    return x * 2.0 + 1.0\n",
    "model/other.py": "import jax\n@jax.jit\ndef step(x):\n    return x - 7.0\n",
}
USE = r"""
import json, os, sys
import jax.numpy as jnp
import a, model.core
x = jnp.ones(4)
total = float(a.scale(x).sum()) + float(model.core.step(x).sum())
if os.environ.get("BOTH"):
    import b, model.other
    total += float(b.shift(x).sum()) + float(model.other.step(x).sum())
print(json.dumps({"result": total}))
"""


def test_functions_of_one_name_are_told_apart_by_where_their_code_is(project: Project, venv: Venv) -> None:
    """Every lambda is `jit__lambda`, and a `step` in two modules is `jit_step` twice: a function
    from elsewhere under a known name is `new`, naming its module, not `changed computation`; where
    the place is not known (`python -c`), `explain` says it cannot tell."""
    for name, source in TWO_LAMBDAS.items():
        project.write(name, source)
    project.write("main.py", USE)
    project.run()
    project.run(BOTH="1")
    found = project.last()
    assert set(found) == {"new"}, found
    assert "another jit__lambda, in b.py" in found["new"]["jit__lambda"], found
    assert "another jit_step, in model/other.py" in found["new"]["jit_step"], found
    command = "import jax, jax.numpy as jnp; print(float(jax.jit(lambda v: v * {})(jnp.ones(4)).sum()))"
    for factor in ("5.0", "6.0"):
        proc = venv.run("-c", command.format(factor), env=project.env)
        assert proc.returncode == 0, proc.stderr
    found = project.last()
    assert set(found) == {"cannot tell"}, found
    assert found["cannot tell"]["jit__lambda"].startswith("new, or another function named jit__lambda changed"), found


def test_a_warm_run_after_a_cold_one_is_the_last_run(project: Project) -> None:
    """`explain` starts with the last run: after a fully warm run it lists no miss of the cold one
    as that run's, and its counts are the report line's, by the names `stats --json` uses."""
    project.write("main.py", MODEL)
    cold = project.run()
    warm = project.run()
    data = project.explain()
    last = data["last_run"]
    assert data["groups"] == [] and last["misses"] == 0 and last["hits"] > 0, data
    assert warm.startswith(f"gkx-autocache: {last['hits']} hits, 0 misses"), (warm, last)
    assert {g["cause"] for g in data["earlier"]} == {"new"} and misses(cold) > 0
    stats = json.loads(project.venv.cli("--json", "stats", env=project.env).stdout)["stats"]
    assert set(last) >= set(stats) - {"writes"}, (sorted(last), sorted(stats))


PYTEST_SUITE = r"""
import jax, jax.numpy as jnp, pytest

@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_shapes(n):
    assert float(jax.jit(lambda v: (v * 2.0).sum())(jnp.ones(n))) == 2.0 * n

def test_matmul():
    x = jnp.ones((4, 4))
    assert float(jax.jit(lambda a: (a @ a).sum())(x)) == 64.0
"""


def test_a_pytest_xdist_session_is_one_run_and_agrees_with_its_line(project: Project) -> None:
    """`pytest -n 2`: the session and its workers are one run; `explain`'s last run has the counts
    of the session's line, cold and then warm."""
    project.write("test_suite.py", PYTEST_SUITE)
    for _ in range(2):
        proc = project.venv.run("-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", str(project.folder),
                                env=project.env, cwd=str(project.folder), timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("gkx-autocache:")]
        # pytest returns once its workers said they finished, which they say before their own exit
        # (where each closes its ledger): a worker may still be writing when the session is over.
        deadline = time.monotonic() + 60
        while (last := project.explain()["last_run"])["processes"] < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert last["processes"] == 2, last
        hits = int(re.match(r"gkx-autocache: (\d+) hits?\b", line)[1])  # type: ignore[index]
        assert (hits, misses(line)) == (last["hits"], last["misses"]), (line, last)


def test_a_jax_upgrade_says_so(project: Project) -> None:
    """The first run in a new version directory while another version's directory holds entries of
    these functions: `changed JAX`, naming the versions and the directory (not "new: nothing to fix")."""
    project.write("main.py", MODEL)
    project.run()
    older = project.vdir.parent / "jax-0.0.1"
    shutil.copytree(project.vdir, older)
    shutil.rmtree(project.vdir)
    project.run(GKX_JAX_CACHE_REBUILD_AHEAD="0")  # (on, it would rebuild them from jax-0.0.1's records)
    found = project.last()
    assert set(found) == {"changed JAX"}, found
    assert found["changed JAX"]["jit_f"].startswith(f"JAX 0.0.1 -> {JAX_VERSION}: the entries of 0.0.1 are in jax-0.0.1/")


def test_each_removal_names_who_removed_the_entry(project: Project) -> None:
    """Entries removed by the cap, by `prune`, by `verify --repair` and by hand are each `evicted`,
    with a fix that fits who removed it (the cap's names where max_size is set: here an environment
    variable, which outranks `config set`)."""
    project.write("main.py", MODEL)
    project.run()
    entry = max(project.vdir.glob("jit_f-*-cache"), key=lambda p: p.stat().st_size)
    entry.unlink()  # by hand
    project.run()
    found = project.explain()
    (group,) = [g for g in found["groups"] if g["cause"] == "evicted"]
    assert "removed outside gkx-autocache" in group["functions"][0]["detail"] and "outside" in group["fix"], found
    assert project.venv.cli("prune", "--max-size", "1", env=project.env).returncode == 0
    project.run()
    (group,) = [g for g in project.explain()["groups"] if g["cause"] == "evicted"]
    assert "removed by gkx-autocache prune" in group["functions"][0]["detail"], group
    entry = max(project.vdir.glob("jit_f-*-cache"), key=lambda p: p.stat().st_size)
    entry.write_bytes(b"not an entry")
    project.venv.cli("verify", "--repair", env=project.env)
    project.run()
    (group,) = [g for g in project.explain()["groups"] if g["cause"] == "evicted"]
    assert "verify --repair" in group["functions"][0]["detail"], group
    project.run(GKX_JAX_CACHE_MAX_SIZE="20kB")  # the exit prunes to the cap
    project.run(GKX_JAX_CACHE_MAX_SIZE="20kB")
    data = project.explain()
    (group,) = [g for g in data["groups"] if g["cause"] == "evicted"]
    assert all("removed by the cap (max_size)" in f["detail"] for f in group["functions"]), group
    assert "GKX_JAX_CACHE_MAX_SIZE" not in group["fix"]  # the CLI's own environment does not set it...
    proc = project.venv.cli("--json", "explain", env={**project.env, "GKX_JAX_CACHE_MAX_SIZE": "20kB"})
    (group,) = [g for g in json.loads(proc.stdout)["groups"] if g["cause"] == "evicted"]
    assert "set by GKX_JAX_CACHE_MAX_SIZE, which outranks config set" in group["fix"], group  # ...this one does


CLOSED_OVER_TIME = r"""
import json, time
import jax, jax.numpy as jnp
started = time.time() % 1000  # (a whole epoch time is the same float32 for two minutes)
@jax.jit
def f(x):
    return x * 2.0 + started  # a time closed over: a new constant, so a new key, on every run
print(json.dumps({"result": float(f(jnp.ones(3)).sum())}))
"""


def test_a_closed_over_time_is_flagged_as_missing_on_every_run(project: Project) -> None:
    """A function that misses with a changed computation on each of its last three runs is flagged
    "misses on every run", with the fix (pass the value as an argument)."""
    project.write("main.py", CLOSED_OVER_TIME)
    for _ in range(4):
        project.run()
    data = project.explain()
    (group,) = [g for g in data["groups"] if g["cause"] == "changed computation"]
    (f,) = [fn for fn in group["functions"] if fn["name"] == "jit_f"]
    assert f["detail"].startswith("same input shapes (f32[3])") and "misses on every run" in f.get("every_run", ""), f


def test_explain_since_and_function_filter(project: Project) -> None:
    """`--function NAME` keeps that function's misses (`step` or `jit_step`); `--since AGE` keeps
    the recent ones; a bad age is a usage error."""
    project.write("main.py", MODEL)
    project.run()
    project.run(SCALE="5.0")
    assert causes(project.explain("--function", "f")["groups"]) == project.last()
    assert project.explain("--function", "jit_nothing")["groups"] == []
    assert project.explain("--since", "1h")["earlier"] != []
    os.utime(project.vdir)  # nothing
    proc = project.venv.cli("explain", "--since", "soon", env=project.env)
    assert proc.returncode == 2 and "--since" in proc.stderr, proc.stderr


# -- issue 45 part 5: explanations on real programs ------------------------------------------------

OUTPUTS = r"""
import os
import jax, jax.numpy as jnp

N = int(os.environ["N"])  # a constant in the code: 12 layers, 9 save times

@jax.jit
def step(x):
    return tuple(x * i for i in range(N))

print(len(step(jnp.ones(3))))
"""


def test_compile_options_that_follow_the_outputs_are_a_changed_computation(project: Project) -> None:
    """Issue 45: a function with more outputs (a training program's layers, a solve's save times)
    was filed under "changed compile options: allow_spmd_sharding_propagation_to_output: [true x 12]
    -> [true x 14]" with "compile options set in code or jax.config differ": the options follow the
    outputs, and the cause is the computation."""
    project.write("main.py", OUTPUTS)
    project.run(N="3")
    assert "1 changed computation" in project.run(N="4")
    (detail,) = project.last()[CHANGED_COMPUTATION].values()
    assert "same input shapes (f32[3]), other outputs: the compile options follow them" in detail, detail
    assert "allow_spmd_sharding_propagation_to_output" in detail, detail


def test_after_a_jax_upgrade_the_fix_says_what_the_old_version_holds(project: Project, tmp_path: Path) -> None:
    """Issue 45: after `pip install -U jax` a run's misses read as first compiles, "nothing to fix",
    though the previous version's entries sit beside them. The fix says entries never carry across
    JAX versions, and what `prune --stale-versions` would free."""
    project.write("main.py", OUTPUTS)
    project.run(N="3")
    upgraded = tmp_path / "upgraded"
    shutil.copytree(project.vdir, upgraded / "jax-0.0.1")  # the same program's entries, by the JAX before
    project.env["GKX_JAX_CACHE_DIR"] = str(upgraded)
    assert "changed JAX" in project.run(N="3")
    groups = {g["cause"]: g for g in project.explain()["groups"]}
    fix = groups["changed JAX"]["fix"]
    assert "entries never carry across JAX versions" in fix and "prune --stale-versions frees jax-0.0.1/ (" in fix, fix
    assert f"JAX 0.0.1 -> {JAX_VERSION}" in groups["changed JAX"]["functions"][0]["detail"], groups


PARTICLES = r"""
import os
import jax, jax.numpy as jnp

N = int(os.environ["N"])  # 200 -> 240 particles, as jax-md's NPT example

def force(i):
    def f(x):
        return jnp.cos(x) * (i + 1)
    f.__name__ = f"force_{i}"
    return jax.jit(f)

print(sum(float(force(i)(jnp.ones(N)).sum()) for i in range(12)))
"""


def test_one_change_to_many_functions_stays_a_screen(project: Project) -> None:
    """Issue 45: jax-md's NPT run with N 200 -> 240 gave 67 lines. Functions that missed for one
    reason are one line (three names, how many more), the user's first, at most six lines a cause;
    `--all` lists every one."""
    project.write("main.py", PARTICLES)
    project.run(N="200")
    project.run(N="240")
    text = project.venv.cli("explain", env=project.env).stdout
    last = text.split("\nearlier")[0].splitlines()
    assert len(last) <= 10, text
    assert any(re.search(r"jit_force_\d+, jit_force_\d+, jit_force_\d+ and 9 more: inputs f32\[200\] -> f32\[240\]", ln)
               for ln in last), text
    every = project.venv.cli("explain", "--all", env=project.env).stdout
    earlier = every.split("\nearlier")[1]
    assert all(f"jit_force_{i} " in earlier for i in range(12)), every


T_FINAL = r"""
import os
import jax, jax.numpy as jnp

T_FINAL = float(os.environ["T"])  # a PDE's t_final, written into the code

@jax.jit
def solve(u):
    for _ in range(5):
        u = u + 0.01 * jnp.sin(u) * T_FINAL
    return u

print(float(solve(jnp.ones(4)).sum()))
"""


def test_a_constant_written_into_the_code_is_named_with_its_values(project: Project) -> None:
    """Issue 45: a constant in the code (diffrax's `t1`, a PDE's `t_final`) gave "changed
    computation" with four possible causes; its scalar constants are the computation's readable
    value, so the one that changed is named, before and after."""
    project.write("main.py", T_FINAL)
    project.run(T="2.0")
    assert "1 changed computation" in project.run(T="3.5")
    (detail,) = project.last()[CHANGED_COMPUTATION].values()
    assert "a constant in its code changed, 2.0 -> 3.5 (5 places)" in detail, detail
    project.run(T="3.5")  # the same value again: served
    assert "0 misses" in project.run(T="3.5")
