"""Every JAX line, as a user meets it: one virtual environment per JAX version (that JAX and its
jaxlib from the index, the package from a wheel of this tree), a small jitted program run cold, warm
under ``-W error``, with ``XLA_FLAGS`` changed, and with a cap; against the same program with the
package off. And a jitted function with host callbacks (``jax.debug.print``, a ``pure_callback`` that
raises for one input, an ordered ``io_callback`` with a side effect) run off, cold and warm, all under
``-W error``: served warm or not cached (and why), and whether the three print and return the same.
Prints a Markdown table, one row a version (docs/jax-lines.md, "Verified").

    python benchmarks/jax_lines.py [--work DIR] 0.4.30 0.6.2 0.9.0 ...

Needs the package index (or uv's or pip's cache) for each JAX; Python 3.11 for JAX before 0.11. Builds
the environments with ``python -m uv`` where the running Python has uv, else with venv and pip.
"""

from __future__ import annotations

import argparse
import importlib.util
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
# tests/test_jax_lines.py runs it too. No vmap (0.4.30 has no ``vmap_method``). Its last line:
# JAX's own cache counts, what the calls returned or raised, and the io_callback's side effects.
CALLING = r"""
import json
import jax, jax.numpy as jnp
from jax.experimental import io_callback
counts = {"requests": 0, "hits": 0}
def listen(event, *a, **k):
    if event == "/jax/compilation_cache/compile_requests_use_cache": counts["requests"] += 1
    elif event == "/jax/compilation_cache/cache_hits": counts["hits"] += 1
jax.monitoring.register_event_listener(listen)
effects = []
def check(v):
    if float(v.sum()) > 10:
        raise ValueError("too large")
    effects.append(float(v.sum()))
    return v
@jax.jit
def f(x):
    jax.debug.print("sum {s}", s=x.sum())
    y = jax.pure_callback(check, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    return io_callback(lambda v: v * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), y, ordered=True)
said = [f(jnp.ones(3)).tolist()]
try:
    f(jnp.ones(3) * 5).block_until_ready()
except Exception as exc:
    said.append("too large" in str(exc))
print(json.dumps({**counts, "said": said, "effects": effects}))
"""
# What the package off gives: the first call's print (some lines print the raising call's "sum 15.0" too),
# the first call's result, the error raised in the second, and the one side effect.
CALLED = ("sum 3.0", {"said": [[2.0, 2.0, 2.0], True], "effects": [3.0]})
NOT_CACHED = re.compile(r"(\d+) not cached \(([^)]*)\)")  # "1 not cached (1 host callbacks: 0.04 s compile)"
REPORT = re.compile(r"gkx-autocache: (\d+) hits?, (\d+) miss(?:es)? ?(\([^)]*\))?")
LEVELS = re.compile(r"gkx-autocache: (\d+ hits? \([^)]*\)), (\d+) miss")  # "3 hits (0 local, 3 shared), 0 misses"


def sh(*cmd: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, check=check)


def environment(work: Path, version: str, wheel: Path) -> Path:
    venv = work / f"jax-{version}"
    python = venv / "bin" / "python"
    uv = importlib.util.find_spec("uv") is not None
    pip = (sys.executable, "-m", "uv", "pip", "install", "-q", "--python", str(python)) if uv else (
        str(python), "-m", "pip", "install", "-q")
    if not python.exists():
        if uv:
            sh(sys.executable, "-m", "uv", "venv", "-q", "--python", sys.executable, str(venv))
        else:
            sh(sys.executable, "-m", "venv", str(venv))
            sh(*pip, "--upgrade", "pip")
        pinned = sh(*pip, f"jax=={version}", f"jaxlib=={version}", check=False)
        if pinned.returncode:  # a jax release without a jaxlib of its number (0.12.0.1): the jaxlib it asks for
            sh(*pip, f"jax=={version}")
    sh(*pip, "--no-deps", "--reinstall" if uv else "--force-reinstall", str(wheel))
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
    described = json.loads(sh(str(python), "-m", "gkx_autocache", "--json", "status", env=base, check=False).stdout
                           or "{}")
    kept = described.get("store")  # the status row is words: "the package's own (gkx-autocache; …)"
    store = str((kept.get("store") if isinstance(kept, dict) else kept) or "?")
    if "is not supported" in status:
        store = "none: JAX left as it is (not supported)"
    stats = json.loads(sh(str(python), "-m", "gkx_autocache", "--json", "stats", env=base, check=False).stdout or "{}")
    present = described.get("versions_present") or [{}]
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
    callbacks = host_callbacks(python, base, work)
    return [version, store,
            f"{hits[1]} of {int(hits[1]) + int(hits[2])}" if hits else "no report line",
            "yes" if warm == cold == off and warm != "failed" else f"no ({off} / {cold} / {warm})",
            (cause[3] or "") if cause else "no report line",
            f"{size} KiB (cap 64)", str(xla_errors),
            f"{agree} ({totals.get('writes')} written, {entries} entries, {totals.get('hits')} hits)",
            other_cpu, f"{from_shared[1]}, {from_shared[2]} misses" if from_shared else "no report line",
            callbacks, (version_line[0].removeprefix("features ") if version_line else "?")]


def host_callbacks(python: Path, base: dict[str, str], work: Path) -> str:
    """CALLING with the package off, cold and warm, each under ``-W error``, every compile worth caching:
    whether the warm run was served or why not (its report line), and whether all three printed and
    returned the same (and what the package off gives: ``CALLED``)."""
    env = {**base, "GKX_JAX_CACHE_DIR": tempfile.mkdtemp(dir=work), "GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "GKX_JAX_CACHE_REPORT": "1"}
    runs = {name: sh(str(python), "-W", "error", "-c", CALLING, env=mode, check=False)
            for name, mode in (("off", {**env, "GKX_JAX_CACHE": "0"}), ("cold", env), ("warm", env))}
    failed = [f"{name} failed: {(done.stderr.strip().splitlines() or [f'exit {done.returncode}'])[-1]}"
              for name, done in runs.items() if done.returncode]
    if failed:
        return "; ".join(failed)
    said: dict[str, tuple[list[str], dict[str, object]]] = {}
    counts = {"requests": 0, "hits": 0}
    for name, done in runs.items():
        lines = done.stdout.strip().splitlines()
        last = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
        said[name] = lines[:-1], {k: v for k, v in last.items() if k not in ("requests", "hits")}
        counts = {k: int(last.get(k, 0)) for k in counts}  # the warm run's, the last
    hits = f"{counts['hits']} of {counts['requests']} hits"
    warm_err = runs["warm"].stderr
    kept = NOT_CACHED.search(warm_err)
    if kept:
        verdict = f"not cached ({re.sub(r': [0-9.]+ s compile', '', kept[2])}), {hits}"
    elif counts["requests"] and counts["hits"] == counts["requests"]:
        verdict = f"served warm ({hits})"
    else:
        found = REPORT.search(warm_err)
        verdict = f"{hits}, {found[0].removeprefix('gkx-autocache: ') if found else 'no report line'}"
    if said["off"] == said["cold"] == said["warm"]:
        expected = said["off"][0][:1] == [CALLED[0]] and said["off"][1] == CALLED[1]
        verdict += ", same output" if expected else f", same output (not the expected one: {said['off']})"
    else:
        verdict += f", DIFFERENT OUTPUT (off {said['off']} / cold {said['cold']} / warm {said['warm']})"
    reports = sum("please report" in done.stderr for done in runs.values())
    return verdict + (f", 'please report' in {reports} runs" if reports else "")


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
          "| a fresh local level from a shared one | host callbacks (off, cold, warm; -W error) | --version features |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for version in args.versions:
        try:
            cells = row(version, args.work, wheel)
        except subprocess.CalledProcessError as exc:
            cells = [version, f"not installed: {(exc.stderr or '').strip().splitlines()[-1:]}"] + [""] * 10
        print("| " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
