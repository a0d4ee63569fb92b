"""SPEC §16: a JAX whose seams differ from every line tested, as a later JAX (0.13 does not exist
yet) may be. Before ``import jax`` the program alters one of JAX's private modules as it is
loaded (a seam renamed in JAX's own source, a parameter added, a name behind a deprecation
shim); JAX itself still works. The feature that needs the seam says why not in ``status``, by
name; everything else works, under ``-W error``, with results equal to the package off, and no
traceback or "please report this"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import COUNTING, Venv

# Alters `jax._src.<MODULE>` as it is loaded: ALTER(module) runs after JAX's own code. RENAME
# compiles JAX's source with a name replaced (a JAX that no longer has it); JAX still runs.
FAKE = r"""
import importlib.abc, importlib.util, sys, warnings, functools

class _Later(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "jax._src." + MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module
        def exec_module(module):
            if RENAME:
                old, new = RENAME
                source = spec.loader.get_source(name).replace(old, new)
                exec(compile(source, spec.origin, "exec"), module.__dict__)
            else:
                run(module)
            ALTER(module)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Later())
"""

PROGRAM = r"""
import json, sys
import jax, jax.numpy as jnp
""" + COUNTING + r"""
x = jnp.ones((16, 16))
steps = [jax.jit(lambda v, i=i: jnp.sin(v) * i + jnp.cos(v @ v.T).sum()) for i in range(int(sys.argv[1]))]
result = sum(float(f(x).sum()) for f in steps)
print(json.dumps({**counts, "result": result}))
"""


def with_parameter(attr: str, extra: str, at: int) -> str:
    """ALTER: ``attr`` keeps working (JAX's calls pass through), with one more parameter at ``at`` in
    its signature."""
    return f"""
def ALTER(module):
    original = getattr(module, {attr!r})
    namespace = {{"original": original}}
    exec("def {attr}(*args, {extra}=None, **kwargs):\\n    return original(*args, **kwargs)", namespace)
    import inspect
    params = list(inspect.signature(original).parameters.values())
    changed = namespace[{attr!r}]
    changed.__signature__ = inspect.Signature(params[:{at}] + [inspect.Parameter({extra!r}, inspect.Parameter.POSITIONAL_OR_KEYWORD)] + params[{at}:])
    setattr(module, {attr!r}, changed)
"""


NOTHING = "def ALTER(module):\n    pass\n"

# (module, rename, ALTER, the features status must still list, the features it must say are missing)
LATER_JAX: dict[str, tuple[str, tuple[str, str] | None, str, set[str], set[str]]] = {
    "the key's custom hook is gone": (
        "cache_key", ("custom_hook", "custom_hook_v2"), NOTHING, {"store", "cap", "explain", "levels", "rebuild"},
        {"ISA key", "host callbacks"}),
    "the key's part logger has a parameter more": (
        "cache_key", None, with_parameter("_log_cache_key_hash", "depth", 3),
        {"store", "cap", "ISA key", "levels", "host callbacks", "rebuild"}, {"explain"}),
    "get_file_cache has a parameter more": (
        "compilation_cache", None, with_parameter("get_file_cache", "options", 1), {"ISA key"},
        {"store", "cap", "explain", "levels", "host callbacks", "rebuild"}),
    "the write has a parameter more in its first five": (
        "compiler", None, with_parameter("_cache_write", "options", 2), {"store", "cap", "ISA key", "levels", "rebuild"},
        {"explain", "host callbacks"}),
    "the compile seam has a parameter more in its first five": (
        "compiler", None, with_parameter("compile_or_get_cached", "options", 1),
        {"store", "cap", "explain", "ISA key", "levels"}, {"host callbacks", "rebuild"}),
    "the loader has a parameter more first": (
        "compilation_cache", None, with_parameter("get_executable_and_time", "options", 0),
        {"store", "cap", "explain", "ISA key", "levels", "rebuild"}, {"host callbacks"}),
    "CacheInterface behind a deprecation shim": (
        "compilation_cache", None, """
def ALTER(module):
    moved = module.__dict__.pop("CacheInterface")
    def __getattr__(name):
        if name == "CacheInterface":
            warnings.warn("CacheInterface moved to jax._src.cache_interface", DeprecationWarning, stacklevel=2)
            return moved
        raise AttributeError(name)
    module.__getattr__ = __getattr__
""", {"ISA key"}, {"store", "cap", "explain", "levels", "host callbacks", "rebuild"}),
}


def fake(case: str) -> str:
    module, rename, alter, _, _ = LATER_JAX[case]
    return f"MODULE = {module!r}\nRENAME = {rename!r}\n{alter}\n{FAKE}\n{PROGRAM}"


def run(venv: Venv, program: str, env: dict[str, str], *flags: str) -> tuple[dict[str, Any], str]:
    proc = venv.run(*flags, "-c", program, "4", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


# Seams the package needs for host callbacks only where JAX does not write them itself (before 0.11).
FOR_CALLBACKS = {"the compile seam has a parameter more in its first five", "the key's custom hook is gone",
                 "the loader has a parameter more first"}


def jax_writes_callbacks() -> bool:
    import inspect

    from jax._src import compiler

    return "host_callbacks" not in inspect.signature(compiler._cache_write).parameters


@pytest.mark.parametrize("case", sorted(LATER_JAX))
def test_a_later_jax_keeps_what_its_seams_allow_and_says_what_not(venv: Venv, tmp_path: Path, case: str) -> None:
    _, _, _, kept, lost = LATER_JAX[case]
    if case in FOR_CALLBACKS and jax_writes_callbacks():  # JAX 0.11+: the package has no part in them
        kept, lost = kept | {"host callbacks"}, lost - {"host callbacks"}
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "cache")}
    program = fake(case)
    off, _ = run(venv, program, {**env, "GKX_JAX_CACHE": "0"}, "-W", "error")
    cold, cold_err = run(venv, program, env, "-W", "error")
    warm, warm_err = run(venv, program, env, "-W", "error")
    for err in (cold_err, warm_err):
        assert "Traceback" not in err and "please report" not in err and "gkx-autocache" not in err, err
    assert cold["result"] == warm["result"] == off["result"]
    assert warm["requests"] > 0 and warm["hits"] == warm["requests"], (warm, warm_err)  # the store's, or JAX's own

    status = json.loads(venv.cli("--json", "status", env=env).stdout)
    features = status["features"]
    assert {name for name, why in features.items() if why is None} == kept, features
    assert {name for name, why in features.items() if why is not None} == lost, features
    assert all("jax._src." in why or "need the store" in why for why in features.values() if why), features
    assert (status["store"]["store"] == "gkx-autocache") == ("store" in kept), status["store"]
    version = json.loads(venv.cli("--json", "--version", env=env).stdout)
    assert version["features"] == features, version
    text = venv.cli("status", env=env).stdout
    (line,) = [line for line in text.splitlines() if line.lstrip().startswith("features")]
    assert all(f"no {name}" in line or name in line for name in lost), line

    run(venv, program, {**env, "XLA_FLAGS": "--xla_cpu_enable_fast_math=true"}, "-W", "error")
    explained = json.loads(venv.cli("--json", "explain", env=env).stdout)
    if "explain" in kept:
        assert explained["unavailable"] is None, explained
        assert {group["cause"] for group in explained["groups"]} == {"changed XLA_FLAGS"}, explained["groups"]
    else:
        assert explained["unavailable"] == features["explain"] or features["explain"] == "they need the store", explained
        assert all(explained["unavailable"] in group["fix"] for group in explained["groups"]), explained["groups"]


CHAINS = r"""
import json, os
import jax, jax.numpy as jnp
from jax._src import cache_key, compilation_cache, compiler
float(jax.jit(lambda x: x * 2.0)(jnp.ones(3)).sum())
chains = {}
for name, owner in (("cache_key.custom_hook", cache_key), ("cache_key._log_cache_key_hash", cache_key),
                    ("compiler.compile_or_get_cached", compiler), ("compilation_cache.get_file_cache", compilation_cache),
                    ("compilation_cache.get_executable_and_time", compilation_cache), ("compiler._cache_write", compiler)):
    found, f = [], getattr(owner, name.split(".")[1])
    while getattr(f, "__module__", "").startswith("gkx_autocache"):  # outermost first
        found.append(f.__module__.removeprefix("gkx_autocache.") + "." + f.__qualname__.split(".<locals>")[0])
        f = f.__wrapped__
    chains[name] = found[::-1]
print(json.dumps(chains))
"""


def test_jaxs_functions_are_wrapped_in_the_order_seams_declares(venv: Venv, tmp_path: Path) -> None:
    """Which wrapper is outermost is written down (``_configure.SEAMS``), not implied by the order of
    statements: each JAX function the package wraps, read back in a configured process (with a
    shared level, so every seam is on), has its wrappers innermost first as the table lists them,
    and every seam of the table that this line takes is there."""
    from gkx_autocache import _configure

    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_SHARED": str(tmp_path / "team")}
    (tmp_path / "team").mkdir(mode=0o700)
    proc = venv.run("-c", CHAINS, env=env)
    assert proc.returncode == 0, proc.stderr
    chains = json.loads(proc.stdout.strip().splitlines()[-1])
    declared: dict[str, list[str]] = {}
    for function, installer, _ in _configure.SEAMS:
        declared.setdefault(function, []).append(installer)
    for function, found in chains.items():
        assert [w for w in declared[function] if w in found] == found, (function, found, declared[function])
    assert set(chains["compilation_cache.get_executable_and_time"]) >= {"_jax.caching._guard_loading",
                                                                         "_jax.caching.skip_lookups"}, chains
    assert chains["compiler._cache_write"][-1] == "_explain.seam.install", chains
    assert chains["cache_key.custom_hook"] == ["_key.install"], chains
