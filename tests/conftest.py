"""Fixtures for the three rings of tests: pure units, in-process hooks, and real interpreters in
real virtual environments built from the wheel, running real JAX.

A test venv gets the wheel (installed with uv, as users do) and a ``zz_test_deps.pth`` whose one
path line lets it import JAX and platformdirs from the environment running pytest. A path line
adds a folder to ``sys.path`` without running the ``.pth`` files inside it, so the runner's own
install of the package stays inert there.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import inspect
import io
import json
import os
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import types
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import servers

ROOT = Path(__file__).resolve().parent.parent
RUNNER_SITE = sysconfig.get_paths()["purelib"]

# The runner may have the package installed (pip install -e .): keep this pytest process's own
# imports of jax unconfigured, so in-process tests start clean.
sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "__name__", None) != "GkxAutocacheFinder"]


def load_benchmark(name: str) -> Any:
    """``benchmarks/<name>.py`` as a module: a program a test runs as the benchmark does."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without any of the user's cache settings, and a private home. ``CI`` goes too:
    the suite runs the same in CI as here, and the tests of CI behaviour set it themselves."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GKX_JAX_CACHE", "JAX_", "XDG_", "PYTHON")) and k != "CI"}
    env.update(JAX_PLATFORMS="cpu", PYTHONDONTWRITEBYTECODE="1")
    env.update(extra)
    return env


def as_user(uid: int, command: list[str], groups: tuple[int, ...] = ()) -> list[str]:
    """``command`` as ``uid`` (primary group ``uid``, and the supplementary ``groups``), able to
    reach the interpreter and the runner's packages.

    Python here lives under /root, which is 0700 (SPEC §12). In a private mount namespace,
    /root is covered by a 0755 tmpfs into which only the folders the interpreter needs are
    bound back: nothing on the machine changes, and the process is a real non-root user.
    """
    import shlex

    groups_flag = f"--groups {','.join(map(str, groups))}" if groups else "--clear-groups"
    script = " && ".join([*_root_covered(), f"exec setpriv --reuid {uid} --regid {uid} {groups_flag} {shlex.join(command)}"])
    return ["unshare", "-m", "sh", "-c", script]


def _root_covered() -> list[str]:
    """Shell commands that, in a private mount namespace, cover /root with a 0755 tmpfs into which
    only the interpreter's folders and the runner's packages are bound back."""
    import shlex

    needed = {os.path.realpath(sys.base_prefix), os.path.realpath(RUNNER_SITE)}
    binds = []
    for path in sorted(p for p in needed if p.startswith("/root/")):
        rel = shlex.quote(os.path.relpath(path, "/root"))
        binds.append(f"mkdir -p /root/{rel} && mount --bind /tmp/.gkx-root/{rel} /root/{rel}")
    return ["mount --make-rprivate /", "mkdir -p /tmp/.gkx-root", "mount --bind /root /tmp/.gkx-root",
            "mount -t tmpfs -o mode=755 gkx-test /root", *binds]


def in_a_child_as(uid: int, groups: tuple[int, ...], call: Any) -> Any:
    """``call()`` in a forked child of this process that is ``uid`` (primary group ``uid``, and the
    supplementary ``groups``), real and effective, as ``as_user`` makes a command: the kernel
    checks each access as that user's, and ``os.getuid()`` says so. Its result comes back pickled;
    an exception in it fails the caller with the child's traceback."""
    import ctypes
    import pickle
    import traceback

    read, write = os.pipe()
    with warnings.catch_warnings():
        # (3.12 warns of a fork in a process with threads: the child runs ``call`` alone and exits)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(read)
            # CLONE_NEWNS: the cover over /root is the child's alone
            if ctypes.CDLL(None, use_errno=True).unshare(0x00020000) != 0:
                raise OSError(ctypes.get_errno(), "unshare")
            subprocess.run(["sh", "-c", " && ".join(_root_covered())], check=True)
            os.setgroups(list(groups))
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            outcome = (True, call())
        except BaseException:
            outcome = (False, traceback.format_exc())
        try:
            with os.fdopen(write, "wb") as f:
                pickle.dump(outcome, f)
        except BaseException:
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    done, value = pickle.loads(data) if data else (False, "the child wrote nothing")
    if not done:
        raise AssertionError(f"in the child as uid {uid}:\n{value}")
    return value


@dataclass
class Venv:
    path: Path
    home: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    @property
    def site(self) -> Path:
        return Path(self.run("-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", check=True).stdout.strip())

    @property
    def default_cache(self) -> Path:
        return self.path / ".cache" / "gkx" / "jax"

    def run(self, *args: str, env: dict[str, str] | None = None, check: bool = False, user: int | None = None,
            cwd: str | None = None, timeout: float = 600, groups: tuple[int, ...] = ()) -> subprocess.CompletedProcess[str]:
        full = {**self.env, **(env or {})}
        command = [self.python, *args]
        if user is not None:
            command = as_user(user, command, groups)
        proc = subprocess.run(command, env=full, capture_output=True, text=True, check=False,
                              cwd=cwd or str(self.home), timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return proc

    def cli(self, *args: str, env: dict[str, str] | None = None, user: int | None = None,
            groups: tuple[int, ...] = ()) -> subprocess.CompletedProcess[str]:
        return self.run("-m", "gkx_autocache", *args, env=env, user=user, groups=groups)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True)
    (found,) = out.glob("gkx_autocache-*.whl")
    return found


def public_tmp() -> Path:
    """A folder whose ancestors are 0755 (pytest's are 0700), so that uid 65534 can reach it."""
    path = Path(tempfile.mkdtemp(prefix="gkx-test-", dir="/tmp"))
    path.chmod(0o755)
    return path


REMOTE_EXTRA = ("etils", "fsspec", "s3fs", "gcsfs")


def deps_without(base: Path, names: tuple[str, ...]) -> Path:
    """A folder that shows the runner's packages, less ``names`` (and their metadata)."""
    import re

    only = base / "deps-without"
    only.mkdir()
    for entry in Path(RUNNER_SITE).iterdir():
        top = re.split(r"[-.]", entry.name, maxsplit=1)[0].lower()
        if top not in names and entry.suffix != ".pth":
            (only / entry.name).symlink_to(entry)
    return only


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that runs real JAX in a test venv checks what the JAX line does (the store, the levels,
    explanations): marked ``line``, which .ci/run runs on the first Python of each JAX line (3.12
    and 3.13 both run JAX 0.12). Unless marked ``every_python``: what it checks is the interpreter's.
    A test venv is built from the wheel: a test that asks for it, through ``venv`` or a scenario
    of its own (``make_venv``), is such a test."""
    for item in items:
        if "wheel" in getattr(item, "fixturenames", ()) and item.get_closest_marker("every_python") is None:
            item.add_marker(pytest.mark.line)


# Modules whose tests share one costly scenario: one xdist worker runs each. Spread over two, the
# other worker would wait out the GPT-like model's runs on their lock (minutes), or make a benchmark
# section or an old JAX line's venv again.
ONE_WORKER = ("test_explain_models.py", "test_benchmarks.py", "test_jax_lines.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's ``load`` distribution, where each module of ONE_WORKER is one unit of work,
    handed out first (the largest units go first). Marks and ``--dist loadgroup`` would say this,
    but pytest-xdist 3.8 names a group by setting ``item._nodeid``, which pytest 9.2 no longer
    reads: the group's tests went to both workers."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class OneWorkerModules(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if path.rsplit("/", 1)[-1] in ONE_WORKER else nodeid

    return OneWorkerModules(config, log)


def make_venv(base: Path, wheel: Path | None, *, deps: bool = True, editable: str | None = None,
              without: tuple[str, ...] = ()) -> Venv:
    path = base / "venv"
    subprocess.run([sys.executable, "-m", "uv", "venv", "-q", "--python", sys.executable, str(path)], check=True,
                   capture_output=True)
    home = base / "home"
    home.mkdir(mode=0o755)
    venv = Venv(path, home, clean_env(HOME=str(home)))
    if deps and without:
        (venv.site / "zz_test_deps.pth").write_text(f"{deps_without(base, without)}\n")
    elif deps:
        (venv.site / "zz_test_deps.pth").write_text(RUNNER_SITE + "\n")
    else:  # platformdirs, a required dependency, without JAX
        only = base / "deps-without-jax"
        only.mkdir()
        (only / "platformdirs").symlink_to(Path(RUNNER_SITE) / "platformdirs")
        (venv.site / "zz_test_deps.pth").write_text(f"{only}\n")
    # After the deps line: an editable build finds hatchling through it.
    target = str(path / "bin" / "python")
    if editable == "pip":
        command = ["pip", "--python", target, "install", "--no-build-isolation", "-e", str(ROOT)]
    elif editable == "uv":
        command = ["uv", "pip", "install", "--python", target, "--no-build-isolation", "-e", str(ROOT)]
    else:
        command = ["uv", "pip", "install", "--python", target, str(wheel)] if wheel else []
    if command:
        proc = subprocess.run([sys.executable, "-m", *command, "-q", "--no-deps"], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    return venv


@pytest.fixture
def venv(wheel: Path) -> Iterator[Venv]:
    """A fresh venv with the wheel installed, and JAX reachable."""
    base = public_tmp()
    try:
        yield make_venv(base, wheel)
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


@pytest.fixture
def public() -> Iterator[Path]:
    """A folder every test user can reach (its ancestors are 0755), removed afterwards."""
    path = public_tmp()
    try:
        yield path
    finally:
        subprocess.run(["rm", "-rf", str(path)], check=False)


@pytest.fixture
def bare_venv(wheel: Path) -> Iterator[Venv]:
    """A fresh venv with the wheel installed and no JAX anywhere."""
    base = public_tmp()
    try:
        yield make_venv(base, wheel, deps=False)
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


# A child's own peak resident memory in bytes, as an expression to run in it: VmHWM, the peak of its
# own image. ru_maxrss keeps the forking parent's peak across exec: in a pytest worker, the worker's
# (a review measured 310 MiB for a child that used 8), which hid the child's and failed tests by load.
PEAK_RSS = 'next(int(_ln.split()[1]) for _ln in open("/proc/self/status") if _ln.startswith("VmHWM:")) * 1024'

# Counts JAX's cache lookups and hits in ``counts``, from JAX's own monitoring events.
COUNTING = r"""
counts = {"requests": 0, "hits": 0}
def listen(event, *a, **k):
    if event == "/jax/compilation_cache/compile_requests_use_cache": counts["requests"] += 1
    elif event == "/jax/compilation_cache/cache_hits": counts["hits"] += 1
jax.monitoring.register_event_listener(listen)
"""

# A small real JAX program: prints, as its last line, JSON with the cache counts and the result.
PROGRAM = r"""
import json, sys
import jax, jax.numpy as jnp
""" + COUNTING + r"""

@jax.jit
def f(x):
    return jnp.tanh(x @ x.T).sum(axis=0) * 3.0
@jax.jit
def g(x):
    return jnp.cumsum(jnp.sin(x) ** 2)
x = jnp.linspace(0.0, 1.0, 64).reshape(8, 8)
result = float(f(x).sum()) + float(g(x.ravel()).sum())
c = jax.config
print(json.dumps({**counts, "result": round(result, 4), "dir": c.jax_compilation_cache_dir,
    "min_compile": c.jax_persistent_cache_min_compile_time_secs,
    "min_entry": c.jax_persistent_cache_min_entry_size_bytes,
    "xla_caches": c.jax_persistent_cache_enable_xla_caches,
    "enabled": c.jax_enable_compilation_cache}))
"""


def run_program(venv: Venv, *flags: str, env: dict[str, str] | None = None, user: int | None = None,
                program: str = PROGRAM, groups: tuple[int, ...] = ()) -> tuple[dict[str, Any], str]:
    """Run PROGRAM; return its JSON line and its stderr."""
    import json

    proc = venv.run(*flags, "-c", program, env=env, user=user, groups=groups)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def autocache_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "AutocacheWarning" in line or line.startswith("gkx-autocache:")]


# -- a real S3-compatible server (moto's standalone server) on 127.0.0.1 -------------------------------

def stop(process: subprocess.Popen[bytes]) -> None:
    """A server this test started (nginx, tinyproxy: ``servers.start``): asked to end, then made to."""
    servers.stop(process)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SERVER_KEYS: dict[str, tuple[str, str]] = {}  # endpoint -> the access key its server checks signatures with


@dataclass
class S3:
    endpoint: str
    bucket: str

    @property
    def keys(self) -> tuple[str, str]:
        return SERVER_KEYS.get(self.endpoint, ("testing", "testing"))

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.keys[0], "AWS_SECRET_ACCESS_KEY": self.keys[1],
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                            aws_access_key_id=self.keys[0], aws_secret_access_key=self.keys[1])

    def objects(self, prefix: str = "") -> dict[str, int]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}


def start_s3_server(tls: tuple[Path, Path] | None = None) -> tuple[str, subprocess.Popen[bytes]]:
    """moto's S3 server on a free port of 127.0.0.1 (``tls``: a certificate and key, served over
    https), checking every request's signature as S3 does: its first three requests (unchecked) make
    an IAM user, its access key and a policy that lets it do anything; every later request must be
    signed with that key (``S3.env``), or it is refused (403 SignatureDoesNotMatch,
    InvalidAccessKeyId). The endpoint, and the server's process (``stop_s3_server``)."""
    import boto3

    port = free_port()
    more = ["-c", str(tls[0]), "-k", str(tls[1])] if tls else []
    server = servers.start([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port), *more],
                           env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"},
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()  # a request would count
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.2)
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="setup",
                           aws_secret_access_key="setup", verify=str(tls[0]) if tls else None)
        iam.create_user(UserName="gkx")
        made = iam.create_access_key(UserName="gkx")["AccessKey"]
        iam.put_user_policy(UserName="gkx", PolicyName="all", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        SERVER_KEYS[endpoint] = (made["AccessKeyId"], made["SecretAccessKey"])
    except BaseException:
        stop_s3_server(endpoint, server)
        raise
    return endpoint, server


def stop_s3_server(endpoint: str, server: subprocess.Popen[bytes]) -> None:
    SERVER_KEYS.pop(endpoint, None)
    servers.stop(server, timeout=30)


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    """moto's S3 server for the module's tests (``start_s3_server``)."""
    endpoint, server = start_s3_server()
    try:
        yield endpoint
    finally:
        stop_s3_server(endpoint, server)


@pytest.fixture
def s3(s3_server: str) -> S3:
    store = S3(s3_server, f"gkx-{uuid.uuid4().hex[:12]}")
    store.client().create_bucket(Bucket=store.bucket)
    return store


JAX_VERSION = __import__("importlib.metadata").metadata.version("jax")
VERSION_DIR = f"jax-{JAX_VERSION}"


class Project:
    """A folder of module files and a cache beside it; runs and reads `explain`."""

    def __init__(self, venv: Venv, base: Path) -> None:
        self.venv = venv
        self.folder = base / "proj"
        self.folder.mkdir()
        self.env = {"GKX_JAX_CACHE_DIR": str(base / "c"), "GKX_JAX_CACHE_REPORT": "1"}
        self.vdir = base / "c" / VERSION_DIR

    def write(self, name: str, source: str) -> None:
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)

    def run(self, script: str = "main.py", **extra: str) -> str:
        """Run a script; its report line."""
        proc = self.venv.run(str(self.folder / script), env={**self.env, **extra}, cwd=str(self.folder))
        assert proc.returncode == 0, proc.stderr
        (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("gkx-autocache:")]
        return line

    def explain(self, *args: str) -> dict[str, Any]:
        proc = self.venv.cli("--json", "explain", *args, env=self.env)
        assert proc.returncode == 0, proc.stderr
        data: dict[str, Any] = json.loads(proc.stdout)
        assert data["unavailable"] is None, data
        return data

    def last(self) -> dict[str, dict[str, str]]:
        """The last run's misses: {cause: {function: its latest detail}}."""
        return causes(self.explain()["groups"])


def causes(groups: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {g["cause"]: {f["name"]: f["detail"] for f in g["functions"]} for g in groups}


@pytest.fixture
def project(venv: Venv, tmp_path: Path) -> Project:
    """A ``Project`` in ``tmp_path``, run in ``venv``."""
    return Project(venv, tmp_path)


def cache_files(vdir: Path) -> list[Path]:
    """A version directory's entries (``-cache`` files), sorted."""
    return sorted(p for p in vdir.iterdir() if p.name.endswith("-cache"))


# -- an environment in this process (ring 2): the command line without a venv ----------------------

@contextlib.contextmanager
def fresh_stderr(error: bool = False) -> Iterator[None]:
    """What a fresh interpreter prints on stderr: its warnings (not recorded by pytest, nor raised by
    its ``filterwarnings = error``; with ``error``, as under ``-W error``), and the package's log
    lines of WARNING and above (logging's last resort: pytest's handlers catch them here)."""
    import logging

    def show(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    logger = logging.getLogger("gkx_autocache")
    handler = logging.StreamHandler()  # (its stream: sys.stderr when made, the redirected one)
    handler.setLevel(logging.WARNING)
    # A fresh process's logger: this handler alone, no level of its own. One an earlier call left
    # (`-v` adds a handler on the stderr of its time, since closed) is set aside and put back after.
    saved = logger.handlers[:], logger.level, logger.propagate
    logger.handlers = [handler]
    logger.setLevel(logging.NOTSET)
    logger.propagate = False
    try:
        with warnings.catch_warnings():
            warnings.resetwarnings()
            warnings.simplefilter("error" if error else "default")
            warnings.showwarning = show
            yield
    finally:
        logger.handlers, level, logger.propagate = saved
        logger.setLevel(level)


def fresh_filesystems(patch: pytest.MonkeyPatch) -> None:
    """fsspec keeps one filesystem per class and options for the process's life (an S3 client bound
    to the endpoint of its first use): a fresh process has none, and another test's are kept."""
    spec = sys.modules.get("fsspec.spec")
    classes = [spec.AbstractFileSystem] if spec is not None else []
    while classes:
        cls = classes.pop()
        patch.setattr(cls, "_cache", {})
        classes += cls.__subclasses__()


class InProcess:
    """An environment of its own in this pytest process: a folder that stands for ``sys.prefix``
    (its ``.cache/gkx/jax`` is the default directory, its ``gkx-autocache.toml`` the policy file), a
    home, and the environment a test venv's process gets (``clean_env``). ``cli`` runs the command
    line's ``main`` as ``Venv.cli`` runs the installed command: same arguments, and what comes back
    (exit status, stdout, stderr) in a ``CompletedProcess``; a fresh interpreter's warning filters
    and once-a-process warnings. For a command on a planted cache, the settings, a directory's
    trust: what needs no installed wheel, no JAX and no fresh interpreter."""

    def __init__(self, base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = base / "venv"
        self.path.mkdir()
        self.home = base / "home"
        self.home.mkdir(mode=0o755)
        self.env = clean_env(HOME=str(self.home))
        self._monkeypatch = monkeypatch
        for name in [n for n in os.environ if n not in self.env]:
            monkeypatch.delenv(name)
        for name, value in self.env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.chdir(self.home)
        # The package binds sys.prefix as a default argument at import (``prefix: str = sys.prefix``):
        # each such default, and sys.prefix itself, now names this folder. Every module is imported
        # first: one imported while it is patched would keep the stand-in.
        import pkgutil

        import gkx_autocache

        for found in pkgutil.walk_packages(gkx_autocache.__path__, "gkx_autocache."):
            if not found.name.endswith(".__main__"):  # (which runs the command line)
                importlib.import_module(found.name)
        real = sys.prefix
        for module in [m for name, m in sys.modules.items() if name.startswith("gkx_autocache")]:
            for function in vars(module).values():
                if inspect.isfunction(function) and function.__defaults__ and real in function.__defaults__:
                    monkeypatch.setattr(function, "__defaults__",
                                        tuple(str(self.path) if d == real else d for d in function.__defaults__))
        monkeypatch.setattr(sys, "prefix", str(self.path))

    @property
    def default_cache(self) -> Path:
        return self.path / ".cache" / "gkx" / "jax"

    def cli(self, *args: str, env: dict[str, str] | None = None, user: int | None = None,
            groups: tuple[int, ...] = ()) -> subprocess.CompletedProcess[str]:
        """``user``: in a forked child that is that user (``in_a_child_as``), as ``Venv.cli``'s."""
        if user is not None:
            return in_a_child_as(user, groups, lambda: self.cli(*args, env=env))  # type: ignore[no-any-return]
        from gkx_autocache import _diagnostics
        from gkx_autocache._cli.main import main

        # A fresh process: no warning said yet, none swallowed.
        self._monkeypatch.setattr(_diagnostics, "_said", set())
        self._monkeypatch.setattr(_diagnostics, "swallowed", [])
        self._monkeypatch.setattr(_diagnostics, "_registry", {})
        fresh_filesystems(self._monkeypatch)
        saved = dict(os.environ)
        out, err = io.StringIO(), io.StringIO()
        try:
            os.environ.update(env or {})
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), fresh_stderr():
                try:
                    code = main(list(args))
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else 1
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return subprocess.CompletedProcess(["gkx-autocache", *args], code, out.getvalue(), err.getvalue())

    def configure(self, env: dict[str, str] | None = None, *, w_error: bool = False, user: int | None = None,
                  groups: tuple[int, ...] = ()) -> tuple[dict[str, Any], str]:
        """What the hook does at a process's first ``import jax``, here: ``_configure`` given a
        stand-in ``jax`` (STYLE's second ring), whose config starts at JAX's defaults (or, as JAX's
        import does, from an option's ``JAX_*`` variable) and whose private modules are missing
        (every seam falls back to JAX's stock behaviour), then the exit hooks it registered, run as
        the interpreter's exit runs them. For what the settings, the directory and the trust rules
        decide: the values it set in ``jax.config``, as PROGRAM prints them, and stderr (its
        warnings as a fresh process prints them; ``w_error``: under ``-W error``). The package's
        module state, the real ``jax`` modules and the exit hooks are restored afterwards. ``user``:
        in a forked child that is that user (``in_a_child_as``)."""
        if user is not None:
            return in_a_child_as(user, groups, lambda: self.configure(env, w_error=w_error))  # type: ignore[no-any-return]
        from gkx_autocache import _settings

        config = types.SimpleNamespace(jax_enable_compilation_cache=True, **_settings.JAX_DEFAULTS)
        config.update = lambda name, value: setattr(config, name, value)
        monitoring = types.ModuleType("jax.monitoring")
        monitoring.register_event_listener = monitoring.register_event_duration_secs_listener = lambda f: None  # type: ignore[attr-defined]
        jax = types.ModuleType("jax")
        jax.__version__ = JAX_VERSION  # type: ignore[attr-defined]
        jax.config = config  # type: ignore[attr-defined]
        jax.monitoring = monitoring  # type: ignore[attr-defined]
        with self._a_process({"jax": jax, "jax.monitoring": monitoring}, env, w_error) as ran:
            pass
        return ran.values, ran.stderr

    @contextlib.contextmanager
    def process(self, env: dict[str, str] | None = None, *, w_error: bool = False,
                version: str = JAX_VERSION) -> Iterator[Ran]:
        """One process of a program, here: its first ``import jax`` (``_configure`` given the stand-in
        JAX of ``standin``, whose cache module the store serves), the block's compiles
        (``ran.jit("f")``, as JAX's compiler asks its cache), then its exit (the hooks it registered:
        the shared level's uploads, manifest and pack, the ledger's fold, the cap, the `report`
        line). What it printed is ``ran.stderr`` once the block is left. For what the chain, the
        levels, the ledgers and the settings do in a run: no JAX's key, seams or compiles (STYLE's
        third ring has those). Each process is its own run, as a fresh one is, unless ``env`` names
        one (``GKX_JAX_CACHE_RUN``). The package's module state and the real ``jax`` modules are
        restored afterwards."""
        from standin import StandInJax

        jax = StandInJax(version)
        with self._a_process(jax.modules, env, w_error, jax) as ran:
            yield ran

    def run_program(self, env: dict[str, str] | None = None, names: tuple[str, ...] = ("f", "g"), *,
                    w_error: bool = False, user: int | None = None, groups: tuple[int, ...] = (),
                    ahead: bool = False, **jit: Any) -> tuple[dict[str, Any], str]:
        """A process that compiles each of ``names`` once (PROGRAM's two functions; ``"f:v"``: ``f``
        with another shape or constant, another key): what PROGRAM prints (the cache's counts, its
        result, the values in ``jax.config``) and its stderr (``w_error``: under ``-W error``).
        ``user``: in a forked child that is that user (``in_a_child_as``). ``ahead``: its threads'
        work done after the first lookup (a real program's tracing gives a prefetch that long; the
        stand-in's next lookup comes at once)."""
        if user is not None:
            return in_a_child_as(user, groups,  # type: ignore[no-any-return]
                                 lambda: self.run_program(env, names, w_error=w_error, ahead=ahead, **jit))
        with self.process(env, w_error=w_error) as ran:
            for i, name in enumerate(names):
                if i == 1 and ahead:
                    ran.settle()
                ran.jit(*name.split(":", 1), **jit)
        assert ran.jax is not None
        return {**ran.values, "requests": ran.jax.requests, "hits": ran.jax.hits, "result": ran.jax.result()}, ran.stderr

    @contextlib.contextmanager
    def _a_process(self, modules: dict[str, types.ModuleType], env: dict[str, str] | None, w_error: bool,
                   standin: Any = None) -> Iterator[Ran]:
        """``_configure`` on ``modules["jax"]`` in a fresh process's state, the block, then the exit hooks."""
        from gkx_autocache import _configure
        from gkx_autocache._record.recorder import RUN

        jax = modules["jax"]
        config: Any = jax.config
        hooks: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        err = io.StringIO()
        ran = Ran(standin)
        printed: list[str] = []  # what the process printed, up to its end (not what its threads say after)
        with pytest.MonkeyPatch.context() as patch:
            # A fresh process's module state: each global restored after (a rebinding), and each
            # list, dict and set a copy (a change in place).
            for module in [m for n, m in sys.modules.items() if n.startswith("gkx_autocache")]:
                for attr, value in list(vars(module).items()):
                    if not attr.startswith("__") and not inspect.ismodule(value):
                        patch.setattr(module, attr, type(value)(value) if type(value) in (list, dict, set) else value)
            from gkx_autocache import _diagnostics

            patch.setattr(_diagnostics, "_said", set())  # no warning said yet
            fresh_filesystems(patch)
            for name in [n for n in sys.modules if n.split(".")[0] in ("jax", "jaxlib")]:
                patch.delitem(sys.modules, name)  # no seam reaches a real JAX this pytest process imported
            for name, module in modules.items():
                patch.setitem(sys.modules, name, module)
            patch.setattr(_configure, "_once", threading.Event())  # not configured yet

            def registering(original: Any) -> Any:
                def register(function: Any, *args: Any, **kwargs: Any) -> Any:
                    # The package's hooks are this process's exit; a library imported meanwhile
                    # (concurrent.futures' own, which would refuse every thread pool after it ran)
                    # registers for the pytest process, where it stays.
                    if not str(sys._getframe(1).f_globals.get("__name__", "")).startswith("gkx_autocache"):
                        return original(function, *args, **kwargs)
                    hooks.append((function, args, kwargs))
                    return function

                return register

            patch.setattr(atexit, "register", registering(atexit.register))
            if hasattr(threading, "_register_atexit"):
                patch.setattr(threading, "_register_atexit", registering(threading._register_atexit))
            patch.setenv(RUN, "-")  # (a fresh process begins its own run: the one it names is undone after)
            patch.delenv(RUN)
            for name, value in (env or {}).items():
                patch.setenv(name, value)
            # As JAX's import does: an option whose JAX_* variable is set starts from it.
            parsers: dict[str, Any] = {"jax_enable_compilation_cache": lambda v: v.lower() in ("y", "yes", "t", "true", "on", "1"),
                                       "jax_compilation_cache_dir": str, "jax_persistent_cache_min_compile_time_secs": float,
                                       "jax_persistent_cache_min_entry_size_bytes": int,
                                       "jax_persistent_cache_enable_xla_caches": str,
                                       "jax_compilation_cache_max_size": int}
            for option, parse in parsers.items():
                if option.upper() in os.environ and hasattr(config, option):
                    setattr(config, option, parse(os.environ[option.upper()]))
            try:
                with contextlib.redirect_stdout(err), contextlib.redirect_stderr(err), fresh_stderr(w_error):
                    _configure.configure(jax, os.environ)
                    ran.values = {"dir": config.jax_compilation_cache_dir,
                                  "min_compile": config.jax_persistent_cache_min_compile_time_secs,
                                  "min_entry": config.jax_persistent_cache_min_entry_size_bytes,
                                  "xla_caches": config.jax_persistent_cache_enable_xla_caches,
                                  "enabled": config.jax_enable_compilation_cache}
                    before = ran.before = set(threading.enumerate())
                    try:
                        yield ran
                    finally:
                        for function, args, kwargs in reversed(hooks):  # the exit: last registered, first run
                            try:
                                function(*args, **kwargs)
                            except Exception as exc:  # as the interpreter says it, and goes on
                                print(f"Exception ignored in atexit callback {function!r}: {exc!r}", file=sys.stderr)
                        printed.append(err.getvalue())
                        _gone(before)
            finally:
                ran.stderr = printed[0] if printed else err.getvalue()


def _gone(before: set[threading.Thread]) -> None:
    """A process's exit, past its hooks: its threads end with it. Here they would go on in the pytest
    process, an upload in flight warning into a later test: its shared level is turned off (what it
    says then is not the process's: it is gone), so that nothing more is asked of it, and the
    threads it started (the upload worker, prefetch workers, bounded calls) get a few seconds to
    end. One that waits for work it will never get (the upload worker) stays, idle."""
    from gkx_autocache import _process

    shared = getattr(getattr(_process.current, "levels", None), "shared", None)
    channel = getattr(shared, "channel", None)
    if channel is not None:
        channel.turn_off("the process exited")
    settle(before, 5)


def settle(before: set[threading.Thread], timeout: float) -> bool:
    """Wait until no thread started since ``before`` runs the package's code (``_busy``), at most
    ``timeout`` seconds; whether they did."""
    started = [t for t in threading.enumerate() if t not in before]
    deadline = time.monotonic() + timeout
    while any(_busy(t) for t in started):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _busy(thread: threading.Thread) -> bool:
    """Whether ``thread`` runs the package's code, but for the upload worker waiting for its next
    item (``Uploads._drain``); a library's own thread (fsspec's event loop) is not the process's."""
    import gkx_autocache

    package = os.path.dirname(gkx_autocache.__file__)
    frame = sys._current_frames().get(thread.ident or 0) if thread.is_alive() else None
    first = True
    while frame is not None:
        if frame.f_code.co_filename.startswith(package):
            return not (first and frame.f_code.co_name == "_drain")
        if frame.f_code.co_filename != threading.__file__:
            first = False
        frame = frame.f_back
    return False


@dataclass
class Ran:
    """What ``InProcess.process`` yields: the stand-in ``jax`` (``jit``), the values ``_configure``
    set in ``jax.config`` (as PROGRAM prints them), and once the block is left, the process's
    stderr (its warnings as a fresh process prints them, and its `report` line)."""

    jax: Any
    values: dict[str, Any] = field(default_factory=dict)
    stderr: str = ""
    before: set[threading.Thread] = field(default_factory=set)  # the threads that were not the process's

    def jit(self, name: str, variant: str = "", **more: Any) -> bool:
        """One compile (``standin.StandInJax.jit``); whether the cache served it."""
        return bool(self.jax.jit(name, variant, **more))

    def settle(self, timeout: float = 120) -> None:
        """Wait until the process's threads have done what they were given (its uploads and heals
        sent, its prefetch landed or given up): each waits for more work, or has ended."""
        assert settle(self.before, timeout), "the process's threads are still at work"

    @property
    def report(self) -> str:
        """The process's `report` line (the last one)."""
        return [ln for ln in self.stderr.splitlines() if ln.startswith("gkx-autocache: ")][-1]


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> InProcess:
    """An ``InProcess`` environment in ``tmp_path``; everything it changed is restored afterwards."""
    return InProcess(tmp_path, monkeypatch)


def planted_run(root: Path, warm: int = 0, version: str | None = JAX_VERSION) -> Path:
    """What a finished cold run of two functions leaves under ``root`` (for the commands that read
    it, not for JAX): the version directory the package made, two entries, the run's ledger of two
    misses and two writes, and the verdict that the package's store served it; and ``warm`` more
    runs' ledgers, each of two hits. The version directory (``version`` None: ``root`` itself, as
    in a directory the user gave JAX)."""
    import zlib

    from gkx_autocache import _cache, _formats

    vdir = Path(_cache.prepare(str(root), version).version_dir or "")
    ledger = vdir / ".gkx-autocache" / "ledger"
    ledger.mkdir(parents=True, exist_ok=True)
    keys = [f"{name}-{zlib.crc32(name.encode()):064x}" for name in ("jit_f", "jit_g")]
    runs: list[list[dict[str, Any]]] = [[]]
    for key in keys:
        (vdir / f"{key}-cache").write_bytes(zlib.compress(os.urandom(500)))
        runs[0] += [{"e": "miss", "key": key}, {"e": "put", "key": key, "bytes": 510}]
    runs += [[{"e": "hit", "key": key, "bytes": 510, "saved": 0.5} for key in keys] for _ in range(warm)]
    for n, records in enumerate(runs, 1):
        (ledger / f"{n}-{n}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*records, {"e": "tally", "end": True}]))
    _formats.write_verdict(str(vdir), "gkx-autocache", None)
    return vdir


def local_at(path: Path | str, signs: bool = False, writable: bool = True) -> Any:
    """A local level in ``path`` (``_local.level.LocalLevel``), as the package builds it for a
    shared level to stand in front of, with zlib's codec (JAX's where zstandard is not installed);
    ``signs``: a signing key keeps a seal beside each entry. The folder is made where it is not."""
    import zlib

    from gkx_autocache._local.level import LocalLevel

    Path(path).mkdir(mode=0o700, parents=True, exist_ok=True)
    return LocalLevel(str(path), compression="zlib", decompress=zlib.decompress, team=False, writable=writable,
                      check_payload=lambda: True, whole=False, signs=signs)
