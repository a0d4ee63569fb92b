"""The portable part of the suite, for macOS and Windows runners (.github/workflows/laptops.yml):
what a new user of a laptop does, checked. The rest of the suite needs Linux (FUSE mounts, a bind
mount over /proc/cpuinfo, other users through setpriv: .ci/run); on Linux, tests/test_platforms.py
runs the same paths under a shim of each platform. Run it in an environment where the package and
JAX are installed: ``python .ci/laptop.py``. Exits non-zero, saying why, at the first failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys

CLI = [sys.executable, "-m", "gkx_autocache"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(args), capture_output=True, text=True, env={**os.environ, **(env or {})})
    print(f"$ {' '.join(args[2:] if args[:1] == (sys.executable,) else args)}  -> {proc.returncode}")
    print(proc.stdout.rstrip()[-2000:])
    if proc.stderr.strip():
        print(proc.stderr.rstrip()[-2000:])
    if "Traceback" in proc.stderr:
        sys.exit("a command printed a traceback")
    return proc


def check(ok: bool, why: str) -> None:
    if not ok:
        sys.exit(f"FAILED: {why}")
    print(f"ok: {why}")


def main() -> None:
    windows = os.name == "nt"
    demo = run(*CLI, "--json", "demo")
    check(demo.returncode == 0, "the demo runs")
    result = json.loads(demo.stdout.strip().splitlines()[-1])
    check(result["warm"]["hits"] == result["warm"]["requests"] > 0, "a warm run is served from the cache")
    probe = run(sys.executable, "-c", "import jax, jax.numpy as jnp; print(jax.jit(jnp.sin)(1.0)); "
                "print(jax.config.jax_compilation_cache_dir)")
    check(probe.returncode == 0, "import jax works")
    said = [ln for ln in probe.stderr.splitlines() if "gkx-autocache:" in ln]
    if windows:
        check(len(said) == 1 and "on Windows JAX's own cache serves" in said[0], "Windows says what it gets, once")
    else:
        check(not said, "nothing to say at import jax")
    status = run(*CLI, "status")
    check(status.returncode == 0, "status answers")
    check("Permission denied" not in status.stdout, "no directory refused")
    if sys.platform == "darwin":
        check("instruction set cannot be read" not in status.stdout, "macOS: the CPU's instruction set is read")
        check("the package's own" in status.stdout, "macOS: the package's store serves")
    check(run(*CLI, "config", "set", "--user", "report", "true").returncode == 0, "config set")
    check(run(*CLI, "config", "unset", "--user", "report").returncode == 0, "config unset")
    for command in (["stats"], ["explain"], ["verify"], ["prune"], ["ci-key"], ["dir"], ["--version"]):
        proc = run(*CLI, *command)
        check(proc.returncode in (0, 1) and (proc.returncode == 0 or len(proc.stderr.strip().splitlines()) == 1),
              f"{' '.join(command)} answers, or says in one line why not")
    check(run(*CLI, "clear", "--yes").returncode == 0, "clear")


if __name__ == "__main__":
    main()
