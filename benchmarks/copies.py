"""N copies of one program started together on a cold cache (issue 69, "once per key across
processes on one host"): each copy's wall and CPU, the compile CPU of all, and the duplicate
compile CPU (a key compiled by more than one copy: every compile of it but the first to start) as
a share of the run's CPU; before (``--rev``, e.g. main) and after (the working tree).

    python benchmarks/copies.py --base .venv-flax/bin/python --rev main --copies 2 4 --programs flax demo

``--base``: an interpreter whose environment has JAX (and flax and optax for ``flax``); two
environments are made over it, identical but for the package (``--rev``'s tree, the working
tree's), installed from their wheels. Each copy imports JAX and the program's libraries, then
waits for the others (a barrier: the race is real, not timed); JAX's ``_compile_and_write_cache``
is timed in each (the process's CPU around it, with its key), from outside the package, so that
both trees are measured the same way. Rounds alternate the two trees.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "benchmarks" / "examples"

# name -> (libraries imported before the barrier, kind, target)
PROGRAMS = {
    "flax": ("flax,optax,flax.linen", "path", str(EXAMPLES / "flax_lm1b" / "run.py")),
    "demo": ("", "code", "from gkx_autocache._cli.demo import workload\nprint(workload())\n"),
}

BOOT = r"""
import json, os, runpy, sys, time
out, barrier, preimports, kind, target = sys.argv[1:6]
import jax
from jax._src import compiler
for name in filter(None, preimports.split(",")):
    __import__(name)
compiles = []
original = compiler._compile_and_write_cache
def timed(*args, **kwargs):
    key = args[6] if len(args) > 6 else kwargs.get("cache_key")
    cpu, wall = time.process_time(), time.time()
    try:
        return original(*args, **kwargs)
    finally:
        compiles.append([key, time.process_time() - cpu, wall, time.time()])
compiler._compile_and_write_cache = timed
open(os.path.join(barrier, f"ready-{os.getpid()}"), "w").close()
while not os.path.exists(os.path.join(barrier, "go")):
    time.sleep(0.005)
started = time.time()
if kind == "path":
    sys.argv = [target]
    runpy.run_path(target, run_name="__main__")
else:
    exec(compile(target, "<program>", "exec"), {"__name__": "__main__"})
with open(out, "w") as f:
    json.dump({"compiles": compiles, "started": started, "ended": time.time()}, f)
"""


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def environment(work: Path, name: str, base: str, source: Path) -> str:
    """A venv over ``base``'s packages, with the package built from ``source``; its interpreter."""
    venv = work / name
    sh(sys.executable, "-m", "uv", "venv", "-q", "--python", base, str(venv))
    python = str(venv / "bin" / "python")
    site = sh(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    base_site = sh(base, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip()
    Path(site, "zz_bench_deps.pth").write_text(f"{base_site}\n")
    wheels = work / f"wheel-{name}"
    sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(source))
    (wheel,) = wheels.glob("*.whl")
    sh(sys.executable, "-m", "uv", "pip", "install", "-q", "--no-deps", "--compile-bytecode", "--python", python, str(wheel))
    return python


def tree(work: Path, rev: str) -> Path:
    """``rev``'s tree, as ``git archive`` gives it."""
    out = work / f"tree-{rev}"
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


def copies(python: str, program: str, n: int, work: Path) -> dict[str, Any]:
    """``n`` copies of ``program`` released together on a cold cache: per copy wall and CPU (from
    outside), and the compiles each timed (key, CPU, start, end)."""
    preimports, kind, target = PROGRAMS[program]
    run = work / f"run-{time.monotonic_ns()}"
    barrier = run / "barrier"
    barrier.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GKX_JAX_CACHE", "JAX_", "PYTHON", "XLA_"))}
    env.update(JAX_PLATFORMS="cpu", GKX_JAX_CACHE_DIR=str(run / "cache"), PYTHONDONTWRITEBYTECODE="1")
    errs = [run / f"err{i}" for i in range(n)]  # (a file, not a pipe: a copy that says much never blocks)
    procs = []
    for i in range(n):
        with errs[i].open("w") as err:
            procs.append(subprocess.Popen([python, "-c", BOOT, str(run / f"copy{i}.json"), str(barrier), preimports, kind,
                                           target], env=env, cwd=str(run), stdout=subprocess.DEVNULL, stderr=err))
    while len(list(barrier.glob("ready-*"))) < n:
        if any(p.poll() is not None for p in procs):
            raise SystemExit(f"a copy ended before the barrier: {errs[0].read_text()[-2000:]}")
        time.sleep(0.01)
    (barrier / "go").touch()
    go = time.time()
    results = []
    for i, proc in enumerate(procs):
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"copy {i} exit {proc.returncode}: {errs[i].read_text()[-3000:]}")
        inside = json.loads((run / f"copy{i}.json").read_text())
        results.append({"cpu": usage.ru_utime + usage.ru_stime, "wall": inside["ended"] - go,
                        "compiles": inside["compiles"]})
    return tally(results)


def tally(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The compile CPU of all copies, and the duplicates': each compile of a key but the first to start."""
    by_key: dict[str, list[tuple[float, float, float]]] = {}
    for copy in results:
        for key, cpu, start, end in copy["compiles"]:
            by_key.setdefault(key, []).append((start, end, cpu))
    duplicate = overlapping = 0.0
    duplicates = 0
    for runs in by_key.values():
        runs.sort()
        first_end = runs[0][1]
        for start, _, cpu in runs[1:]:
            duplicate += cpu
            duplicates += 1
            overlapping += start < first_end
    total_cpu = sum(c["cpu"] for c in results)
    return {"walls": [c["wall"] for c in results], "cpus": [c["cpu"] for c in results], "cpu": total_cpu,
            "compile": sum(cpu for runs in by_key.values() for _, _, cpu in runs), "keys": len(by_key),
            "duplicate": duplicate, "duplicates": duplicates, "early": overlapping / duplicates if duplicates else 0.0}


def row(label: str, rounds: list[dict[str, Any]]) -> str:
    def med(name: str) -> float:
        return float(statistics.median(r[name] for r in rounds))

    walls = statistics.median(max(r["walls"]) for r in rounds)
    share = statistics.median(r["duplicate"] / r["cpu"] for r in rounds)
    spread = ", ".join(f"{r['duplicate'] / r['cpu']:.1%}" for r in rounds)
    per_copy = " ".join(f"{w:.1f}/{c:.1f}" for w, c in zip(rounds[0]["walls"], rounds[0]["cpus"], strict=True))
    return (f"| {label} | {per_copy} | {walls:.1f} | {med('cpu'):.1f} | {med('compile'):.1f} | {med('duplicate'):.2f} "
            f"({med('duplicates'):.0f} of {med('keys'):.0f} keys) | {share:.1%} ({spread}) |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="an interpreter whose environment has JAX (flax, optax)")
    parser.add_argument("--rev", default="main", help="the tree to compare the working tree with")
    parser.add_argument("--copies", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--programs", nargs="+", choices=sorted(PROGRAMS), default=["flax", "demo"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="the raw results, as JSON")
    args = parser.parse_args(argv)
    raw: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="gkx-copies-") as tmp:
        work = Path(tmp)
        pythons = {args.rev: environment(work, "before", args.base, tree(work, args.rev)),
                   "working tree": environment(work, "after", args.base, ROOT)}
        print("| tree, program, copies | each copy: wall/CPU s (first round) | slowest copy s | CPU s | compile CPU s "
              "| duplicate compile CPU s | duplicate share of the run's CPU (each round) |")
        print("|---|---|---|---|---|---|---|")
        for program in args.programs:
            for n in args.copies:
                for _ in range(args.rounds):
                    for label, python in pythons.items():
                        raw.setdefault(f"{label}, {program}, {n}", []).append(copies(python, program, n, work))
                for label in pythons:
                    name = f"{label}, {program}, {n}"
                    print(row(name, raw[name]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
