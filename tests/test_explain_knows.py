"""What the evidence knows, said (SPEC §13.1; issue 70): causes that were true but led the wrong way,
or said less than the module tells. Real model code (equinox, a GPT-like model in plain JAX, a
data-parallel `Mesh` of 8 host devices), run as module files in fresh processes: a mesh shrunk is a
change of devices; one function name in two modules is two functions; JAX's own helpers change with
JAX; inserted layers are added inputs; donation, an input's sharding and the output shapes are named;
"misses on every run" does not depend on `--since`; a lambda has one name."""

from __future__ import annotations

import math
import re
import time

from conftest import Project

from gkx_autocache._causes import CHANGED_COMPUTATION, NEW

CLOCK_SEED = r"""
import json, time
import jax, jax.numpy as jnp

SEED = int(time.time() * 1000) % 2**31  # a clock seed, closed over: another constant every run

@jax.jit
def noisy_step(w, x):
    noise = jax.random.normal(jax.random.key(SEED), x.shape)
    return w - 0.01 * (x + noise)

print(json.dumps({"result": float(noisy_step(jnp.ones(8), jnp.ones(8)).sum())}))
"""


def test_misses_on_every_run_does_not_depend_on_the_since_window(project: Project) -> None:
    """A clock seed closed over misses on every run: `explain --since` with a window that holds the
    last run alone still flags it (on 7906ae9 the flag was computed inside the window)."""
    project.write("main.py", CLOCK_SEED)
    for _ in range(3):
        project.run()
    time.sleep(2.5)
    started = time.time()
    project.run()
    window = f"{math.ceil(time.time() - started) + 1}s"  # the last run, not the one before (2.5 s earlier)
    data = project.explain("--since", window)
    assert data["earlier"] == [], data["earlier"]
    (group,) = [g for g in data["groups"] if g["cause"] == CHANGED_COMPUTATION]
    step = next(f for f in group["functions"] if f["name"] == "jit_noisy_step")
    assert "misses on every run" in step.get("every_run", ""), step


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
