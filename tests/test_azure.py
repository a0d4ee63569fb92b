"""Azure Blob Storage as a shared level (``az://container/prefix``, ``_backends/azure.py``), against
Azurite, Microsoft's emulator (``blobs.py``): each credential Azure users have (a connection string
with the account key or a SAS token, Azurite's development account, ``DefaultAzureCredential``'s
bearer token), the listing paged, ranged reads, a proxy, the 413-like refusal, signing, prefetch and
packs, and the commands; most through the level's objects in this process, one with real JAX."""

from __future__ import annotations

import http.server
import importlib.machinery
import json
import re
import sys
import threading
import time
import types
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from blobs import ACCOUNT, KEY, Azurite, bearer_token
from conftest import JAX_VERSION, InProcess, Venv, local_at, planted_run, run_program
from forward import Tinyproxy, certificate
from test_activation import VERSION_DIR
from test_port import landed as landed_in
from test_port import local_of

from gkx_autocache import _diagnostics, _settings
from gkx_autocache._backends import azure
from gkx_autocache._backends.choose import backend_for
from gkx_autocache._shared.calls import Progress
from gkx_autocache._shared.level import Level

KEYS = [f"jit_f{i}-{i:064x}" for i in range(5)]
SIGNING_KEY = b"a team's signing key"


def entry(i: int, size: int = 3000) -> bytes:
    return zlib.compress(bytes([i]) * size + b"executable", 0)


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test's warnings said afresh (the package says each once a process); the levels' kept
    connections closed after it."""
    monkeypatch.setattr(_diagnostics, "_said", set())
    yield
    for level in MADE:
        level.channel.backend.forget()
    MADE.clear()


MADE: list[Level] = []


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    server = Azurite(tmp_path_factory.mktemp("azurite"))
    yield server
    server.close()


def blob_level(url: str, env: dict[str, str], local: Path, secret: bytes | None = None, **more: Any) -> Level:
    backend = backend_for(url, "0.4.30", False, env)
    MADE.append(Level(url, backend, local=local_at(local, signs=secret is not None), timeout=10.0, writes=None,
                      secret=secret, **more))
    return MADE[-1]


def round_trip(level: Level, reader: Level) -> None:
    """Entries uploaded by ``level``, then each read back by ``reader``: hits, the bytes as written."""
    for i, key in enumerate(KEYS):
        level.put(key, entry(i), 0.5, written=time.time())
    level.finish()
    assert level.snapshot()["uploads"] == len(KEYS) and level.channel.off is None, level.channel.off_note
    found = [reader.read(key).found for key in KEYS]
    assert [f.data if f is not None else None for f in found] == [entry(i) for i in range(len(KEYS))], reader.channel.off
    reader.finish()
    assert reader.snapshot()["hits"] == len(KEYS)


def test_the_account_and_its_credentials_are_read_as_azure_s_tools_read_them() -> None:
    """The connection string first (its key, its SAS token, its endpoint; Azurite's development
    storage), then the account and its key or SAS token, then ``DefaultAzureCredential`` where
    azure-identity is installed; without an account, one line that says what to set."""
    dev = azure.account({"AZURE_STORAGE_CONNECTION_STRING": "UseDevelopmentStorage=true"})
    assert (dev.name, dev.endpoint, dev.how, dev.secret) == (ACCOUNT, "http://127.0.0.1:10000/devstoreaccount1", "key", KEY)
    found = azure.account({"AZURE_STORAGE_CONNECTION_STRING": "DefaultEndpointsProtocol=https;AccountName=acme;"
                                                              "AccountKey=a2V5==;EndpointSuffix=core.chinacloudapi.cn"})
    assert (found.endpoint, found.how, found.secret) == ("https://acme.blob.core.chinacloudapi.cn", "key", "a2V5==")
    sas = azure.account({"AZURE_STORAGE_CONNECTION_STRING": "BlobEndpoint=https://acme.blob.core.windows.net/;"
                                                            "SharedAccessSignature=?sv=2022&sig=abc%2B"})
    assert (sas.name, sas.how, sas.secret) == ("acme", "sas", "sv=2022&sig=abc%2B")
    keyed = azure.account({"AZURE_STORAGE_ACCOUNT": "acme", "AZURE_STORAGE_KEY": "a2V5"})
    assert (keyed.endpoint, keyed.how, keyed.source) == ("https://acme.blob.core.windows.net", "key",
                                                        "the account key of acme (AZURE_STORAGE_KEY)")
    assert azure.account({"AZURE_STORAGE_ACCOUNT_NAME": "acme", "AZURE_STORAGE_SAS_TOKEN": "sv=1&sig=x"}).how == "sas"
    bad = azure.account({"AZURE_STORAGE_ACCOUNT": "acme", "AZURE_STORAGE_SAS_TOKEN": "sv=1\nsig=x"})
    assert bad.problem is not None and "sig" not in bad.problem
    assert "set AZURE_STORAGE_CONNECTION_STRING" in (azure.account({}).problem or "")
    assert "KEY" not in azure.account({"AZURE_STORAGE_ACCOUNT": "acme", "AZURE_STORAGE_KEY": "a2V5"}).source.split(" (")[0]


def test_az_urls_are_shared_levels_and_a_sas_in_one_is_refused(tmp_path: Path) -> None:
    """``az://container/prefix`` is a ``shared`` level (not a ``dir``: JAX's own cache cannot hold
    one); a SAS token pasted into the URL is refused in one line that never shows it."""
    assert _settings.parse_dir("az://cache/team", "/", {}, shared=True) == "az://cache/team"
    with pytest.raises(_settings.BadValue, match="a gs://bucket or s3://bucket URL, got 'az://cache/team'"):
        _settings.parse_dir("az://cache/team", "/", {})
    with pytest.raises(_settings.BadValue) as refused:
        _settings.parse_dir("az://cache/team?sv=2022&sig=s3cret", "/", {}, shared=True)
    assert "AZURE_STORAGE_SAS_TOKEN" in str(refused.value) and "s3cret" not in str(refused.value)
    with pytest.raises(_settings.BadValue, match="gs://bucket, s3://bucket, az://container or https:// URL"):
        _settings.parse_dir("azure://cache/team", "/", {}, shared=True)


def test_a_level_in_a_container_round_trips_with_the_account_key(tmp_path: Path, azurite: Azurite) -> None:
    """Shared Key, signed here: entries and seals go up as blobs a plain client reads back as they
    were written (the container is public), and another machine's lookups are served them."""
    container = azurite.container()
    url = f"az://{container}/team"
    round_trip(blob_level(url, azurite.env(), tmp_path / "a"), blob_level(url, azurite.env(), tmp_path / "b"))
    stored = azurite.objects(container)
    for i, key in enumerate(KEYS):
        assert stored[f"team/jax-0.4.30/{key}-cache"] == entry(i)
        assert json.loads(stored[f"team/jax-0.4.30/{key}-gkx-shared"])["bytes"] == len(entry(i))


def test_a_sas_token_serves_the_level_and_is_never_said(tmp_path: Path, azurite: Azurite) -> None:
    """An account SAS in the connection string: the same round trip; an error names the blob by
    its ``az://`` name and the credentials by where they come from, never the token."""
    container = azurite.container()
    sas = azurite.account_sas()
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string(sas=sas)}
    url = f"az://{container}/team"
    round_trip(blob_level(url, env, tmp_path / "a"), blob_level(url, env, tmp_path / "b"))
    reader = blob_level(f"az://gkx-missing-{container}/team", env, tmp_path / "c")
    with pytest.warns(Warning) as said:
        assert reader.read(KEYS[0]).found is None
    message = str(said[0].message)
    assert "ContainerNotFound" in message and f"az://gkx-missing-{container}/team" in message, message
    assert azurite.account_sas().split("sig=")[1] not in message and "sig=" not in message, message
    _diagnostics._said.clear()  # (the level's off-warning is said once a process)
    readonly = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string(sas=azurite.account_sas("rl"))}
    writer = blob_level(url, readonly, tmp_path / "d")
    with pytest.warns(Warning, match="403"):
        writer.put(KEYS[0] + "0", entry(0), 0.5, written=time.time())
        writer.finish()
    assert writer.snapshot()["uploads"] == 0


def test_a_wrong_key_turns_the_level_off_naming_where_the_key_came_from(tmp_path: Path, azurite: Azurite) -> None:
    """Azure refuses a signature made with another key (403): the level is off after one warning
    that names the connection string, never the key. (A private container: Azurite serves a public
    one's reads whatever the signature.)"""
    container = azurite.container(public=False)
    wrong = "d3Jvbmcga2V5IG9mIGFub3RoZXIgYWNjb3VudA=="
    level = blob_level(f"az://{container}/team", {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string(wrong)},
                       tmp_path / "a")
    with pytest.warns(Warning) as said:
        assert level.read(KEYS[0]).found is None
    message = str(said[0].message)
    assert "403" in message and "AZURE_STORAGE_CONNECTION_STRING" in message and wrong not in message, message
    assert level.channel.off is not None


def test_the_listing_is_one_page_and_the_commands_read_every_page(tmp_path: Path, azurite: Azurite,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A lookup's listing is one List Blobs page ("more than ..." beyond it: each miss asks for its
    key); the commands' ``names`` follow ``NextMarker`` to the end."""
    container = azurite.container()
    backend = backend_for(f"az://{container}/team", "0.4.30", False, azurite.env())
    for i in range(5):
        backend.write(f"{KEYS[i]}-cache", entry(i))
    monkeypatch.setattr(azure, "LIST_LIMIT", 2)
    assert backend.listing(Progress()) == "more than 2"
    names = backend.names(Progress())
    assert sorted(name for name, _, _ in names) == sorted(f"{key}-cache" for key in KEYS)
    assert all(size == len(entry(i)) for (name, size, _), i in zip(sorted(names), range(5), strict=True))
    assert all(abs(written - time.time()) < 300 for _, _, written in names)
    backend.forget()


def test_a_writer_s_pack_lands_on_a_fresh_machine_and_signatures_hold(tmp_path: Path, azurite: Azurite) -> None:
    """With a signing key: the writer's entries, manifest and pack go up signed; a fresh machine's
    first miss streams the pack and lands the rest, checked; a reader with another key is served none."""
    container = azurite.container()
    url = f"az://{container}/team"
    writer = blob_level(url, azurite.env(), tmp_path / "a", SIGNING_KEY)
    for i, key in enumerate(KEYS):
        writer.local_miss(key)
        seal = writer.vouch(key, entry(i), 0.5, 1.0)
        local_of(writer).put(key, entry(i), 0.5, "", seal)
        writer.put(key, entry(i), 0.5, seal=seal, written=1.0)
    writer.finish()
    stored = azurite.objects(container)
    assert any(n.endswith("-gkx-pack") for n in stored) and any(n.endswith("-gkx-manifest") for n in stored), stored
    fresh = blob_level(url, azurite.env(), tmp_path / "b", SIGNING_KEY)
    fresh.local_miss(KEYS[0])
    assert fresh.read(KEYS[0]).found is not None
    deadline = time.monotonic() + 20
    while len(local_of(fresh).landings.items()) < len(KEYS) - 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    fresh.finish()
    landed = landed_in(local_of(fresh))
    assert landed == {key: entry(i) for i, key in enumerate(KEYS) if i}, sorted(landed)
    other = blob_level(url, azurite.env(), tmp_path / "c", b"another key")
    answer = other.read(KEYS[1])
    assert answer.found is None and (answer.refused or "").startswith("not signed"), answer


class Refusing(http.server.BaseHTTPRequestHandler):
    """A Blob endpoint that refuses a body over ``LIMIT`` bytes as Azure does (413,
    ``RequestBodyTooLarge``) and keeps the rest; lists what it keeps."""

    LIMIT = 4000
    kept: dict[str, bytes] = {}

    def log_message(self, *args: Any) -> None:
        pass

    def do_PUT(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if len(body) > self.LIMIT:
            reply = (b'<?xml version="1.0" encoding="utf-8"?><Error><Code>RequestBodyTooLarge</Code><Message>The '
                     b"request body is too large and exceeds the maximum permissible limit.</Message></Error>")
            self.send_response(413, "The request body is too large and exceeds the maximum permissible limit.")
            self.send_header("Content-Type", "application/xml")
            self.send_header("x-ms-error-code", "RequestBodyTooLarge")
        else:
            self.kept[self.path.split("?")[0]] = body
            reply = b""
            self.send_response(201)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def do_GET(self) -> None:  # noqa: N802
        reply = b"<?xml version='1.0'?><EnumerationResults><Blobs></Blobs><NextMarker/></EnumerationResults>"
        self.send_response(200)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


def test_a_blob_refused_for_its_size_skips_that_entry_and_the_level_stays_on(tmp_path: Path) -> None:
    """Azure's ``RequestBodyTooLarge`` (413) is the port's ``TooLarge``: that entry is skipped, with
    one warning saying Azure's limit, and the smaller ones go up."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"AZURE_STORAGE_CONNECTION_STRING": f"AccountName={ACCOUNT};AccountKey={KEY};"
                                                  f"BlobEndpoint=http://127.0.0.1:{server.server_port}/{ACCOUNT}"}
        level = blob_level("az://cache/team", env, tmp_path / "a")
        large, small = entry(9, 20_000), entry(1)
        with pytest.warns(Warning, match="5000 MiB in one Put Blob") as said:
            level.put(KEYS[0], large, 0.5, written=time.time())
            level.put(KEYS[1], small, 0.5, written=time.time())
            level.finish()
        assert "RequestBodyTooLarge" in str(said[0].message)
        counts = level.snapshot()
        assert counts["uploads"] == 1 and counts["skipped"] == 1 and level.channel.off is None, counts
        assert f"/{ACCOUNT}/cache/team/jax-0.4.30/{KEYS[1]}-cache" in Refusing.kept
    finally:
        server.shutdown()
        server.server_close()


def test_the_level_goes_through_the_environment_s_proxy(tmp_path: Path, azurite: Azurite) -> None:
    """``HTTP_PROXY`` carries the level's requests (Azurite on plain http: the whole URL asked of
    the proxy); ``NO_PROXY`` naming the host goes around it."""
    proxy = Tinyproxy(tmp_path / "proxy")
    try:
        container = azurite.container()
        url = f"az://{container}/team"
        env = azurite.env(HTTP_PROXY=proxy.url)
        round_trip(blob_level(url, env, tmp_path / "a"), blob_level(url, env, tmp_path / "b"))
        through = [line for line in proxy.requests() if f":{azurite.port}/" in line]
        assert any(line.startswith("PUT ") for line in through) and any(line.startswith("GET ") for line in through)
        before = len(proxy.requests())
        around = azurite.env(HTTP_PROXY=proxy.url, NO_PROXY="127.0.0.1")
        round_trip(blob_level(f"az://{azurite.container()}/team", around, tmp_path / "c"),
                   blob_level(url, around, tmp_path / "d"))
        assert len(proxy.requests()) == before
    finally:
        proxy.close()


@pytest.fixture
def oauth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Azurite]:
    """Azurite over https, checking bearer tokens; its certificate trusted here (``SSL_CERT_FILE``)."""
    pair = certificate(tmp_path / "tls")
    monkeypatch.setenv("SSL_CERT_FILE", str(pair[0]))
    server = Azurite(tmp_path / "oauth", tls=pair)
    yield server
    server.close()


def test_default_azure_credential_s_bearer_token_serves_the_level(tmp_path: Path, oauth: Azurite,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a key or a SAS token, and with azure-identity installed (here a stand-in module of
    its shape), ``DefaultAzureCredential``'s token for Storage authorizes each request, asked once
    and again before it expires; ``status`` says where it comes from."""
    asked: list[str] = []

    class DefaultAzureCredential:
        def get_token(self, scope: str) -> Any:
            asked.append(scope)
            return types.SimpleNamespace(token=bearer_token(), expires_on=time.time() + 3600)

    identity = types.ModuleType("azure.identity")
    identity.DefaultAzureCredential = DefaultAzureCredential  # type: ignore[attr-defined]
    identity.__spec__ = importlib.machinery.ModuleSpec("azure.identity", None)
    monkeypatch.setitem(sys.modules, "azure", types.ModuleType("azure"))
    monkeypatch.setitem(sys.modules, "azure.identity", identity)
    oauth_env = {"AZURE_STORAGE_CONNECTION_STRING": f"AccountName={ACCOUNT};BlobEndpoint={oauth.endpoint}"}
    url = f"az://{oauth.container()}/team"
    assert backend_for(url, "0.4.30", False, oauth_env).describe()["credentials"].startswith(
        "a bearer token from DefaultAzureCredential")
    round_trip(blob_level(url, oauth_env, tmp_path / "a"), blob_level(url, oauth_env, tmp_path / "b"))
    assert set(asked) == {"https://storage.azure.com/.default"} and len(asked) <= 3, asked


def test_status_prune_and_clear_speak_to_the_container_through_the_level_s_client(
        here: InProcess, tmp_path: Path, azurite: Azurite) -> None:
    """``status`` shows the Azure level, whose credentials, and its entries; ``prune --shared`` and
    ``clear --shared`` remove entries and their seals through the same client, and nothing else."""
    container = azurite.container()
    backend = backend_for(f"az://{container}/team", JAX_VERSION, False, azurite.env())
    vdir = planted_run(tmp_path / "a")
    names = sorted(p.name for p in vdir.glob("*-cache"))
    for name in names:
        backend.write(name.replace("-cache", "-gkx-shared"), b"{}")
        backend.write(name, (vdir / name).read_bytes())
    backend.write("notes.txt", b"mine")
    backend.forget()
    env = azurite.env(GKX_JAX_CACHE_DIR=str(tmp_path / "a"), GKX_JAX_CACHE_SHARED=f"az://{container}/team")
    status = json.loads(here.cli("--json", "status", env=env).stdout)["levels"]["shared"]
    assert status["kind"] == "bucket" and status["probe"]["entries"] == len(names), status
    assert status["credentials"].startswith("the account key of devstoreaccount1 (AZURE_STORAGE_CONNECTION_STRING)")
    assert KEY not in json.dumps(status)
    dry = json.loads(here.cli("--json", "prune", "--shared", "--max-size", "1", "--dry-run", env=env).stdout)
    assert dry["entries"] == len(names) and dry["files"] == 2 * len(names), dry
    cleared = json.loads(here.cli("--json", "clear", "--shared", "--yes", env=env).stdout)
    assert cleared["entries"] == len(names) and cleared["dir"] == f"az://{container}/team/{VERSION_DIR}", cleared
    left = azurite.objects(container)
    assert set(left) == {f"team/{VERSION_DIR}/notes.txt"}, sorted(left)


def test_a_fresh_machine_is_served_from_an_azure_level(venv: Venv, tmp_path: Path, azurite: Azurite) -> None:
    """Real JAX: a cold run uploads to the container; a fresh machine's run is served every entry
    from it (prefetched, landed), and its next run is local."""
    container = azurite.container()
    shared = {**azurite.env(), "GKX_JAX_CACHE_SHARED": f"az://{container}/team", "GKX_JAX_CACHE_REPORT": "1"}
    cold, err = run_program(venv, env={**shared, "GKX_JAX_CACHE_DIR": str(tmp_path / "a")})
    assert cold["hits"] == 0 and "AutocacheWarning" not in err, err
    stored = azurite.objects(container)
    assert sum(n.endswith("-cache") for n in stored) == cold["requests"], sorted(stored)
    fresh, err = run_program(venv, env={**shared, "GKX_JAX_CACHE_DIR": str(tmp_path / "b")})
    assert fresh["hits"] == fresh["requests"] == cold["requests"] and fresh["result"] == cold["result"], err
    line = [ln for ln in err.splitlines() if ln.startswith("gkx-autocache: ")][-1]
    assert re.search(rf"\(0 local, {cold['requests']} shared: \d+ prefetched\)", line), line
    again, err = run_program(venv, env={**shared, "GKX_JAX_CACHE_DIR": str(tmp_path / "b")})
    assert f"({again['requests']} local, 0 shared)" in err, err


class Tokens(http.server.BaseHTTPRequestHandler):
    """A managed identity's token endpoint as App Service and Azure Functions give one
    (``IDENTITY_ENDPOINT``, ``IDENTITY_HEADER``): what ``DefaultAzureCredential`` asks on such a host."""

    asked: list[str] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        self.asked.append(self.path)
        if self.headers.get("X-IDENTITY-HEADER") != "gkx-test":
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        reply = json.dumps({"access_token": bearer_token(), "expires_on": str(int(time.time()) + 3600),
                            "resource": "https://storage.azure.com", "token_type": "Bearer"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)


def test_the_real_default_azure_credential_serves_the_level_from_a_managed_identity(
        tmp_path: Path, oauth: Azurite, monkeypatch: pytest.MonkeyPatch) -> None:
    """With azure-identity itself installed (the ``azure`` extra): ``DefaultAzureCredential`` takes
    the host's managed identity (an App Service token endpoint here) and its token serves the level."""
    pytest.importorskip("azure.identity")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Tokens)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for name in [n for n in __import__("os").environ if n.startswith(("AZURE_", "MSI_", "IDENTITY_"))]:
            monkeypatch.delenv(name)
        monkeypatch.setenv("IDENTITY_ENDPOINT", f"http://127.0.0.1:{server.server_port}/token")
        monkeypatch.setenv("IDENTITY_HEADER", "gkx-test")
        env = {"AZURE_STORAGE_CONNECTION_STRING": f"AccountName={ACCOUNT};BlobEndpoint={oauth.endpoint}"}
        url = f"az://{oauth.container()}/team"
        round_trip(blob_level(url, env, tmp_path / "a"), blob_level(url, env, tmp_path / "b"))
        assert Tokens.asked and all("storage.azure.com" in path for path in Tokens.asked), Tokens.asked
    finally:
        server.shutdown()
        server.server_close()
