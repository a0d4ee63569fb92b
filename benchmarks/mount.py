"""A bucket mounted as ``dir`` (issue 47 part 2): a real program nobody here wrote (diffrax's heat PDE
example) cold, then warm, in a local directory and on the two FUSE semantics of ``tests/bucketfs.py``
(Mountpoint for S3's, Cloud Storage FUSE's). Wall seconds, the median of ``--rounds``; the report
line's hits. The test file system is Python (mfusepy), so its reads cost more than a real mount's
page cache: the figures bound what a mount adds, they do not measure gcsfuse.

    sudo python benchmarks/mount.py --python .ci/venvs/3.11/bin/python --pythonpath /path/to/diffrax/and/deps

Needs root, /dev/fuse, libfuse 2 and mfusepy (the test extra), and diffrax importable by PYTHON.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
EXAMPLE = HERE / "examples" / "diffrax_heat_pde.py"


def run(python: str, directory: str, pythonpath: str) -> tuple[float, str]:
    env = {**os.environ, "GKX_JAX_CACHE_DIR": directory, "JAX_PLATFORMS": "cpu", "GKX_JAX_CACHE_REPORT": "1",
           "PYTHONPATH": pythonpath}
    started = time.perf_counter()
    proc = subprocess.run([python, "-W", "error", str(EXAMPLE)], env=env, capture_output=True, text=True)
    took = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"{EXAMPLE.name} failed in {directory}: {proc.stderr[-500:]}")
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("gkx-autocache:")][-1]
    return took, re.match(r"gkx-autocache: (\d+ hits?, \d+ miss(?:es)?)", line)[1]  # type: ignore[index]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--pythonpath", default="")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from bucketfs import Mounted

    base = Path(tempfile.mkdtemp(prefix="gkx-mount-bench-"))
    try:
        for where in ("local", "mountpoint", "gcsfuse"):
            mounted = None if where == "local" else Mounted(base / f"{where}-objects", base / f"{where}-mnt", where)
            try:
                cold, warm = [], []
                for i in range(args.rounds):
                    directory = str((mounted.mountpoint if mounted else base / "local") / f"jax{i}")
                    cold.append(run(args.python, directory, args.pythonpath))
                    warm.append(run(args.python, directory, args.pythonpath))
                print(f"{where:<11} cold {statistics.median(t for t, _ in cold):5.2f} s ({cold[0][1]})   "
                      f"warm {statistics.median(t for t, _ in warm):5.2f} s ({warm[0][1]})")
            finally:
                if mounted is not None:
                    mounted.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
