"""On a TPU (issue 59): a real model and many small functions, each in fresh processes, under every
way of caching, with where a warm run's time goes and what a hit costs to read and load.

    python benchmarks/tpu.py [--out tpu.json] [--layers 4] [--small 24]

Made for the TPU machine the device tool lends (one v5e chip, JAX 0.10.2 with libtpu, Python 3.11,
no network; flax and optax from its own package index), with the package installed from a carried
wheel; it also runs on a CPU (``JAX_PLATFORMS=cpu``, smaller: ``--layers 2 --seq 64``). Programs:

- ``gpt``: a GPT in flax and optax (token and position embeddings, ``--layers`` blocks of causal
  attention and an MLP, AdamW), its init, a jitted train step, an eval step and a greedy decode:
  compiles of real size (entries of megabytes);
- ``small``: the demo's workload, 24 small jitted functions x 3 shapes and a scanned step (84
  compiles of kilobytes).

Modes, each a fresh process: ``off`` (no cache), ``stock`` (JAX's own cache, its default
thresholds), ``raw`` (JAX's own cache, thresholds at zero, no package: JAX's floor), ``package``
(gkx-autocache); the last three cold, then warm. Each child reports its wall time, ``import jax``,
the chip's start (the first ``jax.devices()``), JAX's own duration events (tracing, lowering,
backend compile, cache retrieval), lookups and hits, and a checksum of its results, which must be
the same in every mode. A hit's cost to read and load is the entries' bytes over the warm run's
cache retrieval time (JAX times the read, the decompression and the deserialisation together).
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

CHILD_EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
    "/jax/compilation_cache/cache_retrieval_time_sec": "retrieve",
}


def child(program: str, layers: int, seq: int, small: int) -> None:
    """One run of ``program``: prints one JSON line of timings, counts and a checksum."""
    started = time.perf_counter()
    import jax

    imported = time.perf_counter()
    sums = dict.fromkeys(CHILD_EVENTS.values(), 0.0)
    counts = {"requests": 0, "hits": 0}

    def duration(event: str, duration_secs: float, **kwargs: Any) -> None:
        if event in CHILD_EVENTS:
            sums[CHILD_EVENTS[event]] += duration_secs

    def listen(event: str, *args: Any, **kwargs: Any) -> None:
        if event == "/jax/compilation_cache/compile_requests_use_cache":
            counts["requests"] += 1
        elif event == "/jax/compilation_cache/cache_hits":
            counts["hits"] += 1

    jax.monitoring.register_event_duration_secs_listener(duration)
    jax.monitoring.register_event_listener(listen)
    devices = jax.devices()
    chip = time.perf_counter()
    checksum = gpt(layers, seq) if program == "gpt" else demo(small)
    done = time.perf_counter()
    print(json.dumps({"wall": done - started, "import": imported - started, "chip": chip - imported,
                      "program": done - chip, **{k: round(v, 4) for k, v in sums.items()}, **counts,
                      "checksum": checksum, "device": str(devices[0].device_kind),
                      "dir": jax.config.jax_compilation_cache_dir}))  # type: ignore[attr-defined]


def demo(functions: int) -> str:
    """The demo's workload (``gkx-autocache demo``'s child, its last line a JSON summary)."""
    from gkx_autocache._cli import demo as _demo

    return json.dumps(_demo.workload(functions))


def gpt(layers: int, seq: int, vocab: int = 8192, width: int = 512, heads: int = 8, batch: int = 8) -> str:
    """A GPT in flax and optax: init, two train steps, an eval step, a short greedy decode."""
    import flax.linen as nn  # type: ignore[import-not-found]  # (the TPU machine's own index has them)
    import jax
    import jax.numpy as jnp
    import optax  # type: ignore[import-not-found]

    class Block(nn.Module):  # type: ignore[misc]
        @nn.compact  # type: ignore[untyped-decorator]
        def __call__(self, x: Any) -> Any:
            mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
            x = x + nn.MultiHeadDotProductAttention(num_heads=heads, dtype=jnp.bfloat16)(nn.LayerNorm()(x), mask=mask)
            h = nn.Dense(4 * width, dtype=jnp.bfloat16)(nn.LayerNorm()(x))
            return x + nn.Dense(width, dtype=jnp.bfloat16)(nn.gelu(h))

    class GPT(nn.Module):  # type: ignore[misc]
        @nn.compact  # type: ignore[untyped-decorator]
        def __call__(self, tokens: Any) -> Any:
            x = nn.Embed(vocab, width)(tokens) + nn.Embed(seq, width)(jnp.arange(tokens.shape[1]))
            for _ in range(layers):
                x = Block()(x)
            return nn.Dense(vocab, dtype=jnp.float32)(nn.LayerNorm()(x))

    model = GPT()
    key = jax.random.PRNGKey(0)
    tokens = jax.random.randint(key, (batch, seq), 0, vocab)
    params = jax.jit(model.init)(key, tokens)
    optimizer = optax.adamw(3e-4, weight_decay=0.1)
    state = jax.jit(optimizer.init)(params)

    def loss(p: Any, t: Any) -> Any:
        logits = model.apply(p, t[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, t[:, 1:]).mean()

    @jax.jit
    def train_step(p: Any, s: Any, t: Any) -> Any:
        value, grads = jax.value_and_grad(loss)(p, t)
        updates, s = optimizer.update(grads, s, p)
        return optax.apply_updates(p, updates), s, value

    @jax.jit
    def eval_step(p: Any, t: Any) -> Any:
        return loss(p, t)

    @jax.jit
    def next_token(p: Any, t: Any) -> Any:
        return jnp.argmax(model.apply(p, t)[:, -1], axis=-1)

    losses = []
    for _ in range(2):
        params, state, value = train_step(params, state, tokens)
        losses.append(float(value))
    losses.append(float(eval_step(params, tokens)))
    prompt = tokens[:, : seq // 2]
    for _ in range(2):
        prompt = jnp.concatenate([prompt[:, 1:], next_token(params, prompt)[:, None]], axis=1)
    return json.dumps([round(v, 5) for v in losses] + [int(prompt.sum())])


MODES = {  # mode -> (environment, cached)
    "off": ({"GKX_JAX_CACHE": "0", "JAX_ENABLE_COMPILATION_CACHE": "false"}, False),
    "stock": ({"GKX_JAX_CACHE": "0"}, True),
    "raw": ({"GKX_JAX_CACHE": "0", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
             "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}, True),
    "package": ({"GKX_JAX_CACHE_REPORT": "1"}, True),
}


def run(args: argparse.Namespace, program: str, mode: str, cache: Path, env: dict[str, str]) -> dict[str, Any]:
    extra, cached = MODES[mode]
    full = {**env, **extra}
    if cached and mode != "package":
        full["JAX_COMPILATION_CACHE_DIR"] = str(cache)
    elif mode == "package":
        full["GKX_JAX_CACHE_DIR"] = str(cache)
    command = [sys.executable, __file__, "child", program, "--layers", str(args.layers), "--seq", str(args.seq),
               "--small", str(args.small)]
    proc = subprocess.run(command, env=full, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise SystemExit(f"{program} {mode} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    found["report"] = next((ln for ln in proc.stderr.splitlines() if ln.startswith("gkx-autocache:")), None)
    return found


def entries(cache: Path) -> tuple[int, int]:
    """The count and bytes of the ``-cache`` files below ``cache``."""
    files = [p for p in cache.rglob("*-cache") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", nargs="?", default="driver", choices=("driver", "child"))
    parser.add_argument("program", nargs="?", default="")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--small", type=int, default=24)
    parser.add_argument("--programs", default="gpt,small")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.role == "child":
        child(args.program, args.layers, args.seq, args.small)
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GKX_JAX_CACHE", "JAX_COMPILATION", "JAX_PERSISTENT"))}
    work = Path(tempfile.mkdtemp(prefix="gkx-tpu-"))
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "args": vars(args)}
    for program in args.programs.split(","):
        rows: dict[str, Any] = {}
        for mode in MODES:
            cache = work / f"{program}-{mode}"
            rows[mode] = {"cold": run(args, program, mode, cache, env)}
            if MODES[mode][1]:
                rows[mode]["warm"] = run(args, program, mode, cache, env)
                rows[mode]["entries"] = entries(cache)
        sums = {r[kind]["checksum"] for r in rows.values() for kind in ("cold", "warm") if kind in r}
        for row in rows.values():
            if "warm" in row and row["warm"]["retrieve"] > 0:
                row["read_and_load_mb_s"] = round(row["entries"][1] / 1e6 / row["warm"]["retrieve"], 1)
        results[program] = {"rows": rows, "same_results": len(sums) == 1}
        print(f"\n{program}: results {'identical' if len(sums) == 1 else 'DIFFER: ' + str(sums)} in every mode")
        print(f"{'mode':<8} {'run':<5} {'wall':>7} {'import':>7} {'chip':>6} {'program':>8} {'trace':>6} {'lower':>6} "
              f"{'compile':>8} {'retrieve':>9} {'hits':>9}")
        for mode, row in rows.items():
            for kind in ("cold", "warm"):
                if kind in row:
                    r = row[kind]
                    print(f"{mode:<8} {kind:<5} {r['wall']:>7.2f} {r['import']:>7.2f} {r['chip']:>6.2f} {r['program']:>8.2f} "
                          f"{r['trace']:>6.2f} {r['lower']:>6.2f} {r['compile']:>8.2f} {r['retrieve']:>9.3f} "
                          f"{r['hits']:>4}/{r['requests']:<4}")
            if "entries" in row:
                mb = f", read and load {row['read_and_load_mb_s']} MB/s" if "read_and_load_mb_s" in row else ""
                print(f"         {row['entries'][0]} entries, {row['entries'][1] / 1e6:.1f} MB{mb}")
        package, raw = rows["package"], rows["raw"]
        print(f"warm/cold: stock {rows['stock']['warm']['wall'] / rows['stock']['cold']['wall']:.2f}, "
              f"package {package['warm']['wall'] / package['cold']['wall']:.2f}; package warm / raw warm "
              f"{package['warm']['wall'] / raw['warm']['wall']:.2f} (after the chip's start: "
              f"{package['warm']['program'] / raw['warm']['program']:.2f})")
        for kind in ("cold", "warm"):
            if package[kind]["report"]:
                print(f"  {kind}: {package[kind]['report']}")
    shutil.rmtree(work, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
