"""On a TPU (SPEC §15, amended 2026-12-06; issue 59): what can be tested without one. A warm read
of an entry for a device assignment without device 0 can crash the TPU runtime (jax-ml/jax#38004,
open): such lookups read no entry, their compiles are still written, and the miss has a cause of
its own. A one-chip machine cannot show the crash, nor CI's CPU: this CPU's four host devices stand
in for a TPU's chips, the adapter's list of guarded platforms naming ``cpu`` in the test's process.
What `explain` and `ci-key` say of a TPU's own key parts (a libtpu build, ``LIBTPU_INIT_ARGS``, the
slice's topology) is tested the same way: the facts of two runs as a TPU gives them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import COUNTING, Project, Venv, autocache_warnings, causes

from gkx_autocache._jax import caching as jax_caching

SUBSET = r"""
import json, sys
from gkx_autocache._jax import caching as jax_caching
jax_caching.SUBSET_PLATFORMS = ("cpu",)  # this CPU stands in for a TPU: set before import jax configures
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
""" + COUNTING + r"""

def step(a):
    return jnp.tanh(a @ a.T).sum(axis=0) * 2.0

def on(devices):
    mesh = Mesh(np.array(devices), ("x",))
    x = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("x")))
    before = dict(counts)
    value = float(jax.jit(step)(x).sum())
    return {"hits": counts["hits"] - before["hits"], "requests": counts["requests"] - before["requests"], "value": value}

d = jax.devices()
print(json.dumps({"first": on(d[0:2]), "later": on(d[2:4]), "one": on(d[3:4])}))
"""


def _run(venv: Venv, env: dict[str, str]) -> tuple[dict[str, Any], str]:
    proc = venv.run("-c", SUBSET, env={**env, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_a_device_subset_without_device_0_reads_no_entry_and_still_writes(venv: Venv, tmp_path: Path) -> None:
    """Devices [0, 1] are served warm; [2, 3] and [3] are not read (a cause of their own, in the report
    line and `explain`, said once), though their entries are written; the results are the same. On
    1531a79 every one of them was read."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_REPORT": "1"}
    cold, _ = _run(venv, env)
    entries = sorted((tmp_path / "c").glob("jax-*/jit_step-*-cache"))
    assert len(entries) == 3, entries  # one a device assignment: all written
    warm, stderr = _run(venv, env)
    assert warm["first"]["hits"] == warm["first"]["requests"] > 0, warm
    assert warm["later"]["hits"] == 0 and warm["one"]["hits"] == 0, warm
    assert {k: v["value"] for k, v in warm.items()} == {k: v["value"] for k, v in cold.items()}
    said = [w for w in autocache_warnings(stderr) if "AutocacheWarning" in w]
    assert len(said) == 1 and "without device 0" in said[0] and "jax-ml/jax#38004" in said[0], stderr
    assert re.search(r"misses \([1-9]\d* not read: TPU device subset\)", stderr), stderr
    data = json.loads(venv.cli("--json", "explain", env=env).stdout)
    (group,) = [g for g in data["groups"] if g["cause"] == "not read: TPU device subset"]
    assert "jax-ml/jax#38004" in group["fix"] and "still written" in group["fix"], group


def test_the_devices_of_a_lookup_are_read_on_every_jax_line() -> None:
    """``executable_devices`` where JAX passes it (0.4.36 on), else the compile options' device
    assignment, as 0.4.30 prints it; only a guarded platform, and only without device 0."""

    class Device:
        def __init__(self, n: int) -> None:
            self.id = n

    class Options:
        class executable_build_options:  # noqa: N801 (the binding's name)
            device_assignment = "DeviceAssignment{replica_count=1, computation_count=2, Computation0{2} Computation1{3}}"

    assert jax_caching.lookup_devices(({}, None, [Device(4), Device(5)]), {}) == [4, 5]
    assert jax_caching.lookup_devices((Options(), None), {}) == [2, 3]
    assert jax_caching.unsafe_subset("tpu", lambda: [2, 3]) is not None
    assert jax_caching.unsafe_subset("tpu", lambda: [0, 1]) is None and jax_caching.unsafe_subset("cpu", lambda: [2, 3]) is None
    assert jax_caching.unsafe_subset("tpu", lambda: []) is None  # nothing known: read as before


def test_ci_key_holds_the_tpu_topology(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A v6e-1 CI cache read by v6e-4 jobs is another topology's (sglang-jax #1263): `ci-key` holds
    what the host says of its slice and the chips it sees (as the TPU machine here reads: a one-chip
    sandbox of a v5litepod-4), and nothing where there is no TPU, so other keys stay as they were."""
    from gkx_autocache._cli import ci

    for name in ci.TPU_TOPOLOGY:
        monkeypatch.delenv(name, raising=False)
    no_dev = tmp_path / "dev"
    (no_dev / "vfio").mkdir(parents=True)
    assert ci.tpu_topology({}, str(no_dev)) is None
    plain, parts = ci.ci_key()
    assert "tpu" not in parts or ci.tpu_topology(dict(__import__("os").environ)) is not None
    (no_dev / "vfio" / "1").touch()
    (no_dev / "vfio" / "vfio").touch()
    v5e = {"TPU_ACCELERATOR_TYPE": "v5litepod-4", "TPU_TOPOLOGY": "2x2", "TPU_HOST_BOUNDS": "1,1,1"}
    assert ci.tpu_topology(v5e, str(no_dev)) == "accelerator_type=v5litepod-4 topology=2x2 host_bounds=1,1,1; 1 chip here"
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v6e-4")
    four = ci.ci_key()
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v6e-1")
    one = ci.ci_key()
    assert four[0] != one[0] != plain and one[1]["tpu"].startswith("accelerator_type=v6e-1"), (four, one)


# The platform version of the TPU machine here (JAX 0.10.2, libtpu 0.0.42.1), and of another build.
BUILT = "tpu PJRT C API\nTFRT TPU v5 lite\nBuilt on Jun 17 2026 11:08:48 (1781719728) cl/933746096"
REBUILT = "tpu PJRT C API\nTFRT TPU v5 lite\nBuilt on Jul 30 2026 09:12:01 (1785402721) cl/951234567"


def _backend_miss(before: str, after: str) -> dict[str, Any]:
    """A miss whose closest entry differs from it in the backend version alone: its cause."""
    from gkx_autocache import _key
    from gkx_autocache._explain import classify, facts
    from gkx_autocache._record import index

    parts = dict.fromkeys(_key.PARTS, "a" * 16)
    evidence = index.Evidence()
    evidence.add(index.lines_for("jit_step", "1" * 20, 1e9, "r1", parts, {"backend version": before}, "f32[8]",
                                 "main.py:step", {}))
    evidence.wrote("jit_step", "1" * 20)
    mine = facts.Facts({**parts, "backend version": "b" * 16}, {"backend version": after}, "f32[8]", "main.py:step", {})
    return classify.classify("jit_step-" + "2" * 64, mine, evidence, "r2")


def test_a_libtpu_rebuild_is_named_with_both_builds() -> None:
    """JAX keys the backend's platform version, whose last line is libtpu's build ("Built on ...
    cl/..."): a rebuild (or an upgrade) is said as one, with both builds, and a fix that is true
    (nothing to fix; pin libtpu in CI). On 1531a79: `changed backend`, the three lines twice."""
    from gkx_autocache import _causes

    found = _backend_miss(BUILT, REBUILT)
    assert found == {"cause": "changed libtpu", "detail": "libtpu rebuilt: Built on Jun 17 2026 11:08:48 cl/933746096 "
                                                          "-> Built on Jul 30 2026 09:12:01 cl/951234567"}, found
    assert "nothing to fix" in _causes.FIXES[found["cause"]] and "ci-key" in _causes.FIXES[found["cause"]]
    # Another chip, or a backend that is not libtpu's, is no rebuild.
    assert _backend_miss(BUILT, REBUILT.replace("v5 lite", "v6 lite"))["cause"] == "changed backend"
    assert _backend_miss("cuda 12030", "cuda 12040")["cause"] == "changed backend"


LIBTPU_FLAGS = r"""
import json
import jax, jax.numpy as jnp
@jax.jit
def step(x):
    return jnp.tanh(x * 2.0).sum()
print(json.dumps({"result": float(step(jnp.ones(8)))}))
"""


def test_a_changed_libtpu_init_args_flag_is_named_by_the_flag(project: Project) -> None:
    """JAX keys LIBTPU_INIT_ARGS with XLA_FLAGS (on any platform: this CPU's key holds them too). One
    TPU flag changed is named by its variable and name, before and after, not as all the flags twice;
    XLA_FLAGS keeps its own cause. On 1531a79: `changed XLA_FLAGS`, the whole lists."""
    project.write("main.py", LIBTPU_FLAGS)
    same = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false", "GKX_JAX_CACHE_REBUILD_AHEAD": "0"}  # (each key missed)
    project.run(**same, LIBTPU_INIT_ARGS="--xla_tpu_enable_latency_hiding_scheduler=true --xla_enable_async_all_gather=true")
    project.run(**same, LIBTPU_INIT_ARGS="--xla_enable_async_all_gather=true --xla_tpu_enable_latency_hiding_scheduler=false")
    data = project.explain()
    found = causes(data["groups"])
    assert set(found) == {"changed LIBTPU_INIT_ARGS"}, found
    assert found["changed LIBTPU_INIT_ARGS"]["jit_step"] == ("LIBTPU_INIT_ARGS: --xla_tpu_enable_latency_hiding_scheduler: "
                                                             "true -> false"), found
    (group,) = data["groups"]
    assert "LIBTPU_INIT_ARGS" in group["fix"] and "ci-key" in group["fix"], group
    project.run(XLA_FLAGS="--xla_cpu_enable_fast_math=true", GKX_JAX_CACHE_REBUILD_AHEAD="0",
                LIBTPU_INIT_ARGS="--xla_enable_async_all_gather=true --xla_tpu_enable_latency_hiding_scheduler=false")
    assert set(project.last()) == {"changed XLA_FLAGS"}, project.last()


TOPOLOGY = r"""
import json
from gkx_autocache._explain import facts
facts.TOPOLOGY_PLATFORMS = ("cpu",)  # this CPU stands in for a TPU: its devices are read as chips
import jax, jax.numpy as jnp
@jax.jit
def step(x):
    return jnp.tanh(x * 2.0).sum()
print(json.dumps({"result": float(step(jnp.ones(8)))}))
"""


def test_a_slice_of_another_topology_is_named_as_one(project: Project) -> None:
    """A v6e-1 CI cache read by v6e-4 jobs (sglang-jax #1263): each slice has its own entries, and the
    miss says so, by its chips, topology and accelerator type, with a fix that keys a CI cache by it.
    On 1531a79: `changed devices: 1 x cpu -> 4 x cpu`, and a fix naming CUDA_VISIBLE_DEVICES."""
    project.write("main.py", TOPOLOGY)
    project.run(JAX_NUM_CPU_DEVICES="1", TPU_ACCELERATOR_TYPE="v6e-1")
    project.run(JAX_NUM_CPU_DEVICES="4", TPU_ACCELERATOR_TYPE="v6e-4", TPU_TOPOLOGY="2x2")
    data = project.explain()
    found = causes(data["groups"])
    assert set(found) == {"changed TPU topology"}, found  # JAX's own helpers too
    assert found["changed TPU topology"]["jit_step"] == "TPU topology: 1 chip (v6e-1) -> 4 chips 2x2 (v6e-4)", found
    (group,) = data["groups"]
    assert "ci-key" in group["fix"] and "CUDA_VISIBLE_DEVICES" not in group["fix"], group


def test_ci_key_holds_libtpu_init_args_as_jax_keys_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """JAX sorts the flags it keys and leaves the dump flags out, in LIBTPU_INIT_ARGS as in XLA_FLAGS:
    the same flags in another order, or with a dump asked for, restore the same CI cache; another
    value does not. On 1531a79 the variable was keyed as written."""
    from gkx_autocache._cli import ci

    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_enable_latency_hiding_scheduler=true --xla_enable_async_all_gather=true")
    key, parts = ci.ci_key()
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_enable_async_all_gather=true --xla_dump_to=/tmp/d "
                                           "--xla_tpu_enable_latency_hiding_scheduler=true")
    assert ci.ci_key()[0] == key, (parts, ci.ci_key()[1])
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_dump_to=/tmp/d")
    monkeypatch.delenv("LIBTPU_INIT_ARGS")
    plain = ci.ci_key()[0]
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_dump_to=/tmp/d")
    assert ci.ci_key()[0] == plain != key
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_enable_async_all_gather=true "
                                           "--xla_tpu_enable_latency_hiding_scheduler=false")
    assert ci.ci_key()[0] not in (key, plain)


def test_a_slice_is_said_by_its_chips_from_their_coordinates(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a TPU each device has its chip's coordinates (and a slice index): a chip's two cores (v2,
    v3) are one chip, two slices of 2 chips are 4 chips, the bounds are the coordinates' (this
    machine's one chip: [0, 0, 0]), and the accelerator type is the host's word for its slice."""
    from types import SimpleNamespace as Device

    from gkx_autocache._explain import facts

    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    monkeypatch.setenv("TPU_TOPOLOGY", "2x2")
    assert facts.topology([Device(coords=[0, 0, 0], slice_index=0)]) == "1 chip (v5litepod-4)"  # the machine here
    square = [Device(coords=[x, y, 0], slice_index=0) for y in (0, 1) for x in (0, 1)]
    assert facts.topology(square) == "4 chips 2x2x1 (v5litepod-4)"
    cores = [Device(coords=[x, 0, 0], slice_index=0, core_on_chip=k) for x in (0, 1) for k in (0, 1)]
    assert facts.topology(cores) == "2 chips 2x1x1 (v5litepod-4)"
    two = [Device(coords=[x, 0, 0], slice_index=s) for s in (0, 1) for x in (0, 1)]
    assert facts.topology(two) == "4 chips 2x1x1 in 2 slices (v5litepod-4)"
