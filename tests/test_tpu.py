"""On a TPU (SPEC §15, amended 2026-12-06; issue 59): what can be tested without one. A warm read
of an entry for a device assignment without device 0 can crash the TPU runtime (jax-ml/jax#38004,
open): such lookups read no entry, their compiles are still written, and the miss has a cause of
its own. A one-chip machine cannot show the crash, nor CI's CPU: this CPU's four host devices stand
in for a TPU's chips, the adapter's list of guarded platforms naming ``cpu`` in the test's process."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import COUNTING, Venv, autocache_warnings

from gkx_autocache import _jax

SUBSET = r"""
import json, sys
from gkx_autocache import _jax as adapter
adapter.SUBSET_PLATFORMS = ("cpu",)  # this CPU stands in for a TPU: set before import jax configures
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

    assert _jax.lookup_devices(({}, None, [Device(4), Device(5)]), {}) == [4, 5]
    assert _jax.lookup_devices((Options(), None), {}) == [2, 3]
    assert _jax.unsafe_subset("tpu", lambda: [2, 3]) is not None
    assert _jax.unsafe_subset("tpu", lambda: [0, 1]) is None and _jax.unsafe_subset("cpu", lambda: [2, 3]) is None
    assert _jax.unsafe_subset("tpu", lambda: []) is None  # nothing known: read as before


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
