"""Buckets mounted as directories (SPEC §14, amended 2026-12-04): a local ``dir`` or a directory
``shared`` level on a real FUSE mount with the semantics of Mountpoint for S3 or of Cloud Storage
FUSE (``tests/bucketfs.py``): no rename or no atomic one, no chmod, owners and modes the mount's."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from bucketfs import SEMANTICS, Mounted
from conftest import Venv, autocache_warnings, run_program
from test_activation import VERSION_DIR
from test_levels import report


@pytest.fixture(params=SEMANTICS)
def bucket(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Mounted]:
    mounted = Mounted(tmp_path / "objects", tmp_path / "mnt", request.param)
    yield mounted
    mounted.close()


def warnings(stderr: str) -> list[str]:
    return [line for line in autocache_warnings(stderr) if "AutocacheWarning" in line]


def test_a_bucket_mount_as_dir_is_written_whole_served_and_healed(venv: Venv, bucket: Mounted) -> None:
    """Under ``-W error``: the cold run writes each entry and its sidecar as one object (no temporary
    name, no rename, no bookkeeping folder), the warm run is all hits, a corrupt object is compiled
    again and replaced (a delete, then a create: Mountpoint overwrites nothing), and ``status`` says
    what the mount cannot do."""
    env = {"GKX_JAX_CACHE_DIR": str(bucket.mountpoint / "jax"), "GKX_JAX_CACHE_REPORT": "1"}
    cold, err = run_program(venv, "-W", "error", env=env)
    assert report(err)["misses"] == cold["requests"] > 0 and not warnings(err), err
    objects = bucket.objects()
    names = [o for o in objects if o.endswith("-cache")]
    assert len(names) == cold["requests"], objects
    assert len([o for o in objects if o.endswith("-gkx-compile")]) == len(names), objects
    assert not [o for o in objects if Path(o).name.startswith(".") or ".gkx-autocache" in o], objects
    warm, err = run_program(venv, "-W", "error", env=env)
    assert warm["hits"] == warm["requests"] == cold["requests"] and warm["result"] == cold["result"], err
    corrupt = bucket.backing / names[0]
    corrupt.write_bytes(b"\x78\x9c" + os.urandom(200))  # a zlib header, then noise: it does not decompress
    healed, err = run_program(venv, "-W", "error", env=env)
    assert healed["result"] == cold["result"] and healed["hits"] == healed["requests"] - 1, err
    assert corrupt.stat().st_size != 202, "the corrupt object was not replaced"
    again, err = run_program(venv, "-W", "error", env=env)
    assert again["hits"] == again["requests"], err
    status = json.loads(venv.cli("--json", "status", env=env).stdout)
    tool = {"mountpoint": "Mountpoint for S3", "gcsfuse": "Cloud Storage FUSE"}[bucket.semantics]
    assert tool in status["directory"]["mount"] and "written whole in one create" in status["directory"]["mount"]
    text = venv.cli("status", env=env).stdout
    assert f"mount    a bucket mount ({tool}" in text and "is on a bucket mount, which keeps no records" in text, text
    for command in ("stats", "explain"):  # said in --json too, not the "none yet" of a directory never used
        assert json.loads(venv.cli("--json", command, env=env).stdout)["kept"] is False, command
    pruned = venv.cli("prune", env={**env, "GKX_JAX_CACHE_MAX_SIZE": "1K"})  # by hand: no cap is kept at exit
    assert pruned.returncode == 0 and "removed" in pruned.stdout, pruned.stderr
    assert len([o for o in bucket.objects() if o.endswith("-cache")]) < len(names), bucket.objects()


def test_a_bucket_mount_as_the_shared_level_serves_a_fresh_machine(venv: Venv, tmp_path: Path,
                                                                   bucket: Mounted) -> None:
    """The team's level a mounted bucket: a writer's entries go up as whole objects with their seals,
    and a fresh machine (another local level) is served every one from the mount."""
    shared = bucket.mountpoint / "team"
    shared.mkdir()  # a shared level is a folder the team made (the package makes only its version folder)
    env = {"GKX_JAX_CACHE_SHARED": str(shared), "GKX_JAX_CACHE_REPORT": "1"}
    cold, err = run_program(venv, "-W", "error", env={**env, "GKX_JAX_CACHE_DIR": str(tmp_path / "writer")})
    assert not warnings(err), err
    up = [o for o in bucket.objects("team") if o.endswith("-cache")]
    assert len(up) == cold["requests"], bucket.objects()
    assert not [o for o in bucket.objects() if Path(o).name.startswith(".")], bucket.objects()
    fresh, err = run_program(venv, "-W", "error", env={**env, "GKX_JAX_CACHE_DIR": str(tmp_path / "fresh")})
    assert fresh["hits"] == fresh["requests"] == cold["requests"], err
    assert report(err)["shared"] == cold["requests"] and fresh["result"] == cold["result"], err
    assert len(list((tmp_path / "fresh" / VERSION_DIR).glob("*-cache"))) == cold["requests"]


def test_a_mount_made_by_someone_else_is_refused_whatever_owner_it_shows(venv: Venv, tmp_path: Path) -> None:
    """A mount another user made (uid 12345, allow_other) shows every file as this user's (root's):
    its mounter chose that. As ``dir`` it is refused with one warning naming the mounter, and the run
    finishes uncached; nothing is written there."""
    mounted = Mounted(tmp_path / "objects", tmp_path / "mnt", "gcsfuse", user_id=12345)
    try:
        assert os.stat(mounted.mountpoint).st_uid == os.getuid()  # the owner it shows
        env = {"GKX_JAX_CACHE_DIR": str(mounted.mountpoint / "jax"), "GKX_JAX_CACHE_REPORT": "1"}
        out, err = run_program(venv, env=env)
        said = warnings(err)
        assert len(said) == 1 and "made by uid 12345" in said[0] and "mount it yourself" in said[0], err
        assert out["hits"] == 0 and mounted.objects() == [], mounted.objects()
    finally:
        mounted.close()


@pytest.mark.parametrize("case", ["no-default-permissions", "another-users-sshfs", "group-writable-files",
                                  "symlink-in-the-bucket"])
def test_a_mount_whose_modes_cannot_be_trusted_is_refused_with_one_warning(venv: Venv, tmp_path: Path,
                                                                          case: str) -> None:
    """Refused, the run finishing uncached with one warning that says why: a mount open to every user
    (allow_other) whose modes the kernel does not check (no default_permissions: rclone's default);
    a FUSE mount of any type (here sshfs's) another user made; a bucket mount whose files all show a
    group-writable mode (``--file-mode=664``: each entry would be refused, run after run); a symlink
    inside the bucket (an object anyone who can write it made) on the way to ``dir``."""
    options: dict[str, dict[str, object]] = {
        "no-default-permissions": {"default_permissions": None},
        "another-users-sshfs": {"subtype": "sshfs"},
        "group-writable-files": {"file_mode": 0o664},
        "symlink-in-the-bucket": {},
    }
    mounted = Mounted(tmp_path / "objects", tmp_path / "mnt", "gcsfuse",
                      user_id=12345 if case == "another-users-sshfs" else None, options=options[case])
    try:
        target = mounted.mountpoint / "jax"
        if case == "symlink-in-the-bucket":
            (tmp_path / "mine").mkdir()
            (mounted.backing / "planted").symlink_to(tmp_path / "mine")
            target = mounted.mountpoint / "planted"
        out, err = run_program(venv, env={"GKX_JAX_CACHE_DIR": str(target), "GKX_JAX_CACHE_REPORT": "1"})
        said = warnings(err)
        why = {"no-default-permissions": "without default_permissions", "another-users-sshfs": "made by uid 12345",
               "group-writable-files": "show mode 0664", "symlink-in-the-bucket": "a symlink inside a"}[case]
        assert len(said) == 1 and why in said[0], err
        assert out["hits"] == 0 and not [o for o in mounted.objects() if o.endswith("-cache")], mounted.objects()
        assert not list((tmp_path / "mine").rglob("*-cache")) if case == "symlink-in-the-bucket" else True
    finally:
        mounted.close()


def test_a_bucket_a_csi_driver_mounts_is_known_by_its_plain_fuse_type(venv: Venv, tmp_path: Path) -> None:
    """GKE's Cloud Storage FUSE CSI driver mounts with the type plain ``fuse`` and the bucket's name as
    source: a bucket mount all the same (written whole, served warm), where a file system mounted
    with a subtype (sshfs, JuiceFS) is left as it is."""
    mounted = Mounted(tmp_path / "objects", tmp_path / "mnt", "gcsfuse", options={"subtype": None, "fsname": "team-bucket"})
    try:
        env = {"GKX_JAX_CACHE_DIR": str(mounted.mountpoint / "jax"), "GKX_JAX_CACHE_REPORT": "1"}
        cold, err = run_program(venv, "-W", "error", env=env)
        assert not warnings(err) and len([o for o in mounted.objects() if o.endswith("-cache")]) == cold["requests"]
        warm, err = run_program(venv, "-W", "error", env=env)
        assert warm["hits"] == warm["requests"] == cold["requests"], err
        status = json.loads(venv.cli("--json", "status", env=env).stdout)
        assert "a bucket (team-bucket), fuse" in status["directory"]["mount"], status["directory"]
    finally:
        mounted.close()


def test_the_mount_a_path_is_on_is_read_where_the_directory_is_chosen(tmp_path: Path) -> None:
    """In-process, as a framework naming a directory after ``import jax``: a mount made after the
    mounts were first read is seen (another user's: refused); a mount made over an older one, which
    hides it, is the one a path is on; a symlink of yours pointing into the bucket, to a link the
    bucket holds, is refused; a bucket whose ``CACHEDIR.TAG`` is a folder (hiding the mode files
    get) is refused."""
    import subprocess

    from gkx_autocache import _cache, _mount

    _mount.fuse_mount(str(tmp_path))  # the mounts, read before any of these is made
    late = Mounted(tmp_path / "late-objects", tmp_path / "late", "gcsfuse", user_id=12345)
    try:
        with pytest.raises(_cache.DirectoryRefused, match="made by uid 12345"):
            _cache.prepare(str(late.mountpoint / "jax"), "1.0")
    finally:
        late.close()
    hidden = tmp_path / "over"
    (hidden / "older").mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(hidden / "older")], check=True)
    try:
        over = Mounted(tmp_path / "over-objects", hidden, "gcsfuse", user_id=12345, options={"nonempty": True})
        try:
            with pytest.raises(_cache.DirectoryRefused, match="made by uid 12345"):
                _cache.prepare(str(hidden / "older" / "jax"), "1.0")
        finally:
            over.close()
    finally:
        subprocess.run(["umount", "-l", str(hidden / "older")], check=False)
    bucket = Mounted(tmp_path / "objects", tmp_path / "mnt", "gcsfuse")
    try:
        (tmp_path / "victim").mkdir()
        (bucket.backing / "x").symlink_to(tmp_path / "victim")
        (tmp_path / "mine").symlink_to(bucket.mountpoint / "x")
        with pytest.raises(_cache.DirectoryRefused, match="a symlink inside a"):
            _cache.prepare(str(tmp_path / "mine" / "cache"), "1.0")
        assert list((tmp_path / "victim").iterdir()) == []
    finally:
        bucket.close()
    tagged = Mounted(tmp_path / "t-objects", tmp_path / "t", "gcsfuse", options={"file_mode": 0o664})
    try:
        (tagged.backing / "jax" / "jax-1.0" / "CACHEDIR.TAG").mkdir(parents=True)
        (tagged.backing / "jax" / "CACHEDIR.TAG").mkdir()
        with pytest.raises(_cache.DirectoryRefused, match="is not a file"):
            _cache.prepare(str(tagged.mountpoint / "jax"), "1.0")
    finally:
        tagged.close()
