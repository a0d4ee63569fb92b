"""Benchmarks for SPEC §11: what the package costs every process, and what it saves a JAX re-run.

    python benchmarks/run.py [--quick] [--only SECTION ...] [--out benchmarks/results.json]

Builds two virtual environments from the working tree (the same interpreter and JAX, one with
the wheel installed and one without), then measures, as medians of interleaved runs:
  1. `python -c pass`, with the package's bytecode present and absent: wall time, instructions
     counted by valgrind (`--tool=lackey --basic-counts=yes`, deterministic to a fraction of a
     percent where wall time at this scale is not; skipped where valgrind is not installed), and
     the modules `python -X importtime -c pass` lists in each;
  2. `import jax` with the hook against without it;
  3. the demo's compile-dominated workload, cold then warm in fresh processes, under: no cache,
     JAX's stock cache (directory set only), JAX's stock cache with thresholds at zero, and
     gkx-autocache;
  4. the CLI on a synthetic directory of 100 000 entries, and the at-exit prune on 10 000;
  5. the bookkeeping: the index explanations read at a first miss (bytes per entry, its load at
     100 000 entries), an exit beside it, and another process's first miss, exit and `status`
     beside a live process that made 1 000 000 lookups, against one that made 100;
  6. levels, against moto's S3 server on 127.0.0.1 (a real bucket is slower): a warm run from the
     local level, from the bucket alone, and raw JAX with the bucket as its dir; a cold run against
     an empty bucket against no shared level; the uploads' cost to a cold run; and a fresh machine
     warm from the bucket (prefetch) against a local warm run and raw JAX's `s3://`, on 20 and on
     500 entries and on a short program (SHORT, 62 entries, about 2.3 s warm), with 0, 20 and
     50 ms added to each request by a delaying proxy on 127.0.0.1; and the levels' fixed costs on
     that short program, as alternated pairs (`level_pairs`; alone, in a few minutes:
     `benchmarks/pairs_levels.py`): a warm writer with a bucket against without, and a fresh
     machine against a local warm run at 20 ms a request; the same pairs with an HTTP cache (nginx
     with WebDAV) in place of the bucket.
Prints a Markdown table and writes it, with every figure, as JSON. `--only startup` (or
import_jax, workload, explain, cli, bookkeeping, levels; repeatable) measures those sections only;
when --out already holds a run, its other sections are kept and the JSON records which were
measured when. Needs `uv` and JAX
in the environment that runs it (`pip install -e '.[test]'`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
RUNNER_SITE = sysconfig.get_paths()["purelib"]


def sh(*cmd: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GKX_JAX_CACHE", "JAX_", "PYTHON"))}
    env.update(JAX_PLATFORMS="cpu", **extra)
    return env


REMOTE_EXTRA = ("etils", "fsspec", "s3fs", "gcsfs")


def runner_deps(work: Path) -> Path:
    """The runner's packages less the remote extra: with ``etils`` importable, every ``import jax``
    also imports ``etils.epath`` (about 0.1 s), which a user without remote storage does not pay."""
    deps = work / "deps"
    deps.mkdir()
    for entry in Path(RUNNER_SITE).iterdir():
        if entry.name.split("-")[0].split(".")[0].lower() not in REMOTE_EXTRA and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    return deps


def build_wheel(work: Path, source: Path = ROOT) -> Path:
    """The package's wheel, from the working tree (or ``source``), in ``work/wheel``."""
    sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(work / "wheel"), str(source))
    (wheel,) = (work / "wheel").glob("*.whl")
    return wheel


def make_venvs(work: Path) -> tuple[Path, Path]:
    """(with, without): the same interpreter and JAX; only the package differs."""
    deps = runner_deps(work)
    wheel = build_wheel(work)
    pythons = []
    for name in ("with", "without"):
        venv = work / name
        sh(sys.executable, "-m", "uv", "venv", "-q", "--python", sys.executable, str(venv))
        python = venv / "bin" / "python"
        site = sh(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
        Path(site, "zz_bench_deps.pth").write_text(f"{deps}\n")
        if name == "with":
            sh(sys.executable, "-m", "uv", "pip", "install", "-q", "--no-deps", "--python", str(python), str(wheel))
        pythons.append(python)
    return pythons[0], pythons[1]


def timed(cmd: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def interleaved(a: list[str], b: list[str], env_a: dict[str, str], env_b: dict[str, str], runs: int) -> tuple[float, float]:
    """Medians of A and B, alternating so that drift in the machine hits both alike."""
    ta, tb = [], []
    for _ in range(runs):
        ta.append(timed(a, env_a))
        tb.append(timed(b, env_b))
    return statistics.median(ta), statistics.median(tb)


def set_bytecode(python: Path, present: bool) -> dict[str, str]:
    site = Path(sh(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout)
    package = Path(str(site).strip()) / "gkx_autocache"
    if package.exists():
        shutil.rmtree(package / "__pycache__", ignore_errors=True)
        if present:
            sh(str(python), "-m", "compileall", "-q", str(package))
    return base_env(PYTHONDONTWRITEBYTECODE="1")


def imported_modules(python: Path) -> set[str]:
    proc = subprocess.run([str(python), "-X", "importtime", "-c", "pass"], capture_output=True, text=True, check=True,
                          env=base_env())
    return {ln.split("|")[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")} - {"package"}


def startup(with_py: Path, without_py: Path, runs: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for present in (True, False):
        env = set_bytecode(with_py, present)
        w, wo = interleaved([str(with_py), "-c", "pass"], [str(without_py), "-c", "pass"], env, env, runs)
        results["bytecode present" if present else "bytecode absent"] = {"with": w, "without": wo}
    extra = sorted(imported_modules(with_py) - imported_modules(without_py))
    results["extra_modules"] = extra
    results["young_collections"] = {"with": young_collections(with_py), "without": young_collections(without_py)}
    return results


def young_collections(python: Path) -> int:
    """Collections of the garbage collector's young generation by the time `-c` reads them (its
    hash seed pinned, like the instruction counts'). Where start-up ends a few allocations short
    of one, a `.pth` line that compiles anything pays for it (0.21 M instructions on 3.12 here)."""
    code = "import gc; print(gc.get_stats()[0]['collections'])"
    env = base_env(PYTHONDONTWRITEBYTECODE="1", PYTHONHASHSEED="0")
    return int(subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=env, check=True).stdout)


VALGRIND = ("valgrind", "--tool=lackey", "--basic-counts=yes")


def instructions(python: Path, env: dict[str, str]) -> int:
    """Instructions executed by one `python -c pass` (lackey's "guest instrs", printed at exit)."""
    proc = subprocess.run([*VALGRIND, str(python), "-c", "pass"], capture_output=True, text=True, env=env, check=True)
    found = re.search(r"guest instrs:\s+([\d,]+)", proc.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{proc.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def startup_instructions(with_py: Path, without_py: Path, runs: int) -> dict[str, Any]:
    """Medians of `runs` interleaved counts, with and without the package, bytecode present and absent.

    Counts move only with the hash seed (by a few hundredths of a million here, as much as the
    margins they are held to), so run i pins PYTHONHASHSEED=i for both interpreters: the package's
    own cost is then the same to a few thousand instructions in every pair, and a few runs
    suffice, where wall time at the 1 ms scale needs hundreds on a shared machine."""
    if shutil.which("valgrind") is None:
        return {"skipped": "valgrind is not installed (apt-get install valgrind)"}
    results: dict[str, Any] = {}
    for present in (True, False):
        env = set_bytecode(with_py, present)
        w, wo = [], []
        for seed in range(runs):
            paired = {**env, "PYTHONHASHSEED": str(seed)}
            w.append(instructions(with_py, paired))
            wo.append(instructions(without_py, paired))
        results["bytecode present" if present else "bytecode absent"] = {
            "with": statistics.median(w), "without": statistics.median(wo), "with_runs": w, "without_runs": wo}
    results["reference lines"] = reference_lines(without_py, runs)
    return results


# Other .pth files, each alone in the venv without the package, against that venv as it is.
REFERENCE_LINES = {"a `.pth` file with only a comment": "# nothing\n"}


def reference_lines(without_py: Path, runs: int) -> dict[str, dict[str, float]]:
    site = Path(sh(str(without_py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    pth = site / "gkx_reference.pth"
    env = base_env(PYTHONDONTWRITEBYTECODE="1")
    results = {}
    for name, line in REFERENCE_LINES.items():
        w, wo = [], []
        for seed in range(runs):
            paired = {**env, "PYTHONHASHSEED": str(seed)}
            pth.write_text(line)
            try:
                w.append(instructions(without_py, paired))
            finally:
                pth.unlink()
            wo.append(instructions(without_py, paired))
        results[name] = {"with": statistics.median(w), "without": statistics.median(wo)}
    return results


# The hook's own share of `import jax`, timed inside one process: far less noisy than the
# difference of two ~0.7 s imports.
CONFIGURE = ("import os, time, jax; os.environ.pop('GKX_JAX_CACHE'); t = time.perf_counter(); "
             "from gkx_autocache._configure import configure; configure(jax); print(time.perf_counter() - t)")


def import_jax(with_py: Path, without_py: Path, runs: int, work: Path) -> dict[str, dict[str, float]]:
    results = {}
    for present in (True, False):
        env = {**set_bytecode(with_py, present), "GKX_JAX_CACHE_DIR": str(work / "import-jax-cache"), "HOME": str(work)}
        w, wo = interleaved([str(with_py), "-c", "import jax"], [str(without_py), "-c", "import jax"], env, env, runs)
        hook = [float(sh(str(with_py), "-c", CONFIGURE, env={**env, "GKX_JAX_CACHE": "0"}).stdout) for _ in range(runs)]
        results["bytecode present" if present else "bytecode absent"] = {
            "with": w, "without": wo, "configure": statistics.median(hook)}
    return results


def demo_program(work: Path, functions: int) -> list[str]:
    """The demo's child as a script outside the package: run as `-c` with `src` on the path, it
    would import the package from the checkout, whatever bytecode the installed copy has."""
    script = work / "demo_program.py"
    shutil.copyfile(SRC / "gkx_autocache" / "_cli" / "demo.py", script)
    return [str(script), "--child", str(functions)]


def workload(with_py: Path, without_py: Path, functions: int, runs: int, work: Path) -> dict[str, Any]:
    """Each configuration: `runs` rounds of (fresh directory, cold process, warm process)."""
    code = demo_program(work, functions)
    configs = {
        "no cache": (without_py, {}),
        "JAX stock cache, default thresholds": (without_py, {"JAX_COMPILATION_CACHE_DIR": "{d}"}),
        "JAX stock cache, thresholds 0": (without_py, {"JAX_COMPILATION_CACHE_DIR": "{d}",
                                                       "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                                                       "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}),
        "gkx-autocache": (with_py, {"GKX_JAX_CACHE_DIR": "{d}"}),
    }
    results: dict[str, Any] = {}
    for name, (python, template) in configs.items():
        cold: list[float] = []
        warm: list[float] = []
        hits: list[float] = []
        requests: list[float] = []
        load: list[float] = []
        for i in range(runs):
            d = work / f"wl-{len(results)}-{i}"
            env = base_env(HOME=str(work), **{k: v.format(d=d) for k, v in template.items()})
            for phase in ("cold", "warm"):
                started = time.perf_counter()
                proc = subprocess.run([str(python), *code], env=env, capture_output=True, text=True, check=True)
                seconds = time.perf_counter() - started
                out = json.loads(proc.stdout.strip().splitlines()[-1])
                (cold if phase == "cold" else warm).append(seconds)
                if phase == "warm":
                    hits.append(out["hits"])
                    requests.append(out["requests"])
                    load.append(out["load_secs"] / max(out["hits"], 1))
        results[name] = {"cold": statistics.median(cold), "warm": statistics.median(warm),
                         "warm_hits": statistics.median(hits), "warm_requests": statistics.median(requests),
                         "load_per_entry": statistics.median(load)}
    return results


def warm_vs_raw(with_py: Path, without_py: Path, functions: int, pairs: int, work: Path) -> dict[str, Any]:
    """Warm runs of the demo workload, gkx-autocache against JAX's stock cache at threshold 0,
    interleaved, with the package's bytecode present (pip writes it) and absent (uv does not):
    medians, and the spread of the per-pair ratio (SPEC §13: within 2 %)."""
    code = demo_program(work, functions)
    results: dict[str, Any] = {}
    for present in (True, False):
        case = "bytecode present" if present else "bytecode absent"
        common = set_bytecode(with_py, present)
        ours = {**common, "HOME": str(work), "GKX_JAX_CACHE_DIR": str(work / f"wvr-ours-{present}")}
        raw = {**common, "HOME": str(work), "JAX_COMPILATION_CACHE_DIR": str(work / f"wvr-raw-{present}" / "jax"),
               "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
               "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none"}
        for python, env in ((with_py, ours), (without_py, raw)):
            timed([str(python), *code], env)  # cold: fills the directory
        a, b = [], []
        for _ in range(pairs):
            a.append(timed([str(with_py), *code], ours))
            b.append(timed([str(without_py), *code], raw))
        ratios = sorted(x / y for x, y in zip(a, b, strict=True))
        results[case] = {"ours": statistics.median(a), "raw": statistics.median(b), "pairs": pairs,
                         "ratio": statistics.median(a) / statistics.median(b), "ratio_min": ratios[0],
                         "ratio_max": ratios[-1]}
    return results


# The package's own time inside one warm run of the demo program, summed by where it is spent:
# far steadier than the difference of two ~1.5 s runs. The wrappers go on before `import jax`, so
# everything the package does in that run passes through one of them.
OWN = r"""
import atexit, json, runpy, sys, time
spent = {}
atexit.register(lambda: print("gkx-own " + json.dumps(spent), file=sys.stderr))  # registered first: runs last
for name in sys.argv[3].split(","):  # the standard library that `import jax` imports anyway
    __import__(name)
started = time.perf_counter()
from gkx_autocache import _configure, _key, _store
from gkx_autocache._explain import seam as _explain_seam
from gkx_autocache._record import recorder as _stats
spent["imports"] = time.perf_counter() - started

def timed(owner, name, label):
    original = getattr(owner, name)
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - t
    setattr(owner, name, wrapper)

timed(_configure, "configure", "configure")
timed(_store.Store, "get", "store")
timed(_stats.Recorder, "on_duration", "events")
timed(_stats.Recorder, "on_event", "events")
timed(_key.Seam, "on_part", "explain")
timed(_stats, "finish", "exit")
sys.argv = [sys.argv[1], "--child", sys.argv[2]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def own_time(with_py: Path, functions: int, runs: int, work: Path) -> dict[str, dict[str, float]]:
    """The package's own seconds in a warm run, by part (medians of ``runs``), bytecode present and
    absent (see OWN)."""
    code = demo_program(work, functions)
    stdlib = sh(str(with_py), "-c", "import sys, jax; print(','.join(sorted(n for n in sys.modules if '.' not in n "
                "and n in sys.stdlib_module_names and not n.startswith('_'))))", env=base_env(GKX_JAX_CACHE="0")).stdout.strip()
    results = {}
    for present in (True, False):
        env = {**set_bytecode(with_py, present), "HOME": str(work), "GKX_JAX_CACHE_DIR": str(work / f"own-{present}")}
        sh(str(with_py), *code, env=env)  # cold
        samples: list[dict[str, float]] = []
        for _ in range(runs):
            err = subprocess.run([str(with_py), "-c", OWN, code[0], code[2], stdlib], env=env, capture_output=True, text=True,
                                 check=True).stderr
            samples.append(json.loads(err.split("gkx-own ", 1)[1].splitlines()[0]))
        parts = sorted({k for sample in samples for k in sample})
        figures = {k: statistics.median(sample.get(k, 0.0) for sample in samples) for k in parts}
        figures["total"] = statistics.median(sum(sample.values()) for sample in samples)
        results["bytecode present" if present else "bytecode absent"] = figures
    return results


KEYS = r"""
import json, sys, time
import numpy as np, jax, jax.numpy as jnp
from jax._src import compilation_cache, compiler, xla_bridge
n, rounds, layers = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
backend = xla_bridge.get_backend()
devices = np.array(jax.devices()[:1])
options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
x = jnp.ones((16, 16))
def body(v, c):  # one layer (a tiny function), or many: JAX's key grows with the function, a miss's extra does not
    for j in range(layers):
        v = jnp.tanh(v @ v.T * c + j) / (1.0 + jnp.abs(v))
    return v.sum(axis=0)
modules = [jax.jit(lambda v, c=float(i): body(v, c)).lower(x).compiler_ir("stablehlo") for i in range(n)]
def per_key():
    start = time.perf_counter()
    for _ in range(rounds):
        for m in modules:
            compilation_cache.get_cache_key(m, devices, options, backend)
    return (time.perf_counter() - start) / (rounds * n)
plain = per_key()
from gkx_autocache import _key
from gkx_autocache._explain import seam as _explain_seam
from gkx_autocache._record.recorder import Recorder
watch = _explain_seam.Watch()
recorder = Recorder("/nonexistent", ledger=False, explainer=watch)
keys, _ = _key.install(jax, listener=watch)
reason = _explain_seam.install(jax, keys, watch, recorder, "/nonexistent", lambda: {})
assert reason is None, reason
wrapped = per_key()
keys = [compilation_cache.get_cache_key(m, devices, options, backend) for m in modules]
def misses():
    start = time.perf_counter()
    for m, key in zip(modules, keys):
        compilation_cache.get_cache_key(m, devices, options, backend)
        recorder.explainer.cause(key, recorder.run)
    return time.perf_counter() - start
first = misses()  # the process's first misses: what is read once (JAX's source, the compile options' fields)
miss = min(misses() for _ in range(rounds)) / n - wrapped
print(json.dumps({"plain": plain, "wrapped": wrapped, "miss_extra": miss, "first_misses_once": first - (miss + wrapped) * n}))
"""


def key_time(with_py: Path, n: int, rounds: int) -> dict[str, float]:
    """JAX's key computation in-process, plain and with the explanation seam (every key: the hit
    path), and what a miss adds (its parts hashed alone, its cause decided). Bytecode present, as pip
    installs: the first misses import the explainer."""
    env = {**set_bytecode(with_py, True), "GKX_JAX_CACHE": "0"}
    figures = dict(json.loads(sh(str(with_py), "-c", KEYS, str(n), str(rounds), "1", env=env).stdout))
    larger = json.loads(sh(str(with_py), "-c", KEYS, str(n), str(rounds), "30", env=env).stdout)
    figures.update({f"{k}_30_layers": v for k, v in larger.items() if k != "first_misses_once"})
    return figures


def saved_under_contention(with_py: Path, functions: int, work: Path) -> dict[str, float]:
    """The same warm run's "compile CPU time avoided", after a cold run alone and after a cold run
    of two processes at once on 2 cores (as `pytest -n 2` does): compile time is CPU time, so the
    two agree (wall time did not: 90 s against 129 s, SPEC §7)."""
    code = demo_program(work, functions)
    figures = {}
    for name, parallel in (("after an uncontended cold run", 1), ("after a contended cold run (2 at once)", 2)):
        env = base_env(HOME=str(work), GKX_JAX_CACHE_DIR=str(work / f"contention-{parallel}"))
        procs = [subprocess.Popen([str(with_py), *code], env=env, stdout=subprocess.DEVNULL) for _ in range(parallel)]
        assert all(p.wait() == 0 for p in procs)
        sh(str(with_py), "-m", "gkx_autocache", "stats", "--reset", env=env)
        sh(str(with_py), *code, env=env)
        stats = json.loads(sh(str(with_py), "-m", "gkx_autocache", "--json", "stats", env=env).stdout)["stats"]
        figures[name] = stats["saved_secs"]
    return figures


def real_entry(with_py: Path, work: Path) -> tuple[bytes, bytes]:
    """One real entry and its compile-time sidecar, from a real compile."""
    seed = work / "seed"
    sh(str(with_py), "-c", "import jax, jax.numpy as jnp; jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.ones((8, 8)))",
       env=base_env(GKX_JAX_CACHE_DIR=str(seed), HOME=str(work)))
    entry = max(seed.glob("jax-*/*-cache"), key=lambda p: p.stat().st_size)
    return entry.read_bytes(), Path(str(entry)[: -len("-cache")] + "-gkx-compile").read_bytes()


def synthetic(vdir: Path, n: int, entry: bytes, sidecar: bytes) -> None:
    """``n`` copies of one real entry (and its sidecar) under ``n`` keys, used at staggered times."""
    from gkx_autocache._layout import TAG

    vdir.mkdir(parents=True, mode=0o700)
    vdir.parent.chmod(0o700)
    (vdir / "CACHEDIR.TAG").write_text(TAG)
    now = time.time()
    for i in range(n):
        key = vdir / synthetic_key(i)
        Path(f"{key}-cache").write_bytes(entry)
        Path(f"{key}-gkx-compile").write_bytes(sidecar)
        os.utime(f"{key}-cache", (now - i, now - i))


def synthetic_key(i: int) -> str:
    """A key as JAX makes them: a function name and a sha256 (the index keeps its first 20 digits)."""
    import hashlib

    return f"jit_fn{i % 97}-{hashlib.sha256(str(i).encode()).hexdigest()}"


def synthetic_ledgers(vdir: Path, n: int) -> None:
    """``n`` ledgers of finished processes, not folded yet, in the package's own format."""
    folder = vdir / ".gkx-autocache" / "ledger"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        lines = [{"e": "hit", "key": synthetic_key(i), "bytes": 3500, "saved": 0.02},
                 {"e": "miss", "key": f"jit_new{i % 13}-{i:064x}", "cause": "new", "t": 1.0},
                 {"e": "put", "key": f"jit_new{i % 13}-{i:064x}", "bytes": 3508, "compile": 0.03}]
        (folder / f"{100000 + i}-{i}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


ORDINARY = "import jax, jax.numpy as jnp; jax.jit(lambda x: jnp.sin(x) * 3.0)(jnp.ones(8)).block_until_ready()"


def cli(with_py: Path, entries: int, work: Path) -> dict[str, float]:
    """The commands on ``entries`` real entries; then ``entries`` unfolded ledgers, one ordinary
    run (which folds them at exit) and ``status`` again."""
    jax_version = sh(str(with_py), "-c", "import importlib.metadata as m; print(m.version('jax'))").stdout.strip()
    root = work / "synthetic"
    vdir = root / f"jax-{jax_version}"
    entry = real_entry(with_py, work)
    synthetic(vdir, entries, *entry)
    # A directory the package did not make (stock JAX's, given as JAX_COMPILATION_CACHE_DIR): no
    # .gkx-autocache in it, so its count is kept in the user's cache (issue 71: counted at every status).
    foreign = work / "foreign"
    synthetic(foreign, entries, *entry)
    (foreign / "CACHEDIR.TAG").unlink()
    env = base_env(GKX_JAX_CACHE_DIR=str(root), HOME=str(work), GKX_JAX_CACHE_MAX_SIZE="0")
    figures = {}
    (vdir / ".gkx-autocache").mkdir(exist_ok=True)  # as any run leaves it
    time.sleep(11)  # a directory last written a while ago: its count is kept (``_entries.count``, QUIET_SECS)
    own = base_env(JAX_COMPILATION_CACHE_DIR=str(foreign), HOME=str(work))
    figures["status, a directory the package did not make"] = timed([str(with_py), "-m", "gkx_autocache", "status"], own)
    figures["status, again: that directory unchanged, its count kept in the user's cache"] = timed(
        [str(with_py), "-m", "gkx_autocache", "status"], own)
    assert not (foreign / ".gkx-autocache").exists()  # nothing written in it
    for command in (["status"], ["prune", "--dry-run", "--max-size", "1MB"], ["prune", "--dry-run", "--older-than", "1s"],
                    ["verify"]):
        figures[" ".join(command)] = timed([str(with_py), "-m", "gkx_autocache", *command], env)
    figures["status, again: the directory unchanged, its count kept"] = timed(
        [str(with_py), "-m", "gkx_autocache", "status"], env)
    baseline = timed([str(with_py), "-c", ORDINARY], env)
    synthetic_ledgers(vdir, entries)
    figures["ordinary run, folding the ledgers at exit (extra seconds)"] = timed([str(with_py), "-c", ORDINARY], env) - baseline
    figures["status, after that run"] = timed([str(with_py), "-m", "gkx_autocache", "status"], env)
    return figures


def prune_at_exit(with_py: Path, entries: int, work: Path) -> float:
    """The fold at exit on ``entries`` entries over the cap: it scans and prunes to 90 %."""
    vdir = work / "prune" / "jax-x"
    synthetic(vdir, entries, *real_entry(with_py, work))
    code = ("import time, sys; from gkx_autocache._record import fold as _fold; t = time.perf_counter(); "
            f"_fold.fold({str(vdir)!r}, int(sys.argv[1]), False); print(time.perf_counter() - t)")
    size = sum(p.stat().st_blocks * 512 for p in vdir.iterdir() if p.is_file())  # as the cap counts (du)
    return float(sh(str(with_py), "-c", code, str(int(size * 0.99)), env=base_env()).stdout)


# -- the bookkeeping: the index explanations read, and processes that live long ----------------------

INDEX_LOAD = r"""
import json, sys, time
from gkx_autocache._explain import classify as _explain
from gkx_autocache._record import index as _index
vdir, key, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
evidence = _index.load(vdir)  # warm the file cache once: the figure is the work, not the disk
times = []
for _ in range(runs):
    started = time.perf_counter()
    evidence = _index.load(vdir)
    name, hex_ = _index.split_key(key)
    records = evidence.records(name)
    times.append(time.perf_counter() - started)
print(json.dumps({"load": sorted(times)[len(times) // 2], "records": len(records)}))
"""


def synthetic_index(vdir: Path, n: int, seed: Path) -> int:
    """An index of ``n`` entries, as the fold writes it: the seed run's real tables once, and an E
    line per entry (its computation and key its own); the bytes written."""
    import hashlib

    lines = (seed / ".gkx-autocache" / "index").read_text().splitlines()
    tables = [ln for ln in lines if not ln.startswith("E\t")]
    template = next(ln for ln in lines if ln.startswith("E\t")).split("\t")
    meta = vdir / ".gkx-autocache"
    meta.mkdir(parents=True, exist_ok=True)
    with open(meta / "index", "w") as f:
        f.write("\n".join(tables) + "\n")
        for i in range(n):
            name, hex_ = synthetic_key(i).rsplit("-", 1)
            fields = [*template]
            fields[1], fields[2], fields[3] = name, hex_, str(int(time.time()) - i)
            fields[5] = hashlib.sha256(hex_.encode()).hexdigest()[:16]
            f.write("\t".join(fields) + "\n")
    return (meta / "index").stat().st_size


LIVE = r"""
import sys, time
from gkx_autocache._record import recorder as _stats
vdir, n = sys.argv[1], int(sys.argv[2])
rec = _stats.Recorder(vdir, ledger=True, run=_stats.begin_run())
keys = [f"jit_live{i}-" + f"{i:064x}" for i in range(100)]
for i in range(n):
    rec.hit(keys[i % 100], 3500, 0.25)
    rec.on_duration(_stats.RETRIEVAL, 0.001)
time.sleep(2.1)
rec.hit(keys[0], 3500, 0.25)
rec.on_duration(_stats.RETRIEVAL, 0.001)
print("ready", flush=True)
sys.stdin.readline()
"""

OTHER = r"""
import json, sys, time
from gkx_autocache._record import index as _index
from gkx_autocache._record import recorder as _stats
vdir = sys.argv[1]
started = time.perf_counter()
_index.load(vdir)  # its first miss reads the index and lists the directory, never a live ledger
first = time.perf_counter() - started
rec = _stats.Recorder(vdir, ledger=True, run=_stats.begin_run())
rec.miss("jit_other-" + "e" * 64)
rec.put("jit_other-" + "e" * 64, 3500, 0.02)
started = time.perf_counter()
_stats.finish(rec, 0)  # its exit: the fold (reads what it folds; of a live ledger, at most 1 MiB)
print(json.dumps({"first_miss": first, "exit": time.perf_counter() - started}))
"""


def bookkeeping(with_py: Path, entries: int, lookups: int, work: Path) -> dict[str, Any]:
    """The index at ``entries`` entries (bytes per entry, its load at a first miss); an exit against
    an index of 1 000 entries and of ``entries``; and another process's first miss, exit and
    ``status`` beside a live process that made ``lookups`` lookups of 100 keys, against one that
    made 100."""
    jax_version = sh(str(with_py), "-c", "import importlib.metadata as m; print(m.version('jax'))").stdout.strip()
    seed = work / "index-seed"
    sh(str(with_py), "-c", ORDINARY, env=base_env(GKX_JAX_CACHE_DIR=str(seed), HOME=str(work)))
    seed_vdir = seed / f"jax-{jax_version}"
    figures: dict[str, Any] = {}
    exits = {}
    for n in sorted({min(1000, entries), entries}):
        vdir = work / f"index-{n}" / f"jax-{jax_version}"
        synthetic(vdir, n, *real_entry(with_py, work))
        size = synthetic_index(vdir, n, seed_vdir)
        found = json.loads(sh(str(with_py), "-c", INDEX_LOAD, str(vdir), synthetic_key(n // 2), "5",
                              env=base_env()).stdout)
        figures[f"index of {n} entries: bytes per entry"] = round(size / n, 1)
        figures[f"index of {n} entries: first miss reads it and lists the directory"] = found["load"]
        exits[n] = statistics.median(json.loads(sh(str(with_py), "-c", OTHER, str(vdir), env=base_env()).stdout)["exit"]
                                     for _ in range(5))
        figures[f"index of {n} entries: an exit's fold"] = exits[n]
    for count in (100, lookups):
        vdir = work / f"live-{count}" / f"jax-{jax_version}"
        synthetic(vdir, 1000, *real_entry(with_py, work))
        synthetic_index(vdir, 1000, seed_vdir)
        live = subprocess.Popen([str(with_py), "-c", LIVE, str(vdir), str(count)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=base_env())
        try:
            assert live.stdout is not None and live.stdout.readline().strip() == "ready"
            ledger = sum(p.stat().st_size for p in (vdir / ".gkx-autocache" / "ledger").iterdir())
            figures[f"beside {count} lookups: the live process's ledger (bytes)"] = ledger
            others = [json.loads(sh(str(with_py), "-c", OTHER, str(vdir), env=base_env()).stdout) for _ in range(5)]
            figures[f"beside {count} lookups: another process's first miss"] = statistics.median(o["first_miss"] for o in others)
            figures[f"beside {count} lookups: another process's exit"] = statistics.median(o["exit"] for o in others)
            env = base_env(GKX_JAX_CACHE_DIR=str(vdir.parent), HOME=str(work))
            figures[f"beside {count} lookups: status"] = statistics.median(
                timed([str(with_py), "-m", "gkx_autocache", "status"], env) for _ in range(3))
        finally:
            assert live.stdin is not None and live.stdout is not None
            live.stdin.close()
            live.wait(timeout=60)
            live.stdout.close()
    return figures
# -- levels (SPEC §14) ---------------------------------------------------------------------------


def remote_venvs(work: Path) -> tuple[Path, Path]:
    """(with, without) as in ``make_venvs``, but seeing the runner's whole site-packages, the
    ``remote`` extra (fsspec, s3fs, etils) included: a bucket needs it."""
    (wheel,) = (work / "wheel").glob("*.whl")
    pythons = []
    for name in ("with-remote", "without-remote"):
        venv = work / name
        if (venv / "bin" / "python").exists():  # made by an earlier section of this run
            pythons.append(venv / "bin" / "python")
            continue
        sh(sys.executable, "-m", "uv", "venv", "-q", "--python", sys.executable, str(venv))
        python = venv / "bin" / "python"
        site = sh(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
        Path(site, "zz_bench_deps.pth").write_text(f"{RUNNER_SITE}\n")
        if name == "with-remote":
            sh(sys.executable, "-m", "uv", "pip", "install", "-q", "--no-deps", "--python", str(python), str(wheel))
        pythons.append(python)
    return pythons[0], pythons[1]


def moto(work: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """moto's S3 server on a free port of 127.0.0.1, and the environment that reaches it."""
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    sys.path.insert(0, str(ROOT / "tests"))
    import servers  # (it dies with this process, however this process ends)

    server = servers.start([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(endpoint, timeout=2).close()
            break
        except OSError:
            time.sleep(0.2)
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/bench", method="PUT"), timeout=10).close()  # the bucket
    return server, env


def cpu_secs(pid: int) -> float:
    """A process's CPU time (user and system), from /proc; 0 where there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def run_json(python: Path, code: list[str], env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    """Wall time and the child's last JSON line, with its CPU time (user and system, all its threads)
    under ``"cpu"``: far steadier than wall time on a machine other work shares."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run([str(python), *code], env=env, capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = dict(json.loads(proc.stdout.strip().splitlines()[-1]))
    out["cpu"] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return seconds, out


def levels(work: Path, functions: int, runs: int) -> dict[str, Any]:
    """The demo workload in fresh processes, each configuration's median of ``runs`` (interleaved
    round by round, so that drift hits all alike). Every cold run gets an empty prefix of its own,
    every "from the bucket" run a fresh local directory."""
    with_py, without_py = remote_venvs(work)
    code = demo_program(work, functions)
    server, s3 = moto(work)
    try:
        base = base_env(HOME=str(work), **s3)
        filled = "s3://bench/filled"
        configs: dict[str, tuple[Path, Any]] = {
            "warm, no shared level": (with_py, lambda i: {"GKX_JAX_CACHE_DIR": str(work / "lv-plain")}),
            "warm, from the local level (shared set)": (with_py, lambda i: {
                "GKX_JAX_CACHE_DIR": str(work / "lv-local"), "GKX_JAX_CACHE_SHARED": filled}),
            "warm, from the bucket alone (fresh local level)": (with_py, lambda i: {
                "GKX_JAX_CACHE_DIR": str(work / f"lv-fresh-{i}"), "GKX_JAX_CACHE_SHARED": filled}),
            "warm, raw JAX with the bucket as its dir (threshold 0)": (without_py, lambda i: {
                "JAX_COMPILATION_CACHE_DIR": "s3://bench/raw", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1", "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none"}),
            "cold, no shared level": (with_py, lambda i: {"GKX_JAX_CACHE_DIR": str(work / f"lv-cold-plain-{i}")}),
            "cold, an empty bucket, uploads on": (with_py, lambda i: {
                "GKX_JAX_CACHE_DIR": str(work / f"lv-cold-up-{i}"), "GKX_JAX_CACHE_SHARED": f"s3://bench/cold-up-{i}"}),
            "cold, an empty bucket, shared_write = never": (with_py, lambda i: {
                "GKX_JAX_CACHE_DIR": str(work / f"lv-cold-never-{i}"),
                "GKX_JAX_CACHE_SHARED": f"s3://bench/cold-never-{i}", "GKX_JAX_CACHE_SHARED_WRITE": "never"}),
        }
        # Fill: the bucket (through a local level that is then warm too), the plain local level, raw JAX's bucket.
        for name in ("warm, from the local level (shared set)", "warm, no shared level",
                     "warm, raw JAX with the bucket as its dir (threshold 0)"):
            python, env = configs[name]
            run_json(python, code, {**base, **env(-1)})
        times: dict[str, list[float]] = {name: [] for name in configs}
        hits: dict[str, list[float]] = {name: [] for name in configs}
        server_cpu: dict[str, list[float]] = {name: [] for name in configs}  # moto's, on this same machine
        cpu: dict[str, list[float]] = {name: [] for name in configs}
        for i in range(runs):
            for name, (python, env) in configs.items():
                before = cpu_secs(server.pid)
                seconds, out = run_json(python, code, {**base, **env(i)})
                server_cpu[name].append(cpu_secs(server.pid) - before)
                times[name].append(seconds)
                cpu[name].append(out["cpu"])
                hits[name].append(out["hits"])
        requests = json.loads(sh(str(with_py), "-m", "gkx_autocache", "--json", "stats", env={
            **base, **configs["cold, an empty bucket, uploads on"][1](runs - 1)}).stdout)["levels"]["shared"]
        out = run_json(with_py, code, {**base, **configs["cold, no shared level"][1](-2)})[1]
    finally:
        server.terminate()
        server.wait(timeout=30)
    results: dict[str, Any] = {name: {"median": statistics.median(t), "min": min(t), "max": max(t),
                                      "hits": statistics.median(hits[name]), "compiles": out["requests"],
                                      "server_cpu": statistics.median(server_cpu[name]),
                                      "cpu": statistics.median(cpu[name])}
                               for name, t in times.items()}
    results["cold requests"] = {"requests": requests["requests"], "uploads": requests["uploads"],
                                "misses": requests["misses"]}
    results["ratios"] = {}  # per round (the two runs side by side in time): median and spread
    for label, a, b in LEVEL_RATIOS:
        per_round = sorted(x / y for x, y in zip(times[a], times[b], strict=True))
        results["ratios"][label] = {"median": statistics.median(per_round), "min": per_round[0], "max": per_round[-1],
                                    "cpu": statistics.median(cpu[a]) / statistics.median(cpu[b])}
    results["runs"] = runs
    return results


# N jitted functions, an entry each, as a program that compiles many small things (a test suite, a
# model's many layers) looks to the cache.
# JAX's own count of a run's cache lookups and hits, which each program prints.
COUNTING = r"""counts = {"requests": 0, "hits": 0}
def listen(event, *a, **k):
    if event == "/jax/compilation_cache/compile_requests_use_cache": counts["requests"] += 1
    elif event == "/jax/compilation_cache/cache_hits": counts["hits"] += 1
jax.monitoring.register_event_listener(listen)
"""
MANY = r"""
import json, sys
import jax, jax.numpy as jnp
""" + COUNTING + r"""x = jnp.linspace(0.0, 1.0, 64)
total = 0.0
for i in range(int(sys.argv[1])):
    total += float(jax.jit(lambda v, c=float(i + 1): jnp.tanh(v * c).sum() + c)(x))
print(json.dumps({**counts, "result": round(total, 3)}))
"""
# A short program as a user writes one (SHORT: 62 entries; a warm run of about 2.3 s on 2 cores, of
# which `import jax` is 1.1 s): data, an MLP's layers, a loss and its gradient, Adam, gradient
# clipping, a few metrics, attention and a recurrent rollout by lax.scan at a few sizes, and the
# eager operations between them; every compile is a cache entry. The levels' fixed costs (the
# client's imports and start, the listing, the landing) are the largest share of a run this short.
SHORT = r"""
import json
import jax, jax.numpy as jnp
""" + COUNTING + r"""WIDTHS = (32, 128, 64, 10)

@jax.jit
def init_layer(key, w_in, b_in):
    k1, _ = jax.random.split(key)
    return jax.random.normal(k1, w_in.shape) * jnp.sqrt(2.0 / w_in.shape[0]), jnp.zeros_like(b_in)

def init(key):
    params = []
    for d_in, d_out in zip(WIDTHS[:-1], WIDTHS[1:]):
        key, sub = jax.random.split(key)
        params.append(init_layer(sub, jnp.empty((d_in, d_out)), jnp.empty((d_out,))))
    return params

@jax.jit
def dense(p, x):
    w, b = p
    return x @ w + b

@jax.jit
def gelu_dense(p, x):
    return jax.nn.gelu(dense(p, x))

@jax.jit
def layer_norm(x):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)

def forward(params, x):
    for p in params[:-1]:
        x = layer_norm(gelu_dense(p, x))
    return dense(params[-1], x)

def mlp(params, x):
    for p in params[:-1]:
        w, b = p
        x = jax.nn.gelu(x @ w + b)
        mu = x.mean(-1, keepdims=True)
        x = (x - mu) / jnp.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    w, b = params[-1]
    return x @ w + b

def loss_fn(params, x, y):
    logits = mlp(params, x)
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, logits.shape[-1]), -1))

loss = jax.jit(loss_fn)
grad = jax.jit(jax.value_and_grad(loss_fn))

@jax.jit
def adam(params, grads, m, v, t):
    lr, b1, b2 = 1e-3, 0.9, 0.999
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
    mh = jax.tree.map(lambda m: m / (1 - b1 ** t), m)
    vh = jax.tree.map(lambda v: v / (1 - b2 ** t), v)
    return jax.tree.map(lambda p, a, b: p - lr * a / (jnp.sqrt(b) + 1e-8), params, mh, vh), m, v

@jax.jit
def train_step(params, m, v, t, x, y):
    value, grads = jax.value_and_grad(loss_fn)(params, x, y)
    params, m, v = adam(params, grads, m, v, t)
    return params, m, v, value

@jax.jit
def accuracy(params, x, y):
    return jnp.mean(jnp.argmax(mlp(params, x), -1) == y)

@jax.jit
def clip_by_norm(grads):
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    return jax.tree.map(lambda g: g * jnp.minimum(1.0, 1.0 / (norm + 1e-6)), grads)

@jax.jit
def attention(q, k, v):
    s = q @ k.swapaxes(-1, -2) / jnp.sqrt(q.shape[-1])
    return jax.nn.softmax(s, -1) @ v

@jax.jit
def rollout(q):
    n = q.shape[0]
    w, h0, xs = jnp.eye(n) * 0.5 + q @ q.T / n ** 2, jnp.zeros(n), jnp.ones((50, n))
    def cell(h, x):
        h = jnp.tanh(h @ w + x)
        return h, h.sum()
    h, trace = jax.lax.scan(cell, h0, xs)
    return h.sum() + trace.sum()

@jax.jit
def schedule(step):
    return 1e-3 * jnp.minimum(1.0, step / 100.0) * 0.5 * (1 + jnp.cos(jnp.pi * jnp.minimum(step, 1000) / 1000))

@jax.jit
def l2(p):
    return jnp.sqrt(jnp.sum(p * p))

@jax.jit
def normalise(x):
    return (x - x.mean(0)) / (x.std(0) + 1e-6)

@jax.jit
def make_data(key):
    kx, ky = jax.random.split(key)
    return jax.random.normal(kx, (256, WIDTHS[0])), jax.random.randint(ky, (256,), 0, WIDTHS[-1])

total = 0.0
key = jax.random.PRNGKey(0)
x, y = make_data(key)
x = normalise(x)
params = init(key)
m = jax.tree.map(jnp.zeros_like, params)
v = jax.tree.map(jnp.zeros_like, params)
for batch in (32, 128):  # the batch sizes a short script tries
    xb, yb = x[:batch], y[:batch]
    value, grads = grad(params, xb, yb)
    grads = clip_by_norm(grads)
    params, m, v = adam(params, grads, m, v, 1.0)
    for t in range(2):
        params, m, v, value = train_step(params, m, v, float(t + 2), xb, yb)
        total += float(value)
total += float(schedule(2.0)) + float(loss(params, xb, yb)) + float(accuracy(params, xb, yb))
total += float(forward(params, x[:32])[0, 0])  # the layers one by one, on one batch
for leaf in jax.tree.leaves(params):  # a norm per parameter, as a log line has them
    total += float(l2(leaf))
for n in (8, 16, 32, 64):
    q = jnp.linspace(0.0, 1.0, n * 16).reshape(n, 16)
    total += float(attention(q, q, q).sum())
    total += float(rollout(q))
print(json.dumps({**counts, "result": round(total, 3)}))
"""
PREFETCH_ROWS = ("fresh machine, from the bucket", "local warm (shared set)", "raw JAX, s3:// as its dir")


def prefetch(work: Path, sizes: tuple[int | str, ...], delays: tuple[float, ...], runs: dict[int | str, int]) -> dict[str, Any]:
    """Per program (``MANY`` of N functions, or ``"short"``: ``SHORT``) and added delay: a fresh machine's warm run from the bucket (a fresh local
    level each run, the package's defaults), a local warm run with the same shared level set, and
    raw JAX reading the bucket as its dir, medians of interleaved rounds, every request to the
    bucket through a proxy on 127.0.0.1 that waits ``delay`` before forwarding it. The cold run
    (no shared level) is measured once per size: it does not read the bucket."""
    sys.path.insert(0, str(ROOT / "tests"))
    from hostile import Proxy

    with_py, without_py = remote_venvs(work)
    script = work / "many.py"
    script.write_text(MANY)
    (work / "short.py").write_text(SHORT)
    server, s3 = moto(work)
    port = int(s3["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
    raw = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
           "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none"}
    results: dict[str, Any] = {}
    try:
        base = base_env(HOME=str(work), **s3)
        for n in sizes:
            code = [str(work / "short.py")] if n == "short" else [str(script), str(n)]
            shared = f"s3://bench/prefetch-{n}"
            cold, out = run_json(with_py, code, {**base, "GKX_JAX_CACHE_DIR": str(work / f"pf-cold-{n}")})
            run_json(with_py, code, {**base, "GKX_JAX_CACHE_DIR": str(work / f"pf-local-{n}"), "GKX_JAX_CACHE_SHARED": shared})
            run_json(without_py, code, {**base, **raw, "JAX_COMPILATION_CACHE_DIR": f"s3://bench/prefetch-raw-{n}"})
            for delay in delays:
                proxy = Proxy(port, delay=delay)
                through = {**base, "AWS_ENDPOINT_URL": proxy.endpoint}
                configs = {  # "{i}": the round
                    PREFETCH_ROWS[0]: (with_py, {"GKX_JAX_CACHE_DIR": str(work / f"pf-fresh-{n}-{delay}-{{i}}"),
                                                 "GKX_JAX_CACHE_SHARED": shared}),
                    PREFETCH_ROWS[1]: (with_py, {"GKX_JAX_CACHE_DIR": str(work / f"pf-local-{n}"), "GKX_JAX_CACHE_SHARED": shared}),
                    PREFETCH_ROWS[2]: (without_py, {**raw, "JAX_COMPILATION_CACHE_DIR": f"s3://bench/prefetch-raw-{n}"}),
                }
                times: dict[str, list[float]] = {name: [] for name in configs}
                hits: dict[str, list[float]] = {name: [] for name in configs}
                cpu: dict[str, list[float]] = {name: [] for name in configs}
                server_cpu: dict[str, list[float]] = {name: [] for name in configs}  # moto's, on these same cores
                try:
                    for i in range(runs[n]):
                        for name, (python, env) in configs.items():
                            before = cpu_secs(server.pid)
                            seconds, got = run_json(python, code, {**through, **{k: v.format(i=i) for k, v in env.items()}})
                            server_cpu[name].append(cpu_secs(server.pid) - before)
                            times[name].append(seconds)
                            hits[name].append(got["hits"])
                            cpu[name].append(got["cpu"])
                    fresh_stats = json.loads(sh(str(with_py), "-m", "gkx_autocache", "--json", "stats", env={
                        **base, "GKX_JAX_CACHE_DIR": str(work / f"pf-fresh-{n}-{delay}-{runs[n] - 1}"),
                        "GKX_JAX_CACHE_SHARED": shared}).stdout)["levels"]["shared"]
                finally:
                    proxy.close()
                per_round = sorted(a / b for a, b in zip(times[PREFETCH_ROWS[0]], times[PREFETCH_ROWS[1]], strict=True))
                program = "the short program" if n == "short" else f"{n} entries"
                results[f"{program}, +{delay * 1000:.0f} ms"] = {
                    "program": "SHORT" if n == "short" else "MANY",
                    "entries": out["requests"], "delay_ms": delay * 1000, "cold": cold, "runs": runs[n],
                    **{name: {"median": statistics.median(t), "min": min(t), "max": max(t),
                              "hits": statistics.median(hits[name]), "cpu": statistics.median(cpu[name]),
                              "server_cpu": statistics.median(server_cpu[name])} for name, t in times.items()},
                    "fresh / local warm": {"median": statistics.median(per_round), "min": per_round[0], "max": per_round[-1]},
                    "prefetched": fresh_stats["prefetched"], "prefetch_used": fresh_stats["prefetch_used"],
                    "prefetch_wasted_bytes": fresh_stats["prefetch_wasted_bytes"]}
    finally:
        server.terminate()
        server.wait(timeout=30)
    return results


# -- the levels' fixed costs, as alternated pairs ---------------------------------------------------
# Two figures of a short program (SHORT), each A against B in fresh processes, A, B, A, B...: the
# ratio is taken per pair (the two runs side by side in time), so that drift on a shared machine
# hits both alike. Targets: (a) 1.02, (b) 1.15.
PAIR_FIGURES = (
    ("a", "(a) a warm writer, with a bucket / without", 1.02,
     "warm writer, shared set (every lookup local)", "warm, no shared level"),
    ("a_slow", "(a) the same, every request +{ms} ms", 1.02,
     "warm writer, shared set (every lookup local)", "warm, no shared level"),
    ("b", "(b) a fresh machine / local warm, every request +{ms} ms", 1.15,
     "fresh machine, from the bucket", "local warm (shared set)"),
)


def machine_busy() -> float:
    """CPU seconds this machine has spent busy (all processes, all cores), from /proc/stat; 0 where
    there is none."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle and iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu(server_pid: int) -> float:
    """CPU seconds of this process (the proxy's threads), its waited-for children, and moto."""
    import resource

    mine, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime + cpu_secs(server_pid)


def measured(python: Path, code: list[str], env: dict[str, str]) -> dict[str, float]:
    """One fresh process: its wall time, its own CPU time (user and system, all its threads) and
    peak resident memory (``wait4``'s, this process alone), and its JSON line's hits and requests."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen([str(python), *code], env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode:
            raise RuntimeError(f"{code} exited {proc.returncode}:\n{err.read().decode(errors='replace')[-3000:]}")
        got = json.loads(out.read().decode().strip().splitlines()[-1])
    return {"wall": seconds, "cpu": usage.ru_utime + usage.ru_stime, "rss": usage.ru_maxrss * 1024.0,
            "hits": got["hits"], "requests": got["requests"]}


def level_pairs(work: Path, pairs: int, delay: float = 0.02, with_py: Path | None = None,
                http: bool = False, via_proxy: bool = False, process: bool = False,
                only: tuple[str, ...] = (), warm_up: bool = True, azure: bool = False) -> dict[str, Any]:
    """The figures of ``PAIR_FIGURES``, ``pairs`` alternated pairs each, rounds interleaved across
    figures, against moto on 127.0.0.1 (``delay``: through ``hostile.Proxy``, which waits that long
    before forwarding each request). A bucket is filled once by a writer's cold run (its entries,
    its manifest and its pack), which leaves that writer's local level warm; a plain local level is
    filled alongside. Every "fresh machine" run gets an empty local level of its own. One run of
    each configuration before the pairs is not counted (the page cache, moto's first requests).
    ``http``: nginx with WebDAV (``tests/webdav.py``) as an HTTP cache in place of the bucket;
    ``azure``: Azurite (``tests/blobs.py``) as an Azure container, Shared Key from a connection string;
    ``via_proxy``: every request of the levels through a real forward proxy (tinyproxy,
    ``tests/forward.py``, named by ``HTTP_PROXY``) in front of the delaying one; ``process``: the
    bucket's keys from a ``credential_process`` profile (botocore's session resolves it), none in the
    environment; ``only``: these figures (``a``, ``a_slow``, ``b``), not all; ``warm_up``: False
    leaves out the uncounted runs (for ``--quick``, whose timings nothing reads)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from hostile import Proxy

    if with_py is None:
        with_py = remote_venvs(work)[0]
    code = [str(work / "pairs-short.py")]
    Path(code[0]).write_text(SHORT)
    if http:
        from webdav import Nginx

        server: Any = Nginx(work / "nginx")
        proxy = Proxy(server.port, delay=delay)
        shared = server.url
        base = base_env(HOME=str(work))
        slow = {**base, "GKX_JAX_CACHE_SHARED": shared.replace(f":{server.port}/", f":{proxy.port}/")}
        server_pid = server.process.pid
    elif azure:
        from blobs import Azurite

        server = Azurite(work / "azurite")
        proxy = Proxy(server.port, delay=delay)
        shared = f"az://{server.container()}/pairs"
        said = server.connection_string()
        base = base_env(HOME=str(work), AZURE_STORAGE_CONNECTION_STRING=said)
        slow = {**base, "AZURE_STORAGE_CONNECTION_STRING": said.replace(f":{server.port}/", f":{proxy.port}/")}
        server_pid = server.process.pid
    else:
        server, s3 = moto(work)
        proxy = Proxy(int(s3["AWS_ENDPOINT_URL"].rsplit(":", 1)[1]), delay=delay)
        shared = "s3://bench/pairs"
        base = base_env(HOME=str(work), **s3)
        slow = {**base, "AWS_ENDPOINT_URL": proxy.endpoint}
        server_pid = server.pid
    forward = None
    if via_proxy:
        from forward import Tinyproxy

        forward = Tinyproxy(work / "tinyproxy")
        slow = {**slow, "HTTP_PROXY": forward.url, "HTTPS_PROXY": forward.url}
    if process and not http:
        keys = {name: base.pop(name) for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        for env in (slow,):
            for name in keys:
                env.pop(name, None)
        said = json.dumps({"Version": 1, "AccessKeyId": keys["AWS_ACCESS_KEY_ID"],
                           "SecretAccessKey": keys["AWS_SECRET_ACCESS_KEY"]})
        (work / "keys.py").write_text(f"print({said!r})\n")
        (work / "aws-config").write_text(f"[profile bench]\ncredential_process = {with_py} {work / 'keys.py'}\n")
        profile = {"AWS_CONFIG_FILE": str(work / "aws-config"), "AWS_PROFILE": "bench",
                   "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}
        base.update(profile)
        slow.update(profile)
    try:
        writer = {"GKX_JAX_CACHE_DIR": str(work / "pairs-writer"), "GKX_JAX_CACHE_SHARED": shared}
        plain = {"GKX_JAX_CACHE_DIR": str(work / "pairs-plain")}

        def fresh(i: int | str) -> dict[str, str]:
            return {"GKX_JAX_CACHE_SHARED": shared, **slow, "GKX_JAX_CACHE_DIR": str(work / f"pairs-fresh-{i}")}

        envs: dict[str, tuple[Any, Any]] = {
            "a": (lambda i: {**base, **writer}, lambda i: {**base, **plain}),
            "a_slow": (lambda i: {**writer, **slow}, lambda i: {**slow, **plain}),
            "b": (fresh, lambda i: {**writer, **slow}),
        }
        envs = {name: pair for name, pair in envs.items() if not only or name in only}
        cold = measured(with_py, code, {**base, **writer})
        measured(with_py, code, {**base, **plain})
        for a, b in envs.values() if warm_up else ():  # not counted
            measured(with_py, code, a("warm-up"))
            measured(with_py, code, b("warm-up"))
        runs: dict[str, dict[str, list[dict[str, float]]]] = {name: {"A": [], "B": []} for name in envs}
        busy, own, started = machine_busy(), own_cpu(server_pid), time.perf_counter()
        for i in range(pairs):
            for name, (a, b) in envs.items():
                for side, env in (("A", a), ("B", b)):
                    before = cpu_secs(server_pid)
                    got = measured(with_py, code, env(i))
                    got["server_cpu"] = cpu_secs(server_pid) - before
                    runs[name][side].append(got)
        elapsed = time.perf_counter() - started
        others = max(machine_busy() - busy - (own_cpu(server_pid) - own), 0.0)
        stats = json.loads(sh(str(with_py), "-m", "gkx_autocache", "--json", "stats", env=fresh(pairs - 1)).stdout)
    finally:
        proxy.close()
        if forward is not None:
            forward.close()
        if http or azure:
            server.close()
        else:
            server.terminate()
            server.wait(timeout=30)
    results: dict[str, Any] = {"server": ("nginx (HTTP)" if http else "Azurite (Azure Blob)" if azure else "moto (S3)")
                               + (", through tinyproxy" if via_proxy else "")
                               + (", keys from a credential_process profile" if process else ""), "pairs": pairs, "delay_ms": delay * 1000, "entries": cold["requests"],
                               "cold": cold["wall"], "figures": {}, "seconds_measured": elapsed,
                               "others_cpu": others, "cores": os.cpu_count()}
    for name, label, target, a_name, b_name in PAIR_FIGURES:
        if name not in runs:
            continue
        a, b = runs[name]["A"], runs[name]["B"]

        def med(side: list[dict[str, float]], field: str) -> float:
            return statistics.median(run[field] for run in side)

        per_pair = sorted(x["wall"] / y["wall"] for x, y in zip(a, b, strict=True))
        results["figures"][name] = {
            "label": label.format(ms=f"{delay * 1000:.0f}"), "target": target, "A": a_name, "B": b_name,
            "ratio": {"median": statistics.median(per_pair), "min": per_pair[0], "max": per_pair[-1]},
            "cpu_ratio": statistics.median(x["cpu"] / y["cpu"] for x, y in zip(a, b, strict=True)),
            **{f"{field}_{side}": med(side_runs, field) for side, side_runs in (("A", a), ("B", b))
               for field in ("wall", "cpu", "rss", "hits", "server_cpu")},
            "rss_added": statistics.median(x["rss"] - y["rss"] for x, y in zip(a, b, strict=True)),
            "walls": {"A": [round(x["wall"], 3) for x in a], "B": [round(y["wall"], 3) for y in b]},
        }
    shared_stats = stats["levels"]["shared"]
    results["fresh machine's last run"] = {k: shared_stats.get(k, 0) for k in (
        "hits", "misses", "requests", "prefetched", "prefetch_used", "prefetch_wasted_bytes", "uploads")}
    return results


def pairs_table(r: dict[str, Any]) -> str:
    rows = [f"| levels' fixed costs: the short program ({r['entries']} entries), alternated pairs of fresh processes "
            "(A, B, A, B...) | A: median (range) | B: median (range) | A / B per pair: median (range) | target | "
            "CPU A / B per pair: median | peak memory, A - B |", "|---|---|---|---|---|---|---|"]
    for f in r["figures"].values():
        walls = f["walls"]
        rows.append(f"| {f['label']} (median of {r['pairs']} pairs) | {f['wall_A']:.2f} s ({min(walls['A']):.2f}-"
                    f"{max(walls['A']):.2f}) | {f['wall_B']:.2f} s ({min(walls['B']):.2f}-{max(walls['B']):.2f}) | "
                    f"{f['ratio']['median']:.3f} ({f['ratio']['min']:.3f}-{f['ratio']['max']:.3f}) | "
                    f"<= {f['target']:.2f} | {f['cpu_ratio']:.3f} | {f['rss_added'] / (1 << 20):+.0f} MiB |")
    if "others_cpu" in r:  # other work on the machine meanwhile: what the spread may owe to it
        rows.append(f"| other processes' CPU time during the pairs | {r['others_cpu']:.1f} s in {r['seconds_measured']:.0f} s "
                    f"({r['others_cpu'] / max(r['seconds_measured'], 1e-9):.2f} of {r['cores']} cores) | | | | | |")
    return "\n".join(rows)


LEVEL_RATIOS = (
    ("warm from the local level, shared set / no shared level", "warm, from the local level (shared set)",
     "warm, no shared level"),
    ("warm from the bucket alone / raw JAX with the bucket as its dir", "warm, from the bucket alone (fresh local level)",
     "warm, raw JAX with the bucket as its dir (threshold 0)"),
    ("cold against an empty bucket / no shared level", "cold, an empty bucket, uploads on", "cold, no shared level"),
    ("the uploads' cost: uploads on / shared_write = never", "cold, an empty bucket, uploads on",
     "cold, an empty bucket, shared_write = never"),
)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def millions(count: float) -> str:
    return f"{count / 1e6:.2f} M"


def table(r: dict[str, Any]) -> str:
    rows = [f"Machine: {r['machine']}; Python {r['python']}; JAX {r['jax']}; {r['date']}; `{r['command']}`"]
    for name, when in r.get("measured", {}).items():
        if (when["date"], when["command"]) != (r["date"], r["command"]):
            machine = f"; machine: {when['machine']}" if when["machine"] != r["machine"] else ""
            rows.append(f"{name.replace('_', ' ').capitalize()} rows: {when['date']}; `{when['command']}`{machine}")
    rows += ["", "| measure | with gkx-autocache | without | ratio |", "|---|---|---|---|"]
    for case, f in r.get("startup", {}).items():
        if case in ("extra_modules", "young_collections"):
            continue
        rows.append(f"| `python -c pass`, {case} | {ms(f['with'])} | {ms(f['without'])} | "
                    f"{f['with'] / f['without']:.3f} ({(f['with'] - f['without']) * 1000:+.1f} ms) |")
    counts = r.get("startup_instructions", {})
    if "skipped" in counts:
        rows.append(f"| `python -c pass`, instructions | skipped: {counts['skipped']} | | |")
    for case, f in ((c, f) for c, f in counts.items() if c not in ("skipped", "reference lines")):
        rows.append(f"| `python -c pass`, {case}, instructions | {millions(f['with'])} | {millions(f['without'])} | "
                    f"{f['with'] / f['without']:.3f} ({(f['with'] - f['without']) / 1e6:+.2f} M) |")
    for case, f in counts.get("reference lines", {}).items():
        rows.append(f"| for reference, instead of the package: {case} | {millions(f['with'])} | {millions(f['without'])} | "
                    f"{f['with'] / f['without']:.3f} ({(f['with'] - f['without']) / 1e6:+.2f} M) |")
    for case, f in r.get("import_jax", {}).items():
        rows.append(f"| `import jax`, {case} | {ms(f['with'])} | {ms(f['without'])} | {f['with'] / f['without']:.3f}"
                    f" (configuring: {ms(f['configure'])} in-process) |")
    if "startup" in r:
        rows.append(f"| modules added at start-up | {', '.join(r['startup']['extra_modules']) or 'none'} | | |")
        if "young_collections" in r["startup"]:
            young = r["startup"]["young_collections"]
            rows.append(f"| young-generation garbage collections at start-up | {young['with']} | {young['without']} | |")
    if "workload" in r:
        rows += ["", "| workload (demo program, fresh processes) | cold | warm | warm / cold | warm hits | load per entry |",
                 "|---|---|---|---|---|---|"]
        for name, w in r["workload"].items():
            rows.append(f"| {name} | {w['cold']:.2f} s | {w['warm']:.2f} s | {w['warm'] / w['cold']:.2f} | "
                        f"{w['warm_hits']:.0f} of {w['warm_requests']:.0f} | {ms(w['load_per_entry'])} |")
    if "warm_vs_raw" in r:
        rows += ["", "| warm run (demo program), interleaved | gkx-autocache | JAX stock cache, threshold 0 | ratio |",
                 "|---|---|---|---|"]
        for case, w in r["warm_vs_raw"].items():
            rows.append(f"| {case}: median of {w['pairs']} pairs (per-pair ratio {w['ratio_min']:.3f} to "
                        f"{w['ratio_max']:.3f}) | {w['ours']:.2f} s | {w['raw']:.2f} s | {w['ratio']:.3f} |")
    if "own_time" in r:
        raw = r.get("warm_vs_raw", {})
        rows += ["", f"| the package's own time in one warm run (medians of {r.get('own_time_runs', 5)}) | total | of raw JAX's warm run | "
                 "imports | configure | store reads | JAX's events | explain seam | at exit |", "|---|---|---|---|---|---|---|---|---|"]
        for case, f in r["own_time"].items():
            share = f"{f['total'] / raw[case]['raw']:.1%}" if case in raw else ""
            rows.append(f"| {case} | {ms(f['total'])} | {share} | " + " | ".join(
                ms(f.get(k, 0.0)) for k in ("imports", "configure", "store", "events", "explain", "exit")) + " |")
    if "key_time" in r:
        k = r["key_time"]
        rows += ["", "| JAX's key computation, in-process, per key | microseconds |", "|---|---|",
                 f"| plain JAX | {k['plain'] * 1e6:.0f} |",
                 f"| with the explanation seam (every key: what a hit pays) | {k['wrapped'] * 1e6:.0f} |",
                 f"| added on a miss (parts hashed alone, cause decided) | {k['miss_extra'] * 1e6:.0f} |"]
        if "plain_30_layers" in k:
            rows += [f"| a function of 30 layers: plain JAX | {k['plain_30_layers'] * 1e6:.0f} |",
                     f"| a function of 30 layers: added on a miss | {k['miss_extra_30_layers'] * 1e6:.0f} |"]
        if "first_misses_once" in k:
            rows.append(f"| once per process, at its first misses (the explainer imported, bytecode present; JAX's source read; the compile options' fields) | "
                        f"{k['first_misses_once'] * 1e6:.0f} |")
    if "saved_contention" in r:
        c = r["saved_contention"]
        rows += ["", "| the same warm run's compile CPU time avoided | seconds |", "|---|---|"]
        rows += [f"| {name} | {secs:.2f} |" for name, secs in c.items()]
    if "levels" in r:
        lv = r["levels"]
        rows += ["", f"| levels, demo program against moto on 127.0.0.1 (median of {lv['runs']}) | wall time | range | "
                 "CPU time | compiles served | moto's CPU time, on this machine |", "|---|---|---|---|---|---|"]
        for name, f in lv.items():
            if isinstance(f, dict) and "median" in f and "compiles" in f:
                rows.append(f"| {name} | {f['median']:.2f} s | {f['min']:.2f}-{f['max']:.2f} s | {f.get('cpu', 0.0):.2f} s | "
                            f"{f['hits']:.0f} of {f['compiles']} | {f.get('server_cpu', 0.0):.2f} s |")
        rows += ["", "| levels, ratios | wall time, per round: median | range | CPU time, medians |", "|---|---|---|---|"]
        for label, f in lv["ratios"].items():
            rows.append(f"| {label} | {f['median']:.3f} | {f['min']:.3f}-{f['max']:.3f} | {f.get('cpu', 0.0):.3f} |")
        c = lv["cold requests"]
        rows.append(f"| a cold run's requests to the bucket | {c['requests']} for {c['misses']} misses and "
                    f"{c['uploads']} uploads | | |")
    if "prefetch" in r:
        rows += ["", "| prefetch: entries, added per request | cold, no shared level | fresh machine, from the bucket | "
                 "local warm (shared set) | raw JAX, s3:// as its dir | fresh / local warm, per round | "
                 "prefetched (used, wasted) |", "|---|---|---|---|---|---|---|"]
        for f in r["prefetch"].values():
            cells = " | ".join(f"{f[row]['median']:.2f} s ({f[row]['min']:.2f}-{f[row]['max']:.2f})" for row in PREFETCH_ROWS)
            ratio = f["fresh / local warm"]
            program = f"the short program ({f['entries']} entries)" if f.get("program") == "SHORT" else f"{f['entries']} entries"
            rows.append(f"| {program}, +{f['delay_ms']:.0f} ms (median of {f['runs']}) | {f['cold']:.2f} s | "
                        f"{cells} | {ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f}) | "
                        f"{f['prefetched']} ({f['prefetch_used']}, {f['prefetch_wasted_bytes']} B) |")
    if "pairs" in r:
        rows += ["", pairs_table(r["pairs"])]
    if "pairs_http" in r:
        rows += ["", "The same with an HTTP cache (nginx with WebDAV) in place of the bucket:", "", pairs_table(r["pairs_http"])]
    if "cli" in r:
        rows += ["", f"| CLI on {r['cli_entries']:,} entries | seconds |", "|---|---|"]
        rows += [f"| `gkx-autocache {c}` | {s:.2f} |" for c, s in r["cli"].items()]
        rows.append(f"| at-exit fold and prune to 90 % of the cap, {r['prune_entries']:,} entries | {r['prune_at_exit']:.3f} |")
    if "bookkeeping" in r:
        rows += ["", "| the bookkeeping (explanations' index; beside a long-lived process) | figure |", "|---|---|"]
        for name, value in r["bookkeeping"].items():
            shown = f"{value:,.0f}" if "bytes" in name else f"{value:.1f}" if "per entry" in name else ms(value)
            rows.append(f"| {name} | {shown} |")
    return "\n".join(rows)


SECTIONS = ("startup", "import_jax", "workload", "explain", "cli", "bookkeeping", "levels")


@contextlib.contextmanager
def work_folder() -> Iterator[Path]:
    """A temporary folder for the environments and caches (about 45 MB), removed however the run
    ends: a Ctrl-C, or a SIGTERM (which ``tests/servers.run`` sends an interrupted runner); the
    signals are ignored while it is removed, so a second one does not leave it half there."""
    import signal

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupted)
    work = Path(tempfile.mkdtemp(prefix="gkx-bench-"))
    try:
        yield work
    finally:
        handlers = [signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)]
        try:
            shutil.rmtree(work, ignore_errors=True)
        finally:
            signal.signal(signal.SIGINT, handlers[0])
            signal.signal(signal.SIGTERM, before)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny run, for the smoke test")
    parser.add_argument("--only", action="append", choices=SECTIONS, help="measure only this section (repeatable)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results.json"))
    args = parser.parse_args(argv)
    quick = args.quick
    sections = args.only or list(SECTIONS)
    command = "python benchmarks/run.py" + (" --quick" if quick else "") + "".join(f" --only {s}" for s in args.only or [])
    out = Path(args.out)
    with work_folder() as work:
        with_py, without_py = make_venvs(work)
        jax_version = sh(str(with_py), "-c", "import importlib.metadata as m; print(m.version('jax'))").stdout.strip()
        here = {
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
            "python": platform.python_version(), "jax": jax_version, "date": time.strftime("%Y-%m-%d"),
            "command": command,
        }
        results: dict[str, Any] = dict(here)
        if args.only and out.exists():  # keep the other sections of an earlier run, saying which is which
            kept = json.loads(out.read_text())
            if (kept["python"], kept["jax"]) != (here["python"], here["jax"]):
                parser.error(f"{out} was measured with another Python or JAX: measure every section")
            results = {k: v for k, v in kept.items() if k != "table"}
            results.setdefault("measured", {s: {k: kept[k] for k in ("date", "command", "machine")} for s in SECTIONS})
        measured = {s: {"date": here["date"], "command": command, "machine": here["machine"]} for s in sections}
        results["measured"] = {**results.get("measured", {}), **measured}
        if "startup" in sections:
            results["startup"] = startup(with_py, without_py, 3 if quick else 200)
            results["startup_instructions"] = startup_instructions(with_py, without_py, 1 if quick else 3)
        if "import_jax" in sections:
            results["import_jax"] = import_jax(with_py, without_py, 1 if quick else 10, work)
        if "workload" in sections:
            results["workload"] = workload(with_py, without_py, 2 if quick else 24, 1 if quick else 3, work)
        if "explain" in sections:
            results["warm_vs_raw"] = warm_vs_raw(with_py, without_py, 2 if quick else 24, 2 if quick else 9, work)
            results["own_time_runs"] = 1 if quick else 5
            results["own_time"] = own_time(with_py, 2 if quick else 24, results["own_time_runs"], work)
            results["key_time"] = key_time(with_py, 4 if quick else 24, 2 if quick else 20)
            results["saved_contention"] = saved_under_contention(with_py, 2 if quick else 24, work)
        if "cli" in sections:
            results["cli_entries"] = 300 if quick else 100_000
            results["cli"] = cli(with_py, results["cli_entries"], work)
            results["prune_entries"] = 100 if quick else 10_000
            results["prune_at_exit"] = prune_at_exit(with_py, results["prune_entries"], work)
        if "bookkeeping" in sections:
            results["bookkeeping"] = bookkeeping(with_py, 300 if quick else 100_000, 1000 if quick else 1_000_000, work)
        if "levels" in sections:
            results["levels"] = levels(work, 2 if quick else 24, 1 if quick else 7)
            results["prefetch"] = (prefetch(work, (4,), (0.02,), {4: 1}) if quick
                                   else prefetch(work, (20, 500, "short"), (0.0, 0.02, 0.05), {20: 5, 500: 3, "short": 5}))
            results["pairs"] = level_pairs(work, 1 if quick else 9, warm_up=not quick)
            results["pairs_http"] = level_pairs(work, 1 if quick else 9, http=True, warm_up=not quick)
    results["table"] = table(results)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(results["table"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
