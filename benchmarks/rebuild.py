"""Rebuild ahead on this machine (SPEC §18, issue 69's "Done when"), as alternated pairs of fresh
processes on copies of one cache directory, with the package from a wheel of this tree:

  flags   a cold start after an XLA_FLAGS change, with rebuild ahead, against today's (the same
          start with ahead off: the records are there, unused), and a warm run after it; on the
          demo's program (24 functions x 3 shapes and a scanned step: many small compiles)
  code    a run whose code changed (every function's constant), ahead on against off (no ahead
          starts: the context is the same); and the worst case, the code and the flags changed
          together (ahead compiles the old modules, of which only JAX's helpers are hit)
  jobs    ``gkx-autocache rebuild`` of the same records after the flags change, --jobs 2 against
          --jobs 1 (the rebuild's own seconds, from its --json)
  warm    a warm run with records kept against raw JAX at threshold 0 (benchmarks/run.py's
          ``warm_vs_raw``: bytecode present and absent)
  own     the package's own time in a warm run (benchmarks/run.py's ``own_time``), this tree against
          ``--rev`` (default: the commit issue 69 began from): what the records' seam and modules add
  size    what the records cost on disk, against the entries

    python benchmarks/rebuild.py [--pairs 7] [--only flags ...] [--flags "--xla_cpu_enable_fast_math=false"] [--rev REV]

Prints each figure with its medians and spread. Needs uv and JAX in the running environment.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("flags", "code", "jobs", "warm", "own", "size")
FLAGS = "--xla_cpu_enable_fast_math=false"


def load_run() -> Any:
    spec = importlib.util.spec_from_file_location("benchmark_run", ROOT / "benchmarks" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def changed_program(work: Path) -> Path:
    """The demo's program with every function's constant changed: a code change."""
    script = work / "demo_changed.py"
    text = (ROOT / "src" / "gkx_autocache" / "_cli" / "demo.py").read_text()
    changed = text.replace("jnp.tanh(x * (i + 1) + j)", "jnp.tanh(x * (i + 1.5) + j)")
    assert changed != text
    script.write_text(changed)
    return script


class Bench:
    def __init__(self, run: Any, with_py: Path, work: Path, flags: str) -> None:
        self.run_module = run
        self.python = with_py
        self.work = work
        self.flags = flags
        self.demo = run.demo_program(work, 24)
        self.changed = [str(changed_program(work)), "--child", "24"]
        self.template = work / "template"
        self._n = 0

    def env(self, root: Path, ahead: bool = True, flags: str = "", **extra: str) -> dict[str, str]:
        env: dict[str, str] = self.run_module.base_env(HOME=str(self.work), GKX_JAX_CACHE_DIR=str(root),
                                                       GKX_JAX_CACHE_REBUILD_AHEAD="1" if ahead else "0", **extra)
        if flags:
            env["XLA_FLAGS"] = flags
        return env

    def child(self, code: list[str], env: dict[str, str]) -> dict[str, Any]:
        """One run: its JSON line, its wall seconds and its CPU seconds (the process's, from outside)."""
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.run([str(self.python), *code], env=env, capture_output=True, text=True, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        out["seconds"] = time.perf_counter() - started
        out["cpu"] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        return out

    def fresh(self) -> Path:
        """A copy of the template directory (a cold run's entries and records, under no flags)."""
        self._n += 1
        root = self.work / f"c{self._n}"
        shutil.copytree(self.template, root, symlinks=True)
        return root

    def make_template(self) -> dict[str, Any]:
        return self.child(self.demo, self.env(self.template, ahead=False))


def pairs_of(a: list[float], b: list[float]) -> dict[str, Any]:
    ratios = sorted(x / y for x, y in zip(a, b, strict=True))
    return {"a": statistics.median(a), "b": statistics.median(b), "ratio": statistics.median(a) / statistics.median(b),
            "min": ratios[0], "max": ratios[-1], "pairs": len(a)}


def flags_section(bench: Bench, pairs: int) -> dict[str, Any]:
    today: list[float] = []
    ahead: list[float] = []
    warm: list[float] = []
    hits: list[float] = []
    for i in range(pairs):
        order = [False, True] if i % 2 == 0 else [True, False]
        for on in order:
            root = bench.fresh()
            out = bench.child(bench.demo, bench.env(root, ahead=on, flags=bench.flags))
            (ahead if on else today).append(out["seconds"])
            if on:
                hits.append(out["hits"] / out["requests"])
                warm.append(bench.child(bench.demo, bench.env(root, flags=bench.flags))["seconds"])
            shutil.rmtree(root)
    return {"ahead / today": pairs_of(ahead, today), "ahead / warm": pairs_of(ahead, warm),
            "today": statistics.median(today), "warm": statistics.median(warm), "hit share": statistics.median(hits)}


def code_section(bench: Bench, pairs: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, flags in (("code changed", ""), ("code and flags changed", bench.flags)):
        on: list[float] = []
        off: list[float] = []
        on_cpu: list[float] = []
        off_cpu: list[float] = []
        for i in range(pairs):
            for ahead in ([False, True] if i % 2 == 0 else [True, False]):
                root = bench.fresh()
                ran = bench.child(bench.changed, bench.env(root, ahead=ahead, flags=flags))
                (on if ahead else off).append(ran["seconds"])
                (on_cpu if ahead else off_cpu).append(ran["cpu"])
                shutil.rmtree(root)
        out[name] = {"wall": pairs_of(on, off), "cpu": pairs_of(on_cpu, off_cpu)}
    return out


def jobs_section(bench: Bench, pairs: int) -> dict[str, Any]:
    secs: dict[int, list[float]] = {1: [], 2: []}
    walls: dict[int, list[float]] = {1: [], 2: []}
    for i in range(pairs):
        for jobs in ((1, 2) if i % 2 == 0 else (2, 1)):
            root = bench.fresh()
            started = time.perf_counter()
            proc = subprocess.run([str(bench.python), "-m", "gkx_autocache", "--json", "rebuild", "--from", "this",
                                   "--jobs", str(jobs)], env=bench.env(root, flags=bench.flags),
                                  capture_output=True, text=True, check=True)
            walls[jobs].append(time.perf_counter() - started)
            data = json.loads(proc.stdout)
            assert data["rebuilt"] > 0 and not data["failed"], data
            secs[jobs].append(data["secs"])
            shutil.rmtree(root)
    return {"jobs 1 / jobs 2 (rebuild's own seconds)": pairs_of(secs[1], secs[2]),
            "jobs 1 / jobs 2 (the command, from outside)": pairs_of(walls[1], walls[2])}


def own_section(bench: Bench, rev: str, runs: int) -> dict[str, Any]:
    """``own_time`` of this tree's package and of ``rev``'s, each in a venv like run.py's."""
    run, work = bench.run_module, bench.work
    tree = work / "rev-tree"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    wheel = run.build_wheel(work / "rev-wheel", source=tree)
    venv = work / "rev-venv"
    run.sh(sys.executable, "-m", "uv", "venv", "-q", "--python", sys.executable, str(venv))
    python = venv / "bin" / "python"
    site = run.sh(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    Path(site, "zz_bench_deps.pth").write_text(f"{work / 'deps'}\n")
    run.sh(sys.executable, "-m", "uv", "pip", "install", "-q", "--no-deps", "--python", str(python), str(wheel))
    for name in ("own-this", "own-rev"):
        (work / name).mkdir()
    return {"this tree": run.own_time(bench.python, 24, runs, work / "own-this"), rev: run.own_time(python, 24, runs,
                                                                                                   work / "own-rev")}


def size_section(bench: Bench) -> dict[str, Any]:
    vdir = next(p for p in bench.template.iterdir() if p.name.startswith("jax-"))
    entries = sum(p.stat().st_size for p in vdir.glob("*-cache"))
    records = sum(p.stat().st_size for p in vdir.glob("*-gkx-record"))
    return {"entries": len(list(vdir.glob("*-cache"))), "records": len(list(vdir.glob("*-gkx-record"))),
            "entry bytes": entries, "record bytes": records, "records / entries": records / entries}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--only", action="append", choices=SECTIONS)
    parser.add_argument("--flags", default=FLAGS, help="the XLA_FLAGS of the changed start")
    parser.add_argument("--rev", default="10855d5", help="the tree the own section compares with")
    args = parser.parse_args(argv)
    run = load_run()
    results: dict[str, Any] = {}
    with run.work_folder() as work:
        with_py, without_py = run.make_venvs(work)
        bench = Bench(run, with_py, work, args.flags)
        results["template"] = {k: v for k, v in bench.make_template().items() if k != "dir"}
        for section in args.only or SECTIONS:
            if section == "flags":
                results["flags"] = flags_section(bench, args.pairs)
            elif section == "code":
                results["code"] = code_section(bench, args.pairs)
            elif section == "jobs":
                results["jobs"] = jobs_section(bench, args.pairs)
            elif section == "warm":
                results["warm"] = run.warm_vs_raw(with_py, without_py, 24, args.pairs, work)
            elif section == "own":
                results["own"] = own_section(bench, args.rev, args.pairs)
            elif section == "size":
                results["size"] = size_section(bench)
            print(json.dumps({section: results.get(section)}, indent=1), flush=True)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
