"""The S3 level's own client (``_backends/s3.py``, issues 42 and 61): requests signed as botocore signs
them, checked by a server that verifies signatures (conftest's moto); credentials, region and
endpoint as botocore's own session resolves them (``test_credentials``: each source for real); the few
settings that still choose s3fs; a bucket in another region. Every other S3 test (test_levels,
test_prefetch, test_autotune) goes through this client, against the same signature-checking server."""

from __future__ import annotations

import calendar
import http.server
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from conftest import S3, local_at

from gkx_autocache._backends import s3 as client
from gkx_autocache._backends.bucket import Bucket
from gkx_autocache._backends.choose import backend_for
from gkx_autocache._backends.http import HttpError
from gkx_autocache._shared.calls import Progress, describe

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
NO_FILES = {"AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}


@pytest.mark.parametrize(("method", "url", "body", "token"), [
    ("GET", "https://bkt.s3.eu-west-1.amazonaws.com/te%20am%2Bx/jax-0.4.30/abc-cache", None, None),
    ("PUT", "http://127.0.0.1:9000/bkt/p/jax-0.4.30/abc-gkx-shared", b"{\"seal\": 1}", "FwoGZX/session+token=="),
    ("GET", "http://127.0.0.1:9000/bkt?delimiter=%2F&list-type=2&max-keys=1000&prefix=p%2Fjax-0.4.30%2F", None, None),
    ("HEAD", "https://s3.us-east-1.amazonaws.com/my.dotted.bucket/abc-cache", None, None),
])
def test_each_request_is_signed_as_botocore_signs_it(method: str, url: str, body: bytes | None,
                                                     token: str | None) -> None:
    """The same request, signed by botocore's S3 signer and by ours at the same second, carries the
    same ``Authorization`` and payload hash (a path with quoted characters, a query, a session
    token, a body)."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    keys = client.Keys("AKIDEXAMPLE", SECRET, token, "eu-west-1", None, "test")
    theirs = AWSRequest(method=method, url=url, data=body or b"", headers={})
    S3SigV4Auth(Credentials(keys.access, keys.secret, keys.token), "s3", keys.region).add_auth(theirs)
    now = calendar.timegm(time.strptime(theirs.headers["X-Amz-Date"], "%Y%m%dT%H%M%SZ"))
    ours = client.sign(method, url, {}, body, keys, keys.region, now)
    assert ours["Authorization"] == theirs.headers["Authorization"]
    assert ours["x-amz-content-sha256"] == theirs.headers["X-Amz-Content-SHA256"]
    assert ours.get("x-amz-security-token") == (token and theirs.headers["X-Amz-Security-Token"])


def test_a_bucket_is_read_and_written_signed_and_a_wrong_secret_is_one_line(s3: S3) -> None:
    """Against a server that checks signatures: a listing, a write, the first reads, a range and a
    stream all pass with the keys; with a wrong secret the server refuses, and the error is one line
    that names S3's code and where the keys came from, never the secret."""
    found = client.keys(s3.env)
    assert isinstance(found, client.Keys) and found.credentials is None  # the environment's: nothing imported
    deferred = backend_for(f"s3://{s3.bucket}/te am+x", "0.4.30", False, s3.env)
    assert isinstance(deferred, client.Deferred)
    level = deferred.chosen()
    assert isinstance(level, client.S3)
    assert level.listing(Progress()) == {}
    level.write("abc-cache", b"x" * 3000)
    level.write("abc-gkx-shared", b"seal")
    assert level.listing(Progress()) == {"abc-cache": 3000, "abc-gkx-shared": 4}
    assert s3.objects() == {"te am+x/jax-0.4.30/abc-cache": 3000, "te am+x/jax-0.4.30/abc-gkx-shared": 4}
    assert level.first("abc", Progress()) == (b"seal", b"x" * 3000)
    assert level.block("abc", 10, 20) == b"x" * 10 and level.size("abc") == 3000 and level.small("none") == b""
    stream = level.stream("abc-cache", 5)
    assert stream is not None and stream.take(5000) == b"x" * 3000
    stream.close()
    assert level.stream("none", 5) is None
    level.forget()  # its kept connections closed (a level lives as long as its process)
    wrong = client.S3(f"s3://{s3.bucket}/team/jax-0.4.30", found.replaced(secret="not the secret"))
    with pytest.raises(HttpError) as caught:
        wrong.listing(Progress())
    text = str(caught.value)
    assert "403 SignatureDoesNotMatch" in text and "AWS_ACCESS_KEY_ID" in text and "\n" not in text, text
    assert found.secret not in text and "not the secret" not in text
    with pytest.raises(HttpError, match="404 NoSuchBucket"):
        client.S3("s3://no-such-bucket/team/jax-0.4.30", found).listing(Progress())


class Moved(http.server.BaseHTTPRequestHandler):
    """A bucket in eu-west-1, asked in us-east-1 first: S3's 301 naming the region, then the listing."""

    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802
        scope = self.headers["Authorization"].split("Credential=", 1)[1].split(",", 1)[0]
        type(self).seen.append(scope.split("/")[2])
        if "/eu-west-1/" not in scope:
            self.send_response(301)
            self.send_header("x-amz-bucket-region", "eu-west-1")
            self.send_header("Content-Type", "application/xml")
            body = b"<Error><Code>PermanentRedirect</Code><Message>elsewhere</Message></Error>"
        else:
            self.send_response(200)
            body = (b"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/jax-1/k-cache</Key>"
                    b"<Size>7</Size></Contents><Contents><Key>p/jax-1/deeper/x</Key><Size>1</Size></Contents>"
                    b"</ListBucketResult>")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def moved() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Moved)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Moved.seen = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_bucket_in_another_region_is_asked_again_there(moved: str) -> None:
    keys = client.Keys("AKID", SECRET, None, "us-east-1", moved, "test")
    level = client.S3("s3://bkt/p/jax-1", keys)
    assert level.listing(Progress()) == {"k-cache": 7}
    assert Moved.seen == ["us-east-1", "eu-west-1"] and level.region == "eu-west-1"
    assert level.listing(Progress()) == {"k-cache": 7} and Moved.seen[2:] == ["eu-west-1"]  # remembered
    level.forget()


def test_a_region_a_server_names_is_taken_only_where_it_is_one() -> None:
    """A region header that is not a region's name (a proxy's ``evil.example/``) is no redirect: the
    host requests go to is never built from it."""
    keys = client.Keys("AKID", SECRET, None, "us-east-1", None, "test")
    level = client.S3("s3://bkt/p/jax-1", keys)
    for bad in ("evil.example/", "us-east-1.evil.example", "", "EU-WEST-1", "x" * 80):
        assert client.REGION.fullmatch(bad) is None, bad
    for good in ("eu-west-1", "us-gov-east-1", "ap-southeast-5", "cn-north-1"):
        assert client.REGION.fullmatch(good), good
    assert level.base == "https://bkt.s3.us-east-1.amazonaws.com/p/jax-1"


def test_a_listing_page_is_read_by_its_names() -> None:
    """Names directly under the prefix, quoted characters unquoted; a deeper name or another
    prefix's left out; a truncated page is "more than"; a page that is no listing raises."""
    page = ("<ListBucketResult><IsTruncated>false</IsTruncated>"
            "<Contents><Key>p/jax-1/a&amp;b-cache</Key><Size>5</Size></Contents>"
            "<Contents><Key>p/jax-1/sub/c-cache</Key><Size>1</Size></Contents>"
            "<Contents><Key>q/jax-1/d-cache</Key><Size>1</Size></Contents>"
            "<CommonPrefixes><Prefix>p/jax-1/sub/</Prefix></CommonPrefixes></ListBucketResult>")
    assert client._names(page, "p/jax-1/") == {"a&b-cache": 5}
    assert client._names(page.replace(">false<", ">true<"), "p/jax-1/") == "more than 1000"
    with pytest.raises(HttpError, match="not a listing"):
        client._names("<html>a captive portal</html>", "p/jax-1/")


class Flaky(http.server.BaseHTTPRequestHandler):
    """S3 answering 503 SlowDown to each connection's first ``slow`` requests of a key (by path),
    then the listing; the arrival time of every request, by path."""

    protocol_version = "HTTP/1.1"
    slow = 2
    arrivals: dict[str, list[float]] = {}

    def do_GET(self) -> None:  # noqa: N802
        seen = type(self).arrivals.setdefault(self.path.split("?")[0], [])
        seen.append(time.monotonic())
        if len(seen) <= type(self).slow:
            self.send_response(503)
            body = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            self.send_header("Content-Type", "application/xml")
        else:
            self.send_response(200)
            body = b"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>"
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def flaky() -> Iterator[str]:
    Flaky.arrivals = {}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("slow", [2, 9])
def test_a_slow_down_is_asked_again_then_named(flaky: str, slow: int) -> None:
    """A 503 SlowDown (S3 throttling many workers on one prefix) is asked again after a backoff,
    as botocore does, rather than turning the level off; one that goes on is named in one line."""
    Flaky.slow = slow
    level = client.S3("s3://bkt/p/jax-1", client.Keys("AKID", SECRET, None, "us-east-1", flaky, "test"))
    try:
        if slow <= len(client.BACKOFF):
            assert level.listing(Progress()) == {} and len(Flaky.arrivals["/bkt"]) == slow + 1
        else:
            with pytest.raises(HttpError, match="503 SlowDown"):
                level.listing(Progress())
            assert len(Flaky.arrivals["/bkt"]) == len(client.BACKOFF) + 1
    finally:
        level.forget()


def test_a_certificate_that_does_not_verify_is_named_so(tmp_path: Path) -> None:
    """An https endpoint whose certificate this machine does not trust: the error is the
    certificate's, not "a request header is not valid" (ssl's error is a ValueError too)."""
    import ssl
    import subprocess

    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-days", "1",
                    "-keyout", str(tmp_path / "k.pem"), "-out", str(tmp_path / "c.pem")], check=True, capture_output=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Flaky.slow, Flaky.arrivals = 0, {}
    keys = client.Keys("AKID", SECRET, None, "us-east-1", f"https://127.0.0.1:{server.server_address[1]}", "test")
    try:
        with pytest.raises(ssl.SSLCertVerificationError) as caught:
            client.S3("s3://bkt/p/jax-1", keys).listing(Progress())
        said = describe(caught.value)
        assert "certificate" in said and "request header" not in said, said
        trusted = client.S3("s3://bkt/p/jax-1", keys.replaced(cafile=str(tmp_path / "c.pem")))
        assert trusted.listing(Progress()) == {}  # AWS_CA_BUNDLE's certificates are the ones checked
        trusted.forget()
    finally:
        server.shutdown()
        server.server_close()


def test_a_listing_keeps_long_keys_and_their_white_space() -> None:
    """S3's keys are up to 1024 bytes and may hold any white space; a size that is not ASCII
    digits is no size (``int("²")`` raises)."""
    prefix = "p" * 900 + "  a\tb/jax-1/"
    page = ("<ListBucketResult><IsTruncated>false</IsTruncated>"
            f"<Contents><Key>{prefix}k-cache</Key><Size>7</Size></Contents>"
            f"<Contents><Key>{prefix}j-cache</Key><Size>\u00b2</Size></Contents></ListBucketResult>")
    assert client._names(page, prefix) == {"k-cache": 7, "j-cache": 0}


def test_aws_own_endpoint_is_reached_by_the_bucket_s_virtual_host() -> None:
    keys = client.Keys("AKID", SECRET, None, "eu-west-1", None, "test")
    assert client.S3("s3://bkt/a b/jax-1", keys).base == "https://bkt.s3.eu-west-1.amazonaws.com/a%20b/jax-1"
    assert client.S3("s3://my.bkt/p/jax-1", keys).base == "https://s3.eu-west-1.amazonaws.com/my.bkt/p/jax-1"


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_the_environment_s_keys_need_nothing_imported_and_a_few_settings_still_choose_s3fs(tmp_path: Path) -> None:
    """Keys in the environment, where no ~/.aws/config could change a request, are read with nothing
    imported, the region and endpoint as botocore reads them; fsspec's own S3 settings, FIPS and
    dual-stack endpoints, a directory bucket or an access point choose s3fs, said in `status`; a
    proxy no longer does (this client goes through it)."""
    env = {**NO_FILES, "AWS_ACCESS_KEY_ID": " AKID ", "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_SESSION_TOKEN": "tok",
           "AWS_ENDPOINT_URL_S3": "HTTP://MinIO:80/", "AWS_ENDPOINT_URL": "http://other", "AWS_REGION": "ap-east-1",
           "AWS_DEFAULT_REGION": "eu-north-1", "FSSPEC_CONFIG_DIR": str(tmp_path / "none"),
           "AWS_CA_BUNDLE": "/etc/team-ca.pem", "HTTPS_PROXY": "http://proxy:3128"}
    found = client.keys(env)
    assert isinstance(found, client.Keys) and found.credentials is None
    # (botocore reads no AWS_REGION; it sends the host in lower case, no default port)
    assert (found.frozen(), found.region, found.endpoint) == (("AKID", SECRET, "tok"), "eu-north-1", "http://minio")
    assert client.S3("s3://b/p", found).cafile == "/etc/team-ca.pem"
    assert isinstance(backend_for("s3://b/p", "0.4.30", False, env), client.Deferred)
    for extra, why in [({"FSSPEC_S3_ENDPOINT_URL": "http://x"}, "fsspec has S3 settings"),
                       ({"AWS_USE_FIPS_ENDPOINT": "true"}, "AWS_USE_FIPS_ENDPOINT is set"),
                       ({"AWS_ENDPOINT_URL_S3": "minio:9000"}, "not a plain http(s) URL"),
                       ({"AWS_ENDPOINT_URL_S3": "http://[::1"}, "not a plain http(s) URL"),
                       ({"AWS_ENDPOINT_URL_S3": "http://ex\uff03ample.com"}, "not a plain http(s) URL"),
                       ({"AWS_ENDPOINT_URL_S3": "http://minio/a%20b"}, "not a plain http(s) URL"),
                       ({"AWS_ENDPOINT_URL_S3": "", "AWS_ENDPOINT_URL": "", "AWS_DEFAULT_REGION": "eu-isoe-west-1"},
                        "outside AWS's main partition")]:
        said = client.keys({**env, **extra})
        assert isinstance(said, str) and why in said, (extra, said)
    assert "directory bucket" in str(client.keys(env, "b--usw2-az1--x-s3"))
    assert isinstance(backend_for("s3://b--usw2-az1--x-s3/p", "0.4.30", False, env), Bucket)
    (tmp_path / "fsspec").mkdir()
    write(tmp_path / "fsspec" / "conf.json", json.dumps({"s3": {"client_kwargs": {"endpoint_url": "http://x"}}}))
    assert isinstance(backend_for("s3://b/p", "0.4.30", False, {**env, "FSSPEC_CONFIG_DIR": str(tmp_path / "fsspec")}),
                      Bucket)


def resolved(env: dict[str, str], bucket: str = "b") -> client.Keys | str:
    """``keys`` where the process's environment is ``env`` (botocore's session reads os.environ)."""
    import os

    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        return client.keys(os.environ, bucket)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_every_other_set_up_is_botocore_s_session_s_to_resolve(tmp_path: Path) -> None:
    """Profiles (their keys, a role, a credential process), the region, the endpoint (a profile's,
    a services section's, ignored where botocore ignores it) are botocore's to decide; this client
    serves them, or s3fs where botocore's requests would differ (a profile's s3 settings, FIPS,
    another partition), or says why none can (a profile in neither file, a file that does not
    parse)."""
    process = tmp_path / "keys.py"
    process.write_text("import json\nprint(json.dumps({'Version': 1, 'AccessKeyId': 'PROC', "
                       f"'SecretAccessKey': {SECRET!r}, 'SessionToken': 'PTOK'}}))\n")
    credentials = write(tmp_path / "credentials", f"[default]\naws_access_key_id = A1\naws_secret_access_key = {SECRET}\n"
                                                  f"[work]\naws_access_key_id = A2\naws_secret_access_key = {SECRET}\n")
    config = write(tmp_path / "config", "[default]\nregion = ap-south-1\n[profile work]\nendpoint_url = https://r2.example\n"
                                        "[profile role]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = default\n"
                                        f"[profile proc]\ncredential_process = {sys.executable} {process}\n"
                                        "[profile nested]\ns3 =\n  addressing_style = virtual\n"
                                        "aws_access_key_id = A3\naws_secret_access_key = s\n"
                                        "[profile fips]\naws_access_key_id = A4\naws_secret_access_key = s\nuse_fips_endpoint = true\n"
                                        "[profile ignore]\nendpoint_url = http://minio\nignore_configured_endpoint_urls = true\n"
                                        "aws_access_key_id = A5\naws_secret_access_key = s\n"
                                        "[profile services]\nservices = local\naws_access_key_id = A6\naws_secret_access_key = s\n"
                                        "[services local]\ns3 =\n  endpoint_url = http://127.0.0.1:9000\n"
                                        "[profile china]\nregion = cn-north-1\naws_access_key_id = A7\naws_secret_access_key = s\n")
    files = {"AWS_SHARED_CREDENTIALS_FILE": credentials, "AWS_CONFIG_FILE": config, "AWS_EC2_METADATA_DISABLED": "true",
             "FSSPEC_CONFIG_DIR": str(tmp_path / "none"), "HOME": str(tmp_path)}
    expected = {"": ("A1", "ap-south-1", None, "profile's keys in ~/.aws/credentials"),
                "work": ("A2", "us-east-1", "https://r2.example", "profile's keys"),
                "proc": ("PROC", "us-east-1", None, "a credential process (the profile 'proc')"),
                "ignore": ("A5", "us-east-1", None, "keys"),
                "services": ("A6", "us-east-1", "http://127.0.0.1:9000", "keys")}
    for profile, (access, region, endpoint, source) in expected.items():
        found = resolved({**files, **({"AWS_PROFILE": profile} if profile else {})})
        assert isinstance(found, client.Keys), (profile, found)
        assert (found.frozen()[0], found.region, found.endpoint) == (access, region, endpoint), profile
        assert source in found.source and "resolved by botocore" in found.source, found.source
    assert resolved({**files, "AWS_PROFILE": "proc"}).frozen() == ("PROC", SECRET, "PTOK")  # type: ignore[union-attr]
    role = resolved({**files, "AWS_PROFILE": "role"})  # (STS is asked at the first request, not here)
    assert isinstance(role, client.Keys) and "an assumed role" in role.source
    chosen = resolved({**files, "AWS_DEFAULT_PROFILE": "work", "AWS_PROFILE": "proc"})  # botocore's order
    assert isinstance(chosen, client.Keys) and chosen.frozen()[0] == "A2"
    for profile, why in [("nested", "has s3 settings"), ("fips", "has use_fips_endpoint"), ("nobody", "in neither"),
                         ("china", "outside AWS's main partition")]:
        said = resolved({**files, "AWS_PROFILE": profile})
        assert isinstance(said, str) and why in said, (profile, said)
    write(tmp_path / "broken", "[default\nregion")
    assert "could not be read" in str(resolved({**files, "AWS_CONFIG_FILE": str(tmp_path / "broken")}))


def botocore_says(env: dict[str, str], bucket: str) -> tuple[str, str, str | None, str]:
    """What botocore (s3fs's client) does with these settings: the key it signs with, the region,
    the token, and the host of the URL it sends a listing to (caught before it is sent)."""
    import os

    import botocore.session

    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        session = botocore.session.Session()
        credentials = session.get_credentials()
        client = session.create_client("s3")
        sent: list[Any] = []

        def catch(request: Any, **kwargs: Any) -> Any:
            sent.append(request)
            raise RuntimeError("caught")

        client.meta.events.register_first("before-send.s3.ListObjectsV2", catch)
        with pytest.raises(RuntimeError, match="caught"):
            client.list_objects_v2(Bucket=bucket, Prefix="p/")
        frozen = credentials.get_frozen_credentials()
        auth = sent[0].headers["Authorization"].decode()
        return frozen.access_key, auth.split("/")[2], frozen.token, sent[0].url.split("/")[2]
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.mark.parametrize("case", ["quoted", "spaced", "empty_config", "vars", "tokens", "long_bucket", "underscore"])
def test_the_direct_client_goes_where_botocore_goes(tmp_path: Path, case: str) -> None:
    """Settings read as botocore reads them (a second attack's cases): profile sections named by a
    shell split, an empty or ``$VAR`` file path, the security token before the session token, a
    bucket that is no DNS label addressed by path. Where the direct client serves, it signs with
    the key and for the region botocore would, and sends to the same host."""
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    config, credentials = home / ".aws" / "config", home / ".aws" / "credentials"
    credentials.write_text("[default]\naws_access_key_id = FKEY\naws_secret_access_key = s\n"
                           "[foo]\naws_access_key_id = FOO\naws_secret_access_key = s\n")
    config.write_text("[default]\nregion = eu-west-1\n[profile \"foo\"]\nregion = ap-south-1\n")
    env = {"HOME": str(home), "AWS_EC2_METADATA_DISABLED": "true", "FSSPEC_CONFIG_DIR": str(tmp_path / "none")}
    bucket = "bkt"
    if case == "quoted":
        env["AWS_PROFILE"] = "foo"
    elif case == "spaced":
        config.write_text("[default]\nregion = eu-west-1\n[profile  foo]\nregion = ap-south-1\n")
        env["AWS_PROFILE"] = "foo"
    elif case == "empty_config":
        env["AWS_CONFIG_FILE"] = ""
    elif case == "vars":
        env["AWS_CONFIG_FILE"] = "$HOME/.aws/config"
    elif case == "tokens":
        credentials.write_text("[default]\naws_access_key_id = FKEY\naws_secret_access_key = s\n"
                               "aws_session_token = SESS\naws_security_token = SEC\n")
    elif case == "long_bucket":
        bucket = "b" * 64
    elif case == "underscore":
        bucket = "my_bucket"
    ours = resolved(env, bucket)
    assert isinstance(ours, client.Keys), ours
    key, region, token, host = botocore_says(env, bucket)
    level = client.S3(f"s3://{bucket}/p/jax-1", ours)
    assert (ours.frozen()[0], ours.region, ours.frozen()[2]) == (key, region, token)
    assert urlsplit(level.root).netloc.replace(".s3.amazonaws.com", f".s3.{region}.amazonaws.com") == host.replace(
        "s3.amazonaws.com", f"s3.{region}.amazonaws.com"), (level.root, host)


def test_a_setting_file_that_is_no_regular_file_is_skipped_never_read(tmp_path: Path) -> None:
    """A FIFO, a device or a folder as a config file is skipped, as botocore skips it (a FIFO read
    would hang ``import jax``; ``/dev/zero`` would fill memory)."""
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero", str(tmp_path)):
        env = {"AWS_CONFIG_FILE": path, "AWS_SHARED_CREDENTIALS_FILE": path, "AWS_ACCESS_KEY_ID": "A",
               "AWS_SECRET_ACCESS_KEY": "s", "FSSPEC_CONFIG_DIR": str(tmp_path)}
        assert isinstance(client.keys(env), client.Keys), path


# -- a server's text on the user's terminal (issue 57 L8) ----------------------------------------------

ESCAPES = "\x1b]0;owned\x07\x1b[2J\x1b[31m\u202e"  # a window title, a cleared screen, red, text reversed


class Hostile(http.server.BaseHTTPRequestHandler):
    """An S3 endpoint (or an HTTP cache) that refuses everything with terminal escapes in its reason
    phrase, its error code and its message."""

    protocol_version = "HTTP/1.1"

    def _refuse(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        body = (f"<?xml version='1.0'?><Error><Code>AccessDenied{ESCAPES}</Code>"
                f"<Message>Access denied {ESCAPES} gone</Message></Error>").encode()
        self.send_response(403, f"Forbidden{ESCAPES[:-1]}")  # (a status line is latin-1)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = _refuse  # noqa: N815

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hostile() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def escaped(text: str) -> bool:
    """Whether ``text`` holds the server's words with none of its control characters raw."""
    return ("Access denied" in text or "Forbidden" in text) and not any(c in text for c in ESCAPES if not c.isprintable())


@pytest.mark.parametrize("scheme", ["s3", "http"])
def test_a_server_s_text_reaches_no_terminal_raw(hostile: str, scheme: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """An endpoint that answers with terminal escapes (a window title, a cleared screen, reversed
    text) in its reason phrase and its S3 error: `status` (its probe), the warning that turns the
    level off, and what `explain` is told of it (the off note) show its words with every control
    character escaped."""
    from gkx_autocache import _diagnostics
    from gkx_autocache._backends.choose import backend_for
    from gkx_autocache._cli.main import main
    from gkx_autocache._diagnostics import AutocacheWarning
    from gkx_autocache._shared.level import Level

    shared = "s3://bucket/team" if scheme == "s3" else f"{hostile}/cache"
    env = {"GKX_JAX_CACHE_DIR": str(tmp_path / "local"), "GKX_JAX_CACHE_SHARED": shared, "AWS_ENDPOINT_URL": hostile,
           "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "HOME": str(tmp_path)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "does not answer" in out and escaped(out), out
    assert main(["--json", "status"]) == 0
    assert escaped(capsys.readouterr().out)
    monkeypatch.setattr(_diagnostics, "_said", set())
    level = Level(shared, backend_for(shared, "0.4.30", False, env), local=local_at(tmp_path / "l"), timeout=5.0,
                  writes="never", secret=None)
    try:
        with pytest.warns(AutocacheWarning) as said:
            assert level.read("jit_f-" + "ab" * 32) == (None, None)
    finally:
        level.channel.backend.forget()
    assert len(said) == 1 and escaped(str(said[0].message)) and escaped(level.off_note or ""), said[0].message


def test_what_explain_and_stats_print_of_a_seal_or_a_ledger_is_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    """A seal's impossible size is said escaped (it reaches `explain` as the entry's `rejected`
    detail), and every command's human text goes out with its control characters escaped but its
    lines kept (a ledger's line, a file's name)."""
    import argparse
    import json

    from gkx_autocache._cli.output import emit
    from gkx_autocache._shared.seal import EntryRefused, read_seal

    key = "jit_f-" + "ab" * 32
    with pytest.raises(EntryRefused) as refused:
        read_seal(json.dumps({"format": 1, "key": key, "bytes": ESCAPES, "sha256": "0" * 64}).encode(), key, 1 << 30)
    assert "impossible size" in str(refused.value) and str(refused.value).isprintable(), refused.value
    for command in ("explain", "stats", "status"):
        emit(argparse.Namespace(json=False, command=command), f"rejected: {ESCAPES}\n  next line", {})
        assert capsys.readouterr().out == "rejected: \\x1b]0;owned\\x07\\x1b[2J\\x1b[31m\\u202e\n  next line\n"


# -- retries as botocore makes them, and a warning that keeps its hint (issue 61) ----------------------


def test_eight_workers_throttled_together_do_not_come_back_together(flaky: str) -> None:
    """Eight clients (a prefetch's workers) each told SlowDown twice at the same moment come back
    spread by the backoff's jitter, not in step (each waited exactly 0.1 then 0.4 s before)."""
    Flaky.slow = 2
    levels = [client.S3(f"s3://b{i}/p/jax-1", client.Keys("AKID", SECRET, None, "us-east-1", flaky, "test"))
              for i in range(8)]
    threads = [threading.Thread(target=level.listing, args=(Progress(),)) for level in levels]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    for level in levels:
        level.forget()
    thirds = sorted(times[2] - times[0] for times in Flaky.arrivals.values())
    assert len(thirds) == 8 and thirds[-1] - thirds[0] > 0.12, thirds  # (0.25 to 0.75 s after the first)


def test_a_backoff_is_progress_so_three_slow_downs_are_no_stall(flaky: str) -> None:
    """Three SlowDowns wait up to 2.7 s in all before the fourth answer: under a timeout of 1 s
    that was "no progress" (the level off); the server answered each time, so it is progress."""
    from gkx_autocache._shared.calls import bounded

    Flaky.slow = 3
    level = client.S3("s3://bkt/p/jax-1", client.Keys("AKID", SECRET, None, "us-east-1", flaky, "test"))
    try:
        started = time.monotonic()
        assert bounded(level.listing, 1.0) == {}
        assert time.monotonic() - started > 0.8 and len(Flaky.arrivals["/bkt"]) == 4, Flaky.arrivals
    finally:
        level.forget()


def test_a_connection_reset_before_its_answer_is_asked_again_on_a_new_one(tmp_path: Path) -> None:
    """A proxy or a load balancer resets a fresh connection (not one kept from before): the request
    is asked once more on a new connection, as botocore does, rather than turning the level off."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    answered: list[int] = []

    def serve() -> None:
        for n in range(2):
            conn, _ = listener.accept()
            conn.recv(65536)
            if n == 0:  # the first connection: reset, no answer
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                conn.close()
                continue
            body = b"<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>"
            answered.append(n)  # before the answer: the client may read it and return before a line after it runs
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    level = client.S3("s3://bkt/p/jax-1", client.Keys("AKID", SECRET, None, "us-east-1",
                                                     f"http://127.0.0.1:{port}", "test"))
    try:
        assert level.listing(Progress()) == {} and answered == [1]
    finally:
        level.forget()
        listener.close()


def test_a_long_server_message_is_cut_but_never_its_fix() -> None:
    """A 403 with a long message (S3's, or a proxy's page): the warning's line is cut in the
    server's words, at a word, and keeps the hint of where the credentials come from whole."""
    error = HttpError(403, "AccessDenied (" + "a very long explanation " * 20 + ")", "s3://b/p/jax-1",
                      credentials="the profile 'ci' in ~/.aws/credentials")
    said = describe(error)
    assert said.endswith("(credentials: the profile 'ci' in ~/.aws/credentials)") and " ... (credentials" in said, said
    assert len(said) <= 240 + 40, len(said)
