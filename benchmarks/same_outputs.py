"""Whether a change kept the package's behaviour: one scenario's outputs, from the working tree and
from a commit, compared after masking what differs between two runs of the same tree.

    python benchmarks/same_outputs.py --rev REV [--modes shared solo signed own refused]

The scenario, in fresh processes of this interpreter (the package taken from each tree's ``src``
through ``PYTHONPATH``): a cold writer, a warm run, a fresh local level, then one constant changed
(a miss to explain); then ``status --no-probe``, ``stats --json``, ``explain --json`` and ``stats``.
The modes: a shared directory level, none, a signing key, the user's own
``JAX_COMPILATION_CACHE_DIR``, and one the store refuses (writable by others). Masked: times,
dates, pids, hashes, byte counts and sizes (seals carry float digits, entries carry paths), the
per-function tracing times, and the order of functions listed by time. Prints SAME or the first differing lines, per mode;
exits 1 where any differs. Used for issue 43's restructure.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = """import sys, jax, jax.numpy as jnp
n = int(sys.argv[1])
def step(x):
    return jnp.tanh(x) @ x.T + n * 0.5
print(float(jax.jit(step)(jnp.ones((16, 16))).sum()), float(jax.jit(lambda x: x * 2)(jnp.arange(4.0)).sum()))
"""
MODES = ("shared", "solo", "signed", "own", "refused")
COMMANDS = (("status.txt", ["status", "--no-probe"]), ("stats.json", ["stats", "--json"]),
            ("explain.json", ["explain", "--json"]), ("stats.txt", ["stats"]))


def scenario(src: Path, out: Path, mode: str) -> str:
    """The scenario's outputs in ``out``, the package from ``src``: one text, its paths as OUT."""
    out.mkdir(parents=True)
    (out / "q.py").write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GKX_JAX_CACHE", "JAX_"))}
    env.update(PYTHONPATH=str(src), GKX_JAX_CACHE_REPORT="1", GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS="0")
    if mode in ("shared", "signed"):
        (out / "shared").mkdir()
        env.update(GKX_JAX_CACHE_DIR=str(out / "local"), GKX_JAX_CACHE_SHARED=str(out / "shared"))
    if mode == "signed":
        env["GKX_JAX_CACHE_SIGNING_KEY"] = "k3y"
    if mode == "solo":
        env["GKX_JAX_CACHE_DIR"] = str(out / "local")
    if mode in ("own", "refused"):
        env["JAX_COMPILATION_CACHE_DIR"] = str(out / "local")
    if mode == "refused":
        (out / "local").mkdir(mode=0o777)
        (out / "local").chmod(0o777)
    said = []
    for step, arg in enumerate(("1", "1", "1", "2")):
        if step == 2:  # a fresh local level
            shutil.rmtree(out / "local", ignore_errors=True)
        run = subprocess.run([sys.executable, "q.py", arg], cwd=out, env=env, capture_output=True, text=True, timeout=600)
        said.append(f"== run {step + 1}\n{run.stderr}")
    for name, args in COMMANDS:
        run = subprocess.run([sys.executable, "-m", "gkx_autocache", *args], cwd=out, env=env, capture_output=True,
                             text=True, timeout=600)
        said.append(f"== {name}\n{run.stdout}{run.stderr}")
    return mask("\n".join(said).replace(str(out), "OUT"))


def mask(text: str) -> str:
    text = "\n".join(ordered(line) for line in text.split("\n"))
    text = re.sub(r'"tracing_by_function": \[[^\]]*\]', '"tracing_by_function": L', text)
    text = re.sub(r'"(\w*bytes\w*)": \d+', r'"\1": N', text)
    text = re.sub(r"\d+(\.\d+)?e-\d+", "F", text)
    text = re.sub(r"\d+\.\d+", "F", text)
    text = re.sub(r"\b\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d)?", "DATE", text)
    text = re.sub(r"\b[0-9a-f]{16,}\b", "HEX", text)
    text = re.sub(r"\b\d+ ?(B|KiB|MiB|ms|s)\b", r"N \1", text)
    text = re.sub(r"-\d{2,7}\b", "-PID", text)
    text = "\n".join(line for line in text.split("\n") if not re.match(r"^\s*F\s+(s\s+)?jit_\S+", line))  # timed rows
    return re.sub(r" +", " ", text)


def ordered(line: str) -> str:
    """A JSON document with its lists ordered by time (``top_functions``) ordered by name instead:
    functions that compile in the same few milliseconds swap places between two runs."""
    if not line.startswith("{"):
        return line
    try:
        data = json.loads(line)
    except ValueError:
        return line
    if isinstance(data.get("top_functions"), list):
        data["top_functions"] = sorted(data["top_functions"], key=lambda f: str(f.get("name")))
    return json.dumps(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", required=True, help="the commit to compare the working tree with")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    args = parser.parse_args(argv)
    differ = False
    with tempfile.TemporaryDirectory(prefix="gkx-same-") as tmp:
        base = Path(tmp)
        before = base / "before"
        before.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.rev, "src"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive.stdout, check=True)
        for mode in args.modes:
            old = scenario(before / "src", base / f"{mode}-b", mode)
            new = scenario(ROOT / "src", base / f"{mode}-a", mode)
            if old == new:
                print(f"{mode}: SAME ({old.count(chr(10)) + 1} lines)")
                continue
            differ = True
            lines = difflib.unified_diff(old.split("\n"), new.split("\n"), args.rev, "working tree", lineterm="", n=0)
            print(f"{mode}: DIFFERENT\n" + "\n".join(list(lines)[:12]))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
