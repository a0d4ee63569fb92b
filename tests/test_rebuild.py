"""SPEC §18 with real JAX compiling real programs in a venv built from the wheel: records kept with
each entry written (and none on a warm run), ``gkx-autocache rebuild`` after an upgrade and after
other XLA flags, rebuild ahead, and the attacks of issue 69 (a planted or altered record, a
rebuild killed midway, two at once, devices that are gone, another platform, ``-W error``, a
fork). An upgrade is a version directory renamed to an older JAX's: the same JAX then lowers the
same modules, which is what a patch upgrade gives for most of them (docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import COUNTING, VERSION_DIR, Venv, make_venv, public_tmp

from gkx_autocache._rebuild import record

OLD_DIR = "jax-0.1.0"  # an older JAX's directory, for this JAX's records

# Six functions of a program, printing the counts and the results as exact bits.
PROGRAM = r"""
import json, sys
import jax, jax.numpy as jnp
""" + COUNTING + r"""
scale = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
x = jnp.linspace(0.0, 1.0, 64).reshape(8, 8)
fns = [jax.jit(lambda v: jnp.tanh(v @ v.T).sum(axis=0) * scale), jax.jit(lambda v: jnp.cumsum(jnp.sin(v) ** 2)),
       jax.jit(jax.grad(lambda v: (v ** 3).sum())), jax.jit(lambda v: jax.lax.scan(lambda c, y: (c + y, c * y), v[0], v)[1]),
       jax.jit(lambda v: jnp.linalg.norm(v, axis=1)), jax.jit(lambda v: jnp.sort(v.ravel()))]
bits = [jnp.asarray(f(x)).tobytes().hex() for f in fns]
print(json.dumps({**counts, "bits": bits}))
"""


@pytest.fixture(scope="module")
def shared_venv(wheel: Path) -> Iterator[Venv]:
    """One venv for the module's scenarios: each runs in a cache directory of its own."""
    base = public_tmp()
    try:
        yield make_venv(base, wheel)
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


class Cache:
    """A cache directory under ``base``, and what runs against it."""

    def __init__(self, venv: Venv, base: Path, **env: str) -> None:
        self.venv = venv
        self.root = base / "c"
        self.vdir = self.root / VERSION_DIR
        self.env = {"GKX_JAX_CACHE_DIR": str(self.root), "GKX_JAX_CACHE_REPORT": "1", **env}

    def run(self, *args: str, program: str = PROGRAM, **env: str) -> tuple[dict[str, Any], str]:
        proc = self.venv.run("-c", program, *args, env={**self.env, **env})
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return self.venv.cli(*args, env={**self.env, **env})

    def rebuild(self, *args: str, **env: str) -> dict[str, Any]:
        proc = self.cli("--json", "rebuild", *args, **env)
        assert proc.returncode == 0, proc.stderr + proc.stdout
        return dict(json.loads(proc.stdout))

    def stats(self) -> dict[str, Any]:
        return dict(json.loads(self.cli("--json", "stats").stdout)["stats"])

    def upgrade(self) -> Path:
        """The directory moved aside as an older JAX's: this JAX starts cold."""
        old = self.root / OLD_DIR
        self.vdir.rename(old)
        return old

    def names(self, suffix: str, where: Path | None = None) -> set[str]:
        return {p.name.removesuffix(suffix) for p in (where or self.vdir).glob(f"*{suffix}")}


@pytest.fixture
def cache(shared_venv: Venv, tmp_path: Path) -> Cache:
    return Cache(shared_venv, tmp_path, GKX_JAX_CACHE_REBUILD_AHEAD="0")


def test_each_entry_written_is_kept_with_its_record_and_a_warm_run_writes_none(cache: Cache) -> None:
    """A cold run writes beside each entry its record (0600, the module and what its options are
    built from, the program); a warm run writes nothing at all."""
    cold, _ = cache.run()
    entries = cache.names("-cache")
    assert entries and cache.names("-gkx-record") == entries
    for key in entries:
        path = cache.vdir / f"{key}-gkx-record"
        assert path.stat().st_mode & 0o777 == 0o600
        found = record.decode(path.read_bytes(), None)
        assert found.fields["key"] == key and found.name == key.rsplit("-", 1)[0]
        assert found.fields["platform"] == "cpu" and found.label and len(found.program) == 32
    before = {p.name: p.stat().st_mtime_ns for p in cache.vdir.iterdir() if not p.name.endswith("-cache")}
    warm, _ = cache.run()
    assert warm["hits"] == warm["requests"] == cold["requests"] and warm["bits"] == cold["bits"]
    after = {p.name: p.stat().st_mtime_ns for p in cache.vdir.iterdir() if not p.name.endswith("-cache")}
    assert {k: v for k, v in after.items() if k != ".gkx-autocache"} == \
        {k: v for k, v in before.items() if k != ".gkx-autocache"}


def test_a_compile_with_host_callbacks_is_not_recorded_and_stats_says_why(cache: Cache) -> None:
    """A function with a host callback (its compile needs this process's Python function) is
    written without a record; ``stats`` counts it by cause."""
    program = ("import jax, jax.numpy as jnp\n"
               "f = jax.jit(lambda x: jax.pure_callback(lambda v: v * 2, jax.ShapeDtypeStruct((3,), jnp.float32), x) + 1)\n"
               "g = jax.jit(lambda x: x * 3)\n"
               "print(f(jnp.ones(3)), g(jnp.ones(3)))\nprint('{}')\n")
    cache.run(program=program)
    written = cache.names("-cache")
    recorded = cache.names("-gkx-record")
    unrecorded = cache.stats()["unrecorded"]
    if any(k.startswith("jit__lambda") for k in written - recorded):  # this line caches host callbacks
        assert unrecorded == {"host callbacks": len(written - recorded)}, unrecorded
    assert recorded and all(k in written for k in recorded)


def test_rebuild_after_an_upgrade_serves_every_module_that_lowers_the_same(cache: Cache) -> None:
    """After an upgrade, ``rebuild`` compiles the older directory's records as this JAX computes
    their keys; the program's next run is all hits, of entries rebuilt, bit for bit as its cold
    run; a second rebuild finds them all there; ``stats`` counts the hits of rebuilt entries."""
    cold, _ = cache.run()
    cache.upgrade()
    dry = cache.rebuild("--dry-run")
    assert dry["would_rebuild"] == cold["requests"] and dry["rebuilt"] == 0 and not list(cache.vdir.glob("*-cache"))
    done = cache.rebuild("--jobs", "2")
    assert (done["rebuilt"], done["present"], done["failed"], done["refused"]) == (cold["requests"], 0, {}, {}), done
    assert done["sources"] == [str(cache.root / OLD_DIR), str(cache.vdir)]
    warm, line = cache.run()
    assert warm["hits"] == warm["requests"] == cold["requests"] and warm["bits"] == cold["bits"], line
    assert f"({cold['requests']} rebuilt)" in line
    stats = cache.stats()
    assert stats["rebuilt"] == cold["requests"] and stats["rebuilt_hits"] == cold["requests"], stats
    again = cache.rebuild()
    assert (again["rebuilt"], again["present"]) == (0, cold["requests"])
    text = cache.cli("rebuild").stdout
    assert f"{cold['requests']} already there" in text


def test_rebuild_after_other_xla_flags_serves_the_next_run(cache: Cache) -> None:
    """Other ``XLA_FLAGS``: this directory's records, compiled under the new flags, serve the
    run under them (the module is the same; only the compile differs). The command's own report
    line (``report``) names what it rebuilt as the command's, not as rebuilt ahead."""
    cold, _ = cache.run()
    flags = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false"}
    proc = cache.cli("--json", "rebuild", "--from", "this", GKX_JAX_CACHE_REPORT="1", **flags)
    assert proc.returncode == 0, proc.stderr
    done = json.loads(proc.stdout)
    assert done["rebuilt"] == cold["requests"] and done["failed"] == {}, done
    # The command's own process reports what it rebuilt, not "ahead" (nothing ran that it was ahead of).
    (report,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("gkx-autocache:")]
    assert f"{cold['requests']} entries rebuilt by the rebuild command," in report and "ahead" not in report, report
    warm, _ = cache.run(**flags)
    assert warm["hits"] == warm["requests"] == cold["requests"] and warm["bits"] == cold["bits"]


def test_rebuild_ahead_serves_a_run_after_an_upgrade_and_not_after_a_code_change(shared_venv: Venv,
                                                                                   tmp_path: Path) -> None:
    """Ahead (the default): the first run after an upgrade rebuilds its program's entries in the
    background, and its lookups are served from them (the first lookup, which started it, may be
    its own compile); a later run whose code changed rebuilds nothing."""
    cache = Cache(shared_venv, tmp_path)
    cold, _ = cache.run()
    cache.upgrade()
    ahead, line = cache.run()
    assert ahead["bits"] == cold["bits"]
    assert ahead["hits"] >= cold["requests"] - 2 and "rebuilt ahead" in line, line
    changed, line = cache.run("4.0")  # another constant: a code change
    assert "rebuilt ahead" not in line and changed["hits"] >= cold["requests"] - 1, line


def test_rebuild_ahead_is_off_when_set_off(cache: Cache) -> None:
    """``rebuild_ahead = false``: a run after an upgrade compiles its own, as before."""
    cold, _ = cache.run()
    cache.upgrade()
    run, line = cache.run()
    assert run["hits"] == 0 and "rebuilt" not in line, line


# -- the attacks (issue 69) --------------------------------------------------------------------------


def test_a_record_planted_or_altered_is_never_compiled(cache: Cache) -> None:
    """A record another user owns, one whose module was changed in place (its digest no longer
    agrees), and one a keyless writer left where a signing key is set are refused, each said;
    the others are rebuilt."""
    cold, _ = cache.run()
    old = cache.upgrade()
    keys = sorted(cache.names("-gkx-record", old))
    os.chown(old / f"{keys[0]}-gkx-record", 4242, 4242)
    data = bytearray((old / f"{keys[1]}-gkx-record").read_bytes())
    data[-40:-30] = b"\x00" * 10
    (old / f"{keys[1]}-gkx-record").write_bytes(bytes(data))
    done = cache.rebuild()
    assert done["rebuilt"] == cold["requests"] - 2, done
    assert sum(done["refused"].values()) == 2 and any("not this user's" in why for why in done["refused"]), done
    signed = cache.rebuild(GKX_JAX_CACHE_SIGNING_KEY="k")  # every record here is unsigned: none read
    assert signed["records"] == 0 and any("not signed" in why for why in signed["refused"]), signed


def test_a_rebuild_killed_midway_leaves_whole_entries_and_the_next_one_finishes(cache: Cache) -> None:
    """A rebuild killed (SIGKILL) while it compiles leaves no partial entry; the next rebuild
    skips what the first wrote and compiles the rest; two at once: the second says so."""
    cold, _ = cache.run()
    cache.upgrade()
    proc = subprocess.Popen([cache.venv.python, "-m", "gkx_autocache", "rebuild", "--jobs", "1"],
                            env={**cache.venv.env, **cache.env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(cache.vdir.glob("*-cache")):
        time.sleep(0.05)
    second = cache.cli("rebuild")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if proc.returncode == -signal.SIGKILL and second.returncode:  # (it may have finished first on a quick machine)
        assert "another rebuild runs" in second.stderr, second.stderr
    assert not [p for p in cache.vdir.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]
    done = cache.rebuild()
    assert done["rebuilt"] + done["present"] == cold["requests"] and done["failed"] == {}, done
    warm, _ = cache.run()
    assert warm["hits"] == cold["requests"] and warm["bits"] == cold["bits"]


def test_records_of_devices_gone_or_another_platform_are_said_not_compiled(cache: Cache) -> None:
    """A record of a device this process does not have (a run on 4 CPU devices, rebuilt on one)
    and one of another platform are said by cause; nothing is compiled for them."""
    program = ("import jax, jax.numpy as jnp\n"
               "d = jax.devices()[3]\n"
               "print(jax.jit(lambda x: x * 2)(jax.device_put(jnp.ones(4), d)))\nprint('{}')\n")
    cache.run(program=program, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    old = cache.upgrade()
    on_zero = [p for p in old.glob("*-gkx-record") if record.decode(p.read_bytes(), None).fields["devices"] == [0]]
    for path in on_zero[:1]:  # one record made another platform's (unsigned: this user's own)
        found = record.decode(path.read_bytes(), None)
        path.write_bytes(record.encode({**found.fields, "platform": "tpu"}, found.module, None))
    done = cache.rebuild()
    assert done["rebuilt"] == len(on_zero) - 1 and len(done["failed"]) == 2, done
    assert any("device 3 is not here" in why for why in done["failed"]), done
    assert any(why.startswith("not here: no tpu") for why in done["failed"]), done


def test_ahead_under_w_error_and_a_fork_never_costs_the_program(shared_venv: Venv, tmp_path: Path) -> None:
    """Under ``-W error``, a program forked before its first compile (the multiprocessing pattern),
    parent and child each meeting the upgrade's cold start with ahead on: both finish with the
    results of the cold run, no warning from the package, and the entries are whole."""
    cache = Cache(shared_venv, tmp_path)
    cold, _ = cache.run()
    cache.upgrade()
    forking = PROGRAM.replace("scale = float", "import os\npid = os.fork()\nscale = float").replace(
        'print(json.dumps({**counts, "bits": bits}))', """
expected = sys.argv[1]
if pid == 0:
    os._exit(0 if json.dumps(bits) == expected else 3)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
print(json.dumps({**counts, "bits": bits}))""").replace("float(sys.argv[1]) if len(sys.argv) > 1 else 3.0", "3.0")
    proc = shared_venv.run("-W", "error", "-c", forking, json.dumps(cold["bits"]), env=cache.env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["bits"] == cold["bits"]
    assert "Warning" not in proc.stderr, proc.stderr
    warm, _ = cache.run()
    assert warm["hits"] == cold["requests"] and warm["bits"] == cold["bits"]


def test_rebuild_with_nothing_to_read_says_so(cache: Cache) -> None:
    """No records anywhere: one line, nothing done, exit 0; an unknown ``--from``: one line, exit 1."""
    proc = cache.cli("rebuild")
    assert proc.returncode == 0 and "no records to rebuild from" in proc.stdout, proc.stdout + proc.stderr
    bad = cache.cli("rebuild", "--from", "9.9.9")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr and "--from 9.9.9" in bad.stderr
    shutil.rmtree(cache.root, ignore_errors=True)


SCRIPT = """
import json, sys
import jax, jax.numpy as jnp

def step(v):
    return jnp.tanh(v @ v.T).sum(axis=0) * SCALE

def decay(v):
    return jnp.cumsum(jnp.sin(v) ** 2)

x = jnp.linspace(0.0, 1.0, 64).reshape(8, 8)
print(json.dumps([jnp.asarray(jax.jit(f)(x)).tobytes().hex() for f in (step, decay)]))
"""


def test_a_miss_whose_module_changed_across_the_upgrade_stays_changed_jax(cache: Cache, tmp_path: Path) -> None:
    """After an upgrade and a rebuild, a function whose module is not the one the older JAX lowered
    (here: its code, as a JAX that lowers it otherwise would make it) misses as ``changed JAX``,
    which says that its entries here were rebuilt and this compile is not one of them; the function
    that lowers the same is a hit of a rebuilt entry."""
    script = tmp_path / "sim.py"
    script.write_text(SCRIPT.replace("SCALE", "3.0"))
    proc = cache.venv.run(str(script), env=cache.env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    cache.upgrade()
    assert cache.rebuild()["rebuilt"] > 0
    script.write_text(SCRIPT.replace("SCALE", "4.0"))
    proc = cache.venv.run(str(script), env=cache.env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    explained = json.loads(cache.cli("--json", "explain").stdout)
    groups = {g["cause"]: {f["name"]: f["detail"] for f in g["functions"]} for g in explained["groups"]}
    assert set(groups) == {"changed JAX"}, groups
    (detail,) = groups["changed JAX"].values()
    assert "were rebuilt from the records of 0.1.0" in detail and "this compile is not one of them" in detail, detail
    assert cache.stats()["rebuilt_hits"] >= 1


def test_a_child_forked_while_ahead_rebuilds_does_not_keep_the_rebuild_lock(shared_venv: Venv, tmp_path: Path) -> None:
    """A child forked while rebuild ahead holds the directory's rebuild lock (a worker pool started
    after the first compile) does not hold it: once the parent is done, ``rebuild`` runs while the
    child lives on (an ``flock`` is its open file's, and a child inherits the descriptor)."""
    cache = Cache(shared_venv, tmp_path)
    many = PROGRAM.replace("fns = [", "fns = [*(jax.jit(lambda v, i=i: jnp.tanh(v + i) @ v) for i in range(24)), ")
    script = tmp_path / "train.py"
    script.write_text(many)
    assert shared_venv.run(str(script), env=cache.env, cwd=str(tmp_path)).returncode == 0
    cache.upgrade()
    script.write_text(many.replace("bits = [", """import fcntl, os, time
fns[0](x)
lock = os.path.join(os.environ["GKX_JAX_CACHE_DIR"], "VERSION_DIR", ".gkx-autocache", "rebuild.lock")
deadline = time.monotonic() + 60
while time.monotonic() < deadline:  # until rebuild ahead holds the lock
    try:
        fd = os.open(lock, os.O_RDWR)
    except OSError:
        continue
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    except OSError:
        break
    finally:
        os.close(fd)
child = os.fork()
if child == 0:
    for out in (1, 2):  # (the test reads the parent's output to its end)
        os.dup2(os.open(os.devnull, os.O_WRONLY), out)
    time.sleep(120)
    os._exit(0)
print("child", child)
bits = [""".replace("VERSION_DIR", VERSION_DIR)))
    proc = shared_venv.run(str(script), env=cache.env, cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 0 and "rebuilt ahead" in proc.stderr, proc.stderr
    (child,) = [int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("child ")]
    try:
        done = cache.cli("--json", "rebuild")
        assert done.returncode == 0 and "another rebuild runs" not in done.stderr, done.stderr
    finally:
        os.kill(child, signal.SIGKILL)


SLOW = r"""
import functools, os, sys, time
import jax, jax.numpy as jnp
from gkx_autocache import _store
from gkx_autocache._rebuild import ahead

x = jnp.ones((16, 16))
slow = jax.jit(lambda v: functools.reduce(lambda a, i: jnp.sin(a @ a.T + i) * jnp.cos(a), range(150), v))
if os.environ.get("COLD"):
    slow(x).block_until_ready()
else:
    ahead.EXIT_WAIT = 0.1
    jax.jit(lambda v: v + 1)(jnp.ones(3))  # a miss of a key with no record: ahead starts
    rebuilds = _store.current()._rebuilds
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not getattr(rebuilds._rebuild, "_compiling", 0):
        time.sleep(0.01)
    print("compiling" if rebuilds._rebuild._compiling else "done", flush=True)
"""


@pytest.mark.once  # the package's waiting, the same on every line (48 s on JAX 0.12, 10 s on 0.10)
def test_a_program_that_exits_while_ahead_compiles_exits_whole(shared_venv: Venv, tmp_path: Path) -> None:
    """A program that ends while rebuild ahead is in a compile longer than the exit's wait exits
    with its own status: a thread that comes back from XLA once the interpreter finalizes would
    abort the process ("terminate called ... FATAL: exception not rethrown")."""
    cache = Cache(shared_venv, tmp_path)
    script = tmp_path / "train.py"
    script.write_text(SLOW)
    cold = shared_venv.run(str(script), env={**cache.env, "COLD": "1"}, cwd=str(tmp_path), timeout=300)
    assert cold.returncode == 0, cold.stderr
    cache.upgrade()
    proc = shared_venv.run(str(script), env=cache.env, cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 0 and proc.stdout.split() == ["compiling"], proc.stdout + proc.stderr
    assert "terminate" not in proc.stderr and "FATAL" not in proc.stderr, proc.stderr


@pytest.mark.once  # the package's waiting, the same on every line (48 s on JAX 0.12, 10 s on 0.10)
def test_a_rebuild_interrupted_mid_compile_ends_whole(shared_venv: Venv, tmp_path: Path) -> None:
    """Ctrl-C on ``rebuild`` while it compiles: it stops taking records, lets the compile running
    end, and exits 1 with whole entries only; never the abort of a thread that comes back from XLA
    while the interpreter finalizes ("terminate called ... FATAL: exception not rethrown")."""
    cache = Cache(shared_venv, tmp_path)
    script = tmp_path / "train.py"
    script.write_text(SLOW)
    cold = shared_venv.run(str(script), env={**cache.env, "COLD": "1"}, cwd=str(tmp_path), timeout=300)
    assert cold.returncode == 0, cold.stderr
    cache.upgrade()
    proc = subprocess.Popen([cache.venv.python, "-m", "gkx_autocache", "rebuild", "--jobs", "1"],
                            env={**cache.venv.env, **cache.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # The command compiles the longest recorded first: the slow one holds its lease while it
    # compiles, before any entry is written (waiting for the small ones' entries, as this test did
    # before the order changed, let the whole rebuild end before the Ctrl-C now and then).
    leases = cache.vdir / ".gkx-autocache" / "leases"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (leases.is_dir() and any(leases.iterdir())):
        time.sleep(0.02)
    time.sleep(0.3)
    assert proc.poll() is None and not list(cache.vdir.glob("*-cache")), "the slow compile is over already"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "terminate" not in err and "FATAL" not in err, (proc.returncode, err)
    assert not [p for p in cache.vdir.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]


def test_the_keying_makes_one_mlir_context_a_thread_not_one_a_module(shared_venv: Venv) -> None:
    """Making an MLIR context registers every dialect under the GIL (50 ms a module on the TPU v5e's
    host: the rebuild's keying held the program's tracing and the compiles' writes for 4.4 s of 84
    modules): the keying thread parses every module into one context of its own; another thread,
    into another (a context is never shared between threads)."""
    code = """
import threading
import jax, jax.numpy as jnp
from jax._src.interpreters import mlir
from gkx_autocache._jax.rebuild import Rebuilder
data = [mlir.module_to_bytecode(jax.jit(lambda x, k=k: x * k).lower(jnp.ones(3)).compiler_ir()) for k in (2, 3, 4)]
r = Rebuilder()
assert r.problem is None, r.problem
mine = {id(r.parse(d).context) for d in data}
other = []
t = threading.Thread(target=lambda: other.extend(id(r.parse(d).context) for d in data))
t.start(); t.join()
print(len(mine), len(set(other)), len(mine | set(other)))
"""
    proc = shared_venv.run("-c", code, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "1", "2"], proc.stdout


def test_a_threads_mlir_context_is_made_again_once_many_modules_were_parsed_into_it(shared_venv: Venv) -> None:
    """A context keeps what is parsed into it (a module's constants) until it is freed: the keying
    thread's, which parses every record of the directory, held them all (24 MB of modules kept
    18 MB, where a context a module kept 2). A thread's context is made again after a bound of
    modules' bytes, not after each module."""
    code = """
import jax, jax.numpy as jnp
from jax._src.interpreters import mlir
from gkx_autocache._jax import rebuild
data = mlir.module_to_bytecode(jax.jit(lambda x: jnp.sin(x) * 2).lower(jnp.ones(8)).compiler_ir())
rebuild.CONTEXT_BYTES = 10 * len(data)  # (a closed-over constant is an argument on some JAX lines: no large module)
made = []
make = mlir.make_ir_context
mlir.make_ir_context = lambda: made.append(1) or make()  # (JAX 0.12's reuses its own a thread, ten times)
r = rebuild.Rebuilder()
assert r.problem is None, r.problem
for _ in range(48):
    r.parse(data)
print(len(made))
"""
    proc = shared_venv.run("-c", code, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert 4 <= int(proc.stdout) <= 6, proc.stdout  # a context asked for every 11 modules


def test_each_compile_is_given_the_modules_bytes_and_only_the_keying_thread_parses(cache: Cache) -> None:
    """XLA compiles a module without the GIL and loads dialects into its MLIR context: a module the
    keying thread parsed, compiled while that thread parses the next one into the same context, is a
    data race. A compile is given the record's bytes, which XLA parses into a context of its own (as
    JAX's own compile did through 0.7); no compiling thread makes a Python MLIR context, which costs
    50 ms of the GIL each on the TPU v5e's host, every other thread waiting."""
    cache.run()
    cache.upgrade()
    probe = """
import json, sys, threading
import gkx_autocache
from gkx_autocache._jax import rebuild
from gkx_autocache._rebuild import engine
parsers, given, order = set(), [], []
parse, compile_, run = rebuild.Rebuilder.parse, rebuild.Rebuilder.compile, engine.Rebuild.run
def run_(self, found):
    order.extend(float(f.record.fields["compile"]) for f in found)
    return run(self, found)
engine.Rebuild.run = run_
def parse_(self, data):
    parsers.add(threading.get_ident())
    return parse(self, data)
def compile__(self, backend, module, *rest):
    given.append(type(module).__name__)
    return compile_(self, backend, module, *rest)
rebuild.Rebuilder.parse, rebuild.Rebuilder.compile = parse_, compile__
from gkx_autocache._cli.main import main
try:
    main(["--json", "rebuild", "--jobs", "2"])
except SystemExit:
    pass
print(json.dumps([len(parsers), given, order]))
"""
    proc = cache.venv.run("-c", probe, env=cache.env)
    assert proc.returncode == 0, proc.stderr
    parsers, given, order = json.loads(proc.stdout.strip().splitlines()[-1])
    assert given and set(given) == {"bytes"}, given
    assert parsers == 1, parsers
    # The command starts the longest recorded compiles first (no program waits on its order).
    assert len(order) == len(given) and order == sorted(order, reverse=True) and order[0] > order[-1], order
