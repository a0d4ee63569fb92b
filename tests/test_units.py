"""Pure units on injected environments and temporary folders: settings, files, directories, trust."""

from __future__ import annotations

import os
import stat
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from conftest import local_at

import gkx_autocache
from gkx_autocache import _cache, _entries, _policy, _remove, _settings, _trust, _userdirs
from gkx_autocache._layout import TAG, TAG_NAME


def resolve(env: dict[str, str], prefix: Path, user: Path | None = None) -> _settings.Settings:
    return _settings.resolve(env, str(prefix), str(user or prefix / "no-user.toml"), cwd="/work/cwd")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("5GiB", 5 * 1024**3), ("800MB", 800_000_000), ("1.5k", 1500), ("2KiB", 2048), ("123", 123), (0, 0),
     (" 7 tib ", 7 * 1024**4), ("10b", 10)],
)
def test_sizes(text: object, expected: int) -> None:
    """Sizes: a byte count or a number with K/M/G/T (1000) or KiB.. (1024), any case."""
    assert _settings.parse_size(text) == expected


@pytest.mark.parametrize("bad", ["lots", "-1", "5 GiBs", True, -3, "1e9"])
def test_bad_sizes(bad: object) -> None:
    with pytest.raises(_settings.BadValue):
        _settings.parse_size(bad)


def test_precedence_and_origins(tmp_path: Path) -> None:
    """env > policy file > user file > default, each value with its origin; JAX's own wins over all."""
    (tmp_path / "gkx-autocache.toml").write_text('max_size = "1GiB"\nreport = true\n')
    user = tmp_path / "user.toml"
    user.write_text('max_size = "2GiB"\ntrust_shared = "yes"\nreport = false\n')
    s = _settings.resolve({"GKX_JAX_CACHE_REPORT": "off", "GKX_JAX_CACHE_DIR": "rel"}, str(tmp_path), str(user),
                          cwd="/work/cwd", jax_explicit={"min_compile_time_secs": (3.0, "JAX (X)")})
    assert (s["max_size"], s.origin("max_size")) == (1024**3, str(tmp_path / "gkx-autocache.toml"))
    assert (s["report"], s.origin("report")) == (False, "env GKX_JAX_CACHE_REPORT")
    assert (s["trust_shared"], s.origin("trust_shared")) == (True, str(user))
    assert (s["dir"], s.origin("dir")) == ("/work/cwd/rel", "env GKX_JAX_CACHE_DIR")
    assert (s["min_compile_time_secs"], s.origin("min_compile_time_secs")) == (3.0, "JAX (X)")
    assert (s["min_entry_size_bytes"], s.origin("min_entry_size_bytes")) == (-1, "default")
    assert s.problems == []


def test_bad_value_falls_through_to_next_source(tmp_path: Path) -> None:
    """A bad value is skipped with one problem naming source and key; the next source applies."""
    (tmp_path / "gkx-autocache.toml").write_text("min_entry_size_bytes = 9\n")
    s = resolve({"GKX_JAX_CACHE_MIN_ENTRY_SIZE_BYTES": "many", "GKX_JAX_CACHE_XLA_CACHES": "some"}, tmp_path)
    assert s["min_entry_size_bytes"] == 9
    assert s["xla_caches"] is None
    messages = [m for _, m in s.problems]
    assert any("GKX_JAX_CACHE_MIN_ENTRY_SIZE_BYTES" in m and "min_entry_size_bytes" in m for m in messages)
    assert any("GKX_JAX_CACHE_XLA_CACHES" in m for m in messages)


def test_empty_variable_counts_as_unset(tmp_path: Path) -> None:
    s = resolve({"GKX_JAX_CACHE_DIR": "  ", "GKX_JAX_CACHE": ""}, tmp_path)
    assert s.origin("dir") == "default" and s["enabled"] is True


def test_an_empty_signing_key_is_a_bad_setting_where_a_shared_level_is_set(tmp_path: Path) -> None:
    """GKX_JAX_CACHE_SIGNING_KEY set but empty (a CI secret not passed) is one problem naming the
    variable, where a shared level is set; without one it changes nothing, and says nothing."""
    empty = {"GKX_JAX_CACHE_SIGNING_KEY": ""}
    s = resolve({**empty, "GKX_JAX_CACHE_SHARED": "s3://bucket/team"}, tmp_path)
    assert [cause for cause, _ in s.problems] == ["signing:empty"]
    assert "GKX_JAX_CACHE_SIGNING_KEY" in s.problems[0][1] and "empty" in s.problems[0][1]
    assert _settings.signing_key(empty) is None
    assert resolve(empty, tmp_path).problems == []


def test_dir_expansion_and_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """~ and $VARS expand; a file's relative dir is relative to its folder; URLs stay verbatim."""
    monkeypatch.setenv("GKX_TEST_SCRATCH", "/scratch")
    assert _settings.parse_dir("$GKX_TEST_SCRATCH/c", "/x") == "/scratch/c"
    assert _settings.parse_dir("~/c", "/x") == os.path.expanduser("~/c")
    assert _settings.parse_dir("s3://bucket/p", "/x") == "s3://bucket/p"
    (tmp_path / "gkx-autocache.toml").write_text('dir = "../shared-cache"\n')
    assert resolve({}, tmp_path)["dir"] == str(tmp_path.parent / "shared-cache")


def test_config_set_keeps_the_rest_of_the_file(tmp_path: Path) -> None:
    """Editing one key keeps comments, other keys and tables."""
    path = tmp_path / "c.toml"
    path.write_text("# team policy\nmax_size = \"1GiB\"\nreport = true\n\n[other]\nx = 1\n")
    _policy.set_key(str(path), "max_size", '"3GiB"')
    _policy.set_key(str(path), "dir", '"/d"')
    _policy.set_key(str(path), "report", None)
    assert path.read_text() == '# team policy\nmax_size = "3GiB"\n\ndir = "/d"\n[other]\nx = 1\n'
    assert _policy.read(str(path)).data["max_size"] == "3GiB"


def test_untrusted_policy_file_is_ignored(tmp_path: Path) -> None:
    """A world-writable file, or one owned by another user, is ignored with a reason."""
    path = tmp_path / "gkx-autocache.toml"
    path.write_text('max_size = "1GiB"\n')
    path.chmod(0o666)
    verdict = _policy.read(str(path))
    assert verdict.status == "ignored" and "others can write" in (verdict.problem or "")
    path.chmod(0o644)
    os.chown(path, 12345, 0)
    verdict = _policy.read(str(path))
    assert verdict.status == "ignored" and "uid 12345" in (verdict.problem or "")
    os.chown(path, 0, 0)
    assert _policy.read(str(path)).status == "used"


def test_created_directories_are_0700_under_any_umask(tmp_path: Path) -> None:
    """Every directory the package creates is 0700 even with umask 000; tags only where it created."""
    (tmp_path / "existing").mkdir(mode=0o755)
    old = os.umask(0)
    try:
        prepared = _cache.prepare(str(tmp_path / "existing" / "a" / "b"), "1.0")
    finally:
        os.umask(old)
    for p in (tmp_path / "existing" / "a", tmp_path / "existing" / "a" / "b", Path(prepared.version_dir)):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
    assert (tmp_path / "existing" / "a" / "b" / TAG_NAME).exists()
    assert (Path(prepared.version_dir) / TAG_NAME).exists()
    assert not (tmp_path / "existing" / TAG_NAME).exists()
    assert not (tmp_path / "existing" / "a" / TAG_NAME).exists()


def test_existing_root_gets_no_tag(tmp_path: Path) -> None:
    """A directory that already existed (a home, a scratch dir) is never tagged."""
    root = tmp_path / "scratch"
    root.mkdir(mode=0o700)
    prepared = _cache.prepare(str(root), "1.0")
    assert not (root / TAG_NAME).exists() and (Path(prepared.version_dir) / TAG_NAME).exists()


def test_shared_mode_creates_setgid_group_directories(tmp_path: Path) -> None:
    """trust_shared: created directories are 0770 with setgid, and a 2770 group dir is accepted."""
    team = tmp_path / "team"
    team.mkdir()
    team.chmod(0o2770)
    prepared = _cache.prepare(str(team / "cache"), "1.0", team=True)
    for p in (team / "cache", Path(prepared.version_dir)):
        assert stat.S_IMODE(p.stat().st_mode) == 0o2770
    with pytest.raises(_cache.DirectoryRefused, match="group can write"):
        _cache.prepare(str(team), "1.0", team=False)


def test_shared_mode_accepts_a_teammates_group_directory(tmp_path: Path) -> None:
    """A team cache created by a teammate (another owner, one of your groups, group-writable) is
    usable with trust_shared, and refused without it or when others can write it."""
    team = tmp_path / "team"
    team.mkdir()
    os.chown(team, 4242, os.getgid())
    team.chmod(0o2770)
    vdir = team / "jax-1.0"
    vdir.mkdir()
    os.chown(vdir, 4242, os.getgid())
    vdir.chmod(0o2770)
    assert _cache.prepare(str(team), "1.0", team=True).version_dir == str(vdir)
    with pytest.raises(_cache.DirectoryRefused, match="owned by uid 4242"):
        _cache.prepare(str(team), "1.0", team=False)
    team.chmod(0o2750)  # a teammate's directory the group cannot write: theirs alone
    with pytest.raises(_cache.DirectoryRefused, match="owned by uid 4242"):
        _cache.prepare(str(team), "1.0", team=True)
    team.chmod(0o2777)
    with pytest.raises(_cache.DirectoryRefused, match="others can write"):
        _cache.prepare(str(team), "1.0", team=True)


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        (lambda p: p.chmod(0o777), "others can write"),
        (lambda p: p.chmod(0o770), "group can write"),
        (lambda p: os.chown(p, 4242, 4242), "owned by uid 4242"),
    ],
)
def test_untrusted_directories_are_refused(tmp_path: Path, setup, reason: str) -> None:  # type: ignore[no-untyped-def]
    """World-writable, group-writable (without trust_shared) or foreign-owned: refused, with why."""
    bad = tmp_path / "bad"
    bad.mkdir(mode=0o700)
    setup(bad)
    with pytest.raises(_cache.DirectoryRefused, match=reason):
        _cache.prepare(str(bad), "1.0")
    link = tmp_path / "link"
    link.symlink_to(bad)
    with pytest.raises(_cache.DirectoryRefused, match=reason):  # judged by its target
        _cache.prepare(str(link), "1.0")


def test_ancestor_writable_by_others_without_sticky_is_refused(tmp_path: Path) -> None:
    """An ancestor others can write (not sticky) could swap the directory; a sticky one is fine."""
    parent = tmp_path / "open"
    parent.mkdir()
    parent.chmod(0o777)
    with pytest.raises(_cache.DirectoryRefused, match="parent"):
        _cache.prepare(str(parent / "cache"), "1.0")
    parent.chmod(0o1777)
    assert _cache.prepare(str(parent / "cache"), "1.0").writable


def test_private_dir_in_sticky_tmp_is_trusted(tmp_path: Path) -> None:
    """/tmp/<something> created 0700 by the user inside sticky /tmp: accepted."""
    import tempfile

    d = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        assert _trust.directory_problem(str(d)) is None and _trust.ancestors_problem(str(d / "x")) is None
    finally:
        os.rmdir(d)


def test_scan_groups_sidecars_and_skips_links_and_strangers(tmp_path: Path) -> None:
    """scan() groups an entry with its sidecars, lists temporaries, and never counts links or
    files of other shapes."""
    key = "jit_f-" + "a" * 64
    (tmp_path / f"{key}-cache").write_bytes(b"x" * 10)
    (tmp_path / f"{key}-gkx-compile").write_bytes(b"0.1")
    (tmp_path / f"jit_g-{'b' * 64}-atime").write_bytes(b"12345678")
    (tmp_path / f".{key}-cache.4242.1.tmp").write_bytes(b"partial")
    (tmp_path / ".jit_f.tmp").write_bytes(b"another tool's")  # not the package's pattern (pid, thread)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / f"weights-{'d' * 64}-weights").write_text("a suffix the package does not know")
    (tmp_path / f"jit_h-{'c' * 64}-cache").symlink_to("/etc/passwd")
    found = _entries.scan(str(tmp_path))
    on_disk = sum(os.stat(p).st_blocks * 512 for p in found.units[key].files)  # as du counts: whole blocks
    assert found.entries == 1 and found.units[key].bytes == on_disk >= 13 and len(found.units[key].files) == 2
    assert not found.units[f"jit_g-{'b' * 64}"].has_entry and f"weights-{'d' * 64}" not in found.units
    assert [os.path.basename(t[0]) for t in found.temporary] == [f".{key}-cache.4242.1.tmp"]
    assert [os.path.basename(p) for p in found.links] == [f"jit_h-{'c' * 64}-cache"]


def test_count_takes_what_scan_takes(tmp_path: Path) -> None:
    """count(), status's fast path, counts the entries and bytes scan() and the bookkeeping come to:
    no link, FIFO, folder or stranger named like an entry, whatever way its name is read."""
    hex_ = "a" * 64
    taken = [f"jit_f-{hex_}-cache", f"jit_f-{hex_}-gkx-compile", f"jit_g-{hex_}-atime", f"jit_\u00e9-{hex_}-cache",
             f".jit_f-{hex_}-cache.77.3.tmp"]
    for name in taken:
        (tmp_path / name).write_bytes(b"x" * 5000)
    for name in ("notes.txt", ".hidden", f"a b-{hex_}-cache", f"jit_h-{'A' * 64}-cache", f"jit_a\u200db-{hex_}-cache",
                 f"-{hex_}-cache", f"jit_i-{hex_}-cache.bak", ".jit_f.tmp", f"m-{hex_}-weights"):
        (tmp_path / name).write_bytes(b"not ours")
    (tmp_path / f"jit_j-{hex_}-cache").symlink_to(tmp_path / f"jit_f-{hex_}-cache")
    os.mkfifo(tmp_path / f"jit_k-{hex_}-cache")
    (tmp_path / f"jit_l-{hex_}-cache").mkdir()
    (tmp_path / ".gkx-autocache" / "ledger").mkdir(parents=True)
    (tmp_path / ".gkx-autocache" / "ledger" / "1-2.jsonl").write_bytes(b"{}\n")
    found = _entries.scan(str(tmp_path))
    top = sum(u.bytes for u in found.units.values()) + sum(t[1] for t in found.temporary)
    assert found.entries == 2 and len(found.temporary) == 1
    assert _entries.count(str(tmp_path)) == (found.entries, top + _entries.bookkeeping_bytes(str(tmp_path)))
    assert top == sum(_remove.on_disk(os.lstat(tmp_path / name)) for name in taken)


def test_count_is_kept_until_the_directory_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """count() keeps its figures with the directory's inode and change time, once the directory was
    quiet (status on 100 000 entries); any entry added or removed, and it counts again, also where a
    modification time was set back (``rsync -a``, ``touch -r``). Kept nowhere when the directory
    changed just now; a record of another time, garbage, another user's or a symlink is not read."""
    hex_ = "b" * 64
    vdir, meta = str(tmp_path), tmp_path / ".gkx-autocache"
    meta.mkdir()
    kept = meta / "count"
    (tmp_path / f"jit_f-{hex_}-cache").write_bytes(b"x" * 5000)
    first = _entries.count(vdir)
    assert first[0] == 1 and not kept.exists()  # changed just now: counted, nothing kept
    monkeypatch.setattr(_entries, "QUIET_SECS", -60.0)  # from here on, as if all was written a minute ago
    (tmp_path / f"jit_g-{hex_}-cache").write_bytes(b"x" * 5000)
    second = _entries.count(vdir)
    assert second[0] == 2 and kept.exists()
    with open(tmp_path / f"jit_g-{hex_}-cache", "ab") as f:  # in place: the directory's times stay
        f.write(b"y" * 100_000)
    assert _entries.count(vdir) == second  # read from the record, not counted again
    st = os.stat(tmp_path)
    (tmp_path / f"jit_h-{hex_}-cache").write_bytes(b"x" * 5000)
    os.utime(tmp_path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the modification time put back
    third = _entries.count(vdir)
    assert third[0] == 3 and third[1] > second[1] + 100_000
    os.remove(tmp_path / f"jit_h-{hex_}-cache")
    assert _entries.count(vdir)[0] == 2
    st = os.stat(tmp_path)
    for text in (f"{st.st_ino} {st.st_ctime_ns + 1} 7 7\n", "garbage\n", f"{st.st_ino} {st.st_ctime_ns} -7 7\n"):
        kept.write_text(text)
        assert _entries.count(vdir)[0] == 2
    kept.write_text(f"{st.st_ino} {st.st_ctime_ns} 7 7\n")  # a team's member's record (chown: SPEC §12)
    os.chown(kept, 54321, -1)
    assert _entries.count(vdir)[0] == 2
    kept.write_text(f"{st.st_ino} {st.st_ctime_ns} 7 7\n")  # the same, this user's own: believed
    assert _entries.count(vdir)[0] == 7
    elsewhere = tmp_path.parent / "count-elsewhere"
    elsewhere.write_text(f"{st.st_ino} {st.st_ctime_ns} 7 7\n")
    kept.unlink()
    kept.symlink_to(elsewhere)
    assert _entries.count(vdir)[0] == 2  # the link not followed; replaced by the new record, never written through
    assert elsewhere.read_text() == f"{st.st_ino} {st.st_ctime_ns} 7 7\n" and not kept.is_symlink()


def test_count_is_not_kept_while_an_entry_is_written_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """JAX's own cache writes an entry in place: the directory's times change at its creation, not as
    its bytes land. A count while one is being written is not kept (its file's change time is new)."""
    (tmp_path / ".gkx-autocache").mkdir()
    entry = tmp_path / f"jit_big-{'c' * 64}-cache"
    with open(entry, "wb") as f:
        f.write(b"x" * 4096)
        f.flush()
        time.sleep(2.5)
        monkeypatch.setattr(_entries, "QUIET_SECS", 2.0)  # the directory quiet (2.5 s), the entry not (just now)
        f.write(b"x" * 4096)
        f.flush()
        during = _entries.count(str(tmp_path))
        f.write(b"x" * (1 << 20))
    assert _entries.count(str(tmp_path))[1] >= during[1] + (1 << 20)
    assert not (tmp_path / ".gkx-autocache" / "count").exists()


def test_a_kept_count_does_not_make_an_old_version_directory_look_used(tmp_path: Path) -> None:
    """status counts every version directory, writing its count: that is no use of the directory (an
    old JAX's directory is still removed after 30 days unused, SPEC §8)."""
    vdir = tmp_path / "jax-0.4.1"
    (vdir / ".gkx-autocache").mkdir(parents=True)
    (vdir / f"jit_f-{'d' * 64}-cache").write_bytes(b"x")
    month = time.time() - 31 * 86400
    for path in (vdir / f"jit_f-{'d' * 64}-cache", vdir / ".gkx-autocache"):
        os.utime(path, (month, month))
    assert _entries.stale(str(vdir), "jax-0.10.2")
    (vdir / ".gkx-autocache" / "count").write_text("1 2 3 4\n")
    assert _entries.stale(str(vdir), "jax-0.10.2")


def test_select_over_removes_least_recent_first() -> None:
    units = [_entries.Unit(k, bytes=10, last_used=t, has_entry=True) for k, t in (("a", 3), ("b", 1), ("c", 2))]
    assert [u.key for u in _entries.select_over(units, 15)] == ["b", "c"]


def test_remove_files_refuses_untagged_directory(tmp_path: Path) -> None:
    (tmp_path / f"jit_f-{'a' * 64}-cache").write_bytes(b"x")
    with pytest.raises(_remove.RemovalRefused):
        _remove.remove_files(str(tmp_path), [str(tmp_path / f"jit_f-{'a' * 64}-cache")])
    assert (tmp_path / f"jit_f-{'a' * 64}-cache").exists()


# -- the start-up hook, in process, with a stand-in module ----------------------------------------
#
# Two finders share one name and one behaviour: the class that the .pth line defines (which hands
# over to the package on the target's import) and the package's own, which install() puts in place
# (Python >= 3.15 runs install() from gkx_autocache.start). Each test below runs against both.

ROOT = Path(__file__).resolve().parent.parent


def _finders() -> list[object]:
    return [f for f in sys.meta_path if getattr(f, "__name__", None) == gkx_autocache.FINDER]


def _pth_line(target: str) -> str:
    """The .pth line as installed, aimed at the stand-in instead of jax."""
    line = (ROOT / "gkx_autocache.pth").read_text()
    assert line.count('"jax"') == 1 and line.count("\n") == 1 and line.startswith("import ")
    return line.replace('"jax"', f'"{target}"')


@pytest.fixture
def target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A module named like a stand-in for jax, on sys.path; configuration calls are recorded."""
    name = f"standin_{os.getpid()}_{id(tmp_path)}"
    (tmp_path / f"{name}.py").write_text("import os\nif os.environ.get('STANDIN_FAIL'):\n    raise OSError(5, 'disk')\nVALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(gkx_autocache, "TARGET", name)
    calls: list[types.ModuleType] = []
    monkeypatch.setattr(gkx_autocache, "_configure_now", lambda module: calls.append(module))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delenv("GKX_JAX_CACHE", raising=False)
    yield name, calls
    sys.modules.pop(name, None)


@pytest.fixture(params=["pth line", "install()"])
def stand_in(request, target):  # type: ignore[no-untyped-def]
    """(name, calls, install): install() puts the hook in place as the .pth line does (exec'd inside a
    function by site.addpackage, so with globals that are not its own) or as install() does."""
    name, calls = target
    if request.param == "install()":
        return name, calls, gkx_autocache.install
    line = _pth_line(name)
    return name, calls, lambda: exec(line, {})


def test_finder_configures_after_the_module_body_and_leaves(stand_in) -> None:  # type: ignore[no-untyped-def]
    """The callback sees the finished module; the finder leaves sys.meta_path; installing is idempotent."""
    name, calls, install = stand_in
    install()
    install()
    assert len(_finders()) == 1 and sys.meta_path[0] is _finders()[0]
    module = __import__(name)
    assert [m.VALUE for m in calls] == [42]
    assert module.__loader__.__class__.__name__ != "_ConfiguringLoader"
    assert module.__spec__ is not None and module.__spec__.loader is module.__loader__
    assert _finders() == []


def test_a_spec_found_before_the_import_gets_its_own_loader_back(stand_in) -> None:  # type: ignore[no-untyped-def]
    """A spec that `importlib.util.find_spec` handed out before the import (an "is it installed?"
    check) has the target's own loader once the import has run and configured, like the module's."""
    import importlib.util

    name, calls, install = stand_in
    install()
    early = importlib.util.find_spec(name)
    assert early is not None
    module = __import__(name)
    assert [m.VALUE for m in calls] == [42]
    assert type(early.loader) is type(module.__loader__) and type(module.__loader__).__name__ == "SourceFileLoader"


def test_failed_import_is_unchanged_and_retry_configures(stand_in, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The user's exception comes through as it was, without our frames; the finder stays."""
    name, calls, install = stand_in
    install()
    monkeypatch.setenv("STANDIN_FAIL", "1")
    with pytest.raises(OSError) as info:
        __import__(name)
    assert info.value.errno == 5
    assert not any("gkx_autocache" in (tb.tb_frame.f_code.co_filename) for tb in _walk(info.value.__traceback__))
    assert calls == [] and len(_finders()) == 1
    monkeypatch.delenv("STANDIN_FAIL")
    __import__(name)
    assert len(calls) == 1 and _finders() == []


def _walk(tb: types.TracebackType | None) -> Iterator[types.TracebackType]:
    while tb is not None:
        yield tb
        tb = tb.tb_next


@pytest.mark.parametrize("value", ["off", " No ", "DISABLED", "0"])
def test_opt_out_configures_nothing(stand_in, monkeypatch: pytest.MonkeyPatch, value: str) -> None:  # type: ignore[no-untyped-def]
    """GKX_JAX_CACHE off, in any spelling: importing the target configures nothing, keeps its own
    loader and leaves no finder behind (the .pth line's finder steps aside at that import)."""
    name, calls, install = stand_in
    monkeypatch.setenv("GKX_JAX_CACHE", value)
    install()
    module = __import__(name)
    assert calls == [] and _finders() == []
    assert module.__spec__ is not None and type(module.__spec__.loader).__name__ != "_ConfiguringLoader"


def test_install_returns_at_once_when_off(target, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """install() (what gkx_autocache.start runs) puts no finder in place when GKX_JAX_CACHE says off."""
    monkeypatch.setenv("GKX_JAX_CACHE", "off")
    gkx_autocache.install()
    assert _finders() == []


def test_opt_out_is_read_when_the_target_is_imported(stand_in, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """GKX_JAX_CACHE set off after the hook is in place, before the import: still honoured."""
    name, calls, install = stand_in
    install()
    assert len(_finders()) == 1
    monkeypatch.setenv("GKX_JAX_CACHE", "0")
    __import__(name)
    assert calls == [] and _finders() == []


def test_hook_is_not_live_when_opted_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """status's "hook live" says whether `import jax` would be configured: a finder in place is not
    enough when GKX_JAX_CACHE says off, or when the target is imported already (a finder put in
    place after it never fires)."""
    from gkx_autocache import _layout
    from gkx_autocache._context import hook_live

    name = f"standin_{os.getpid()}_never_imported"
    monkeypatch.setattr(_layout, "TARGET", name)
    monkeypatch.setattr(sys, "meta_path", [gkx_autocache.GkxAutocacheFinder, *sys.meta_path])
    monkeypatch.delenv("GKX_JAX_CACHE", raising=False)
    assert hook_live()
    monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    assert not hook_live()
    monkeypatch.delitem(sys.modules, name)
    monkeypatch.setenv("GKX_JAX_CACHE", " Off ")
    assert not hook_live()
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if f is not gkx_autocache.GkxAutocacheFinder])
    monkeypatch.delenv("GKX_JAX_CACHE")
    assert not hook_live()


def _nothing(*args: object) -> None:
    return None


def _hostile(kind: str) -> object:
    """A finder that finds nothing and whose __name__ raises (through its metaclass), or one whose
    every attribute but find_spec raises (so __class__ too)."""
    if kind == "name raises":
        class RaisingName(type):
            def __getattribute__(cls, attr: str) -> Any:
                if attr == "__name__":
                    raise RuntimeError("hostile")
                return super().__getattribute__(attr)

        return RaisingName("Hostile", (), {"find_spec": staticmethod(_nothing)})

    class Hostile:
        def __getattribute__(self, attr: str) -> Any:
            if attr == "find_spec":
                return _nothing
            raise RuntimeError("hostile")

    return Hostile()


@pytest.mark.parametrize("kind", ["name raises", "__class__ raises"])
def test_a_hostile_finder_on_meta_path_does_not_stop_the_hook(stand_in, kind: str) -> None:  # type: ignore[no-untyped-def]
    """Another finder whose __name__ or __class__ raises, first on sys.meta_path: is_finder says
    no, and the target is still configured."""
    hostile = _hostile(kind)
    name, calls, install = stand_in
    install()
    sys.meta_path.insert(0, cast(Any, hostile))
    assert not gkx_autocache.is_finder(hostile)
    module = __import__(name)
    assert [m.VALUE for m in calls] == [42]
    assert module.VALUE == 42


@pytest.mark.parametrize("line_first", [False, True])
def test_target_imported_first_is_configured_at_install(target, line_first: bool) -> None:  # type: ignore[no-untyped-def]
    """The target already imported when install() runs: configured at once, and no finder left, also
    when the .pth line ran after the import (it only puts its finder in place: checking sys.modules
    there would cost every start)."""
    name, calls = target
    module = __import__(name)
    if line_first:
        exec(_pth_line(name), {})
        assert calls == [] and len(_finders()) == 1
    gkx_autocache.install()
    assert calls == [module] and _finders() == []


def test_threads_import_once(stand_in) -> None:  # type: ignore[no-untyped-def]
    """Threads importing the module at once: one configuration call, no deadlock."""
    name, calls, install = stand_in
    install()
    barrier = threading.Barrier(6)

    def work() -> None:
        barrier.wait()
        __import__(name)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(calls) == 1


def test_pth_finder_answers_other_names_without_the_package(target, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The line's finder is a function named GkxAutocacheFinder that is its own find_spec, not the
    package's class; for any other name it returns None without importing the package; for the target
    it hands over to the package, and where the package cannot be imported (blocked here) it returns
    None too, so that the target imports as if the finder were not there."""
    name, calls = target
    exec(_pth_line(name), {})
    (finder,) = _finders()
    finder = cast(Any, finder)
    assert not isinstance(finder, type) and finder.find_spec is finder and gkx_autocache.is_finder(finder)
    monkeypatch.setitem(sys.modules, "gkx_autocache", None)
    assert finder.find_spec("json", None, None) is None
    assert finder.find_spec(name + ".sub", None, None) is None
    assert finder.find_spec(name, None, None) is None and calls == []
    monkeypatch.setitem(sys.modules, "gkx_autocache", gkx_autocache)
    assert finder.find_spec(name, None, None) is not None and calls == []


@pytest.mark.parametrize("xdg", [None, "/srv/xdg", "  ", "relative/xdg", "./xdg", "~/xdg"])
def test_user_dirs_match_platformdirs(monkeypatch: pytest.MonkeyPatch, xdg: str | None) -> None:
    """The XDG rule computed inline (platformdirs costs ~7 ms of import jax) gives platformdirs' answer."""
    import platformdirs

    for variable in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
        if xdg is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, xdg)
    assert _userdirs.user_dir("cache", "gkx") == platformdirs.user_cache_dir("gkx")
    assert _userdirs.user_dir("config", "gkx-autocache") == platformdirs.user_config_dir("gkx-autocache")
    assert _policy.user_path() == os.path.join(platformdirs.user_config_dir("gkx-autocache"), "config.toml")


@pytest.mark.parametrize("variable", ["XDG_CACHE_HOME", "XDG_CONFIG_HOME"])
@pytest.mark.parametrize("home", ["", ".", "home"])
def test_user_dirs_never_depend_on_the_current_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         variable: str, home: str) -> None:
    """A relative XDG value (and a relative HOME) is ignored, as the XDG spec says: the user
    directories are absolute and the same from every current directory."""
    monkeypatch.setenv(variable, "checkout/xdg")
    monkeypatch.setenv("HOME", home)
    monkeypatch.chdir(tmp_path)
    import pwd

    own_home = pwd.getpwuid(os.getuid()).pw_dir
    assert _cache.user_root() == os.path.join(own_home, ".cache", "gkx", "jax")
    assert _policy.user_path() == os.path.join(own_home, ".config", "gkx-autocache", "config.toml")


@pytest.mark.parametrize("home", [None, "", "relative"])
def test_a_user_the_password_database_does_not_know_gets_a_folder_in_the_temporary_directory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, home: str | None) -> None:
    """No absolute HOME and no passwd entry (`docker run --user 12345`): no user cache or config
    directory (never a relative `~`), so no user config file, and the default directory is the
    user's own folder in the temporary directory, made 0700."""
    import pwd
    import tempfile

    def unknown(uid: int) -> Any:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", unknown)
    for variable in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(variable, raising=False)
    if home is None:
        monkeypatch.delenv("HOME", raising=False)
    else:
        monkeypatch.setenv("HOME", home)
    monkeypatch.chdir(tmp_path)
    assert _userdirs.user_dir("cache", "gkx") is None and _userdirs.user_dir("config", "gkx-autocache") is None
    settings = _settings.resolve({}, str(tmp_path / "env"), cwd=str(tmp_path))
    assert settings.problems == [] and list(settings.files) == [str(tmp_path / "env" / "gkx-autocache.toml")]
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    scratch.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # what gettempdir() found for this TMPDIR
    location = _cache.locate(settings, "9.9.9", prefix=sys.base_prefix)
    root = scratch / f"gkx-{os.getuid()}" / "jax"
    assert location.version_dir == str(root / "jax-9.9.9") and "temporary" in location.rule
    assert (root.parent.stat().st_mode & 0o777) == 0o700 and not (tmp_path / "~").exists()
    monkeypatch.setenv("TMPDIR", "checkout")  # relative: tempfile takes it against the current directory
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "checkout"))
    assert _cache.temp_root() is None


@pytest.mark.parametrize("kind, default", [("cache", "Library/Caches"), ("config", "Library/Application Support")])
def test_a_platformdirs_that_takes_a_relative_xdg_value_is_not_followed(monkeypatch: pytest.MonkeyPatch,
                                                                          kind: str, default: str) -> None:
    """Off Linux the package asks platformdirs, whose older versions take a relative XDG value as
    it is (macOS reads XDG too): a relative answer is replaced by the platform's own place."""
    stand_in = types.ModuleType("platformdirs")
    stand_in.user_cache_dir = lambda app: os.path.join("xdg", app)  # type: ignore[attr-defined]
    stand_in.user_config_dir = lambda app: os.path.join("xdg", app)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "platformdirs", stand_in)
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setenv("HOME", "/Users/someone")
    assert _userdirs.user_dir(kind, "gkx") == os.path.join("/Users/someone", default, "gkx")
    stand_in.user_cache_dir = stand_in.user_config_dir = lambda app: f"/abs/{app}"  # type: ignore[attr-defined]
    assert _userdirs.user_dir(kind, "gkx") == "/abs/gkx"


def test_a_parent_swapped_in_while_creating_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Parents are checked again once created: a folder an attacker swaps in (owned by them, 0777)
    between the check and the creation of the cache below it is refused."""
    from gkx_autocache import _files

    sticky = tmp_path / "scratch"
    sticky.mkdir()
    sticky.chmod(0o1777)
    real = _files.make_dir

    def racing(path: str, team: bool, tag: str | None = None, mounted: bool = False) -> bool:
        created = real(path, team, tag, mounted)
        if path == str(sticky / "x"):
            os.chown(path, 4242, 4242)
            os.chmod(path, 0o777)
        return created

    monkeypatch.setattr(_files, "make_dir", racing)
    with pytest.raises(_cache.DirectoryRefused, match=f"its parent {sticky / 'x'}"):
        _cache.prepare(str(sticky / "x" / "cache"), "1.0")


def test_the_root_is_not_called_its_own_parent(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    root.chmod(0o770)
    with pytest.raises(_cache.DirectoryRefused) as info:
        _cache.prepare(str(root), "1.0")
    assert str(info.value).startswith("its group can write to it"), info.value


def test_files_that_block_or_are_not_files_are_never_read(tmp_path: Path) -> None:
    """A FIFO, a directory or a device where a file should be: refused at once, never read."""
    from gkx_autocache import _files

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "dir").mkdir()
    for path in (fifo, tmp_path / "dir", Path("/dev/zero")):
        assert _files.read(str(path)) is None
        verdict = _policy.read(str(path))
        assert verdict.status == "ignored" and "regular" in (verdict.problem or ""), verdict


class _Calls:
    """A recorder that keeps what the store told it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def __getattr__(self, name: str) -> Any:
        return lambda key, *rest, **named: self.calls.append((name, key))


@pytest.mark.parametrize("check_payload", [True, False])
def test_a_payload_is_decompressed_before_serving_only_where_jax_loading_is_not_guarded(
        tmp_path: Path, check_payload: bool) -> None:
    """Bytes that do not decompress: refused by the store itself where JAX's loading is not
    wrapped; served where it is (the wrapper then turns JAX's failure into a miss), so that a hit
    is not decompressed twice."""
    import zlib

    from gkx_autocache._store import Store

    key = "jit_f-" + "a" * 64
    (tmp_path / f"{key}-cache").write_bytes(b"x\x9c" + b"not zlib" * 10)  # zlib's magic bytes, then garbage
    (tmp_path / f"jit_g-{'b' * 64}-cache").write_bytes(zlib.compress(b"an executable"))
    calls = _Calls()
    from gkx_autocache._chain import Chain, NoLevel
    from gkx_autocache._local.level import LocalLevel

    local = LocalLevel(str(tmp_path), compression="zlib", decompress=zlib.decompress, team=False, writable=True,
                       check_payload=lambda: check_payload, whole=False, signs=False)
    store = Store(str(tmp_path), Chain(local, NoLevel()), calls)
    assert (store.get(key) is None) == check_payload
    assert calls.calls[0] == (("rejected", key) if check_payload else ("hit", key))
    assert store.get(f"jit_g-{'b' * 64}") is not None


@pytest.mark.parametrize("size", [0, 1, 6000, 70_000, 3 << 20])
def test_reads_are_whole_or_exactly_the_limit(tmp_path: Path, size: int) -> None:
    """``_files.read`` sizes its reads by one ``fstat``: every size and limit still gets the whole
    file, or exactly its first ``limit`` bytes."""
    from gkx_autocache import _files

    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    assert _files.read(str(tmp_path / "f")) == data
    for limit in (0, 4, 65536, 65537, 100_000, 64 << 20):
        assert _files.read(str(tmp_path / "f"), limit) == data[:limit]
    with open(tmp_path / "sparse", "wb") as f:  # over 1 GiB: the buffered path (sparse: no disk used)
        f.truncate((1 << 30) + 10)
    assert _files.read(str(tmp_path / "sparse"), 4) == b"\0" * 4
    assert _files.read(str(tmp_path / "sparse"), 100_000) == b"\0" * 100_000


@pytest.mark.parametrize(("value", "expected"), [("1796000000.5-42", 1796000000.5), ("nan-1", None), ("inf-1", None),
                                                 ("-1e400-1", None), ("soon-1", None), ("", None),
                                                 ("1796000000.5", None), ("1796000000.5-x", None)])
def test_a_run_is_a_time_and_a_pid_or_nothing(monkeypatch: pytest.MonkeyPatch, value: str, expected: float | None) -> None:
    """A run (the pytest plugin's session, or a process and those it starts) reaches every process
    through the environment: anything but a plausible time and a pid is ignored (a new run begins)."""
    from gkx_autocache._record import recorder as _stats

    monkeypatch.setenv(_stats.RUN, value)
    found = _stats.run_of()
    assert (found[1] if found else None) == expected


@pytest.mark.parametrize(("value", "ci"), [("true", True), ("1", True), ("yes", True), ("", False), ("  ", False),
                                           ("false", False), (" FALSE ", False), ("0", False), ("off", False)])
def test_ci_is_any_value_but_a_false_spelling(monkeypatch: pytest.MonkeyPatch, value: str, ci: bool) -> None:
    from gkx_autocache import _settings

    monkeypatch.setenv("CI", value)
    assert _settings.is_ci() is ci


def test_an_option_this_jax_lacks_is_nobody_s_setting() -> None:
    """JAX 0.4.30-0.4.35 have no ``jax_persistent_cache_enable_xla_caches``: reading what the user
    set through jax.config skips it (it raised AttributeError, and the cache was left off with
    'please report this' on every import)."""

    class Config:  # jax.config of JAX 0.4.30, as far as these options go
        jax_compilation_cache_dir = None
        jax_persistent_cache_min_compile_time_secs = 1.0
        jax_persistent_cache_min_entry_size_bytes = 0

    assert _settings.jax_explicit({}, Config()) == {}
    Config.jax_persistent_cache_min_compile_time_secs = 2.0
    assert _settings.jax_explicit({}, Config()) == {
        "min_compile_time_secs": (2.0, "JAX (jax.config jax_persistent_cache_min_compile_time_secs)")}


@pytest.mark.parametrize(("version", "supported"), [("0.4.29", False), ("0.4.26rc1", False), ("0.3.25", False),
                                                    ("0.4.30", True), ("0.4.30.dev20240601", True), ("0.10.2", True),
                                                    ("1.0", True), ("unknown", True)])
def test_a_jax_older_than_0_4_30_is_left_as_it_is(version: str, supported: bool,
                                                   recwarn: pytest.WarningsRecorder) -> None:
    """SPEC §16: an older JAX gets one line naming its version, and its config is never touched."""
    from gkx_autocache import _configure, _diagnostics
    from gkx_autocache._jax import versions as jax_versions

    class Config:
        jax_enable_compilation_cache = False  # a supported line stops here without an update: nothing to set up

        def update(self, name: str, value: Any) -> None:
            raise AssertionError(f"jax.config.update({name!r}) on JAX {version}")

    _diagnostics._said.discard("jax:unsupported")
    _configure._configure(types.SimpleNamespace(__version__=version, config=Config()), {})
    said = [str(w.message) for w in recwarn if "not supported" in str(w.message)]
    assert (jax_versions.unsupported(version) is None) is supported
    assert said == ([] if supported else [f"gkx-autocache: JAX {version} is not supported (gkx-autocache supports "
                                          f"JAX 0.4.30 and later): JAX is left as it is "
                                          f"({_diagnostics.SILENCE})"]), said


@pytest.mark.parametrize(("verdict", "line"), [
    ({"store": "gkx-autocache", "reason": None, "explain": None, "isa": None, "callbacks": None, "rebuild": None},
     "  features store, cap, explain, ISA key, levels, host callbacks, rebuild (as the last process here found this JAX)"),
    ({"store": "gkx-autocache", "reason": None, "explain": "jax._src.compiler._cache_write has changed",
      "isa": "CPU entries are not keyed by ISA: jax._src.cache_key cannot be imported (x)", "callbacks": None,
      "rebuild": None},
     "  features store, cap, levels, host callbacks, rebuild; no explain (jax._src.compiler._cache_write has changed); "
     "no ISA key (jax._src.cache_key cannot be imported (x)) (as the last process here found this JAX)"),
    ({"store": "gkx-autocache", "reason": None, "explain": None, "isa": None,
      "callbacks": "jaxlib 0.6.2 cannot give a loaded executable its host callbacks: cached from JAX 0.8.1",
      "rebuild": "jax._src.compiler.compile_or_get_cached has changed"},
     "  features store, cap, explain, ISA key, levels; no host callbacks (jaxlib 0.6.2 cannot give a loaded "
     "executable its host callbacks: cached from JAX 0.8.1); no rebuild (jax._src.compiler.compile_or_get_cached has "
     "changed) (as the last process here found this JAX)"),
    ({"store": "gkx-autocache", "reason": None, "explain": None, "isa": None},  # written by an older package
     "  features store, cap, explain, ISA key, levels; no host callbacks, rebuild (not known: recorded by an older "
     "gkx-autocache) (as the last process here found this JAX)"),
    ({"store": "jax", "reason": "jax._src.compilation_cache.get_file_cache(path) is missing or has changed",
      "explain": None, "isa": None},
     "  features ISA key; no store (jax._src.compilation_cache.get_file_cache(path) is missing or has changed); "
     "no cap, explain, levels, host callbacks, rebuild (they need the store) (as the last process here found this JAX)"),
    ({"store": None, "reason": "no process has used it yet"}, None),
])
def test_status_names_what_this_jax_line_gives(verdict: dict[str, Any], line: str | None) -> None:
    """SPEC §16: `status` names each feature a JAX line gives, and why one is missing, by name, in one
    line (from what the last process that configured JAX here found)."""
    from gkx_autocache import _status
    from gkx_autocache._cli import status

    assert status.features_line(_status.features(verdict)) == line


def test_a_settings_file_owned_by_another_says_a_fix_its_reader_can_do(tmp_path: Path) -> None:
    """Only its owner or root can chown a file: the advice is one the reader can follow."""
    path = tmp_path / "config.toml"
    path.write_text("")
    os.chown(path, 4242, 4242)
    said = _trust.file_problem(os.stat(path))
    assert said is not None and "owned by uid 4242" in said and "copy it to a file you own" in said, said
    assert "chown" not in said, said


def test_a_pytest_sessions_merged_line_names_its_uploads() -> None:
    """xdist workers that wrote the shared level: the session's one line says what they uploaded,
    and where, as one process's line does."""
    from gkx_autocache._record import show

    worker = {**show.empty(), "hits": 1, "misses": 2, "dirs": ["/c/jax-1"],
              "levels": {"shared": {"uploads": 2, "hits": 0}, "local": {"hits": 1}},
              "shared": {"url": "s3://team/c", "signed": True}}
    line = show.summary_line(show.merge([worker, {**worker, "shared": None}]))
    assert "4 uploaded to s3://team/c (signed)" in line, line


def test_the_library_behind_host_callbacks_is_its_package_not_a_prefix() -> None:
    """`explain` names who put host callbacks in a function: jax_md's are jax_md's, not JAX's; an
    object whose attributes raise is passed over, never an exception into JAX's write."""
    from gkx_autocache._jax import callbacks as jax_callbacks

    def simulate(v: Any) -> Any:
        return v

    simulate.__module__ = "jax_md.simulate"

    def wrapped(*args: Any) -> Any:  # as JAX wraps a callback: a closure over the user's function
        return simulate(*args)

    wrapped.__module__ = "jax._src.callback"

    class Hostile:
        def __call__(self) -> None: ...

        def __getattribute__(self, name: str) -> Any:
            raise RuntimeError(name)

    assert jax_callbacks.callbacks_by([wrapped]) == "jax_md"
    assert jax_callbacks.callbacks_by([Hostile(), wrapped]) == "jax_md"
    assert jax_callbacks.callbacks_by([Hostile()]) == "jax"


def _scratch_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A /tmp of the test's own (root's and sticky), which the package takes as the temporary directory."""
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    scratch.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return scratch


def test_a_temporary_folder_another_user_made_first_leads_to_a_private_one(monkeypatch: pytest.MonkeyPatch,
                                                                           tmp_path: Path) -> None:
    """/tmp/gkx-<uid> is a name every local user knows: another who makes it first used to turn
    caching off for the uid (refused, rightly). Now a second folder of an unguessable name, made
    0700, serves, and the next run finds it again by its owner and mode, never a decoy of that
    prefix another user made or one others could enter (issue 57's L9)."""
    scratch = _scratch_tmp(monkeypatch, tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # no user cache either
    (tmp_path / "file").write_text("in the way")
    taken = scratch / f"gkx-{os.getuid()}"
    taken.mkdir(mode=0o700)
    os.chown(taken, 1002, 1002)
    for name, owner, mode in (("aaaa", 1002, 0o700), ("bbbb", os.getuid(), 0o755)):  # decoys, sorted first
        (scratch / f"gkx-{os.getuid()}-{name}").mkdir(mode=mode)
        os.chown(scratch / f"gkx-{os.getuid()}-{name}", owner, owner)
        (scratch / f"gkx-{os.getuid()}-{name}").chmod(mode)
    settings = _settings.resolve({}, str(tmp_path / "env"), cwd=str(tmp_path))
    first = _cache.locate(settings, "9.9.9", prefix=sys.base_prefix)
    assert first.version_dir is not None and first.version_dir.startswith(str(scratch / f"gkx-{os.getuid()}-"))
    assert "aaaa" not in first.version_dir and "bbbb" not in first.version_dir, first.version_dir
    assert "uid 1002's" in first.rule, first.rule
    private = Path(first.version_dir).parent.parent
    assert (private.stat().st_mode & 0o777, private.stat().st_uid) == (0o700, os.getuid())
    assert _cache.locate(settings, "9.9.9", prefix=sys.base_prefix).version_dir == first.version_dir
    assert _cache.locate(settings, "9.9.9", prefix=sys.base_prefix, create=False).version_dir == first.version_dir


def test_a_broken_user_cache_setting_that_moves_the_cache_to_the_temporary_directory_is_said(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An XDG_CACHE_HOME that cannot be used (a file, a typo): the cache moves to the temporary
    directory, cleared at reboot, which the user may not know: one line says so and how to fix it
    (issue 57); a user with no home at all is cached there silently, as before."""
    _scratch_tmp(monkeypatch, tmp_path)
    (tmp_path / "file").write_text("in the way")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    settings = _settings.resolve({}, str(tmp_path / "env"), cwd=str(tmp_path))
    location = _cache.locate(settings, "9.9.9", prefix=sys.base_prefix)
    assert location.version_dir is not None and "temporary" in location.rule
    (said,) = [message for _cause, message in location.problems]
    assert str(tmp_path / "file" / "gkx" / "jax") in said and "cleared at reboot" in said and "XDG_CACHE_HOME" in said


def test_a_link_of_the_private_prefix_to_a_folder_of_yours_is_never_taken(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    """A decoy of the private temporary folder's prefix (issue 57's L9) that is a link another user
    made to a 0700 folder of yours, sorted first: the owner and mode found are the folder's, but a
    link is not a folder of the package's; a private one of its own is made, and found again."""
    scratch = _scratch_tmp(monkeypatch, tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # no user cache either
    (tmp_path / "file").write_text("in the way")
    taken = scratch / f"gkx-{os.getuid()}"
    taken.mkdir(mode=0o700)
    os.chown(taken, 1002, 1002)
    yours = tmp_path / "yours"
    yours.mkdir(mode=0o700)
    decoy = scratch / f"gkx-{os.getuid()}-0000"
    decoy.symlink_to(yours)
    os.lchown(decoy, 1002, 1002)
    settings = _settings.resolve({}, str(tmp_path / "env"), cwd=str(tmp_path))
    first = _cache.locate(settings, "9.9.9", prefix=sys.base_prefix)
    assert first.version_dir is not None and not first.version_dir.startswith(str(decoy)), first.version_dir
    assert not any(yours.iterdir())
    assert _cache.locate(settings, "9.9.9", prefix=sys.base_prefix).version_dir == first.version_dir


def test_an_entry_appears_with_its_compile_time_and_seal_already_beside_it(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup of another thread or process that finds an entry finds beside it who wrote it and
    whether a rebuild did (else a rebuilt entry read in that moment counted as the run's own hit:
    test_jax_lines failed so under load); an entry that cannot be written leaves no compile time."""
    import zlib

    from gkx_autocache._local.level import LocalLevel

    local = local_at(tmp_path / "l", signs=True)
    key = "jit_f-" + "a" * 64
    seen: list[tuple[float, bool, bool]] = []
    write = LocalLevel.write

    def watched(self: LocalLevel, k: str, data: bytes, beside: Any = None) -> None:
        def then() -> None:  # the moment before the entry appears
            beside()
            secs, _, _, rebuilt = self.compile_secs(k, data)
            seen.append((secs, rebuilt, os.path.exists(self._seal(k))))
        write(self, k, data, then)

    monkeypatch.setattr(LocalLevel, "write", watched)
    local.put(key, zlib.compress(b"\0\0\0\1an executable"), 2.5, "run-1", b"seal", rebuilt=True)
    assert seen == [(2.5, True, True)], seen
    assert local.compile_secs(key, b"")[3] is True

    def full(self: LocalLevel, k: str, data: bytes, *rest: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(LocalLevel, "write", full)
    other = "jit_g-" + "b" * 64
    with pytest.raises(OSError):
        local.put(other, zlib.compress(b"\0\0\0\1x"), 2.5, "run-1", None)
    assert sorted(p.name for p in (tmp_path / "l").iterdir() if p.name.startswith("jit_g")) == []


def test_a_prune_in_the_moment_before_an_entry_lands_leaves_its_compile_time_and_seal(tmp_path: Path,
                                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The seal and the compile time are written before the entry: a prune (the cap at another
    process's exit, ``prune --older-than``) or ``verify`` that lists the directory in that moment
    finds them without their entry. They are a writer's, mid-put, as its temporary file is: never
    the orphans removed first, which left the entry without who wrote it and whether a rebuild did."""
    import zlib

    from gkx_autocache import _files
    from gkx_autocache._local.level import LocalLevel

    path = tmp_path / "l"
    assert _files.make_dir(str(path), False, TAG)  # the package's: its entries are not read to be pruned
    local = local_at(path, signs=True)
    old = ["jit_f-" + c * 64 for c in "ce"]
    day_ago = time.time() - 86400
    for key in old:
        local.put(key, zlib.compress(b"\0\0\0\1old"), 1.0, "", b"seal")
        for p in path.glob(key + "*"):
            os.utime(p, (day_ago, day_ago))
    key = "jit_g-" + "d" * 64
    orphans: list[str] = []
    write = LocalLevel.write

    def pruned_first(self: LocalLevel, k: str, data: bytes, beside: Any = None) -> None:
        def then() -> None:
            beside()
            if k == key:
                _entries.execute(_entries.plan_prune(str(path), _entries.scan(str(path)).bytes - 1))  # one unit goes
                _entries.execute(_entries.plan_prune(str(path), 0, older_than=3600.0))
                orphans.extend(_entries.verify(str(path)).orphans)
        write(self, k, data, then)

    monkeypatch.setattr(LocalLevel, "write", pruned_first)
    local.put(key, zlib.compress(b"\0\0\0\1an executable"), 2.5, "", b"seal", rebuilt=True)
    assert orphans == [] and not any(local.has(k) for k in old), orphans
    secs, _, _, rebuilt = local.compile_secs(key, b"")
    kept = local.uploadable(key)
    assert (secs, rebuilt) == (2.5, True) and kept is not None and kept.seal == b"seal"


def test_a_rebuilt_compile_time_whose_entry_never_landed_is_no_entry_rebuilt_here(tmp_path: Path) -> None:
    """A rebuild killed between an entry's compile time and the entry (written in that order)
    leaves the compile time alone: explain does not count it among the entries rebuilt here (the
    key's miss would be told its module lowers differently under this JAX), but tells the records
    a rebuild compiles."""
    from gkx_autocache._explain import classify
    from gkx_autocache._formats import sidecar

    mine, theirs = tmp_path / "jax-0.5.0", tmp_path / "jax-0.4.1"
    mine.mkdir()
    theirs.mkdir()
    (theirs / f"jit_f-{'b' * 64}-gkx-record").write_bytes(b"{}")
    (mine / f"jit_f-{'a' * 64}-gkx-compile").write_bytes(sidecar(2.5, "", rebuilt=True))
    said = classify._rebuilt("jit_f", str(mine), str(theirs), "0.4.1", "0.5.0")
    assert "were rebuilt" not in said and "rebuild compiles them" in said, said


def test_a_write_that_fails_leaves_another_writers_entry_with_its_own_seal_and_compile_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes compile one key; the second's entry cannot be written (a disk full): its bytes
    are staged before anything goes beside the entry, so the first's entry keeps its own seal and
    compile time (removing them lost the compile time its waiters are bounded by). Where no entry
    is there, nothing is left."""
    import errno
    import zlib

    local = local_at(tmp_path / "l", signs=True)
    key, theirs, ours = "jit_f-" + "0" * 64, zlib.compress(b"their executable"), zlib.compress(b"our executable")
    local.put(key, theirs, 2.0, "run-a", b"their seal")

    def full(self: Any, key: str, data: bytes, *rest: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(type(local), "write", full)
    with pytest.raises(OSError):
        local.put(key, ours, 3.0, "run-b", b"our seal")
    kept = local.uploadable(key)
    assert kept is not None and kept.data == theirs and kept.seal == b"their seal", kept
    assert local.compile_secs(key, theirs)[0] == 2.0
    other = "jit_g-" + "1" * 64
    with pytest.raises(OSError):
        local.put(other, ours, 3.0, "run-b", b"our seal")
    assert sorted(p.name for p in (tmp_path / "l").iterdir() if p.name.startswith("jit_g")) == []


def test_a_full_disk_leaves_the_entry_there_with_its_own_seal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every write fails (a full disk): this put's seal and compile time are never written, and the
    entry already there keeps its own (its seal verifies against its bytes)."""
    import errno
    import zlib

    from gkx_autocache import _files
    from gkx_autocache._shared.seal import make_seal

    local = local_at(tmp_path / "l", signs=True)
    key, secret = "jit_f-" + "0" * 64, b"k" * 32
    theirs, ours = zlib.compress(b"their executable"), zlib.compress(b"our executable")
    their_seal = make_seal(key, theirs, 2.0, 1000.0, secret)
    local.put(key, theirs, 2.0, "run-a", their_seal)

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_files, "atomic", full)
    with pytest.raises(OSError):
        local.put(key, ours, 3.0, "run-b", make_seal(key, ours, 3.0, 1001.0, secret))
    monkeypatch.undo()
    kept = local.uploadable(key)
    assert kept is not None and kept.data == theirs and kept.seal == their_seal, kept
    assert local.compile_secs(key, theirs)[0] == 2.0


def test_a_writer_that_lands_while_a_put_fails_keeps_what_it_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process writes the key (seal, compile time, entry) while this put's replace fails:
    what it wrote stays, this put removes only what is still its own; and a rebuild's put that fails
    never marks the entry there as rebuilt."""
    import errno
    import zlib

    from gkx_autocache._local.level import LocalLevel

    local, other = local_at(tmp_path / "l", signs=True), local_at(tmp_path / "l", signs=True)
    key = "jit_f-" + "0" * 64
    theirs, ours = zlib.compress(b"their executable"), zlib.compress(b"our executable")
    real = LocalLevel.write

    def racing(self: Any, k: str, data: bytes, beside: Any = None) -> None:
        def then() -> None:
            beside()
            monkeypatch.setattr(LocalLevel, "write", real)  # (the other process's own write)
            other.put(k, theirs, 2.0, "run-a", b"their seal")
            raise OSError(errno.ENOSPC, "No space left on device")  # (the replace, as it were)
        real(self, k, data, then)

    monkeypatch.setattr(LocalLevel, "write", racing)
    with pytest.raises(OSError):
        local.put(key, ours, 3.0, "run-b", b"our seal")
    monkeypatch.undo()
    kept = local.uploadable(key)
    assert kept is not None and kept.data == theirs and kept.seal == b"their seal", kept

    def staged_full(self: Any, k: str, data: bytes, beside: Any = None) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(LocalLevel, "write", staged_full)
    with pytest.raises(OSError):
        local.put(key, ours, 3.0, "run-b", None, rebuilt=True)
    secs, _, _, rebuilt = local.compile_secs(key, theirs)
    assert (secs, rebuilt) == (2.0, False)
