"""A cache directory a framework gives JAX after `import jax` (SPEC §5, §7, amended 2026-12-04;
issue 45 part 1): MaxText's `jax_cache_dir`, vLLM's TPU backend, AlphaFold 3's flag. Until then
JAX's stock cache served it: no atomic writes, no records, no explanations, and nothing said."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from conftest import InProcess, Ran, Venv, autocache_warnings
from test_activation import VERSION_DIR

FRAMEWORK = r"""
import os, sys
import jax, jax.numpy as jnp

def setup(directory):  # a framework's own setting, after import jax
    if os.environ.get("HOW") == "set_cache_dir":
        from jax.experimental.compilation_cache import compilation_cache
        compilation_cache.set_cache_dir(directory)
    else:
        jax.config.update("jax_compilation_cache_dir", directory)

setup(os.environ["FRAMEWORK_DIR"])

@jax.jit
def step(x):
    return jnp.tanh(x @ x.T).sum()

print(float(step(jnp.ones((8, 8)))))
"""


def framework(ran: Ran, directory: Path | str) -> str:
    """A framework's own setting, after import jax, in a process here (``jax.config.update``): the
    line that set it, as the package names it."""
    import inspect

    frame = inspect.currentframe()
    assert frame is not None
    line = frame.f_lineno + 1
    ran.jax.config.update("jax_compilation_cache_dir", str(directory))
    return f"{__file__}:{line}"


def train(here: InProcess, env: dict[str, str], directory: Path | str) -> tuple[Ran, str]:
    """FRAMEWORK as a process here: the framework's directory set after import jax, then its two
    functions compiled; the process, and the line that set the directory."""
    with here.process(env) as ran:
        by = framework(ran, directory)
        ran.jit("step")
        ran.jit("loss")
    return ran, by


def _run(venv: Venv, folder: Path, env: dict[str, str]) -> str:
    proc = venv.run(str(folder / "train.py"), env=env, cwd=str(folder))
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("gkx-autocache:")]
    return line


@pytest.mark.parametrize("how", ["config.update", "set_cache_dir"])
def test_a_directory_a_framework_sets_after_import_is_served_and_explained(venv: Venv, tmp_path: Path,
                                                                           how: str) -> None:
    (tmp_path / "train.py").write_text(FRAMEWORK)
    framework = tmp_path / "framework-cache"
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "ours"), "GKX_JAX_CACHE_REPORT": "1", "HOW": how,
           "FRAMEWORK_DIR": str(framework)}
    line = {"config.update": "train.py:10", "set_cache_dir": "train.py:8"}[how]  # the framework's line, not JAX's
    cold = _run(venv, tmp_path, env)
    assert cold.endswith(f"{framework} (set by {line})"), cold
    assert any(p.name.endswith("-gkx-compile") for p in framework.iterdir())  # the store's writes
    assert (framework / ".gkx-autocache" / "ledger").is_dir()
    warm = _run(venv, tmp_path, env)
    assert re.match(r"gkx-autocache: [1-9]\d* hits, 0 misses", warm), warm
    changed = _run(venv, tmp_path, {**env, "XLA_FLAGS": "--xla_cpu_enable_fast_math=true"})
    assert "changed XLA_FLAGS" in changed, changed
    # `explain` resolves the package's own directory, and follows the framework's there
    explained = venv.cli("--json", "explain", env=env)
    data = json.loads(explained.stdout)
    assert data["moved"]["dir"] == str(framework) and data["moved"]["by"] == line, data["moved"]
    assert "changed XLA_FLAGS" in data["last_run"]["misses_by_cause"], data["last_run"]
    status = venv.cli("status", env=env).stdout
    assert f"JAX's directory is {framework}, set by {line}" in status, status


def test_a_framework_directory_others_can_write_is_left_unused_and_said(here: InProcess, tmp_path: Path) -> None:
    """Never trust a directory others can write (SPEC §8, amended 2026-12-06): JAX sets up no cache
    there (it reads and writes nothing), and one line says so, naming the framework's line."""
    directory = tmp_path / "open"
    directory.mkdir()
    directory.chmod(0o777)
    ran, by = train(here, {"GKX_JAX_CACHE_DIR": str(tmp_path / "ours")}, directory)
    said = [w for w in autocache_warnings(ran.stderr) if "AutocacheWarning" in w]
    assert len(said) == 1 and f"set by {by}" in said[0] and "others can write" in said[0], ran.stderr
    assert ran.jax.requests == 2 and ran.jax.hits == 0 and not any(directory.iterdir())


def test_the_cap_applies_to_a_framework_directory_only_where_max_size_is_set(here: InProcess, tmp_path: Path) -> None:
    """A framework's directory may be shared with tools that expect their entries to stay: the
    package prunes it only where the user set max_size (here, 1 byte)."""
    for cap, kept in ((None, True), ("1", False)):
        directory = tmp_path / f"cache-{cap}"
        env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "ours"), **({"GKX_JAX_CACHE_MAX_SIZE": cap} if cap else {})}
        train(here, env, directory)
        assert (directory / ".gkx-autocache").is_dir()  # the store served it
        assert any(p.name.endswith("-cache") for p in directory.iterdir()) == kept, (cap, list(directory.iterdir()))


def test_a_framework_directory_through_a_link_of_roots_is_served_where_it_points(here: InProcess,
                                                                                 tmp_path: Path) -> None:
    """An HPC home (`/home/u -> /gpfs/...`, a link of root's): the store writes where the link
    points. A review found every write refused (the store was handed JAX's spelling, and opens
    nothing through a link): nothing cached, nothing said."""
    import os

    (tmp_path / "gpfs" / "u").mkdir(parents=True)
    (tmp_path / "hpc-home").symlink_to(tmp_path / "gpfs" / "u")  # ("home" is the process's own)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "ours"), "GKX_JAX_CACHE_REPORT": "1"}
    train(here, env, tmp_path / "hpc-home" / "cache")
    assert re.match(r"gkx-autocache: [1-9]\d* hits, 0 misses", train(here, env, tmp_path / "hpc-home" / "cache")[0].report)
    assert any(p.name.endswith("-cache") for p in (tmp_path / "gpfs" / "u" / "cache").iterdir())
    # a link another user planted (in a sticky /tmp) would choose where the cache goes: refused, said
    planted = tmp_path / "planted"
    planted.symlink_to(tmp_path / "gpfs" / "u" / "elsewhere")
    os.lchown(planted, 1001, 1001)
    ran, _ = train(here, env, planted)
    said = [w for w in autocache_warnings(ran.stderr) if "AutocacheWarning" in w]
    assert len(said) == 1 and "symlink of uid 1001" in said[0], ran.stderr
    assert not (tmp_path / "gpfs" / "u" / "elsewhere" / ".gkx-autocache").exists()


def test_a_relative_framework_directory_is_the_one_checked_whatever_the_current_directory(
        here: InProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative setting, then `os.chdir`: the directory checked is the one served and recorded
    (a review found the store serving the relative name in the new current directory)."""
    import os

    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "ours"), "GKX_JAX_CACHE_REPORT": "1"}
    for _ in range(2):
        monkeypatch.chdir(tmp_path)
        with here.process(env) as ran:
            by = framework(ran, "rel-cache")
            ran.jit("step")
            os.makedirs("elsewhere", mode=0o777, exist_ok=True)
            os.chmod("elsewhere", 0o777)  # a folder anyone can write: the relative name must not follow the process there
            os.chdir("elsewhere")
            ran.jit("_lambda")
    assert any(p.name.startswith("jit__lambda") for p in (tmp_path / "rel-cache").iterdir())
    assert not (tmp_path / "elsewhere" / "rel-cache").exists()
    assert re.match(r"gkx-autocache: [1-9]\d* hits, 0 misses", ran.report) and ran.report.endswith(f"(set by {by})"), ran.report


def test_a_framework_directory_that_existed_keeps_its_bookkeeping_folded_and_its_cap(here: InProcess,
                                                                                    tmp_path: Path) -> None:
    """A directory that existed gets no tag of its own (it would hide it from backups), but the
    bookkeeping folder the package makes in it does: ledgers are folded and an explicit cap is kept
    (a review found every ledger kept for good, and max_size never applied there)."""
    import os

    directory = tmp_path / "existing"
    directory.mkdir(mode=0o700)
    # What a folder named by mistake (`.`, a project's, one shared with another tool) holds: none of it
    # the package's, all of it named like a cache's at a glance (issue 57's M: each of these was removed).
    theirs = {".notes.tmp": b"a draft", ".jit_f.tmp": b"another tool's", "weights-" + "ab" * 32 + "-weights": b"w",
              "model-" + "cd" * 32 + "-cache": b"not an executable", "model-" + "cd" * 32 + "-config": b"{}"}
    ours = ".jit_g-" + "ef" * 32 + "-cache.4242.1.tmp"  # a writer of the package's, killed mid-write
    for name, data in {**theirs, ours: b"half"}.items():
        (directory / name).write_bytes(data)
        os.utime(directory / name, (time.time() - 7200, time.time() - 7200))
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "ours")}
    for _ in range(3):
        train(here, env, directory)
    assert not (directory / "CACHEDIR.TAG").exists() and (directory / ".gkx-autocache" / "CACHEDIR.TAG").exists()
    assert len(list((directory / ".gkx-autocache" / "ledger").iterdir())) == 0
    assert all((directory / name).exists() for name in theirs) and (directory / ours).exists()  # no cap: no sweep
    assert any(p.name.startswith("jit_") and p.name.endswith("-cache") for p in directory.iterdir())
    train(here, {**env, "GKX_JAX_CACHE_MAX_SIZE": "1"}, directory)
    assert not any(p.name.startswith("jit_") and p.name.endswith("-cache") for p in directory.iterdir())
    assert all((directory / name).read_bytes() == data for name, data in theirs.items())
    assert not (directory / ours).exists()  # its own temporary, by its own name pattern, under a cap


def test_a_pointer_to_a_directory_others_can_write_is_not_followed(here: InProcess, tmp_path: Path) -> None:
    """`moved.json` names a directory `explain` reads and `status` shows: one others can write is
    never followed, and who moved it is shown printable."""
    ours = tmp_path / "ours"
    env = {"GKX_JAX_CACHE_DIR": str(ours)}
    here.run_program(env, names=())  # `import jax`, nothing more
    meta = next(ours.glob("jax-*")) / ".gkx-autocache"
    meta.mkdir(exist_ok=True)
    for mode, followed in ((0o777, False), (0o700, True)):
        target = tmp_path / f"target-{mode:o}"
        target.mkdir()
        target.chmod(mode)
        (meta / "moved.json").write_text(json.dumps({"dir": str(target), "by": "x\n  FAKE \x1b[31m", "t": time.time()}))
        status = here.cli("status", env=env).stdout
        assert (f"JAX's directory is {target}" in status) == followed, status
        assert "\x1b" not in status and "\n  FAKE" not in status, status


def _plant(here: InProcess, planted: Path, owner: int, mode: int) -> None:
    """Fill ``planted`` as its owner would (the same machine: the same keys), then swap the two
    functions' entries and hand it to ``owner`` with ``mode``: an attacker who swaps two entries
    of one signature in a directory JAX reads swaps the victim's results (issue 57: what a planted
    entry does, without any code of his own)."""
    import os

    out, _ = here.run_program({"JAX_COMPILATION_CACHE_DIR": str(planted)}, ("f", "g"))
    assert out["requests"] == 2 and out["hits"] == 0
    (f_entry,) = planted.glob("jit_f-*-cache")
    (g_entry,) = planted.glob("jit_g-*-cache")
    f_bytes = f_entry.read_bytes()
    f_entry.write_bytes(g_entry.read_bytes())
    g_entry.write_bytes(f_bytes)
    for path in [planted, *planted.rglob("*")]:
        os.lchown(path, owner, owner)
        path.chmod(mode if path == planted or path.is_dir() else 0o644)


@pytest.mark.parametrize("how", ["config.update", "env"])
@pytest.mark.parametrize("who", ["another owner", "others can write"])
def test_a_directory_jax_is_given_that_the_trust_rules_refuse_is_read_by_no_one(here: InProcess, tmp_path: Path,
                                                                                how: str, who: str) -> None:
    """Another user's directory (the tutorials' /tmp/jax_cache, made first by someone else), or one
    others can write, given to JAX after import or in JAX_COMPILATION_CACHE_DIR: no entry of it is
    loaded, under -W error too, and one line says so with a fix the user can make (SPEC §5/§8,
    amended 2026-12-06). Until then JAX's stock cache read it, and the victim's results came out
    swapped. `read_untrusted_dir` is the opt-in to JAX's unchecked reads there, and does what it says."""
    from standin import executable

    planted = tmp_path / "jax_cache"
    owner, mode = (1002, 0o755) if who == "another owner" else (0, 0o777)
    _plant(here, planted, owner, mode)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "ours")}
    if how == "env":
        env["JAX_COMPILATION_CACHE_DIR"] = str(planted)

    def victim(extra: dict[str, str]) -> Ran:
        with here.process({**env, **extra}, w_error=True) as ran:
            if how == "config.update":
                framework(ran, planted)
            ran.jit("f")
            ran.jit("g")
        return ran

    ran = victim({})
    assert ran.jax.served[ran.jax.key("f")] == executable("f") and ran.jax.hits == 0, ran.stderr
    said = autocache_warnings(ran.stderr)
    assert len(said) == 1, ran.stderr
    assert str(planted) in said[0] and "reads no entry" in said[0] and "chmod" not in said[0], said
    assert "read_untrusted_dir" in said[0] and "a directory of your own" in said[0], said
    # The opt-in, named for what it does: JAX's own cache reads it, unchecked (and is fooled).
    ran = victim({"GKX_JAX_CACHE_READ_UNTRUSTED_DIR": "1"})
    assert ran.jax.hits == 2 and ran.jax.served[ran.jax.key("f")] == executable("g"), ran.stderr
    assert any("unchecked" in line for line in autocache_warnings(ran.stderr)), ran.stderr


# -- JAX's own cap, where JAX's LRU cache cannot keep it (issue 67) --------------------------------------

def test_jaxs_own_cap_without_filelock_is_kept_by_the_store(here: InProcess, tmp_path: Path) -> None:
    """JAX's guide documents jax_compilation_cache_max_size; its LRU cache needs filelock, and without
    it every lookup raised inside JAX (a UserWarning each: an error under -W error) and nothing was
    cached, while `status` said "JAX's own LRU cache serves". The store serves now, with that size as
    its cap, and `status` says so; at 0 (JAX caches nothing) nothing is cached, and that is said.
    (A process here has no LRU cache of JAX's: as one without filelock.)"""
    cache = tmp_path / "c"
    env = {"GKX_JAX_CACHE_DIR": str(cache), "JAX_COMPILATION_CACHE_MAX_SIZE": str(1 << 30)}
    cold, err = here.run_program(env, w_error=True, size=12_000)
    warm, err = here.run_program(env, w_error=True, size=12_000)
    assert warm["hits"] == warm["requests"] == cold["requests"] > 0 and autocache_warnings(err) == [], (warm, err)
    status = json.loads(here.cli("--json", "status", env=env).stdout)
    assert status["store"]["store"] == "gkx-autocache" and "jax_compilation_cache_max_size" in status["store"]["reason"]
    assert "filelock" in status["store"]["reason"], status["store"]
    before = len(list((cache / VERSION_DIR).glob("*-cache")))
    small = {**env, "JAX_COMPILATION_CACHE_MAX_SIZE": "20000"}  # smaller than the directory: kept at exit
    here.run_program(small, ("f:changed", "g"), size=12_000)
    left = list((cache / VERSION_DIR).glob("*-cache"))
    assert len(left) < before and sum(p.stat().st_size for p in left) <= 20000, (before, left)
    none = {**env, "JAX_COMPILATION_CACHE_MAX_SIZE": "0"}
    out, err = here.run_program(none, w_error=True)
    said = autocache_warnings(err)
    assert len(said) == 1 and "nothing is cached" in said[0] and "jax_compilation_cache_max_size is 0" in said[0], said
    assert out["hits"] == 0
    status = json.loads(here.cli("--json", "status", env=none).stdout)
    assert status["store"]["store"] == "none" and "nothing is cached" in status["store"]["reason"], status["store"]
