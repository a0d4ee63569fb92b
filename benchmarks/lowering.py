"""Where a warm run's time goes after ``import jax`` (issue 62): tracing, lowering, the cache key,
the cache read, the rest; and the most that skipping lowering and the key could save.

    python benchmarks/lowering.py [--runs N] [--programs demo,short,...] PYTHON [PYTHON ...]

Each PYTHON is an interpreter with jax, gkx-autocache and the real programs' libraries installed
(diffrax, equinox, optax, optimistix, flax, jax-md, pytest); a program whose library is missing is
skipped with a line. Per program and Python: one cold run fills a fresh cache directory (the
package's, at its defaults), then N warm runs, each a fresh process, are timed whole from outside
and, inside, by wrapping JAX's functions on the way of one jit (the names below, the same on JAX
0.10.2 and 0.12). Each wrapper charges its time to its own part, less what the parts inside it
took, so the parts add up: what is in no part is "other" (dispatch, execution, Python, the
program's own imports). Figures are medians over the warm runs.

The real programs: diffrax's two examples and flax's lm1b transformer (``benchmarks/examples``);
optax's own tests (shipped in its wheel: ``transform_test``, ``combine_test``, ``update_test``);
optimistix's (``tests/test_fixed_point.py``, its ``-k "not jvp"`` cases, at commit 6415ab1) and
jax-md's (``tests/space_test.py``, its ``-k matrix`` cases, at tag jax-md-v0.2.29), which their
wheels do not ship: ``--tests DIR`` names a folder holding them as ``optimistix_tests/`` and
``jaxmd_tests/`` (each repository's ``tests/*.py``), and an empty ``pytest.ini``. jax-md's tests
need ``netCDF4``.

``--prototype`` also runs ``lowering_key.py``'s fingerprint before each lowering (its own part,
"fingerprint") and the module's canonical digest after it ("verify"), and checks the pairs: a
fingerprint that stands for two different modules is a mismatch.

The bound: lowering (``lower_sharding_computation``, whose ``lower_jaxpr_to_module`` is the
module's construction), the compile options (``create_compile_options``: it walks the module) and
the key (``_get_cache_key``: it serialises and hashes the module) are what a hit keyed before
lowering would not do. The bound takes them whole (the parts of lowering a skip still needs, such
as the device assignment, are counted in it), and it counts none of the new key's own cost.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE / "examples"
sys.path.insert(0, str(HERE))
from run import MANY, SHORT  # noqa: E402

# (owner module, attribute path, part): the functions one jit's first call goes through, in
# order. A part's time is its own: what a part inside it took is taken off.
WRAPPED = (
    ("jax._src.pjit", "_trace_for_jit", "trace"),
    ("jax._src.interpreters.pxla", "lower_sharding_computation", "lower: other"),
    ("jax._src.interpreters.mlir", "lower_jaxpr_to_module", "lower: module"),
    ("jax._src.interpreters.pxla", "create_compile_options", "compile options"),
    ("jax._src.compiler", "_get_cache_key", "key: other"),
    ("jax._src.cache_key", "_hash_computation", "key: module"),
    ("jax._src.compiler", "_cache_read", "read"),
    ("jax._src.compiler", "backend_compile_and_load", "compile"),
    ("jax._src.interpreters.pxla", "UnloadedMeshExecutable.from_hlo", "load: other"),
)
PARTS = ("import jax", "trace", "lower: module", "lower: other", "compile options", "key: module", "key: other",
         "read", "compile", "load: other", "fingerprint", "verify", "other")
SKIPPABLE = ("lower: module", "lower: other", "compile options", "key: module", "key: other")

# Runs in each measured process: times `import jax` and the preimports, wraps WRAPPED, runs the
# program, and at exit writes the parts (seconds) and counts as JSON to the file in argv[1].
BOOT = r"""
import atexit, hashlib, json, os, sys, threading, time
started = time.perf_counter()
out_path, preimports, kind, target, *rest = sys.argv[1:]
spent, cpu = {}, {}  # wall and this thread's CPU seconds, by part
counts = {"traces": 0, "lowerings": 0, "keys": 0, "reads": 0, "compiles": 0, "hits": 0}
stack = []  # [part, start, time taken by inner parts]
main = threading.main_thread()

def wrap(owner, name, part, count):
    original = getattr(owner, name)
    def wrapper(*args, **kwargs):
        if threading.current_thread() is not main:
            return original(*args, **kwargs)
        if count:
            counts[count] += 1
        frame = [time.perf_counter(), time.thread_time(), 0.0, 0.0]
        stack.append(frame)
        try:
            return original(*args, **kwargs)
        finally:
            stack.pop()
            took, took_cpu = time.perf_counter() - frame[0], time.thread_time() - frame[1]
            spent[part] = spent.get(part, 0.0) + took - frame[2]
            cpu[part] = cpu.get(part, 0.0) + took_cpu - frame[3]
            if stack:
                stack[-1][2] += took
                stack[-1][3] += took_cpu
    wrapper.__wrapped__ = original
    if isinstance(owner, type):
        wrapper = staticmethod(wrapper) if isinstance(owner.__dict__[name], staticmethod) else wrapper
    setattr(owner, name, wrapper)

import jax
after, after_cpu = time.perf_counter(), time.thread_time()
spent["import jax"], cpu["import jax"] = after - started, after_cpu
import importlib
COUNT = {"trace": "traces", "lower: other": "lowerings", "key: other": "keys", "read": "reads", "compile": "compiles"}
for module, path, part in WRAPPED:
    owner = importlib.import_module(module)
    *outer, name = path.split(".")
    for attr in outer:
        owner = getattr(owner, attr)
    wrap(owner, name, part, COUNT.get(part))

if os.environ.get("GKX_BENCH_PROTOTYPE"):  # lowering_key.py's fingerprint, before each lowering
    sys.path.insert(0, os.environ["GKX_BENCH_PROTOTYPE"])
    import lowering_key
    from jax._src.interpreters import pxla
    counts["uncovered"] = {}
    lower = pxla._cached_lowering_to_hlo
    from jax._src import cache_key
    no = getattr(getattr(cache_key, "IgnoreCallbacks", None), "NO", False)
    log = open(os.environ["GKX_BENCH_PROTOTYPE_LOG"], "a")
    def canonical(module):  # what the key's computation part hashes: the module less its debug info
        return hashlib.sha256(cache_key._canonicalize_ir(module, no)).hexdigest()
    def fingerprinted(*args, **kwargs):
        try:
            key = lowering_key.fingerprint(*args, *sorted(kwargs.items()))
        except lowering_key.Uncovered as exc:
            key = None
            counts["uncovered"][str(exc)] = counts["uncovered"].get(str(exc), 0) + 1
        result = lower(*args, **kwargs)
        log.write(json.dumps([args[1], key, canonical(result[0])]) + "\n")
        return result
    pxla._cached_lowering_to_hlo = fingerprinted
    wrap(pxla, "_cached_lowering_to_hlo", "lower: other", None)
    wrap(lowering_key, "fingerprint", "fingerprint", None)
    wrap(sys.modules[__name__], "canonical", "verify", None)

def listen(event, *a, **k):
    if event == "/jax/compilation_cache/cache_hits":
        counts["hits"] += 1
jax.monitoring.register_event_listener(listen)
t, t_cpu = time.perf_counter(), time.thread_time()
for name in filter(None, preimports.split(",")):
    importlib.import_module(name)
spent["preimports"], cpu["preimports"] = time.perf_counter() - t, time.thread_time() - t_cpu

def done():
    spent["after import jax"], cpu["after import jax"] = time.perf_counter() - after, time.thread_time() - after_cpu
    for d in (spent, cpu):
        d["other"] = d["after import jax"] - sum(v for k, v in d.items() if k not in ("import jax", "after import jax"))
    with open(out_path, "w") as f:
        json.dump({"spent": spent, "cpu": cpu, "counts": counts}, f)
atexit.register(done)  # registered after JAX's and the package's, so it runs before them

import runpy
if kind == "path":
    sys.argv = [target, *rest]
    runpy.run_path(target, run_name="__main__")
elif kind == "module":
    sys.argv = [target, *rest]
    runpy.run_module(target, run_name="__main__", alter_sys=True)
else:
    exec(compile(target, "<program>", "exec"), {"__name__": "__main__"})
"""


def boot_source() -> str:
    return f"WRAPPED = {WRAPPED!r}\n" + BOOT


# name -> (needed modules, preimports, kind, target, args). Preimported libraries are timed apart
# from the program ("/ program" leaves them out). The optimistix and jax-md tests are their
# repositories' own `tests/` folders, in TESTS (see the module docstring); optax ships its tests.
def programs(tests: Path) -> dict[str, tuple[tuple[str, ...], str, str, str, list[str]]]:
    demo = "from gkx_autocache._cli.demo import workload\nprint(workload())\n"
    many = MANY.replace("int(sys.argv[1])", "70")
    # pytest with an empty configuration: not this repository's (warnings as errors)
    pytest = ["-c", str(tests / "pytest.ini"), "--rootdir", str(tests), "-q", "-p", "no:cacheprovider"]
    return {
        "demo": ((), "", "code", demo, []),
        "short": ((), "", "code", SHORT, []),
        "many70": ((), "", "code", many, []),
        "diffrax heat_pde": (("diffrax",), "diffrax,equinox", "path", str(EXAMPLES / "diffrax_heat_pde.py"), []),
        "diffrax stiff_ode": (("diffrax",), "diffrax,equinox", "path", str(EXAMPLES / "diffrax_stiff_ode.py"), []),
        "flax lm1b": (("flax", "optax"), "flax,optax", "path", str(EXAMPLES / "flax_lm1b" / "run.py"), []),
        "optax tests": (("optax", "pytest"), "optax,pytest", "module", "pytest",
                        [*pytest, "--pyargs", "optax._src.transform_test", "optax._src.combine_test",
                         "optax._src.update_test"]),
        "optimistix tests": (("optimistix", "pytest"), "optimistix,pytest", "module", "pytest",
                             [*pytest, str(tests / "optimistix_tests" / "test_fixed_point.py"), "-k", "not jvp"]),
        "jax-md tests": (("jax_md", "pytest", "netCDF4"), "jax_md,pytest", "module", "pytest",
                         [*pytest, str(tests / "jaxmd_tests" / "space_test.py"), "-k", "matrix"]),
    }


def has(python: str, modules: tuple[str, ...]) -> bool:
    code = "import importlib.util, sys; sys.exit(any(importlib.util.find_spec(m) is None for m in sys.argv[1:]))"
    return subprocess.run([python, "-c", code, *modules], check=False).returncode == 0


def run(python: str, program: tuple[tuple[str, ...], str, str, str, list[str]], env: dict[str, str],
        work: Path) -> dict[str, Any]:
    """One process: its wall and CPU seconds whole (from outside), and its parts (from inside)."""
    _, preimports, kind, target, args = program
    out = work / "parts.json"
    out.unlink(missing_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([python, "-c", boot_source(), str(out), preimports, kind, target, *args],
                          capture_output=True, text=True, env=env, cwd=work, check=False)
    whole = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not out.exists():
        raise SystemExit(f"{python} {target[:60]!r}: exit {done.returncode}\n{done.stderr[-3000:]}")
    parts: dict[str, Any] = json.loads(out.read_text())
    parts["spent"]["whole"] = whole
    parts["cpu"]["whole"] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return parts


def check(runs: list[list[list[Any]]]) -> dict[str, Any]:
    """What the prototype key would have done: lowerings it covers; keys seen in more than one
    run (a warm run's would-be hits: a key that changes between runs of one program is a
    miss); and mismatches, one key with two different modules (the modules' canonical digests,
    what JAX's key hashes), which a shipped key must never have."""
    modules: dict[str, set[str]] = {}
    names: dict[str, set[str]] = {}
    seen_in: dict[str, set[int]] = {}
    covered = total = 0
    for i, run in enumerate(runs):
        for name, key, digest in run:
            total += 1
            if key is None:
                continue
            covered += 1
            modules.setdefault(key, set()).add(digest)
            names.setdefault(key, set()).add(name)
            seen_in.setdefault(key, set()).add(i)
    stable = sum(1 for i, run in enumerate(runs) if i for _n, key, _d in run if key is not None and min(seen_in[key]) < i)
    later = sum(len(run) for run in runs[1:])
    return {"lowerings": total, "covered": covered, "keys": len(modules),
            "mismatches": sum(1 for digests in modules.values() if len(digests) > 1),
            "mismatched": [sorted(names[key]) for key, digests in modules.items() if len(digests) > 1],
            "later runs' lowerings": later, "found from an earlier run": stable}


def summary(warm: list[dict[str, Any]], clock: str) -> dict[str, Any]:
    """Medians over the warm runs of one clock ("spent": wall, "cpu": the main thread's CPU, the
    whole process's for "whole"), and the bound as a fraction of the whole run, of the run after
    `import jax`, and of the program after its own imports."""
    runs = [w[clock] for w in warm]
    med = {part: statistics.median(r.get(part, 0.0) for r in runs) for part in (*PARTS, "preimports", "whole",
                                                                               "after import jax")}
    bound = [sum(r.get(part, 0.0) for part in SKIPPABLE) for r in runs]
    return {"parts": med, "bound": statistics.median(bound),
            "of whole": statistics.median(b / r["whole"] for b, r in zip(bound, runs, strict=True)),
            "of after import jax": statistics.median(b / r["after import jax"] for b, r in zip(bound, runs, strict=True)),
            "of program": statistics.median(b / (r["after import jax"] - r["preimports"])
                                            for b, r in zip(bound, runs, strict=True))}


def table(results: list[dict[str, Any]], clock: str) -> None:
    columns = ("trace", "lower: module", "lower: other", "compile options", "key: module", "key: other", "read",
               "compile", "load: other", "fingerprint", "verify", "other")
    print("| JAX | program | whole s | import jax | other imports | " + " | ".join(columns)
          + " | lowerings / hits | bound s | bound / whole | / after import jax | / program |")
    print("|---" * (len(columns) + 10) + "|")
    for r in results:
        c = r[clock]
        p = c["parts"]
        cells = [r["jax"], r["program"], f"{p['whole']:.2f}", f"{p['import jax']:.2f}", f"{p['preimports']:.2f}",
                 *(f"{p[k]:.3f}" for k in columns),
                 f"{r['counts']['lowerings']:.0f} / {r['counts']['hits']:.0f}", f"{c['bound']:.3f}",
                 f"{c['of whole']:.1%}", f"{c['of after import jax']:.1%}", f"{c['of program']:.1%}"]
        print("| " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--programs", default="", help="comma-separated names (default: all)")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure here")
    parser.add_argument("--platform", default="cpu", help="JAX_PLATFORMS for the programs ('' for JAX's choice)")
    parser.add_argument("--prototype", action="store_true",
                        help="also time lowering_key.py's fingerprint before each lowering")
    parser.add_argument("--tests", type=Path, default=Path(".bench/src"),
                        help="a folder with optimistix_tests/ and jaxmd_tests/ (default: .bench/src)")
    parser.add_argument("pythons", nargs="+")
    args = parser.parse_args()
    chosen = [p for p in args.programs.split(",") if p]
    results = []
    lowerings: list[list[list[Any]]] = []  # per warm run: [module name, prototype key or None, module digest]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for python in (os.path.abspath(p) if os.sep in p else p for p in args.pythons):
            version = subprocess.run([python, "-c", "import jax; print(jax.__version__)"], capture_output=True,
                                     text=True, check=True).stdout.strip()
            for name, program in programs(args.tests.resolve()).items():
                if chosen and name not in chosen:
                    continue
                missing = any(os.sep in a and not Path(a).exists() for a in program[4])
                if not has(python, program[0]) or missing:
                    print(f"{version} {name}: skipped ({', '.join(program[0])} not installed)", flush=True)
                    continue
                cache = work / "cache"
                shutil.rmtree(cache, ignore_errors=True)
                env = {k: v for k, v in os.environ.items() if not k.startswith(("GKX_", "JAX_", "EQX_"))}
                env.update(GKX_JAX_CACHE_DIR=str(cache))
                if args.platform:
                    env["JAX_PLATFORMS"] = args.platform
                log = work / "prototype.jsonl"
                if args.prototype:
                    env.update(GKX_BENCH_PROTOTYPE=str(HERE), GKX_BENCH_PROTOTYPE_LOG=str(log))
                run(python, program, env, work)  # cold: fills the directory
                warm = []
                for _ in range(args.runs):
                    log.write_text("")
                    warm.append(run(python, program, env, work))
                    if args.prototype:
                        lowerings.append([[f"{name}: {n}", *rest] for n, *rest in map(json.loads, log.read_text().splitlines())])
                row = {"jax": version, "program": name, "runs": args.runs,
                       "counts": {k: statistics.median(w["counts"][k] for w in warm) for k in warm[0]["counts"]
                                  if k != "uncovered"},
                       "uncovered": warm[0]["counts"].get("uncovered"),
                       "wall": summary(warm, "spent"), "cpu": summary(warm, "cpu")}
                if args.prototype:
                    row["prototype"] = check(lowerings[-args.runs:])
                results.append(row)
                print(json.dumps(row), flush=True)
    if args.prototype:
        everything = check(lowerings)
        print(f"\nprototype key, all programs and runs together: {json.dumps(everything)}")
        for names in everything["mismatched"]:
            print(f"  one prototype key, two modules: {', '.join(names)}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    print("\nWall seconds (medians):\n")
    table(results, "wall")
    print("\nCPU seconds (medians; the parts are the main thread's, 'whole' the process's):\n")
    table(results, "cpu")


if __name__ == "__main__":
    main()
