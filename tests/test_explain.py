"""Why it missed (SPEC §13): each miss and each uncached compile names exactly its own cause,
with real JAX in fresh processes, as `explain --json`, `stats` and the `report` line show it."""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path
from typing import Any

from conftest import Venv, run_program
from test_activation import VERSION_DIR

PROGRAM = r"""
import json, os, sys
import jax, jax.numpy as jnp
SCALE = float(os.environ.get("SCALE", "3.0"))
@jax.jit
def f(x):
    return jnp.tanh(x @ x.T).sum(axis=0) * SCALE
@jax.jit
def g(x):
    return jnp.cumsum(jnp.sin(x) ** 2)
x = jnp.linspace(0.0, 1.0, 64).reshape(8, 8)
result = float(f(x).sum()) + float(g(x.ravel()).sum())
if os.environ.get("EXTRA"):
    @jax.jit
    def h(x):
        return jnp.cos(x).sum(axis=0) * 2.0 + 1.0
    result += float(h(x).sum())
if os.environ.get("PRINT"):
    @jax.jit
    def noisy(x):
        jax.debug.print("total {}", x.sum())
        return x * 2.0
    result += float(noisy(x).sum())
print(json.dumps({"result": round(result, 4)}))
"""


def explain(venv: Venv, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """`explain --json` as {cause: {function name: detail}}."""
    proc = venv.cli("--json", "explain", env=env)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["unavailable"] is None, data
    return {g["cause"]: {f["name"]: f["detail"] for f in g["functions"]} for g in data["groups"]}


def run_file(venv: Venv, env: dict[str, str], source: str = PROGRAM, name: str = "sim.py") -> tuple[dict[str, Any], str]:
    """Run ``source`` as a script in a project folder beside the cache (a module file: `explain`
    tells functions of one name apart by where their code is, which `python -c` does not say)."""
    folder = Path(env["GKX_JAX_CACHE_DIR"]).parent / "proj"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(source)
    proc = venv.run(str(folder / name), env=env, cwd=str(folder))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def fresh_causes(venv: Venv, env: dict[str, str], **extra: str) -> tuple[dict[str, dict[str, Any]], str]:
    """Run once more: the causes of that run alone (explain's last run), and its report line."""
    _, err = run_file(venv, {**env, **extra, "GKX_JAX_CACHE_REPORT": "1"})
    (line,) = [ln for ln in err.splitlines() if ln.startswith("gkx-autocache:")]
    return explain(venv, env), line


def cache(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), **extra}


def test_a_cold_run_is_new_and_a_warm_run_has_nothing_to_explain(venv: Venv, tmp_path: Path) -> None:
    env = cache(tmp_path)
    causes, line = fresh_causes(venv, env)
    assert {"jit_f", "jit_g"} <= set(causes["new"]), causes
    assert set(causes) == {"new"}, causes  # a first run: new, JAX's own helpers' further variants too
    assert "misses (" in line and " new)" in line, line
    causes, line = fresh_causes(venv, env)
    assert causes == {} and " 0 misses," in line, (causes, line)


def test_changed_xla_flags_names_the_values_before_and_after(venv: Venv, tmp_path: Path) -> None:
    env = cache(tmp_path)
    run_file(venv, env)
    # (Rebuild ahead off: on, it would compile jit_f again from its record before the program missed it.)
    causes, line = fresh_causes(venv, env, XLA_FLAGS="--xla_cpu_enable_fast_math=true", GKX_JAX_CACHE_REBUILD_AHEAD="0")
    assert set(causes) == {"changed XLA_FLAGS"}, causes
    assert causes["changed XLA_FLAGS"]["jit_f"].startswith("XLA_FLAGS: '' -> '--xla_cpu_enable_fast_math=true'")
    assert "changed XLA_FLAGS)" in line, line


def test_a_changed_constant_is_that_functions_computation(venv: Venv, tmp_path: Path) -> None:
    env = cache(tmp_path)
    run_file(venv, env)
    causes, _ = fresh_causes(venv, env, SCALE="4.0")
    assert causes == {"changed computation": {"jit_f": causes["changed computation"]["jit_f"]}}, causes
    last = json.loads(venv.cli("--json", "explain", env=env).stdout)["last_run"]  # stats --json's names
    assert last["misses_by_cause"] == {"changed computation": 1} and last["hits"] >= 2  # g and the helpers hit


def test_a_new_function_is_new(venv: Venv, tmp_path: Path) -> None:
    env = cache(tmp_path)
    run_file(venv, env)
    causes, _ = fresh_causes(venv, env, EXTRA="1")
    assert set(causes) == {"new"} and set(causes["new"]) == {"jit_h"}, causes


def test_an_entry_pruned_by_the_cap_is_evicted_naming_max_size(venv: Venv, tmp_path: Path) -> None:
    """A cap below the working set: the entries pruned at exit miss next time as `evicted`."""
    env = cache(tmp_path, GKX_JAX_CACHE_MAX_SIZE="12kB")
    run_file(venv, env)
    vdir = tmp_path / "c" / VERSION_DIR
    assert len(list(vdir.glob("*-cache"))) < 7  # the cap pruned some at exit
    causes, line = fresh_causes(venv, env)
    assert "evicted" in causes and all("max_size" in d for d in causes["evicted"].values()), causes
    assert set(causes) == {"evicted"}, causes


def test_an_entry_that_does_not_load_is_rejected(venv: Venv, tmp_path: Path) -> None:
    env = cache(tmp_path)
    run_file(venv, env)
    victim = max((tmp_path / "c" / VERSION_DIR).glob("jit_f-*-cache"), key=lambda p: p.stat().st_size)
    payload = zlib.decompress(victim.read_bytes())
    victim.write_bytes(zlib.compress(payload[:4] + b"\x07rotten\x00" * 40))
    causes, _ = fresh_causes(venv, env)
    assert set(causes) == {"rejected"} and set(causes["rejected"]) == {"jit_f"}, causes
    assert causes["rejected"]["jit_f"], causes  # JAX's reason


def test_host_callbacks_are_served_like_any_other_compile(venv: Venv, tmp_path: Path) -> None:
    """`jax.debug.print` in a function: JAX 0.10 does not write it, the package does (JAX 0.12
    writes it itself); the next run is served, nothing missed or uncached. Where a line cannot
    (0.4.30, 0.6.2), test_jax_lines.py checks that it is named."""
    env = cache(tmp_path)
    run_file(venv, {**env, "PRINT": "1"})
    causes, line = fresh_causes(venv, env, PRINT="1")
    assert causes == {}, causes
    assert ", 0 misses" in line and "not cached" not in line, line


NOISY = PROGRAM.replace("def f(x):\n", "def f(x):\n    if os.environ.get('NOISY'):\n        jax.debug.print('f {}', x.sum())\n")


def test_a_print_added_to_a_function_is_a_changed_computation(venv: Venv, tmp_path: Path) -> None:
    """A `jax.debug.print` added to a function changes its computation, and so the key's mark of host
    callbacks: the miss is the computation's, not "changed custom hook"."""
    assert NOISY != PROGRAM
    env = cache(tmp_path)
    run_file(venv, env, NOISY)
    _, err = run_file(venv, {**env, "NOISY": "1", "GKX_JAX_CACHE_REPORT": "1"}, NOISY)
    causes = explain(venv, env)
    assert set(causes) == {"changed computation"} and set(causes["changed computation"]) == {"jit_f"}, (causes, err)


def test_a_raised_threshold_is_named(venv: Venv, tmp_path: Path) -> None:
    env = cache(tmp_path, GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS="100")
    causes, line = fresh_causes(venv, env)
    assert set(causes) == {"not cached: below min_compile_time_secs"}, causes
    assert {"jit_f", "jit_g"} <= set(causes["not cached: below min_compile_time_secs"])
    assert "not cached (" in line and "below min_compile_time_secs: " in line and " s compile)" in line, line


SEAM_CHANGED = "import gkx_autocache._explain.seam as e; e.install = lambda *a, **k: 'simulated: cache_key changed'\n" + PROGRAM


def test_a_changed_seam_leaves_everything_else_and_status_says_why(venv: Venv, tmp_path: Path) -> None:
    """JAX's key internals not as expected: the cache still serves, and `status` and `explain`
    say that explanations are unavailable, and why."""
    env = cache(tmp_path)
    run_program(venv, env=env, program=SEAM_CHANGED)
    warm, _ = run_program(venv, env=env, program=SEAM_CHANGED)
    stats = json.loads(venv.cli("--json", "stats", env=env).stdout)["stats"]
    assert stats["hits"] >= 2 and set(stats["misses_by_cause"]) == {"unexplained"}  # the breakdown stays whole
    status = json.loads(venv.cli("--json", "status", env=env).stdout)
    assert any("not explained here: simulated: cache_key changed" in a for a in status["attention"]), status["attention"]
    data = json.loads(venv.cli("--json", "explain", env=env).stdout)
    assert data["unavailable"] == "simulated: cache_key changed"


def test_an_entry_of_another_format_is_rejected_not_evicted(venv: Venv, tmp_path: Path) -> None:
    """An entry in another environment's compression (zstd framing), which the store leaves alone:
    named `rejected` with why, not `evicted` ("raise max_size") on every run."""
    env = cache(tmp_path)
    run_file(venv, env)
    victim = max((tmp_path / "c" / VERSION_DIR).glob("jit_f-*-cache"), key=lambda p: p.stat().st_size)
    victim.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(64))
    for _ in range(2):
        causes, _ = fresh_causes(venv, env)
        assert set(causes) == {"rejected"} and "compresses with zstd" in causes["rejected"]["jit_f"], causes


LONG = PROGRAM.replace("def f(x):", "def f" + "o" * 240 + "(x):").replace("float(f(x)", "float(f" + "o" * 240 + "(x)")


def test_an_entry_that_cannot_be_written_is_named(venv: Venv, tmp_path: Path) -> None:
    """A function name that makes the entry's file name too long: `not cached: write failed`, with
    the system's reason, on every run, not `new`."""
    env = cache(tmp_path)
    run_program(venv, env=env, program=LONG)
    assert venv.cli("stats", "--reset", env=env).returncode == 0
    run_program(venv, env=env, program=LONG)
    causes = explain(venv, env)
    (name,) = [n for n in causes.get("not cached: write failed", {}) if n.startswith("jit_foooo")]
    assert "too long" in causes["not cached: write failed"][name].lower() and "new" not in causes, causes


DEBUG_LOG = r"""
import logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(name)s %(message)s")
logging.getLogger("jax._src.cache_key").setLevel(logging.DEBUG)
""" + PROGRAM


def test_the_users_debug_log_of_the_key_is_unchanged(venv: Venv, tmp_path: Path) -> None:
    """A user who turned on JAX's DEBUG log of the key's parts sees the same lines with the package
    as without it: explaining a miss does not make JAX log its parts again. (The hook part, and
    so the hash after it, holds the CPU's ISA with the package: SPEC §15.)"""
    flags = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=true --xla_cpu_fast_math_honor_nans=true"}

    def lines(env: dict[str, str]) -> list[str]:
        proc = venv.run("-c", DEBUG_LOG, env={**env, **flags}, check=True)
        found = [ln for ln in proc.stdout.splitlines() if ln.startswith("jax._src.cache_key")]
        return sorted(re.sub(r"[0-9a-f]{64}$", "<hash>", ln) if "custom_hook" in ln else ln for ln in found)

    ours = lines(cache(tmp_path))
    stock = lines({"GKX_JAX_CACHE": "0", "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "stock"),
                   "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES": "none"})
    assert len(ours) > 10 and ours == stock


# An at-exit handler registered before `import jax` runs after the package's own (last in, first
# out): it sees every module the run imported, the exit's fold included.
MODULES_AT_EXIT = r"""
import atexit, sys
atexit.register(lambda: print("MODULES", *sorted(m for m in sys.modules if m.startswith("gkx_autocache")), file=sys.stderr))
""" + PROGRAM


def modules_at_exit(stderr: str) -> set[str]:
    (line,) = [ln for ln in stderr.splitlines() if ln.startswith("MODULES")]
    return set(line.split()[1:])


def test_a_run_where_every_lookup_hits_never_imports_the_explainer(venv: Venv, tmp_path: Path) -> None:
    """The explainer and the index it reads are for misses and writes: a warm run where every
    lookup hits, exit included, does not import them (a third of the package's own time on such a
    run, three quarters without bytecode); a run with a miss does, and its miss has a cause."""
    env = cache(tmp_path, GKX_JAX_CACHE_REPORT="1")
    cold, err = run_program(venv, env=env, program=MODULES_AT_EXIT)
    assert {"gkx_autocache._explain.classify", "gkx_autocache._record.index"} <= modules_at_exit(err)
    warm, err = run_program(venv, env=env, program=MODULES_AT_EXIT)
    (line,) = [ln for ln in err.splitlines() if ln.startswith("gkx-autocache:")]
    assert warm == cold and " 0 misses" in line and " 0 hits" not in line, line
    loaded = modules_at_exit(err)
    assert not loaded & {"gkx_autocache._explain.classify", "gkx_autocache._record.index"}, loaded
    assert "gkx_autocache._explain.seam" in loaded and "gkx_autocache._isa" in loaded, loaded
    _, err = run_program(venv, env={**env, "XLA_FLAGS": "--xla_cpu_enable_fast_math=true"}, program=MODULES_AT_EXIT)
    assert "gkx_autocache._explain.classify" in modules_at_exit(err)
    assert "changed XLA_FLAGS" in explain(venv, env)


def test_a_lambda_is_placed_under_the_name_older_jax_gives_it() -> None:
    """JAX 0.4.30-0.6.2 name a jitted lambda's module `jit__lambda_` (later lines `jit__lambda`),
    and every op's location is the same call site: the lambda was taken for one of JAX's own
    helpers. Locations as JAX 0.4.38 prints them."""
    import types

    from gkx_autocache._explain import facts

    def op(location: str, *regions: Any) -> Any:
        return types.SimpleNamespace(location=location, regions=list(regions))

    site = 'callsite("<lambda>"("/work/loc.py":3:27) at "<module>"("/work/loc.py":3:9))'
    body = types.SimpleNamespace(blocks=[types.SimpleNamespace(operations=[
        op(f'loc("jit(<lambda>)/jit(main)/sin"({site}))'), op("loc(unknown)"),
        op(f'loc("jit(<lambda>)/jit(main)/mul"({site}))')])])
    module = types.SimpleNamespace(body=types.SimpleNamespace(operations=[op("loc(unknown)", body)]))
    assert facts.place_of(module, "jit__lambda") == "/work/loc.py:<lambda>"
    assert facts.place_of(module, "jit__lambda_") == "/work/loc.py:<lambda>"
