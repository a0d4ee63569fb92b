"""Why it missed, on a TPU (issue 58's TPU scenario; issue 59): a GPT-like model, pure JAX (no
flax, no network), run as its user runs it, one process a run: cold, warm, 4 -> 6 layers, sequence
256 -> 128, float32 -> bfloat16, another learning rate. Prints each run's report line and
``gkx-autocache explain --json``'s groups (and writes them all to ``--out``).

    python benchmarks/tpu_explain.py [--dir DIR] [--out FILE] [--width 512] [--vocab 2048]

Runs with the interpreter running it, which must have JAX (0.10.2 on the TPU machine) and
gkx-autocache installed. On CPU it runs too (slowly at these sizes: ``--width 64``).

The model (``MODEL``) is the one ``tests/test_explain_models.py`` runs on CPU at width 16.
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
from pathlib import Path
from typing import Any

MODEL = r'''
"""A GPT-like model: embeddings, LAYERS blocks of causal attention and an MLP with LayerNorms, a
loss, and a train step with Adam written by hand; its sizes and constants from the environment."""
import json, os, time
import jax, jax.numpy as jnp

LAYERS = int(os.environ.get("LAYERS", "9"))
SEQ = int(os.environ.get("SEQ", "16"))
BATCH = int(os.environ.get("BATCH", "4"))
WIDTH, VOCAB = int(os.environ.get("WIDTH", "16")), int(os.environ.get("VOCAB", "32"))
DTYPE = jnp.dtype(os.environ.get("DTYPE", "float32"))
LR = float(os.environ.get("LR", "0.001"))
STARTED = time.time() % 1000 if os.environ.get("CLOSE_OVER_TIME") else 0.0


def init(key):
    keys = iter(jax.random.split(key, 8 * LAYERS + 4))
    dense = lambda i, o: jax.random.normal(next(keys), (i, o), DTYPE) * 0.02
    norm = lambda: {"scale": jnp.ones(WIDTH, DTYPE), "bias": jnp.zeros(WIDTH, DTYPE)}
    params = {"embed": dense(VOCAB, WIDTH), "pos": dense(SEQ, WIDTH), "ln_f": norm(), "layers": []}
    for _ in range(LAYERS):
        params["layers"].append({
            "ln1": norm(), "ln2": norm(),
            "attn": {"q": dense(WIDTH, WIDTH), "k": dense(WIDTH, WIDTH), "v": dense(WIDTH, WIDTH),
                     "o": dense(WIDTH, WIDTH)},
            "mlp": {"w1": dense(WIDTH, 4 * WIDTH), "b1": jnp.zeros(4 * WIDTH, DTYPE),
                    "w2": dense(4 * WIDTH, WIDTH), "b2": jnp.zeros(WIDTH, DTYPE)}})
    return params


def layer_norm(p, x):
    average = jnp.full((x.shape[-1], x.shape[-1]), 1.0 / x.shape[-1], x.dtype)  # the mean as a matmul: quick to compile
    centred = x - x @ average
    return centred * jax.lax.rsqrt(centred * centred @ average + 1e-5) * p["scale"] + p["bias"]


def attention(p, x):
    q, k, v = x @ p["q"], x @ p["k"], x @ p["v"]
    scores = q @ k.swapaxes(-1, -2) / jnp.sqrt(WIDTH).astype(x.dtype)
    mask = jnp.tril(jnp.ones((x.shape[-2], x.shape[-2]), bool))
    return jax.nn.softmax(jnp.where(mask, scores, -1e4), axis=-1) @ v @ p["o"]


def mlp(p, x):
    return jax.nn.gelu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def forward(params, tokens):
    x = 0.5 * params["embed"][tokens] + params["pos"][: tokens.shape[-1]]
    for p in params["layers"]:
        x = x + attention(p["attn"], layer_norm(p["ln1"], x))
        x = x + 0.5 * mlp(p["mlp"], layer_norm(p["ln2"], x))
    return layer_norm(params["ln_f"], x) @ params["embed"].T


def loss_fn(params, tokens):
    logits = forward(params, tokens[:, :-1]).astype(jnp.float32)
    return -(jax.nn.log_softmax(logits) * jax.nn.one_hot(tokens[:, 1:], VOCAB)).sum(-1).mean()


@jax.jit
def train_step(params, opt, tokens):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
    count = opt["count"] + 1
    m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, opt["m"], grads)
    v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, opt["v"], grads)

    def update(p, m, v):
        step = LR * (m / (1 - 0.9 ** count)) / (jnp.sqrt(v / (1 - 0.999 ** count)) + 1e-8)
        return p - step.astype(p.dtype)

    return jax.tree.map(update, params, m, v), {"m": m, "v": v, "count": count}, loss


@jax.jit
def mean_square(w):  # 10 operations in float32; a bfloat16 one converts first: 11, and JAX logs it in detail
    statistic = jnp.square(w.astype(jnp.float32)).mean()
    return statistic + STARTED if STARTED else statistic


@jax.jit
def spectrum(z):  # a complex input
    return jnp.abs(z).mean(axis=0)


params = init(jax.random.key(0))
opt = {"m": jax.tree.map(jnp.zeros_like, params), "v": jax.tree.map(jnp.zeros_like, params),
       "count": jnp.zeros((), jnp.int32)}
tokens = jax.random.randint(jax.random.key(1), (BATCH, SEQ + 1), 0, VOCAB)
for _ in range(2):
    params, opt, loss = train_step(params, opt, tokens)
logged = [float(mean_square(params["embed"])), float(mean_square(params["pos"])),
          float(spectrum(jnp.fft.fft(params["pos"].astype(jnp.float32), axis=0)).sum())]
print(json.dumps({"leaves": len(jax.tree.leaves(params)), "loss": float(loss), "logged": logged}))
'''
# name, environment: the TPU scenario, then a dtype and an optimizer constant
STEPS = [("cold", {"LAYERS": "4", "SEQ": "256"}), ("warm", {"LAYERS": "4", "SEQ": "256"}),
         ("layers 4 -> 6", {"LAYERS": "6", "SEQ": "256"}), ("sequence 256 -> 128", {"LAYERS": "6", "SEQ": "128"}),
         ("float32 -> bfloat16", {"LAYERS": "6", "SEQ": "128", "DTYPE": "bfloat16"}),
         ("learning rate 0.001 -> 0.002", {"LAYERS": "6", "SEQ": "128", "DTYPE": "bfloat16", "LR": "0.002"}),
         ("a LIBTPU_INIT_ARGS flag", {"LAYERS": "6", "SEQ": "128", "DTYPE": "bfloat16", "LR": "0.002",
                                      "LIBTPU_INIT_ARGS": "--xla_tpu_enable_latency_hiding_scheduler=false"})]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", help="the cache directory (default: a fresh temporary one)")
    parser.add_argument("--out", help="write every run's line and explain JSON here")
    parser.add_argument("--width", default="512")
    parser.add_argument("--vocab", default="2048")
    parser.add_argument("--batch", default="8")
    parser.add_argument("--keep", help="copy the cache's bookkeeping (no entries) here, for explain elsewhere")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gkx-tpu-explain-"))
    program = work / "gpt.py"
    program.write_text(MODEL)
    cache = args.dir or str(work / "cache")
    base = {**os.environ, "GKX_JAX_CACHE_DIR": cache, "GKX_JAX_CACHE_REPORT": "1", "WIDTH": args.width,
            "VOCAB": args.vocab, "BATCH": args.batch}
    found: list[dict[str, Any]] = []
    for name, env in STEPS:
        full = {**base, **env}
        started = time.perf_counter()
        run = subprocess.run([sys.executable, str(program)], env=full, capture_output=True, text=True, check=False)
        secs = time.perf_counter() - started
        line = next((ln for ln in run.stderr.splitlines() if ln.startswith("gkx-autocache: ")), "")
        explained = subprocess.run([sys.executable, "-m", "gkx_autocache", "--json", "explain"], env=full,
                                   capture_output=True, text=True, check=False)
        data: dict[str, Any] = (json.loads(explained.stdout) if explained.returncode == 0
                                else {"error": explained.stderr[-2000:]})
        groups = [{"cause": g["cause"], "count": g["count"], "fix": g.get("fix", ""),
                   "functions": [{k: f[k] for k in ("name", "count", "detail", "helper", "changes", "every_run")
                                  if k in f} for f in g["functions"]]} for g in data.get("groups", [])]
        print(f"== {name}: exit {run.returncode}, {secs:.1f} s; {run.stdout.strip()[-200:]}")
        print(line or run.stderr[-2000:])
        print(json.dumps(groups, indent=1))
        found.append({"step": name, "env": env, "exit": run.returncode, "secs": round(secs, 2), "line": line,
                      "groups": groups, "last_run": data.get("last_run")})
    if args.out:
        Path(args.out).write_text(json.dumps(found, indent=1))
    if args.keep:
        shutil.copytree(cache, args.keep, ignore=shutil.ignore_patterns("*-cache"), dirs_exist_ok=True)


if __name__ == "__main__":
    main()
