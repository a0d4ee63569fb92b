"""A mixed CPU pair sharing one warm cache (SPEC §15, ``cpu_target``): figures for the README's CI
section.

    sudo python benchmarks/cpu_target.py [--runs 3] [--target x86-64-v3]

Host A is this machine; host B is this machine with its AVX-512 flags taken out of
``/proc/cpuinfo`` (a bind mount in a private mount namespace, as SPEC §12 says: root, Linux), which
is what the package reads to key CPU entries. A runs the demo's workload cold into a fresh
directory; then B runs it in fresh processes against A's warm directory, with the target and
without (``host``, the default). Prints B's wall time and hits, medians of ``--runs``, and B's
own cold run for reference. Run it with the Python of an environment that has the package and JAX.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = "from gkx_autocache._cli import demo; demo.child(24)"


def run(cpuinfo: Path | None, env: dict[str, str]) -> tuple[float, dict[str, float]]:
    """The workload in a fresh process (on the fake CPU where ``cpuinfo`` is given): wall seconds, its JSON."""
    command = [sys.executable, "-c", CHILD]
    if cpuinfo is not None:
        command = ["unshare", "-m", "sh", "-c",
                   f"mount --bind {shlex.quote(str(cpuinfo))} /proc/cpuinfo && exec {shlex.join(command)}"]
    started = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - started, json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--target", default="x86-64-v3")
    args = parser.parse_args()
    import os

    real = Path("/proc/cpuinfo").read_text()
    flags = set(re.search(r"^flags\s*:(.*)$", real, re.M)[1].split())  # type: ignore[index]
    avx512 = {f for f in flags if f.startswith("avx512")}
    if not avx512:
        sys.exit("this host has no AVX-512 flags to take away: it cannot play both hosts")
    work = Path(tempfile.mkdtemp(prefix="gkx-cpu-target-"))
    fake = work / "cpuinfo"
    fake.write_text(re.sub(r"^(flags\s*:)(.*)$", lambda m: m[1] + " ".join(f for f in m[2].split() if f not in avx512),
                           real, flags=re.M))
    rows = []
    for target in (args.target, "host"):
        walls, hits, requests = [], [], []
        for i in range(args.runs):
            env = {**os.environ, "GKX_JAX_CACHE_DIR": str(work / f"{target}-{i}"), "GKX_JAX_CACHE_CPU_TARGET": target}
            run(None, env)  # host A, cold: writes the cache
            wall, found = run(fake, env)  # host B, against A's warm cache
            walls.append(wall)
            hits.append(found["hits"])
            requests.append(found["requests"])
        rows.append((target, statistics.median(walls), statistics.median(hits), statistics.median(requests)))
    cold = statistics.median(run(fake, {**os.environ, "GKX_JAX_CACHE_DIR": str(work / f"cold-{i}")})[0]
                             for i in range(args.runs))
    print(f"demo workload, host B (no AVX-512) after host A (AVX-512) wrote the cache; median of {args.runs}")
    print("| cpu_target | B's wall | B's hits |")
    print("|---|---|---|")
    for target, wall, hit, asked in rows:
        print(f"| {target} | {wall:.2f} s | {hit:.0f} of {asked:.0f} |")
    print(f"| (B cold, no cache of A's) | {cold:.2f} s | 0 |")


if __name__ == "__main__":
    main()
