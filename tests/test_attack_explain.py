"""Attacks on `explain` (SPEC §7, §13, §13.1, §15): histories and programs a JAX user has, each of
which made `explain`, the report line or `stats` say something false, and defects of the
bookkeeping (index, ledgers, liveness without flock). Real JAX where the cause depends on it; the
bookkeeping in-process where a real program cannot reach the state deterministically."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Venv
from test_explain_real import Project

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


@pytest.fixture
def project(venv: Venv, tmp_path: Path) -> Project:
    return Project(venv, tmp_path)


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
