"""Every level honours ``HTTPS_PROXY``, ``HTTP_PROXY`` and ``NO_PROXY`` (SPEC §14, amended
2026-12-06; issue 61): the HTTP level and the S3 level's own client through a real forward proxy
(Debian's tinyproxy, ``tests/forward.py``): an https cache (nginx) and an https bucket (moto) by a
``CONNECT`` tunnel, an http cache by an absolute-form request, and around it where ``NO_PROXY``
names the host; gcsfs told to read the variables. In-process, against real servers."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import S3, local_at, start_s3_server, stop_s3_server
from forward import Tinyproxy, certificate
from test_activation import VERSION_DIR
from webdav import Nginx

from gkx_autocache._backends import proxies
from gkx_autocache._backends.choose import backend_for
from gkx_autocache._backends.http import HttpCache
from gkx_autocache._backends.s3 import Deferred
from gkx_autocache._entry import Entry as Found
from gkx_autocache._shared.calls import Progress
from gkx_autocache._shared.level import Level
from gkx_autocache._shared.seal import make_seal


@pytest.fixture
def tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that this process trusts (``SSL_CERT_FILE``)."""
    pair = certificate(tmp_path / "tls")
    monkeypatch.setenv("SSL_CERT_FILE", str(pair[0]))
    return pair


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[Tinyproxy]:
    server = Tinyproxy(tmp_path / "proxy")
    yield server
    server.close()


def round_trip(cache: HttpCache) -> None:
    """A write and a read of one object, and the kept connections closed."""
    try:
        cache.write("probe-gkx-shared", b"a seal")
        assert cache.small("probe-gkx-shared") == b"a seal"
    finally:
        cache.forget()


def test_the_http_level_tunnels_through_the_proxy_and_goes_around_it_where_no_proxy_says(
        tmp_path: Path, tls: tuple[Path, Path], proxy: Tinyproxy) -> None:
    """An https cache through HTTPS_PROXY by CONNECT (the request stays encrypted to nginx), an
    http cache through HTTP_PROXY by its whole URL, and both direct where NO_PROXY names the host
    (in any case, lower case first)."""
    secure, plain = Nginx(tmp_path / "secure", tls=tls), Nginx(tmp_path / "plain")
    try:
        env = {"HTTPS_PROXY": proxy.url, "http_proxy": proxy.url}
        round_trip(HttpCache(f"{secure.url}/{VERSION_DIR}", env=env))
        assert proxy.requests() and {r.rsplit(" ", 1)[0] for r in proxy.requests()} == {f"CONNECT 127.0.0.1:{secure.port}"}
        got = f"GET /cache/{VERSION_DIR}/probe-gkx-shared"
        deadline = time.monotonic() + 5  # (nginx logs a request once it has answered it)
        while not any(r.startswith(got) for r in secure.requests()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(r.startswith(got) for r in secure.requests()), secure.requests()
        round_trip(HttpCache(f"{plain.url}/{VERSION_DIR}", env=env))
        whole = f"http://127.0.0.1:{plain.port}/cache/{VERSION_DIR}/probe-gkx-shared HTTP/1.1"
        assert {f"PUT {whole}", f"GET {whole}"} <= set(proxy.requests()), proxy.requests()
        before = len(proxy.requests())
        for around in ({"NO_PROXY": "localhost,127.0.0.1"}, {"no_proxy": "127.0.0.0/8", "NO_PROXY": "elsewhere"}):
            round_trip(HttpCache(f"{secure.url}/{VERSION_DIR}", env={**env, **around}))
            round_trip(HttpCache(f"{plain.url}/{VERSION_DIR}", env={**env, **around}))
        assert len(proxy.requests()) == before, proxy.requests()[before:]
    finally:
        secure.close()
        plain.close()


def test_an_s3_level_goes_through_the_proxy_on_its_own_client(tmp_path: Path, tls: tuple[Path, Path],
                                                               proxy: Tinyproxy) -> None:
    """An https bucket (moto, checking signatures) behind a CONNECT proxy: the level's own client
    (no s3fs: a proxy chose s3fs before) lists, reads and writes through the tunnel; with NO_PROXY,
    around it."""
    import boto3

    endpoint, server = start_s3_server(tls=tls)
    try:
        store = S3(endpoint, "proxied")
        access, secret = store.keys
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=access,
                     aws_secret_access_key=secret, verify=str(tls[0])).create_bucket(Bucket=store.bucket)
        env = {**store.env, "AWS_CA_BUNDLE": str(tls[0]), "HTTPS_PROXY": proxy.url, "HOME": str(tmp_path)}
        key = "jit_f-" + hashlib.sha256(b"f").hexdigest()
        data = b"\x78\x01" + os.urandom(300 << 10)  # (two blocks: a ranged read after the first)
        for around in ({}, {"NO_PROXY": "127.0.0.1"}):
            before = len(proxy.requests())
            backend = backend_for(f"s3://{store.bucket}/team", "0.4.30", False, {**env, **around})
            assert isinstance(backend, Deferred)
            level = Level(f"s3://{store.bucket}/team", backend, local=local_at(tmp_path / "local"), timeout=10.0,
                          writes="never", secret=None)
            try:
                backend.write(key + "-gkx-shared", make_seal(key, data, 1.0, time.time(), None))
                backend.write(key + "-cache", data)
                found = level.read(key).found
                assert isinstance(found, Found) and found.data == data, found
                listed = backend.listing(Progress())
                assert isinstance(listed, dict) and listed[key + "-cache"] == len(data)
                assert type(backend.chosen()).__name__ == "S3", backend.why
            finally:
                backend.forget()
            tunnels = proxy.requests()[before:]
            if around:
                assert tunnels == [], tunnels
            else:
                assert tunnels and {t.rsplit(" ", 1)[0] for t in tunnels} == {f"CONNECT 127.0.0.1:{endpoint.rsplit(':', 1)[1]}"}
    finally:
        stop_s3_server(endpoint, server)


def test_no_proxy_and_the_proxy_variables_as_the_standard_library_and_curl_read_them() -> None:
    found = proxies.settings({"HTTPS_PROXY": "http://upper:1", "https_proxy": "http://lower:2", "ALL_PROXY": "a:3",
                              "NO_PROXY": ".corp.example,10.0.0.0/8,[::1],db:5432"})
    assert found == {"https": "http://lower:2", "all": "a:3", "no": ".corp.example,10.0.0.0/8,[::1],db:5432"}
    assert proxies.proxy_for("https://s3.amazonaws.com/b", found).shown == "http://lower:2"  # type: ignore[union-attr]
    assert proxies.proxy_for("http://cache.lan/x", found).shown == "http://a:3"  # type: ignore[union-attr]
    for direct in ("https://x.corp.example/a", "https://corp.example/", "http://10.1.2.3/", "http://[::1]:8/",
                   "http://db:5432/"):
        assert proxies.proxy_for(direct, found) is None, direct
    assert proxies.proxy_for("http://db:80/", found) is not None
    assert "HTTP_PROXY" not in str(proxies.settings({"HTTP_PROXY": "http://p:1", "REQUEST_METHOD": "GET"}))  # httpoxy
    with_login = proxies.parse("http://us%40er:p%3Ass@proxy:3128", "https")
    assert with_login.authorization == "Basic dXNAZXI6cDpzcw==" and "p:ss" not in with_login.shown
    for bad in ("socks5://proxy:1080", "https://proxy:443"):
        with pytest.raises(proxies.Unsupported):
            proxies.parse(bad, "https")


def test_gcsfs_is_told_to_read_the_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """gcsfs's aiohttp session reads HTTPS_PROXY only with ``trust_env``: a gs:// level gets it
    where a proxy is named (s3fs's botocore reads them itself)."""
    import fsspec.core

    from gkx_autocache import _remote

    seen: list[dict[str, object]] = []

    def url_to_fs(url: str, **options: object) -> tuple[None, str]:
        seen.append(options)
        return None, url

    monkeypatch.setattr(fsspec.core, "url_to_fs", url_to_fs)
    for name in [n for n in os.environ if n.lower().endswith("_proxy")]:
        monkeypatch.delenv(name)
    _remote.filesystem("gs://b/x", own=True)
    monkeypatch.setenv("https_proxy", "http://proxy:3128")
    _remote.filesystem("gs://b/x", own=True)
    _remote.filesystem("s3://b/x", own=True)
    assert [o.get("session_kwargs") for o in seen] == [None, {"trust_env": True}, None], seen
