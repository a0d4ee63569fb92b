"""Processes the suite and the benchmarks start and must not outlive them (issue 71: a Ctrl-C left
moto's server running, reparented to init, and 43 MB of ``gkx-bench-*`` in the temporary directory).

``start`` makes a server die with the process that started it, whatever ends that process;
``run`` gives an interrupted child time to remove what it made."""

from __future__ import annotations

import atexit
import shutil
import signal
import subprocess
from typing import Any

_running: list[subprocess.Popen[bytes]] = []


def start(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``argv`` as a server: in a session of its own (a Ctrl-C at the terminal is for pytest, whose
    fixture stops it in order), sent SIGTERM by the kernel when the process that started it dies,
    however it dies (PR_SET_PDEATHSIG, set by setpriv before it runs ``argv``: a killed xdist worker
    runs no finalizer and no atexit), and stopped at this interpreter's exit where still running."""
    setpriv = shutil.which("setpriv")
    # PR_SET_PDEATHSIG follows the thread that forks: servers are started from a test's thread.
    command = [setpriv, "--pdeathsig", "TERM", "--", *argv] if setpriv else argv
    process = subprocess.Popen(command, start_new_session=True, **kwargs)
    _running.append(process)
    return process


def stop(process: subprocess.Popen[bytes], timeout: float = 10) -> None:
    """A server ``start`` started: asked to end, then made to."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process in _running:
        _running.remove(process)


@atexit.register
def _stop_all() -> None:
    for process in list(_running):
        stop(process)


def run(argv: list[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True)``, but a child interrupted (a Ctrl-C,
    the timeout) is sent SIGTERM and given a minute to remove what it made before it is killed:
    ``subprocess.run`` kills it a quarter second after a Ctrl-C, which left ``benchmarks/run.py``'s
    environments in the temporary directory."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:
        process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=60)
        except BaseException:
            process.kill()
            process.communicate()
        raise
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)
