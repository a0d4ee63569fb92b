"""Zero-code activation in real venvs built from the wheel, with real JAX (SPEC §1-§6); what the
settings decide at ``import jax`` (the directory, the thresholds, the warnings) also in this
process, with a stand-in ``jax`` (``here.configure``)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import JAX_VERSION as JAX_VERSION  # (other test modules import these two from here)
from conftest import PROGRAM, ROOT, InProcess, Venv, autocache_warnings, make_venv, public_tmp, run_program
from conftest import VERSION_DIR as VERSION_DIR

pytestmark = pytest.mark.every_python  # the start-up hook: the interpreter's .pth and import machinery

FINDER = "GkxAutocacheFinder"  # the finder's class name: the .pth line's class and the package's share it


def test_default_directory_thresholds_and_a_warm_second_process(venv: Venv) -> None:
    """`import jax` in a venv caches under <venv>/.cache/gkx/jax/jax-<version>, thresholds opened,
    and a second process is served from the cache."""
    cold, err = run_program(venv)
    assert cold["dir"] == str(venv.default_cache / VERSION_DIR)
    assert cold["min_compile"] == 0.0 and cold["min_entry"] == -1 and cold["xla_caches"] == "none"
    assert cold["hits"] == 0 and cold["requests"] >= 2
    assert autocache_warnings(err) == []
    warm, _ = run_program(venv)
    assert warm["hits"] == warm["requests"] >= 2
    assert warm["result"] == cold["result"]
    assert (venv.default_cache / "CACHEDIR.TAG").is_file()
    assert (venv.default_cache / VERSION_DIR / "CACHEDIR.TAG").is_file()
    for folder in (venv.path / ".cache", venv.path / ".cache" / "gkx", venv.default_cache, venv.default_cache / VERSION_DIR):
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    assert not (venv.path / ".cache" / "CACHEDIR.TAG").exists()


@pytest.mark.line  # the settings the hook applies, not the interpreter's start-up: each JAX line's first Python
@pytest.mark.parametrize("spelling", ["0", "off", "FALSE", " no ", "none", "disable", "Disabled"])
def test_opt_out_leaves_jax_untouched(venv: Venv, spelling: str) -> None:
    """Every false spelling of GKX_JAX_CACHE leaves JAX's settings at its own defaults."""
    out, err = run_program(venv, env={"GKX_JAX_CACHE": spelling})
    assert out["dir"] is None and out["min_compile"] == 1.0 and out["min_entry"] == 0
    assert not venv.default_cache.exists()
    assert err.strip() == "" or autocache_warnings(err) == []


@pytest.mark.line  # the settings the hook applies, not the interpreter's start-up: each JAX line's first Python
def test_gkx_dir_variable(here: InProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GKX_JAX_CACHE_DIR=D caches in D/jax-<version>, and a relative D is taken from the cwd."""
    out, _ = here.configure({"GKX_JAX_CACHE_DIR": str(tmp_path / "d")})
    assert out["dir"] == str(tmp_path / "d" / VERSION_DIR)
    monkeypatch.chdir(tmp_path)
    out, _ = here.configure({"GKX_JAX_CACHE_DIR": "rel"})
    assert out["dir"] == str(tmp_path / "rel" / VERSION_DIR)


@pytest.mark.line  # the settings the hook applies, not the interpreter's start-up: each JAX line's first Python
def test_jax_own_directory_stays_as_set_and_is_served_by_the_store(venv: Venv, tmp_path: Path) -> None:
    """JAX_COMPILATION_CACHE_DIR=E stays E (no version folder, no tag in a directory that existed),
    with the thresholds, and the store serves it (SPEC §5, amended 2026-12-04): its writes are
    atomic, with their compile-time sidecars and records. Until then JAX's stock cache served it."""
    own = tmp_path / "own"
    own.mkdir(mode=0o700)
    out, _ = run_program(venv, env={"JAX_COMPILATION_CACHE_DIR": str(own)})
    assert out["dir"] == str(own) and out["min_compile"] == 0.0 and out["min_entry"] == -1
    assert any(p.name.endswith("-gkx-compile") for p in own.iterdir())
    assert (own / ".gkx-autocache" / "store.json").exists() and not (own / "CACHEDIR.TAG").exists()
    warm, _ = run_program(venv, env={"JAX_COMPILATION_CACHE_DIR": str(own)})
    assert warm["hits"] == warm["requests"]


@pytest.mark.line  # the settings the hook applies, not the interpreter's start-up: each JAX line's first Python
def test_jax_own_threshold_variable_wins(here: InProcess) -> None:
    """A JAX_* variable the user set is left exactly as they set it."""
    out, _ = here.configure({"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "2.5"})
    assert out["min_compile"] == 2.5 and out["min_entry"] == -1


@pytest.mark.line  # the settings the hook applies, not the interpreter's start-up: each JAX line's first Python
def test_jax_cache_turned_off_by_user_means_nothing_happens(here: InProcess) -> None:
    """JAX_ENABLE_COMPILATION_CACHE=false: no directory, no setting."""
    out, _ = here.configure({"JAX_ENABLE_COMPILATION_CACHE": "false"})
    assert out["dir"] is None and out["min_compile"] == 1.0
    assert not here.default_cache.exists()


@pytest.mark.line  # the settings the hook applies, not the interpreter's start-up: each JAX line's first Python
def test_policy_file_relative_dir_and_precedence(here: InProcess, tmp_path: Path) -> None:
    """The policy file applies, a relative dir in it is relative to the venv; env beats it; it beats
    the user's config file."""
    (here.path / "gkx-autocache.toml").write_text('dir = "policy-cache"\nmin_compile_time_secs = 0.5\n')
    user_cfg = here.home / ".config" / "gkx-autocache"
    user_cfg.mkdir(parents=True)
    (user_cfg / "config.toml").write_text('dir = "/nonexistent-user"\nmin_compile_time_secs = 0.25\nmin_entry_size_bytes = 7\n')
    out, err = here.configure()
    assert out["dir"] == str(here.path / "policy-cache" / VERSION_DIR)
    assert out["min_compile"] == 0.5 and out["min_entry"] == 7
    assert autocache_warnings(err) == []
    out, _ = here.configure({"GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS": "0.125"})
    assert out["min_compile"] == 0.125


@pytest.mark.line  # the settings the hook applies, not the interpreter's start-up: each JAX line's first Python
def test_user_config_applies_below_env(here: InProcess, tmp_path: Path) -> None:
    """The user's config.toml (XDG_CONFIG_HOME honoured) sets the directory when nothing above does."""
    cfg = tmp_path / "xdg"
    (cfg / "gkx-autocache").mkdir(parents=True)
    (cfg / "gkx-autocache" / "config.toml").write_text(f'dir = "{tmp_path / "user-cache"}"\nreport = "yes"\n')
    out, err = here.configure({"XDG_CONFIG_HOME": str(cfg)})
    assert out["dir"] == str(tmp_path / "user-cache" / VERSION_DIR)
    assert re.search(r"^gkx-autocache: 0 hits, \d+ miss(es)?\b", err, re.M), err


@pytest.mark.line  # the settings the hook applies, not the interpreter's start-up: each JAX line's first Python
def test_uncreatable_default_falls_back_quietly_to_user_cache(here: InProcess, tmp_path: Path) -> None:
    """A regular file where <venv>/.cache should be: the user cache path, with no warning."""
    (here.path / ".cache").write_text("in the way")
    out, err = here.configure({"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert out["dir"] == str(tmp_path / "xdg" / "gkx" / "jax" / VERSION_DIR)
    assert autocache_warnings(err) == []


@pytest.mark.line  # the settings the hook applies, not the interpreter's start-up: each JAX line's first Python
def test_nothing_usable_runs_uncached_with_one_warning(venv: Venv, tmp_path: Path) -> None:
    """Neither the default, the user cache nor the user's folder in the temporary directory can be
    created: one warning, the program runs uncached."""
    (venv.path / ".cache").write_text("in the way")
    (tmp_path / "xdg").write_text("in the way too")
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / f"gkx-{os.getuid()}").write_text("in the way as well")
    out, err = run_program(venv, env={"XDG_CACHE_HOME": str(tmp_path / "xdg"), "TMPDIR": str(tmp_path / "tmp")})
    assert out["dir"] is None and out["result"]
    warnings = autocache_warnings(err)
    assert len(warnings) == 1 and "filter gkx_autocache.AutocacheWarning" in warnings[0] and "GKX_JAX_CACHE=0" not in warnings[0], err


@pytest.mark.line  # the settings the hook applies, not the interpreter's start-up: each JAX line's first Python
def test_unusable_explicit_dir_is_not_replaced(here: InProcess, tmp_path: Path) -> None:
    """An explicit dir that cannot be created: one warning naming it, uncached, nothing elsewhere."""
    (tmp_path / "file").write_text("x")
    bad = tmp_path / "file" / "cache"
    out, err = here.configure({"GKX_JAX_CACHE_DIR": str(bad)})
    assert out["dir"] is None
    warnings = autocache_warnings(err)
    assert len(warnings) == 1 and "GKX_JAX_CACHE_DIR" in warnings[0] and str(bad) in warnings[0]
    assert not here.default_cache.exists()


# PROGRAM, with the package's DEBUG lines on stderr.
DEBUG_PROGRAM = ("import logging; logging.basicConfig(format='%(name)s %(message)s'); "
                 "logging.getLogger('gkx_autocache').setLevel(logging.DEBUG)\n" + PROGRAM)


@pytest.mark.parametrize("home", [None, "/"])
def test_a_user_the_password_database_does_not_know_caches_in_the_temporary_directory(venv: Venv,
                                                                                     home: str | None) -> None:
    """`docker run --user 12345`: a uid with no passwd entry, HOME unset or /, neither the venv's
    directory nor a home it can write: cached in its own 0700 folder of the temporary directory,
    said at DEBUG and by `status`, no traceback, no `~` directory; a second process is served."""
    uid = 12345
    scratch = venv.path.parent / "tmp"  # a /tmp of the test's own: root's and sticky
    scratch.mkdir()
    scratch.chmod(0o1777)
    work = venv.path.parent / "work"  # the current directory, writable by the user: a relative `~` would land here
    work.mkdir()
    os.chown(work, uid, uid)
    if home is None:
        del venv.env["HOME"]
    else:
        venv.env["HOME"] = home
    env = {"TMPDIR": str(scratch)}
    root = scratch / f"gkx-{uid}" / "jax"
    proc = venv.run("-c", DEBUG_PROGRAM, env=env, user=uid, cwd=str(work))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    cold = json.loads(proc.stdout.strip().splitlines()[-1])
    assert cold["dir"] == str(root / VERSION_DIR) and autocache_warnings(proc.stderr) == [], proc.stderr
    assert any(str(root) in line and "temporary" in line for line in proc.stderr.splitlines()), proc.stderr
    assert (root.parent.stat().st_mode & 0o777, root.parent.stat().st_uid) == (0o700, uid)
    assert not (work / "~").exists()
    warm, _ = run_program(venv, env=env, user=uid)
    assert warm["hits"] == warm["requests"] >= 2
    status = venv.cli("--json", "status", env=env, user=uid)
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    data = json.loads(status.stdout)
    assert data["directory"]["version_dir"] == str(root / VERSION_DIR)
    assert "temporary" in data["settings"]["dir"]["effective"] and data["settings"]["dir"]["origin"] == "default"


@pytest.mark.line  # the settings the hook applies, not the interpreter's start-up: each JAX line's first Python
@pytest.mark.parametrize(
    ("content", "named"),
    [
        ("dir = [broken", "not valid TOML"),
        ('min_compile_time_secs = "soon"', "min_compile_time_secs"),
        ("colour = 3", "colour"),
        ('max_size = "lots"', "max_size"),
        ("report = 3", "report"),
    ],
)
def test_bad_policy_values_warn_once_and_run(here: InProcess, content: str, named: str) -> None:
    """Bad TOML, a wrong type, an unknown key, an unparsable size: one warning naming the file and
    the key; the program runs with the next source down."""
    policy = here.path / "gkx-autocache.toml"
    policy.write_text(content + "\n")
    out, err = here.configure()
    warnings = autocache_warnings(err)
    assert len(warnings) == 1, err
    assert str(policy) in warnings[0] and named in warnings[0]
    assert out["dir"] == str(here.default_cache / VERSION_DIR)


def test_bad_env_value_warns_and_runs_under_w_error(here: InProcess) -> None:
    """Under -W error a bad setting is logged, never raised: the program still runs, cached."""
    out, err = here.configure({"GKX_JAX_CACHE_MAX_SIZE": "huge"}, w_error=True)
    assert out["dir"] == str(here.default_cache / VERSION_DIR)
    assert "GKX_JAX_CACHE_MAX_SIZE" in err and "Traceback" not in err


@pytest.mark.line  # the settings the hook applies, not the interpreter's start-up: each JAX line's first Python
def test_an_empty_signing_key_is_one_warning_where_a_shared_level_is_set(here: InProcess, tmp_path: Path) -> None:
    """GKX_JAX_CACHE_SIGNING_KEY set but empty (a CI secret not passed) with a shared level: one
    warning naming the variable, the cause and the fix, logged and never raised under -W error,
    and said by `status`; without a shared level an empty key changes nothing and says nothing."""
    shared = tmp_path / "team"
    shared.mkdir(mode=0o700)
    env = {"GKX_JAX_CACHE_SHARED": str(shared), "GKX_JAX_CACHE_SIGNING_KEY": ""}
    out, err = here.configure(env)
    warnings = [w for w in autocache_warnings(err) if "gkx-autocache:" in w]
    assert len(warnings) == 1 and "GKX_JAX_CACHE_SIGNING_KEY" in warnings[0] and "empty" in warnings[0], err
    assert out["dir"] == str(here.default_cache / VERSION_DIR)
    _, err = here.configure(env, w_error=True)
    assert "GKX_JAX_CACHE_SIGNING_KEY" in err and "Traceback" not in err
    data = json.loads(here.cli("--json", "status", env=env).stdout)
    assert sum("GKX_JAX_CACHE_SIGNING_KEY" in line and "empty" in line for line in data["attention"]) == 1
    assert data["signing_key"].startswith("empty")
    _, err = here.configure({"GKX_JAX_CACHE_SIGNING_KEY": ""})
    assert autocache_warnings(err) == []


def test_warning_points_at_the_users_import_line(venv: Venv, tmp_path: Path) -> None:
    """The warning's location is the user's `import jax`, not the package's code."""
    script = tmp_path / "user_script.py"
    script.write_text("import os\nimport jax\n")
    proc = venv.run(str(script), env={"GKX_JAX_CACHE_MIN_ENTRY_SIZE_BYTES": "-5"})
    assert f"{script}:2: AutocacheWarning: gkx-autocache: env GKX_JAX_CACHE_MIN_ENTRY_SIZE_BYTES" in proc.stderr


def test_no_jax_installed_is_silent(bare_venv: Venv) -> None:
    """Without JAX, interpreters start and programs run with nothing printed, and the package is never imported."""
    proc = bare_venv.run("-c", "import json, sys; print(json.dumps(sorted(m for m in sys.modules if 'gkx' in m)))",
                         check=True)
    assert proc.stderr == ""
    assert json.loads(proc.stdout) == []
    proc = bare_venv.run("-c", "import jax", check=False)
    assert "No module named 'jax'" in proc.stderr and "gkx" not in proc.stderr


FAKE_JAX = '''
import os
if os.path.exists(os.environ["BREAK_JAX"]):
    raise ImportError("jaxlib is broken: " + os.environ["BREAK_JAX"])
__version__ = "9.9.9"
class _Config:
    def __init__(self):
        self.values = {"jax_enable_compilation_cache": True, "jax_compilation_cache_dir": None,
                       "jax_persistent_cache_min_compile_time_secs": 1.0,
                       "jax_persistent_cache_min_entry_size_bytes": 0,
                       "jax_persistent_cache_enable_xla_caches": "xla_gpu_per_fusion_autotune_cache_dir",
                       "jax_compilation_cache_max_size": -1, "jax_compilation_cache_check_contents": False}
    def __getattr__(self, name):
        return self.values[name]
    def update(self, name, value):
        self.values[name] = value
config = _Config()
'''

FAKE_MONITORING = "def register_event_listener(f): pass\ndef register_event_duration_secs_listener(f): pass\n"

RETRY = r'''
import os, sys, traceback
try:
    import jax
except ImportError as exc:
    frames = [f.filename for f in traceback.extract_tb(exc.__traceback__)]
    print("caught", type(exc).__name__, exc, "gkx frames:", [f for f in frames if "gkx_autocache" in f])
    os.unlink(os.environ["BREAK_JAX"])
import jax
print("retry", jax.config.jax_compilation_cache_dir)
'''


def test_failing_jax_import_passes_through_and_a_retry_is_configured(bare_venv: Venv, tmp_path: Path) -> None:
    """A jax whose import raises: the same exception, no package frames; after the fix, configured."""
    fake = tmp_path / "fake"
    (fake / "jax").mkdir(parents=True)
    (fake / "jax" / "__init__.py").write_text(FAKE_JAX)
    (fake / "jax" / "monitoring.py").write_text(FAKE_MONITORING)
    flag = tmp_path / "broken"
    flag.write_text("")
    env = {"PYTHONPATH": str(fake), "BREAK_JAX": str(flag), "GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    # platformdirs is not needed: the dir is explicit.
    proc = bare_venv.run("-c", RETRY, env=env, check=True)
    assert f"caught ImportError jaxlib is broken: {flag} gkx frames: []" in proc.stdout
    assert f"retry {tmp_path / 'c' / 'jax-9.9.9'}" in proc.stdout, proc.stderr


def test_import_time_adds_no_module(venv: Venv, tmp_path: Path, wheel: Path) -> None:
    """`python -X importtime -c pass` lists no module that the same venv without the package does not."""
    without = make_venv(public_tmp(), None)

    def modules(v: Venv) -> set[str]:
        proc = v.run("-X", "importtime", "-c", "pass", check=True)
        return {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")} - {
            "package"}

    assert modules(venv) - modules(without) == set()


# Which modules of the package are imported, and which finders are on sys.meta_path, at start-up and
# after importing modules other than jax.
START_UP = r'''
import sys
def gkx():
    return sorted(m for m in sys.modules if m.split(".")[0] == "gkx_autocache")
before = gkx()
finders = [getattr(f, "__name__", type(f).__name__) for f in sys.meta_path]
import csv, email.parser, json
print(json.dumps({"before": before, "finders": finders, "after": gkx()}))
'''


def test_start_up_imports_nothing_of_the_package(venv: Venv) -> None:
    """Without bytecode, `python -c` imports no module of the package (no compile() at start-up, SPEC §2):
    the .pth line defines the finder itself, first on sys.meta_path and named GkxAutocacheFinder, and
    imports other than jax leave the package unimported."""
    package = venv.site / "gkx_autocache"
    shutil.rmtree(package / "__pycache__", ignore_errors=True)
    assert venv.env["PYTHONDONTWRITEBYTECODE"] == "1"
    out = json.loads(venv.run("-c", START_UP, check=True).stdout)
    assert out["before"] == [] and out["after"] == []
    assert out["finders"][0] == FINDER and out["finders"].count(FINDER) == 1
    assert not (package / "__pycache__").exists()


# Runs every .pth file of site-packages again (site already ran them twice: a venv's site-packages is
# processed twice at start-up), then counts the finders.
AGAIN = r'''
import json, site, sys
def count():
    return sum(getattr(f, "__name__", "") == "GkxAutocacheFinder" for f in sys.meta_path)
at_start = count()
site.addsitedir(sys.argv[1])
print(json.dumps({"at_start": at_start, "again": count(), "gkx": sorted(m for m in sys.modules if "gkx" in m)}))
'''


@pytest.mark.parametrize("value", [None, "0"])
def test_pth_line_is_idempotent(venv: Venv, value: str | None) -> None:
    """However often the .pth line runs, one finder, whatever GKX_JAX_CACHE says (the finder reads it
    when jax is imported, so that the line stays short), and the package is not imported."""
    env = {} if value is None else {"GKX_JAX_CACHE": value}
    out = json.loads(venv.run("-c", AGAIN, str(venv.site), env=env, check=True).stdout)
    assert out == {"at_start": 1, "again": 1, "gkx": []}


# What `import jax` leaves behind: the package's modules, the finders, and jax's loader.
IMPORT_JAX = r'''
import json, sys, jax
print(json.dumps({"gkx": sorted(m for m in sys.modules if m.split(".")[0] == "gkx_autocache"),
                  "finders": [getattr(f, "__name__", "") for f in sys.meta_path if "Gkx" in str(f)],
                  "loader": type(jax.__spec__.loader).__name__, "dir": jax.config.jax_compilation_cache_dir}))
'''


def test_opt_out_is_read_at_import_jax_and_touches_nothing(venv: Venv) -> None:
    """GKX_JAX_CACHE=0: at `import jax` the finder steps aside: jax keeps its own loader and settings,
    the finder is gone, and nothing of the package beyond its start-up module is imported."""
    out = json.loads(venv.run("-c", IMPORT_JAX, env={"GKX_JAX_CACHE": "0"}, check=True).stdout)
    assert out == {"gkx": ["gkx_autocache"], "finders": [], "loader": "SourceFileLoader", "dir": None}
    assert not venv.default_cache.exists()


# A spec of jax asked for before the import (an "is jax installed?" check), then the import: the
# loaders in sight, a resource of JAX's read through importlib.resources, and the directory.
LOADERS = r'''
import importlib.resources, importlib.util, json
early = importlib.util.find_spec("jax")
import jax
loaders = {"early": early.loader, "find_spec": importlib.util.find_spec("jax").loader,
           "__loader__": jax.__loader__, "__spec__": jax.__spec__.loader}
print(json.dumps({"loaders": {name: type(loader).__name__ for name, loader in loaders.items()},
                  "resource": importlib.resources.files("jax").joinpath("version.py").is_file(),
                  "dir": jax.config.jax_compilation_cache_dir}))
'''


def test_jax_has_its_own_loader_once_imported(venv: Venv) -> None:
    """Once `import jax` has run and configured, every spec of jax has JAX's own loader, one that
    `importlib.util.find_spec` handed out before the import too, and importlib.resources reads it."""
    out = json.loads(venv.run("-c", LOADERS, check=True).stdout)
    assert out["loaders"] == dict.fromkeys(("early", "find_spec", "__loader__", "__spec__"), "SourceFileLoader")
    assert out["resource"] is True and out["dir"] == str(venv.default_cache / VERSION_DIR)


def test_pth_line_leaves_a_jax_imported_before_it_to_install(bare_venv: Venv, tmp_path: Path) -> None:
    """If jax is already imported when the line runs (an earlier .pth imported it), the line only puts
    its finder in place, raising nothing and touching nothing of jax (checking sys.modules would cost
    every start); install() then configures it."""
    fake = tmp_path / "fake"
    (fake / "jax").mkdir(parents=True)
    (fake / "jax" / "__init__.py").write_text(FAKE_JAX)
    (fake / "jax" / "monitoring.py").write_text(FAKE_MONITORING)
    site, pth = str(bare_venv.site), str(bare_venv.site / "gkx_autocache.pth")
    code = (f"import sys; sys.path.append({site!r}); import jax; exec(open({pth!r}).read());"
            f"print(sorted(getattr(f, '__name__', '') for f in sys.meta_path if 'Gkx' in str(f)),"
            " jax.config.jax_compilation_cache_dir);"
            "import gkx_autocache; gkx_autocache.install(); print(jax.config.jax_compilation_cache_dir)")
    env = {"PYTHONPATH": str(fake), "BREAK_JAX": str(tmp_path / "absent"), "GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    proc = bare_venv.run("-S", "-c", code, env=env, check=True)
    assert proc.stdout.split() == ["['GkxAutocacheFinder']", "None", str(tmp_path / "c" / "jax-9.9.9")]


def test_a_program_that_drops_site_packages_imports_its_own_jax(bare_venv: Venv, tmp_path: Path) -> None:
    """A program that takes site-packages off sys.path and imports a jax of its own (pip's isolated
    build environments do, for a build that needs jax; so do zipapp runners) is not broken by the
    finder, which then cannot import the package: jax imports, unconfigured."""
    fake = tmp_path / "fake"
    (fake / "jax").mkdir(parents=True)
    (fake / "jax" / "__init__.py").write_text(FAKE_JAX)
    code = ("import sys; sys.path[:] = [p for p in sys.path if p.startswith(sys.base_prefix) and 'site-packages' not in p]"
            f" + [{str(fake)!r}]; import jax; print(jax.__version__, jax.config.jax_compilation_cache_dir)")
    env = {"BREAK_JAX": str(tmp_path / "absent"), "GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    proc = bare_venv.run("-W", "error", "-c", code, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["9.9.9", "None"] and proc.stderr == ""


@pytest.mark.parametrize(("flag", "active"), [("-S", False), ("-I", True), ("-E", True), ("-s", True)])
def test_interpreter_flags(venv: Venv, flag: str, active: bool) -> None:
    """`python -S` skips site processing, so the hook is inactive; -I, -E and -s keep it."""
    code = f"import sys; print(any(getattr(f, '__name__', '') == {FINDER!r} for f in sys.meta_path))"
    proc = venv.run(flag, "-c", code, check=True)
    assert proc.stdout.strip() == str(active)


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_editable_install_works_like_the_wheel(installer: str) -> None:
    """`pip install -e .` and `uv pip install -e .` put both start-up files at the root of
    site-packages, and `import jax` is configured."""
    base = public_tmp()
    try:
        v = make_venv(base, None, editable=installer)
        assert (v.site / "gkx_autocache.pth").read_text() == (ROOT / "gkx_autocache.pth").read_text()
        assert (v.site / "gkx_autocache.start").read_text() == (ROOT / "gkx_autocache.start").read_text()
        proc = v.run("-c", "import jax; print(jax.config.jax_compilation_cache_dir)", check=True)
        assert proc.stdout.strip() == str(v.default_cache / VERSION_DIR)
    finally:
        os.system(f"rm -rf {base}")


def test_wheel_uninstall_removes_start_files(venv: Venv) -> None:
    """Uninstalling removes gkx_autocache.pth and .start."""
    import subprocess
    import sys

    site = venv.site
    assert (site / "gkx_autocache.pth").exists() and (site / "gkx_autocache.start").exists()
    subprocess.run([sys.executable, "-m", "uv", "pip", "uninstall", "-q", "--python", venv.python, "gkx-autocache"],
                   check=True, capture_output=True)
    assert not (site / "gkx_autocache.pth").exists() and not (site / "gkx_autocache.start").exists()


THREADS = r'''
import logging, sys, threading
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s %(message)s")
barrier = threading.Barrier(8)
def worker():
    barrier.wait()
    import jax.numpy
threads = [threading.Thread(target=worker) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
import jax
print(jax.config.jax_compilation_cache_dir)
'''


def test_threads_importing_jax_at_once_configure_once(venv: Venv) -> None:
    """Eight threads import jax together: configured exactly once, no deadlock."""
    proc = venv.run("-c", THREADS, check=True, timeout=120)
    assert proc.stdout.strip() == str(venv.default_cache / VERSION_DIR)
    updates = [line for line in proc.stderr.splitlines() if "jax.config.update('jax_compilation_cache_dir'" in line]
    assert len(updates) == 1, proc.stderr


def test_already_imported_jax_is_configured_at_install(bare_venv: Venv, tmp_path: Path) -> None:
    """install() after jax is imported configures at once."""
    fake = tmp_path / "fake"
    (fake / "jax").mkdir(parents=True)
    (fake / "jax" / "__init__.py").write_text(FAKE_JAX)
    (fake / "jax" / "monitoring.py").write_text(FAKE_MONITORING)
    code = (f"import sys; sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, '__name__', '') != {FINDER!r}];"
            "import jax; import gkx_autocache; gkx_autocache.install(); print(jax.config.jax_compilation_cache_dir)")
    env = {"PYTHONPATH": str(fake), "BREAK_JAX": str(tmp_path / "absent"), "GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    proc = bare_venv.run("-c", code, env=env, check=True)
    assert proc.stdout.strip() == str(tmp_path / "c" / "jax-9.9.9")


# -- throwaway environments (SPEC §4, amended 2026-12-04) ------------------------------------------


def test_uv_run_with_twice_is_warm_the_second_time(wheel: Path) -> None:
    """Issue 45: `uv run --with gkx-autocache` builds its environment in uv's cache for each run,
    and the default directory lived inside it: every run was cold, and `status` there said the
    .pth was not installed (it was running). Such an environment caches in the user cache."""
    import subprocess
    import sys

    base = public_tmp()
    try:
        runner = make_venv(base, None)  # JAX, and no gkx-autocache: uv lays it over this one
        links = base / "links"
        links.mkdir()
        shutil.copy(wheel, links)
        _wheel_of_installed("platformdirs", links)  # gkx-autocache's one dependency, resolved offline
        env = {**runner.env, "UV_CACHE_DIR": str(base / "uv-cache"), "JAX_PLATFORMS": "cpu"}

        def uv_run(*args: str) -> subprocess.CompletedProcess[str]:
            command = [sys.executable, "-m", "uv", "run", "--no-project", "--no-index", "--find-links", str(links),
                       "--python", runner.python, "--with", "gkx-autocache", "python", *args]
            return subprocess.run(command, env=env, capture_output=True, text=True, cwd=str(runner.home), timeout=600)

        results = []
        for _ in range(2):
            proc = uv_run("-c", PROGRAM)
            assert proc.returncode == 0, proc.stderr[-3000:]
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        cold, warm = results
        assert cold["dir"].startswith(str(runner.home / ".cache" / "gkx" / "jax")), cold["dir"]
        assert warm["hits"] == warm["requests"] > 0 and cold["hits"] == 0, results
        status = uv_run("-m", "gkx_autocache", "status")
        assert "reinstall" not in status.stdout and "NOT installed" not in status.stdout, status.stdout
        assert "the user cache, as uv run --with and uvx rebuild their environments" in status.stdout, status.stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _wheel_of_installed(name: str, folder: Path) -> None:
    """A wheel of the runner's installed ``name``: its files and its dist-info, zipped as a wheel is."""
    import zipfile

    from conftest import RUNNER_SITE

    info = next(Path(RUNNER_SITE).glob(f"{name}-*.dist-info"))
    version = info.name.removeprefix(f"{name}-").removesuffix(".dist-info")
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as archive:
        for top in (Path(RUNNER_SITE) / name, info):
            for path in top.rglob("*"):
                if path.is_file() and "__pycache__" not in path.parts:
                    archive.write(path, str(path.relative_to(RUNNER_SITE)))


@pytest.mark.parametrize(("prefix", "rebuilt"), [
    ("/home/u/.cache/uv/builds-v0/.tmpLlsIVw", "uv run --with and uvx"),
    ("/home/u/.cache/uv/archive-v0/EXHvfV3ANYknv4h4", "uv run --with and uvx"),
    ("/home/u/.cache/uv/environments-v2/script-1a2b", "uv run --with and uvx"),
    ("/home/u/.local/share/pipx/.cache/5d9c3a", "pipx run"),
    ("/home/u/src/proj/.nox/tests-3-11", "nox"),
    ("/home/u/src/proj/.tox/py311", None),  # tox reuses its environments
    ("/home/u/src/proj/.venv", None),
    ("/home/u/.local/share/uv/tools/ruff", None),  # uv tool install: kept
    ("/home/u/builds-v1/.venv", None),  # a folder of that name outside uv's cache
    ("/srv/ci/builds-v2/venv", None),
    ("/home/u/src/proj/.nox/.venv", None),
])
def test_which_environments_are_rebuilt_for_each_run(prefix: str, rebuilt: str | None) -> None:
    from gkx_autocache import _cache

    assert _cache.throwaway(prefix) == rebuilt
