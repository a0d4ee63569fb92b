"""Host callbacks on real programs (issue 44): diffrax's own examples, run as their users run them
(equinox's runtime checks on, so every solve has a host callback), cold then warm, in alternated
pairs each with a fresh cache, and with the package off. Two figures a run: the whole process
(``import jax, diffrax`` included: some 2.8 s here that no cache can save) and the program after its
imports (what a cache can act on). Prints a Markdown table.

    python benchmarks/callbacks.py [--pairs N] PYTHON [PYTHON ...]

Each PYTHON is an interpreter with jax, jaxlib, diffrax, equinox and gkx-autocache installed (one
per JAX line). The examples are in benchmarks/examples (diffrax's notebooks, their code cells).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent / "examples"
# Runs an example after its imports, timing that part; prints its output, then the seconds, last.
AFTER_IMPORTS = r"""
import contextlib, io, runpy, sys, time
import jax, diffrax, equinox
start = time.perf_counter()
out = io.StringIO()
with contextlib.redirect_stdout(out):
    runpy.run_path(sys.argv[1], run_name="__main__")
print(out.getvalue().replace(sys.argv[1], "-"), end="")
print(f"{time.perf_counter() - start:.3f}")
"""


def run(python: str, example: Path, env: dict[str, str]) -> tuple[float, float, str, str]:
    """(whole process s, after imports s, stdout without the timing, the report line)."""
    start = time.perf_counter()
    done = subprocess.run([python, "-c", AFTER_IMPORTS, str(example)], capture_output=True, text=True, env=env,
                          check=False)
    whole = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{python} {example.name}: exit {done.returncode}\n{done.stderr[-2000:]}")
    *lines, after = done.stdout.strip().splitlines()
    output = "\n".join(line for line in lines if " seconds" not in line)  # the stiff example times itself
    report = next((line for line in done.stderr.splitlines() if line.startswith("gkx-autocache:")), "")
    return whole, float(after), output, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("pythons", nargs="+")
    args = parser.parse_args()
    print("| JAX | example | cold s (whole / after imports) | warm s | warm/cold (whole / after imports) | off s "
          "| same output | warm report line |")
    print("|---|---|---|---|---|---|---|---|")
    for python in args.pythons:
        version = subprocess.run([python, "-c", "import jax; print(jax.__version__)"], capture_output=True,
                                 text=True, check=True).stdout.strip()
        for example in sorted(EXAMPLES.glob("diffrax_*.py")):
            base = {k: v for k, v in os.environ.items() if not k.startswith(("GKX_", "EQX_", "JAX_"))}
            base.update(GKX_JAX_CACHE_REPORT="1", JAX_PLATFORMS="cpu")
            off = run(python, example, {**base, "GKX_JAX_CACHE": "0"})
            cold, warm = [], []
            for _ in range(args.pairs):
                with tempfile.TemporaryDirectory() as cache:
                    cold.append(run(python, example, {**base, "GKX_JAX_CACHE_DIR": cache}))
                    warm.append(run(python, example, {**base, "GKX_JAX_CACHE_DIR": cache}))
            ratio = [statistics.median(w[0] / c[0] for c, w in zip(cold, warm, strict=True)),
                     statistics.median(w[1] / c[1] for c, w in zip(cold, warm, strict=True))]
            same = all(r[2] == off[2] for r in cold + warm)
            cells = [version, example.stem.removeprefix("diffrax_"),
                     f"{statistics.median(c[0] for c in cold):.2f} / {statistics.median(c[1] for c in cold):.2f}",
                     f"{statistics.median(w[0] for w in warm):.2f} / {statistics.median(w[1] for w in warm):.2f}",
                     f"{ratio[0]:.2f} / {ratio[1]:.2f}", f"{off[0]:.2f} / {off[1]:.2f}", "yes" if same else "NO",
                     f"`{json.dumps(warm[-1][3])[1:-1]}`"]
            print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
