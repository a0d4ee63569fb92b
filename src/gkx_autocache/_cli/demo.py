"""``gkx-autocache demo``: a compile-dominated JAX program, run cold then warm in fresh processes.

The program is what makes GKX's runs compile-bound: dozens of small jitted functions, each
compiled for several shapes, plus a step function driven by ``lax.scan``. Each compile is tens of
milliseconds, under JAX's default 1 s threshold, so JAX's stock settings would cache none of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, TextIO

FUNCTIONS = 24
SHAPES = (8, 16, 32)


def workload(functions: int = FUNCTIONS, shapes: tuple[int, ...] = SHAPES) -> float:
    """Compile and run the program; return a checksum so a wrong result cannot hide."""
    import jax
    import jax.numpy as jnp

    def make(i: int) -> Any:
        def f(x: Any) -> Any:
            for j in range(1 + i % 4):
                x = jnp.tanh(x * (i + 1) + j) @ x.T if j % 2 else jnp.sin(x) + jnp.cos(x * j + i)
            return x.sum(axis=0) * (i + 1)

        f.__name__ = f"demo_fn_{i:02d}"
        return jax.jit(f)

    total = 0.0
    for i in range(functions):
        fn = make(i)
        for n in shapes:
            total += float(fn(jnp.linspace(0.0, 1.0, n * n).reshape(n, n)).sum())

    def step(carry: Any, t: Any) -> Any:
        u, v = carry
        lap = jnp.roll(u, 1) + jnp.roll(u, -1) - 2 * u
        u, v = u + 0.01 * v, v + 0.01 * (lap - jnp.sin(u) * t)
        return (u, v), u.mean()

    @jax.jit
    def integrate(u0: Any) -> Any:
        (u, _), trace = jax.lax.scan(step, (u0, jnp.zeros_like(u0)), jnp.linspace(0.0, 1.0, 200))
        return u.sum() + trace.sum()

    for n in (64, 128):
        total += float(integrate(jnp.linspace(0.0, 1.0, n)))
    return total


def child(functions: int) -> None:
    """Run the workload and print one JSON line: compiles served from the cache, and the checksum."""
    import jax.monitoring

    counts: dict[str, float] = {"requests": 0, "hits": 0, "load_secs": 0.0, "compile_secs": 0.0}

    def listen(event: str, *args: Any, **kwargs: Any) -> None:
        if event == "/jax/compilation_cache/compile_requests_use_cache":
            counts["requests"] += 1
        elif event == "/jax/compilation_cache/cache_hits":
            counts["hits"] += 1

    def durations(event: str, duration_secs: float, **kwargs: Any) -> None:
        if event == "/jax/compilation_cache/cache_retrieval_time_sec":
            counts["load_secs"] += duration_secs
        elif event == "/jax/core/compile/backend_compile_duration":
            counts["compile_secs"] += duration_secs

    jax.monitoring.register_event_listener(listen)
    jax.monitoring.register_event_duration_secs_listener(durations)
    checksum = workload(functions)
    import jax

    directory = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]
    print(json.dumps({**counts, "checksum": checksum, "dir": directory}))


def run_once(env: dict[str, str], functions: int) -> dict[str, Any]:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "gkx_autocache._cli.demo", "--child", str(functions)],
        env=env, capture_output=True, text=True, check=False,
    )
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"the demo program failed:\n{proc.stderr.strip()}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["seconds"] = seconds
    return result


def demo(out: TextIO = sys.stdout, functions: int = FUNCTIONS, as_json: bool = False) -> int:
    """Cold then warm, each in a fresh process over a fresh temporary cache directory."""
    try:
        import importlib.metadata

        jax_version = importlib.metadata.version("jax")
    except Exception:
        print("gkx-autocache demo: JAX is not installed here; pip install 'gkx-autocache[jax]'", file=sys.stderr)
        return 1
    progress = sys.stderr
    with tempfile.TemporaryDirectory(prefix="gkx-autocache-demo-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GKX_JAX_CACHE", "JAX_"))}
        env["GKX_JAX_CACHE_DIR"] = os.path.join(tmp, "cache")
        print(f"gkx-autocache demo: JAX {jax_version}, {functions} small jitted functions x {len(SHAPES)} shapes"
              f" and a scanned step, cache in {tmp}", file=progress)
        print("  cold run (compiling everything)...", end="", file=progress, flush=True)
        cold = run_once(env, functions)
        print(f" {cold['seconds']:.1f} s", file=progress)
        print("  warm run (a fresh process, same program)...", end="", file=progress, flush=True)
        warm = run_once(env, functions)
        print(f" {warm['seconds']:.1f} s", file=progress)
    if abs(cold["checksum"] - warm["checksum"]) > 1e-3 * max(1.0, abs(cold["checksum"])):
        print("gkx-autocache demo: cold and warm results differ", file=sys.stderr)
        return 1
    speedup = cold["seconds"] / warm["seconds"]
    if as_json:
        print(json.dumps({"cold": cold, "warm": warm, "speedup": speedup}), file=out)
        return 0
    print(f"cold  {cold['seconds']:6.2f} s   {cold['hits']:3d} of {cold['requests']} compiles served from the cache", file=out)
    print(f"warm  {warm['seconds']:6.2f} s   {warm['hits']:3d} of {warm['requests']} compiles served from the cache", file=out)
    print(f"speed-up {speedup:.1f}x (warm takes {warm['seconds'] / cold['seconds']:.0%} of cold)", file=out)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(int(sys.argv[2]))
