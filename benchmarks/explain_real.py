"""Why it missed, on CPU, for real programs (issue 58's done-when): a flax GPT (140-180 parameter
leaves), diffrax's stiff-ODE example, optimistix's own tests and a jax-md simulation, each run as
its user runs it, one process a run, against its own fresh cache: cold, warm, then the edits a user
makes (a model's layers, sequence, batch, dtype and learning rate; a solver's end time and its
step-size controller's tolerance; a test file's tolerance; a particle count and a density). Each edit
is a text edit of the program's source, kept for the steps after it. After each run it prints the
report line (``gkx-autocache: ...`` on stderr), ``gkx-autocache explain``'s text, and writes both
with ``explain --json`` to ``--out``.

    python benchmarks/explain_real.py [--only flax,diffrax,optimistix,jaxmd] [--out FILE] [--tests DIR]

Runs with the interpreter running it, which must hold JAX, gkx-autocache, flax, optax, diffrax,
optimistix, jax-md and pytest (CPU is forced: ``JAX_PLATFORMS=cpu``). optimistix's tests are its
repository's ``tests/`` folder, which its wheel does not ship: ``--tests DIR`` names a folder with
them as ``optimistix_tests/`` and an empty ``pytest.ini`` (the layout ``lowering.py`` uses).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

FLAX_GPT = r'''
"""A GPT in flax.linen: token and position embeddings, LAYERS pre-LayerNorm blocks of causal
multi-head attention and an MLP, tied output; optax's AdamW; a jitted train step and an eval."""
import jax, jax.numpy as jnp
import flax.linen as nn
import optax

LAYERS = 8
SEQ = 64
BATCH = 8
WIDTH, HEADS, VOCAB = 64, 4, 256
DTYPE = jnp.float32
LEARNING_RATE = 3e-4


class Block(nn.Module):
    @nn.compact
    def __call__(self, x):
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
        h = nn.LayerNorm(dtype=DTYPE)(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=HEADS, dtype=DTYPE)(h, h, mask=mask)
        h = nn.LayerNorm(dtype=DTYPE)(x)
        h = nn.Dense(4 * WIDTH, dtype=DTYPE)(h)
        return x + nn.Dense(WIDTH, dtype=DTYPE)(nn.gelu(h))


class GPT(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        embed = nn.Embed(VOCAB, WIDTH, dtype=DTYPE)
        x = embed(tokens) + nn.Embed(SEQ, WIDTH, dtype=DTYPE)(jnp.arange(tokens.shape[1]))
        for _ in range(LAYERS):
            x = Block()(x)
        return embed.attend(nn.LayerNorm(dtype=DTYPE)(x))


model = GPT()
tx = optax.adamw(LEARNING_RATE, weight_decay=0.1)


def loss_fn(params, tokens):
    logits = model.apply(params, tokens[:, :-1]).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


@jax.jit
def train_step(params, opt_state, tokens):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


@jax.jit
def evaluate(params, tokens):
    return loss_fn(params, tokens)


tokens = jax.random.randint(jax.random.key(0), (BATCH, SEQ + 1), 0, VOCAB)
params = jax.jit(model.init)(jax.random.key(1), tokens[:, :-1])
opt_state = tx.init(params)
for _ in range(3):
    params, opt_state, loss = train_step(params, opt_state, tokens)
print("leaves", len(jax.tree.leaves(params)), "loss", float(loss), "eval", float(evaluate(params, tokens)))
'''

JAXMD_SIM = r'''
"""jax-md's README example grown a little: soft spheres in a periodic box at a density, relaxed by
FIRE descent, then NVT Langevin dynamics; energies and temperature logged."""
import jax, jax.numpy as jnp
from jax_md import energy, minimize, quantity, simulate, space

N = 500
DIMENSION = 2
DENSITY = 0.8
box_size = quantity.box_size_at_number_density(N, DENSITY, DIMENSION)
displacement, shift = space.periodic(box_size)
R = jax.random.uniform(jax.random.key(0), (N, DIMENSION), maxval=box_size)
energy_fn = energy.soft_sphere_pair(displacement)

fire_init, fire_apply = minimize.fire_descent(energy_fn, shift)
state = fire_init(R)
relax = jax.jit(lambda s: jax.lax.fori_loop(0, 100, lambda i, s: fire_apply(s), s))
state = relax(state)

nvt_init, nvt_apply = simulate.nvt_langevin(energy_fn, shift, dt=1e-3, kT=0.1)
md = nvt_init(jax.random.key(1), state.position)
run = jax.jit(lambda s: jax.lax.fori_loop(0, 100, lambda i, s: nvt_apply(s), s))
md = run(md)
kT = jax.jit(lambda s: quantity.temperature(momentum=s.momentum, mass=s.mass))(md)
print("energy", float(jax.jit(energy_fn)(md.position)), "kT", float(kT))
'''


@dataclass
class Program:
    """One real program: its files (written or copied into a fresh folder), how it is run there,
    and its steps, each a name and the text edits (file, old, new) made before that run."""

    files: dict[str, str]
    command: list[str]
    steps: list[tuple[str, list[tuple[str, str, str]]]]


def programs(tests: Path) -> dict[str, Program]:
    pytest = [sys.executable, "-m", "pytest", "-c", "pytest.ini", "--rootdir", ".", "-q", "-p", "no:cacheprovider"]
    return {
        "flax": Program(
            {"gpt.py": FLAX_GPT}, [sys.executable, "gpt.py"],
            [("cold", []), ("warm", []),
             ("layers 8 -> 10", [("gpt.py", "LAYERS = 8", "LAYERS = 10")]),
             ("sequence 64 -> 32", [("gpt.py", "SEQ = 64", "SEQ = 32")]),
             ("batch 8 -> 16", [("gpt.py", "BATCH = 8", "BATCH = 16")]),
             ("float32 -> bfloat16", [("gpt.py", "DTYPE = jnp.float32", "DTYPE = jnp.bfloat16")]),
             ("learning rate 3e-4 -> 1e-3", [("gpt.py", "LEARNING_RATE = 3e-4", "LEARNING_RATE = 1e-3")])]),
        "diffrax": Program(
            {"stiff_ode.py": (HERE / "examples" / "diffrax_stiff_ode.py").read_text()},
            [sys.executable, "stiff_ode.py"],
            [("cold", []), ("warm", []),
             ("t1 100.0 -> 200.0", [("stiff_ode.py", "t1 = 100.0", "t1 = 200.0")]),
             ("rtol=1e-8 -> 1e-6 (PIDController)",
              [("stiff_ode.py", "PIDController(rtol=1e-8", "PIDController(rtol=1e-6")])]),
        "optimistix": Program(
            {"pytest.ini": "[pytest]\n",
             **{f"optimistix_tests/{p.name}": p.read_text() for p in (tests / "optimistix_tests").glob("*.py")}},
            [*pytest, "optimistix_tests/test_fixed_point.py", "-k", "not jvp"],
            [("cold", []), ("warm", []),
             ("solver tolerance 1e-6 -> 1e-7 (test_fixed_point.py)",
              [("optimistix_tests/test_fixed_point.py", "atol = rtol = 1e-6", "atol = rtol = 1e-7")]),
             ("the same again (no edit)", [])]),
        "jaxmd": Program(
            {"sim.py": JAXMD_SIM}, [sys.executable, "sim.py"],
            [("cold", []), ("warm", []),
             ("density 0.8 -> 0.9 (box size)", [("sim.py", "DENSITY = 0.8", "DENSITY = 0.9")]),
             ("particles 500 -> 1000", [("sim.py", "N = 500", "N = 1000")])]),
    }


def run_program(name: str, program: Program, work: Path) -> list[dict[str, Any]]:
    folder = work / name
    for relative, content in program.files.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(content)
    env = {**os.environ, "GKX_JAX_CACHE_DIR": str(work / f"{name}-cache"), "GKX_JAX_CACHE_REPORT": "1",
           "JAX_PLATFORMS": "cpu"}
    found = []
    for step, edits in program.steps:
        for relative, old, new in edits:
            source = (folder / relative).read_text()
            if old not in source:
                raise SystemExit(f"{name}: {step}: {old!r} is not in {relative}")
            (folder / relative).write_text(source.replace(old, new))
        started = time.perf_counter()
        ran = subprocess.run(program.command, cwd=folder, env=env, capture_output=True, text=True, check=False)
        secs = time.perf_counter() - started
        line = next((ln for ln in ran.stderr.splitlines() if ln.startswith("gkx-autocache: ")), "")
        text = subprocess.run([sys.executable, "-m", "gkx_autocache", "explain"], cwd=folder, env=env,
                              capture_output=True, text=True, check=False)
        as_json = subprocess.run([sys.executable, "-m", "gkx_autocache", "explain", "--json"], cwd=folder, env=env,
                                 capture_output=True, text=True, check=False)
        print(f"== {name}: {step}: exit {ran.returncode}, {secs:.1f} s; {ran.stdout.strip()[-300:]}", flush=True)
        print(line or ran.stderr[-2000:])
        print(text.stdout + text.stderr, flush=True)
        found.append({"program": name, "step": step, "exit": ran.returncode, "secs": round(secs, 1), "line": line,
                      "stdout_tail": ran.stdout[-1000:], "explain": text.stdout + text.stderr,
                      "explain_json": json.loads(as_json.stdout) if as_json.returncode == 0 else as_json.stderr})
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated programs (default: all)")
    parser.add_argument("--out", type=Path, help="write every run's line and explain text and JSON here")
    parser.add_argument("--tests", type=Path, default=Path(".bench/src"),
                        help="a folder with optimistix_tests/ (default: .bench/src)")
    parser.add_argument("--keep", action="store_true", help="keep the programs' folders and caches")
    args = parser.parse_args()
    chosen = [p for p in args.only.split(",") if p]
    work = Path(tempfile.mkdtemp(prefix="gkx-explain-real-"))
    found: list[dict[str, Any]] = []
    try:
        for name, program in programs(args.tests).items():
            if not chosen or name in chosen:
                found += run_program(name, program, work)
                if args.out:
                    args.out.write_text(json.dumps(found, indent=1))
    finally:
        if args.keep:
            print(f"kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
