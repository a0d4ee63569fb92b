"""Trust (SPEC §8) with real JAX: a directory others can write is never used."""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Venv, autocache_warnings, run_program
from test_activation import VERSION_DIR


def world_writable(p: Path) -> None:
    p.chmod(0o777)


def group_writable(p: Path) -> None:
    p.chmod(0o770)


def foreign(p: Path) -> None:
    os.chown(p, 4242, 4242)


@pytest.mark.parametrize("spoil", [world_writable, group_writable, foreign])
@pytest.mark.parametrize("via_link", [False, True])
def test_untrusted_explicit_dir_turns_the_cache_off(venv: Venv, tmp_path: Path, spoil: Callable[[Path], None],
                                                    via_link: bool) -> None:
    """World-writable, group-writable, foreign-owned, or a symlink to one: uncached, one warning
    naming the path, and the right result."""
    bad = tmp_path / "bad"
    bad.mkdir(mode=0o700)
    spoil(bad)
    target = bad
    if via_link:
        target = tmp_path / "link"
        target.symlink_to(bad)
    out, err = run_program(venv, env={"GKX_JAX_CACHE_DIR": str(target)})
    assert out["dir"] is None and out["result"]
    (warning,) = autocache_warnings(err)
    assert str(target) in warning and "GKX_JAX_CACHE=0" in warning
    assert not (bad / VERSION_DIR).exists()


def test_world_writable_policy_file_is_ignored(venv: Venv) -> None:
    """Its settings do not apply; one warning; the next source (the default) does."""
    policy = venv.path / "gkx-autocache.toml"
    policy.write_text('dir = "/tmp"\nmin_compile_time_secs = 5\n')
    policy.chmod(0o666)
    out, err = run_program(venv)
    assert out["dir"] == str(venv.default_cache / VERSION_DIR) and out["min_compile"] == 0.0
    (warning,) = autocache_warnings(err)
    assert str(policy) in warning and "others can write" in warning


def test_trust_shared_accepts_a_group_directory(venv: Venv, tmp_path: Path) -> None:
    """trust_shared with a 2770 directory of one of the user's groups: used; what the package
    creates is 0770 with setgid, and entries are 0660."""
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o2770)
    out, err = run_program(venv, env={"GKX_JAX_CACHE_DIR": str(team), "GKX_JAX_CACHE_TRUST_SHARED": "1"})
    vdir = team / VERSION_DIR
    assert out["dir"] == str(vdir) and autocache_warnings(err) == []
    assert stat.S_IMODE(vdir.stat().st_mode) == 0o2770
    for folder in (vdir / ".gkx-autocache", vdir / ".gkx-autocache" / "ledger"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o2770, folder  # group members keep ledgers too
    assert {stat.S_IMODE(p.stat().st_mode) for p in vdir.glob("*-cache")} == {0o660}
    out, err = run_program(venv, env={"GKX_JAX_CACHE_DIR": str(team)})
    assert out["dir"] is None and len(autocache_warnings(err)) == 1


def test_umask_000_still_creates_private_directories(venv: Venv, tmp_path: Path) -> None:
    """Under umask 000 every directory the package creates is 0700 and entries are 0600."""
    proc = subprocess.run(["bash", "-c", f"umask 000; exec {venv.python} -c 'import jax, jax.numpy as j; j.ones(3).sum()'"],
                          env={**venv.env, "GKX_JAX_CACHE_DIR": str(tmp_path / "a" / "b")}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for p in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / VERSION_DIR):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
    assert {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "a" / "b" / VERSION_DIR).glob("*-cache")} == {0o600}


def test_untrusted_default_falls_back_silently(venv: Venv, tmp_path: Path) -> None:
    """A default venv cache others can write: the user cache instead, with no warning."""
    venv.default_cache.mkdir(parents=True)
    venv.default_cache.chmod(0o777)
    out, err = run_program(venv, env={"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert out["dir"] == str(tmp_path / "xdg" / "gkx" / "jax" / VERSION_DIR)
    assert autocache_warnings(err) == []
