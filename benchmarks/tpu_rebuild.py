"""Rebuild ahead on a TPU (issue 69): the demo's many small compiles (24 functions x 3 shapes and a
scanned step), each run a fresh process holding the chip, on copies of one cold run's directory:

- ``today``: a cold start after an ``XLA_FLAGS`` (or ``LIBTPU_INIT_ARGS``) change, rebuild ahead off;
- ``ahead``: the same start with rebuild ahead on (the records compiled in the process's threads
  while the program traces, the program's lookups waiting for them);
- ``warm``: the run after it (all hits);
- ``rebuild --jobs N`` against ``--jobs 1`` of the same records under the new flags (the rebuild's
  own seconds).

    python benchmarks/tpu_rebuild.py [--pairs 3] [--jobs 12] [--var XLA_FLAGS] [--flags "..."]

Made for the one-chip TPU v5e the device tool lends (13 cores, no network), with the package
installed (or ``src`` on ``PYTHONPATH``: each child installs the import hook itself); it runs on a
CPU too (``JAX_PLATFORMS=cpu``, ``--jobs`` the cores). Prints the figures as JSON: the bounds are
ahead / warm at most 1.25 and jobs N / jobs 1 at least 4 x on the TPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CHILD = r"""
import json, sys, time
started = time.perf_counter()
import gkx_autocache
gkx_autocache.install()  # (where the .pth is not installed: the hook, as the .start file puts it)
import jax
counts = {"requests": 0, "hits": 0}
def listen(event, *a, **k):
    if event == "/jax/compilation_cache/compile_requests_use_cache": counts["requests"] += 1
    elif event == "/jax/compilation_cache/cache_hits": counts["hits"] += 1
jax.monitoring.register_event_listener(listen)
from gkx_autocache._cli.demo import workload
checksum = workload(int(sys.argv[1]))
print(json.dumps({**counts, "checksum": checksum, "seconds": time.perf_counter() - started,
                  "platform": jax.devices()[0].platform}))
"""

REBUILD = r"""
import sys
import gkx_autocache
gkx_autocache.install()
from gkx_autocache._cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def run(code: str, args: list[str], env: dict[str, str]) -> tuple[dict[str, Any], float]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"exit {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


def ratio(a: list[float], b: list[float]) -> dict[str, float]:
    ratios = sorted(x / y for x, y in zip(a, b, strict=True))
    return {"ratio": statistics.median(a) / statistics.median(b), "min": ratios[0], "max": ratios[-1],
            "a": statistics.median(a), "b": statistics.median(b)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--functions", type=int, default=24)
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--var", default="XLA_FLAGS", help="the variable changed (XLA_FLAGS or LIBTPU_INIT_ARGS)")
    parser.add_argument("--flags", default="--xla_cpu_enable_fast_math=false", help="its value in the changed start")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gkx-tpu-rebuild-"))
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GKX_JAX_CACHE", "JAX_COMPILATION"))}
    here = Path(__file__).resolve().parent.parent / "src"
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(here), base.get("PYTHONPATH", "")) if p)
    base.pop(args.var, None)

    def env(root: Path, ahead: bool, changed: bool) -> dict[str, str]:
        e = {**base, "GKX_JAX_CACHE_DIR": str(root), "GKX_JAX_CACHE_REBUILD_AHEAD": "1" if ahead else "0"}
        if changed:
            e[args.var] = args.flags
        return e

    template = work / "template"
    n = [0]

    def fresh() -> Path:
        n[0] += 1
        root = work / f"c{n[0]}"
        shutil.copytree(template, root, symlinks=True)
        return root

    try:
        cold, _ = run(CHILD, [str(args.functions)], env(template, False, False))
        results: dict[str, Any] = {"cold": cold, "jobs": args.jobs, "var": args.var, "flags": args.flags}
        today: list[float] = []
        ahead: list[float] = []
        warm: list[float] = []
        served: list[str] = []
        for i in range(args.pairs):
            for on in ((False, True) if i % 2 == 0 else (True, False)):
                root = fresh()
                out, _ = run(CHILD, [str(args.functions)], env(root, on, True))
                assert abs(out["checksum"] - cold["checksum"]) <= 1e-6 * max(1.0, abs(cold["checksum"])), out
                if on:
                    ahead.append(out["seconds"])
                    served.append(f"{out['hits']} of {out['requests']}")
                    again, _ = run(CHILD, [str(args.functions)], env(root, True, True))
                    warm.append(again["seconds"])
                else:
                    today.append(out["seconds"])
                shutil.rmtree(root)
        results.update({"ahead / warm": ratio(ahead, warm), "ahead / today": ratio(ahead, today),
                        "today / warm": ratio(today, warm), "served ahead": served})
        print(json.dumps(results, indent=1), flush=True)
        secs: dict[int, list[float]] = {1: [], args.jobs: []}
        for i in range(args.pairs):
            for jobs in ((1, args.jobs) if i % 2 == 0 else (args.jobs, 1)):
                root = fresh()
                out, _ = run(REBUILD, ["--json", "rebuild", "--from", "this", "--jobs", str(jobs)], env(root, False, True))
                assert out["rebuilt"] > 0 and not out["failed"], out
                secs[jobs].append(out["secs"])
                shutil.rmtree(root)
        results[f"rebuild jobs 1 / jobs {args.jobs}"] = ratio(secs[1], secs[args.jobs])
        print(json.dumps(results, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
