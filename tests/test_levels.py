"""Levels (SPEC §14): a local cache in front of a shared one, a bucket on a real S3-compatible
server (moto's, started by conftest) or a real directory, with real JAX compiling real programs in
fresh processes. The misbehaving endpoints are in ``hostile``: a proxy in front of moto that
delays or lies, a server that never answers, one that answers a byte a second."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import servers
from conftest import (
    PEAK_RSS,
    PROGRAM,
    S3,
    InProcess,
    Venv,
    free_port,
    in_a_child_as,
    local_at,
    planted_run,
    run_program,
)
from hostile import Proxy, Silent
from test_activation import VERSION_DIR
from test_multihost import RANK  # two jax.distributed ranks compiling one step

from gkx_autocache import _settings

KEY_A = "correct horse battery staple"
KEY_B = "another team's key"
OTHER = PROGRAM.replace("x @ x.T", "x @ x.T + 1.0")  # one function more than PROGRAM compiles


def autocache_warnings(stderr: str) -> list[str]:
    """The package's warnings (the `report` line, which also begins with `gkx-autocache:`, is not one)."""
    return [line for line in stderr.splitlines() if "AutocacheWarning" in line]


def levels_env(endpoint_env: dict[str, str], bucket: str, local: Path, prefix: str = "team", **extra: str) -> dict[str, str]:
    return {**endpoint_env, "GKX_JAX_CACHE_DIR": str(local), "GKX_JAX_CACHE_SHARED": f"s3://{bucket}/{prefix}",
            "GKX_JAX_CACHE_REPORT": "1", **extra}


def report(stderr: str) -> dict[str, int]:
    """The numbers of the `report` line (the last: a forked child that exits normally prints its own
    first): hits, local and shared hits, misses."""
    line = [ln for ln in stderr.splitlines() if ln.startswith("gkx-autocache: ")][-1]
    match = re.match(r"gkx-autocache: (\d+) hits?(?: \((\d+) local, (\d+) shared(?:: \d+ prefetched)?[;)])?.*?, (\d+) miss(?:es)?", line)
    assert match, line
    return {"hits": int(match[1]), "local": int(match[2] or 0), "shared": int(match[3] or 0), "misses": int(match[4])}


def entries(s3: S3, prefix: str) -> dict[str, int]:
    """The bucket's entries directly under ``prefix``'s version prefix, by name."""
    under = f"{prefix}/{VERSION_DIR}/"
    return {k[len(under):]: n for k, n in s3.objects(under).items() if "/" not in k[len(under):] and k.endswith("-cache")}


def drop_packs(s3: S3, prefix: str = "team") -> int:
    """Delete the packs under ``prefix`` (a writer's, at exit): a test of each entry's own reads
    then reads them, not the sound copies a pack holds; how many there were."""
    packs = [k for k in s3.objects(f"{prefix}/{VERSION_DIR}/") if k.endswith("-gkx-pack")]
    for key in packs:
        s3.client().delete_object(Bucket=s3.bucket, Key=key)
    return len(packs)


def local_entries(local: Path) -> set[str]:
    vdir = local / VERSION_DIR
    return {p.name for p in vdir.glob("*-cache")} if vdir.is_dir() else set()


def start_moto(port: int) -> subprocess.Popen[bytes]:
    server = servers.start([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}", timeout=2).close()
            return server
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("moto's S3 server did not start") from None
            time.sleep(0.2)


@pytest.fixture
def own_s3() -> Iterator[tuple[S3, subprocess.Popen[bytes]]]:
    """A moto server of this test's own (the test stops it), and a bucket in it."""
    port = free_port()
    server = start_moto(port)
    store = S3(f"http://127.0.0.1:{port}", f"gkx-{uuid.uuid4().hex[:12]}")
    store.client().create_bucket(Bucket=store.bucket)
    try:
        yield store, server
    finally:
        servers.stop(server, timeout=30)


FUNCTIONS = ("f", "g", "h", "k")  # a program's functions, each one compile (a process here: conftest's InProcess.process)
MORE = (*FUNCTIONS, "more")  # one function more


def test_a_bucket_fills_a_fresh_local_level_which_keeps_it_and_a_stopped_server_costs_nothing(
        here: InProcess, tmp_path: Path, own_s3: tuple[S3, subprocess.Popen[bytes]]) -> None:
    """A cold run fills the bucket; a fresh local directory gets every hit from the bucket and holds
    them afterwards; with the server stopped, that directory serves every hit with no warning, and a
    cold local directory finishes with one."""
    s3, server = own_s3
    cold, err = here.run_program(levels_env(s3.env, s3.bucket, tmp_path / "a"), FUNCTIONS)
    assert cold["hits"] == 0 and not autocache_warnings(err), err
    uploaded = entries(s3, "team")
    assert set(uploaded) == local_entries(tmp_path / "a") and len(uploaded) == cold["requests"] == len(FUNCTIONS)
    seals = {k for k in s3.objects(f"team/{VERSION_DIR}/") if k.endswith("-gkx-shared")}
    assert len(seals) == len(uploaded)

    fresh, err = here.run_program(levels_env(s3.env, s3.bucket, tmp_path / "b"), FUNCTIONS)
    assert fresh["hits"] == fresh["requests"] == cold["requests"] and fresh["result"] == cold["result"]
    assert report(err) == {"hits": cold["requests"], "local": 0, "shared": cold["requests"], "misses": 0}, err
    assert local_entries(tmp_path / "b") == set(uploaded)  # backfilled
    assert len(list((tmp_path / "b" / VERSION_DIR).glob("*-gkx-compile"))) == len(uploaded)  # time saved stays true

    server.terminate()
    server.wait(timeout=30)
    warm, err = here.run_program(levels_env(s3.env, s3.bucket, tmp_path / "b"), FUNCTIONS)
    assert warm["hits"] == warm["requests"] == cold["requests"] and not autocache_warnings(err), err
    assert report(err)["local"] == cold["requests"]
    dead, err = here.run_program(levels_env(s3.env, s3.bucket, tmp_path / "c"), FUNCTIONS)
    assert dead["hits"] == 0 and dead["result"] == cold["result"]
    (warning,) = autocache_warnings(err)
    assert "shared level" in warning and f"s3://{s3.bucket}/team" in warning, warning


def side_by_side(venv: Venv, envs: list[dict[str, str]]) -> list[tuple[float, str]]:
    """Run PROGRAM once per environment, all at once (so that another test running on the other core
    slows them alike): each run's wall time and stderr."""
    started = time.monotonic()
    procs = [subprocess.Popen([venv.python, "-c", PROGRAM], env={**venv.env, **env}, cwd=str(venv.home),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for env in envs]
    results = []
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        results.append((time.monotonic() - started, err))
    return results


@pytest.mark.parametrize("dribble", [False, True], ids=["never-answers", "a-byte-a-second"])
def test_a_silent_or_dribbling_server_costs_a_cold_run_one_timeout(tmp_path: Path, dribble: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that accepts and never answers, or answers a byte a second: a cold run's lookups and
    uploads, and its exit, cost one shared_timeout and a second in all, with one warning. (In
    process: a cold run's level is asked exactly this, a lookup then an upload a compile.)"""
    import warnings

    from gkx_autocache import _diagnostics
    from gkx_autocache._backends.choose import backend_for
    from gkx_autocache._shared.level import Level

    monkeypatch.setattr(_diagnostics, "_said", set())
    server = Silent(dribble=dribble)
    env = {**S3(server.endpoint, "x").env, "HOME": str(tmp_path)}
    url = "s3://bucket/team"
    level = Level(url, backend_for(url, "0.4.30", False, env), local=local_at(tmp_path / "local"), timeout=2.0,
                  writes=None, secret=None, origin="env GKX_JAX_CACHE_SHARED_TIMEOUT")
    started = time.monotonic()
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            level.uploads.start()
            for i in range(12):
                key = f"jit_f{i}-" + f"{i:064x}"
                assert level.read(key) == (None, None)
                level.put(key, b"\x78\x01" + b"x" * 5000, 0.5, written=time.time())
            level.finish()
        took = time.monotonic() - started
    finally:
        level.channel.backend.forget()
        server.close()
    (warning,) = [str(w.message) for w in said]
    assert "no progress for 2 s" in warning and "shared_timeout (env GKX_JAX_CACHE_SHARED_TIMEOUT)" in warning
    assert server.connections >= 1 and took <= 2 + 1, took


def test_a_baked_root_owned_directory_serves_a_user_who_cannot_write_it(public: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A root-owned read-only directory baked into an image, as `shared` for a non-root user: its
    entries are hits, new compiles land in the user's local directory, nothing is written to it."""
    here = InProcess(public, monkeypatch)  # where uid 65534 reaches it
    baked = public / "baked"
    cold, _ = here.run_program({"GKX_JAX_CACHE_DIR": str(baked)}, FUNCTIONS)  # built as the local level, at build time
    subprocess.run(["chmod", "-R", "a+rX", str(baked)], check=True)
    before = sorted((str(p), p.stat().st_mtime_ns) for p in baked.rglob("*"))
    home = public / "nobody"
    home.mkdir()
    os.chown(home, 65534, 65534)
    env = {"GKX_JAX_CACHE_DIR": str(home / "cache"), "GKX_JAX_CACHE_SHARED": str(baked), "GKX_JAX_CACHE_REPORT": "1"}
    warm, err = here.run_program(env, FUNCTIONS, user=65534)
    assert warm["hits"] == warm["requests"] == cold["requests"] and warm["result"] == cold["result"]
    assert report(err)["shared"] == cold["requests"] and not autocache_warnings(err), err
    assert local_entries(home / "cache") == {p.name for p in (baked / VERSION_DIR).glob("*-cache")}
    more, err = here.run_program(env, MORE, user=65534)
    assert more["requests"] - more["hits"] == 1 and not autocache_warnings(err), err
    assert len(local_entries(home / "cache")) == cold["requests"] + 1  # the new compile, in the user's own
    assert sorted((str(p), p.stat().st_mtime_ns) for p in baked.rglob("*")) == before
    mode = (home / "cache" / VERSION_DIR).stat().st_mode & 0o7777
    assert mode == 0o700, oct(mode)


def test_signed_entries_reach_only_readers_with_the_key(here: InProcess, tmp_path: Path, s3: S3) -> None:
    """A reader with the writer's key gets hits; a reader with another key, or with the key where
    an entry was planted unsigned, gets misses named `rejected: not signed`, and the run finishes;
    the key is never printed."""
    key_a = {"GKX_JAX_CACHE_SIGNING_KEY": KEY_A}
    cold, err = here.run_program(levels_env(s3.env, s3.bucket, tmp_path / "w", **key_a), FUNCTIONS)
    seal = json.loads(s3.client().get_object(Bucket=s3.bucket, Key=next(
        k for k in s3.objects(f"team/{VERSION_DIR}/") if k.endswith("-gkx-shared")))["Body"].read())
    assert len(seal["hmac"]) == 64 and KEY_A not in err
    same, err = here.run_program(levels_env(s3.env, s3.bucket, tmp_path / "r1", **key_a), FUNCTIONS)
    assert same["hits"] == same["requests"] == cold["requests"] and report(err)["shared"] == cold["requests"]
    other_env = levels_env(s3.env, s3.bucket, tmp_path / "r2", GKX_JAX_CACHE_SIGNING_KEY=KEY_B)
    other, err = here.run_program(other_env, FUNCTIONS)
    assert other["hits"] == 0 and other["result"] == cold["result"] and not autocache_warnings(err), err
    explained = json.loads(here.cli("--json", "explain", env=other_env).stdout)
    rejected = [g for g in explained["groups"] if g["cause"] == "rejected"]
    assert rejected and all(f["detail"].startswith("not signed") for f in rejected[0]["functions"]), explained

    # Planted: the same entries copied under another prefix, without their seals.
    for name in entries(s3, "team"):
        body = s3.client().get_object(Bucket=s3.bucket, Key=f"team/{VERSION_DIR}/{name}")["Body"].read()
        s3.client().put_object(Bucket=s3.bucket, Key=f"planted/{VERSION_DIR}/{name}", Body=body)
    planted_env = levels_env(s3.env, s3.bucket, tmp_path / "r3", prefix="planted", **key_a)
    planted, err = here.run_program(planted_env, FUNCTIONS)
    assert planted["hits"] == 0 and planted["result"] == cold["result"] and not autocache_warnings(err), err
    explained = json.loads(here.cli("--json", "explain", env=planted_env).stdout)
    assert {f["detail"] for g in explained["groups"] if g["cause"] == "rejected" for f in g["functions"]} == {"not signed"}
    unkeyed, _ = here.run_program(levels_env(s3.env, s3.bucket, tmp_path / "r4", prefix="planted2"), FUNCTIONS)
    assert unkeyed["hits"] == 0  # (another prefix: nothing there)
    for proc in (here.cli("status", env=planted_env), here.cli("--json", "status", env=planted_env)):
        assert KEY_A not in proc.stdout + proc.stderr and "set (env GKX_JAX_CACHE_SIGNING_KEY)" in proc.stdout
    # A reader without a key is served signed entries unchecked (the bucket's policy is its trust): status says so.
    keyless = json.loads(here.cli("--json", "status", env=levels_env(s3.env, s3.bucket, tmp_path / "r5")).stdout)
    assert keyless["levels"]["shared"]["signing"].startswith("not set, and this level's entries carry signatures")
    assert any("does not check them" in line for line in keyless["attention"]), keyless["attention"]


def test_without_a_key_an_unsigned_entry_is_served_and_a_signed_one_too(here: InProcess, tmp_path: Path, s3: S3) -> None:
    """Without a key nothing is checked but the entry's integrity: a bucket filled by stock JAX
    (a `dir = s3://…` user: each entry alone, no seal beside it) is served, and so is one a key
    holder signed."""
    cold, _ = here.run_program({"GKX_JAX_CACHE_DIR": str(tmp_path / "stock")}, FUNCTIONS)
    for entry in (tmp_path / "stock" / VERSION_DIR).glob("*-cache"):  # as stock JAX writes a bucket
        s3.client().put_object(Bucket=s3.bucket, Key=f"stock/{VERSION_DIR}/{entry.name}", Body=entry.read_bytes())
    assert len(entries(s3, "stock")) == cold["requests"] and not [k for k in s3.objects() if k.endswith("-gkx-shared")]
    served, err = here.run_program(levels_env(s3.env, s3.bucket, tmp_path / "r", prefix="stock"), FUNCTIONS)
    assert served["hits"] == served["requests"] and served["result"] == cold["result"], err
    assert report(err)["shared"] == cold["requests"], err
    status = json.loads(here.cli("--json", "status", env=levels_env(s3.env, s3.bucket, tmp_path / "r", prefix="stock")).stdout)
    assert status["levels"]["shared"]["signing"] == "not set: entries are neither signed nor checked", status["levels"]
    here.run_program(levels_env(s3.env, s3.bucket, tmp_path / "w", prefix="signed", GKX_JAX_CACHE_SIGNING_KEY=KEY_A),
                     FUNCTIONS)
    signed, err = here.run_program(levels_env(s3.env, s3.bucket, tmp_path / "r2", prefix="signed"), FUNCTIONS)
    assert signed["hits"] == signed["requests"] and report(err)["shared"] == cold["requests"], err


def run_ranks(venv: Venv, envs: list[dict[str, str]]) -> list[dict[str, int]]:
    """Both ranks at once, each with its own environment; each rank's `report` numbers."""
    port = str(free_port())
    procs = [subprocess.Popen([venv.python, "-c", RANK, str(rank), port], env={**venv.env, **envs[rank]},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(venv.home))
             for rank in (0, 1)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1])["result"] > 0
        results.append(report(err))
    return results


def test_rank_1_reads_its_own_local_level_on_its_second_run(venv: Venv, tmp_path: Path, s3: S3) -> None:
    """Two `jax.distributed` ranks, each with its own local level and one bucket: process 0 alone
    writes the bucket (JAX's rule), every rank writes its own local level, so rank 1 reads
    locally on its second run (on CPU its keys differ from rank 0's: its devices are in them)."""
    envs = [levels_env(s3.env, s3.bucket, tmp_path / f"rank{rank}") for rank in (0, 1)]
    first = run_ranks(venv, envs)
    assert first[0]["hits"] == first[1]["hits"] == 0 and first[1]["misses"] > 0
    assert set(entries(s3, "team")) == local_entries(tmp_path / "rank0")  # rank 0's alone
    assert local_entries(tmp_path / "rank1") and not local_entries(tmp_path / "rank1") & set(entries(s3, "team"))
    second = run_ranks(venv, envs)
    assert second[1] == {"hits": first[1]["misses"], "local": first[1]["misses"], "shared": 0, "misses": 0}, second
    assert second[0]["hits"] == second[0]["local"] == first[0]["misses"]


FORK_POOL = r"""
import json, multiprocessing, os, sys, time
import jax, jax.numpy as jnp
fs = [jax.jit(lambda v, i=i: jnp.sin(v) * i + jnp.cos(v) ** i) for i in range(1, 9)]
parent = [float(f(jnp.ones(16)).sum()) for f in fs]  # 8 uploads queued, a slow bucket: in flight at the fork
def work(i):  # no JAX after a fork: XLA's threads do not survive it (JAX warns); the package's must not matter
    return sum(k * i for k in range(100000))
with multiprocessing.get_context("fork").Pool(2) as pool:  # its workers end by os._exit
    children = pool.map(work, range(4))
started = time.monotonic()
pid = os.fork()
if pid == 0:  # a child that exits normally runs the at-exit hooks: it has no uploads of its own to wait for
    sys.exit(0)
os.waitpid(pid, 0)
print(json.dumps({"parent": parent, "children": children, "child_exit": time.monotonic() - started}))
"""


def test_a_fork_with_uploads_in_flight(venv: Venv, tmp_path: Path, s3: S3, s3_server: str) -> None:
    """A multiprocessing pool and a plain child forked while uploads are in flight: no deadlock, no
    upload made twice (a child does not inherit the queue), a child's exit does not wait for its
    parent's uploads, and every upload lands whole (no object without its seal, none whose bytes
    differ from its seal); a fresh local level is then served from the bucket."""
    proxy = Proxy(int(s3_server.rsplit(":", 1)[1]), delay=0.3)
    try:
        env = levels_env({**s3.env, "AWS_ENDPOINT_URL": proxy.endpoint}, s3.bucket, tmp_path / "a")
        proc = venv.run("-c", FORK_POOL, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        first = json.loads(proc.stdout.strip().splitlines()[-1])
        assert not autocache_warnings(proc.stderr), proc.stderr
    finally:
        proxy.close()
    assert first["child_exit"] < 5, first
    client = s3.client()
    uploaded = entries(s3, "team")
    assert len(uploaded) >= 8
    puts = [p for m, p in proxy.requests if m == "PUT" and not p.endswith(("-gkx-manifest", "-gkx-pack"))]
    assert len(puts) == len(set(puts)) == 2 * len(uploaded), puts  # each seal and entry once
    manifests = [p for m, p in proxy.requests if m == "PUT" and p.endswith(("-gkx-manifest", "-gkx-pack"))]
    assert len(manifests) == 2, manifests  # the parent's and its pack: a forked child's run is part of its parent's
    for name in uploaded:
        key = name.removesuffix("-cache")
        body = client.get_object(Bucket=s3.bucket, Key=f"team/{VERSION_DIR}/{name}")["Body"].read()
        seal = json.loads(client.get_object(Bucket=s3.bucket, Key=f"team/{VERSION_DIR}/{key}-gkx-shared")["Body"].read())
        assert seal["bytes"] == len(body) and seal["sha256"] == hashlib.sha256(body).hexdigest()
    proc = venv.run("-c", FORK_POOL, env=levels_env(s3.env, s3.bucket, tmp_path / "b"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    again = json.loads(proc.stdout.strip().splitlines()[-1])
    assert again["parent"] == first["parent"] and again["children"] == first["children"]
    assert report(proc.stderr)["shared"] == len(uploaded), proc.stderr


def through_a_proxy(here: InProcess, s3: S3, s3_server: str, local: Path) -> tuple[dict[str, Any], str, list[tuple[str, str]]]:
    """A run of the program with the bucket behind a recording proxy: its output, its stderr, and
    every request the bucket was asked (method, path)."""
    proxy = Proxy(int(s3_server.rsplit(":", 1)[1]))
    try:
        out, err = here.run_program(levels_env({**s3.env, "AWS_ENDPOINT_URL": proxy.endpoint}, s3.bucket, local), FUNCTIONS)
    finally:
        proxy.close()
    return out, err, proxy.requests


def test_a_cold_run_against_an_empty_bucket_lists_once(here: InProcess, tmp_path: Path, s3: S3, s3_server: str) -> None:
    """A cold run against a live, empty bucket asks it one listing, not a read per miss (nor its
    manifest: the listing says there is none); its only other requests are the uploads (a seal and
    an entry each) and, at exit, its manifest and pack for the next fresh machine."""
    out, err, requests = through_a_proxy(here, s3, s3_server, tmp_path / "a")
    gets = [(m, p) for m, p in requests if m in ("GET", "HEAD")]
    puts = [p for m, p in requests if m == "PUT" and not p.endswith(("-gkx-manifest", "-gkx-pack"))]
    manifests = [p for m, p in requests if m == "PUT" and p.endswith("-gkx-manifest")]
    packs = [p for m, p in requests if m == "PUT" and p.endswith("-gkx-pack")]
    assert len(gets) == 1 and "list-type=2" in gets[0][1], requests
    assert len(puts) == 2 * out["requests"] and out["hits"] == 0 and len(manifests) == len(packs) == 1, requests


@pytest.mark.parametrize("mode", ["truncate", "short", "long", "lie"])
def test_a_bucket_that_lies_never_gets_an_entry_loaded(here: InProcess, tmp_path: Path, s3: S3, s3_server: str,
                                                      mode: str) -> None:
    """A bucket that cuts bodies short, says a smaller or larger size than it sends, or sends other
    bytes: no entry it serves is loaded; the run finishes with the right result."""
    cold, _ = here.run_program(levels_env(s3.env, s3.bucket, tmp_path / "w"), FUNCTIONS)
    assert drop_packs(s3) == 1  # each entry's own reads (a pack's lies: test_prefetch)
    proxy = Proxy(int(s3_server.rsplit(":", 1)[1]), mode=mode)
    try:
        env = levels_env({**s3.env, "AWS_ENDPOINT_URL": proxy.endpoint}, s3.bucket, tmp_path / "r")
        out, err = here.run_program(env, FUNCTIONS)
    finally:
        proxy.close()
    assert any(p.split("?")[0].endswith("-cache") for m, p in proxy.requests if m == "GET"), proxy.requests  # it was read
    assert out["hits"] == 0 and out["result"] == cold["result"], err
    assert report(err)["shared"] == 0
    assert len(autocache_warnings(err)) <= 1, err  # a connection cut mid-body is an error: the level turns off
    honest, err = here.run_program(levels_env(s3.env, s3.bucket, tmp_path / "control"), FUNCTIONS)
    assert honest["hits"] == honest["requests"] == cold["requests"], err  # the entries were fine all along


def test_planted_objects_that_do_not_match_their_seal_are_never_loaded(here: InProcess, tmp_path: Path, s3: S3) -> None:
    """Objects swapped between keys, truncated in place, or grown: their seals say otherwise, so
    they are misses named `rejected`; the run finishes with the right result."""
    cold, _ = here.run_program(levels_env(s3.env, s3.bucket, tmp_path / "w"), FUNCTIONS)
    client = s3.client()
    names = sorted(entries(s3, "team"))
    bodies = {n: client.get_object(Bucket=s3.bucket, Key=f"team/{VERSION_DIR}/{n}")["Body"].read() for n in names}
    spoiled = [bodies[names[1]], bodies[names[0]][: len(bodies[names[0]]) // 2]] + [bodies[n] + b"\0" for n in names[2:]]
    for name, body in zip(names, spoiled, strict=True):
        client.put_object(Bucket=s3.bucket, Key=f"team/{VERSION_DIR}/{name}", Body=body)
    assert drop_packs(s3) == 1  # its sound copies would be served: each entry's own reads are tested here
    env = levels_env(s3.env, s3.bucket, tmp_path / "r")
    out, err = here.run_program(env, FUNCTIONS)
    assert out["hits"] == 0 and out["result"] == cold["result"] and not autocache_warnings(err), err
    explained = json.loads(here.cli("--json", "explain", env=env).stdout)
    (rejected,) = [g for g in explained["groups"] if g["cause"] == "rejected"]
    assert rejected["count"] == len(names) == len(FUNCTIONS), explained


def test_pending_uploads_get_one_timeout_at_exit(here: InProcess, tmp_path: Path, s3: S3, s3_server: str) -> None:
    """Uploads still pending at exit get one shared_timeout in all: the rest are dropped, counted,
    with one warning, and the process does not wait for them. Each request is slowed by 0.6 s, well
    inside the 3 s timeout (at 0.4 s against 1.5 s, a busy CI machine's bucket once took longer than
    the timeout for one request, and the level turned off during the run instead)."""
    proxy = Proxy(int(s3_server.rsplit(":", 1)[1]), delay=0.6)
    try:
        env = levels_env({**s3.env, "AWS_ENDPOINT_URL": proxy.endpoint}, s3.bucket, tmp_path / "a",
                         GKX_JAX_CACHE_SHARED_TIMEOUT="3")
        started = time.monotonic()
        out, err = here.run_program(env, tuple(f"f{i}" for i in range(8)))  # 8 uploads queued: 16 requests
        seconds = time.monotonic() - started
    finally:
        proxy.close()
    (warning,) = autocache_warnings(err)
    assert "dropped at exit" in warning and "shared_timeout (3 s, env GKX_JAX_CACHE_SHARED_TIMEOUT)" in warning
    stats = json.loads(here.cli("--json", "stats", env=env).stdout)
    shared = stats["levels"]["shared"]
    assert shared["dropped"] > 0 and shared["uploads"] + shared["dropped"] >= 8, shared
    assert shared["uploads"] <= len(entries(s3, "team")) <= shared["uploads"] + 1  # (+1: the one in flight at exit)
    assert seconds < 60


def test_status_shows_both_levels_and_its_probe_is_bounded(here: InProcess, tmp_path: Path, s3: S3) -> None:
    """`status` shows both levels with their trust, whether uploads happen, the signing state, and
    whether the shared level answers (a probe bounded by the timeout; `--no-probe` skips it)."""
    # What a writer's finished run leaves: its local level, and its two entries in the bucket.
    for entry in sorted(planted_run(tmp_path / "a").glob("*-cache")):
        s3.client().put_object(Bucket=s3.bucket, Key=f"team/{VERSION_DIR}/{entry.name}", Body=entry.read_bytes())
    env = levels_env(s3.env, s3.bucket, tmp_path / "a", GKX_JAX_CACHE_SHARED_WRITE="ci")
    data = json.loads(here.cli("--json", "status", env=env).stdout)
    shared = data["levels"]["shared"]
    assert shared["url"] == f"s3://{s3.bucket}/team" and shared["origin"] == "env GKX_JAX_CACHE_SHARED"
    assert shared["probe"]["answers"] is True and shared["probe"]["entries"] >= 2
    assert "CI is not set" in shared["writes"] and shared["signing"].startswith("not set")
    assert data["settings"]["shared_timeout"] == {"value": 10.0, "origin": "default", "effective": "10.0"}
    assert data["settings"]["shared_write"]["origin"] == "env GKX_JAX_CACHE_SHARED_WRITE"
    text = here.cli("status", env=env).stdout
    assert "levels" in text and "shared   s3://" in text and "answers" in text, text
    assert "skipped (--no-probe)" in here.cli("status", "--no-probe", env=env).stdout
    server = Silent()
    try:
        silent = {**env, **S3(server.endpoint, "x").env, "GKX_JAX_CACHE_SHARED_TIMEOUT": "1"}
        started = time.monotonic()
        data = json.loads(here.cli("--json", "status", env=silent).stdout)
        assert time.monotonic() - started < 15
        assert data["levels"]["shared"]["probe"]["answers"] is False
    finally:
        server.close()


def test_stats_json_has_both_levels_at_its_top(here: InProcess, tmp_path: Path, s3: S3) -> None:
    """`stats --json` has `levels.local` and `levels.shared` at its top, summed over processes:
    hits, misses, backfills, uploads, errors, timeouts, bytes and the mean read time."""
    env_a = levels_env(s3.env, s3.bucket, tmp_path / "a")
    cold, _ = here.run_program(env_a, FUNCTIONS)
    env_b = levels_env(s3.env, s3.bucket, tmp_path / "b")
    here.run_program(env_b, FUNCTIONS)
    here.run_program(env_b, FUNCTIONS)
    levels = json.loads(here.cli("--json", "stats", env=env_b).stdout)["levels"]
    n = cold["requests"]
    assert levels["shared"]["hits"] == levels["shared"]["backfills"] == n and levels["local"]["hits"] == n
    assert levels["local"]["misses"] == n and levels["shared"]["mean_read_secs"] > 0
    assert levels["local"]["mean_read_secs"] > 0 and levels["shared"]["bytes_read"] > 0
    assert {"uploads", "errors", "timeouts", "bytes_written"} <= set(levels["shared"])
    uploads = json.loads(here.cli("--json", "stats", env=env_a).stdout)["levels"]["shared"]
    assert uploads["uploads"] == n and uploads["misses"] == n and uploads["bytes_written"] > 0
    text = here.cli("stats", env=env_b).stdout
    assert f"levels      local {n} hits" in text and f"shared {n} hits" in text, text


def uploaded(s3: S3, vdir: Path) -> int:
    """Put the entries of a planted run's version directory ``vdir`` in the bucket's ``team`` level
    as its writer's uploads leave them (each entry, and its seal beside it); how many."""
    names = sorted(p.name for p in vdir.glob("*-cache"))
    for name in names:
        key = name.removesuffix("-cache")
        s3.client().put_object(Bucket=s3.bucket, Key=f"team/{VERSION_DIR}/{key}-gkx-shared", Body=b"{}")
        s3.client().put_object(Bucket=s3.bucket, Key=f"team/{VERSION_DIR}/{name}", Body=(vdir / name).read_bytes())
    return len(names)


def test_prune_and_clear_shared_act_on_the_bucket(here: InProcess, tmp_path: Path, s3: S3) -> None:
    """`prune --shared` and `clear --shared` act on the shared level (entries and their sidecars
    only), say that it has no cap of its own, and leave the local level alone."""
    env = levels_env(s3.env, s3.bucket, tmp_path / "a")
    requests = uploaded(s3, planted_run(tmp_path / "a"))  # a writer's finished cold run
    s3.client().put_object(Bucket=s3.bucket, Key=f"team/{VERSION_DIR}/notes.txt", Body=b"mine")
    proc = here.cli("prune", "--shared", env=env)
    assert proc.returncode == 2 and "no cap of its own" in proc.stderr and "lifecycle" in proc.stderr, proc.stderr
    dry = json.loads(here.cli("--json", "prune", "--shared", "--max-size", "1", "--dry-run", env=env).stdout)
    assert dry["entries"] == requests and dry["files"] == 2 * requests
    assert json.loads(here.cli("--json", "prune", "--shared", "--max-size", "1", env=env).stdout)["dir"].startswith("s3://")
    assert entries(s3, "team") == {} and f"team/{VERSION_DIR}/notes.txt" in s3.objects()
    assert len(local_entries(tmp_path / "a")) == requests
    uploaded(s3, planted_run(tmp_path / "b"))  # another machine's run uploads them again
    cleared = json.loads(here.cli("--json", "clear", "--shared", "--yes", env=env).stdout)
    left = {k for k in s3.objects() if not k.endswith(("-gkx-manifest", "-gkx-pack"))}  # their records need listed entries
    assert cleared["entries"] == requests and left == {f"team/{VERSION_DIR}/notes.txt"}
    assert len(local_entries(tmp_path / "a")) == requests
    assert here.cli("clear", "--shared", "--yes", env={"GKX_JAX_CACHE_DIR": str(tmp_path / "a")}).returncode == 1


def test_explain_says_the_shared_level_was_off(here: InProcess, tmp_path: Path) -> None:
    """Misses after the shared level turned off are explained with what turned it off, and when."""
    env = levels_env(S3(f"http://127.0.0.1:{free_port()}", "x").env, "nowhere", tmp_path / "a",
                     GKX_JAX_CACHE_SHARED_TIMEOUT="3")
    out, err = here.run_program(env, FUNCTIONS)
    assert out["hits"] == 0 and len(autocache_warnings(err)) == 1, err
    explained = json.loads(here.cli("--json", "explain", env=env).stdout)
    details = [f["detail"] for g in explained["groups"] if not g["cause"].startswith("not cached") for f in g["functions"]]
    assert len(details) == len(FUNCTIONS), explained
    assert all("may have been served by the shared level, which was off after" in d for d in details), details
    assert all(re.search(r" at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", d) for d in details), details


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("GKX_JAX_CACHE_SHARED", "ftp://host/cache", "gs://bucket, s3://bucket, az://container or https:// URL"),
    ("GKX_JAX_CACHE_SHARED_TIMEOUT", "0", "above 0"),
    ("GKX_JAX_CACHE_SHARED_TIMEOUT", "nan", "above 0"),
    ("GKX_JAX_CACHE_SHARED_TIMEOUT", "1e12", "above 0"),
    ("GKX_JAX_CACHE_SHARED_TIMEOUT", "-3", "above 0"),
    ("GKX_JAX_CACHE_SHARED_WRITE", "sometimes", "always, ci, never"),
])
def test_a_bad_shared_value_is_one_line_and_the_next_source_applies(variable: str, value: str, says: str) -> None:
    """A bad `shared`, `shared_timeout` or `shared_write` is skipped with one line naming the source
    and the key; the default (or the next source down) applies."""
    settings = _settings.resolve({variable: value}, prefix="/nonexistent", user_file="/nonexistent/c.toml")
    ((cause, message),) = settings.problems
    assert variable in message and says in message and "\n" not in message
    key = {"GKX_JAX_CACHE_SHARED": "shared", "GKX_JAX_CACHE_SHARED_TIMEOUT": "shared_timeout",
           "GKX_JAX_CACHE_SHARED_WRITE": "shared_write"}[variable]
    assert settings.origin(key) == "default"


def test_a_relative_shared_is_taken_as_dir_is(tmp_path: Path) -> None:
    """A relative `shared` is relative to the settings file's folder, or to the current directory
    for the environment variable, as `dir` is (§3)."""
    settings = _settings.resolve({"GKX_JAX_CACHE_SHARED": "team/cache"}, prefix="/nonexistent",
                                 user_file="/nonexistent/c.toml", cwd=str(tmp_path))
    assert settings["shared"] == str(tmp_path / "team" / "cache")
    (tmp_path / "gkx-autocache.toml").write_text('shared = "../baked"\n')
    settings = _settings.resolve({}, prefix=str(tmp_path), user_file="/nonexistent/c.toml", cwd="/")
    assert settings["shared"] == str(tmp_path.parent / "baked")


def test_shared_with_a_bucket_dir_or_equal_to_dir_is_one_line_and_the_run_goes_on(here: InProcess, tmp_path: Path,
                                                                                  s3: S3) -> None:
    """`dir` itself a bucket together with `shared`, or `shared` the same directory as `dir`: one
    line each, and the run goes on cached as before."""
    env = {**s3.env, "GKX_JAX_CACHE_DIR": f"s3://{s3.bucket}/stock", "GKX_JAX_CACHE_SHARED": f"s3://{s3.bucket}/team"}
    out, err = here.run_program(env, FUNCTIONS)
    (warning,) = autocache_warnings(err)
    assert "dir is itself a bucket" in warning and out["dir"].startswith("s3://")
    same = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_SHARED": str(tmp_path / "c" / ".")}
    out, err = here.run_program(same, FUNCTIONS)
    (warning,) = autocache_warnings(err)
    assert "same directory as dir" in warning and out["dir"] == str(tmp_path / "c" / VERSION_DIR)
    again, err = here.run_program(same, FUNCTIONS)
    assert again["hits"] == again["requests"] == len(FUNCTIONS)


def test_the_signing_key_is_never_a_setting(here: InProcess) -> None:
    """`config set` refuses the signing key (a secret lives in the environment, never in a file)
    without echoing it, and a settings file that holds one is ignored for that key, with one line
    that does not show it."""
    for name in ("signing_key", "GKX_JAX_CACHE_SIGNING_KEY"):
        proc = here.cli("config", "set", name, KEY_A)
        assert proc.returncode == 2 and "GKX_JAX_CACHE_SIGNING_KEY" in proc.stderr and KEY_A not in proc.stderr
    (here.path / "gkx-autocache.toml").write_text(f'signing_key = "{KEY_A}"\n')
    proc = here.cli("--json", "status")
    attention = json.loads(proc.stdout)["attention"]
    assert any("signing_key skipped" in a for a in attention) and KEY_A not in proc.stdout + proc.stderr
    assert _settings.signing_key({"GKX_JAX_CACHE_SIGNING_KEY": " k\u00e9y "}) == " k\u00e9y ".encode()
    assert _settings.signing_key({"GKX_JAX_CACHE_SIGNING_KEY": ""}) is None


def test_the_upload_queue_is_bounded_in_bytes(tmp_path: Path) -> None:
    """An entry that would take the queue past its bound is skipped and counted, not waited for;
    the rest are uploaded to a real directory, each with its seal, and none is partial. The
    directory's writes wait on a gate until every entry is offered, so the worker cannot drain the
    queue in between (on a fast machine it did, and nothing was skipped)."""
    import threading

    from gkx_autocache._backends import directory as _directory
    from gkx_autocache._shared import level as _levels

    gate = threading.Event()

    class Gated(_directory.Directory):
        def write(self, name: str, data: bytes) -> None:
            gate.wait(10)
            super().write(name, data)

    shared = tmp_path / "team"
    shared.mkdir(mode=0o700)
    level = _levels.Level(str(shared), Gated(str(shared), "0.0.0", team=False), local=local_at(tmp_path),
                          timeout=20.0, writes=None, secret=None, queue_bytes=3000)
    for i in range(6):
        level.put(f"jit_f-{i:064x}", bytes([i]) * 1000, 0.5)
    gate.set()
    level.finish()
    counts = level.snapshot()
    assert counts["uploads"] == 3 and counts["skipped"] == 3, counts
    found = sorted(p.name for p in (shared / "jax-0.0.0").iterdir() if p.name.endswith("-cache"))
    assert len(found) == counts["uploads"]
    for name in found:
        key = name.removesuffix("-cache")
        seal = json.loads((shared / "jax-0.0.0" / f"{key}-gkx-shared").read_text())
        assert seal["sha256"] == hashlib.sha256((shared / "jax-0.0.0" / name).read_bytes()).hexdigest()


def test_a_team_shared_directory_keeps_the_local_level_private(public: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`trust_shared` with a team directory as `shared` governs that level: members share it, while
    each member's own local level stays private (0700, entries 0600)."""
    here = InProcess(public, monkeypatch)  # where the members reach it
    team = public / "team"
    team.mkdir()
    os.chown(team, 0, 4242)
    team.chmod(0o2770)
    homes = {}
    for uid in (4243, 4244):
        homes[uid] = public / f"home{uid}"
        homes[uid].mkdir()
        os.chown(homes[uid], uid, uid)
    env = {"GKX_JAX_CACHE_SHARED": str(team), "GKX_JAX_CACHE_TRUST_SHARED": "1", "GKX_JAX_CACHE_REPORT": "1"}
    first, err = here.run_program({**env, "GKX_JAX_CACHE_DIR": str(homes[4243] / "c")}, FUNCTIONS, user=4243, groups=(4242,))
    assert first["hits"] == 0 and not autocache_warnings(err), err
    second, err = here.run_program({**env, "GKX_JAX_CACHE_DIR": str(homes[4244] / "c")}, FUNCTIONS, user=4244,
                                   groups=(4242,))
    assert second["hits"] == second["requests"] == len(FUNCTIONS) and report(err)["shared"] == second["requests"], err
    vdir = homes[4244] / "c" / VERSION_DIR
    assert vdir.stat().st_mode & 0o7777 == 0o700
    assert {p.stat().st_mode & 0o777 for p in vdir.glob("*-cache")} == {0o600}
    assert {p.stat().st_mode & 0o777 for p in (team / VERSION_DIR).glob("*-cache")} == {0o660}


def test_two_local_paths_share_the_buckets_entries_where_jax_leaves_the_path_out(venv: Venv, tmp_path: Path,
                                                                                s3: S3) -> None:
    """With XLA's GPU autotune cache on (JAX's default where a GPU plugin is installed), its path,
    the local level's, is in the key on JAX 0.10 and left out from JAX 0.11 on: two local paths
    share the bucket's entries on 0.12, and only the same path does on 0.10 (the README says so)."""
    import importlib.metadata

    on = {"GKX_JAX_CACHE_XLA_CACHES": "xla_gpu_per_fusion_autotune_cache_dir"}
    cold, _ = run_program(venv, env=levels_env(s3.env, s3.bucket, tmp_path / "a", **on))
    assert cold["xla_caches"] == "xla_gpu_per_fusion_autotune_cache_dir"
    other, err = run_program(venv, env=levels_env(s3.env, s3.bucket, tmp_path / "b", **on))
    major, minor = (int(part) for part in importlib.metadata.version("jax").split(".")[:2])
    if (major, minor) >= (0, 11):
        assert other["hits"] == other["requests"] == cold["requests"] and report(err)["shared"] == cold["requests"]
    else:
        assert report(err)["shared"] < cold["requests"] // 2, err  # the user's functions miss: the path is in their keys
    subprocess.run(["rm", "-rf", str(tmp_path / "a")], check=True)  # the same path, emptied: served from the bucket
    same, err = run_program(venv, env=levels_env(s3.env, s3.bucket, tmp_path / "a", **on))
    assert same["hits"] == same["requests"] == cold["requests"] and report(err)["shared"] == cold["requests"], err


PYTEST_PROJECT = """
import jax, jax.numpy as jnp, pytest

@pytest.mark.parametrize("scale", [1.0, 2.0, 3.0])
def test_tanh(scale):
    assert float(jax.jit(lambda v: jnp.tanh(v * scale).sum())(jnp.ones(8))) > 0
"""


def test_the_pytest_line_splits_hits_by_level(venv: Venv, tmp_path: Path, s3: S3) -> None:
    """The pytest plugin's one line sums every worker's per-level hits: a session with a fresh local
    level says how many hits came from the bucket."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "test_model.py").write_text(PYTEST_PROJECT)
    (proj / "pytest.ini").write_text("[pytest]\nfilterwarnings =\n    error\naddopts = -p xdist\n")

    def session(local: str) -> str:
        proc = venv.run("-m", "pytest", "-n", "2", "-p", "no:cacheprovider", str(proj), cwd=str(proj), timeout=600,
                        env=levels_env(s3.env, s3.bucket, tmp_path / local))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        (line,) = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("gkx-autocache:")]
        return line

    cold = report(session("a"))  # (its two workers may serve each other already, through the bucket)
    warm = report(session("b"))
    assert cold["misses"] > 0 and warm["misses"] == 0, (cold, warm)
    assert warm["shared"] > 0 and warm["local"] + warm["shared"] == warm["hits"] >= 3, warm


def test_shared_write_says_which_runs_upload(here: InProcess, tmp_path: Path, s3: S3) -> None:
    """`shared_write = never` never uploads; `ci` uploads only where `CI` is set to a true value
    (CI as the one trusted writer); every run writes its local level all the same."""
    cases = [("never", {}, False), ("ci", {}, False), ("ci", {"CI": "false"}, False), ("ci", {"CI": "true"}, True),
             ("always", {}, True)]
    for i, (setting, ci, uploads) in enumerate(cases):
        env = levels_env(s3.env, s3.bucket, tmp_path / f"l{i}", prefix=f"p{i}", GKX_JAX_CACHE_SHARED_WRITE=setting, **ci)
        out, err = here.run_program(env, FUNCTIONS)
        assert len(local_entries(tmp_path / f"l{i}")) == out["requests"] == len(FUNCTIONS) and not autocache_warnings(err), err
        assert len(entries(s3, f"p{i}")) == (out["requests"] if uploads else 0), (setting, ci)


def test_a_full_or_read_only_local_level_is_served_without_the_backfill(public: Path, s3: S3,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A local level that cannot take the entry (a full file system; a directory the user cannot
    write) is served from the shared level all the same, without the backfill and without a
    warning."""
    here = InProcess(public, monkeypatch)  # where uid 65534 reaches it
    cold, _ = here.run_program(levels_env(s3.env, s3.bucket, public / "w"), FUNCTIONS, size=20_000)
    full = public / "full"
    full.mkdir()

    def on_a_full_file_system() -> tuple[dict[str, Any], str, set[str]]:  # (in the child's own mount namespace)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k,mode=700", "gkx-full", str(full)], check=True)
        out, err = here.run_program(levels_env(s3.env, s3.bucket, full), FUNCTIONS, size=20_000)
        return out, err, local_entries(full)

    out, err, kept = cast(tuple[dict[str, Any], str, set[str]], in_a_child_as(0, (), on_a_full_file_system))
    assert out["hits"] == out["requests"] == cold["requests"] and not autocache_warnings(err), err
    assert report(err)["shared"] == cold["requests"] and out["result"] == cold["result"]
    assert not kept, kept  # no 20 kB entry fits in 8 kB: none was backfilled
    readonly = public / "readonly"
    here.run_program({"GKX_JAX_CACHE_DIR": str(readonly)}, ("f:changed",))  # root's, with one entry of its own
    subprocess.run(["chmod", "-R", "a+rX", str(readonly)], check=True)
    before = local_entries(readonly)
    out, err = here.run_program(levels_env(s3.env, s3.bucket, readonly), FUNCTIONS, user=65534, size=20_000)
    assert out["hits"] == out["requests"] == cold["requests"] and not autocache_warnings(err), err
    assert report(err)["shared"] == cold["requests"] - len(before & set(entries(s3, "team")))
    assert local_entries(readonly) == before


def hostile_level(tmp_path: Path, secret: bytes | None = None) -> tuple[Any, Path]:
    from gkx_autocache._backends import directory as _directory
    from gkx_autocache._shared import level as _levels

    root = tmp_path / "team"
    (root / "jax-0.0.0").mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    level = _levels.Level(str(root), _directory.Directory(str(root), "0.0.0", team=False), local=local_at(tmp_path / "l"),
                          timeout=5.0, writes=None, secret=secret)
    return level, root / "jax-0.0.0"


GOOD, OTHER_KEY = f"jit_f-{'a' * 64}", f"jit_g-{'b' * 64}"


@pytest.mark.parametrize("spoil", ["deep json", "huge size", "boolean size", "not an object", "another key",
                                   "a symlinked entry", "a fifo", "writable by others", "moved signed seal",
                                   "a compile time of a century", "a non-ASCII signature", "a non-ASCII digest",
                                   "an empty unsealed entry"])
def test_a_hostile_shared_directory_entry_is_refused_and_never_hangs(tmp_path: Path, spoil: str) -> None:
    """Entries and seals a group member or a bucket could plant are refused one by one, each a
    `rejected` miss with its reason (or served, where only a figure in the seal is absurd); none
    turns the level off, hangs, or raises."""
    from gkx_autocache._entry import Entry as Found
    from gkx_autocache._shared import seal as _seal

    secret = b"k" if spoil in ("moved signed seal", "a non-ASCII signature") else None
    level, vdir = hostile_level(tmp_path, secret)
    data = b"\x78\x9c" + b"entry" * 100
    seal = json.loads(_seal.make_seal(GOOD, data, 0.5, time.time(), secret))
    (vdir / f"{GOOD}-cache").write_bytes(data)
    if spoil == "deep json":
        (vdir / f"{GOOD}-gkx-shared").write_text("[" * 100000 + "]" * 100000)
    elif spoil in ("huge size", "boolean size", "another key", "a compile time of a century"):
        seal.update({"huge size": {"bytes": 1 << 62}, "boolean size": {"bytes": True}, "another key": {"key": OTHER_KEY},
                     "a compile time of a century": {"compile": 3.2e9}}[spoil])
        (vdir / f"{GOOD}-gkx-shared").write_text(json.dumps(seal))
    elif spoil == "not an object":
        (vdir / f"{GOOD}-gkx-shared").write_text("[1, 2]")
    elif spoil in ("a non-ASCII signature", "a non-ASCII digest"):  # compare_digest raises on such strings
        seal["hmac" if spoil == "a non-ASCII signature" else "sha256"] = "\u00e9" * 64
        (vdir / f"{GOOD}-gkx-shared").write_text(json.dumps(seal))
    elif spoil == "a symlinked entry":
        (vdir / f"{GOOD}-cache").unlink()
        (tmp_path / "elsewhere").write_bytes(data)
        (vdir / f"{GOOD}-cache").symlink_to(tmp_path / "elsewhere")
    elif spoil == "a fifo":
        (vdir / f"{GOOD}-cache").unlink()
        os.mkfifo(vdir / f"{GOOD}-cache")
    elif spoil == "writable by others":
        (vdir / f"{GOOD}-cache").chmod(0o666)
    elif spoil == "an empty unsealed entry":  # no first block, so no head check: served and backfilled
        (vdir / f"{GOOD}-cache").write_bytes(b"")
    elif spoil == "moved signed seal":  # a validly signed entry of another key, moved to this one
        moved = json.loads(_seal.make_seal(OTHER_KEY, data, 0.5, time.time(), secret))
        (vdir / f"{GOOD}-gkx-shared").write_text(json.dumps(moved))
    started = time.monotonic()
    answer = level.read(GOOD)
    got = answer.found if answer.found is not None else answer.refused
    assert time.monotonic() - started < 3 and level.channel.off is None
    if spoil == "a compile time of a century":
        assert isinstance(got, Found) and got.data == data and got.compile_secs is None
    else:
        assert isinstance(got, str) and got, got
        assert level.snapshot()["rejected"] == 1


def test_a_bucket_with_more_names_than_one_listing_is_asked_key_by_key(here: InProcess, tmp_path: Path, s3: S3,
                                                                      s3_server: str) -> None:
    """A version prefix with more than 1000 names is not listed again: each miss asks for its key,
    and every compile is still uploaded and then served."""
    client = s3.client()
    for i in range(1001):
        client.put_object(Bucket=s3.bucket, Key=f"team/{VERSION_DIR}/jit_other-{i:064x}-cache", Body=b"x")
    out, err, requests = through_a_proxy(here, s3, s3_server, tmp_path / "a")
    listings = [p for m, p in requests if m == "GET" and "list-type=2" in p]
    reads = [p for m, p in requests if m == "GET" and p.split("?")[0].endswith("-cache")]
    assert len(listings) >= 1 and len(reads) == out["requests"] == len(FUNCTIONS), requests[:5]
    warm, err = here.run_program(levels_env(s3.env, s3.bucket, tmp_path / "b"), FUNCTIONS)
    assert warm["hits"] == warm["requests"] and report(err)["shared"] == warm["requests"], err


def test_a_bucket_without_the_remote_extra_is_one_line_and_the_local_level_serves(here: InProcess, tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Without `gkx-autocache[remote]`, a bucket as `shared` costs one warning naming the extra;
    the local level works as before."""
    from conftest import REMOTE_EXTRA

    for name in REMOTE_EXTRA:  # as an environment without them: not found, not importable
        monkeypatch.setitem(sys.modules, name, None)
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "c"), "GKX_JAX_CACHE_SHARED": "s3://some-bucket/cache"}
    out, err = here.run_program(env, FUNCTIONS)
    (warning,) = autocache_warnings(err)
    assert "gkx-autocache[remote]" in warning and "GKX_JAX_CACHE_SHARED" in warning and "s3fs" in warning
    warm, err = here.run_program(env, FUNCTIONS)
    assert warm["hits"] == warm["requests"] == out["requests"] == len(FUNCTIONS)


SPARSE_LOOKUP = r"""
import json, resource, sys, time, zlib
from gkx_autocache._backends import directory as _directory
from gkx_autocache._local.level import LocalLevel
from gkx_autocache._shared import level as _levels
root, key, signed = sys.argv[1], sys.argv[2], sys.argv[3] == "signed"
local = LocalLevel(root + "-l", compression="zlib", decompress=zlib.decompress, team=False, writable=True,
                   check_payload=lambda: True, whole=False, signs=signed)
level = _levels.Level(root, _directory.Directory(root, "0.0.0", team=False), local=local, timeout=60.0,
                      writes=None, secret=b"k" if signed else None)
started = time.monotonic()
answer = level.read(key)
got = answer.refused if answer.refused is not None else answer.found
print(json.dumps({"got": got if isinstance(got, str) else type(got).__name__, "secs": time.monotonic() - started,
                  "peak_mb": (""" + PEAK_RSS + r""") / 2**20}))
"""


@pytest.mark.parametrize("case", ["signed reader, no seal", "signed reader, a stolen seal", "keyless, a lying seal",
                                  "keyless, no seal, zeros"])
def test_a_planted_sparse_entry_costs_a_reader_neither_memory_nor_time(tmp_path: Path, case: str) -> None:
    """A member plants a sparse 2 GiB file (no disk of theirs) as an entry of a shared directory: a
    reader that misses that key refuses it from its seal and ``fstat`` (or its first bytes) before
    reading it, within 100 MB of a clean lookup's memory and in seconds. The seal is read, and with
    a key its HMAC checked, before the entry; a seal's size must be the file's."""
    from gkx_autocache._shared import seal as _seal

    root = tmp_path / "team"
    vdir = root / "jax-0.0.0"
    vdir.mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    data = b"\x78\x9c" + b"entry" * 100
    (vdir / f"{OTHER_KEY}-cache").write_bytes(data)  # a clean entry, for the baseline
    (vdir / f"{OTHER_KEY}-gkx-shared").write_bytes(_seal.make_seal(OTHER_KEY, data, 0.5, time.time(), b"k"))
    with open(vdir / f"{GOOD}-cache", "wb") as f:
        if case != "keyless, no seal, zeros":
            f.write(data[:2])  # a compressed frame's first bytes: only the seal or the size can tell
        f.truncate(2 << 30)
    if case == "signed reader, a stolen seal":  # another key's valid seal, renamed: its key and size differ
        (vdir / f"{GOOD}-gkx-shared").write_bytes(_seal.make_seal(GOOD, data, 0.5, time.time(), b"k"))
    elif case == "keyless, a lying seal":
        (vdir / f"{GOOD}-gkx-shared").write_bytes(_seal.make_seal(GOOD, data, 0.5, time.time(), None))
    signed = "signed" if case.startswith("signed") else "keyless"

    def lookup(key: str) -> dict[str, Any]:
        proc = subprocess.run([sys.executable, "-c", SPARSE_LOOKUP, str(root), key, signed], capture_output=True,
                              text=True, timeout=600, check=True)
        return dict(json.loads(proc.stdout))

    clean, planted = lookup(OTHER_KEY), lookup(GOOD)
    assert clean["got"] == "Entry", clean
    assert planted["got"].startswith(("not signed", "the shared entry")), planted
    assert planted["peak_mb"] < clean["peak_mb"] + 100, (clean, planted)
    assert planted["secs"] < 10, planted


@pytest.mark.parametrize(("write", "ci", "uploads"), [("always", "", True), ("ci", "true", True), ("ci", "", False),
                                                       ("never", "true", False)])
def test_the_fix_for_a_shared_entry_not_signed_is_true_for_shared_write(write: str, ci: str, uploads: bool) -> None:
    """`rejected: not signed` promises a signed replacement upload only where this setting makes
    one (``always``; ``ci`` with CI set); elsewhere it says the shared entry stays, and who replaces it."""
    from gkx_autocache import _context
    from gkx_autocache._explain import report as _report

    env = {"GKX_JAX_CACHE_SHARED": "s3://b/team", "GKX_JAX_CACHE_SHARED_WRITE": write, **({"CI": ci} if ci else {})}
    settings = _settings.resolve(env=env, user_file="/nonexistent")
    ctx = _context.Context(settings, "0.10.2", None)
    for detail in ("not signed", "not signed: its signature does not match (another key, or altered)"):
        fix = _report.fix_for("rejected", ctx, detail=detail, env=env)
        assert ("this process uploads its signed replacement" in fix) == uploads, fix
        assert "replaced" not in fix or uploads, fix
        assert "verify" not in fix, fix  # verify checks the local level, not the shared one
        if not uploads:
            assert f"shared_write = {write}" in fix and "stays" in fix, fix
    assert "verify" in _report.fix_for("rejected", ctx, detail="corrupt", env=env)


# -- Hardening 4: the bucket path ---------------------------------------------------------------

PLANTED = 300 << 20  # an entry this large, sent whole for a ranged read, shows in the reader's peak memory
PEAK = PROGRAM.rsplit("print(", 1)[0] + r"""
print(json.dumps({**counts, "result": round(result, 4), "peak": """ + PEAK_RSS + r"""}))
"""


def test_an_endpoint_that_ignores_range_never_has_a_whole_object_read(here: InProcess, tmp_path: Path, s3: S3,
                                                                     s3_server: str) -> None:
    """An endpoint that ignores Range sends a planted 300 MiB entry whole for a read of its first
    block: the reader stops at the length it asked for (the memory the process's Python allocates
    at its peak stays within 64 MiB of a run that reads nothing from the bucket), the level turns
    off with one line naming the ignored Range, and the run finishes with the right result."""
    import tracemalloc

    cold, _ = here.run_program(levels_env(s3.env, s3.bucket, tmp_path / "w"), FUNCTIONS)
    name = sorted(entries(s3, "team"))[0]
    s3.client().put_object(Bucket=s3.bucket, Key=f"team/{VERSION_DIR}/{name}", Body=bytes(PLANTED))
    assert drop_packs(s3) == 1  # (its sound copy of the entry would be served)

    def peak(env: dict[str, str]) -> tuple[dict[str, Any], str, int]:
        tracemalloc.start()
        try:
            out, err = here.run_program(env, FUNCTIONS)
            return out, err, tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    _, _, baseline = peak({**s3.env, "GKX_JAX_CACHE_DIR": str(tmp_path / "plain")})
    proxy = Proxy(int(s3_server.rsplit(":", 1)[1]), mode="norange")
    try:
        env = levels_env({**s3.env, "AWS_ENDPOINT_URL": proxy.endpoint}, s3.bucket, tmp_path / "r",
                         GKX_JAX_CACHE_SHARED_TIMEOUT="60")  # time enough to read it all, where it is read
        out, err, most = peak(env)
    finally:
        proxy.close()
    print(f"peak: {most >> 20} MiB, without the bucket {baseline >> 20} MiB")
    assert out["result"] == cold["result"] and out["hits"] < out["requests"], err
    assert most < baseline + (64 << 20), (most >> 20, baseline >> 20)
    (warning,) = autocache_warnings(err)
    assert "ignores Range" in warning and "raise shared_timeout" not in warning, warning


class _FakeGcs:
    """The shape of gcsfs's listing (``_list_objects(path, prefix="", versions=False, **kwargs)``,
    whose ``_do_list_objects`` takes ``max_results``), over a dict of names; an empty prefix raises
    FileNotFoundError, as gcsfs's does (it then looks for an object of the prefix's own name)."""

    def __init__(self, names: dict[str, int], pages: bool = True) -> None:
        import fsspec.asyn

        self.loop = fsspec.asyn.get_loop()
        self.names = names
        self.asked: list[dict[str, Any]] = []
        if not pages:
            self._do_list_objects = self._no_pages  # type: ignore[method-assign,assignment]

    async def _list_objects(self, path: str, prefix: str = "", versions: bool = False, **kwargs: Any) -> list[dict[str, Any]]:
        self.asked.append(kwargs)
        most = kwargs.get("max_results") or len(self.names)
        if not self.names:
            raise FileNotFoundError(path)
        return [{"name": f"{path}/{n}", "size": s, "type": "file"} for n, s in sorted(self.names.items())[:most]]

    async def _do_list_objects(self, path: str, max_results: int | None = None, delimiter: str = "/",
                               prefix: str = "", versions: bool = False, **kwargs: Any) -> None:
        raise AssertionError("not called: _list_objects is")

    async def _no_pages(self, path: str, **kwargs: Any) -> None:
        raise AssertionError("not called")

    def invalidate_cache(self, path: str | None = None) -> None:
        pass


def _gcs_bucket(fs: Any) -> Any:
    from gkx_autocache._backends import bucket as _bucket

    bucket = _bucket.Bucket(f"gs://b/team/{VERSION_DIR}")
    bucket._fs, bucket._path = fs, f"b/team/{VERSION_DIR}"
    return bucket


def test_a_gcs_listing_is_one_bounded_page() -> None:
    """gcsfs's ``_list_objects`` takes ``**kwargs``: the listing is still used, one page of at most
    LIST_LIMIT + 1 names (``max_results``); an empty prefix is an empty listing, not an error."""
    from gkx_autocache._backends import bucket as _bucket
    from gkx_autocache._shared import calls as _calls

    key = "jit_f-" + "0" * 64
    fs = _FakeGcs({key + "-cache": 10, key + "-gkx-shared": 2})
    assert _gcs_bucket(fs).listing(_calls.Progress()) == {key + "-cache": 10, key + "-gkx-shared": 2}
    assert fs.asked == [{"max_results": _bucket.LIST_LIMIT + 1}]
    assert _gcs_bucket(_FakeGcs({})).listing(_calls.Progress()) == {}


def test_status_never_says_more_than_1000_entries_where_it_could_not_list() -> None:
    """A bucket whose filesystem cannot list a bounded page: `status` says it could not count the
    entries, never "more than 1000"; an empty one says 0; one of 1001 names says more than 1000."""
    from gkx_autocache._shared import probe as _probe

    def line(fs: Any) -> str:
        found = _probe.probe(_gcs_bucket(fs), 10.0)
        assert found["answers"] is True, found
        shared = {"url": "gs://b/team", "version_dir": "gs://b/team/x", "kind": "bucket", "trust": "t", "probe": found,
                  "writes": "on", "timeout": 10.0, "signing": "not set", "cap": "none"}
        return _probe.level_lines({"local": {"dir": "/l", "trust": "private"}, "shared": shared})[3]

    unlistable = line(_FakeGcs({"a-cache": 1}, pages=False))
    assert "1000" not in unlistable and "not counted" in unlistable, unlistable
    assert "answers: 0 entries" in line(_FakeGcs({})), line(_FakeGcs({}))
    many = {f"jit_f-{i:064x}-cache": 1 for i in range(1001)}
    assert "more than 1000 entries" in line(_FakeGcs(many))


REFUSED = r"""
import json, os, signal, socket, sys, time, warnings
import jax, jax.numpy as jnp
seen = []
shown = warnings.showwarning
def show(message, category, filename, lineno, file=None, line=None):
    seen.append(time.monotonic())
    shown(message, category, filename, lineno, file, line)
warnings.showwarning = show
first = float(jax.jit(lambda v: jnp.sin(v) * 2.0)(jnp.ones(8)).sum())  # a miss: the listing, then an upload
time.sleep(1.0)  # the upload lands
os.kill(int(os.environ["SERVER_PID"]), signal.SIGTERM)
port = int(os.environ["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
while True:  # until nothing listens there
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        time.sleep(0.1)
    except OSError:
        break
stopped = time.monotonic()
rest = [float(jax.jit(lambda v, i=i: jnp.cos(v) * i)(jnp.ones(8)).sum()) for i in range(1, 4)]  # uploads to a dead server
while not seen and time.monotonic() - stopped < 60:
    time.sleep(0.05)
print(json.dumps({"first": first, "rest": rest, "secs": seen[0] - stopped if seen else None}))
"""


def test_a_server_stopped_mid_run_is_named_refused_at_once(here: InProcess, tmp_path: Path,
                                                          own_s3: tuple[S3, subprocess.Popen[bytes]]) -> None:
    """A bucket's server stopped mid-run refuses connections: the warning names the refused
    connection and the endpoint, arrives in far less than shared_timeout (60 s here: a refused
    connection is not retried), does not advise raising shared_timeout, and points at no line of
    threading.py (it comes from the upload worker)."""
    import warnings

    s3, server = own_s3
    env = levels_env(s3.env, s3.bucket, tmp_path / "a", GKX_JAX_CACHE_SHARED_TIMEOUT="60")
    seen: list[float] = []
    with here.process(env) as ran:
        shown = warnings.showwarning

        def show(*args: Any, **kwargs: Any) -> None:
            seen.append(time.monotonic())
            shown(*args, **kwargs)

        warnings.showwarning = show
        ran.jit("first")  # a miss: the listing, then an upload
        deadline = time.monotonic() + 60
        while not entries(s3, "team") and time.monotonic() < deadline:  # the upload lands
            time.sleep(0.05)
        server.terminate()
        server.wait(timeout=30)
        stopped = time.monotonic()
        for i in range(1, 4):  # uploads to a dead server
            ran.jit(f"rest{i}")
        while not seen and time.monotonic() - stopped < 60:
            time.sleep(0.05)
    secs = seen[0] - stopped if seen else None
    print(f"warning {secs} s after the server stopped")
    (warning,) = autocache_warnings(ran.stderr)
    assert secs is not None and secs < 20, (secs, ran.stderr)  # a retry until the timeout: >= 60
    assert "refused" in warning and s3.endpoint in warning and "raise shared_timeout" not in warning, warning
    where = warning.split(": AutocacheWarning: ")[0]
    assert ": AutocacheWarning: " in warning and "threading.py" not in where and "gkx_autocache" not in where, warning


def test_a_warning_from_the_compile_path_or_at_exit_points_at_no_package_or_jax_line(
        venv: Venv, tmp_path: Path, s3: S3, s3_server: str) -> None:
    """Under `python -W always`, a warning the shared level gives during a compile (nothing listens
    at the endpoint) points at the user's line, not at JAX's compilation_cache.py; one given at exit
    (uploads dropped) at no line of threading.py."""
    dead = levels_env({**s3.env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}, s3.bucket, tmp_path / "a")
    out, err = run_program(venv, "-W", "always", env=dead)
    (warning,) = autocache_warnings(err)
    where = warning.split(": AutocacheWarning: ")[0]
    assert ": AutocacheWarning: " in warning and "compilation_cache.py" not in where and "/jax/" not in where and "threading.py" not in where, warning

    proxy = Proxy(int(s3_server.rsplit(":", 1)[1]), delay=1.0)  # against 8 s: 16 PUTs cannot all land
    program = FORK_POOL.split("def work")[0] + "print(json.dumps({'parent': parent}))\n"
    try:
        env = levels_env({**s3.env, "AWS_ENDPOINT_URL": proxy.endpoint}, s3.bucket, tmp_path / "b",
                         GKX_JAX_CACHE_SHARED_TIMEOUT="8")
        proc = venv.run("-W", "always", "-c", program, env=env, timeout=300)
    finally:
        proxy.close()
    assert proc.returncode == 0, proc.stderr
    (warning,) = autocache_warnings(proc.stderr)
    assert "dropped at exit" in warning and ": AutocacheWarning: " in warning, warning
    assert "threading.py" not in warning.split(": AutocacheWarning: ")[0], warning


def test_a_writer_heals_an_emptied_bucket_in_a_run_that_asks_it_and_only_then(here: InProcess, tmp_path: Path,
                                                                            s3: S3, s3_server: str) -> None:
    """A run fills the local level and the bucket; the bucket is emptied; a writer's run of local
    hits asks the bucket nothing (no request: SPEC §14, a run that needs no request costs what a
    run without a shared level costs), nor does a run with shared_write = never; the next writer's
    run that misses once (one function changed) takes the listing and uploads what it lacks
    (counted as uploads), and a fresh local level is then served from it."""
    env = levels_env(s3.env, s3.bucket, tmp_path / "a")
    cold, _ = here.run_program(env, FUNCTIONS)
    uploaded = entries(s3, "team")
    assert len(uploaded) == cold["requests"]
    client = s3.client()
    for name in s3.objects("team/"):
        client.delete_object(Bucket=s3.bucket, Key=name)
    out, err = here.run_program({**env, "GKX_JAX_CACHE_SHARED_WRITE": "never"}, FUNCTIONS)
    assert out["hits"] == out["requests"] and not autocache_warnings(err) and entries(s3, "team") == {}, err
    proxy = Proxy(int(s3_server.rsplit(":", 1)[1]))
    try:
        out, err = here.run_program({**env, "AWS_ENDPOINT_URL": proxy.endpoint}, FUNCTIONS)
        assert out["hits"] == out["requests"] and not autocache_warnings(err), err
        assert proxy.requests == [] and entries(s3, "team") == {}, proxy.requests
    finally:
        proxy.close()
    # The writer stays alive until the bucket holds its entries again (at most 120 s): healing is
    # never waited for at exit. Its entries: one per lookup it made (the old f is not one of them:
    # it was not looked up, nor healed).
    changed = ("f:changed", *FUNCTIONS[1:])
    with here.process(env) as ran:
        for name in changed:
            ran.jit(*name.split(":"))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(entries(s3, "team")) < len(changed):
            time.sleep(0.05)
    assert report(ran.stderr)["misses"] == 1 and not autocache_warnings(ran.stderr), ran.stderr
    assert len(entries(s3, "team")) == len(changed), ran.stderr  # its hits healed, its miss uploaded
    shared = json.loads(here.cli("--json", "stats", env=env).stdout)["levels"]["shared"]
    assert shared["uploads"] == len(uploaded) + len(changed), shared
    fresh, err = here.run_program(levels_env(s3.env, s3.bucket, tmp_path / "b"), changed)
    assert report(err)["shared"] == fresh["requests"] == len(changed), err


@pytest.mark.parametrize("endpoint", ["silent", "refused"])
def test_a_warm_all_local_run_against_a_silent_endpoint_costs_nothing_at_exit(here: InProcess, tmp_path: Path,
                                                                              endpoint: str) -> None:
    """A writer's local level is warm (every lookup a local hit); the bucket's endpoint accepts and
    never answers (or nothing listens there). The run needs nothing of the bucket (SPEC §14: a warm
    all-local run costs nothing): it asks the bucket nothing, not even at its exit (no healing
    listing, no upload dropped, no warning), so that it cannot wait a shared_timeout for it."""
    server = Silent()
    try:
        cold, _ = here.run_program({"GKX_JAX_CACHE_DIR": str(tmp_path / "a")}, FUNCTIONS)
        where = server.endpoint if endpoint == "silent" else f"http://127.0.0.1:{free_port()}"
        env = levels_env(S3(where, "x").env, "bucket", tmp_path / "a", GKX_JAX_CACHE_SHARED_TIMEOUT="30")
        out, err = here.run_program(env, FUNCTIONS)
        assert report(err)["local"] == cold["requests"] == out["hits"], err
        assert not autocache_warnings(err), err
        shared = json.loads(here.cli("--json", "stats", env=env).stdout)["levels"]["shared"]
        assert shared["requests"] == shared["errors"] == shared["timeouts"] == shared["dropped"] == 0, shared
        assert server.connections == 0
    finally:
        server.close()


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    async def read(self, n: int) -> bytes:
        chunk = self.data[self.pos:self.pos + n]
        self.pos += len(chunk)
        return chunk

    def close(self) -> None:
        pass


@pytest.mark.parametrize("content_range", ["bytes 0-4095/16384", "bytes 8192-12287/16384", "bytes 4096-6143/16384"],
                         ids=["from-the-start", "further-on", "shorter"])
def test_a_206_whose_content_range_is_not_the_range_asked_is_refused(content_range: str) -> None:
    """An endpoint answers a ranged read of bytes 4096-8191 with a 206 of other bytes of the object
    (its Content-Range says so): they are not the bytes asked for, and an unsealed entry (stock JAX
    wrote it: no SHA-256 to catch them) would be served spliced from the wrong places."""
    import asyncio
    import random

    from gkx_autocache._backends import bucket as _bucket
    from gkx_autocache._shared import seal as _seal

    obj = random.Random(1).randbytes(16384)
    first, last = (int(n) for n in content_range.split(" ")[1].split("/")[0].split("-"))

    class FS:
        async def _call_s3(self, op: str, **kwargs: Any) -> dict[str, Any]:
            return {"Body": _Body(obj[first:last + 1]), "ContentRange": content_range, "ContentLength": last + 1 - first}

    with pytest.raises((_seal.EntryRefused, OSError)):
        got = asyncio.run(_bucket._read_range(FS(), "bucket/team/k-cache", 4096, 8192))
        assert got == obj[4096:8192]  # (never reached where it is refused)
        print(len(got), "bytes of", content_range, "taken for bytes 4096-8191")


SHAPED = """
import sys, jax, jax.numpy as jnp
@jax.jit
def smooth(v):
    return jnp.sin(v) * 2.0 + v.sum()
print(float(smooth(jnp.ones(int(sys.argv[1]))).sum()))
"""


def test_an_entry_backfilled_from_the_bucket_explains_its_next_shape(venv: Venv, tmp_path: Path, s3: S3) -> None:
    """A CI job fills the bucket at N=48; a developer's empty local level is filled from it; their
    next run at N=40 misses, and `explain` compares it with the backfilled entry (the hit's record
    carries its facts): "changed computation: inputs f32[48] -> f32[40]", never "has no record"."""
    script = tmp_path / "train.py"
    script.write_text(SHAPED)
    writer = levels_env(s3.env, s3.bucket, tmp_path / "ci", GKX_JAX_CACHE_SHARED_WRITE="always")
    assert venv.run(str(script), "48", env=writer).returncode == 0
    reader = levels_env(s3.env, s3.bucket, tmp_path / "dev", GKX_JAX_CACHE_SHARED_WRITE="never")
    warm = venv.run(str(script), "48", env=reader)
    assert report(warm.stderr)["shared"] >= 1 and report(warm.stderr)["misses"] == 0, warm.stderr
    assert venv.run(str(script), "40", env=reader).returncode == 0
    groups = json.loads(venv.cli("--json", "explain", env=reader).stdout)["groups"]
    said = {f["name"]: (g["cause"], f["detail"]) for g in groups for f in g["functions"]}
    assert said["jit_smooth"] == ("changed computation", "inputs f32[48] -> f32[40]"), said
    assert not any("no record" in detail for _cause, detail in said.values()), said


def test_a_local_entry_is_uploaded_only_with_the_seal_its_key_vouched_for(tmp_path: Path) -> None:
    """What healing and packs sign (SPEC §14, amended 2026-12-04): with a key, only a local entry
    whose kept seal its key verifies against the bytes on disk, that seal as it is; never bytes
    swapped after it was verified, a seal of another key or of another entry, an unsigned seal, or
    none (a keyless backfill). Without a key, an unsigned seal, as every keyless upload has."""
    from gkx_autocache._shared.seal import make_seal

    level, _ = hostile_level(tmp_path, secret=KEY_A.encode())
    data, other = b"\x78\x9c" + b"a" * 100, b"\x78\x9c" + b"b" * 100
    vouched = level.vouch(GOOD, data, 1.5, 1000.0)
    assert vouched is not None and level.reader.seal_for(GOOD, data, vouched, None, 0.0) == vouched
    for name, raw, bytes_ in (("swapped after it was verified", vouched, other),
                              ("another key's", make_seal(GOOD, data, 1.5, 1000.0, KEY_B.encode()), data),
                              ("another entry's", level.vouch(OTHER_KEY, data, 1.5, 1000.0), data),
                              ("unsigned", make_seal(GOOD, data, 1.5, 1000.0, None), data),
                              ("none", None, data), ("not a seal", b"{", data)):
        assert level.reader.seal_for(GOOD, bytes_, raw, None, 0.0) is None, name
    keyless, _ = hostile_level(tmp_path / "k")
    minted = keyless.reader.seal_for(GOOD, data, vouched, 2.0, 1000.0)
    assert minted is not None and b"hmac" not in minted and keyless.vouch(GOOD, data, 2.0, 1000.0) is None


def test_an_unsigned_seal_says_who_uploaded_it_and_a_wrong_signature_says_so() -> None:
    """K5: a seal without a signature is `not signed`, uploaded by a process without the key; one
    whose signature does not match names another key or an alteration: two causes, two fixes."""
    from gkx_autocache._shared.channel import Channel
    from gkx_autocache._shared.reads import Reader
    from gkx_autocache._shared.seal import EntryRefused, make_seal

    channel = Channel("s3://b/team", cast(Any, None), timeout=1.0, rank=lambda: 0)
    reader = Reader(channel, secret=KEY_A.encode(), max_entry=1 << 30)
    data = b"\x78\x9c" + b"a" * 10
    for raw, said in ((make_seal(GOOD, data, None, 1.0, None), "not signed: a process without the signing key uploaded it"),
                      (make_seal(GOOD, data, None, 1.0, KEY_B.encode()),
                       "not signed: its signature does not match (another key, or altered)")):
        with pytest.raises(EntryRefused) as refused:
            reader.admit(GOOD, raw)
        assert str(refused.value) == said


def test_an_upload_the_worker_holds_when_the_level_turns_off_is_counted(tmp_path: Path) -> None:
    """Another thread turns the level off (a lookup stalled) while the worker uploads: the entry in
    flight and the queued ones are each counted, as dropped or uploaded, none lost between the two
    (the level's switch and the uploads' queue are two objects: the switch is thrown in the queue's lock)."""
    import threading

    from gkx_autocache._backends import directory as _directory
    from gkx_autocache._shared import level as _levels

    gate, writing = threading.Event(), threading.Event()

    class Gated(_directory.Directory):
        def write(self, name: str, data: bytes) -> None:
            writing.set()
            gate.wait(10)
            super().write(name, data)

    level, _ = hostile_level(tmp_path)
    level = _levels.Level(level.url, Gated(level.url, "0.0.0", team=False), local=local_at(tmp_path / "l"),
                          timeout=20.0, writes=None, secret=None)
    for i in range(5):
        level.put(f"jit_f-{i:064x}", bytes([i]) * 1000, 0.5)
    assert writing.wait(10)  # the worker writes the first
    level.channel.turn_off("a lookup timed out", timed_out=True)
    gate.set()
    time.sleep(0.3)  # the worker, if it took another, would have by now
    counts = level.snapshot()
    assert counts["dropped"] == 5 and counts["uploads"] <= 1, counts

    # The instant between the switch and the drop: the worker takes nothing once the level is off.
    gate.clear()
    writing.clear()
    level = _levels.Level(level.url, Gated(level.url, "0.0.0", team=False), local=local_at(tmp_path / "l"),
                          timeout=20.0, writes=None, secret=None)
    for i in range(5):
        level.put(f"jit_g-{i:064x}", bytes([i]) * 1000, 0.5)
    assert writing.wait(10)
    level.channel.off = ("a lookup timed out", time.time())  # thrown, not yet dropped
    gate.set()
    time.sleep(0.3)
    assert level.uploads.drop(lambda: None) == 4  # the four queued, still there to count


def test_turning_off_counts_only_this_runs_own_uploads_as_dropped(tmp_path: Path) -> None:
    """A level turned off with this run's uploads queued behind entries to heal and its manifest:
    `dropped` counts this run's entries only (heals are dropped silently, a manifest is no entry)."""
    from gkx_autocache._shared.uploads import Item

    level, _ = hostile_level(tmp_path)
    uploads = level.uploads
    uploads._queue.extend([Item(f"jit_{i}-{'a' * 64}", b"x", None, None, 0.0, heal=False, manifest=False)
                           for i in range(2)] + [Item("m-gkx-manifest", b"{}", None, None, 0.0, heal=False, manifest=True)])
    uploads._heals.extend(Item(f"jit_h{i}-{'b' * 64}", b"", None, None, 0.0, heal=True, manifest=False) for i in range(500))
    level.channel.turn_off("a test", timed_out=False)
    assert level.channel.counts["dropped"] == 2 and not uploads._queue and not uploads._heals
    level.channel.turn_off("again", timed_out=False)  # once only
    assert level.channel.counts["dropped"] == 2 and level.channel.counts["errors"] == 1
