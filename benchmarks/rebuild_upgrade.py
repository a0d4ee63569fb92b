"""A JAX patch upgrade with ``gkx-autocache rebuild`` (issue 69's first "Done when"): per program,
a cold run under the old JAX (its entries and records), then under the new JAX ``rebuild`` and the
program: its hits, against the share of its modules that lower identically under both JAX versions
(each record's module parsed under the new JAX, its debug information stripped, as JAX's key hashes
it), and its output against a cold run of the new JAX in a directory of its own (bit for bit: the
output's last line, less times).

    python benchmarks/rebuild_upgrade.py --old OLD_PYTHON --new NEW_PYTHON [--programs demo,flax,diffrax,optax]

OLD_PYTHON and NEW_PYTHON: interpreters of two environments with their JAX, and flax, optax,
diffrax, equinox and pytest (a program whose library is missing is skipped); the package's wheel,
built from this tree, is installed into both. Rebuild ahead is off in every run: this measures
``rebuild`` itself. Prints one JSON object a program, then a table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLES = HERE / "examples"

DIGESTS = r"""
import hashlib, io, json, sys
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir, passmanager
from gkx_autocache._rebuild import record
out = {}
for path in sys.argv[1:]:
    try:
        found = record.decode(open(path, "rb").read(), None)
        with mlir.make_ir_context():
            module = ir.Module.parse(found.module)
            passmanager.PassManager.parse("builtin.module(strip-debuginfo)").run(module.operation)
            data = io.BytesIO()
            module.operation.write_bytecode(file=data)
        out[path] = hashlib.sha256(data.getvalue()).hexdigest()
    except Exception as exc:
        out[path] = "unreadable: " + type(exc).__name__
print(json.dumps(out))
"""


def programs(work: Path) -> dict[str, tuple[tuple[str, ...], list[str], Path]]:
    """name -> (modules it needs, its arguments after the interpreter, the folder it runs in)."""
    ini = work / "pytest.ini"
    ini.write_text("[pytest]\n")
    return {
        "demo": ((), ["-m", "gkx_autocache._cli.demo", "--child", "24"], work),
        "flax": (("flax", "optax"), [str(EXAMPLES / "flax_lm1b" / "run.py")], EXAMPLES / "flax_lm1b"),
        "diffrax": (("diffrax", "equinox"), [str(EXAMPLES / "diffrax_stiff_ode.py")], work),
        "optax": (("optax", "pytest"), ["-m", "pytest", "-c", str(ini), "--rootdir", str(work), "-q", "-p",
                                        "no:cacheprovider", "--pyargs", "optax._src.transform_test",
                                        "optax._src.combine_test", "optax._src.update_test"], work),
    }


def has(python: str, modules: tuple[str, ...]) -> bool:
    code = "import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))"
    return subprocess.run([python, "-c", code, *modules], check=False).returncode == 0


def env_for(root: Path, work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GKX_JAX_CACHE", "JAX_", "PYTHON", "XLA_"))}
    env.update(JAX_PLATFORMS="cpu", HOME=str(work), GKX_JAX_CACHE_DIR=str(root), GKX_JAX_CACHE_REBUILD_AHEAD="0",
               GKX_JAX_CACHE_REPORT="1")
    return env


def run(python: str, args: list[str], env: dict[str, str], cwd: Path) -> tuple[str, dict[str, int], float]:
    """The output's last line (less times and counts), the directory's hits and misses since (its
    ``stats``: the runs before this one had none), the wall seconds."""
    started = time.perf_counter()
    proc = subprocess.run([python, *args], env=env, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{args}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
    last = re.sub(r"\bin [\d.]+s\b", "", lines[-1]) if lines else ""
    last = re.sub(r'"(requests|hits|load_secs|compile_secs|dir)": [^,}]+,? ?', "", last)
    stats = subprocess.run([python, "-m", "gkx_autocache", "--json", "stats"], env=env, capture_output=True, text=True,
                           check=True)
    totals = json.loads(stats.stdout)["stats"] or {}
    return last, {"hits": totals.get("hits", 0), "misses": totals.get("misses", 0)}, wall


def digests(python: str, vdir: Path, env: dict[str, str]) -> list[str]:
    paths = sorted(str(p) for p in vdir.glob("*-gkx-record"))
    if not paths:
        return []
    proc = subprocess.run([python, "-c", DIGESTS, *paths], env=env, capture_output=True, text=True, check=True)
    return list(json.loads(proc.stdout.strip().splitlines()[-1]).values())


def install(python: str, work: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(work / "wheel"), str(ROOT)], check=True)
    (wheel,) = (work / "wheel").glob("*.whl")
    subprocess.run([sys.executable, "-m", "uv", "pip", "install", "-q", "--no-deps", "--reinstall", "--python",
                    python, str(wheel)], check=True)


def version_of(python: str) -> str:
    return subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('jax'))"],
                          capture_output=True, text=True, check=True).stdout.strip()


def measure(name: str, program: tuple[tuple[str, ...], list[str], Path], old: str, new: str, work: Path) -> dict[str, Any]:
    _, args, cwd = program
    upgraded, fresh = work / f"{name}-upgraded", work / f"{name}-fresh"
    old_version, new_version = version_of(old), version_of(new)
    run(old, args, env_for(upgraded, work), cwd)
    started = time.perf_counter()
    rebuilt = subprocess.run([new, "-m", "gkx_autocache", "--json", "rebuild"], env=env_for(upgraded, work),
                             capture_output=True, text=True, check=True)
    rebuild_wall = time.perf_counter() - started
    summary = json.loads(rebuilt.stdout)
    after, counts, after_wall = run(new, args, env_for(upgraded, work), cwd)
    cold, cold_counts, cold_wall = run(new, args, env_for(fresh, work), cwd)
    old_digests = set(digests(new, upgraded / f"jax-{old_version}", env_for(upgraded, work)))
    new_digests = digests(new, fresh / f"jax-{new_version}", env_for(fresh, work))
    same = sum(1 for d in new_digests if d in old_digests)
    lookups = counts["hits"] + counts["misses"]
    return {"program": name, "old": old_version, "new": new_version, "records": summary["records"],
            "rebuilt": summary["rebuilt"], "failed": summary["failed"], "refused": summary["refused"],
            "rebuild_secs": round(rebuild_wall, 2), "hits": counts["hits"], "lookups": lookups,
            "hit_share": round(counts["hits"] / lookups, 3) if lookups else None,
            "modules": len(new_digests), "same_modules": same,
            "same_share": round(same / len(new_digests), 3) if new_digests else None,
            "bit_identical": after == cold, "output": after[:160], "cold_output": cold[:160],
            "after_rebuild_secs": round(after_wall, 2), "cold_secs": round(cold_wall, 2),
            "cold_lookups": cold_counts["hits"] + cold_counts["misses"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", required=True)
    parser.add_argument("--programs", default="demo,flax,diffrax,optax")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="gkx-upgrade-"))
    rows = []
    try:
        install(args.old, work)
        install(args.new, work)
        found = programs(work)
        for name in args.programs.split(","):
            program = found[name]
            if not (has(args.old, program[0]) and has(args.new, program[0])):
                print(f"{name}: skipped, {', '.join(program[0])} not installed in both", flush=True)
                continue
            row = measure(name, program, args.old, args.new, work)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("| program | JAX | modules lowering the same | hits after rebuild | rebuilt (failed) | bit-identical |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        failed = sum(r["failed"].values())
        print(f"| {r['program']} | {r['old']} -> {r['new']} | {r['same_modules']} of {r['modules']} ({r['same_share']}) | "
              f"{r['hits']} of {r['lookups']} ({r['hit_share']}) | {r['rebuilt']} ({failed}) | {r['bit_identical']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
