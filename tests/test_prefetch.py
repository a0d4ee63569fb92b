"""Prefetch (SPEC §14, amended 2026-12-02): a fresh local level fetches ahead, in parallel and
bounded, the entries the last run of the program looked up (its manifest, written by a writer
beside the entries), verified before they land. Real JAX in fresh processes, against moto's S3
server (conftest) behind the recording, delaying, lying proxy of ``hostile``, and a real shared
directory. Speed is the benchmark's (``benchmarks/run.py --only levels``), not a test's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import pytest
from conftest import COUNTING, S3, InProcess, Venv, run_program
from hostile import Proxy
from test_activation import VERSION_DIR
from test_levels import KEY_A, KEY_B, autocache_warnings, drop_packs, entries, levels_env, local_entries, report

# N jitted functions, each its own entry; MANY_SHIFT changes the odd ones (half the keys new).
MANY = r"""
import json, os, time
import jax, jax.numpy as jnp
""" + COUNTING + r"""
n = int(os.environ.get("MANY_N", "12"))
shift = float(os.environ.get("MANY_SHIFT", "0"))
x = jnp.linspace(0.0, 1.0, 64)
total = 0.0
for i in range(n):
    if i == 1 and os.environ.get("MANY_PAUSE"):  # the program's own work after its first lookups, while a
        # prefetch goes on: until the local level holds no new entry for MANY_PAUSE seconds (at most 60 s)
        vdir, seen, still = jax.config.jax_compilation_cache_dir, -1, time.monotonic()
        begun = still
        while time.monotonic() - still < float(os.environ["MANY_PAUSE"]) and time.monotonic() - begun < 60:
            now = sum(name.endswith("-cache") for name in os.listdir(vdir))
            seen, still = now, still if now == seen else time.monotonic()
            time.sleep(0.2)
    c = float(i + 1) + (shift if i % 2 else 0.0)
    total += float(jax.jit(lambda v, c=c: jnp.tanh(v * c).sum() + c)(x))
print(json.dumps({**counts, "result": round(total, 4)}), flush=True)
if os.environ.get("MANY_KILLED"):  # no exit: no prune, no upload, no ledger's last lines, as after a kill
    os._exit(0)
"""


def run_many(venv: Venv, env: dict[str, str], n: int = 12, shift: float = 0.0) -> tuple[dict[str, Any], str]:
    return run_program(venv, env={**env, "MANY_N": str(n), "MANY_SHIFT": str(shift)}, program=MANY)


def many(here: InProcess, env: dict[str, str], n: int = 12, shift: float = 0.0, pause: float = 0.0,
         size: int = 2000, settle: bool = False, ahead: bool = False) -> tuple[dict[str, Any], str]:
    """MANY as a process here (conftest's ``InProcess.process``): ``n`` functions, each its own
    entry, the odd ones changed by ``shift``; ``pause``: after the first lookup, the program's own
    work while a prefetch goes on, until the local level holds no new entry for that long (at most
    60 s); ``size``: each executable's bytes; ``settle``: its threads' work done before it exits (a
    real compile takes that long: its prefetch has read the manifest by then); ``ahead``: the same
    after its first lookup (its prefetch lands all it will before the next lookup). What PROGRAM
    prints, and stderr."""
    with here.process(env) as ran:
        for i in range(n):
            if i == 1 and ahead:
                ran.settle()
            if i == 1 and pause:
                vdir, seen, still = Path(str(ran.values["dir"])), -1, time.monotonic()
                begun = still
                while time.monotonic() - still < pause and time.monotonic() - begun < 60:
                    now = len(list(vdir.glob("*-cache")))
                    seen, still = now, still if now == seen else time.monotonic()
                    time.sleep(0.05)
            ran.jit("_lambda", str(float(i + 1) + (shift if i % 2 else 0.0)), size=size)
        if settle:
            ran.settle()
    return {"requests": ran.jax.requests, "hits": ran.jax.hits, "result": ran.jax.result()}, ran.stderr


def shared_stats(runs: Venv | InProcess, env: dict[str, str]) -> dict[str, Any]:
    proc = runs.cli("--json", "stats", env=env)
    assert proc.returncode == 0, proc.stderr
    levels: dict[str, Any] = json.loads(proc.stdout)["levels"]["shared"]
    return levels


def manifests(s3: S3, prefix: str = "team") -> dict[str, int]:
    under = f"{prefix}/{VERSION_DIR}/"
    return {k[len(under):]: n for k, n in s3.objects(under).items() if k.endswith("-gkx-manifest")}


def behind(s3: S3, s3_server: str, **kwargs: Any) -> tuple[Proxy, dict[str, str]]:
    proxy = Proxy(int(s3_server.rsplit(":", 1)[1]), **kwargs)
    return proxy, {**s3.env, "AWS_ENDPOINT_URL": proxy.endpoint}


def pack_of(s3: S3) -> tuple[str, list[tuple[str, bytes, bytes]]]:
    """The bucket's one pack: its object's name and its records, ``(key, seal, entry)``."""
    from gkx_autocache._shared import pack

    (name,) = [k for k in s3.objects(f"team/{VERSION_DIR}/") if k.endswith("-gkx-pack")]
    data = s3.client().get_object(Bucket=s3.bucket, Key=name)["Body"].read()
    at = [0]

    def take(n: int) -> bytes:
        at[0] += n
        return bytes(data[at[0] - n:at[0]])

    reader, records = pack.Reader(take), []
    while (record := reader.next(1 << 30)) is not None:
        records.append((record[0], record[1], reader.body(record[2])))
    return name, records


@pytest.mark.parametrize("packed", ["from its pack", "entry by entry"])
def test_a_fresh_local_level_fetches_the_last_runs_entries_ahead(
        here: InProcess, tmp_path: Path, s3: S3, s3_server: str, packed: str) -> None:
    """A writer's cold run leaves its manifest and its pack beside its entries; a fresh local level
    then gets them ahead of its lookups: from the pack, one request, or (the pack gone: dropped at
    a writer's exit, or a bucket that cannot stream one) several requests at once. Each entry is
    read once, every prefetched entry used and none wasted; the report line says how many were
    prefetched."""
    cold, _ = many(here, levels_env(s3.env, s3.bucket, tmp_path / "a"))
    uploaded = entries(s3, "team")
    assert len(manifests(s3)) == 1 and len(uploaded) == cold["requests"] >= 12
    assert sorted(key + "-cache" for key, _, _ in pack_of(s3)[1]) == sorted(uploaded)
    if packed == "entry by entry":
        drop_packs(s3)

    proxy, env = behind(s3, s3_server, delay=0.05)
    try:
        fresh, err = many(here, levels_env(env, s3.bucket, tmp_path / "b", GKX_JAX_CACHE_SHARED_WRITE="never"))
    finally:
        proxy.close()
    assert fresh["hits"] == fresh["requests"] == cold["requests"] and fresh["result"] == cold["result"], err
    assert report(err)["shared"] == cold["requests"] and not autocache_warnings(err), err
    assert local_entries(tmp_path / "b") == set(uploaded)
    reads = [p.split("?")[0] for m, p in proxy.requests if m == "GET" and p.split("?")[0].endswith("-cache")]
    packs = [p for m, p in proxy.requests if m == "GET" and p.split("?")[0].endswith("-gkx-pack")]
    if packed == "entry by entry":
        assert len(reads) == len(set(reads)) == len(uploaded), reads  # each entry read once: prefetch or lookup
        assert proxy.peak >= 4 and not packs, proxy.peak  # in parallel, not one after another
    else:  # the first lookups, before the pack arrives, read their own
        assert len(packs) == 1 and len(reads) == len(set(reads)) < len(uploaded) // 2, (packs, reads)
    shared = shared_stats(here, levels_env(s3.env, s3.bucket, tmp_path / "b"))
    assert cold["requests"] // 2 <= shared["prefetched"] == shared["prefetch_used"], shared
    assert shared["prefetch_wasted_bytes"] == 0 and shared["backfills"] == cold["requests"], shared
    assert f": {shared['prefetch_used']} prefetched)" in err, err


def test_a_changed_program_counts_what_it_fetched_for_nothing(here: InProcess, tmp_path: Path, s3: S3) -> None:
    """Half the program's keys are new since the manifest: the run is right, its new keys compile,
    and the bytes prefetched that it never looked up are counted as wasted, exactly."""
    many(here, levels_env(s3.env, s3.bucket, tmp_path / "a"))
    old = entries(s3, "team")
    reference, _ = many(here, {"GKX_JAX_CACHE_DIR": str(tmp_path / "c")}, shift=0.5)  # its keys, unshared
    new_keys = local_entries(tmp_path / "c")
    env = levels_env(s3.env, s3.bucket, tmp_path / "b", GKX_JAX_CACHE_SHARED_WRITE="never")
    changed, err = many(here, env, shift=0.5)
    assert changed["result"] == reference["result"] and changed["requests"] == reference["requests"], err
    assert 0 < changed["hits"] < changed["requests"], err
    landed_unused = (local_entries(tmp_path / "b") & set(old)) - new_keys
    assert landed_unused, err  # the old program's keys the new one does not look up
    shared = shared_stats(here, env)
    assert shared["prefetch_wasted_bytes"] == sum(old[name] for name in landed_unused), shared
    assert shared["prefetched"] - shared["prefetch_used"] == len(landed_unused), shared


def planted_manifest(s3: S3, body: dict[str, Any] | bytes) -> str:
    (name,) = manifests(s3)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    s3.client().put_object(Bucket=s3.bucket, Key=f"team/{VERSION_DIR}/{name}", Body=data)
    return name


def read_manifest(s3: S3) -> dict[str, Any]:
    (name,) = manifests(s3)
    body: dict[str, Any] = json.loads(s3.client().get_object(Bucket=s3.bucket, Key=f"team/{VERSION_DIR}/{name}")["Body"].read())
    return body


def test_a_hostile_bucket_never_lands_a_byte_its_seal_refused(here: InProcess, tmp_path: Path, s3: S3) -> None:
    """A manifest naming paths outside the level and an entry whose bytes do not match its seal: no
    file lands outside the version directory, the planted bytes never land in it, the lookup of
    that key is a rejected miss, and the run is right."""
    from gkx_autocache._shared import pack

    cold, _ = many(here, levels_env(s3.env, s3.bucket, tmp_path / "a"), n=6)
    body = read_manifest(s3)
    victim = body["keys"][-1][0]
    client = s3.client()
    where = f"team/{VERSION_DIR}/{victim}-cache"
    planted = bytes(b ^ 0x5A for b in client.get_object(Bucket=s3.bucket, Key=where)["Body"].read())
    client.put_object(Bucket=s3.bucket, Key=where, Body=planted)
    name, records = pack_of(s3)  # the pack's copy too, and a record of a key the manifest does not name
    extra = "jit_planted-" + "ab" * 32
    records = [(k, seal, planted if k == victim else data) for k, seal, data in records] + [(extra, records[0][1], planted)]
    client.put_object(Bucket=s3.bucket, Key=name, Body=pack.build(records)[0])
    body["keys"] = [["../../../escaped-0000000000000000000000000000000000000000000000000000000000000000", 10],
                    ["/abs-0000000000000000000000000000000000000000000000000000000000000000", 10], *body["keys"]]
    planted_manifest(s3, body)
    out, err = many(here, levels_env(s3.env, s3.bucket, tmp_path / "b", GKX_JAX_CACHE_SHARED_WRITE="never"), n=6)
    assert out["result"] == cold["result"] and out["hits"] == cold["requests"] - 1, err
    local = tmp_path / "b" / VERSION_DIR / f"{victim}-cache"
    assert not local.exists() or local.read_bytes() != planted
    assert not list(tmp_path.rglob("*escaped*")) and not Path("/abs-" + "0" * 64 + "-cache").exists()
    assert not (tmp_path / "b" / VERSION_DIR / f"{extra}-cache").exists()
    assert "1 rejected" in shared_line(here, levels_env(s3.env, s3.bucket, tmp_path / "b")), err


@pytest.mark.parametrize("fault", ["cut short", "an impossible size", "not a pack", "another entry's seal"])
def test_a_pack_that_cannot_be_read_on_leaves_its_entries_to_their_own_reads(here: InProcess, tmp_path: Path, s3: S3,
                                                                              fault: str) -> None:
    """A pack cut in the middle of an entry, one whose record claims 2**60 bytes, one that is not a
    pack, or one whose first record carries its neighbour's seal: what it does not give is read
    entry by entry. Every lookup hits, every entry landed is the bucket's own, nothing is said."""
    from gkx_autocache._shared import pack

    cold, _ = many(here, levels_env(s3.env, s3.bucket, tmp_path / "a"))
    name, records = pack_of(s3)
    half = len(records) // 2
    if fault == "cut short":
        body = pack.build(records)[0][:-len(records[-1][2]) * half // 2]
    elif fault == "an impossible size":
        key, seal, data = records[half]
        body = pack.build(records[:half])[0] + pack.HEAD.pack(len(key), len(seal), 1 << 60) + key.encode() + seal + data
    elif fault == "not a pack":
        body = b"\0" * 4096
    else:
        body = pack.build([(records[0][0], records[1][1], records[0][2]), *records[1:]])[0]
    s3.client().put_object(Bucket=s3.bucket, Key=name, Body=body)
    env = levels_env(s3.env, s3.bucket, tmp_path / "b", GKX_JAX_CACHE_SHARED_WRITE="never")
    out, err = many(here, env)
    assert out["hits"] == out["requests"] == cold["requests"] and out["result"] == cold["result"], err
    assert not autocache_warnings(err), err
    client = s3.client()
    for entry in local_entries(tmp_path / "b"):
        sound = client.get_object(Bucket=s3.bucket, Key=f"team/{VERSION_DIR}/{entry}")["Body"].read()
        assert (tmp_path / "b" / VERSION_DIR / entry).read_bytes() == sound, entry


def test_a_pack_holds_its_records_in_order_up_to_its_limit() -> None:
    from gkx_autocache._shared import pack

    records = [(f"jit_f{i}-{i:064x}", b'{"k":1}', bytes([i + 1]) * 100) for i in range(5)]
    one = pack.HEAD.size + len(records[0][0]) + 7 + 100
    data, keys = pack.build(records, limit=len(pack.MAGIC) + 3 * one)
    assert keys == [key for key, _, _ in records[:3]] and len(data) == len(pack.MAGIC) + 3 * one
    at = [0]

    def take(n: int) -> bytes:
        at[0] += n
        return data[at[0] - n:at[0]]

    reader = pack.Reader(take)
    back = []
    while (record := reader.next(1000)) is not None:
        back.append((record[0], record[1], reader.body(record[2])))
    assert back == records[:3] and reader.consumed == len(data)
    for planted in (b"GKXPACK0", pack.MAGIC + pack.HEAD.pack(5, 7, 100) + b"../x/{}",
                    pack.MAGIC + pack.HEAD.pack(71, 7, 1001) + records[0][0].encode(), data[:-1]):
        data, at[0] = planted, 0
        with pytest.raises(pack.Malformed):  # not a pack; a key that names no entry; too large; cut short
            reader = pack.Reader(take)
            while (record := reader.next(1000)) is not None:
                reader.body(record[2])


class _Channel:
    """What ``Prefetch`` reads of its channel (``channel.Channel``), for driving it without a bucket."""

    def __init__(self) -> None:
        self.timeout = 5.0
        self.off: tuple[str, float] | None = None
        self.backend: Any = None
        self.closed, self.listing = False, None
        self.counted: dict[str, float] = {}

    def ensure(self, quiet: bool = False) -> bool:
        return True

    def count(self, **add: float) -> None:
        for name, n in add.items():
            self.counted[name] = self.counted.get(name, 0) + n

    def turn_off(self, why: str, timed_out: bool = False) -> None:
        self.off = (why, 0.0)

    def too_slow(self, key: str, why: str) -> None:
        self.count(slow=1)


def _landing(local: Path, land: Any) -> Any:
    """A local level in ``local`` (``_local.level.LocalLevel``) whose check and write of a landed
    entry is ``land(key, entry) -> (bytes written or None, why not)``: what it books is its own."""
    import time as _time

    from gkx_autocache._local.landing import Receipt
    from gkx_autocache._local.level import LocalLevel

    class Landing(LocalLevel):
        def land(self, key: str, entry: Any) -> tuple[bool, str | None]:
            written, why = land(key, entry)
            if written is None:
                return False, why
            self.landings.book(key, Receipt(len(entry.data), written, entry.compile_secs or 0.0, _time.time()))
            return True, None

    return Landing(str(local), compression="zlib", decompress=lambda data: data, team=False, writable=True,
                   check_payload=lambda: True, whole=False, signs=False)


def _reader() -> Any:
    """A reader that takes any seal as it is (its shape is ``seal``'s tests'), bytes unchecked."""
    from gkx_autocache._entry import Entry as Found
    from gkx_autocache._shared.reads import Reader

    class Unchecked(Reader):
        def admit(self, key: str, raw_seal: bytes | None) -> dict[str, Any] | None:
            return dict(json.loads(raw_seal or b"{}"))

        def found(self, key: str, seal: dict[str, Any] | None, data: bytes, raw_seal: bytes | None = None) -> Found:
            return Found(data, None, 0.0)

    return Unchecked(cast(Any, _Channel()), secret=None, max_entry=1 << 30)


def test_a_hostile_pack_is_read_no_further_than_a_writer_packs_and_a_cut_record_goes_to_the_workers(
        tmp_path: Path) -> None:
    """A pack of 30 000 tiny records nobody wants is read no further than the most records a writer
    packs (each read past costs the GIL); a wanted record cut short in its body leaves its key to
    the workers, not lost."""
    from gkx_autocache._shared import pack, prefetch

    def reader(data: bytes) -> pack.Reader:
        at = [0]

        def take(n: int) -> bytes:
            at[0] += n
            return data[at[0] - n:at[0]]

        return pack.Reader(take)

    ahead = prefetch.Prefetch(cast(Any, _Channel()), _reader(), _landing(tmp_path, lambda key, found: (1, None)), 1 << 30)
    wanted = "jit_w-" + "cd" * 32
    ahead.flights.packed[wanted] = 10
    junk = pack.build([(f"jit_j-{i:064x}", b'{"bytes":1}', b"x") for i in range(30_000)])[0]
    stream = reader(junk)
    with pytest.raises(pack.Malformed, match="records"):
        ahead.unpack.records(stream)
    assert stream.consumed < len(junk) * 0.7, stream.consumed
    cut = pack.build([(wanted, b'{"bytes":10}', b"0123456789")])[0][:-4]
    with pytest.raises(pack.Malformed, match="cut short"):
        ahead.unpack.records(reader(cut))
    flights = ahead.flights
    assert flights.pending == {wanted: 10} and not flights.flight and flights.spent == flights.holding == 0


def shared_line(runs: Venv | InProcess, env: dict[str, str]) -> str:
    proc = runs.cli("stats", env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.once  # the same on every JAX line: the first Python's
@pytest.mark.parametrize("case", ["a million keys", "not json", "signed by another key"])
def test_a_manifest_that_cannot_be_used_costs_no_more_than_no_manifest(here: InProcess, tmp_path: Path, s3: S3,
                                                                       case: str) -> None:
    """A manifest of a million keys (beyond what is read of one), one that is not JSON, or (with a
    signing key) one not signed by it: nothing is prefetched, every lookup is served as without a
    prefetch, and nothing is said (a manifest is a hint)."""
    signing = {"GKX_JAX_CACHE_SIGNING_KEY": KEY_A} if case == "signed by another key" else {}
    cold, _ = many(here, levels_env(s3.env, s3.bucket, tmp_path / "a", **signing), n=6)
    if case == "a million keys":
        keys = ",".join(f'["jit_f-{i:064x}",4096]' for i in range(1_000_000))
        planted_manifest(s3, f'{{"v":1,"program":"x","keys":[{keys}]}}'.encode())
    elif case == "not json":
        planted_manifest(s3, b"\x00" * 100_000)
    else:
        body = read_manifest(s3)
        from gkx_autocache._shared import manifest

        planted_manifest(s3, manifest.encode([tuple(k) for k in body["keys"]], body["program"], KEY_B.encode()))
    env = levels_env(s3.env, s3.bucket, tmp_path / "b", GKX_JAX_CACHE_SHARED_WRITE="never", **signing)
    out, err = many(here, env, n=6)
    assert out["hits"] == out["requests"] == cold["requests"] and not autocache_warnings(err), err
    assert shared_stats(here, env)["prefetched"] == 0


@pytest.mark.once  # the same on every JAX line: the first Python's
def test_a_signed_manifest_is_used_by_a_reader_with_the_key(here: InProcess, tmp_path: Path, s3: S3) -> None:
    cold, _ = many(here, levels_env(s3.env, s3.bucket, tmp_path / "a", GKX_JAX_CACHE_SIGNING_KEY=KEY_A), n=6)
    assert "hmac" in read_manifest(s3)
    env = levels_env(s3.env, s3.bucket, tmp_path / "b", GKX_JAX_CACHE_SHARED_WRITE="never",
                     GKX_JAX_CACHE_SIGNING_KEY=KEY_A)
    out, err = many(here, env, n=6)
    assert out["hits"] == cold["requests"] and shared_stats(here, env)["prefetched"] > 0, err


@pytest.mark.once  # the same on every JAX line: the first Python's
@pytest.mark.parametrize("sizes", ["true", "lying"])
def test_a_tiny_cap_bounds_what_is_prefetched(here: InProcess, tmp_path: Path, s3: S3, sizes: str) -> None:
    """The local level's cap leaves little room: the prefetch lands no more than 90 % of it (the
    level it prunes to), also where the manifest says each entry has 1 byte; the rest is served
    by lookups as without a prefetch."""
    cold, _ = many(here, levels_env(s3.env, s3.bucket, tmp_path / "a"), n=16, size=20_000)
    if sizes == "lying":
        body = read_manifest(s3)
        body["keys"] = [[k, 1] for k, _ in body["keys"]]
        planted_manifest(s3, body)
    total = sum(entries(s3, "team").values())
    cap = total // 2
    env = levels_env(s3.env, s3.bucket, tmp_path / "b", GKX_JAX_CACHE_SHARED_WRITE="never",
                     GKX_JAX_CACHE_MAX_SIZE=str(cap))
    out, err = many(here, env, n=16, size=20_000)
    assert out["hits"] == out["requests"] == cold["requests"] and out["result"] == cold["result"], err
    shared = shared_stats(here, env)
    assert 0 < shared["prefetched_bytes"] + 4096 * shared["prefetched"] <= cap * 0.9, (shared, cap)


@pytest.mark.once  # the same on every JAX line: the first Python's
def test_two_processes_prefetching_into_one_local_level(venv: Venv, tmp_path: Path, s3: S3, s3_server: str) -> None:
    """Two fresh processes at once into one local level: both right, the level whole, no file left
    half-written, and no entry fetched by both but those in flight at once."""
    cold, _ = run_many(venv, levels_env(s3.env, s3.bucket, tmp_path / "a"), n=24)
    proxy, env = behind(s3, s3_server, delay=0.02)
    try:
        both_env = {**venv.env, **levels_env(env, s3.bucket, tmp_path / "b", GKX_JAX_CACHE_SHARED_WRITE="never"),
                    "MANY_N": "24"}
        procs = [subprocess.Popen([str(venv.python), "-c", MANY], env=both_env, cwd=str(venv.home),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        proxy.close()
    for proc, (stdout, stderr) in zip(procs, outs, strict=True):
        assert proc.returncode == 0, stderr
        out = json.loads(stdout.strip().splitlines()[-1])
        assert out["result"] == cold["result"] and out["hits"] == out["requests"], stderr
    vdir = tmp_path / "b" / VERSION_DIR
    assert local_entries(tmp_path / "b") == set(entries(s3, "team"))
    assert not [p for p in vdir.iterdir() if p.name.endswith(".tmp")]
    reads = [p.split("?")[0] for m, p in proxy.requests if m == "GET" and p.split("?")[0].endswith("-cache")]
    assert len(reads) <= len(set(reads)) + 2 * 8, len(reads) - len(set(reads))  # at most a window in flight twice


def test_a_bucket_that_stalls_during_the_prefetch_costs_one_timeout(here: InProcess, tmp_path: Path, s3: S3,
                                                                    s3_server: str) -> None:
    """The listing and the manifest answer, then every entry read hangs: the lookups waiting on the
    prefetch's fetches are released by the first stall, the level turns off with one warning, and
    the run compiles the rest; one timeout in all, not one per entry."""
    cold, _ = many(here, levels_env(s3.env, s3.bucket, tmp_path / "a"))
    proxy, env = behind(s3, s3_server, mode="hang")
    try:
        started = time.monotonic()
        out, err = many(here, levels_env(env, s3.bucket, tmp_path / "b", GKX_JAX_CACHE_SHARED_TIMEOUT="5"))
        elapsed = time.monotonic() - started
    finally:
        proxy.close()
    assert out["result"] == cold["result"] and out["hits"] == 0, err
    (warning,) = autocache_warnings(err)
    assert "is off for the rest of this process" in warning, warning
    assert elapsed < 45, elapsed  # twelve timeouts would be 60 s


def test_a_pack_that_drips_holds_no_lookup_beyond_one_timeout(here: InProcess, tmp_path: Path, s3: S3,
                                                              s3_server: str) -> None:
    """The pack arrives at once up to the middle of a record, then a byte every 40 ms (a bad
    proxy) while the program works before its next lookups: the lookup of the record in flight
    waits no longer than shared_timeout, the drip is a stall (the level turns off, one warning),
    and the run is right. Counting each byte as progress held that lookup until its record had
    dripped (45 s at a 3 s timeout)."""
    cold, _ = many(here, levels_env(s3.env, s3.bucket, tmp_path / "a"))
    proxy, env = behind(s3, s3_server, mode="drip")
    try:
        started = time.monotonic()
        out, err = many(here, levels_env(env, s3.bucket, tmp_path / "b", GKX_JAX_CACHE_SHARED_TIMEOUT="3"), pause=6)
        elapsed = time.monotonic() - started
    finally:
        proxy.close()
    print(f"{elapsed:.1f} s with a dripping pack")
    assert out["result"] == cold["result"] and "prefetched" in err, err
    (warning,) = autocache_warnings(err)
    assert "no progress for 3 s" in warning, warning
    assert elapsed < 35, elapsed  # the rest of the record at 25 bytes a second: a minute


@pytest.mark.once  # the same on every JAX line: the first Python's
def test_a_shared_directory_is_prefetched_too(here: InProcess, tmp_path: Path) -> None:
    """A shared directory (NFS, a baked image): the same manifest, read in parallel."""
    team = tmp_path / "team"
    team.mkdir(mode=0o755)
    env = {"GKX_JAX_CACHE_SHARED": str(team), "GKX_JAX_CACHE_REPORT": "1"}
    cold, _ = many(here, {**env, "GKX_JAX_CACHE_DIR": str(tmp_path / "a")})
    assert [p.name for p in (team / VERSION_DIR).glob("*-gkx-manifest")]
    fresh_env = {**env, "GKX_JAX_CACHE_DIR": str(tmp_path / "b"), "GKX_JAX_CACHE_SHARED_WRITE": "never"}
    out, err = many(here, fresh_env)
    assert out["hits"] == out["requests"] == cold["requests"] and report(err)["shared"] == cold["requests"], err
    assert shared_stats(here, fresh_env)["prefetched"] > 0


@pytest.mark.once  # the same on every JAX line: the first Python's
def test_a_warm_local_run_asks_the_bucket_for_no_manifest(here: InProcess, tmp_path: Path, s3: S3, s3_server: str) -> None:
    """Prefetch begins at the first local miss: a warm local run reads no manifest and writes none."""
    many(here, levels_env(s3.env, s3.bucket, tmp_path / "a"), n=4)
    proxy, env = behind(s3, s3_server)
    try:
        warm, err = many(here, levels_env(env, s3.bucket, tmp_path / "a"), n=4)
    finally:
        proxy.close()
    assert warm["hits"] == warm["requests"], err
    assert not [p for _, p in proxy.requests if "-gkx-manifest" in p], proxy.requests


def test_manifest_keys_are_entry_names_and_a_signature_is_checked() -> None:
    from gkx_autocache._shared import manifest

    good = "jit_f-" + "ab" * 32
    data = manifest.encode([(good, 10), ("../x-" + "ab" * 32, 10), ("a/b-" + "ab" * 32, 5), (good + "x", 3)], "p", None)
    assert manifest.decode(data, None) == ([(good, 10)], 0, None)
    signed = manifest.encode([(good, 10)], "p", b"k", packed=1)
    assert manifest.decode(signed, b"k") == ([(good, 10)], 1, None)
    for secret, body in ((b"other", signed), (b"k", data)):
        with pytest.raises(ValueError, match="not signed"):
            manifest.decode(body, secret)
    with pytest.raises(ValueError, match="longer"):
        manifest.decode(b" " * manifest.MANIFEST_LIMIT, None)
    hidden = manifest.encode([("." + good[1:], 10), (good, 10)], "p", None)
    assert manifest.decode(hidden, None) == ([(good, 10)], 0, None)  # a hidden file would be outside the cap and prune
    with pytest.raises(ValueError, match="another program"):
        manifest.decode(data, None, "q")  # copied under another program's name
    bad_mac = json.loads(signed)
    bad_mac["hmac"] = "\u00e9" * 64  # compare_digest raises TypeError on a non-ASCII string
    with pytest.raises(ValueError, match="not signed"):
        manifest.decode(json.dumps(bad_mac).encode(), b"k")


def test_a_manifest_names_the_program_and_never_shows_its_arguments(tmp_path: Path) -> None:
    """`python -c` programs are told apart by their code (with combined flags too); arguments that
    are paths (a Jupyter kernel's connection file) do not make a new manifest each run."""
    probe = "from gkx_autocache._shared import manifest; print(manifest.program()[0])"

    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # not a worker's

    def ident(*argv: str, cwd: Path = tmp_path) -> str:
        return subprocess.run([sys.executable, *argv], capture_output=True, text=True, check=True,
                              cwd=str(cwd), env=env).stdout.strip()

    first, again, other = ident("-c", probe), ident("-Bc", probe), ident("-c", probe + " ")
    assert first == again != other and len(first) == 32
    script = tmp_path / "kernel.py"
    script.write_text(probe + "\n")
    assert ident(str(script), "-f", "/run/a-1.json") == ident(str(script), "-f", "/run/b-2.json")
    assert ident(str(script), "--config", "a") != ident(str(script), "--config", "b")
    data = subprocess.run([sys.executable, "-c", "from gkx_autocache._shared import manifest as p; "
                           "print(p.encode([], p.program()[0], None).decode())", "--secret=hunter2"],
                          capture_output=True, text=True, check=True, env=env).stdout
    assert "hunter2" not in data


def test_pytest_xdist_workers_read_their_siblings_manifests(monkeypatch: pytest.MonkeyPatch) -> None:
    from gkx_autocache._shared import manifest

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    ident, part, index, count = manifest.program()
    assert (part, index, count) == ("gw1", 1, 3) and len(ident) == 32
    names = {manifest.manifest_name(ident, f"gw{i}") for i in range(3)}
    assert len(names) == 3 and all(n.endswith("-gkx-manifest") for n in names)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "many")
    assert manifest.program()[1:] == ("", 0, 1)


# -- a signing key vouches only for what it checked (SPEC §8 / §14, amended 2026-12-04) ---------------

# MANY, then (with WANT set) alive until the bucket holds WANT entries (at most 120 s) and 2 s more:
# healing is never waited for at exit, and a loaded machine can outlast a short run's uploads.
def swap(a: Path, b: Path) -> tuple[bytes, bytes]:
    """Swap two files' bytes in place (each keeps its owner and mode, as a group member's write
    into a team directory's 0660 entry would): two executables of the same shape, other constants."""
    da, db = a.read_bytes(), b.read_bytes()
    for path, data in ((a, db), (b, da)):
        with open(path, "r+b") as f:
            f.write(data)
            f.truncate()
    return da, db


def test_a_key_holder_heals_the_bucket_only_with_entries_its_key_vouched_for(here: InProcess, tmp_path: Path,
                                                                             s3: S3) -> None:
    """Someone without the key swaps two entries' bytes in a key holder's local level; the bucket
    loses its copies; the key holder's next run (one new compile: it asks the bucket) heals the
    bucket with the entries whose kept seal its key verifies, each with that seal as it was, and
    never the swapped two: a fresh key holder computes what the clean run computed."""
    key = {"GKX_JAX_CACHE_SIGNING_KEY": KEY_A}
    writer = levels_env(s3.env, s3.bucket, tmp_path / "w", **key)
    clean, _ = many(here, writer, n=6)
    local = tmp_path / "w" / VERSION_DIR
    lambdas = sorted(local.glob("jit__lambda*-cache"))
    assert len(lambdas) == 6
    swapped = {p.name for p in lambdas[:2]}
    swap(*lambdas[:2])
    for name in s3.objects("team/"):
        s3.client().delete_object(Bucket=s3.bucket, Key=name)
    want = len(local_entries(tmp_path / "w")) - 1  # its new compile, and the four it can vouch for
    with here.process(writer) as ran:
        for i in range(7):
            ran.jit("_lambda", str(float(i + 1)))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(entries(s3, "team")) < want:
            time.sleep(0.05)
        ran.settle()  # (what else it queued to heal, sent)
    assert report(ran.stderr)["misses"] == 1, ran.stderr
    healed = entries(s3, "team")
    assert swapped.isdisjoint(healed) and len(healed) == len(local_entries(tmp_path / "w")) - 2, (healed, swapped)
    kept = next(p for p in lambdas[2:])
    seal = s3.client().get_object(Bucket=s3.bucket, Key=f"team/{VERSION_DIR}/{kept.name[:-len('-cache')]}-gkx-shared")
    assert seal["Body"].read() == Path(f"{kept}"[:-len("-cache")] + "-gkx-shared").read_bytes()  # the seal kept, not a new one
    fresh, err = many(here, levels_env(s3.env, s3.bucket, tmp_path / "f", **key), n=6)
    assert fresh["result"] == clean["result"], err


def test_a_keyless_runs_backfill_is_never_signed_into_a_key_holders_pack(here: InProcess, tmp_path: Path,
                                                                         s3: S3) -> None:
    """A bucket writer without the key swaps two entries and writes unsigned seals that match; a
    keyless run of the user (a CI job whose secret was not passed) backfills them; the user's next
    run with the key and one new compile packs what it can vouch for only: a fresh key holder
    computes what the clean run computed."""
    from gkx_autocache._shared.seal import make_seal

    key = {"GKX_JAX_CACHE_SIGNING_KEY": KEY_A}
    clean, _ = many(here, {"GKX_JAX_CACHE_DIR": str(tmp_path / "plain")}, n=7)
    many(here, levels_env(s3.env, s3.bucket, tmp_path / "w", **key), n=6)
    drop_packs(s3)  # (the writer's pack holds sound copies: the keyless run reads the swapped objects)
    client = s3.client()
    under = f"team/{VERSION_DIR}/"
    names = sorted(k for k in entries(s3, "team") if k.startswith("jit__lambda"))[:2]
    bodies = [client.get_object(Bucket=s3.bucket, Key=under + n)["Body"].read() for n in names]
    for name, body in zip(names, reversed(bodies), strict=True):
        key_name = name[:-len("-cache")]
        client.put_object(Bucket=s3.bucket, Key=under + name, Body=body)
        client.put_object(Bucket=s3.bucket, Key=under + key_name + "-gkx-shared",
                          Body=make_seal(key_name, body, None, time.time(), None))
    user = tmp_path / "u"
    many(here, levels_env(s3.env, s3.bucket, user), n=6)  # keyless: the swapped two land unchecked
    assert {(user / VERSION_DIR / n).read_bytes() for n in names} == set(bodies)
    out, err = many(here, levels_env(s3.env, s3.bucket, user, **key), n=7)
    assert report(err)["misses"] == 1, err
    _, records = pack_of(s3)
    assert records and not {k + "-cache" for k, _, _ in records} & set(names), [k for k, _, _ in records]
    fresh, err = many(here, levels_env(s3.env, s3.bucket, tmp_path / "f", **key), n=7)
    assert fresh["result"] == clean["result"], err
    for name, planted in zip(names, reversed(bodies), strict=True):  # (its own compile may give the bytes it had)
        assert not (tmp_path / "f" / VERSION_DIR / name).exists() or (tmp_path / "f" / VERSION_DIR / name).read_bytes() != planted


# -- a lookup never waits on a pack record longer than shared_timeout (M5) -----------------------------


def test_a_lookup_waits_for_a_record_in_flight_no_longer_than_the_timeout_and_it_never_lands(tmp_path: Path) -> None:
    """A record the pack is reading (dripped by a bad proxy) holds its lookup at most one
    ``shared_timeout``: then the key is the lookup's own, and the record, when it completes, is
    not landed (the lookup read the entry itself)."""
    import threading

    from gkx_autocache._entry import Entry as Found
    from gkx_autocache._shared import prefetch

    channel = _Channel()
    channel.timeout = 0.5
    landed: list[str] = []
    def land(key: str, found: Any) -> tuple[int | None, str | None]:
        landed.append(key)
        return len(found.data), None

    ahead = prefetch.Prefetch(cast(Any, channel), _reader(), _landing(tmp_path, land), 1 << 30)
    key = "jit_w-" + "cd" * 32
    with ahead.flights.lock:
        event = ahead.flights.flight[key] = threading.Event()
        ahead.flights.from_pack.add(key)  # (a worker's fetch is bounded by its own progress)
    started = time.monotonic()
    waiting = threading.Thread(target=ahead.wait, args=(key,), daemon=True)
    waiting.start()
    waiting.join(5.0)
    waited = time.monotonic() - started
    assert not waiting.is_alive() and 0.4 < waited < 3.0 and key in ahead.flights.asked, waited
    ahead.lands.land(key, 10, Found(b"0123456789", None, 0.0))
    assert landed == [] and key not in ahead.local.landings
    event.set()


class _Drip:
    """An HTTP body that sends one byte every 20 ms, ``n`` in all, then ``then`` at once (aiohttp's
    ``read``, as s3fs gives it)."""

    def __init__(self, n: int, then: bytes = b"") -> None:
        self.left = n
        self.then = then

    async def read(self, n: int) -> bytes:
        import asyncio

        if self.left <= 0:
            rest, self.then = self.then[:n], self.then[n:]
            return rest
        await asyncio.sleep(0.02)
        self.left -= 1
        return b"x"


def test_a_dripping_pack_stalls_within_one_timeout() -> None:
    """A pack's body that arrives a byte at a time is no progress: reading a part of it stalls
    within ``shared_timeout`` (each byte counted as progress held a lookup 45 s at a 3 s timeout)."""
    import fsspec.asyn

    from gkx_autocache._backends.bucket import Stream
    from gkx_autocache._shared.calls import Stalled

    stream = Stream(fsspec.asyn.get_loop(), _Drip(400), timeout=0.5)  # 8 s of drip in all
    started = time.monotonic()
    with pytest.raises(Stalled):
        stream.take(1 << 20)
    assert time.monotonic() - started < 4.0
    small = Stream(fsspec.asyn.get_loop(), _Drip(3), timeout=0.5)
    assert small.take(3) == b"xxx"  # (a small read that completes is no stall)
    # A drip that speeds up just before the timeout: its 64 KiB are progress, and the read goes on.
    spurt = Stream(fsspec.asyn.get_loop(), _Drip(20, then=b"y" * (200 << 10)), timeout=0.5)
    assert len(spurt.take(1 << 20)) == 20 + (200 << 10)


# -- what a prefetch lands stays under the cap, on disk (L5), and an early stop keeps the manifest (L6) --

def on_disk_file(path: Path) -> int:
    return path.lstat().st_blocks * 512


def on_disk(folder: Path) -> int:
    """Bytes allocated, as `du` counts them."""
    return sum(p.lstat().st_blocks * 512 for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.mark.once  # the same on every JAX line: the first Python's
def test_two_fresh_programs_prefetching_together_stay_under_the_cap_on_disk(venv: Venv, tmp_path: Path,
                                                                          s3: S3) -> None:
    """Two fresh processes of two programs prefetch into one local level whose cap holds less than
    both manifests, look up two entries each, and end without their exit prune (``os._exit``, as
    a kill would): what is on disk, entries, sidecars and bookkeeping in whole blocks, stays under
    the cap (128 % and 135 % before: an entry was charged its bytes and 4 KiB, the bookkeeping
    nothing, and each process the whole room). The four entries the runs looked up themselves are
    their own writes (backfills), outside the prefetch's room, as a compile's would be: the exit
    prune keeps the cap for those, and a kill leaves them; they are allowed for, at most the four
    largest units. (One run in a few reached 121 %: a reservation seen between its creation and
    its lock was counted as a dead one's, and both processes took the whole room. Then, with the
    S3 client of its own, 115-121 % in 2 of 6: one process's first lookup hit what the other had
    landed, so its prefetch began after the other was killed, whose landings no ledger held yet;
    they are now recorded as they land.)"""
    from concurrent.futures import ThreadPoolExecutor

    # Two programs: the same code run from two working directories (a manifest each; no pytest-xdist
    # worker's name, which would make it this worker's part of a session).
    places = [tmp_path / "one", tmp_path / "two"]
    shifts = {"one": "0", "two": "0.5"}
    for place in places:
        place.mkdir()
        proc = venv.run("-c", MANY, env={**levels_env(s3.env, s3.bucket, tmp_path / f"a-{place.name}"), "MANY_N": "24",
                                         "MANY_SHIFT": shifts[place.name], "PYTEST_XDIST_WORKER": ""}, cwd=str(place))
        assert proc.returncode == 0, proc.stderr
    cap = 400_000
    env = levels_env(s3.env, s3.bucket, tmp_path / "b", GKX_JAX_CACHE_SHARED_WRITE="never", PYTEST_XDIST_WORKER="",
                     GKX_JAX_CACHE_MAX_SIZE=str(cap), MANY_N="2", MANY_PAUSE="8", MANY_KILLED="1")
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda place: venv.run("-c", MANY, env={**env, "MANY_SHIFT": shifts[place.name]},
                                                    cwd=str(place)), places))
    assert all(proc.returncode == 0 for proc in runs), [proc.stderr for proc in runs]
    vdir = tmp_path / "b" / VERSION_DIR
    used = on_disk(vdir)
    print(f"{used} bytes on disk under a cap of {cap}, {len(list(vdir.glob('*-cache')))} entries")
    assert len(list(vdir.glob("*-cache"))) > 4, "nothing prefetched"
    units = sorted((sum(on_disk_file(p) for p in vdir.glob(entry.name[:-len("-cache")] + "-*"))
                    for entry in vdir.glob("*-cache")), reverse=True)
    assert used <= cap + sum(units[:4]), (used, cap, units[:4])


@pytest.mark.once  # the same on every JAX line: the first Python's
def test_a_run_stopped_after_its_first_compile_keeps_its_programs_manifest(here: InProcess, tmp_path: Path,
                                                                          s3: S3) -> None:
    """A run of the program that stops after one new compile writes a manifest that still holds
    the keys of the one it read (its own first): the next fresh machine prefetches them all, as
    before (a 154-key manifest was cut to 5, and the next fresh machine prefetched 3 of 40)."""
    many(here, levels_env(s3.env, s3.bucket, tmp_path / "a"), n=12)
    before = [key for key, _ in read_manifest(s3)["keys"]]
    out, err = many(here, levels_env(s3.env, s3.bucket, tmp_path / "b"), n=2, shift=0.5, settle=True)
    assert report(err)["misses"] == 1, err
    after = [key for key, _ in read_manifest(s3)["keys"]]
    assert len(after) == len(before) + 1 and set(before) < set(after), (before, after)
    fresh, err = many(here, levels_env(s3.env, s3.bucket, tmp_path / "c", GKX_JAX_CACHE_SHARED_WRITE="never"), n=12,
                      ahead=True)
    assert shared_stats(here, levels_env(s3.env, s3.bucket, tmp_path / "c"))["prefetched"] >= len(before) - 1, err


def test_a_reservation_counts_only_live_holders_and_the_earlier_keeps_its_share(tmp_path: Path) -> None:
    """Reservations of the room under the cap: one whose lock nobody holds (a killed process, one
    in another container, a planted file, however large or far in the future) is not counted; a
    name that is no reservation's (``²``, a pid past any int) is read past; of two live ones the
    earlier keeps its share and the later takes what is left."""
    from gkx_autocache._shared import room

    meta = tmp_path / ".gkx-autocache"
    meta.mkdir()
    planted = meta / ".prefetch.1.999999999999.tmp"
    planted.write_bytes(b"")
    os.utime(planted, (4e9, 4e9))
    for odd in (".prefetch.1.\u00b2.tmp", ".prefetch.99999999999999999999.5.tmp", ".prefetch.x.tmp"):
        (meta / odd).write_bytes(b"")
    first, second = room.Reservation(str(tmp_path)), room.Reservation(str(tmp_path))
    assert first.take(600, 1000, 1) == 600
    time.sleep(0.05)  # (file times are the kernel's coarse clock: of two made in one tick, the lower pid is the earlier)
    assert second.take(500, 1000, 1) == 400  # (the first's lock is held: it is live)
    first.close()
    assert not list(meta.glob(f".prefetch.{os.getpid()}.600.tmp"))
    third = room.Reservation(str(tmp_path))
    time.sleep(0.05)
    assert third.take(700, 1000, 1) == 600  # the second's 400 is still held
    second.close()
    third.close()
