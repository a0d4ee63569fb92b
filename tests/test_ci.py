"""The CI recipe without GitHub (README, In CI): `ci-key` and a cache directory restored at another
path; and `.ci/run`'s choice of Pythons."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, InProcess, Venv, clean_env, make_venv, planted_run, public_tmp, run_program
from test_activation import VERSION_DIR

from gkx_autocache import _context
from gkx_autocache._cli import ci as _ci

pytestmark = pytest.mark.every_python  # .ci/run and the interpreter it is given


def test_a_restored_directory_gives_hits_in_a_fresh_venv_at_another_path(venv: Venv, wheel: Path) -> None:
    """What actions/cache does: the version directory of one job, restored in a later job's fresh
    environment at another path, serves every compile there."""
    cold, _ = run_program(venv)
    saved = venv.cli("dir").stdout.strip()
    base = public_tmp()
    try:
        later = make_venv(base, wheel)
        restored = later.cli("dir").stdout.strip()
        assert restored != saved and restored.endswith(VERSION_DIR)
        shutil.copytree(saved, restored)
        for path in [Path(restored).parent, *Path(restored).parent.rglob("*")]:  # as a restore leaves them
            path.chmod(0o700 if path.is_dir() else 0o600)
        warm, _ = run_program(later)
        assert warm["hits"] == warm["requests"] == cold["requests"] and warm["result"] == cold["result"]
        assert later.cli("ci-key").stdout == venv.cli("ci-key").stdout
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def fresh(tmp_path: Path) -> dict[str, str]:
    """The environment of a fresh process of this interpreter (no venv: the command needs none),
    with a directory of its own."""
    return clean_env(HOME=str(tmp_path), GKX_JAX_CACHE_DIR=str(tmp_path / "c"))


def test_ci_key_is_stable_and_changes_with_the_cpu(tmp_path: Path) -> None:
    """Two processes print the same key; a different CPU feature list (a fake CPUID and /proc/cpuinfo,
    bound in a private mount namespace) gives another."""
    import cpus

    first, second = (subprocess.run([sys.executable, "-m", "gkx_autocache", "ci-key"], env=fresh(tmp_path),
                                    capture_output=True, text=True, check=True).stdout for _ in range(2))
    assert first == second and len(first.strip()) > 10
    if not cpus.unshared():
        pytest.skip("another CPU needs root (unshare -m) and a cpuid driver")
    other = cpus.real_less(tmp_path, {"avx2"})
    script = " && ".join([*other.mounts(), f"exec {sys.executable} -m gkx_autocache ci-key"])
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script], env=fresh(tmp_path), capture_output=True, text=True,
                          check=True)
    assert proc.stdout != first


def test_ci_key_changes_with_jaxlib(monkeypatch: pytest.MonkeyPatch) -> None:
    key, parts = _ci.ci_key()
    real = _context.distribution_version
    monkeypatch.setattr(_context, "distribution_version", lambda name: "9.9.9" if name == "jaxlib" else real(name))
    other, other_parts = _ci.ci_key()
    assert other != key and other_parts["jaxlib"] == "9.9.9" and parts["jaxlib"] != "9.9.9"


def test_ci_key_changes_with_the_flags_jax_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """XLA_FLAGS and LIBTPU_INIT_ARGS are in JAX's key: a CI cache made under others is not restored.
    A dump flag, which JAX leaves out of its key, changes nothing."""
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    plain, _ = _ci.ci_key()
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/dump")
    assert _ci.ci_key()[0] == plain
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=true")
    assert _ci.ci_key()[0] != plain
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_enable_latency_hiding_scheduler=true")
    assert _ci.ci_key()[0] != plain


def test_a_closed_pipe_is_not_a_traceback(tmp_path: Path) -> None:
    """`gkx-autocache --json status | head -c 10`: the reader leaves early; no traceback."""
    proc = subprocess.run(f"{sys.executable} -m gkx_autocache --json status | head -c 10", shell=True,
                          env=fresh(tmp_path), capture_output=True, text=True)
    assert "Traceback" not in proc.stderr and "Broken pipe" not in proc.stderr, proc.stderr


def plan(path: str, ci: bool | str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYENV_VERSION")}
    env["PATH"] = path
    if ci:
        env["CI"] = "true" if ci is True else str(ci)
    return subprocess.run(["/bin/bash", str(ROOT / ".ci" / "run"), "--plan"], env=env, capture_output=True, text=True)


def only(tmp_path: Path, *versions: str) -> str:
    """A PATH on which only the given Pythons (the real ones) are found, and the few tools the
    script's plan needs (the machine's own /usr/bin has a python3.11)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for version in versions:
        real = next(Path("/root/.pyenv/versions").glob(f"{version}.*/bin/python{version}"))
        (folder / f"python{version}").symlink_to(real)
    for tool in ("dirname", "tr", "grep", "sort", "tail", "uname"):
        (folder / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    return str(folder)


@pytest.mark.parametrize("versions", [("3.11",), ("3.13",), ("3.11", "3.12", "3.13")])
def test_ci_run_tests_every_python_it_finds(tmp_path: Path, versions: tuple[str, ...]) -> None:
    """Without CI, `.ci/run` runs the suite on each Python found (3.11: JAX 0.10; 3.12 and later:
    JAX 0.12), and passes with one line missing; it says which lines ran."""
    proc = plan(only(tmp_path, *versions), ci=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for version in versions:
        assert f"Python {version}" in proc.stdout
    assert ("JAX 0.10" in proc.stdout) == ("3.11" in versions)
    assert ("JAX 0.12" in proc.stdout) == any(v != "3.11" for v in versions)


def test_ci_run_says_what_each_python_runs(tmp_path: Path) -> None:
    """Issue 68's 20 minutes: the first Python runs the whole suite; a second Python of a JAX line
    only what depends on the line (3.12: the tests marked ``line``); the newest, what is the
    interpreter's and the units (3.13: all but ``line`` and ``once``); a Python between two of its
    line, nothing of its own."""
    proc = plan(only(tmp_path, "3.11", "3.12", "3.13"), ci=False)
    said = {line.split()[2]: line.split(" -> ", 1)[1].split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("plan: Python")}
    assert said == {"3.11": "the whole suite", "3.12": '-m "not once and line"', "3.13": '-m "not once and not line"'}, said
    (tmp_path / "two").mkdir()
    proc = plan(only(tmp_path / "two", "3.12", "3.13"), ci=False)
    said = {line.split()[2]: line.split(" -> ", 1)[1].split(": ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("plan: Python")}
    assert said == {"3.12": "the whole suite", "3.13": '-m "not once and not line"'}, said


def test_ci_run_says_first_what_it_needs_and_keeps_to_a_folder_of_its_own(tmp_path: Path) -> None:
    """Issue 71: the test command turned the README's ``.venv`` (the demo's) into an editable install,
    downgraded ml_dtypes there, made about 3 GB of venvs and apt-installed packages as root, none of
    it said. Its plan says the disk, where (``.ci/venvs/``, git-ignored), the time, and the Debian
    packages it would install; none of its environments is ``.venv``."""
    proc = plan(only(tmp_path, "3.11", "3.12"), ci=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    needs = [line for line in proc.stdout.splitlines() if line.startswith("needs: ")]
    assert any("GB of disk" in line and ".ci/venvs/3.11 .ci/venvs/3.12" in line for line in needs), proc.stdout
    assert any("minutes" in line for line in needs), proc.stdout
    # (the PATH here has no ldconfig: libfuse2 counts as missing, and the packages are said)
    assert any("libfuse2" in line for line in needs), proc.stdout
    assert ".venv" not in proc.stdout.replace(".ci/venvs", ""), proc.stdout
    script = (ROOT / ".ci" / "run").read_text()
    code = [line for line in script.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if re.search(r"\.venv(?!s)", line)], "the test command names .venv"
    ignored = subprocess.run(["git", "check-ignore", "-q", ".ci/venvs/3.11/bin/python"], cwd=ROOT)
    assert ignored.returncode == 0, ".ci/venvs/ is not git-ignored"


def test_ci_run_fails_under_ci_when_a_line_is_missing(tmp_path: Path) -> None:
    proc = plan(only(tmp_path, "3.13"), ci=True)
    assert proc.returncode != 0 and "JAX 0.10" in proc.stderr and "3.11" in proc.stderr, proc.stdout + proc.stderr


@pytest.mark.parametrize("value", ["false", " FALSE ", "0", "no"])
def test_ci_false_is_not_ci_for_ci_run(tmp_path: Path, value: str) -> None:
    """`CI=false` (or another false spelling) is not CI for `.ci/run` either, as for the plugin: a
    missing line is reported, and the run goes on."""
    proc = plan(only(tmp_path, "3.13"), ci=value)
    assert proc.returncode == 0 and "CI would fail" in proc.stderr, proc.stdout + proc.stderr


def test_ci_run_says_at_once_that_it_needs_linux(tmp_path: Path) -> None:
    """Issue 46: on macOS (bash 3.2, no /proc) `.ci/run` failed half-way with a bash error; it says
    first that it needs Linux, and what a Mac or Windows runs instead."""
    path = only(tmp_path, "3.11")
    (tmp_path / "bin" / "uname").unlink()
    (tmp_path / "bin" / "uname").write_text("#!/bin/sh\necho Darwin\n")
    (tmp_path / "bin" / "uname").chmod(0o755)
    proc = plan(path, ci=True)
    assert proc.returncode == 1 and not proc.stdout, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "needs Linux (Darwin)" in proc.stderr and ".ci/laptop.py" in proc.stderr


def test_ci_key_without_jax_reads_as_a_key(here: InProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without JAX installed, the key still reads as a key (not `--f5320738...`, which a shell or
    an action's input parser may take for an option)."""
    import importlib.metadata

    # JAX uninstalled, as far as the key's metadata lookups can tell: no folder of sys.path holding it.
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not list(importlib.metadata.distributions(name="jax", path=[p]))])
    assert _context.distribution_version("jax") is None
    proc = here.cli("ci-key")
    assert proc.returncode == 0 and proc.stdout.startswith("nojax-") and len(proc.stdout.split()) == 1, proc.stdout


# -- the README's recipes: caches that keep learning (SPEC §15) -------------------------------------------


def readme_yaml() -> list[Any]:
    """The YAML recipes of the README and of docs/ci.md (the bundle variant lives there)."""
    import yaml

    text = (ROOT / "README.md").read_text() + (ROOT / "docs" / "ci.md").read_text()
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.S)]


def github_steps() -> list[dict[str, Any]]:
    """The steps of the README's GitHub Actions job, and of its bundle variant after it."""
    found = []
    for doc in readme_yaml():
        if isinstance(doc, dict) and "jobs" in doc:
            found += next(iter(doc["jobs"].values()))["steps"]
        elif isinstance(doc, list):  # the bundle variant: a list of steps
            found += doc
    return found


def test_readme_github_recipe_keys_each_run_anew_and_restores_by_prefix() -> None:
    """`actions/cache` never updates an existing key: each run's key holds `github.run_id`, and
    each restore key is a prefix of its key; nothing hashes a lockfile (entries are content-keyed);
    a save only happens when the run wrote entries, fed by the package."""
    steps = github_steps()
    caches = [s for s in steps if str(s.get("uses", "")).startswith("actions/cache")]
    assert {s["uses"].split("@")[0] for s in caches} == {"actions/cache/restore", "actions/cache/save"}, caches
    for step in caches:
        key = step["with"]["key"]
        assert "github.run_id" in key and "steps.jax.outputs.prefix" in key, key
        for restore in str(step["with"].get("restore-keys", "")).splitlines():
            assert key.startswith(restore), (key, restore)
        if step["uses"].startswith("actions/cache/save"):
            assert "steps.wrote.outputs.entries != '0'" in step["if"], step
    assert all("restore-keys" in s["with"] for s in caches if s["uses"].startswith("actions/cache/restore"))
    assert "hashFiles" not in (ROOT / "README.md").read_text()
    wrote = [s for s in steps if s.get("id") == "wrote"]
    assert wrote and all("gkx-autocache stats --written" in s["run"] for s in wrote)


def test_readme_gitlab_recipe_has_a_fixed_key_per_job_pulled_and_pushed() -> None:
    (job,) = [next(iter(doc.values())) for doc in readme_yaml() if isinstance(doc, dict) and "jobs" not in doc]
    assert job["cache"]["policy"] == "pull-push" and "$CI_JOB_NAME" in job["cache"]["key"]
    assert "GKX_JAX_CACHE_MAX_SIZE" in job["variables"]


def run_step(script: str, path: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """A `run:` step as GitHub runs it (`bash --noprofile --norc -eo pipefail`), its `${{ }}`
    expressions filled in."""
    script = re.sub(r"\$\{\{\s*([^}]*?)\s*\}\}", lambda m: m[1].replace(".", "_"), script)
    output = tmp_path / "github_output"
    output.write_text("")
    env = {"PATH": path, "GITHUB_OUTPUT": str(output), "HOME": str(tmp_path)}
    return subprocess.run(["/bin/bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], env=env,
                          capture_output=True, text=True)


def test_readme_key_step_fails_without_the_command(tmp_path: Path) -> None:
    """The key step fails when `gkx-autocache` is not on PATH (a cache key `jax--` would restore
    nothing and save a useless cache), and gives a prefix and a directory when it is (the runner's
    own installed command: `dir` only names the directory, `ci-key` reads no cache)."""
    (step,) = [s for s in github_steps() if s.get("id") == "jax"]
    missing = run_step(step["run"], "/usr/bin:/bin", tmp_path)
    assert missing.returncode != 0, missing
    installed = Path(sys.executable).parent
    there = run_step(step["run"], f"{installed}:/usr/bin:/bin", tmp_path)
    assert there.returncode == 0, there.stderr
    outputs = dict(line.split("=", 1) for line in (tmp_path / "github_output").read_text().splitlines())
    key = subprocess.run([str(installed / "gkx-autocache"), "ci-key"], env=clean_env(HOME=str(tmp_path)),
                         capture_output=True, text=True, check=True).stdout.strip()
    assert outputs["prefix"].endswith(f"-{key}-") and outputs["dir"].endswith(VERSION_DIR), outputs


def test_stats_written_counts_what_a_run_wrote_since_the_reset(here: InProcess, tmp_path: Path) -> None:
    """What the README's save step reads: 0 after a reset and a warm run, more after a cold one."""
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    assert here.cli("stats", "--written", env=env).stdout.strip() == "0"
    vdir = planted_run(tmp_path / "c")  # a cold run: two writes
    assert int(here.cli("stats", "--written", env=env).stdout) >= 2
    assert here.cli("stats", "--reset", env=env).returncode == 0
    warm = [{"e": "hit", "key": p.name.removesuffix("-cache"), "bytes": 510, "saved": 0.5} for p in vdir.glob("*-cache")]
    (vdir / ".gkx-autocache" / "ledger" / "2-2.jsonl").write_text(  # then a warm one: hits only
        "".join(json.dumps(r) + "\n" for r in [*warm, {"e": "tally", "end": True}]))
    assert here.cli("stats", "--written", env=env).stdout.strip() == "0"
