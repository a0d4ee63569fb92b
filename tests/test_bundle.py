"""Warm bundles (SPEC §9): ``export`` in one environment, ``import`` into a fresh one at another
path, and every way a bundle is refused having written nothing."""

from __future__ import annotations

import io
import json
import lzma
import os
import re
import subprocess
import sys
import tarfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import PEAK_RSS, InProcess, Venv, clean_env, make_venv, public_tmp, run_program
from test_activation import JAX_VERSION, VERSION_DIR

pytestmark = pytest.mark.every_python  # tarfile's extraction filters differ between Pythons

MANIFEST = "gkx-autocache-manifest.json"


def export(venv: Venv | InProcess, archive: Path) -> dict[str, object]:
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


@pytest.fixture
def planted_bundle(here: InProcess, tmp_path: Path) -> tuple[Path, dict[str, object]]:
    """A bundle of planted entries (two, each with its compile time), exported in this process:
    for what a bundle's refusal reads (its names, hashes, sizes, manifest), not what JAX loads."""
    from gkx_autocache import _cache

    vdir = Path(_cache.prepare(str(here.default_cache), JAX_VERSION).version_dir or "")
    for name in ("jit_f", "jit_g"):
        key = f"{name}-{zlib.crc32(name.encode()):064x}"
        (vdir / f"{key}-cache").write_bytes(zlib.compress(os.urandom(2000)))
        (vdir / f"{key}-gkx-compile").write_text("0.5")
    archive = tmp_path / "warm.tar"
    return archive, export(here, archive)


def test_export_then_import_into_a_fresh_environment_is_warm(venv: Venv, wheel: Path,
                                                             bundle: tuple[Path, dict[str, object]]) -> None:
    """A bundle written with its manifest first imports at another path, and the next run is warm."""
    archive, exported = bundle
    with tarfile.open(archive) as tar:
        first = tar.next()
        assert first is not None and first.name == MANIFEST  # first: it bounds what import reads after it
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
            extra_data: bytes = b"", manifest_edit: dict[str, object] | None = None, list_extra: bool = True,
            manifest_first: bool = False) -> None:
    """A copy of the bundle with one thing wrong, its manifest last (the earlier layout) or first."""
    import hashlib

    with tarfile.open(source) as tar:
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]  # type: ignore[union-attr]
    manifest = json.loads(dict((m.name, d) for m, d in members)[MANIFEST])
    body = io.BytesIO()
    with tarfile.open(fileobj=body, mode="w") as out:
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
        end = out.offset  # where the members end: close() adds the end-of-archive blocks
    manifest.update(manifest_edit or {})
    head = _member(MANIFEST, json.dumps(manifest).encode())
    body_bytes = body.getvalue()[:end]
    target.write_bytes(head + body_bytes + bytes(1024) if manifest_first else body_bytes + head + bytes(1024))


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
@pytest.mark.parametrize("first", [False, True], ids=["manifest-last", "manifest-first"])
def test_refused_bundles_write_nothing(here: InProcess, tmp_path: Path,
                                       planted_bundle: tuple[Path, dict[str, object]],
                                       case: str, why: str, first: bool) -> None:
    """A corrupt entry, an escaping name, a link, an unlisted member, another JAX, a wrong
    --sha256, not a tar: one line, exit 1, nothing written, whichever layout."""
    good, _ = planted_bundle
    bad = tmp_path / "bad.tar"
    args: list[str] = []
    if case == "corrupt":
        rewrite(good, bad, change="jit_", manifest_first=first)
    elif case == "traversal":
        rewrite(good, bad, extra=regular(f"../{KEY}-cache"), extra_data=b"x\x9c", manifest_first=first)
    elif case == "absolute":
        rewrite(good, bad, extra=regular(f"/tmp/{KEY}-cache"), extra_data=b"x\x9c", manifest_first=first)
    elif case == "link":
        rewrite(good, bad, extra=link(f"{KEY}-cache", "/etc/passwd"), manifest_first=first)
    elif case == "unlisted":
        rewrite(good, bad, extra=regular(f"{KEY}-cache"), extra_data=b"x\x9c", list_extra=False, manifest_first=first)
    elif case == "other-jax":
        rewrite(good, bad, manifest_edit={"jax": "0.0.1"}, manifest_first=first)
    elif case == "wrong-sha256":
        bad = good
        args = ["--sha256", "0" * 64]
    else:
        bad.write_bytes(b"this is not a tar archive" * 100)
    target = tmp_path / "target"
    proc = here.cli("import", str(bad), *args, env={"GKX_JAX_CACHE_DIR": str(target)})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("gkx-autocache import:") and why in line and line.endswith("nothing imported")
    vdir = target / VERSION_DIR
    assert not [p for p in vdir.iterdir() if p.name != "CACHEDIR.TAG"]  # no entry, no temporary file
    assert not (target / f"{KEY}-cache").exists() and not Path(f"/tmp/{KEY}-cache").exists()
    if case == "other-jax":  # --force is the way past a version mismatch
        forced = here.cli("import", str(bad), "--force", env={"GKX_JAX_CACHE_DIR": str(target)})
        assert forced.returncode == 0, forced.stderr
        assert any(p.name.endswith("-cache") for p in vdir.iterdir())


def crafted(path: Path, members: list[tuple[str, bytes]], sizes: dict[str, object] | None = None,
            compress: bool = False, raw_size: str | None = None, manifest_first: bool = False) -> None:
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
        head = [(MANIFEST, text.encode())]
        for name, data in [*head, *members] if manifest_first else [*members, *head]:
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
@pytest.mark.parametrize("first", [False, True], ids=["manifest-last", "manifest-first"])
def test_bundles_larger_than_the_cache_are_refused_before_writing(here: InProcess, tmp_path: Path, case: str,
                                                                  why: str, first: bool) -> None:
    """A bundle declaring more than the cap or the free space, a manifest with an absurd size, or
    one member twice: one line, exit 1, nothing written."""
    bad = tmp_path / "bad.tar"
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "target"), "GKX_JAX_CACHE_MAX_SIZE": "10MB"}
    name = f"{KEY}-cache"
    small = [(name, b"x" * 1000)]
    if case == "over-the-cap":
        crafted(bad, small, sizes={name: 20_000_000}, manifest_first=first)
    elif case == "bomb":  # 50 MB of zeros is a small gzip: refused before any of it is written
        crafted(bad, [(name, bytes(50_000_000))], compress=True, manifest_first=first)
        assert bad.stat().st_size < 1_000_000
    elif case == "over-free-space":
        env["GKX_JAX_CACHE_MAX_SIZE"] = "0"
        crafted(bad, small, sizes={name: 10**18}, manifest_first=first)
    elif case == "huge-number":
        crafted(bad, small, raw_size="1e400", manifest_first=first)
    elif case == "negative":
        crafted(bad, small, sizes={name: -5}, manifest_first=first)
    else:
        crafted(bad, [*small, *small], manifest_first=first)
    proc = here.cli("import", str(bad), env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("gkx-autocache import:") and why in line and line.endswith("nothing imported"), line
    vdir = tmp_path / "target" / VERSION_DIR
    assert not [p for p in vdir.iterdir() if p.name != "CACHEDIR.TAG"]


def test_two_exports_of_unchanged_entries_are_byte_identical(here: InProcess, tmp_path: Path,
                                                             planted_bundle: tuple[Path, dict[str, object]]) -> None:
    """A bundle can be content-addressed and compared (issue 71): exporting the same entries again,
    later, gives the same bytes (the first export's reads had moved each entry's access time, which
    the manifest carries as its recency: a new sha256 every time). Its members are in order, with no
    time, owner or mode of the exporting machine; the bundle still imports, recency and all."""
    first, exported = planted_bundle
    vdir = Path(str(exported["dir"]))
    entry = next(vdir.glob("*-cache"))
    long_ago = time.time() - 3 * 86400  # (relatime moves an access time older than a day on a read)
    for path in vdir.glob("jit_*"):
        os.utime(path, (long_ago, long_ago))
    again = tmp_path / "again.tar"
    time.sleep(1.1)
    assert export(here, again)["sha256"] == export(here, first)["sha256"]
    assert first.read_bytes() == again.read_bytes()
    assert abs(entry.stat().st_atime - long_ago) < 1, "export made the entry recently used"
    with tarfile.open(again) as tar:
        members = tar.getmembers()
    assert members[0].name == MANIFEST and [m.name for m in members[1:]] == sorted(m.name for m in members[1:])
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {(0, 0, 0, "", "", 0o600)}
    target = tmp_path / "target"
    proc = here.cli("--json", "import", str(again), env={"GKX_JAX_CACHE_DIR": str(target)})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["entries"] == exported["entries"] == 2
    (landed,) = (target / VERSION_DIR).glob(entry.name)
    assert abs(landed.stat().st_atime - long_ago) < 1  # (before a read of it here moves it)
    assert landed.read_bytes() == entry.read_bytes()


def test_a_read_that_keeps_the_access_time_reads_another_users_file_all_the_same(public: Path) -> None:
    """``O_NOATIME`` is for the file's owner: an export by another member of a team directory reads
    that member's entries plainly (EPERM, then an ordinary open), never skips them."""
    from conftest import in_a_child_as

    from gkx_autocache import _files

    path = public / "jit_f-cache"
    path.write_bytes(b"entry")
    path.chmod(0o644)
    assert in_a_child_as(65534, (), lambda: _files.read(str(path), keep_atime=True)) == b"entry"


def test_a_bundle_of_the_earlier_layout_still_imports(here: InProcess, tmp_path: Path,
                                                      planted_bundle: tuple[Path, dict[str, object]]) -> None:
    """A bundle written before the manifest came first (manifest last) imports as before."""
    good, exported = planted_bundle
    old = tmp_path / "old.tar"
    rewrite(good, old)  # the same members, the manifest last
    with tarfile.open(old) as tar:
        assert tar.getmembers()[-1].name == MANIFEST
    proc = here.cli("--json", "import", str(old), env={"GKX_JAX_CACHE_DIR": str(tmp_path / "target")})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["entries"] == exported["entries"]


# -- memory and time bounded by the manifest (SPEC §8) --------------------------------------------


def _header(name: str, size: int = 0, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(tarfile.GNU_FORMAT)


def _member(name: str, data: bytes) -> bytes:
    return _header(name, len(data)) + data + bytes(-len(data) % 512)


def _zero_size_members(count: int) -> Iterator[bytes]:
    """``count`` zero-size members with names like entries, 1000 headers at a time (a header
    patched in place, its checksum recomputed: tarfile takes 7 s for 300 000)."""
    template = bytearray(_header(f"jit_f{0:06d}-{'a' * 64}-cache"))
    for start in range(0, count, 1000):
        chunk = []
        for i in range(start, min(count, start + 1000)):
            block = bytearray(template)
            block[5:11] = b"%06d" % i
            block[148:156] = b" " * 8
            block[148:155] = b"%06o\0" % sum(block)
            chunk.append(bytes(block))
        yield b"".join(chunk)


def _manifest(files: list[tuple[str, bytes]]) -> bytes:
    import hashlib

    listed = [{"name": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in files]
    return json.dumps({"format": 1, "created_by": "gkx-autocache", **_here(), "files": listed}).encode()


MEASURED = f"""import sys
from gkx_autocache._cli.main import main
code = main(sys.argv[1:])
print(({PEAK_RSS}) >> 20)  # peak RSS, MiB
sys.exit(code)
"""


def _import_measured(archive: Path, target: Path) -> tuple[str, int, float]:
    """``gkx-autocache import`` of ``archive`` in a fresh process (of this interpreter: no venv is
    needed): its one-line refusal, its peak RSS in MiB, seconds."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", MEASURED, "import", str(archive)], capture_output=True, text=True,
                          env=clean_env(HOME=str(target.parent), GKX_JAX_CACHE_DIR=str(target)), cwd=str(target.parent),
                          timeout=600)
    seconds = time.monotonic() - start
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert not [p for p in (target / VERSION_DIR).iterdir() if p.name != "CACHEDIR.TAG"]  # nothing written
    return line, int(proc.stdout.split()[-1]), seconds


@pytest.mark.once  # slow, and the same on every JAX line
@pytest.mark.parametrize("layout, why", [
    ("manifest-last", "more than 100000 members before its manifest"),
    ("manifest-first", f"'jit_f000000-{'a' * 32}... (84 characters) is not listed in the manifest"),
])
def test_a_small_archive_of_many_headers_is_refused_with_bounded_memory(tmp_path: Path, layout: str,
                                                                        why: str) -> None:
    """300 000 zero-size members (a 0.4 MB .tar.xz): refused at the first member beyond what the
    manifest lists (manifest first) or beyond the earlier layout's cap of 100 000 (manifest
    last), in bounded memory and time, having written nothing."""
    one = [(f"{KEY}-cache", b"x\x9c")]
    archive = tmp_path / "many.tar.xz"
    compressor = lzma.LZMACompressor(preset=1)
    with archive.open("wb") as out:
        out.write(compressor.compress(_member(MANIFEST, _manifest(one)) if layout == "manifest-first" else b""))
        out.write(compressor.compress(_member(*one[0])))
        for chunk in _zero_size_members(300_000):
            out.write(compressor.compress(chunk))
        out.write(compressor.compress(_member(MANIFEST, _manifest(one)) if layout == "manifest-last" else b""))
        out.write(compressor.compress(bytes(1024)) + compressor.flush())
    assert archive.stat().st_size < 1_000_000
    line, peak_mib, seconds = _import_measured(archive, tmp_path / "target")
    assert line.startswith("gkx-autocache import:") and why in line and line.endswith("nothing imported"), line
    print(f"{layout}: peak {peak_mib} MiB, {seconds:.1f} s")  # pytest -s shows it
    assert peak_mib < 150 and seconds < 60, (peak_mib, seconds)  # measured: 47 MiB; 2.0 s, 0.1 s (before: 180 MiB, 6 s)


def test_a_huge_tar_header_in_a_small_archive_is_refused_with_bounded_memory(tmp_path: Path) -> None:
    """A GNU long-name header declaring 512 MiB of name (zeros: 100 KB of xz) is refused before
    tarfile reads it into memory, as is a PAX header of that size."""
    zeros = lzma.compress(bytes(8 << 20), preset=1)  # xz streams may be concatenated: 64 of them
    for kind in (tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE):
        archive = tmp_path / "long.tar.xz"
        with archive.open("wb") as out:
            out.write(lzma.compress(_member(MANIFEST, _manifest([])) + _header("././@LongLink", 512 << 20, kind)))
            for _ in range(64):
                out.write(zeros)
        assert archive.stat().st_size < 200_000
        line, peak_mib, seconds = _import_measured(archive, tmp_path / f"target-{kind!r}")
        assert "damaged" in line and line.endswith("nothing imported"), line
        print(f"{kind!r}: peak {peak_mib} MiB, {seconds:.1f} s")  # pytest -s shows it
        assert peak_mib < 150 and seconds < 60, (peak_mib, seconds)  # measured: 63 MiB, 0.2 s (before: 551 MiB)


@pytest.mark.parametrize("extra, why", [("unlisted", "is not listed in the manifest"), ("again", "appears twice")])
def test_a_member_beyond_a_first_manifest_is_refused_at_that_member(here: InProcess, tmp_path: Path, extra: str,
                                                                    why: str) -> None:
    """With the manifest first, the first member beyond what it lists (another name, or a listed
    one again) is refused, having written nothing."""
    listed = [(f"{KEY}-cache", b"x\x9c"), (f"{KEY}-gkx-compile", b"0.5")]
    beyond = (f"jit_more-{'ab' * 32}-cache", b"x\x9c") if extra == "unlisted" else listed[0]
    archive = tmp_path / "extra.tar"
    archive.write_bytes(_member(MANIFEST, _manifest(listed)) + b"".join(_member(*m) for m in [*listed, beyond])
                        + bytes(1024))
    target = tmp_path / "target"
    proc = here.cli("import", str(archive), env={"GKX_JAX_CACHE_DIR": str(target)})
    (line,) = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and why in line and shown_name(beyond[0]) in line, line
    assert not [p for p in (target / VERSION_DIR).iterdir() if p.name != "CACHEDIR.TAG"]
    archive.write_bytes(_member(MANIFEST, _manifest(listed)) + b"".join(_member(*m) for m in listed) + bytes(1024))
    proc = here.cli("--json", "import", str(archive), env={"GKX_JAX_CACHE_DIR": str(target)})
    assert proc.returncode == 0 and json.loads(proc.stdout)["files"] == 2, proc.stderr


def shown_name(name: str) -> str:
    from gkx_autocache._diagnostics import shown

    return shown(name)


@pytest.mark.parametrize("members, imported", [(3, True), (4, False)])
def test_the_earlier_layout_is_read_up_to_its_stated_member_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                members: int, imported: bool) -> None:
    """A bundle whose manifest comes last imports with up to EARLIER_LAYOUT_MEMBERS members before
    it, and is refused beyond (here the cap is made 3)."""
    from gkx_autocache import _bundle

    monkeypatch.setattr(_bundle, "EARLIER_LAYOUT_MEMBERS", 3)
    files = [(f"jit_m{i}-{'ab' * 32}-cache", b"x\x9c%d" % i) for i in range(members)]
    archive = tmp_path / "old.tar"
    archive.write_bytes(b"".join(_member(*m) for m in files) + _member(MANIFEST, _manifest(files)) + bytes(1024))
    target = tmp_path / "target"
    target.mkdir()
    if imported:
        done = _bundle.import_bundle(str(archive), str(target), _here())
        assert done.files == members and sorted(p.name for p in target.iterdir()) == sorted(n for n, _ in files)
    else:
        with pytest.raises(_bundle.BundleRefused, match="more than 3 members before its manifest"):
            _bundle.import_bundle(str(archive), str(target), _here())
        assert list(target.iterdir()) == []


def test_a_bundle_carries_its_records_so_a_later_miss_is_explained(venv: Venv, wheel: Path, tmp_path: Path) -> None:
    """The README's CI recipe imports a bundle, then the run's flags change: each miss names the
    flag (the bundle carried what each entry's key was made of), never `new` beside its entry."""
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "main.py").write_text("import jax, jax.numpy as jnp\n@jax.jit\ndef energy(x):\n"
                                    "    return (x * x).sum()\nprint(float(energy(jnp.ones(8))))\n")
    assert venv.run(str(folder / "main.py"), cwd=str(folder)).returncode == 0
    archive = tmp_path / "warm.tar"
    export(venv, archive)
    base = public_tmp()
    try:
        fresh = make_venv(base, wheel)
        assert fresh.cli("import", str(archive)).returncode == 0
        proc = fresh.run(str(folder / "main.py"), env={"XLA_FLAGS": "--xla_cpu_enable_fast_math=true"}, cwd=str(folder))
        assert proc.returncode == 0, proc.stderr
        data = json.loads(fresh.cli("--json", "explain").stdout)
        found = {g["cause"]: {f["name"]: f["detail"] for f in g["functions"]} for g in data["groups"]}
        assert set(found) == {"changed XLA_FLAGS"}, found
        assert found["changed XLA_FLAGS"]["jit_energy"].startswith("XLA_FLAGS: '' -> '--xla_cpu_enable_fast_math=true'")
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_a_bundle_from_another_cpu_is_kept_old_and_never_loaded(venv: Venv, wheel: Path, tmp_path: Path) -> None:
    """Imported on a CPU without AVX-512 (a fake CPUID and /proc/cpuinfo in a private mount namespace), a
    bundle built here says how many entries were built for another CPU; they keep their original
    access time (they must not push useful entries out) and a run there loads none of them."""
    import cpus
    from test_isa import needs_unshare, on_cpu

    from gkx_autocache import _isa

    avx512 = {f for f in _isa.read().features if f.startswith("avx512")}
    if not avx512 or needs_unshare.args[0]:
        pytest.skip("needs AVX-512 to take away and a private mount namespace")
    cold, _ = run_program(venv)
    vdir = venv.default_cache / VERSION_DIR
    old = time.time() - 30 * 86400
    for entry in vdir.glob("*-cache"):
        import os

        os.utime(entry, (old, old))
    archive = tmp_path / "warm.tar"
    export(venv, archive)
    fake = cpus.real_less(tmp_path, avx512)
    base = public_tmp()
    try:
        fresh = make_venv(base, wheel)
        proc = on_cpu(fresh, fake, "-m", "gkx_autocache", "--json", "import", str(archive), env={})
        assert proc.returncode == 0, proc.stderr
        imported = json.loads(proc.stdout)
        assert imported["entries"] == cold["requests"] and imported["other_cpu"] == imported["entries"], imported
        target = fresh.default_cache / VERSION_DIR
        assert all(abs(p.stat().st_atime - old) < 5 for p in target.glob("*-cache"))
        from conftest import PROGRAM

        proc = on_cpu(fresh, fake, "-c", PROGRAM, env={})
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout.strip().splitlines()[-1])["hits"] == 0
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_a_bundle_carries_no_record_and_one_with_a_record_is_refused(here: InProcess, tmp_path: Path) -> None:
    """Records (issue 69) are compiled by ``rebuild``, which trusts only those written here: an
    export leaves them out, and a bundle holding one is refused, before anything is written."""
    from gkx_autocache import _cache

    vdir = Path(_cache.prepare(str(here.default_cache), JAX_VERSION).version_dir or "")
    key = f"jit_f-{zlib.crc32(b'jit_f'):064x}"
    (vdir / f"{key}-cache").write_bytes(zlib.compress(os.urandom(2000)))
    (vdir / f"{key}-gkx-record").write_bytes(b"gkx-autocache record 1\n{}\n")
    archive = tmp_path / "warm.tar"
    export(here, archive)
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert f"{key}-cache" in names and f"{key}-gkx-record" not in names
    bad = tmp_path / "bad.tar"
    crafted(bad, [(f"{key}-cache", zlib.compress(b"x" * 100)), (f"{key}-gkx-record", b"planted")])
    target = tmp_path / "target"
    proc = here.cli("import", str(bad), env={"GKX_JAX_CACHE_DIR": str(target)})
    assert proc.returncode == 1 and "is a record" in proc.stderr, proc.stdout + proc.stderr
    assert not [p for p in (target / VERSION_DIR).iterdir() if p.name != "CACHEDIR.TAG"]
