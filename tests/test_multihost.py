"""Multi-host runs (SPEC §9): two processes joined by ``jax.distributed.initialize`` on 127.0.0.1,
on CPU, sharing one cache directory. Only process 0 writes (JAX returns before ``put`` elsewhere);
on CPU the key of process 1 includes its device assignment, so it compiles again on every run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import COUNTING, Venv, free_port
from test_activation import VERSION_DIR

RANK = r"""
import json, sys
import jax
rank, port = int(sys.argv[1]), sys.argv[2]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=rank,
                           initialization_timeout=120)
import jax.numpy as jnp
""" + COUNTING + r"""
@jax.jit
def step(x):
    return jnp.tanh(x @ x.T).sum(axis=0) * 3.0
result = float(step(jnp.linspace(0.0, 1.0, 64).reshape(8, 8)).sum())
print(json.dumps({"rank": jax.process_index(), "processes": jax.process_count(), "result": round(result, 4), **counts}))
jax.distributed.shutdown()
"""


def run_ranks(venv: Venv, env: dict[str, str]) -> list[dict[str, int]]:
    port = str(free_port())
    procs = [subprocess.Popen([venv.python, "-c", RANK, str(rank), port], env={**venv.env, **env},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(venv.home))
             for rank in (0, 1)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert [r["rank"] for r in results] == [0, 1] and all(r["processes"] == 2 for r in results)
    return results


def entries(vdir: Path) -> set[str]:
    return {p.name for p in vdir.iterdir() if p.name.endswith("-cache")}


def test_only_process_0_writes_and_is_served_on_the_second_run(venv: Venv, tmp_path: Path) -> None:
    cache = tmp_path / "shared-cache"
    env = {"GKX_JAX_CACHE_DIR": str(cache)}
    vdir = cache / VERSION_DIR

    first = run_ranks(venv, env)
    assert all(r["hits"] == 0 and r["requests"] >= 2 for r in first)
    written = entries(vdir)
    assert len(written) == first[0]["requests"]  # process 0's entries only: process 1's keys differ
    stats = json.loads(venv.cli("--json", "stats", env=env).stdout)["stats"]  # both ranks' ledgers
    assert stats["writes"] == first[0]["requests"] == stats["misses"]  # process 1's compiles are not cached
    assert stats["not_cached"] == first[1]["requests"] == stats["not_cached_by_reason"]["not process 0"]

    second = run_ranks(venv, env)
    assert second[0]["hits"] == second[0]["requests"] == first[0]["requests"]
    assert second[1]["hits"] == 0  # CPU: process 1's key includes its device assignment
    assert entries(vdir) == written  # and it still writes nothing
    assert second[0]["result"] == second[1]["result"] == first[0]["result"]


def test_rank_1_is_named_not_process_0_and_its_misses_the_device_assignment(venv: Venv, tmp_path: Path) -> None:
    """On CPU, rank 1's key includes its device assignment (JAX strips it only on GPU), and only
    process 0 writes: `explain` names both, and the changed part as the device assignment, which
    JAX keeps in the compile options."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "shared-cache")}
    run_ranks(venv, env)
    assert venv.cli("stats", "--reset", env=env).returncode == 0
    second = run_ranks(venv, env)
    assert second[0]["hits"] == second[0]["requests"] and second[1]["hits"] == 0
    data = json.loads(venv.cli("--json", "explain", env=env).stdout)
    # Each rank is a process of its own (launched apart): two runs, the last and an earlier one.
    groups = {g["cause"]: {f["name"]: f["detail"] for f in g["functions"]} for g in data["groups"] + data["earlier"]}
    assert "jit_step" in groups["not cached: not process 0"], groups
    detail = groups["not cached: not process 0"]["jit_step"]
    assert "changed device assignment" in detail and "compile options" in detail, groups
    assert data["last_run"]["misses"] == 0 and data["last_run"]["not_cached"] in (0, second[1]["requests"]), data["last_run"]
