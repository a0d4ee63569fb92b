"""SPEC §18, its parts on injected values: a record's bytes and their checks, the sidecar's mark
of a rebuilt entry, the in-process claims a lookup waits on, a program's list, which directory is
the older one, which records a rebuild may read, and the rebuild's threads, stops and outcomes
(with a stand-in for JAX's functions: the real ones are tests/test_rebuild.py's)."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from gkx_autocache import _formats
from gkx_autocache._rebuild import engine, keeper, record
from gkx_autocache._rebuild.ahead import Inflight

KEY = "jit_f-" + "ab" * 32
FIELDS: dict[str, Any] = {"platform": "cpu", "devices": [0], "shape": [1], "kinds": ["cpu"], "replicas": 1,
                          "partitions": 1, "tupled": False, "overrides": [["xla_cpu_x", True]], "spmd": True,
                          "to_parameters": [False], "to_output": [False], "name": "jit_f", "shardy": True,
                          "efforts": {}, "program": "p" * 32, "label": "train.py", "key": KEY, "compile": 0.5,
                          "written": 1.0}
MODULE = b"ML\xefR" + bytes(range(256)) * 8


def test_a_record_reads_back_as_written() -> None:
    """Encoded then decoded: the fields and the module bytes, unchanged."""
    found = record.decode(record.encode(FIELDS, MODULE, None), None)
    assert found.module == MODULE
    assert {k: found.fields[k] for k in FIELDS} == FIELDS
    assert found.label == "train.py" and found.name == "jit_f"


def test_a_record_is_compressed() -> None:
    """The module is kept compressed (zlib): a record costs less than its module."""
    assert len(record.encode(FIELDS, MODULE, None)) < len(MODULE) / 2


@pytest.mark.parametrize("damage", ["module", "fields", "truncated", "magic", "size", "json"])
def test_a_damaged_or_altered_record_is_refused(damage: str) -> None:
    """A record whose module or fields were altered, or that was cut short, is refused by cause
    (never compiled): the module's digest and size are checked, the fields' shapes too."""
    data = bytearray(record.encode(FIELDS, MODULE, None))
    head = data.index(b"\n", len(record.MAGIC)) + 1
    if damage == "module":
        planted = zlib.compress(MODULE[:-1] + b"\x00")
        data[head:] = planted
    elif damage == "fields":
        data[:head] = data[:head].replace(b'"replicas":1', b'"replicas":"1"')
    elif damage == "truncated":
        del data[-10:]
    elif damage == "magic":
        data[:4] = b"XXXX"
    elif damage == "size":
        data[:head] = data[:head].replace(f'"module_bytes":{len(MODULE)}'.encode(), b'"module_bytes":5')
    else:
        data[:head] = record.MAGIC + b"{not json\n"
    with pytest.raises(record.Refused):
        record.decode(bytes(data), None)


def test_with_a_signing_key_only_a_record_it_signed_is_read() -> None:
    """With a signing key set, an unsigned record, one signed with another key, and a signed one
    whose fields were changed after signing are all refused; the one it signed is read."""
    key = b"secret"
    signed = record.encode(FIELDS, MODULE, key)
    assert record.decode(signed, key).module == MODULE
    with pytest.raises(record.Refused, match="not signed"):
        record.decode(record.encode(FIELDS, MODULE, None), key)
    with pytest.raises(record.Refused, match="does not verify"):
        record.decode(record.encode(FIELDS, MODULE, b"another"), key)
    head = signed.index(b"\n", len(record.MAGIC))
    body = json.loads(signed[len(record.MAGIC):head])
    body["devices"] = [3]  # a keyless writer's change, the signature kept
    altered = record.MAGIC + json.dumps(body).encode() + signed[head:]
    with pytest.raises(record.Refused, match="does not verify"):
        record.decode(altered, key)


def test_two_records_of_one_compile_are_one() -> None:
    """The same module and options recorded in two directories (two JAX versions, two runs) are
    one compile for a rebuild, whatever their key, time or program."""
    a = record.decode(record.encode(FIELDS, MODULE, None), None)
    b = record.decode(record.encode({**FIELDS, "key": "jit_f-" + "cd" * 32, "written": 9.0, "label": "x"}, MODULE,
                                    None), None)
    c = record.decode(record.encode({**FIELDS, "devices": [1]}, MODULE, None), None)
    assert record.identity(a) == record.identity(b) != record.identity(c)


def test_the_sidecar_says_a_rebuild_compiled_its_entry() -> None:
    """A rebuilt entry's sidecar carries a mark after its run; a sidecar of before (no mark) reads
    as it did, and a rebuild's without a run still names none."""
    marked = _formats.sidecar(0.25, "1733500000.123-42", rebuilt=True)
    assert _formats.sidecar_rebuilt(marked) and _formats.sidecar_run(marked) == "1733500000.123-42"
    assert _formats.compile_secs_of(marked) == 0.25
    plain = _formats.sidecar(0.25, "1733500000.123-42")
    assert not _formats.sidecar_rebuilt(plain) and _formats.sidecar_run(plain) == "1733500000.123-42"
    anonymous = _formats.sidecar(0.25, "", rebuilt=True)
    assert _formats.sidecar_rebuilt(anonymous) and _formats.sidecar_run(anonymous) == ""


def test_a_lookup_waits_only_for_a_key_being_rebuilt() -> None:
    """A key the rebuild compiles is waited for (until it is done); a key it has not reached is the
    lookup's, and the rebuild skips it when it comes to it; nothing is waited for when no rebuild runs."""
    inflight = Inflight(timeout=5.0)
    assert not inflight.wait(KEY)  # no rebuild: the lookup compiles
    inflight.begin()
    assert inflight.claim(KEY, 0.1)
    done: list[bool] = []
    waiter = threading.Thread(target=lambda: done.append(inflight.wait(KEY)))
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive()  # waiting for the rebuild's entry
    inflight.done(KEY)
    waiter.join(5)
    assert done == [True]
    other = "jit_g-" + "cd" * 32
    assert not inflight.wait(other)  # looked up before the rebuild reached it
    assert not inflight.claim(other, 0.1)
    inflight.end()
    assert not inflight.wait(other)


def test_a_wait_is_bounded() -> None:
    """A rebuild that never finishes a key holds a lookup at most its bound (then it compiles)."""
    inflight = Inflight(timeout=0.3)
    inflight.begin()
    inflight.claim(KEY, 0.0)
    started = time.monotonic()
    assert not inflight.wait(KEY)
    assert time.monotonic() - started < 3


def test_the_older_directory_is_the_newest_older_version(tmp_path: Path) -> None:
    """Versions are ordered as numbers (0.10.1 after 0.9.2), newer ones and other files ignored."""
    for name in ("jax-0.9.2", "jax-0.10.1", "jax-0.10.10", "jax-0.4.38", "notes"):
        (tmp_path / name).mkdir()
    (tmp_path / "jax-0.10.0").write_text("a file")
    assert engine.older_dir(str(tmp_path / "jax-0.10.2")) == str(tmp_path / "jax-0.10.1")
    assert engine.older_dir(str(tmp_path / "jax-0.4.38")) is None
    assert engine.older_dir(str(tmp_path / "jax-0.11.0")) == str(tmp_path / "jax-0.10.10")


def test_a_program_list_keeps_only_well_formed_lines(tmp_path: Path) -> None:
    """A program's list: (context, key) per line in order; anything else is skipped."""
    folder = tmp_path / ".gkx-autocache" / "programs"
    folder.mkdir(parents=True)
    good = [("0123456789abcdef", KEY), ("fedcba9876543210", "jit_g-" + "cd" * 32)]
    text = "".join(f"{c} {k}\n" for c, k in good[:1]) + "junk\n../../x y\n\xff\n" + f"{good[1][0]} {good[1][1]}\n"
    (folder / "prog").write_text(text)
    assert keeper.listed(str(tmp_path), "prog") == good


def test_the_context_follows_the_flags_and_the_cpu() -> None:
    """Another XLA_FLAGS, LIBTPU_INIT_ARGS or CPU is another context; the rest of the environment is not."""
    base = keeper.context("x86_64:avx2", {"XLA_FLAGS": "--xla_a=1"})
    assert base == keeper.context("x86_64:avx2", {"XLA_FLAGS": "--xla_a=1", "HOME": "/x"})
    assert base != keeper.context("x86_64:avx2", {"XLA_FLAGS": "--xla_a=2"})
    assert base != keeper.context("x86_64:avx2", {"XLA_FLAGS": "--xla_a=1", "LIBTPU_INIT_ARGS": "--x"})
    assert base != keeper.context("x86_64:avx512f", {"XLA_FLAGS": "--xla_a=1"})


# -- which records a rebuild reads (SPEC §8, §18) ---------------------------------------------------


def plant(vdir: Path, key: str = KEY, secret: bytes | None = None, **fields: Any) -> Path:
    vdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = vdir / f"{key}-gkx-record"
    path.write_bytes(record.encode({**FIELDS, "key": key, **fields}, MODULE, secret))
    path.chmod(0o600)
    return path


def test_a_record_another_user_owns_or_others_can_write_is_not_read(tmp_path: Path) -> None:
    """In a private directory, a record another user owns, or one its group or others can write,
    is refused (it is compiled, as an entry is loaded); this user's own is read."""
    vdir = tmp_path / "jax-0.10.2"
    plant(vdir)
    os.chown(plant(vdir, "jit_g-" + "cd" * 32, devices=[1]), 4242, 4242)
    plant(vdir, "jit_h-" + "ef" * 32, devices=[2]).chmod(0o620)
    found = engine.gather([str(vdir)], None)
    assert [f.key for f in found.found] == [KEY]
    assert sum(found.refused.values()) == 2, found.refused


def test_a_team_directory_s_records_are_read_only_when_signed(tmp_path: Path) -> None:
    """In a directory others can write (a team directory, group-writable), no record is read
    without a signing key; with one, only those it signed (a keyless member's are refused)."""
    vdir = tmp_path / "jax-0.10.2"
    plant(vdir, secret=b"k")
    plant(vdir, "jit_g-" + "cd" * 32, devices=[1])  # a keyless member's
    vdir.chmod(0o770)
    os.chown(vdir, -1, os.getgid())
    keyless = engine.gather([str(vdir)], None)
    assert keyless.found == [] and list(keyless.refused.values()) == [2]
    keyed = engine.gather([str(vdir)], b"k")
    assert [f.key for f in keyed.found] == [KEY]
    assert any("not signed" in why for why in keyed.refused), keyed.refused


def test_records_are_chosen_by_program_and_one_compile_is_rebuilt_once(tmp_path: Path) -> None:
    """``--program`` keeps the records whose label holds the name (or whose identity begins with
    it); one compile recorded in two directories is rebuilt from the newer record, once; the
    order is the one the program compiled them in."""
    old, new = tmp_path / "jax-0.10.1", tmp_path / "jax-0.10.2"
    plant(old, written=5.0)
    plant(new, "jit_k-" + "99" * 32, written=9.0)  # the same compile, recorded again
    plant(old, "jit_g-" + "cd" * 32, devices=[1], written=1.0)
    plant(old, "jit_t-" + "77" * 32, devices=[2], label="pytest -q", program="q" * 32, written=2.0)
    both = engine.gather([str(old), str(new)], None)
    assert [f.key for f in both.found] == ["jit_g-" + "cd" * 32, "jit_t-" + "77" * 32, "jit_k-" + "99" * 32]
    mine = engine.gather([str(old), str(new)], None, program="train")
    assert [f.key for f in mine.found] == ["jit_g-" + "cd" * 32, "jit_k-" + "99" * 32] and mine.other_programs == 1
    assert [f.key for f in engine.gather([str(old)], None, program="qqq").found] == ["jit_t-" + "77" * 32]


# -- the rebuild's threads, with a stand-in for JAX's functions ------------------------------------------


class FakeJax:
    """Stands for ``_jax.rebuild.Rebuilder``: a record's key is its device id's; device 9 is not
    here; device 8's module does not parse; a compile takes ``secs``."""

    def __init__(self, secs: float = 0.05) -> None:
        self.secs = secs
        self.compiling = 0
        self.most = 0
        self.lock = threading.Lock()

    def backend(self, platform: str) -> str:
        if platform != "cpu":
            raise LookupError(f"no {platform} here")
        return platform

    def devices(self, backend: str, ids: list[int], shape: list[int]) -> list[int]:
        if 9 in ids:
            raise LookupError("cpu device 9 is not here (1 here)")
        return ids

    def parse(self, data: bytes) -> bytes:
        return data

    def options(self, fields: dict[str, Any], backend: str, devices: list[int], module: bytes) -> list[int]:
        if devices == [8]:
            raise ValueError("bad module")
        return devices

    def key(self, module: bytes, devices: list[int], options: list[int], backend: str) -> str:
        return f"jit_f-{devices[0]:064x}"

    def compile(self, backend: str, module: bytes, devices: list[int], options: list[int]) -> str:
        with self.lock:
            self.compiling += 1
            self.most = max(self.most, self.compiling)
        time.sleep(self.secs)
        with self.lock:
            self.compiling -= 1
        return "exe"

    def entry(self, executable: str, backend: str, secs: float) -> bytes:
        return b"x" * 1000

    def thresholds(self) -> tuple[float, int]:
        return 0.0, -1


class FakeStore:
    def __init__(self, present: set[str] = set(), full_after: int | None = None,  # noqa: B006
                 elsewhere: set[str] = set(), full: int = errno.ENOSPC) -> None:  # noqa: B006
        self.path = "/nowhere"
        self.present = set(present)
        self.written: list[str] = []
        self.full_after = full_after
        self.full = full
        self.elsewhere = elsewhere  # keys another process is compiling now
        self.held: set[str] = set()

    def lease(self, key: str, compile_secs: float) -> bool:
        if key in self.elsewhere:
            return False
        self.held.add(key)
        return True

    def let_go(self, key: str) -> None:
        self.held.discard(key)

    def has(self, key: str) -> bool:
        return key in self.present

    def rebuilt(self, key: str, value: bytes, compile_secs: float, data: bytes) -> int:
        if self.full_after is not None and len(self.written) >= self.full_after:
            raise OSError(self.full, os.strerror(self.full))
        self.written.append(key)
        self.present.add(key)
        return len(value)


def records(*device_ids: int, platform: str = "cpu") -> list[engine.Found]:
    out = []
    for i in device_ids:
        found = record.decode(record.encode({**FIELDS, "devices": [i], "platform": platform}, MODULE, None), None)
        out.append(engine.Found(f"jit_f-{i:064x}", "/old", b"record", found))
    return out


def test_a_rebuild_compiles_the_missing_in_parallel_and_says_why_the_rest_were_not() -> None:
    """Missing keys are compiled, on as many threads as asked; present ones skipped; a record of
    another platform, of devices not here, or whose module does not parse is said by cause."""
    fake, store = FakeJax(), FakeStore(present={f"jit_f-{1:064x}"})
    out = engine.Rebuild(store, fake, jobs=3).run(records(0, 1, 2, 3, 4, 5, 8, 9) + records(6, platform="gpu"))
    assert out.rebuilt == 5 and out.present == 1, vars(out)
    assert fake.most == 3
    assert sorted(store.written) == sorted(f"jit_f-{i:064x}" for i in (0, 2, 3, 4, 5))
    assert set(out.failed) == {"not here: no gpu here", "not here: cpu device 9 is not here (1 here)",
                               "its compile options cannot be built (ValueError: bad module)"}, out.failed


def test_a_dry_run_compiles_nothing() -> None:
    """``--dry-run`` computes the keys and says what it would compile."""
    fake, store = FakeJax(), FakeStore(present={f"jit_f-{1:064x}"})
    out = engine.Rebuild(store, fake, jobs=2, dry_run=True).run(records(0, 1, 2))
    assert (out.would, out.present, out.rebuilt, store.written) == (2, 1, 0, [])


def test_a_rebuild_stops_at_the_cap_and_says_so() -> None:
    """The directory's cap is not passed: the rebuild stops, and says the cap stopped it."""
    store = FakeStore()
    out = engine.Rebuild(store, FakeJax(), jobs=1, cap=10_000, used=7_500).run(records(*range(10, 20)))
    assert out.rebuilt == 2 and out.stopped == "cap", vars(out)
    assert sum(out.failed.values()) == 1 and out.done < 10


@pytest.mark.parametrize("full", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_a_full_disk_stops_the_rebuild(full: int) -> None:
    """A write that finds the disk full, the quota or the file size limit (``ulimit -f``) reached
    stops the rebuild (the next write would fail too: its compile would be lost), said once."""
    store = FakeStore(full_after=3, full=full)
    out = engine.Rebuild(store, FakeJax(secs=0.0), jobs=1).run(records(*range(10, 20)))
    assert out.rebuilt == 3 and (out.stopped or "").startswith("disk"), vars(out)
    assert out.done == 4


def test_keys_the_program_looked_up_first_are_left_to_it() -> None:
    """Ahead: a key the program's lookup reached first is not compiled a second time."""
    inflight = Inflight(timeout=1.0)
    inflight.begin()
    inflight.wait(f"jit_f-{2:064x}")  # the program missed it first
    store = FakeStore()
    out = engine.Rebuild(store, FakeJax(secs=0.0), jobs=2, claims=inflight).run(records(1, 2, 3))
    assert (out.rebuilt, out.taken) == (2, 1) and f"jit_f-{2:064x}" not in store.written


def test_a_stopped_rebuild_takes_no_more_records() -> None:
    """At exit ahead stops the rebuild: what is compiling finishes, nothing more starts."""
    rebuild = engine.Rebuild(FakeStore(), FakeJax(secs=0.2), jobs=1)
    thread = threading.Thread(target=rebuild.run, args=(records(*range(20)),))
    thread.start()
    time.sleep(0.3)
    rebuild.stop("the program ended")
    thread.join(5)
    assert not thread.is_alive() and rebuild.outcome.rebuilt < 5


def test_a_rebuild_ahead_stops_where_the_program_compiles_none_of_its_keys() -> None:
    """Ahead after a change of both the flags and the code: once the program's last misses are
    none of the keys the rebuild computed, the rebuild stops (futile) instead of compiling on."""
    inflight = Inflight(timeout=1.0)
    inflight.begin()
    for i in range(Inflight.WINDOW):
        inflight.wait(f"jit_g-{i:064x}")  # the program's own, changed, modules
    store = FakeStore()
    out = engine.Rebuild(store, FakeJax(secs=0.01), jobs=1, claims=inflight).run(records(*range(10, 40)))
    assert out.stopped == "futile" and out.rebuilt < 5, vars(out)
    related = Inflight(timeout=1.0)
    related.begin()
    for i in range(Inflight.WINDOW):
        related.wait(f"jit_f-{i + 40:064x}")  # keys the rebuild computes: the same modules
    out = engine.Rebuild(FakeStore(), FakeJax(secs=0.01), jobs=1, claims=related).run(records(*range(10, 50)))
    assert out.stopped is None and out.rebuilt == 32 and out.taken == 8, vars(out)


def test_a_key_another_process_compiles_now_is_left_to_it() -> None:
    """A key whose lease another process holds (it compiles it now) is not compiled a second time
    by the rebuild; every lease the rebuild took is let go."""
    store = FakeStore(elsewhere={f"jit_f-{2:064x}"})
    out = engine.Rebuild(store, FakeJax(secs=0.0), jobs=2).run(records(1, 2, 3))
    assert out.rebuilt == 2 and f"jit_f-{2:064x}" not in store.written, vars(out)
    assert out.failed == {"another process compiles it now": 1} and store.held == set(), vars(out)


def test_a_child_forked_while_a_rebuild_thread_notes_a_key_can_note_its_own(tmp_path: Path) -> None:
    """A fork while a thread of the parent holds the keeper's lock (a rebuild ahead noting an entry
    it wrote) leaves the child a lock of its own: its own records are kept, never a hang."""
    kept = keeper.Keeper(str(tmp_path), lambda key, data: len(data), False, None,
                         lambda: keeper.Program("p" * 32, "train.py", "c" * 16), "0.0")
    kept._lock.acquire()  # as the parent's rebuild thread holds it, at the fork
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            import signal

            signal.alarm(10)  # (a hang ends the child, and the test fails)
            kept.noted()
            code = 0
        finally:
            os._exit(code)
    kept._lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, status


def test_the_rebuild_command_compiles_the_longest_first() -> None:
    """With no program waiting for its keys in order, the command starts the compiles recorded as
    the longest first: the last to start are short, and the threads end together (on the TPU v5e's
    13 threads a long compile left to the end kept the others idle)."""
    found = records(1, 2, 3, 4)
    for item, secs in zip(found, (0.1, 0.9, 0.0, 0.5), strict=True):
        item.record.fields["compile"] = secs
    ordered = engine.longest_first(found)
    assert [float(f.record.fields["compile"]) for f in ordered] == [0.9, 0.5, 0.1, 0.0]
    store = FakeStore()
    engine.Rebuild(store, FakeJax(secs=0.0), jobs=1).run(ordered)
    assert store.written == [f.key for f in ordered]
