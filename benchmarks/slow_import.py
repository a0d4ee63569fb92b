"""`import jax` in an environment made by the README's first command, against the same with
ml_dtypes 0.7 (issue 71: 0.7 registers its loops in quadratic time under a NumPy before 2.5).

    python benchmarks/slow_import.py [--runs 9] [--python python3.11]

Makes two virtual environments from this checkout in a temporary folder, as the README says
(`python -m venv V && V/bin/pip install '.[jax]'`: pip writes bytecode), the second without the
extra, with `jax 'ml_dtypes>=0.7'`; then times `import jax` in fresh processes of each, interleaved: its CPU
time inside the process (getrusage around the import) and the whole process's from outside (wait4).
Prints the versions each resolved and the medians with their range, and the ratio.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = ("import resource as r; u = r.getrusage(r.RUSAGE_SELF); import jax; v = r.getrusage(r.RUSAGE_SELF); "
        "print(v.ru_utime - u.ru_utime + v.ru_stime - u.ru_stime)")
VERSIONS = "import importlib.metadata as m; print(*(m.version(p) for p in ('jax', 'ml_dtypes', 'numpy')))"


def make(python: str, folder: Path, *packages: str) -> Path:
    subprocess.run([python, "-m", "venv", str(folder)], check=True)
    subprocess.run([str(folder / "bin" / "pip"), "install", "-q", *packages], check=True)
    return folder / "bin" / "python"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GKX_", "JAX_", "PYTHON"))}
    env["JAX_PLATFORMS"] = "cpu"
    work = Path(tempfile.mkdtemp(prefix="gkx-slow-import-"))
    try:
        # (the second without the extra, which holds ml_dtypes below 0.7 on Python 3.11)
        pythons = {"README's install": make(args.python, work / "readme", f"{ROOT}[jax]"),
                   "with ml_dtypes>=0.7": make(args.python, work / "slow", str(ROOT), "jax", "ml_dtypes>=0.7")}
        inside: dict[str, list[float]] = {name: [] for name in pythons}
        outside: dict[str, list[float]] = {name: [] for name in pythons}
        for _ in range(args.runs):
            for name, python in pythons.items():
                proc = subprocess.Popen([str(python), "-c", CODE], stdout=subprocess.PIPE, env=env, cwd=str(work))
                assert proc.stdout is not None
                out = proc.stdout.read()
                proc.stdout.close()
                _, status, usage = os.wait4(proc.pid, 0)  # (its own CPU time, which Popen.wait does not give)
                proc.returncode = os.waitstatus_to_exitcode(status)
                assert proc.returncode == 0, name
                inside[name].append(float(out))
                outside[name].append(usage.ru_utime + usage.ru_stime)
        for name, python in pythons.items():
            versions = subprocess.run([str(python), "-c", VERSIONS], capture_output=True, text=True, env=env).stdout.split()
            print(f"{name}: jax {versions[0]}, ml_dtypes {versions[1]}, numpy {versions[2]}; import jax "
                  f"{statistics.median(inside[name]):.3f} s of CPU ({min(inside[name]):.3f}-{max(inside[name]):.3f}), "
                  f"the whole process {statistics.median(outside[name]):.3f} s, median of {args.runs}")
        held, slow = (statistics.median(inside[name]) for name in pythons)
        print(f"ratio: {slow / held:.2f} (ml_dtypes 0.7 against the README's install)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
