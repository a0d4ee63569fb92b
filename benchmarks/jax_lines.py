"""Every JAX line, as a user meets it: one virtual environment per JAX version (that JAX and its
jaxlib from the index, the package from a wheel of this tree), a small jitted program run cold, warm
under ``-W error``, with ``XLA_FLAGS`` changed, and with a cap; against the same program with the
package off. Prints a Markdown table, one row a version (docs/jax-lines.md, "Verified").

    python benchmarks/jax_lines.py [--work DIR] 0.4.30 0.6.2 0.9.0 ...

Needs the package index (or pip's cache) for each JAX; Python 3.11 for JAX before 0.11.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = """
import jax, jax.numpy as jnp
x = jnp.ones((16, 16))
steps = [jax.jit(lambda v, i=i: jnp.sin(v) * i + jnp.cos(v @ v.T).sum()) for i in range(int(__import__("sys").argv[1]))]
print(repr(sum(float(f(x).sum()) for f in steps)))
"""
REPORT = re.compile(r"gkx-autocache: (\d+) hits?, (\d+) miss(?:es)? ?(\([^)]*\))?")
LEVELS = re.compile(r"gkx-autocache: (\d+ hits? \([^)]*\)), (\d+) miss")  # "3 hits (0 local, 3 shared), 0 misses"


def sh(*cmd: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, check=check)


def environment(work: Path, version: str, wheel: Path) -> Path:
    venv = work / f"jax-{version}"
    python = venv / "bin" / "python"
    if not python.exists():
        sh(sys.executable, "-m", "venv", str(venv))
        sh(str(python), "-m", "pip", "install", "-q", "--upgrade", "pip")
        pinned = sh(str(python), "-m", "pip", "install", "-q", f"jax=={version}", f"jaxlib=={version}", check=False)
        if pinned.returncode:  # a jax release without a jaxlib of its number (0.12.0.1): the jaxlib it asks for
            sh(str(python), "-m", "pip", "install", "-q", f"jax=={version}")
    sh(str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel))
    return python


def run(python: Path, env: dict[str, str], n: int, *flags: str) -> tuple[str, str]:
    done = sh(str(python), *flags, "-c", PROGRAM, str(n), env=env, check=False)
    if done.returncode:
        return "failed", done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
    return done.stdout.strip(), done.stderr


def row(version: str, work: Path, wheel: Path) -> list[str]:
    python = environment(work, version, wheel)
    cache = Path(tempfile.mkdtemp(dir=work))
    base = {**os.environ, "GKX_JAX_CACHE_DIR": str(cache), "GKX_JAX_CACHE_REPORT": "1", "HOME": str(cache)}
    off, _ = run(python, {**base, "GKX_JAX_CACHE": "0"}, 6)
    cold, cold_err = run(python, base, 6)
    warm, warm_err = run(python, base, 6, "-W", "error")
    flags, flags_err = run(python, {**base, "XLA_FLAGS": "--xla_cpu_enable_fast_math=true"}, 6)
    status = sh(str(python), "-m", "gkx_autocache", "status", env=base, check=False).stdout
    store = next((ln.split()[-1] for ln in status.splitlines() if ln.strip().startswith("store ")), "?")
    if "is not supported" in status:
        store = "none: JAX left as it is (not supported)"
    stats = json.loads(sh(str(python), "-m", "gkx_autocache", "--json", "stats", env=base, check=False).stdout or "{}")
    present = json.loads(sh(str(python), "-m", "gkx_autocache", "--json", "status", env=base, check=False).stdout
                         or "{}").get("versions_present") or [{}]
    totals, entries = stats.get("stats") or {}, present[0].get("entries")
    hits = REPORT.search(warm_err)
    agree = "yes" if totals and totals.get("writes") == entries and hits and totals.get("hits") == int(hits[1]) else "no"
    version_line = sh(str(python), "-m", "gkx_autocache", "--version", env=base, check=False).stdout.splitlines()[1:]
    other_cpu = on_another_cpu(python, base, work)
    shared = Path(tempfile.mkdtemp(dir=work))
    (shared / "team").mkdir()  # a team directory is made by its team, not by a reader
    run(python, {**base, "GKX_JAX_CACHE_DIR": str(shared / "a"), "GKX_JAX_CACHE_SHARED": str(shared / "team")}, 6)
    _, fresh_err = run(python, {**base, "GKX_JAX_CACHE_DIR": str(shared / "b"), "GKX_JAX_CACHE_SHARED": str(shared / "team")}, 6)
    from_shared = LEVELS.search(fresh_err)
    capped = Path(tempfile.mkdtemp(dir=work))
    run(python, {**base, "GKX_JAX_CACHE_DIR": str(capped), "GKX_JAX_CACHE_MAX_SIZE": "64KiB"}, 40)
    size = int(sh("du", "-sk", str(capped), check=False).stdout.split()[0] or 0)
    cause = REPORT.search(flags_err)
    xla_errors = sum("cpu_aot_loader" in ln for ln in warm_err.splitlines())
    return [version, store,
            f"{hits[1]} of {int(hits[1]) + int(hits[2])}" if hits else "no report line",
            "yes" if warm == cold == off and warm != "failed" else f"no ({off} / {cold} / {warm})",
            (cause[3] or "") if cause else "no report line",
            f"{size} KiB (cap 64)", str(xla_errors),
            f"{agree} ({totals.get('writes')} written, {entries} entries, {totals.get('hits')} hits)",
            other_cpu, f"{from_shared[1]}, {from_shared[2]} misses" if from_shared else "no report line",
            (version_line[0].removeprefix("features ") if version_line else "?")]


def on_another_cpu(python: Path, base: dict[str, str], work: Path) -> str:
    """The warm run on a CPU without AVX2 (a fake /proc/cpuinfo in a private mount namespace, as root):
    its report line's misses."""
    real = Path("/proc/cpuinfo").read_text(errors="replace")
    if " avx2" not in real or os.geteuid() != 0:
        return "not run (needs root and an AVX2 host)"
    fake = work / "cpuinfo-no-avx2"
    fake.write_text(re.sub(r" avx2(?= |$)", "", real, flags=re.M))
    script = f"mount --bind {fake} /proc/cpuinfo && exec {python} -c '{PROGRAM}' 6"
    done = sh("unshare", "-m", "sh", "-c", script, env=base, check=False)
    found = REPORT.search(done.stderr)
    return f"{found[1]} hits, {found[2]} misses {found[3] or ''}" if found else f"no report line (exit {done.returncode})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="+")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "gkx-jax-lines")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    wheels = args.work / "wheel"
    for old in wheels.glob("*.whl"):
        old.unlink()
    sh(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT))
    wheel = next(wheels.glob("*.whl"))
    print(f"`python benchmarks/jax_lines.py {' '.join(args.versions)}` (Python {sys.version.split()[0]})\n")
    print("| JAX | store | warm hits (-W error) | results = package off | XLA_FLAGS miss | cap kept (du after exit) "
          "| XLA loader error lines, warm | stats = directory | warm on a CPU without AVX2 "
          "| a fresh local level from a shared one | --version features |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for version in args.versions:
        try:
            cells = row(version, args.work, wheel)
        except subprocess.CalledProcessError as exc:
            cells = [version, f"not installed: {(exc.stderr or '').strip().splitlines()[-1:]}"] + [""] * 9
        print("| " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
