"""XLA's GPU autotune results travel with the entries (issue 47): by the shared level (an object beside
each program's manifest, its SHA-256 in the manifest) and by warm bundles. No GPU here: the program
writes them as XLA does (``<sha256 of its key, base64url>.textproto`` in JAX's folder, through its
``tmp/`` and a rename), in XLA's text format, during its run."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import S3, InProcess
from test_activation import VERSION_DIR
from test_levels import levels_env
from webdav import Nginx

from gkx_autocache import _autotune

FOLDER = "xla_gpu_per_fusion_autotune_cache_dir"
ON = {"GKX_JAX_CACHE_XLA_CACHES": FOLDER}  # as JAX's default is where a GPU plugin is installed

# The writer's XLA tunes three fusions while it compiles; a reader compiles one function the writer
# never did (a miss all the way down), and lists the folder right after: XLA would have read it then.
def program(here: InProcess, env: dict[str, str], role: str, other: str = "7",
            w_error: bool = False) -> dict[str, Any]:
    """The program as a process here (``role``: ``writer`` or ``reader``; ``other``: the reader's
    own function, another constant another key): what its f computed, and the results it saw."""
    with here.process({**env, "ROLE": role}, w_error=w_error) as ran:
        folder = os.path.join(str(ran.jax.config.jax_compilation_cache_dir), FOLDER)
        ran.jit("f")
        if role == "writer":
            os.makedirs(os.path.join(folder, "tmp"), exist_ok=True)
            for i in range(3):
                key = f"CUDA: 9.0, Cores: 132|fusion.{i}|3"
                name = base64.urlsafe_b64encode(hashlib.sha256(key.encode()).digest()).decode().rstrip("=") + ".textproto"
                tmp = os.path.join(folder, "tmp", "tmp_per_fusion_cache_" + name)
                with open(tmp, "w") as out:
                    out.write(f"scratch_bytes: 0\nrun_time {{\n  nanos: {20480 + i}\n}}\ntriton {{\n  block_m: 64\n  num_warps: 4\n}}\n")
                os.rename(tmp, os.path.join(folder, name))
        else:
            ran.jit("_lambda", f"cos * {other}")
        seen = {n: Path(folder, n).read_bytes().hex() for n in sorted(os.listdir(folder))
                if n.endswith(".textproto")} if os.path.isdir(folder) else {}
        # (a real program's compiles take long enough for its prefetch to have read the manifest by
        # its exit, where the manifest it leaves names the writer's results: here, it is waited for)
        ran.settle()
    return {"result": hashlib.sha256(ran.jax.served[ran.jax.key("f")]).hexdigest(), "seen": seen, "stderr": ran.stderr}


def tuned(local: Path) -> dict[str, str]:
    folder = local / VERSION_DIR / FOLDER
    return {p.name: p.read_bytes().hex() for p in sorted(folder.glob("*.textproto"))} if folder.is_dir() else {}


@pytest.fixture(params=["directory", "s3", "http"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The shared level's settings: a team directory, a bucket on moto's S3 server, or nginx's WebDAV."""
    if request.param == "directory":
        (tmp_path / "team").mkdir()
        yield {"GKX_JAX_CACHE_SHARED": str(tmp_path / "team")}
    elif request.param == "s3":
        s3: S3 = request.getfixturevalue("s3")
        env = levels_env(s3.env, s3.bucket, tmp_path / "unused")
        yield {k: v for k, v in env.items() if k != "GKX_JAX_CACHE_DIR"}
    else:
        server = Nginx(tmp_path / "nginx")
        try:
            yield {"GKX_JAX_CACHE_SHARED": server.url}
        finally:
            server.close()


def test_a_fresh_machine_gets_the_writers_autotune_results_before_its_first_compile(here: InProcess, tmp_path: Path,
                                                                                    shared: dict[str, str]) -> None:
    """The writer's three results reach a fresh machine byte for byte, in place before it compiles its
    first miss, vouched for by the signing key through the manifest. (On JAX 0.10 the folder's path is
    in every key, so the reader's entries miss: its results are what it gets.)"""
    key = {"GKX_JAX_CACHE_SIGNING_KEY": "k" * 32, "GKX_JAX_CACHE_REPORT": "1", **ON, **shared}
    writer = program(here, {**key, "GKX_JAX_CACHE_DIR": str(tmp_path / "w")}, "writer", w_error=True)
    written = tuned(tmp_path / "w")
    assert len(written) == 3 and writer["seen"] == written, writer["stderr"]
    reader = program(here, {**key, "GKX_JAX_CACHE_DIR": str(tmp_path / "r")}, "reader", w_error=True)
    assert reader["seen"] == written and reader["result"] == writer["result"], reader["stderr"]  # listed right after its miss
    assert tuned(tmp_path / "r") == written


def test_autotune_results_the_key_never_vouched_for_are_not_landed(here: InProcess, tmp_path: Path) -> None:
    """A bucket writer without the signing key swaps the autotune object (a result of its own under a
    name a key holder wrote): it no longer matches the signed manifest, and nothing of it lands."""
    team = tmp_path / "team"
    team.mkdir()
    key = {"GKX_JAX_CACHE_SIGNING_KEY": "k" * 32, "GKX_JAX_CACHE_SHARED": str(team), **ON}
    program(here, {**key, "GKX_JAX_CACHE_DIR": str(tmp_path / "w")}, "writer")
    [obj] = list((team / VERSION_DIR).glob("*-gkx-autotune"))
    files = _autotune.unpack(obj.read_bytes())
    obj.write_bytes(_autotune.pack([(files[0][0], b"triton { block_m: 16 num_warps: 32 }\n"), *files[1:]]))
    reader = program(here, {**key, "GKX_JAX_CACHE_DIR": str(tmp_path / "r")}, "reader")
    assert reader["seen"] == {} and tuned(tmp_path / "r") == {}, reader["stderr"]


def test_an_autotune_object_names_only_files_xla_writes() -> None:
    """Unpacking refuses a record whose name is not one XLA writes (a path, another suffix) or whose
    size is out of bounds; packing and unpacking are each other's inverse."""
    name = base64.urlsafe_b64encode(hashlib.sha256(b"k").digest()).decode().rstrip("=") + ".textproto"
    good = [(name, b"scratch_bytes: 0\n")]
    assert _autotune.unpack(_autotune.pack(good)) == good
    for bad in ("../" + name[3:], name.replace(".textproto", ".txt"), "tmp/" + name[4:], name[:-10] + "=.textproto"):
        with pytest.raises(ValueError):
            _autotune.unpack(_autotune.pack([(bad, b"x")]))
    with pytest.raises(ValueError):
        _autotune.unpack(_autotune.pack([(name, b"x" * (_autotune.FILE_LIMIT + 1))]))
    with pytest.raises(ValueError):
        _autotune.unpack(_autotune.pack(good)[:-5])  # a record cut short


def test_a_warm_bundle_carries_autotune_results(here: InProcess, tmp_path: Path) -> None:
    """``export`` takes the results with the entries and ``import`` places them (the ones there kept);
    a bundle member under that folder with another name is refused, having written nothing."""
    source = {"GKX_JAX_CACHE_DIR": str(tmp_path / "w"), **ON}
    program(here, source, "writer")
    archive = tmp_path / "warm.tar.gz"
    exported = here.cli("--json", "export", str(archive), env=source)
    assert exported.returncode == 0, exported.stderr
    target = {"GKX_JAX_CACHE_DIR": str(tmp_path / "fresh")}
    imported = here.cli("import", str(archive), env=target)
    assert imported.returncode == 0, imported.stderr
    assert tuned(tmp_path / "fresh") == tuned(tmp_path / "w") and len(tuned(tmp_path / "w")) == 3
    bad = tmp_path / "bad.tar"
    name = f"{FOLDER}/../evil.textproto"
    manifest = {"format": json.loads(_manifest_of(archive))["format"], "files": [
        {"name": name, "size": 1, "sha256": hashlib.sha256(b"x").hexdigest()}]}
    with tarfile.open(bad, "w") as tar:
        for member, data in (("gkx-autocache-manifest.json", json.dumps(manifest).encode()), (name, b"x")):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    refused = here.cli("import", str(bad), "--force", env={"GKX_JAX_CACHE_DIR": str(tmp_path / "other")})
    assert refused.returncode != 0 and "not the name of a cache entry" in refused.stderr, refused.stderr
    assert not (tmp_path / "evil.textproto").exists() and not (tmp_path / "other" / VERSION_DIR / "evil.textproto").exists()
    assert not os.path.isdir(tmp_path / "other" / VERSION_DIR / FOLDER)


def _manifest_of(archive: Path) -> bytes:
    with tarfile.open(archive) as tar:
        member = tar.extractfile("gkx-autocache-manifest.json")
        assert member is not None
        return member.read()


def test_results_landed_without_a_key_are_never_vouched_for_by_one(here: InProcess, tmp_path: Path) -> None:
    """A keyless run (a CI job whose secret was not passed) lands a keyless writer's results, made
    read-only; the user's next run with the key and a miss does not sign them into its manifest, so
    a fresh key holder gets none of them (a planted result would otherwise be laundered by the key)."""
    team = tmp_path / "team"
    team.mkdir()
    env = {"GKX_JAX_CACHE_SHARED": str(team), **ON}
    program(here, {**env, "GKX_JAX_CACHE_DIR": str(tmp_path / "attacker")}, "writer")
    victim = tmp_path / "victim"
    keyless = program(here, {**env, "GKX_JAX_CACHE_DIR": str(victim)}, "reader")
    assert len(keyless["seen"]) == 3, keyless["stderr"]
    assert {p.stat().st_mode & 0o777 for p in (victim / VERSION_DIR / FOLDER).glob("*.textproto")} == {0o400}
    key = {**env, "GKX_JAX_CACHE_SIGNING_KEY": "k" * 32}
    for obj in (team / VERSION_DIR).glob("*-gkx-*"):
        obj.unlink()  # the victim's keyed run writes the program's manifest afresh
    program(here, {**key, "GKX_JAX_CACHE_DIR": str(victim)}, "reader", other="8")  # one more miss: a manifest is written
    fresh = program(here, {**key, "GKX_JAX_CACHE_DIR": str(tmp_path / "fresh")}, "reader", other="8")
    assert fresh["seen"] == {} and tuned(tmp_path / "fresh") == {}, fresh["stderr"]


def test_a_process_whose_xla_keeps_no_results_neither_waits_nor_lands(here: InProcess, tmp_path: Path) -> None:
    """Without a GPU plugin (``xla_caches`` none: XLA reads no folder) a reader lands nothing, though
    the program's manifest names results."""
    team = tmp_path / "team"
    team.mkdir()
    env = {"GKX_JAX_CACHE_SHARED": str(team)}
    program(here, {**env, **ON, "GKX_JAX_CACHE_DIR": str(tmp_path / "w")}, "writer")
    assert list((team / VERSION_DIR).glob("*-gkx-autotune"))
    reader = program(here, {**env, "GKX_JAX_CACHE_DIR": str(tmp_path / "r")}, "reader")
    assert reader["seen"] == {} and not (tmp_path / "r" / VERSION_DIR / FOLDER).exists(), reader["stderr"]


def test_an_object_never_outgrows_what_a_reader_takes(tmp_path: Path) -> None:
    """A folder of 20 000 results: the object of them stops at ``TOTAL_LIMIT``, records included,
    newest first, and reads no file beyond."""
    folder = tmp_path / FOLDER
    folder.mkdir()
    for i in range(20_000):
        name = base64.urlsafe_b64encode(hashlib.sha256(str(i).encode()).digest()).decode().rstrip("=") + ".textproto"
        (folder / name).write_bytes(b"x" * 300)
    obj = _autotune.pack(_autotune.local(str(tmp_path)))
    assert _autotune.TOTAL_LIMIT - 400 < len(obj) <= _autotune.TOTAL_LIMIT
    assert len(_autotune.unpack(obj)) < 20_000


def test_a_bundle_into_a_folder_that_is_a_symlink_imports_the_entries(here: InProcess, tmp_path: Path) -> None:
    """The target's autotune folder is a symlink (to a big disk, or planted): its results are left
    out, nothing is written through the link, and every entry is imported."""
    source = {"GKX_JAX_CACHE_DIR": str(tmp_path / "w"), **ON}
    program(here, source, "writer")
    archive = tmp_path / "warm.tar"
    assert here.cli("export", str(archive), env=source).returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "t" / VERSION_DIR).mkdir(parents=True)
    (tmp_path / "t" / VERSION_DIR / FOLDER).symlink_to(elsewhere)
    imported = here.cli("import", str(archive), env={"GKX_JAX_CACHE_DIR": str(tmp_path / "t")})
    assert imported.returncode == 0, imported.stderr
    assert list(elsewhere.iterdir()) == []
    assert len(list((tmp_path / "t" / VERSION_DIR).glob("*-cache"))) == len(list((tmp_path / "w" / VERSION_DIR).glob("*-cache")))


def test_landed_results_make_the_object_they_came_from(tmp_path: Path) -> None:
    """Results landed (written in the object's order: their times reversed) make the same object
    again, so a fresh machine's run does not upload it anew."""
    source = tmp_path / "a"
    (source / FOLDER).mkdir(parents=True)
    for i in range(5):
        name = base64.urlsafe_b64encode(hashlib.sha256(bytes([i])).digest()).decode().rstrip("=") + ".textproto"
        (source / FOLDER / name).write_bytes(b"scratch_bytes: %d\n" % i)
        os.utime(source / FOLDER / name, (1000 + i, 1000 + i))
    obj = _autotune.pack(_autotune.local(str(source)))
    assert _autotune.land(str(tmp_path / "b"), _autotune.unpack(obj), team=False, verified=True) == 5
    assert _autotune.pack(_autotune.local(str(tmp_path / "b"))) == obj


def test_a_run_without_results_of_its_own_keeps_the_writers_object_named(here: InProcess, tmp_path: Path) -> None:
    """A run whose XLA keeps no results (no GPU plugin) that writes the program's manifest (a new
    miss) names the writer's object still: the next fresh machine gets the results."""
    team = tmp_path / "team"
    team.mkdir()
    env = {"GKX_JAX_CACHE_SHARED": str(team)}
    program(here, {**env, **ON, "GKX_JAX_CACHE_DIR": str(tmp_path / "w")}, "writer")
    program(here, {**env, "GKX_JAX_CACHE_DIR": str(tmp_path / "cpu")}, "reader")
    fresh = program(here, {**env, **ON, "GKX_JAX_CACHE_DIR": str(tmp_path / "r")}, "reader")
    assert len(fresh["seen"]) == 3 and fresh["seen"] == tuned(tmp_path / "w"), fresh["stderr"]
