"""Remote directories (SPEC §9): a real S3-compatible server (moto's standalone server) on
127.0.0.1, started and stopped here; gs:// up to the filesystem call, since nothing here can reach
Google Cloud Storage."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REMOTE_EXTRA, S3, Venv, autocache_warnings, free_port, make_venv, public_tmp, run_program
from test_activation import VERSION_DIR

from gkx_autocache import _cache, _configure, _entries, _remote, _settings

HEX = "ab" * 32


def cli_json(venv: Venv, *args: str, env: dict[str, str]) -> dict[str, Any]:
    proc = venv.cli("--json", *args, env=env)
    assert proc.returncode == 0, proc.stderr
    assert not autocache_warnings(proc.stderr), proc.stderr
    return dict(json.loads(proc.stdout))


def test_s3_round_trip(venv: Venv, s3: S3) -> None:
    """A cold run writes entries into the bucket, a second process is served from it, and the CLI
    lists, counts and prunes them, touching only objects named like entries."""
    env = {**s3.env, "GKX_JAX_CACHE_DIR": f"s3://{s3.bucket}/team-cache"}
    prefix = f"team-cache/{VERSION_DIR}/"
    cold, stderr = run_program(venv, env=env)
    assert not autocache_warnings(stderr), stderr
    assert cold["dir"] == f"s3://{s3.bucket}/{prefix.rstrip('/')}" and cold["xla_caches"] == "none"
    assert cold["hits"] == 0 and cold["requests"] >= 2
    entries = {k for k in s3.objects(prefix) if k.endswith("-cache") and "/" not in k[len(prefix):]}
    assert len(entries) == cold["requests"]  # every compile written, directly under the version prefix

    warm, stderr = run_program(venv, env=env)
    assert warm["hits"] == warm["requests"] == cold["requests"] and warm["result"] == cold["result"]

    foreign = {prefix + "notes.txt", prefix + f"nested/jit_f-{HEX}-cache", f"elsewhere/jit_f-{HEX}-cache"}
    for key in foreign:
        s3.client().put_object(Bucket=s3.bucket, Key=key, Body=b"not the package's")

    status = cli_json(venv, "status", env=env)
    assert status["directory"]["version_dir"] == cold["dir"] and status["directory"]["trusted"] is None
    assert status["store"]["store"] == "jax"
    assert status["versions_present"] == [{"version": VERSION_DIR, "entries": len(entries),
                                           "bytes": sum(s3.objects(prefix)[k] for k in entries), "installed": True}]
    stats = cli_json(venv, "stats", env=env)["stats"]
    assert stats["hits"] == warm["hits"] and stats["misses"] == cold["requests"]  # both processes' ledgers
    verified = cli_json(venv, "verify", env=env)  # every object read back and decompressed
    assert verified["entries"] == len(entries) and verified["corrupt"] == [] and not verified["repaired"]

    dry = cli_json(venv, "prune", "--max-size", "1", "--dry-run", env=env)
    assert dry["entries"] == len(entries) and entries <= set(s3.objects(prefix))
    pruned = cli_json(venv, "prune", "--max-size", "1", env=env)
    assert pruned["entries"] == len(entries)
    left = set(s3.objects())
    assert not entries & left and foreign <= left  # only entries went

    third, _ = run_program(venv, env=env)
    assert third["hits"] == 0
    assert len([k for k in s3.objects(prefix) if "/.gkx-autocache/ledger/" in k]) == 3
    assert cli_json(venv, "stats", "--reset", env=env)["removed"] == 3
    assert not [k for k in s3.objects(prefix) if "/.gkx-autocache/" in k]
    run_program(venv, env=env)
    cleared = cli_json(venv, "clear", "--yes", env=env)  # a fresh start: the totals go too
    assert cleared["entries"] == len(entries) and cleared["totals_reset"]
    assert foreign <= set(s3.objects()) and not any(k.endswith("-cache") for k in s3.objects(prefix) if "/" not in k[len(prefix):])
    assert not [k for k in s3.objects(prefix) if "/.gkx-autocache/" in k]
    assert cli_json(venv, "stats", env=env)["stats"] is None

    other_version = f"team-cache/jax-0.0.1/jit_f-{HEX}-cache"  # another environment's, written just now
    s3.client().put_object(Bucket=s3.bucket, Key=other_version, Body=b"x\x9c")
    stale = cli_json(venv, "prune", "--stale-versions", env=env)
    assert stale["stale_versions"] == [] and other_version in s3.objects()
    later = time.time() + 31 * 86400  # a bucket's objects cannot be aged: judge them from 31 days on
    judge = ("import sys; from gkx_autocache import _entries as e; old, current, name, later = sys.argv[1:5]; "
             "print(e.stale(old, name, now=float(later)), e.stale(current, name, now=float(later))); "
             "e.remove_version_dir(old)")
    proc = venv.run("-c", judge, f"s3://{s3.bucket}/team-cache/jax-0.0.1", f"s3://{s3.bucket}/team-cache/{VERSION_DIR}",
                    VERSION_DIR, str(later), env=env, check=True)
    assert proc.stdout.split() == ["True", "False"], proc.stdout
    assert other_version not in s3.objects() and foreign <= set(s3.objects())


@pytest.mark.once  # commands on the settings and a bucket, no JAX process: the same on every JAX line
def test_unreachable_bucket_status_still_reports(venv: Venv) -> None:
    """status on a bucket it cannot reach: exit 0, everything else shown, the failure in one line."""
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1", "GKX_JAX_CACHE_DIR": "s3://nowhere/cache"}
    data = cli_json(venv, "status", env=env)
    assert data["directory"]["version_dir"] == f"s3://nowhere/cache/{VERSION_DIR}"
    assert [a for a in data["attention"] if a.startswith("cannot list the cache: s3://nowhere/cache/")]
    proc = venv.cli("prune", "--max-size", "1", env=env)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("gkx-autocache prune: s3://nowhere/cache/")


def test_missing_remote_extra_is_one_warning_and_an_uncached_run(wheel: Path) -> None:
    """Without gkx-autocache[remote], an s3:// dir costs one warning naming the extra, not the run."""
    base = public_tmp()
    try:
        venv = make_venv(base, wheel, without=REMOTE_EXTRA)
        env = {"GKX_JAX_CACHE_DIR": "s3://some-bucket/cache"}
        result, stderr = run_program(venv, env=env)
        (warning,) = autocache_warnings(stderr)
        assert "gkx-autocache[remote]" in warning and "GKX_JAX_CACHE_DIR" in warning and "s3://some-bucket/cache" in warning
        assert result["hits"] == 0 and result["dir"] in (None, "")
        proc = venv.cli("--json", "status", env=env)
        assert any("gkx-autocache[remote]" in a for a in json.loads(proc.stdout)["attention"])
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def gs_settings(url: str) -> _settings.Settings:
    return _settings.resolve({"GKX_JAX_CACHE_DIR": url}, prefix="/nonexistent", user_file="/nonexistent/c.toml")


def test_gs_up_to_the_filesystem_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """gs:// cannot be reached here: check everything up to the call into fsspec (gcsfs)."""
    import fsspec

    settings = gs_settings("gs://bkt/cache/")
    location = _cache.locate(settings, "0.10.2")
    assert location.version_dir == "gs://bkt/cache/jax-0.10.2" and location.kind == _cache.REMOTE
    assert not location.problems
    assert _configure.xla_caches_for(settings, location.version_dir) == "none"
    assert fsspec.get_filesystem_class("gs").__module__.startswith("gcsfs")

    asked = []

    def url_to_fs(url: str, **kwargs: Any) -> Any:
        asked.append(url)
        raise ConnectionError("no route to Google Cloud Storage from the test machine")

    monkeypatch.setattr("fsspec.core.url_to_fs", url_to_fs)
    with pytest.raises(_remote.RemoteError, match=r"^gs://bkt/cache/jax-0.10.2: no route"):
        _entries.scan(location.version_dir)
    assert asked == ["gs://bkt/cache/jax-0.10.2"]


def test_remote_deletion_touches_only_entries_and_ledgers(monkeypatch: pytest.MonkeyPatch) -> None:
    removed: list[list[str]] = []

    class FakeFs:
        def rm(self, paths: list[str]) -> None:
            removed.append(paths)

    monkeypatch.setattr(_remote, "filesystem", lambda url: (FakeFs(), "bkt/cache/jax-1"))
    vdir = "gs://bkt/cache/jax-1"
    asked = [f"{vdir}/jit_f-{HEX}-cache", f"{vdir}/jit_f-{HEX}-gkx-compile", f"{vdir}/notes.txt",
             f"{vdir}/sub/jit_f-{HEX}-cache", f"gs://bkt/other/jit_f-{HEX}-cache",
             f"{vdir}/.gkx-autocache/ledger/h-1-2.jsonl", f"{vdir}/.gkx-autocache/store.json"]
    assert _remote.remove(vdir, asked) == 3
    assert removed == [[f"bkt/cache/jax-1/jit_f-{HEX}-cache", f"bkt/cache/jax-1/jit_f-{HEX}-gkx-compile",
                        "bkt/cache/jax-1/.gkx-autocache/ledger/h-1-2.jsonl"]]


@pytest.mark.parametrize("url", ["ftp://host/cache", "s3://", "gs:///", "az://container/cache"])
def test_unsupported_urls_are_bad_values(url: str) -> None:
    with pytest.raises(_settings.BadValue, match="gs://bucket or s3://bucket"):
        _settings.parse_dir(url, "/")


def test_a_signing_key_with_a_bucket_dir_says_it_protects_nothing(venv: Venv, s3: S3) -> None:
    """With `dir` a bucket, JAX's stock cache reads it and checks no signature: a signing key set
    there protects nothing. One warning says so and points to `shared`; `status` says so too,
    rather than `signing_key: set`."""
    env = {**s3.env, "GKX_JAX_CACHE_DIR": f"s3://{s3.bucket}/c", "GKX_JAX_CACHE_SIGNING_KEY": "s3cret"}
    out, stderr = run_program(venv, env=env)
    warned = autocache_warnings(stderr)
    assert out["dir"].startswith("s3://") and len(warned) == 1, stderr
    assert "protects nothing" in warned[0] and "shared" in warned[0] and "s3cret" not in stderr, warned
    proc = venv.cli("--json", "status", "--no-probe", env=env)
    data = json.loads(proc.stdout)
    assert "protects nothing" in data["signing_key"], data["signing_key"]
    assert any("protects nothing" in line for line in data["attention"]), data["attention"]
    assert "s3cret" not in proc.stdout + proc.stderr
