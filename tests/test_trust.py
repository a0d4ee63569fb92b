"""Trust (SPEC §8) with real JAX: a directory others can write is never used. Which directory and
settings file the trust rules leave also in this process, with a stand-in ``jax`` (``here``)."""

from __future__ import annotations

import functools
import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import InProcess, autocache_warnings, in_a_child_as, planted_run
from test_activation import VERSION_DIR


def world_writable(p: Path) -> None:
    p.chmod(0o777)


def group_writable(p: Path) -> None:
    p.chmod(0o770)


def foreign(p: Path) -> None:
    os.chown(p, 4242, 4242)


@pytest.mark.parametrize("spoil", [world_writable, group_writable, foreign])
@pytest.mark.parametrize("via_link", [False, True])
def test_untrusted_explicit_dir_turns_the_cache_off(here: InProcess, tmp_path: Path, spoil: Callable[[Path], None],
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
    out, err = here.run_program({"GKX_JAX_CACHE_DIR": str(target)})
    assert out["dir"] is None and out["requests"] == 0 and out["result"]
    (warning,) = autocache_warnings(err)
    assert str(target) in warning and "filter gkx_autocache.AutocacheWarning" in warning
    assert not (bad / VERSION_DIR).exists()


def test_world_writable_policy_file_is_ignored(here: InProcess) -> None:
    """Its settings do not apply; one warning; the next source (the default) does."""
    policy = here.path / "gkx-autocache.toml"
    policy.write_text('dir = "/tmp"\nmin_compile_time_secs = 5\n')
    policy.chmod(0o666)
    out, err = here.configure()
    assert out["dir"] == str(here.default_cache / VERSION_DIR) and out["min_compile"] == 0.0
    (warning,) = autocache_warnings(err)
    assert str(policy) in warning and "others can write" in warning


def test_trust_shared_accepts_a_group_directory(here: InProcess, tmp_path: Path) -> None:
    """trust_shared with a 2770 directory of one of the user's groups: used; what the package
    creates is 0770 with setgid, and entries are 0660."""
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o2770)
    out, err = here.run_program({"GKX_JAX_CACHE_DIR": str(team), "GKX_JAX_CACHE_TRUST_SHARED": "1"})
    vdir = team / VERSION_DIR
    assert out["dir"] == str(vdir) and autocache_warnings(err) == []
    assert stat.S_IMODE(vdir.stat().st_mode) == 0o2770
    for folder in (vdir / ".gkx-autocache", vdir / ".gkx-autocache" / "ledger"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o2770, folder  # group members keep ledgers too
    assert {stat.S_IMODE(p.stat().st_mode) for p in vdir.glob("*-cache")} == {0o660}
    out, err = here.run_program({"GKX_JAX_CACHE_DIR": str(team)})
    assert out["dir"] is None and len(autocache_warnings(err)) == 1


def test_umask_000_still_creates_private_directories(here: InProcess, tmp_path: Path) -> None:
    """Under umask 000 every directory the package creates is 0700 and entries are 0600."""
    def under_umask_000() -> Any:  # (in a child: the umask is the process's)
        os.umask(0)
        return here.run_program({"GKX_JAX_CACHE_DIR": str(tmp_path / "a" / "b")})

    out, _ = in_a_child_as(0, (), under_umask_000)
    assert out["requests"] == 2 and out["hits"] == 0
    for p in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / VERSION_DIR):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
    assert {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "a" / "b" / VERSION_DIR).glob("*-cache")} == {0o600}


def test_untrusted_default_falls_back_silently(here: InProcess, tmp_path: Path) -> None:
    """A default venv cache others can write: the user cache instead, with no warning."""
    here.default_cache.mkdir(parents=True)
    here.default_cache.chmod(0o777)
    out, err = here.configure({"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert out["dir"] == str(tmp_path / "xdg" / "gkx" / "jax" / VERSION_DIR)
    assert autocache_warnings(err) == []


# -- attacks by other users (SPEC §8, §12): real non-root processes -----------------------------

ATTACKER, VICTIM, MEMBER_A, MEMBER_B, TEAM = 4242, 1001, 1001, 1002, 3000


def test_sticky_ancestor_owned_by_another_user_is_refused(public: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1777 /scratch owned by someone else: its owner can rename the victim's cache away and put
    their own in its place, so the victim's explicit dir is refused; owned by root, it is fine."""
    here = InProcess(public, monkeypatch)  # where the victim reaches it
    scratch = public / "scratch"
    scratch.mkdir()
    os.chown(scratch, ATTACKER, ATTACKER)
    scratch.chmod(0o1777)
    cache = scratch / "victim-cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, VICTIM, VICTIM)
    out, err = here.run_program({"GKX_JAX_CACHE_DIR": str(cache)}, user=VICTIM)
    assert out["dir"] is None and out["result"]
    (warning,) = autocache_warnings(err)
    assert str(scratch) in warning and f"uid {ATTACKER}" in warning and "sticky" in warning, warning
    assert not (cache / VERSION_DIR).exists()
    os.chown(scratch, 0, 0)  # /tmp's case: a sticky directory owned by root
    out, err = here.run_program({"GKX_JAX_CACHE_DIR": str(cache)}, user=VICTIM)
    assert out["dir"] == str(cache / VERSION_DIR) and autocache_warnings(err) == []


def test_policy_file_writable_by_the_users_own_primary_group_is_ignored(public: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Any member of a shared primary group (`users`) could point everyone at their directory:
    a settings file its group can write is ignored with one warning, whoever's group it is."""
    here = InProcess(public, monkeypatch)  # where the victim reaches it
    mine = public / "mine"
    mine.mkdir(mode=0o700)
    os.chown(mine, VICTIM, VICTIM)
    policy = here.path / "gkx-autocache.toml"
    policy.write_text("min_compile_time_secs = 5\n")
    os.chown(policy, VICTIM, VICTIM)
    policy.chmod(0o664)
    out, err = here.configure({"GKX_JAX_CACHE_DIR": str(mine)}, user=VICTIM)
    assert out["min_compile"] == 0.0
    (warning,) = autocache_warnings(err)
    assert str(policy) in warning and "group" in warning and "chmod g-w" in warning, warning
    policy.chmod(0o644)  # its owner alone can write it: used
    out, err = here.configure({"GKX_JAX_CACHE_DIR": str(mine)}, user=VICTIM)
    assert out["min_compile"] == 5.0 and autocache_warnings(err) == []


def test_baked_root_owned_cache_is_read_only_for_other_users(public: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The container recipe: root populates a cache, `chmod -R a+rX` it, and names it in the
    image's policy file; a non-root user gets every hit, writes nothing, and sees no warning."""
    here = InProcess(public, monkeypatch)  # where uid 65534 reaches it
    baked = public / "baked"
    cold, _ = here.run_program({"GKX_JAX_CACHE_DIR": str(baked)})
    subprocess.run(["chmod", "-R", "a+rX", str(baked)], check=True)
    (here.path / "gkx-autocache.toml").write_text(f'dir = "{baked}"\n')
    before = sorted(str(p) for p in baked.rglob("*"))
    warm, err = here.run_program(w_error=True, user=65534)
    assert warm["dir"] == str(baked / VERSION_DIR)
    assert warm["hits"] == warm["requests"] >= 2 and warm["result"] == cold["result"]
    assert err.strip() == "", err
    assert sorted(str(p) for p in baked.rglob("*")) == before  # no entry, ledger or lock of theirs


def test_baked_cache_writable_by_its_group_is_still_refused(public: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Owned by root but group-writable: not a baked cache; without trust_shared it is refused."""
    here = InProcess(public, monkeypatch)
    baked = public / "baked"
    planted_run(baked)  # what root's cold run left
    subprocess.run(["chmod", "-R", "a+rX,g+w", str(baked)], check=True)
    out, err = here.configure({"GKX_JAX_CACHE_DIR": str(baked)}, user=65534)
    assert out["dir"] is None and len(autocache_warnings(err)) == 1


def test_two_members_of_one_group_share_a_team_cache(public: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's cluster recipe (`install -d -m 2770 -g simteam`, a policy file with
    trust_shared): each member is served what the other compiled."""
    here = InProcess(public, monkeypatch)  # where the members reach it
    team = public / "team"
    team.mkdir()
    os.chown(team, 0, TEAM)
    team.chmod(0o2770)
    (here.path / "gkx-autocache.toml").write_text(f'dir = "{team}"\ntrust_shared = true\n')
    first, err = here.run_program(user=MEMBER_A, groups=(TEAM,))
    assert first["dir"] == str(team / VERSION_DIR) and first["hits"] == 0 and autocache_warnings(err) == []
    second, err = here.run_program(user=MEMBER_B, groups=(TEAM,))
    assert second["hits"] == second["requests"] >= 2 and autocache_warnings(err) == []
    other = ("f:changed", "g")  # one new function, written by member B
    third, _ = here.run_program(names=other, user=MEMBER_B, groups=(TEAM,))
    assert third["requests"] - third["hits"] == 1
    fourth, _ = here.run_program(names=other, user=MEMBER_A, groups=(TEAM,))
    assert fourth["hits"] == fourth["requests"]
    outsider, err = here.run_program(user=ATTACKER)  # not in the group: cannot even look
    assert outsider["dir"] is None and len(autocache_warnings(err)) == 1


def test_an_entry_others_can_write_is_never_loaded(public: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry is code: one that others can write (stock JAX under umask 000, say) could have been
    swapped, so it is a miss, silently, even in a trusted directory."""
    here = InProcess(public, monkeypatch)  # where uid 65534 reaches it
    baked = public / "baked"
    cold, _ = here.run_program({"GKX_JAX_CACHE_DIR": str(baked)})
    subprocess.run(["chmod", "-R", "a+rX", str(baked)], check=True)
    victim = sorted((baked / VERSION_DIR).glob("*-cache"))[0]
    victim.chmod(0o666)
    warm, err = here.run_program({"GKX_JAX_CACHE_DIR": str(baked)}, w_error=True, user=65534)
    assert warm["requests"] - warm["hits"] == 1 and warm["result"] == cold["result"] and err.strip() == "", err


def test_commands_on_a_cache_they_cannot_write_say_so(public: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`clear` by a user who cannot write the (baked) cache: exit 1 and the reason, never a claim
    that entries were removed."""
    here = InProcess(public, monkeypatch)
    baked = public / "baked"
    planted_run(baked)  # what root's cold run left
    subprocess.run(["chmod", "-R", "a+rX", str(baked)], check=True)
    before = sorted(p.name for p in (baked / VERSION_DIR).iterdir())
    for command in (["clear", "--yes"], ["prune", "--max-size", "1"]):
        proc = here.cli(*command, env={"GKX_JAX_CACHE_DIR": str(baked)}, user=65534)
        assert proc.returncode == 1 and "could not be removed" in proc.stderr and "removed 0 of" in proc.stderr, proc
    assert sorted(p.name for p in (baked / VERSION_DIR).iterdir()) == before


def test_planted_fifos_never_hang(here: InProcess, tmp_path: Path) -> None:
    """FIFOs where the policy file, an entry, the tag and a ledger should be: `import jax` and
    the commands finish (each in a child that a 120 s alarm ends: a hang fails the test), with
    one line where something is refused."""
    import signal

    def within_120_s(call: Callable[[], Any]) -> Any:
        def bounded() -> Any:
            signal.alarm(120)
            return call()

        return in_a_child_as(0, (), bounded)

    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}
    cold, _ = here.run_program(env)
    vdir = tmp_path / "c" / VERSION_DIR
    victim = sorted(vdir.glob("*-cache"))[0]
    victim.unlink()
    os.mkfifo(victim)
    os.mkfifo(vdir / ".gkx-autocache" / "ledger" / "1-2.jsonl")
    os.mkfifo(here.path / "gkx-autocache.toml")
    out, err = within_120_s(lambda: here.run_program(env))
    assert out["requests"] - out["hits"] == 1 and out["result"] == cold["result"], err
    assert len(autocache_warnings(err)) == 1, err
    for command in (["status"], ["stats"], ["verify"]):
        assert within_120_s(functools.partial(here.cli, *command, env=env)).returncode in (0, 1)
    (vdir / "CACHEDIR.TAG").unlink()
    os.mkfifo(vdir / "CACHEDIR.TAG")
    proc = within_120_s(lambda: here.cli("clear", "--yes", env=env))
    assert proc.returncode == 1 and "CACHEDIR.TAG" in proc.stderr


def test_a_members_reset_keeps_the_team_cache_usable(public: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`stats --reset` by one member of a team cache leaves the lock and the summary writable by
    the group, so the other member's runs still fold and are explained."""
    here = InProcess(public, monkeypatch)  # where the members reach it
    team = public / "team"
    team.mkdir()
    os.chown(team, 0, TEAM)
    team.chmod(0o2770)
    (here.path / "gkx-autocache.toml").write_text(f'dir = "{team}"\ntrust_shared = true\n')
    here.run_program(user=MEMBER_A, groups=(TEAM,))
    assert here.cli("stats", "--reset", user=MEMBER_A, groups=(TEAM,)).returncode == 0
    meta = team / VERSION_DIR / ".gkx-autocache"
    for name in ("prune.lock", "summary.json"):
        assert (meta / name).stat().st_mode & 0o060 == 0o060, name
    here.run_program(user=MEMBER_B, groups=(TEAM,))
    assert list((meta / "ledger").iterdir()) == []  # member B folded


# -- what a checked-out repository may choose (SPEC §3) -------------------------------------------


def test_a_relative_xdg_cache_home_cannot_make_a_checkout_the_cache(here: InProcess, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative XDG_CACHE_HOME is ignored (XDG spec): a run from a repository holding a planted,
    trusted cache under that relative path gets no hit from it and uses ~/.cache instead."""
    repo = tmp_path / "repo"
    planted = repo / "xdg" / "gkx" / "jax"
    cold, _ = here.run_program({"GKX_JAX_CACHE_DIR": str(planted)})  # entries that pass every check
    assert cold["hits"] == 0 and any((planted / VERSION_DIR).glob("*-cache"))
    (here.path / ".cache").write_text("")  # the venv's own cache cannot be made: the user cache is next
    monkeypatch.chdir(repo)
    out, err = here.run_program({"XDG_CACHE_HOME": "xdg"})
    assert out["hits"] == 0 and out["dir"] == str(here.home / ".cache" / "gkx" / "jax" / VERSION_DIR)
    assert autocache_warnings(err) == []


def test_a_relative_xdg_config_home_cannot_make_a_checkout_the_config(here: InProcess, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative XDG_CONFIG_HOME is ignored: a config.toml planted in a repository under that
    relative path is not read; the user's own ~/.config one is."""
    repo = tmp_path / "repo"
    (repo / "cfg" / "gkx-autocache").mkdir(parents=True)
    (repo / "cfg" / "gkx-autocache" / "config.toml").write_text(f'dir = "{tmp_path / "chosen"}"\nreport = true\n')
    mine = here.home / ".config" / "gkx-autocache" / "config.toml"
    mine.parent.mkdir(parents=True)
    mine.write_text('max_size = "1GiB"\n')
    monkeypatch.chdir(repo)
    proc = here.cli("--json", "config", "list", env={"XDG_CONFIG_HOME": "cfg"})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["files"].get(str(mine)) == "used" and not any("cfg" in p for p in data["files"])
    assert data["settings"]["dir"]["origin"] == "default" and data["settings"]["report"]["value"] is False
    assert data["settings"]["max_size"]["origin"] == str(mine)
    out, err = here.configure({"XDG_CONFIG_HOME": "cfg"})
    assert "gkx-autocache:" not in err, err  # no report line either
    assert out["dir"] == str(here.default_cache / VERSION_DIR)


def _swap_after_mkdir(monkeypatch: pytest.MonkeyPatch, target: Path, victim: Path) -> list[str]:
    """A hostile group member at the worst moment: right after the package's ``mkdir`` of
    ``target``, before anything else, the new directory is renamed away and a symlink to
    ``victim`` (a directory the victim owns) put in its place. Returns the paths swapped."""
    real_mkdir = os.mkdir
    swapped: list[str] = []

    def mkdir(path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        real_mkdir(path, mode, dir_fd=dir_fd)
        made = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path) if dir_fd is not None else os.fspath(path)
        if made == str(target):
            os.rename(made, made + ".moved")
            os.symlink(victim, made)
            swapped.append(made)

    monkeypatch.setattr(os, "mkdir", mkdir)
    return swapped


@pytest.mark.parametrize("component", ["root", "version", "bookkeeping", "ledger"])
def test_a_directory_swapped_for_a_symlink_after_mkdir_is_never_chmod_ed_or_tagged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, component: str) -> None:
    """In a team directory (2770, no sticky bit) a member may rename what the victim just made.
    Swapped for a symlink between the ``mkdir`` and what follows, the victim's own private
    directory must not become group-writable, nor tagged, nor get anything written in it: every
    mode change and write goes through a descriptor opened without following a link. The audit
    hook sees every ``chmod`` and ``open``: none by path under the victim."""
    from gkx_autocache import _cache, _files

    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o2770)
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    victim.chmod(0o700)
    root = team / "cache"
    vdir = root / "jax-0.0.0"
    target = {"root": root, "version": vdir, "bookkeeping": vdir / ".gkx-autocache",
              "ledger": vdir / ".gkx-autocache" / "ledger"}[component]
    swapped = _swap_after_mkdir(monkeypatch, target, victim)
    touched: list[str] = []
    active = [True]  # an audit hook stays for the life of the process: inert after this test

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if active and event in ("os.chmod", "open") and isinstance(args[0], str) and args[0].startswith(str(team)):
            touched.append(f"{event} {args[0]}")

    sys.addaudithook(audit)
    try:
        _cache.prepare(str(root), "0.0.0", team=True)
        if component in ("bookkeeping", "ledger"):
            _files.bookkeeping_dir(str(vdir), True, *(["ledger"] if component == "ledger" else []))
    except _cache.DirectoryRefused:
        pass  # refusing the swapped directory is right too
    finally:
        active.clear()
        monkeypatch.undo()
    assert swapped == [str(target)]
    assert stat.S_IMODE(victim.stat().st_mode) == 0o700
    assert list(victim.iterdir()) == []
    assert [t for t in touched if "os.chmod" in t or t.endswith("CACHEDIR.TAG")] == []


def test_trust_shared_for_a_shared_directory_never_trusts_a_group_writable_local_level(
        here: InProcess, tmp_path: Path) -> None:
    """`trust_shared` given for a shared directory is that level's: a local `dir` that has become
    group-writable (by a swap, or a mistake) is refused with one line, never taken for a team
    directory whose members may plant code in it."""
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o2770)
    local = tmp_path / "local"
    (local / VERSION_DIR).mkdir(parents=True)
    for folder in (local, local / VERSION_DIR):
        folder.chmod(0o2770)
    env = {"GKX_JAX_CACHE_DIR": str(local), "GKX_JAX_CACHE_SHARED": str(team), "GKX_JAX_CACHE_TRUST_SHARED": "1"}
    out, err = here.configure(env)
    assert out["dir"] is None, out
    assert len(autocache_warnings(err)) == 1 and "group can write" in err, err


@pytest.mark.parametrize("write", ["index append", "index compaction", "verdict", "ledger"])
def test_bookkeeping_swapped_for_a_symlink_after_its_check_is_never_written_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write: str) -> None:
    """`bookkeeping_dir` refuses a symlinked `.gkx-autocache`, then the file is written by its path:
    a team member who swaps the folder for a symlink between the check and the write (a real
    two-user race won 11 of 500) points the victim's write at a folder of the victim's own, and
    its `index` (a `.git` has one), `store.json` or ledger is replaced or appended to there. Every
    write into bookkeeping must go through the descriptor of the folder that was checked."""
    from gkx_autocache import _cache, _files, _formats
    from gkx_autocache._record import index as _index
    from gkx_autocache._record import reset as _reset

    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o2770)
    victim = tmp_path / "victim"  # say the victim's ~/project/.git
    victim.mkdir(mode=0o700)
    for name in ("index", "store.json"):
        (victim / name).write_bytes(b"the victim's own")
    vdir = Path(_cache.prepare(str(team / "cache"), "0.0.0", team=True).version_dir)
    real = _files.bookkeeping_dir

    def checked_then_swapped(version_dir: str, shared: bool, *parts: str) -> str | None:
        folder = real(version_dir, shared, *parts)
        meta = vdir / ".gkx-autocache"
        if folder is not None and not meta.is_symlink():
            os.rename(meta, tmp_path / "moved")
            meta.symlink_to(victim)
        return folder

    monkeypatch.setattr(_files, "bookkeeping_dir", checked_then_swapped)
    if write == "index append":
        _index.append(str(vdir), ["a line"], True)
    elif write == "index compaction":
        _files.bookkeeping_dir(str(vdir), True)
        _files.write_atomic(_index.index_path(str(vdir)), b"compacted", _files.file_mode(True))
    elif write == "verdict":
        _formats.write_verdict(str(vdir), "gkx", None, team=True)
    else:
        (victim / "ledger").mkdir(mode=0o700)
        _reset._command_ledger(str(vdir), [{"event": "x"}], True)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in victim.iterdir() if p.is_file()} == {
        "index": b"the victim's own", "store.json": b"the victim's own"}
    assert list((victim / "ledger").iterdir()) == [] if write == "ledger" else True


def test_a_shared_directory_swapped_after_its_check_is_never_written_through(tmp_path: Path) -> None:
    """A shared directory level is checked once (`prepare`), then each upload is written by its
    path: a team member who later replaces the version directory with a symlink to a folder of the
    victim's own has the victim's process write entries there (no race: the swap may come at any
    time in a long run)."""
    from gkx_autocache._backends import directory as _directory
    from gkx_autocache._shared import calls as _calls

    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o2770)
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    backend = _directory.Directory(str(team), "0.0.0", team=True)
    backend.prepare(_calls.Progress())
    os.rename(backend.where, tmp_path / "moved")
    os.symlink(victim, backend.where)
    try:
        backend.write(f"jit_f-{'a' * 64}-cache", b"\x78\x9centry")
    except OSError:
        pass  # refused: right
    assert list(victim.iterdir()) == []


def test_a_team_caches_tag_is_readable_by_every_member_whatever_the_umask(tmp_path: Path) -> None:
    """The tag is how `clear` and `prune` recognise a cache before deleting (SPEC §8), and every
    member of a team cache may prune: written under a umask of 077, a 0600 tag leaves the other
    members unable to read it, so their prune and clear refuse the team's cache."""
    from gkx_autocache import _cache

    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o2770)
    old = os.umask(0o077)
    try:
        prepared = _cache.prepare(str(team / "cache"), "0.0.0", team=True)
    finally:
        os.umask(old)
    for folder in (team / "cache", Path(prepared.version_dir)):
        assert stat.S_IMODE((folder / "CACHEDIR.TAG").stat().st_mode) == 0o644


@pytest.mark.parametrize("o_path", [True, False])
def test_without_o_path_a_user_below_a_0711_ancestor_still_gets_a_cache(public: Path, o_path: bool) -> None:
    """Where the OS has no ``O_PATH`` (macOS), directories are opened ``O_RDONLY`` one component at
    a time, which needs read permission on each: a user whose cache lies below a directory they
    may cross but not list (0711, like many a /home) has the cache refused, where a plain mkdir
    worked. Such an ancestor is root's and writable by no one else, so nobody can swap it."""
    from conftest import as_user

    base = public / "locked"
    (base / "u").mkdir(parents=True)
    base.chmod(0o711)
    os.chown(base / "u", 1002, 1002)
    (base / "u").chmod(0o700)
    src = str(Path(__file__).resolve().parents[1] / "src")
    script = (f"import os, sys; sys.path.insert(0, {src!r}); from gkx_autocache import _cache, _files; "
              f"_files.PATH = {'_files.PATH' if o_path else 'os.O_RDONLY'}; print(_cache.prepare({str(base / 'u' / 'cache')!r}, '0.0.0').version_dir)")
    proc = subprocess.run(as_user(1002, [sys.executable, "-c", script]), capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"]})
    assert proc.returncode == 0, proc.stderr[-1500:]
    assert (base / "u" / "cache" / "jax-0.0.0").is_dir()


def test_a_private_directory_of_the_victim_swapped_in_after_mkdir_is_never_made_a_team_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make_dir` checks that what it opens after `mkdir` is the victim's and no wider than 0700:
    a directory of the victim's own passes both. A member who removes the new directory and
    renames into its place a private folder the victim keeps in a directory the member can write
    (the team directory) has the victim make it 2770 and tag it: the group reads its files, and
    backups skip it. A directory `mkdir` just made holds nothing of anyone's."""
    from gkx_autocache import _cache

    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o2770)
    scratch = team / "scratch"
    scratch.mkdir(mode=0o700)
    scratch.chmod(0o700)
    (scratch / "secret").write_text("the victim's")
    root = team / "cache"
    real_mkdir = os.mkdir

    def mkdir(path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        real_mkdir(path, mode, dir_fd=dir_fd)
        made = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path) if dir_fd is not None else os.fspath(path)
        if made == str(root):
            os.rmdir(made)
            os.rename(scratch, made)

    monkeypatch.setattr(os, "mkdir", mkdir)
    try:
        _cache.prepare(str(root), "0.0.0", team=True)
    except _cache.DirectoryRefused:
        pass  # refusing is right
    monkeypatch.undo()
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert sorted(p.name for p in root.iterdir()) == ["secret"]
