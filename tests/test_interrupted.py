"""A Ctrl-C on the suite, or a worker killed, leaves no server running and no benchmark directory
behind (issue 71: moto's server reparented to init, and 43 MB of ``gkx-bench-*`` in the temporary
directory). Each case runs pytest in a child on a test that starts what it names, then interrupts it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, clean_env

pytestmark = pytest.mark.every_python  # what the interpreter does on a signal


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no one reaped yet, in a container whose init reaps none, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def moto_pids(port: str) -> list[int]:
    """The processes that run moto's server on ``port``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"moto.server" in argv and port.encode() in argv and entry.name.isdigit():
            found.append(int(entry.name))
    return found


def interrupted(tmp_path: Path, body: str, ready: str, how: signal.Signals, env: dict[str, str] | None = None,
                flags: tuple[str, ...] = ()) -> str:
    """pytest in a child on one test of ``body`` (which may use conftest's fixtures), with ``flags``,
    sent ``how`` once the file ``ready`` names holds something; what that file holds."""
    (tmp_path / "test_inner.py").write_text(body)
    mark = tmp_path / ready
    child_env = clean_env(PYTHONPATH=str(ROOT / "tests"), MARK=str(mark), HOME=str(tmp_path), **(env or {}))
    log = tmp_path / "pytest.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:gkx_autocache",
                                 "--rootdir", str(tmp_path), *flags, str(tmp_path / "test_inner.py")], cwd=str(tmp_path),
                                env=child_env, stdout=out, stderr=subprocess.STDOUT,
                                # (a suite started in the background, `bash .ci/run &`, inherits SIGINT
                                # ignored, and so would the child: Python then makes no KeyboardInterrupt,
                                # and the Ctrl-C sent below did nothing)
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300
        while not (mark.exists() and mark.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        proc.send_signal(how)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(log.read_text()[-3000:])  # (shown where the test fails)
    return mark.read_text()


S3_TEST = """
import os, time
from conftest import s3_server  # noqa: F401  (the module's fixture)

def test_waits(s3_server):
    open(os.environ["MARK"], "w").write(s3_server)
    time.sleep(600)
"""


@pytest.mark.parametrize(("how", "flags"), [(signal.SIGINT, ()), (signal.SIGINT, ("-n", "1")), (signal.SIGKILL, ())],
                         ids=["ctrl-c", "ctrl-c, an xdist worker", "killed"])
def test_an_interrupted_session_leaves_no_s3_server(tmp_path: Path, how: signal.Signals, flags: tuple[str, ...]) -> None:
    """moto's server dies with the pytest process that started it: stopped by its fixture on a
    Ctrl-C, and sent SIGTERM by the kernel when that process is killed outright (the xdist worker
    of an interrupted session) or dies any other way."""
    endpoint = interrupted(tmp_path, S3_TEST, "endpoint", how, flags=flags)
    port = endpoint.rsplit(":", 1)[1]
    deadline = time.monotonic() + 30
    while (left := [pid for pid in moto_pids(port) if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:  # (a failure here must not leave one either)
        os.kill(pid, signal.SIGKILL)
    assert not left, f"moto's server on {endpoint} outlived pytest ({how.name})"


BENCH_TEST = """
import os, pathlib, threading, time
from test_benchmarks import run

def test_bench(tmp_path_factory):
    def mark():
        while not list(pathlib.Path(os.environ["TMPDIR"]).glob("gkx-bench-*/*")):
            time.sleep(0.2)
        open(os.environ["MARK"], "w").write("started")
    threading.Thread(target=mark, daemon=True).start()
    run(tmp_path_factory, "startup")
"""


@pytest.mark.once  # what the benchmark runner does on an interruption, not the JAX line
def test_an_interrupted_benchmark_leaves_no_directory(tmp_path: Path) -> None:
    """A Ctrl-C while ``benchmarks/run.py`` builds its environments (``test_benchmarks``) removes
    its ``gkx-bench-*`` folder: subprocess.run killed the runner a quarter second after the
    interruption, before it could remove what it made."""
    temp = tmp_path / "temp"
    temp.mkdir()
    interrupted(tmp_path, BENCH_TEST, "started", signal.SIGINT, env={"TMPDIR": str(temp)})
    deadline = time.monotonic() + 60
    while (left := list(temp.glob("gkx-bench-*"))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, left
