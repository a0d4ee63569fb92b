"""What the evidence knows, said (SPEC §13.1; issue 70): causes that were true but led the wrong way,
or said less than the module tells. Real model code (equinox, a GPT-like model in plain JAX, a
data-parallel `Mesh` of 8 host devices), run as module files in fresh processes: a mesh shrunk is a
change of devices; one function name in two modules is two functions; JAX's own helpers change with
JAX; inserted layers are added inputs; donation, an input's sharding and the output shapes are named;
"misses on every run" does not depend on `--since`; a lambda has one name."""

from __future__ import annotations

import re

from conftest import Project

from gkx_autocache._causes import NEW

LAMBDA = r"""
import json
import jax, jax.numpy as jnp

def body(x):
    for i in range(60):  # slow enough to trace to be among the slowest
        x = jnp.tanh(x) * (1.0 + i / 60)
    return x.sum()

predict = jax.jit(lambda x: body(x))
print(json.dumps({"result": float(predict(jnp.ones((8, 64))))}))
"""


def test_a_lambda_has_one_name_in_the_tracing_line_and_the_causes(project: Project) -> None:
    """JAX names a lambda's module `jit__lambda`: the tracing line says so too, not `jit_<lambda>`."""
    project.write("main.py", LAMBDA)
    project.run()
    traced = [f["function"] for f in project.explain()["last_run"]["tracing_by_function"]]
    assert "jit__lambda" in traced and "jit_<lambda>" not in traced, traced
    text = project.venv.cli("explain", env=project.env).stdout
    assert "<lambda>" not in text and re.search(r"tracing and lowering .*jit__lambda \d", text), text
    assert "jit__lambda" in project.last()[NEW], text


# -- the pieces, in-process ---------------------------------------------------------------------

def test_a_traced_functions_name_is_its_modules() -> None:
    """JAX's tracing event names `jit(<lambda>)`, its module `jit__lambda`."""
    from gkx_autocache._record.recorder import module_name

    assert module_name("jit(<lambda>)") == "jit__lambda" and module_name("jit(step)") == "jit_step"
    assert module_name("step") == "jit_step" and module_name("pmap(f)") == "pmap_f" and module_name("") == ""
