"""macOS and Windows, simulated on Linux by ``platforms``' shim (issue 46): no machine here runs
either. The configure path (settings, directory, ``jax.config``, a compile and a warm re-run) and
every command run under the shim; ``.github/workflows/laptops.yml`` runs the portable part of the
suite on real macOS and Windows runners."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import platforms
import pytest

from gkx_autocache._layout import version_name

pytestmark = pytest.mark.once  # the platform's API, not the JAX line, is what these tests vary

JAX = __import__("importlib.metadata").metadata.version("jax")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "LOCALAPPDATA": str(tmp_path / "local"),
            "JAX_PLATFORMS": "cpu", "GKX_JAX_CACHE_REPORT": "1", **extra}


def _ours(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "gkx-autocache:" in line and "AutocacheWarning" in line]


def test_windows_caches_with_jaxs_own_cache_in_the_user_cache_and_says_so(tmp_path: Path) -> None:
    """Issue 46: on Windows every directory was refused (`open_dir` opened `/` as a directory) and
    every `import jax` warned "Permission denied ... set GKX_JAX_CACHE_DIR", advice that cannot
    help. Now JAX's own cache serves the platform's user cache, a warm re-run hits, and one line
    says what Windows gets; no POSIX call (fcntl, getuid, dir_fd, os.kill) is made on the way."""
    env = _env(tmp_path)
    expected = tmp_path / "local" / "gkx" / "gkx" / "Cache" / "jax" / version_name(JAX)
    for run in ("cold", "warm"):
        proc = platforms.run("windows", platforms.CONFIGURE, env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"DIR {expected}" in proc.stdout, (proc.stdout, proc.stderr[-2000:])
        said = _ours(proc.stderr)
        assert len(said) == 1 and "on Windows JAX's own cache serves" in said[0], proc.stderr[-2000:]
        assert "Permission denied" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        report = next(line for line in proc.stderr.splitlines() if line.startswith("gkx-autocache: ") and "hits" in line)
        hits, misses = map(int, re.findall(r"(\d+) (?:hits|misses)", report))
        assert (hits == 0 and misses > 0) if run == "cold" else (hits > 0 and misses == 0), report
    assert any(p.name.endswith("-cache") for p in expected.iterdir())
    assert (expected / "CACHEDIR.TAG").is_file()


def test_windows_an_explicit_dir_is_used_or_refused_in_one_line(tmp_path: Path) -> None:
    """An explicit `dir` is JAX's cache as it is; one that cannot be created is one warning that
    names it, and the run goes on uncached."""
    proc = platforms.run("windows", platforms.CONFIGURE, _env(tmp_path, GKX_JAX_CACHE_DIR=str(tmp_path / "mine")))
    assert proc.returncode == 0 and f"DIR {tmp_path / 'mine' / version_name(JAX)}" in proc.stdout, proc.stderr[-2000:]
    (tmp_path / "file").write_text("not a directory")
    proc = platforms.run("windows", platforms.CONFIGURE, _env(tmp_path, GKX_JAX_CACHE_DIR=str(tmp_path / "file" / "x")))
    said = _ours(proc.stderr)
    assert proc.returncode == 0 and "DIR None" in proc.stdout, proc.stderr[-2000:]
    assert len(said) == 1 and f"dir {tmp_path / 'file' / 'x'} not used" in said[0] and "running uncached" in said[0], said


def test_windows_commands_answer_in_lines_never_a_traceback(tmp_path: Path) -> None:
    """Issue 46: `config set` ended in a traceback on Python 3.11 and 3.12 (no `os.fchmod`), and
    `status` named a "writable, trusted" directory no run could create. Every command answers;
    those that need the package's store say in one line that Windows has none."""
    env = _env(tmp_path)
    assert platforms.run("windows", platforms.CONFIGURE, env).returncode == 0
    vdir = tmp_path / "local" / "gkx" / "gkx" / "Cache" / "jax" / version_name(JAX)
    answers = {}
    for args in (["status"], ["dir"], ["--version"], ["config", "set", "--user", "max_size", "2G"],
                 ["config", "get", "max_size"], ["config", "unset", "--user", "max_size"], ["ci-key"], ["prune"],
                 ["verify"], ["stats"], ["explain"],
                 ["export", str(tmp_path / "b.tar")], ["clear", "--dry-run"], ["clear", "--yes"]):
        proc = platforms.cli("windows", args, env)
        assert "Traceback" not in proc.stderr and proc.returncode == 0, (args, proc.stderr[-2000:])
        answers[" ".join(args[:2]) if args[0] in ("config", "clear") else args[0]] = proc
        if "exit 0" not in proc.stdout:
            assert len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
    status = answers["status"].stdout
    assert "trust not checked on Windows" in status and "on Windows JAX's own cache serves" in status, status
    assert "trusted)" not in status and "Permission denied" not in status, status
    assert answers["dir"].stdout.splitlines()[0] == str(vdir)
    assert answers["config get"].stdout.splitlines()[0] == "2G", answers["config get"].stdout
    for command in ("prune", "verify", "stats", "explain", "export"):
        assert "exit 1" in answers[command].stdout and "on Windows" in answers[command].stderr, answers[command]
    assert re.search(r"would remove [1-9]\d* entr", answers["clear --dry-run"].stdout), answers["clear --dry-run"].stdout
    assert "exit 0" in answers["clear --yes"].stdout, answers["clear --yes"].stderr
    assert [p.name for p in vdir.iterdir()] == ["CACHEDIR.TAG"]


def test_macos_gets_the_whole_store_and_reads_the_m_series_isa(tmp_path: Path) -> None:
    """Issue 46: on an M-series Mac the instruction set was never read (`machdep.cpu.*` stopped
    Apple's sysctl before `hw.optional`), so keys fell back to the host name. Without O_PATH and
    /proc, the store serves, a warm re-run hits, and keys carry the CPU's features."""
    env = _env(tmp_path, PATH=f"{platforms.fake_sysctl(tmp_path / 'bin', platforms.M_SERIES)}:{os.environ['PATH']}",
               GKX_JAX_CACHE_DIR=str(tmp_path / "cache"))
    code = platforms.CONFIGURE + "from gkx_autocache import _isa\nprint('ISA', _isa.isa())\n"
    for run in ("cold", "warm"):
        proc = platforms.run("macos", code, env)
        assert proc.returncode == 0 and not _ours(proc.stderr), proc.stderr[-3000:]
        isa = next(line for line in proc.stdout.splitlines() if line.startswith("ISA "))
        assert "host=" not in isa and {"neon", "lse", "sha3", "dotprod"} <= set(isa.split(":")[1].split(",")), isa
        report = next(line for line in proc.stderr.splitlines() if line.startswith("gkx-autocache: "))
        assert ("0 hits" in report) == (run == "cold") and ("0 misses" in report) == (run == "warm"), report
    vdir = Path(next(line for line in proc.stdout.splitlines() if line.startswith("DIR "))[4:])
    assert (vdir / ".gkx-autocache").is_dir()  # the package's store and records, not JAX's stock cache
    status = platforms.cli("macos", ["status"], env)
    assert "the package's own" in status.stdout and "cannot be read" not in status.stdout, status.stdout


def test_an_unexpected_error_in_a_command_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI never prints a traceback, on any platform: a bug is one line that says whose it is."""
    from gkx_autocache._cli import main as _main

    def broken(args: object) -> int:
        raise AttributeError("module 'os' has no attribute 'fchmod'")

    monkeypatch.setattr(_main, "cmd_dir", broken)
    assert _main.main(["dir"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "AttributeError" in err and "please report it" in err, err


def test_windows_under_w_error_the_line_is_logged_and_the_run_cached(tmp_path: Path) -> None:
    """`-W error` (common in test suites) turns the one line into an exception: it is logged
    instead, and the run is still cached (SPEC §6)."""
    code = "import warnings\nwarnings.simplefilter('error')\n" + platforms.CONFIGURE
    proc = platforms.run("windows", code, _env(tmp_path))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "DIR None" not in proc.stdout and "on Windows JAX's own cache serves" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("xdg", [None, "relative/cache"])
def test_macos_user_cache_is_library_caches(tmp_path: Path, xdg: str | None) -> None:
    """Outside a virtual environment a Mac's cache is `~/Library/Caches/gkx/jax` (README: On macOS
    and Windows); a relative XDG_CACHE_HOME is ignored there too, whatever platformdirs makes of it."""
    env = _env(tmp_path, **({"XDG_CACHE_HOME": xdg} if xdg else {}))
    proc = platforms.run("macos", "from gkx_autocache import _cache\nprint('ROOT', _cache.user_root())\n", env, jax=False)
    assert f"ROOT {tmp_path / 'home' / 'Library' / 'Caches' / 'gkx' / 'jax'}" in proc.stdout, proc.stdout + proc.stderr


def test_windows_a_broken_entry_or_a_failed_write_never_reaches_the_users_jit(tmp_path: Path) -> None:
    """JAX's stock cache reports a corrupt entry and a failed write as its own UserWarning, which
    `-W error` raises out of the user's `jit`, on every later run: JAX never rewrites an entry. On
    Windows (the package's directory, JAX's cache) a broken entry is removed and compiled again,
    and a failed write is logged (SPEC §6)."""
    env = _env(tmp_path)
    assert platforms.run("windows", platforms.CONFIGURE, env).returncode == 0
    vdir = tmp_path / "local" / "gkx" / "gkx" / "Cache" / "jax" / version_name(JAX)
    entries = sorted(p for p in vdir.iterdir() if p.name.endswith("-cache"))
    broken, blocked = entries[0], entries[1]
    size = broken.stat().st_size
    broken.write_bytes(broken.read_bytes()[: size // 2])  # a write cut short (Ctrl-C)
    blocked.unlink()
    blocked.mkdir()  # where JAX writes this entry, it cannot
    strict = "import warnings\nwarnings.simplefilter('error')\n" + platforms.CONFIGURE
    proc = platforms.run("windows", strict, env)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "Error reading" not in proc.stderr and "Error writing" not in proc.stderr, proc.stderr[-3000:]
    assert broken.stat().st_size > 0.9 * size  # compiled again and written whole (its compile time may differ)
    blocked.rmdir()
    platforms.run("windows", platforms.CONFIGURE, env)
    warm = platforms.run("windows", strict, env)
    report = next(line for line in warm.stderr.splitlines() if line.startswith("gkx-autocache: ") and "hits" in line)
    assert re.search(r": [1-9]\d* hits, 0 misses", report), report


def test_windows_processes_that_start_together_all_get_the_cache(tmp_path: Path) -> None:
    """`os.makedirs` without `exist_ok`: of 16 processes started together on a fresh machine, 5 ran
    uncached with "File exists ... set GKX_JAX_CACHE_DIR", advice that cannot help."""
    import subprocess
    import sys

    go = tmp_path / "go"
    code = (f"import time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.001)\n"
            "from gkx_autocache import _cache, _settings\n"
            "location = _cache.locate(_settings.resolve(os.environ), '0.0.0')\n"
            "print('KIND', location.kind, location.problems)\n")
    procs = [subprocess.Popen([sys.executable, "-c", platforms.script("windows", code, jax=False)],
                              env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(12)]
    import time

    time.sleep(1.0)  # every process waiting at the line
    go.touch()
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all("KIND stock []" in out for out, _ in outputs), outputs


def test_windows_commands_refuse_what_needs_the_store_and_status_says_what_cannot_be(tmp_path: Path) -> None:
    """A dir that cannot be created is said so by `status` too (not "writable"); a shared level is
    one warning at import jax and no claim in `status`; `clear --shared` is refused in one line;
    `clear --all-versions` clears every version directory."""
    (tmp_path / "afile").write_text("not a directory")
    env = _env(tmp_path, GKX_JAX_CACHE_DIR=str(tmp_path / "afile"))
    status = platforms.cli("windows", ["status"], env)
    assert "not used" in status.stdout and "writable" not in status.stdout, status.stdout
    env = _env(tmp_path, GKX_JAX_CACHE_SHARED=str(tmp_path / "team"), GKX_JAX_CACHE_SIGNING_KEY="k" * 32)
    proc = platforms.run("windows", platforms.CONFIGURE, env)
    said = [w for w in _ours(proc.stderr) if "shared" in w]
    assert len(said) == 1 and "on Windows" in said[0], proc.stderr[-2000:]
    levels = platforms.cli("windows", ["status"], env).stdout
    assert "private to you" not in levels and "uploads are signed" not in levels, levels
    refused = platforms.cli("windows", ["clear", "--shared", "--yes"], env)
    assert "exit 1" in refused.stdout and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "on Windows" in refused.stderr, refused.stderr
    vdir = tmp_path / "local" / "gkx" / "gkx" / "Cache" / "jax" / version_name(JAX)
    old = vdir.parent / "jax-0.0.1"
    shutil.copytree(vdir, old)
    cleared = platforms.cli("windows", ["clear", "--all-versions", "--yes"], env)
    assert "exit 0" in cleared.stdout, cleared.stderr
    assert [p.name for p in old.iterdir()] == ["CACHEDIR.TAG"] and [p.name for p in vdir.iterdir()] == ["CACHEDIR.TAG"]
