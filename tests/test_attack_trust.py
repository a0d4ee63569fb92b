"""Attacks on issue 57's fixes (SPEC §5, §7, §8, §15, amended 2026-12-06), as another local user
and a careful reviewer would make them: a directory JAX is given that is checked once and read by
path afterwards, the run's line for a refused directory, removal in a directory the package did not
make, and a CPU whose kernel hides a feature XLA's code uses. Each test fails where the attack
works (each failed on 767e416, the review's findings, before they were fixed)."""

from __future__ import annotations

import json
import os
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import COUNTING, InProcess, Ran, Venv, autocache_warnings, run_program
from test_adopted import framework

# The victim: the JAX guide's thresholds (every compile written), a cache directory given after
# import, a first compile (JAX sets its cache up there, where the package checks it), then more
# compiles after something changed what the name JAX holds leads to (``then``).
THRESHOLDS = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}


def victim(here: InProcess, env: dict[str, str], given: str, first_cwd: Path, then: Any = None,
           w_error: bool = False) -> Ran:
    """The victim as a process here: a directory given after import (from ``first_cwd``), a first
    compile (JAX sets its cache up there, where the package checks it), ``then()``, then f and g."""
    os.chdir(first_cwd)  # (the test's monkeypatch.chdir puts the current directory back)
    with here.process(env, w_error=w_error) as ran:
        framework(ran, given)
        ran.jit("warm_up")
        if then is not None:
            then()
        ran.jit("f")
        ran.jit("g")
    return ran


def results(ran: Ran) -> tuple[bytes, bytes]:
    """The executables the victim's f and g ran."""
    return ran.jax.served[ran.jax.key("f")], ran.jax.served[ran.jax.key("g")]


def right() -> tuple[bytes, bytes]:
    from standin import executable

    return executable("f"), executable("g")


def _swap_and_give(planted: Path, owner: int) -> None:
    """Swap the entries of f and g in ``planted`` and give it all to ``owner``, 0755 (the tutorials'
    /tmp/jax_cache, made first by someone else)."""
    (f_entry,) = planted.glob("jit_f-*-cache")
    (g_entry,) = planted.glob("jit_g-*-cache")
    f_bytes = f_entry.read_bytes()
    f_entry.write_bytes(g_entry.read_bytes())
    g_entry.write_bytes(f_bytes)
    for path in [planted, *planted.rglob("*")]:
        os.lchown(path, owner, owner)
        path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.mark.parametrize("then", ["chdir", "repoint", "chown"])
def test_a_directory_checked_for_jaxs_stock_cache_is_the_one_it_reads(here: InProcess, tmp_path: Path, then: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The package checks a directory JAX is given when JAX sets its cache up there (issue 57's
    critical): also where JAX's stock cache serves it, which reads each entry by the name it was
    given. Another user who planted a swapped pair where that name leads later (a `jax_cache` in
    the folder the program moves to; a link of his on the way, re-pointed after the check), or who
    was given the directory since and renamed the victim's entries, must not swap the victim's
    results. The package's own directory here is another user's: it runs uncached, and only the
    guard stands between JAX and the planted entries (the user's jax_compilation_cache_max_size
    does the same with filelock installed, which the test extra lacks)."""
    import glob

    monkeypatch.chdir(tmp_path)
    me = tmp_path / "victim"
    me.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"  # where the other user waits (the temporary directory, a shared folder)
    elsewhere.mkdir(mode=0o755)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 1002, 1002)
    env = {**THRESHOLDS, "GKX_JAX_CACHE_DIR": str(theirs)}
    if then == "chdir":
        given, planted = "jax_cache", elsewhere / "jax_cache"
        victim(here, env, given, elsewhere)  # the other user fills it as the victim's program would: the same keys

        def later() -> None:  # the program moves on (a run folder, the temporary directory)
            os.chdir(elsewhere)
    elif then == "chown":
        planted = me / "jax_cache"
        given = str(planted)
        victim(here, env, given, me)  # the victim's own entries, as they were

        def later() -> None:  # the directory is given to another user (an admin's chown), who renames what is in it
            folder = str(planted)
            os.chown(folder, 1002, 1002)
            (f_entry,), (g_entry,) = glob.glob(f"{folder}/jit_f-*-cache"), glob.glob(f"{folder}/jit_g-*-cache")
            os.rename(f_entry, f"{folder}/swap")
            os.rename(g_entry, f_entry)
            os.rename(f"{folder}/swap", g_entry)
    else:
        sticky = tmp_path / "tmp"
        sticky.mkdir()
        sticky.chmod(0o1777)
        hop, planted = sticky / "cache", elsewhere / "jax_cache"
        mine = tmp_path / "mine"  # the victim's own link to a name in the temporary directory
        mine.symlink_to(hop)
        given = str(mine)
        hop.symlink_to(planted)
        victim(here, env, given, me)
        hop.unlink()
        hop.symlink_to(me)  # at the check: the link leads to the victim's own folder

        def later() -> None:  # what the other user, who owns the link on the way, does after the check
            os.remove(hop)
            os.symlink(planted, hop)
            os.lchown(hop, 1002, 1002)

        os.lchown(hop, 1002, 1002)
    if then != "chown":
        _swap_and_give(planted, 1002)
    ran = victim(here, env, given, me, later, w_error=True)
    assert ran.jax.requests == 3 and results(ran) == right(), ran.stderr


def test_the_report_line_of_a_run_given_a_refused_directory_says_it_was_uncached(here: InProcess, tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's line tells the truth: JAX had no cache in the refused directory, so nothing was
    looked up or missed there; the line says the run was uncached, as it does where the refused
    directory came from JAX_COMPILATION_CACHE_DIR."""
    monkeypatch.chdir(tmp_path)
    refused = tmp_path / "jax_cache"
    refused.mkdir()
    os.chown(refused, 1002, 1002)
    env = {**THRESHOLDS, "GKX_JAX_CACHE_DIR": str(tmp_path / "ours"), "GKX_JAX_CACHE_REPORT": "1"}
    ran = victim(here, env, str(refused), tmp_path)
    assert ran.jax.hits == 0 and ran.jax.requests == 3 and not any(refused.iterdir())
    (line,) = [ln for ln in ran.stderr.splitlines() if ln.startswith("gkx-autocache:") and str(refused) in ln
               and "AutocacheWarning" not in ln and "refused, it is" not in ln]
    assert "uncached" in line and " misses" not in line, line


HEX = "ab" * 32


@pytest.mark.parametrize("theirs", ["a note named -atime", "another user's zlib file named -cache"])
def test_a_directory_the_package_did_not_make_keeps_what_it_cannot_have_written(here: InProcess, tmp_path: Path,
                                                                               theirs: str) -> None:
    """SPEC §7 (amended 2026-12-06): in a directory the package did not make it removes only what it
    can show it wrote. A unit with no entry is no proof (another tool's `-atime`), and neither is a
    compressed frame in a file another user owns (the package writes as this user; a framework's
    folder is not a team cache)."""
    from test_adopted import train

    directory = tmp_path / "existing"
    directory.mkdir(mode=0o700)
    if theirs == "a note named -atime":
        name, data = f"notes-{HEX}-atime", b"another tool's access times"
    else:
        name, data = f"model-{HEX}-cache", zlib.compress(b"weights another user put here, compressed")
    (directory / name).write_bytes(data)
    if theirs != "a note named -atime":
        os.chown(directory / name, 1002, 1002)
    os.utime(directory / name, (time.time() - 7200, time.time() - 7200))  # the least recently used of all
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "ours")}
    train(here, env, directory)
    assert any(p.name.startswith("jit_") and p.name.endswith("-cache") for p in directory.iterdir())
    train(here, {**env, "GKX_JAX_CACHE_MAX_SIZE": "1"}, directory)
    assert not any(p.name.startswith("jit_") and p.name.endswith("-cache") for p in directory.iterdir())  # the cap ran
    assert (directory / name).read_bytes() == data


def test_verify_repair_in_a_directory_the_package_did_not_make_removes_only_its_own(tmp_path: Path) -> None:
    """`verify --repair` in a framework's directory (tagged only in its bookkeeping folder): a
    link, a FIFO, or an `-atime` note another tool keeps there under an entry's name is not the
    package's to remove; corrupt entries of its own format still are."""
    from gkx_autocache import _entries, _files

    framework = tmp_path / "existing"
    framework.mkdir(mode=0o700)
    assert _files.bookkeeping_dir(str(framework), False) is not None  # what the store makes there
    (framework / f"dataset-{HEX}-cache").symlink_to(tmp_path)
    os.mkfifo(framework / f"pipe-{HEX}-cache")
    (framework / f"notes-{HEX}-atime").write_bytes(b"another tool's")
    (framework / f"jit_f-{'cd' * 32}-cache").write_bytes(zlib.compress(b"")[:-1])  # the package's format, corrupt
    doomed = {os.path.basename(p) for p in _entries.verify(str(framework)).doomed}
    assert f"jit_f-{'cd' * 32}-cache" in doomed
    assert doomed == {f"jit_f-{'cd' * 32}-cache"}, doomed


def test_another_users_link_reached_through_one_of_yours_is_refused_like_one_named_directly(here: InProcess,
                                                                                          tmp_path: Path) -> None:
    """A link of the user's own (`~/.jaxcache -> /tmp/cache`) to a name in a sticky folder that
    another user made first, as a link to a folder of the user's: the same link named directly is
    refused ("a symlink of uid 1002's"); reached through the user's own link it must be too."""
    from test_adopted import train

    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    yours = tmp_path / "project"  # any folder of the user's: the other user chooses it
    yours.mkdir(mode=0o700)
    (sticky / "cache").symlink_to(yours)
    os.lchown(sticky / "cache", 1002, 1002)
    mine = tmp_path / "jaxcache"
    mine.symlink_to(sticky / "cache")
    for given in (sticky / "cache", mine):
        ran, _ = train(here, {"GKX_JAX_CACHE_DIR": str(tmp_path / "ours")}, given)
        said = [w for w in autocache_warnings(ran.stderr) if "AutocacheWarning" in w]
        assert len(said) == 1 and "symlink of uid 1002" in said[0], (given, ran.stderr)
    assert not any(yours.iterdir())


# What JAX hands XLA for a compile: the paths of XLA's own GPU caches (its kernel cache file, its
# autotune results), which JAX puts under jax_compilation_cache_dir whenever the persistent cache is
# on and a directory is set, whether or not it set up a cache object there.
XLA_PATHS = r"""
import json, os
import jax, jax.numpy as jnp
from jax._src import compiler

seen = []
name = "backend_compile_and_load" if hasattr(compiler, "backend_compile_and_load") else "backend_compile"
original = getattr(compiler, name)

def spy(*args, **kwargs):  # what XLA is handed: the options JAX's compile ends with
    options = next(a for a in (*args, *kwargs.values()) if hasattr(a, "executable_build_options"))
    debug = options.executable_build_options.debug_options
    seen.extend(os.path.abspath(p) for p in (debug.xla_gpu_kernel_cache_file, debug.xla_gpu_per_fusion_autotune_cache_dir) if p)
    return original(*args, **kwargs)

setattr(compiler, name, spy)
refused = os.environ["REFUSED"]
if os.environ["HOW"] == "relative, then another current directory":  # jc: one's own here, another's there
    os.makedirs(os.path.join(os.environ["MINE"], "jc"), mode=0o700)
    os.chdir(os.environ["MINE"])
    jax.config.update("jax_compilation_cache_dir", "jc")
    jax.jit(lambda x: x - 1.0)(jnp.ones(3)).block_until_ready()
    os.chdir(os.path.dirname(refused))
elif os.environ["HOW"] != "env":
    jax.config.update("jax_compilation_cache_dir", refused)
if os.environ["HOW"] == "made after it was set":  # another user makes it before the first compile
    try:
        os.mkdir(refused, 0o755)
        os.chown(refused, 1002, 1002)
    except FileExistsError:  # the package made it where it judged it: this user's, private, first
        pass
jax.jit(lambda x: x + 1.0)(jnp.ones(3)).block_until_ready()
jax.jit(lambda x: x * 2.0)(jnp.ones(3)).block_until_ready()
print(json.dumps(sorted(set(seen))))
"""


@pytest.mark.parametrize("how", ["config.update", "env", "made after it was set", "relative, then another current directory"])
def test_xlas_own_caches_read_nothing_of_a_refused_directory(venv: Venv, tmp_path: Path, how: str) -> None:
    """'Read by no one' (SPEC §5/§8, amended 2026-12-06) holds for XLA's GPU caches too: a kernel
    cache file in another user's directory is code XLA loads (with `xla_caches = all`), and its
    autotune results choose the kernels (JAX's default wherever a GPU plugin is installed). Here on a
    CPU the compile options XLA is handed show where it would read. Issue 67's M2: a directory that
    did not exist when it was set, made by another user before the first compile, was refused to
    JAX's cache but left to XLA's. Now the package makes it where it judges it (this user's, 0700,
    as JAX would at its first compile): the other user's mkdir finds it there."""
    refused = tmp_path / ("elsewhere/jc" if how.startswith("relative") else "jax_cache")
    if how != "made after it was set":
        refused.mkdir(mode=0o755, parents=True)
        os.chown(refused, 1002, 1002)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "ours"), "GKX_JAX_CACHE_XLA_CACHES": "all", "HOW": how,
           "REFUSED": str(refused), "MINE": str(tmp_path / "here")}
    if how == "env":
        env["JAX_COMPILATION_CACHE_DIR"] = str(refused)
    proc = venv.run("-W", "error", "-c", XLA_PATHS, env=env)
    assert proc.returncode == 0, proc.stderr
    paths = json.loads(proc.stdout.strip().splitlines()[-1])
    if how == "made after it was set" and refused.stat().st_uid == os.getuid():  # the package's mkdir came first
        assert refused.stat().st_mode & 0o077 == 0 and not autocache_warnings(proc.stderr), proc.stderr
        return
    assert len(autocache_warnings(proc.stderr)) == (0 if how.startswith("relative") else 1), proc.stderr
    assert not [p for p in paths if p.startswith(str(refused))], paths
    if how.startswith("relative"):  # the first compile's, in one's own jc, kept them
        assert [p for p in paths if p.startswith(str(tmp_path / "here" / "jc"))], paths
    mine = dict(env, REFUSED=str(tmp_path / "mine"), HOW="config.update")  # a directory of one's own keeps them
    allowed = venv.run("-W", "error", "-c", XLA_PATHS, env=mine)
    assert allowed.returncode == 0, allowed.stderr
    assert [p for p in json.loads(allowed.stdout.strip().splitlines()[-1]) if p.startswith(str(tmp_path / "mine"))]


# Two functions of one signature: an attacker who swaps their entries in a directory JAX reads
# swaps the victim's results (issue 57: what a planted entry does, without any code of his own).
SWAPPABLE = r"""
import json, os
import jax, jax.numpy as jnp
""" + COUNTING + r"""
if os.environ.get("HOW") == "config.update":
    jax.config.update("jax_compilation_cache_dir", os.environ["PLANTED"])

@jax.jit
def f(x):
    return x + 1.0

@jax.jit
def g(x):
    return x * 10.0

x = jnp.ones(4)
print(json.dumps({**counts, "f": float(f(x).sum()), "g": float(g(x).sum())}))
"""


def _plant_for(venv: Venv, planted: Path, owner: int, mode: int) -> None:
    """Fill ``planted`` as its owner would (the same machine: the same keys), then swap the two
    functions' entries and hand it to ``owner`` with ``mode``."""
    import os

    out, _ = run_program(venv, env={"JAX_COMPILATION_CACHE_DIR": str(planted), "HOW": "env"}, program=SWAPPABLE)
    assert (out["f"], out["g"]) == (8.0, 40.0)
    (f_entry,) = planted.glob("jit_f-*-cache")
    (g_entry,) = planted.glob("jit_g-*-cache")
    f_bytes = f_entry.read_bytes()
    f_entry.write_bytes(g_entry.read_bytes())
    g_entry.write_bytes(f_bytes)
    for path in [planted, *planted.rglob("*")]:
        os.lchown(path, owner, owner)
        path.chmod(mode if path == planted or path.is_dir() else 0o644)


# -- the attacks that held: each fails where it works (they did on 1531a79) ------------------------------

FORKED = r"""
import os, sys
import jax
pid = os.fork()  # after the package configured JAX, before any compile: the child sets its own directory
if pid == 0:
    os.environ["HOW"] = "config.update"
    exec(compile(os.environ["SWAPPABLE"], "swappable", "exec"))
    sys.stdout.flush()
    os._exit(0)
_, status = os.waitpid(pid, 0)
raise SystemExit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.parametrize("how", ["a forked child", "jax_compilation_cache_max_size, env",
                                 "jax_compilation_cache_max_size, config.update"])
def test_a_refused_directory_stays_unread_in_a_fork_and_where_the_store_does_not_serve(venv: Venv, tmp_path: Path,
                                                                                       how: str) -> None:
    """Issue 57's critical, attacked where the guard differs: a child forked after the package
    configured JAX (it inherits the seams), and the user's own jax_compilation_cache_max_size (the
    store does not serve: the guard on JAX's get_file_cache alone judges), under -W error."""
    planted = tmp_path / "jax_cache"
    _plant_for(venv, planted, 1002, 0o755)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "ours"), "PLANTED": str(planted), "HOW": "config.update",
           "SWAPPABLE": SWAPPABLE}
    program = SWAPPABLE
    if how == "a forked child":
        program = FORKED
    else:
        env["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(1 << 30)
        if how.endswith("env"):
            env.update(JAX_COMPILATION_CACHE_DIR=str(planted), HOW="env")
    out, err = run_program(venv, "-W", "error", env=env, program=program)
    assert (out["f"], out["g"]) == (8.0, 40.0), (out, err)
    said = autocache_warnings(err)
    assert len(said) == 1 and "reads no entry" in said[0], err


def test_a_refused_directory_stays_unread_where_the_package_has_no_directory_of_its_own(
        here: InProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The package's own directory unusable (another user's `dir`: the run is uncached) and a refused
    directory given after import: JAX's stock cache would serve it; the guard on get_file_cache
    alone keeps it unread, under -W error. The opt-in shows the plant works (results swapped)."""
    monkeypatch.chdir(tmp_path)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 1002, 1002)
    planted = tmp_path / "jax_cache"
    env = {**THRESHOLDS, "GKX_JAX_CACHE_DIR": str(theirs)}
    victim(here, env, str(planted), tmp_path)  # filled as the victim's setup fills it: the same keys
    _swap_and_give(planted, 1002)
    ran = victim(here, env, str(planted), tmp_path, w_error=True)
    assert results(ran) == right() and ran.jax.hits == 0, ran.stderr
    assert any("reads no entry" in line for line in autocache_warnings(ran.stderr)), ran.stderr
    ran = victim(here, {**env, "GKX_JAX_CACHE_READ_UNTRUSTED_DIR": "1"}, str(planted), tmp_path)
    assert results(ran) == right()[::-1] and ran.jax.hits == 3, ran.stderr
