"""The port a shared level's storage answers (``_backends/port.py``): every backend the table names
has its methods, and the shared level (lookups, uploads, healing, packs and prefetch, the commands'
maintenance) runs in this process over the memory backend (``_backends/memory.py``), each kind of
failure typed on the port doing what it says."""

from __future__ import annotations

import importlib
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import local_at

from gkx_autocache._backends import schemes
from gkx_autocache._backends.memory import Memory
from gkx_autocache._backends.port import Backend, TimedOut
from gkx_autocache._local.level import LocalLevel
from gkx_autocache._shared.level import Level

KEYS = [f"jit_f{i}-{i:064x}" for i in range(6)]


def entry(i: int) -> bytes:
    """An executable as JAX writes one: compressed."""
    return zlib.compress(bytes([i]) * 3000 + b"executable")


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's warnings said afresh (the package says each once a process)."""
    from gkx_autocache import _diagnostics

    monkeypatch.setattr(_diagnostics, "_said", set())


def level_over(backend: Memory, local: Path, **more: Any) -> Level:
    """A shared level over ``backend``, in front of a local level in ``local``."""
    return Level(backend.where, backend, local=local_at(local), timeout=5.0, writes=None, secret=None, **more)


def test_every_backend_of_the_table_answers_the_port() -> None:
    """Each class the table names (and the two an ``s3://`` level chooses between) has every method
    and capability the Protocol declares; the memory backend type-checks against it (mypy)."""
    typed: Backend = Memory()  # (mypy: the memory backend is a Backend)
    declared = {name for name in vars(Backend) if not name.startswith("_")} | set(Backend.__annotations__)
    classes = {getattr(importlib.import_module(row.module), row.cls) for row in [*schemes.SCHEMES.values(), schemes.PATH]}
    from gkx_autocache._backends import s3

    classes = (classes - {s3.Deferred}) | {s3.S3}
    missing = {cls.__name__: sorted(name for name in declared if not hasattr(cls, name) and name not in ("where",))
               for cls in classes}
    assert not any(missing.values()) and all(hasattr(typed, name) for name in declared), missing
    assert {"describe", "caution", "names", "remove"} <= declared


def test_an_upload_reaches_another_machine_through_the_memory_backend(tmp_path: Path) -> None:
    """A writer's entries go up with their seals; another machine's lookups find them (hits, bytes
    as written), a key never written is a miss answered by the listing, without a read."""
    objects: dict[str, bytes] = {}
    writer = level_over(Memory(objects=objects), tmp_path / "a")
    for i, key in enumerate(KEYS):
        writer.put(key, entry(i), 0.5, written=time.time())
    writer.finish()
    assert writer.snapshot()["uploads"] == len(KEYS) and all(f"{key}-gkx-shared" in objects for key in KEYS)
    backend = Memory(objects=objects)
    reader = level_over(backend, tmp_path / "b")
    found = [reader.read(key).found for key in KEYS]
    assert [f.data if f is not None else None for f in found] == [entry(i) for i in range(len(KEYS))]
    assert reader.read("jit_g-" + "f" * 64).found is None
    counts = reader.snapshot()
    assert counts["hits"] == len(KEYS) and counts["misses"] == 1 and counts["errors"] == 0, counts
    assert [call for call in backend.calls if call[1].startswith("jit_g")] == []  # the listing answered it


def test_an_upload_refused_for_its_size_skips_that_entry_not_the_level(tmp_path: Path) -> None:
    """The backend's typed refusal (``port.TooLarge``), whatever its client: that entry is skipped
    with one warning giving the backend's fix, one as large is not sent again, and the smaller
    ones go up (the level stays on)."""
    backend = Memory(limit=2000)
    level = level_over(backend, tmp_path / "a")
    large, small = zlib.compress(bytes(range(256)) * 40, 0), entry(1)
    assert len(large) > 2000 > len(small)
    with pytest.warns(Warning, match="as too large") as said:
        level.put(KEYS[0], large, 0.5, written=time.time())
        level.put(KEYS[1], large, 0.5, written=time.time())
        level.put(KEYS[2], small, 0.5, written=time.time())
        level.finish()
    counts = level.snapshot()
    assert counts["uploads"] == 1 and counts["skipped"] == 2 and counts["errors"] == 0, counts
    assert level.channel.off is None and f"{KEYS[2]}-cache" in backend.objects
    assert [name for method, name in backend.calls if method == "put" and name == f"{KEYS[1]}-cache"] == []
    assert "raise the server's limit" in str(said[0].message)


def test_a_timeout_of_the_backend_s_own_turns_the_level_off_as_a_timeout(tmp_path: Path) -> None:
    """A client that times out by itself raises the port's ``TimedOut``: the lookup misses, and the
    level is off, counted as a timeout (not an error), with one warning that says to raise the
    timeout."""
    backend = Memory(objects={f"{KEYS[0]}-cache": entry(0)})
    level = level_over(backend, tmp_path / "a")
    assert level.read(KEYS[1]).found is None  # (the listing taken: the read of KEYS[0] is what times out)
    backend.failing = TimedOut("the client's own read timed out")
    with pytest.warns(Warning, match="raise shared_timeout"):
        assert level.read(KEYS[0]).found is None
    counts = level.snapshot()
    assert counts["timeouts"] == 1 and counts["errors"] == 0 and level.channel.off is not None, counts


def local_of(level: Level) -> LocalLevel:
    """The local level a shared level stands in front of (it sees it through its port)."""
    local = level.local
    assert isinstance(local, LocalLevel)
    return local


def landed(local: LocalLevel) -> dict[str, bytes]:
    """What a prefetch landed in the local level and no lookup used yet: each entry's bytes there."""
    return {key: local.read(key)[0] or b"" for key, _ in local.landings.items()}


def test_a_fresh_machine_lands_a_writer_s_pack_before_its_lookups(tmp_path: Path) -> None:
    """A writer's run leaves its manifest and its pack; a fresh machine's first miss starts the
    prefetch, which streams the pack (one request, no entry read on its own) and lands every entry
    the manifest names, checked, before the lookups come."""
    objects: dict[str, bytes] = {}
    writer = level_over(Memory(objects=objects), tmp_path / "a")
    for i, key in enumerate(KEYS):
        writer.local_miss(key)
        local_of(writer).put(key, entry(i), 0.5, "", None)
        writer.put(key, entry(i), 0.5, written=time.time())
    writer.finish()
    assert any(name.endswith("-gkx-pack") for name in objects) and any(n.endswith("-gkx-manifest") for n in objects)
    backend = Memory(objects=objects)
    reader = level_over(backend, tmp_path / "b")
    reader.local_miss(KEYS[0])
    assert reader.read(KEYS[0]).found is not None  # the first miss's own lookup
    deadline = time.monotonic() + 10
    while len(landed(local_of(reader))) < len(KEYS) - 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    reader.finish()
    assert landed(local_of(reader)) == {key: entry(i) for i, key in enumerate(KEYS) if i}
    assert [call for call in backend.calls if call[0] == "stream"] and not [
        call for call in backend.calls if call[0] == "first" and call[1] != KEYS[0]], backend.calls
    assert reader.snapshot()["prefetched"] == len(KEYS) - 1


def test_a_writer_s_local_hit_heals_an_entry_the_level_lost(tmp_path: Path) -> None:
    """An entry the bucket lost is put back by a writer that hits it locally, with the seal kept
    beside it, once a miss has taken the listing (a run of local hits alone asks the level nothing)."""
    backend = Memory()
    level = level_over(backend, tmp_path / "a")
    local_of(level).put(KEYS[0], entry(0), 0.5, "", None)
    level.local_hit(KEYS[0], len(entry(0)))
    assert backend.calls == []
    level.local_miss(KEYS[1])
    assert level.read(KEYS[1]).found is None
    deadline = time.monotonic() + 10  # (healing is the worker's, when nothing of this run's is queued)
    while f"{KEYS[0]}-cache" not in backend.objects and time.monotonic() < deadline:
        time.sleep(0.02)
    level.finish()
    assert backend.objects.get(f"{KEYS[0]}-cache") == entry(0) and f"{KEYS[0]}-gkx-shared" in backend.objects


def test_prune_and_clear_of_the_shared_level_go_through_its_port(tmp_path: Path) -> None:
    """``prune --shared`` and ``clear --shared`` list the level and remove through its backend:
    entries with their sidecars, least recently written first, never a manifest, a pack or an
    object of another name; bounded like a run."""
    from gkx_autocache._shared import upkeep

    backend = Memory()
    for i, key in enumerate(KEYS):
        backend.write(f"{key}-cache", entry(i))
        backend.write(f"{key}-gkx-shared", b"{}")
        backend.written[f"{key}-cache"] = 1000.0 + i
    backend.write("abc-gkx-manifest", b"{}")
    backend.write("notes.txt", b"mine")
    oldest = upkeep.plan(backend, 5.0, cap=sum(len(entry(i)) + 2 for i in range(2, len(KEYS))))
    assert [unit.key for unit in oldest.units] == KEYS[:2] and oldest.entries == 2
    assert upkeep.execute(backend, oldest, 5.0) == 4
    assert sorted(backend.objects) == sorted(["abc-gkx-manifest", "notes.txt"]
                                             + [f"{key}{suffix}" for key in KEYS[2:] for suffix in ("-cache", "-gkx-shared")])
    everything = upkeep.plan(backend, 5.0, everything=True)
    assert upkeep.execute(backend, everything, 5.0) == 2 * (len(KEYS) - 2)
    assert sorted(backend.objects) == ["abc-gkx-manifest", "notes.txt"]
    backend.failing = TimedOut("the client's own read timed out")
    with pytest.raises(upkeep.Failed, match="timed out"):
        upkeep.plan(backend, 5.0, everything=True)
