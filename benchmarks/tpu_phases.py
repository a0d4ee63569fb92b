"""Where a rebuild's time goes (issue 69): each phase of ``gkx-autocache rebuild`` timed in its own
process, for each ``--jobs``, on copies of one cold run of the demo's 84 small compiles, rebuilt
after an ``XLA_FLAGS`` change. A phase's sum over its calls, across threads, against the seconds a
compile takes alone and with others (how many ran at once, for how long):

    python benchmarks/tpu_phases.py [--jobs 1 13] [--functions 24]

Made for the TPU v5e the device tool lends (what found that the keying's MLIR contexts and the
compile clock's reads of /proc held the GIL, docs/benchmarks.md); it runs on a CPU too. The package
installed, or ``src`` on ``PYTHONPATH``. Prints one JSON line a ``--jobs``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

COLD = r"""
import sys
import gkx_autocache
gkx_autocache.install()
from gkx_autocache._cli.demo import workload
workload(int(sys.argv[1]))
"""

PHASES = r"""
import json, sys, threading, time
import gkx_autocache
gkx_autocache.install()
from gkx_autocache import _store
from gkx_autocache._jax import rebuild
from gkx_autocache._rebuild import engine

spans, lock, zero = [], threading.Lock(), time.perf_counter()

def timed(cls, name, label):
    inner = getattr(cls, name)
    def call(*args, **kwargs):
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            with lock:
                spans.append((label, started - zero, time.perf_counter() - zero))
    setattr(cls, name, call)

for name in ("parse", "options", "key", "compile", "entry"):
    timed(rebuild.Rebuilder, name, name)
for name in ("has", "lease", "let_go", "rebuilt"):
    timed(_store.Store, name, "store." + name)
timed(engine.Rebuild, "_key", "keying a record")
timed(engine.Rebuild, "_claimed", "a compile's thread, all told")
from gkx_autocache._cli.main import main
try:
    main(["--json", "rebuild", "--from", "this", "--jobs", sys.argv[1]])
except SystemExit:
    pass
phases = {}
for label, a, b in spans:
    n, total, first, last = phases.get(label, (0, 0.0, b, a))
    phases[label] = (n + 1, total + b - a, min(first, a), max(last, b))
edges = sorted([(a, 1) for label, a, b in spans if label == "compile"] + [(b, -1) for label, a, b in spans if label == "compile"])
running, since, at_once = 0, None, {}
for t, step in edges:
    if since is not None:
        at_once[running] = at_once.get(running, 0.0) + t - since
    running, since = running + step, t
print("PHASES " + json.dumps({
    "jobs": int(sys.argv[1]),
    "phases": {k: {"calls": n, "secs": round(s, 3), "from": round(f, 3), "to": round(l, 3)} for k, (n, s, f, l) in phases.items()},
    "compiles at once (secs)": {k: round(v, 3) for k, v in sorted(at_once.items())}}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, len(os.sched_getaffinity(0))])
    parser.add_argument("--functions", type=int, default=24)
    parser.add_argument("--flags", default="--xla_cpu_enable_fast_math=false", help="XLA_FLAGS of the rebuild")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gkx-phases-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GKX_JAX_CACHE", "JAX_COMPILATION", "XLA_FLAGS"))}
    env["GKX_JAX_CACHE_REBUILD_AHEAD"] = "0"
    src = Path(__file__).resolve().parent.parent / "src"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(src), env.get("PYTHONPATH", "")) if p)
    try:
        subprocess.run([sys.executable, "-c", COLD, str(args.functions)], env={**env, "GKX_JAX_CACHE_DIR": str(work / "t")},
                       check=True, capture_output=True)
        for jobs in args.jobs:
            root = work / f"jobs{jobs}"
            shutil.copytree(work / "t", root, symlinks=True)
            proc = subprocess.run([sys.executable, "-c", PHASES, str(jobs)], capture_output=True, text=True, check=True,
                                  env={**env, "GKX_JAX_CACHE_DIR": str(root), "XLA_FLAGS": args.flags})
            summary = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))
            phases = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("PHASES "))[7:])
            print(json.dumps({"rebuilt": summary["rebuilt"], "secs": summary["secs"], **phases}), flush=True)
            shutil.rmtree(root)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
