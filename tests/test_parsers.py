"""Every parser of outside input, with Hypothesis: setting values from variables and TOML, whole
TOML files, ledger lines and summaries, bundle manifests and member names. Any input yields a
value or the package's own one-line refusal, never another exception."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gkx_autocache import _bundle, _policy, _settings
from gkx_autocache._record import fold as _fold
from gkx_autocache._record import ledger as _ledger

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
toml_scalars = st.booleans() | st.integers() | st.floats() | st.text() | st.lists(st.integers(), max_size=3)
big_numbers = st.integers(min_value=10**18, max_value=10**500).map(str) | st.just("9" * 4000) | st.just("1e400")


def one_line(message: str) -> None:
    assert "\n" not in message and "\r" not in message and len(message) < 600, message


@SETTINGS
@given(key=st.sampled_from(sorted(_settings.KEYS)), raw=st.text() | big_numbers,
       env=st.dictionaries(st.from_regex(r"[A-Z_]{1,8}", fullmatch=True), st.text(max_size=20), max_size=3))
def test_setting_values_from_variables(key: str, raw: str, env: dict[str, str]) -> None:
    try:
        _settings.validate(key, raw, "/base", env)
    except _settings.BadValue as exc:
        one_line(str(exc))


@SETTINGS
@given(key=st.sampled_from(sorted(_settings.KEYS)), raw=toml_scalars | st.integers(min_value=10**300, max_value=10**400))
def test_setting_values_from_toml(key: str, raw: Any) -> None:
    try:
        _settings.validate(key, raw, "/base", {})
    except _settings.BadValue as exc:
        one_line(str(exc))


@SETTINGS
@given(content=st.binary(max_size=300) | st.text(max_size=300).map(str.encode)
       | st.dictionaries(st.sampled_from([*sorted(_settings.KEYS), "colour"]), toml_scalars, max_size=5).map(
           lambda d: "".join(f"{k} = {json.dumps(v) if not isinstance(v, bool) else str(v).lower()}\n" for k, v in d.items()).encode()))
def test_whole_toml_files(tmp_path_factory: Any, content: bytes) -> None:
    """Any file: read or ignored with one reason; resolving with it yields values and one-line problems."""
    folder = tmp_path_factory.mktemp("toml")
    path = folder / "gkx-autocache.toml"
    path.write_bytes(content)
    path.chmod(0o644)
    verdict = _policy.read(str(path))
    assert verdict.status in ("used", "ignored")
    if verdict.problem:
        one_line(verdict.problem)
    resolved = _settings.resolve({}, str(folder), str(folder / "none.toml"), cwd="/cwd")
    assert set(resolved.values) == set(_settings.KEYS)
    for _cause, message in resolved.problems:
        one_line(message)


@SETTINGS
@given(line=st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode())
       | st.dictionaries(st.sampled_from(["e", "key", "bytes", "saved", "compile", "own", "cause", "t", "hits"]),
                         json_values, max_size=6).map(lambda d: json.dumps({"e": "hit", **d}).encode()))
def test_ledger_lines(line: bytes) -> None:
    record = _ledger.parse_record(line)
    if record is not None:
        totals = _ledger.Totals()
        totals.add(record)
        json.dumps(totals.to_json())
        assert totals.hits >= 0 and totals.saved_secs >= 0


@SETTINGS
@given(data=json_values | st.dictionaries(st.sampled_from(["format", "totals", "size", "scanned_at", "folded",
                                                           "recent", "explain"]), json_values, max_size=7).map(
    lambda d: {**d, "format": 1}))
def test_summaries(data: Any) -> None:
    summary = _fold.Summary.from_json(data)
    json.dumps(summary.to_json())
    assert summary.size >= 0


def tar_with(manifest: bytes, names: list[str]) -> tarfile.TarFile:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
        info = tarfile.TarInfo(_bundle.MANIFEST)
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
    buffer.seek(0)
    return tarfile.open(fileobj=buffer, mode="r")


manifests = json_values.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=100) | st.builds(
    lambda files, fmt: json.dumps({"format": fmt, "files": files}).encode(),
    st.lists(st.dictionaries(st.sampled_from(["name", "size", "sha256"]), json_values | big_numbers, max_size=3),
             max_size=3), st.sampled_from([1, 2, "1", None]))


@SETTINGS
@given(manifest=manifests)
def test_bundle_manifests(manifest: bytes) -> None:
    try:
        tar = tar_with(manifest, [])
        read = _bundle.read_manifest(tar, tar.getmember(_bundle.MANIFEST))
    except _bundle.BundleRefused as exc:
        one_line(str(exc))
        return
    for name, (size, digest) in read["files"].items():
        assert isinstance(name, str) and isinstance(size, int) and size >= 0 and isinstance(digest, str)
    try:
        _bundle.check_room(read["files"], "/tmp", 10**9)
    except _bundle.BundleRefused as exc:
        one_line(str(exc))


@SETTINGS
@given(name=st.text(min_size=1, max_size=120) | st.sampled_from(["../x", "/etc/passwd", "a/b", "..", ".hidden-cache",
                                                                   f"jit_f-{'a' * 64}-cache"]))
def test_bundle_member_names(name: str) -> None:
    info = tarfile.TarInfo(name)
    info.size = 1
    try:
        _bundle.check_member(info, {name: (1, "0" * 64)})
    except _bundle.BundleRefused as exc:
        one_line(str(exc))
        return
    from gkx_autocache._layout import key_match

    assert "/" not in name and not name.startswith(".") and key_match(name) is not None


@SETTINGS
@given(raw=st.text(max_size=30) | big_numbers.map(lambda n: n + "d") | st.sampled_from(["30d", "1.5h", " 2W ", "1e9d"]))
def test_ages(raw: str) -> None:
    """``prune --older-than``: a finite number of seconds, or the one-line refusal."""
    try:
        assert 0 <= _settings.parse_age(raw) < 1e20
    except _settings.BadValue as exc:
        one_line(str(exc))


names_like_keys = st.builds(
    lambda prefix, digest, suffix: f"{prefix}-{digest}{suffix}",
    st.text(min_size=0, max_size=12) | st.from_regex(r"[a-z_]{1,10}", fullmatch=True),
    st.text(alphabet="0123456789abcdefABCDEFg_ ", min_size=62, max_size=66) | st.just("a" * 64),
    st.sampled_from(["-cache", "-gkx-compile", "-x", "cache", "-cache ", "-", "-gkx-compile-cache"]))


@SETTINGS
@given(name=names_like_keys | st.text(max_size=90) | st.just(f"jit_a\u200db-{'a' * 64}-cache"))  # an invisible joiner
def test_key_names_read_alike_on_the_fast_path(name: str) -> None:
    """``key_match`` decides the two common names by a shorter pattern (``common_name``, all that ``count``
    asks of them): it must agree with the full one."""
    import re

    from gkx_autocache._layout import _KEY, key_match

    full = re.fullmatch(_KEY, name) if name.isprintable() else None
    assert key_match(name) == (None if full is None else (full["key"], full["suffix"])), name


def test_the_properties_can_fail(tmp_path: Path) -> None:
    """A check above can fail: a message with a newline is not one line."""
    try:
        one_line("two\nlines")
    except AssertionError:
        return
    raise AssertionError("one_line accepted two lines")


def _valid_bundle() -> bytes:
    """A small bundle as export writes it: the manifest first, an entry and its sidecar."""
    import hashlib

    files = [(f"jit_f-{'ab' * 32}-cache", b"x\x9c" + bytes(700)), (f"jit_f-{'ab' * 32}-gkx-compile", b"0.25")]
    listed = [{"name": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in files]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [(_bundle.MANIFEST, json.dumps({"format": 1, "files": listed}).encode()), *files]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


VALID_BUNDLE = _valid_bundle()


def _flipped(flips: list[tuple[int, int]]) -> bytes:
    changed = dict(flips)
    return bytes(changed.get(i, b) for i, b in enumerate(VALID_BUNDLE))


def _compressed_cut(kind: str, cut: int) -> bytes:
    import bz2
    import gzip
    import lzma

    compress: dict[str, Callable[[bytes], bytes]] = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress}
    data = compress[kind](VALID_BUNDLE)
    return data[:len(data) - cut]


bundles = (st.binary(max_size=2000)
           | st.lists(st.tuples(st.integers(0, len(VALID_BUNDLE) - 1), st.integers(0, 255)), min_size=1,
                      max_size=8).map(_flipped)
           | st.integers(0, len(VALID_BUNDLE)).map(lambda n: VALID_BUNDLE[:n])
           | st.builds(_compressed_cut, st.sampled_from(["gz", "bz2", "xz"]), st.integers(0, 400)))


@SETTINGS
@given(archive=bundles)
def test_whole_bundles(tmp_path_factory: Any, archive: bytes) -> None:
    """Any archive (random bytes, a bundle with bytes changed, cut short, compressed and cut
    short): imported whole, or refused in one line with nothing left in the directory."""
    folder = tmp_path_factory.mktemp("bundle")
    path, target = folder / "in.tar", folder / "target"
    path.write_bytes(archive)
    target.mkdir()
    environment = {"jax": None, "jaxlib": None, "system": None, "machine": None}
    try:
        done = _bundle.import_bundle(str(path), str(target), environment, force=True)
    except _bundle.BundleRefused as exc:
        one_line(str(exc))
        assert list(target.iterdir()) == []
        return
    assert len(list(target.iterdir())) == done.files
