"""The lookup chain in one process (issue 43's in-process ring): the store, its local level and a
shared level on a directory in ``tmp_path``, with prefetch and signing; a backend that fails for
the off-switch. No virtual environment and no JAX: the store is driven as JAX drives it (``get``,
then ``put`` after a miss), with zlib entries. What needs a real interpreter (JAX's seams, exit
hooks, a fresh machine's process) stays in the venv tests (test_levels.py, test_prefetch.py)."""

from __future__ import annotations

import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import local_at

from gkx_autocache._backends.directory import Directory
from gkx_autocache._chain import Chain, NoLevel
from gkx_autocache._diagnostics import AutocacheWarning
from gkx_autocache._shared.level import Level
from gkx_autocache._store import Store


class Told:
    """What the store tells its recorder (``_record.recorder.Recorder``), in order."""

    def __init__(self) -> None:
        self.said: list[tuple[Any, ...]] = []
        self.run = type("Run", (), {"id": "1796000000.000-1"})()
    def hit(self, key: str, nbytes: int, compile_secs: float, by: str = "", rebuilt: bool = False) -> None:
        self.said.append(("hit", key))

    def miss(self, key: str, shared_off: str | None = None) -> None:
        self.said.append(("miss", key, shared_off))

    def rejected(self, key: str, reason: str) -> None:
        self.said.append(("rejected", key, reason))

    def put(self, key: str, nbytes: int, compile_secs: float, landed: bool = False, rebuilt: bool = False,
            unrecorded: str | None = None) -> None:
        self.said.append(("landed" if landed else "put", key))

    def landed(self, nbytes: int) -> None:
        pass

    def uncached(self, key: str, reason: str, detail: str = "", *rest: Any, **more: Any) -> None:
        self.said.append(("uncached", key, reason))


def key(n: int) -> str:
    return f"jit_f{n}-{n:064x}"


def entry(n: int) -> bytes:
    return zlib.compress(b"an executable %d " % n * 50)


class Machine:
    """One process on one machine: its local level, its store, its shared level, its recorder."""

    def __init__(self, shared: Path, local: Path, secret: bytes | None = None, backend: Any = None) -> None:
        local.mkdir(parents=True, exist_ok=True)
        self.local = local
        self.told = Told()
        self.local_level = local_at(local, signs=secret is not None)
        self.level = Level(str(shared), backend or Directory(str(shared), "0.0.0", team=False), self.local_level,
                           timeout=30.0, writes=None, secret=secret)
        self.chain = Chain(self.local_level, self.level)
        self.store = Store(str(local), self.chain, self.told)

    def compile(self, n: int) -> bytes | None:
        """What JAX does for one ``jit``: look up, and write what it compiled after a miss."""
        found = self.store.get(key(n))
        if found is None:
            self.store.put(key(n), entry(n))
        return found

    def shared(self, kind: str) -> dict[str, float]:
        return self.level.snapshot() if kind == "shared" else self.chain.numbers()["local"]


@pytest.fixture
def team(tmp_path: Path) -> Path:
    root = tmp_path / "team"
    (root / "jax-0.0.0").mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    return root


def test_a_write_goes_up_and_a_fresh_machine_is_served_and_keeps_it(tmp_path: Path, team: Path) -> None:
    writer = Machine(team, tmp_path / "a")
    assert writer.compile(1) is None
    writer.level.finish()
    up = team / "jax-0.0.0"
    assert (up / f"{key(1)}-cache").read_bytes() == entry(1) and (up / f"{key(1)}-gkx-shared").exists()
    assert writer.shared("shared")["uploads"] == 1

    fresh = Machine(team, tmp_path / "b")
    assert fresh.compile(1) == entry(1)
    assert (tmp_path / "b" / f"{key(1)}-cache").read_bytes() == entry(1)  # the backfill
    assert (tmp_path / "b" / f"{key(1)}-gkx-compile").exists()  # with the writer's compile time
    assert fresh.told.said == [("put", key(1)), ("hit", key(1))]  # counted as a write, then served
    assert fresh.shared("shared")["hits"] == fresh.shared("shared")["backfills"] == 1
    assert fresh.compile(1) == entry(1) and fresh.shared("local")["hits"] == 1  # then local


def test_a_key_holder_refuses_what_a_keyless_writer_uploaded(tmp_path: Path, team: Path) -> None:
    writer = Machine(team, tmp_path / "a")
    writer.compile(1)
    writer.level.finish()
    uploaded = (team / "jax-0.0.0" / f"{key(1)}-gkx-shared").read_bytes()
    assert b'"hmac"' not in uploaded
    reader = Machine(team, tmp_path / "b", secret=b"the team's key")
    assert reader.compile(1) is None
    assert ("rejected", key(1), "not signed: a process without the signing key uploaded it") in reader.told.said
    assert (tmp_path / "b" / f"{key(1)}-cache").read_bytes() == entry(1)  # compiled again
    kept = (tmp_path / "b" / f"{key(1)}-gkx-shared").read_bytes()  # its own compile, signed by its key
    assert b'"hmac"' in kept and kept != uploaded


def test_a_signed_entry_keeps_its_seal_beside_the_local_copy(tmp_path: Path, team: Path) -> None:
    writer = Machine(team, tmp_path / "a", secret=b"k")
    writer.compile(1)
    writer.level.finish()
    reader = Machine(team, tmp_path / "b", secret=b"k")
    assert reader.compile(1) == entry(1)
    kept = (tmp_path / "b" / f"{key(1)}-gkx-shared").read_bytes()
    assert kept == (team / "jax-0.0.0" / f"{key(1)}-gkx-shared").read_bytes()  # what vouches for it, kept
    held = reader.local_level.uploadable(key(1))  # healing and packs upload that seal only
    assert held is not None and held.data == entry(1) and held.seal == kept
    assert reader.level.reader.seal_for(key(1), held.data, held.seal, held.compile_secs, held.written) == kept


class Refusing(Directory):
    """A shared directory whose every read fails, as a revoked credential does."""

    def listing(self, *progress: Any) -> Any:
        raise PermissionError(13, "Permission denied", self.where)


def test_a_failing_shared_level_turns_off_once_and_each_miss_says_so(tmp_path: Path, team: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from gkx_autocache import _diagnostics

    monkeypatch.setattr(_diagnostics, "_said", set())  # (a warning is said once a process: another test's may be out)
    machine = Machine(team, tmp_path / "a", backend=Refusing(str(team), "0.0.0", team=False))
    with pytest.warns(AutocacheWarning, match="is off for the rest of this process after PermissionError"):
        assert machine.compile(1) is None
    assert machine.compile(2) is None  # no second warning, no second request
    misses = [said for said in machine.told.said if said[0] == "miss"]
    assert [said[1] for said in misses] == [key(1), key(2)] and all("Permission denied" in str(said[2]) for said in misses)
    assert machine.shared("shared")["errors"] == 1
    assert (tmp_path / "a" / f"{key(2)}-cache").read_bytes() == entry(2)  # the local level goes on


def test_a_fresh_machine_fetches_ahead_what_the_writer_s_run_looked_up(tmp_path: Path, team: Path) -> None:
    writer = Machine(team, tmp_path / "a")
    for n in range(6):
        writer.compile(n)
    writer.level.finish()  # the run missed locally: it leaves its manifest
    assert any(path.name.endswith("-gkx-manifest") for path in (team / "jax-0.0.0").iterdir())

    fresh = Machine(team, tmp_path / "b")
    assert fresh.compile(0) == entry(0)  # the first miss: the lookup's own, and the prefetch begins
    deadline = time.monotonic() + 30
    while len(list((tmp_path / "b").glob("*-cache"))) < 6 and time.monotonic() < deadline:
        time.sleep(0.02)
    for n in range(1, 6):
        assert fresh.compile(n) == entry(n)
    shared = fresh.shared("shared")
    assert shared["prefetched"] == shared["prefetch_used"] == 5, shared
    assert [said for said in fresh.told.said if said[0] == "landed"] == [("landed", key(n)) for n in range(1, 6)]
    fresh.level.finish()
    assert fresh.shared("shared")["prefetch_wasted_bytes"] == 0


def test_another_environment_s_entry_is_left_alone(tmp_path: Path, team: Path) -> None:
    machine = Machine(team, tmp_path / "a")
    zstd = b"\x28\xb5\x2f\xfd" + b"a zstd frame"
    (tmp_path / "a" / f"{key(1)}-cache").write_bytes(zstd)
    assert machine.compile(1) is None
    assert ("rejected", key(1), "written by an environment that compresses with zstd: left alone") in machine.told.said
    assert (tmp_path / "a" / f"{key(1)}-cache").read_bytes() == zstd  # not overwritten, nor asked of the bucket
    assert machine.shared("shared")["misses"] == 0


def test_a_directory_that_becomes_anothers_mid_run_is_read_no_more(tmp_path: Path) -> None:
    """The store checked its directory when JAX set it up; it is then given to another user (an
    admin's chown), who may rename the entries in it, which are still yours: a swapped pair passes
    every check of an entry's own owner and mode. Each lookup checks the directory's rules again
    (one stat), and reads nothing of a directory that fails them (issue 57's attacks)."""
    import os

    local = tmp_path / "local"
    local.mkdir(mode=0o700)
    store = Store(str(local), Chain(local_at(local), NoLevel()), Told())
    assert store.get(key(1)) is None
    store.put(key(1), entry(1))
    assert store.get(key(1)) == entry(1)
    os.chown(local, 1002, 1002)
    assert store.get(key(1)) is None
    os.chown(local, os.getuid(), os.getgid())
    local.chmod(0o777)
    assert store.get(key(1)) is None
    local.chmod(0o700)
    assert store.get(key(1)) == entry(1)


class _Waits:
    """Leases whose wait ends with another process's entry written."""

    def __init__(self, local: Any) -> None:
        self.local = local

    def settle(self, path: str, team: bool, k: str, ready: Any, expected: Any = None) -> str:
        from gkx_autocache._local import lease as _lease

        self.local.put(k, entry(1), 2.0, "run-a", None)
        return _lease.READY if ready() else _lease.BUSY

    def release(self, path: str, k: str) -> None:
        pass


def test_an_entry_waited_for_that_jax_cannot_load_is_a_local_miss(tmp_path: Path) -> None:
    """A lookup served the entry another process wrote while it waited is the local level's hit; one
    JAX then cannot load is a miss there too, as it is to the run (the levels' numbers agree with it)."""
    shared = tmp_path / "team"
    (shared / "jax-0.0.0").mkdir(parents=True, mode=0o700)
    m = Machine(shared, tmp_path / "a")
    m.store._leases = _Waits(local_at(tmp_path / "a"))  # type: ignore[assignment]
    assert m.store.get(key(1)) == entry(1)
    assert (m.chain.numbers()["local"]["hits"], m.chain.numbers()["local"]["misses"]) == (1, 0)
    m.store.reject(key(1), ValueError("jaxlib rebuilt under the same version"))
    m.store.put(key(1), entry(1))
    local = m.chain.numbers()["local"]
    assert (local["hits"], local["misses"]) == (0, 1), (local, m.told.said)


class _RebuiltMeanwhile:
    """A rebuild ahead in this process that compiled the key a lookup missed (or tried: ``writes``)."""

    def __init__(self, local: Any, writes: bool) -> None:
        self.local, self.writes = local, writes

    def missed(self, k: str) -> bool:
        if self.writes:
            self.local.put(k, entry(1), 2.0, "", None, rebuilt=True)
        return True


@pytest.mark.parametrize("writes", [True, False], ids=["rebuilt", "not rebuilt"])
def test_a_lookup_looked_at_again_after_a_rebuild_is_one_lookup_of_the_local_level(tmp_path: Path, writes: bool) -> None:
    """A miss whose key a rebuild here compiled meanwhile is looked up again (``Store.get``): one
    request of JAX's, one hit or one miss of the local level, never a miss and then a hit; the
    shared level asked once."""
    shared = tmp_path / "team"
    (shared / "jax-0.0.0").mkdir(parents=True, mode=0o700)
    m = Machine(shared, tmp_path / "a")
    m.store._rebuilds = _RebuiltMeanwhile(local_at(tmp_path / "a"), writes)
    assert (m.store.get(key(1)) == entry(1)) is writes
    local = m.chain.numbers()["local"]
    assert (local["hits"], local["misses"]) == ((1, 0) if writes else (0, 1)), local
    assert m.chain.numbers()["shared"]["misses"] == 1  # asked once, in the first lookup
