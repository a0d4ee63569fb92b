"""Warm bundles (SPEC §9): ``export`` in one environment, ``import`` into a fresh one at another
path, and every way a bundle is refused having written nothing."""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
from conftest import Venv, make_venv, public_tmp, run_program
from test_activation import JAX_VERSION, VERSION_DIR

MANIFEST = "gkx-autocache-manifest.json"


def export(venv: Venv, archive: Path) -> dict[str, object]:
    proc = venv.cli("--json", "export", str(archive))
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


@pytest.fixture
def bundle(venv: Venv, tmp_path: Path) -> tuple[Path, dict[str, object]]:
    """A bundle of a real cold run's entries."""
    cold, _ = run_program(venv)
    assert cold["hits"] == 0
    archive = tmp_path / "warm.tar"
    return archive, export(venv, archive)


def test_export_then_import_into_a_fresh_environment_is_warm(venv: Venv, wheel: Path,
                                                             bundle: tuple[Path, dict[str, object]]) -> None:
    archive, exported = bundle
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile(MANIFEST))  # type: ignore[arg-type]
        names = {m.name for m in tar.getmembers()} - {MANIFEST}
    assert manifest["jax"] == JAX_VERSION and manifest["jaxlib"] and manifest["system"] and manifest["machine"]
    assert {f["name"] for f in manifest["files"]} == names and exported["files"] == len(names)
    assert exported["entries"] == sum(n.endswith("-cache") for n in names) >= 2

    base = public_tmp()
    try:
        fresh = make_venv(base, wheel)
        proc = fresh.cli("--json", "import", str(archive), "--sha256", str(exported["sha256"]))
        assert proc.returncode == 0, proc.stderr
        imported = json.loads(proc.stdout)
        target = fresh.default_cache / VERSION_DIR
        assert imported["dir"] == str(target) and imported["entries"] == exported["entries"]
        assert names <= {p.name for p in target.iterdir()}
        assert all(p.stat().st_mode & 0o777 == 0o600 for p in target.iterdir() if p.name in names)
        warm, _ = run_program(fresh)
        assert warm["hits"] == warm["requests"] == exported["entries"]
        again = json.loads(fresh.cli("--json", "import", str(archive)).stdout)
        assert again["entries"] == 0 and again["present"] == exported["entries"]
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def rewrite(source: Path, target: Path, *, change: str | None = None, extra: tarfile.TarInfo | None = None,
            extra_data: bytes = b"", manifest_edit: dict[str, object] | None = None, list_extra: bool = True) -> None:
    """A copy of the bundle with one thing wrong."""
    import hashlib

    with tarfile.open(source) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    manifest = json.loads(dict((m.name, d) for m, d in members)[MANIFEST])
    with tarfile.open(target, "w") as out:
        for member, data in members:
            if member.name == MANIFEST:
                continue
            if member.name.endswith("-cache") and member.name.startswith(change or "\0"):
                data = data[:-1] + bytes([data[-1] ^ 0xFF])  # the manifest keeps the old hash
            out.addfile(member, io.BytesIO(data))
        if extra is not None:
            if extra.isreg():
                extra.size = len(extra_data)
            out.addfile(extra, io.BytesIO(extra_data) if extra.isreg() else None)
            if list_extra:
                manifest["files"].append({"name": extra.name, "size": extra.size,
                                          "sha256": hashlib.sha256(extra_data).hexdigest()})
        manifest.update(manifest_edit or {})
        blob = json.dumps(manifest).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(blob)
        out.addfile(info, io.BytesIO(blob))


def link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


def regular(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


KEY = "jit_evil-" + "cd" * 32


@pytest.mark.parametrize("case, why", [
    ("corrupt", "does not match its sha256"),
    ("traversal", "not the name of a cache entry"),
    ("absolute", "not the name of a cache entry"),
    ("link", "is a link"),
    ("unlisted", "not listed in the manifest"),
    ("other-jax", "made for jax 0.0.1"),
    ("wrong-sha256", "sha256 is"),
    ("not-a-tar", "not a readable archive"),
])
def test_refused_bundles_write_nothing(venv: Venv, tmp_path: Path, bundle: tuple[Path, dict[str, object]],
                                       case: str, why: str) -> None:
    good, _ = bundle
    bad = tmp_path / "bad.tar"
    args: list[str] = []
    if case == "corrupt":
        rewrite(good, bad, change="jit_")
    elif case == "traversal":
        rewrite(good, bad, extra=regular(f"../{KEY}-cache"), extra_data=b"x\x9c")
    elif case == "absolute":
        rewrite(good, bad, extra=regular(f"/tmp/{KEY}-cache"), extra_data=b"x\x9c")
    elif case == "link":
        rewrite(good, bad, extra=link(f"{KEY}-cache", "/etc/passwd"))
    elif case == "unlisted":
        rewrite(good, bad, extra=regular(f"{KEY}-cache"), extra_data=b"x\x9c", list_extra=False)
    elif case == "other-jax":
        rewrite(good, bad, manifest_edit={"jax": "0.0.1"})
    elif case == "wrong-sha256":
        bad = good
        args = ["--sha256", "0" * 64]
    else:
        bad.write_bytes(b"this is not a tar archive" * 100)
    target = tmp_path / "target"
    proc = venv.cli("import", str(bad), *args, env={"GKX_JAX_CACHE_DIR": str(target)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("gkx-autocache import:") and why in line and line.endswith("nothing imported")
    vdir = target / VERSION_DIR
    assert not [p for p in vdir.iterdir() if p.name != "CACHEDIR.TAG"]  # no entry, no temporary file
    assert not (target / f"{KEY}-cache").exists() and not Path(f"/tmp/{KEY}-cache").exists()
    if case == "other-jax":  # --force is the way past a version mismatch
        forced = venv.cli("import", str(bad), "--force", env={"GKX_JAX_CACHE_DIR": str(target)})
        assert forced.returncode == 0, forced.stderr
        assert any(p.name.endswith("-cache") for p in vdir.iterdir())


def crafted(path: Path, members: list[tuple[str, bytes]], sizes: dict[str, object] | None = None,
            compress: bool = False, raw_size: str | None = None) -> None:
    """A bundle made by hand: these members, and a manifest that lists each (with ``sizes``
    overriding what the manifest declares, or ``raw_size`` written verbatim as every size)."""
    import hashlib

    files = [{"name": n, "size": (sizes or {}).get(n, len(d)), "sha256": hashlib.sha256(d).hexdigest()}
             for n, d in members]
    manifest = {"format": 1, "created_by": "gkx-autocache", **_here(), "files": files}
    text = json.dumps(manifest)
    if raw_size is not None:
        text = re.sub(r'"size": -?\d+', f'"size": {raw_size}', text)
    with tarfile.open(path, "w:gz" if compress else "w") as out:
        for name, data in [*members, (MANIFEST, text.encode())]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))


def _here() -> dict[str, object]:
    from importlib.metadata import version

    from gkx_autocache._bundle import environment

    return environment(JAX_VERSION, version("jaxlib"))


@pytest.mark.parametrize("case, why", [
    ("over-the-cap", "more than max_size"),
    ("bomb", "more than max_size"),
    ("over-free-space", "free space"),
    ("huge-number", "size"),
    ("negative", "size"),
    ("duplicate", "twice"),
])
def test_bundles_larger_than_the_cache_are_refused_before_writing(venv: Venv, tmp_path: Path, case: str,
                                                                  why: str) -> None:
    """A bundle declaring more than the cap or the free space, a manifest with an absurd size, or
    one member twice: one line, exit 1, nothing written."""
    bad = tmp_path / "bad.tar"
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "target"), "GKX_JAX_CACHE_MAX_SIZE": "10MB"}
    name = f"{KEY}-cache"
    small = [(name, b"x" * 1000)]
    if case == "over-the-cap":
        crafted(bad, small, sizes={name: 20_000_000})
    elif case == "bomb":  # 50 MB of zeros is a small gzip: refused before any of it is written
        crafted(bad, [(name, bytes(50_000_000))], compress=True)
        assert bad.stat().st_size < 1_000_000
    elif case == "over-free-space":
        env["GKX_JAX_CACHE_MAX_SIZE"] = "0"
        crafted(bad, small, sizes={name: 10**18})
    elif case == "huge-number":
        crafted(bad, small, raw_size="1e400")
    elif case == "negative":
        crafted(bad, small, sizes={name: -5})
    else:
        crafted(bad, [*small, *small])
    proc = venv.cli("import", str(bad), env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("gkx-autocache import:") and why in line and line.endswith("nothing imported"), line
    vdir = tmp_path / "target" / VERSION_DIR
    assert not [p for p in vdir.iterdir() if p.name != "CACHEDIR.TAG"]
