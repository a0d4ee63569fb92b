"""What differs, named whole (SPEC §13.1), on real programs: every part in which a miss differs from
its closest entry, not only the first (8 -> 4 devices); a file renamed or moved is "new, or moved",
with what differs; a `cannot tell` still names what differs from the closest entry; JAX's helpers
follow the rule user functions do; a fix names the source of the setting the run used."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import Project, Venv, causes

SHARDED = r"""
import json
import jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(jax.devices(), ("d",))
x = jax.device_put(jnp.ones((32, 8)), NamedSharding(mesh, P("d")))
w = jnp.full((8, 8), 0.5)
@jax.jit
def step(x, w):
    return jnp.tanh(x @ w).sum()
print(json.dumps({"result": float(step(x, w)), "devices": len(jax.devices())}))
"""


def test_fewer_devices_name_the_devices_and_the_computation_with_them(project: Project) -> None:
    """Sharded over 8 host devices, then 4: the step's miss names the devices, before and after,
    and says its computation differs too (the number of partitions is in it), not "same input
    shapes: its code, a static argument, a closed-over constant", none of which changed."""
    project.write("main.py", SHARDED)
    project.run(JAX_NUM_CPU_DEVICES="8")
    project.run(JAX_NUM_CPU_DEVICES="4")
    found = causes(project.explain()["groups"])
    step = found.get("changed devices", {}).get("jit_step", "")
    assert step.startswith("devices: 8 x cpu -> 4 x cpu"), found
    assert "its computation differs too" in step and "closed-over constant" not in step, found


TRAIN = """
import jax, jax.numpy as jnp
LR = {lr}
@jax.jit
def train_step(w, g):
    return w - LR * g
"""
MAIN = """
import json, jax.numpy as jnp
from {module} import train_step
print(json.dumps({{"result": float(train_step(jnp.ones(8), jnp.ones(8)).sum())}}))
"""


def test_a_renamed_module_is_new_or_moved_with_what_differs(project: Project) -> None:
    """`git mv train.py train_adam.py`, then a changed learning rate: the evidence cannot tell another
    function from the same one moved, so it says both, and what differs from the moved entry."""
    project.write("train.py", TRAIN.format(lr="0.1"))
    project.write("main.py", MAIN.format(module="train"))
    project.run()
    (project.folder / "train.py").rename(project.folder / "train_adam.py")
    project.write("train_adam.py", TRAIN.format(lr="0.05"))
    project.write("main.py", MAIN.format(module="train_adam"))
    project.run()
    found = causes(project.explain()["groups"])
    step = found.get("cannot tell", {}).get("jit_train_step", "")
    assert step.startswith("new, or jit_train_step moved from train.py"), found
    assert "the closest entry differs in its computation, with the same input shapes (f32[8], f32[8])" in step, found
    (group,) = [g for g in project.explain()["groups"] if g["cause"] == "cannot tell"]
    assert "renamed or moved the file" in group["fix"] and "module file" not in group["fix"], group  # already one


def test_a_module_still_there_is_another_function_not_a_move(project: Project) -> None:
    """Two modules with a `train_step` each, both still there: the second is another function."""
    project.write("train.py", TRAIN.format(lr="0.1"))
    project.write("main.py", MAIN.format(module="train"))
    project.run()
    project.write("train_adam.py", TRAIN.format(lr="0.05"))
    project.write("main.py", MAIN.format(module="train_adam"))
    project.run()
    found = causes(project.explain()["groups"])
    assert found.get("new", {}).get("jit_train_step", "").startswith("another jit_train_step, in train_adam.py"), found


HELPERS = r"""
import json, os
import jax.numpy as jnp
n = int(os.environ["N"])
print(json.dumps({"result": float(jnp.linspace(0.0, 1.0, n).sum() + jnp.arange(n).sum())}))
"""


def test_jax_helpers_with_earlier_entries_are_compared_with_them(project: Project) -> None:
    """N=64, then N=32: JAX's own helpers have entries from the earlier run, so their misses are
    compared with them (as a user function's are), not "a further variant"."""
    project.write("main.py", HELPERS)
    project.run(N="64")
    project.run(N="32")
    data = project.explain()
    helpers = [f for g in data["groups"] for f in g["functions"] if f["helper"]]
    assert helpers, data["groups"]
    assert not [f for f in helpers if "further variant" in f["detail"]], helpers


SLOW_ENOUGH = r"""
import json
import jax, jax.numpy as jnp
@jax.jit
def smooth(x):
    return jnp.convolve(x, jnp.ones(3) / 3.0, mode="same")
print(json.dumps({"result": float(smooth(jnp.ones(48)).sum())}))
"""


def test_a_threshold_fix_names_the_variable_the_run_had(project: Project) -> None:
    """GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS=5 in the run's environment only: the uncached compile
    names the threshold and where it came from, and the fix says to change the variable (which
    outranks config set), though the shell running `explain` has no such variable."""
    project.write("main.py", SLOW_ENOUGH)
    project.run(GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS="5")
    data = project.explain()
    (group,) = [g for g in data["groups"] if g["cause"] == "not cached: below min_compile_time_secs"]
    smooth = next(f for f in group["functions"] if f["name"] == "jit_smooth")
    assert smooth["detail"].startswith("min_compile_time_secs 5 s (env GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS); it took"), smooth
    assert "GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS" in group["fix"] and "config set" not in group["fix"].split("outranks")[0], group


def test_a_cap_fix_names_the_file_config_set_writes(project: Project, venv: Venv) -> None:
    """The cap set in the user's file evicts: the fix's `config set` names the file it writes (the
    environment's policy file, which outranks the user's)."""
    project.write("main.py", SLOW_ENOUGH.replace("float(smooth(jnp.ones(48)).sum())", "sum(float(smooth(jnp.ones(n)).sum()) "
                                                 "for n in range(*map(int, __import__('os').environ['N'].split())))"))
    user = Path(venv.env["HOME"]) / ".config" / "gkx-autocache" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text('max_size = "40KiB"\n')
    project.run(N="20 60")  # more than the cap holds: the oldest go at exit
    project.run(N="20 22")
    data = project.explain()
    evicted = [g for g in data["groups"] + data["earlier"] if g["cause"] == "evicted"]
    assert evicted, json.dumps(data)[:2000]
    fix = evicted[0]["fix"]
    assert "config set max_size" in fix and str(Path(venv.path) / "gkx-autocache.toml") in fix, fix
    assert str(user) in fix, fix
