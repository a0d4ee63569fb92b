"""AWS credentials beyond static keys, on the fast path (SPEC §14, amended 2026-12-06; issue 61):
botocore's own session resolves them (a credential process, an SSO token in its cache, the
instance's metadata, a container's endpoint), and the level's own S3 client signs its requests
with them, against moto's server, which checks every signature. The endpoints botocore asks are
small fakes on 127.0.0.1 that answer as AWS's do (the SSO portal, IMDSv2, the ECS agent)."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import JAX_VERSION, S3

from gkx_autocache._backends import s3 as client
from gkx_autocache._backends.choose import backend_for
from gkx_autocache._shared.calls import Progress


class Fake(http.server.BaseHTTPRequestHandler):
    """Answers each request with ``answer(handler)``: ``(status, body)``; what it was asked, in ``asked``."""

    answer: Callable[[Any], tuple[int, bytes]]
    asked: list[str]

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        type(self).asked.append(f"{self.command} {self.path}")
        status, body = type(self).answer(self)
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = _serve  # noqa: N815

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake() -> Iterator[Callable[[Callable[[Any], tuple[int, bytes]]], tuple[str, list[str]]]]:
    """Starts a fake endpoint answering as told: its URL, and the list of what it was asked."""
    servers = []

    def start(answer: Callable[[Any], tuple[int, bytes]]) -> tuple[str, list[str]]:
        handler: Any = type("Handler", (Fake,), {"answer": staticmethod(answer), "asked": []})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", handler.asked

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def aws(monkeypatch: pytest.MonkeyPatch, home: Path, **env: str) -> None:
    """The process's environment for botocore's session: no AWS variable but ``env``, ``home``'s
    ~/.aws files."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "FSSPEC_")) or name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def served(s3: S3) -> tuple[client.Keys, client.S3]:
    """The level's backend for the bucket, chosen as at a first request: the package's own client,
    its write and listing checked by moto's signature checks."""
    deferred = backend_for(f"s3://{s3.bucket}/team", JAX_VERSION, False, os.environ)
    assert isinstance(deferred, client.Deferred)
    chosen = deferred.chosen()
    assert isinstance(chosen, client.S3), deferred.why
    name = "jit_f-" + "ab" * 32 + "-cache"
    chosen.write(name, b"x" * 100)
    assert chosen.listing(Progress()) == {name: 100}
    chosen.forget()
    return chosen.keys, chosen


def role(s3: S3) -> tuple[str, str, str]:
    """Temporary credentials moto's STS issues for a role that may do anything: an access key, its
    secret and the session token the server then requires with it (as an instance role's are)."""
    import boto3

    access, secret = s3.keys
    iam = boto3.client("iam", endpoint_url=s3.endpoint, region_name="us-east-1", aws_access_key_id=access,
                       aws_secret_access_key=secret)
    name = f"builder-{time.monotonic_ns()}"
    made = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}]}))
    iam.put_role_policy(RoleName=name, PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    sts = boto3.client("sts", endpoint_url=s3.endpoint, region_name="us-east-1", aws_access_key_id=access,
                       aws_secret_access_key=secret)
    got = sts.assume_role(RoleArn=made["Role"]["Arn"], RoleSessionName="gkx")["Credentials"]
    return got["AccessKeyId"], got["SecretAccessKey"], got["SessionToken"]


def expiry(hours: float = 6) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + hours * 3600))


def test_a_credential_process_profile(s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """botocore's session runs the process; the level signs with its keys; `status` names the
    client and the source; and a fresh process that resolves them imports no s3fs (it went to s3fs
    before)."""
    from gkx_autocache._cli.main import main

    access, secret = s3.keys
    process = tmp_path / "keys.py"
    process.write_text(f"import json\nprint(json.dumps({{'Version': 1, 'AccessKeyId': {access!r}, "
                       f"'SecretAccessKey': {secret!r}, 'Expiration': {expiry()!r}}}))\n")
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "config").write_text(f"[profile ci]\ncredential_process = {sys.executable} {process}\n")
    aws(monkeypatch, tmp_path, AWS_PROFILE="ci", AWS_ENDPOINT_URL=s3.endpoint, AWS_EC2_METADATA_DISABLED="true")
    keys, _ = served(s3)
    assert keys.source == "a credential process (the profile 'ci'), resolved by botocore", keys.source
    monkeypatch.setenv("GKX_JAX_CACHE_DIR", str(tmp_path / "local"))
    monkeypatch.setenv("GKX_JAX_CACHE_SHARED", f"s3://{s3.bucket}/team")
    assert main(["--json", "status"]) == 0
    shared = json.loads(capsys.readouterr().out)["levels"]["shared"]
    assert shared["credentials"] == ("a credential process (the profile 'ci'), resolved by botocore, signed here "
                                     "(no client library)"), shared
    assert shared["probe"]["answers"] is True and shared["probe"]["entries"] == 1, shared
    fresh = subprocess.run([sys.executable, "-c", "import os, sys\nfrom gkx_autocache._backends.choose import backend_for\n"
                            f"backend = backend_for('s3://{s3.bucket}/team', '0.4.30', False, os.environ)\n"
                            "print(type(backend.chosen()).__name__, 's3fs' in sys.modules, 'aiobotocore' in sys.modules)"],
                           capture_output=True, text=True, env=dict(os.environ), check=True)
    assert fresh.stdout.split() == ["S3", "False", "False"], fresh


def test_an_sso_profile_with_its_cached_token(s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              fake: Callable[..., tuple[str, list[str]]]) -> None:
    """A profile of IAM Identity Center (SSO), logged in (`aws sso login` left its token in
    ~/.aws/sso/cache): botocore exchanges the token for role credentials at the portal (a fake,
    ``AWS_ENDPOINT_URL_SSO``), and the level signs with them."""
    access, secret, token = role(s3)
    start_url = "https://example.awsapps.com/start"

    def portal(handler: Any) -> tuple[int, bytes]:
        if handler.headers.get("x-amz-sso_bearer_token") != "cached-token-Qq1":
            return 401, b'{"message": "not logged in"}'
        return 200, json.dumps({"roleCredentials": {"accessKeyId": access, "secretAccessKey": secret,
                                                    "sessionToken": token,
                                                    "expiration": int((time.time() + 3600) * 1000)}}).encode()

    url, asked = fake(portal)
    (tmp_path / ".aws" / "sso" / "cache").mkdir(parents=True)
    (tmp_path / ".aws" / "config").write_text(f"[profile team]\nsso_start_url = {start_url}\nsso_region = us-east-1\n"
                                              "sso_account_id = 123456789012\nsso_role_name = Builder\n")
    cache = tmp_path / ".aws" / "sso" / "cache" / f"{hashlib.sha1(start_url.encode()).hexdigest()}.json"
    cache.write_text(json.dumps({"startUrl": start_url, "region": "us-east-1", "accessToken": "cached-token-Qq1",
                                 "expiresAt": expiry()}))
    aws(monkeypatch, tmp_path, AWS_PROFILE="team", AWS_ENDPOINT_URL_S3=s3.endpoint, AWS_ENDPOINT_URL_SSO=url,
        AWS_EC2_METADATA_DISABLED="true")
    import botocore.credentials  # (which took its cache folder from the HOME it was imported under)

    monkeypatch.setattr(botocore.credentials.SSOProvider, "_SSO_TOKEN_CACHE_DIR", str(cache.parent))
    keys, _ = served(s3)
    assert keys.source.startswith("SSO (its cached token) (the profile 'team')"), keys.source
    assert keys.frozen()[2] == token and any("/federation/credentials" in a for a in asked), asked


def test_the_instance_s_role_from_its_metadata(s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               fake: Callable[..., tuple[str, list[str]]]) -> None:
    """A fresh cloud machine with nothing but its instance role: botocore asks the instance
    metadata service (IMDSv2: a session token first; a fake, ``AWS_EC2_METADATA_SERVICE_ENDPOINT``)."""
    access, secret, token = role(s3)

    def imds(handler: Any) -> tuple[int, bytes]:
        if handler.command == "PUT" and handler.path == "/latest/api/token":
            return 200, b"imds-session-token"
        if handler.headers.get("X-aws-ec2-metadata-token") != "imds-session-token":
            return 401, b""
        if handler.path == "/latest/meta-data/iam/security-credentials/":
            return 200, b"builder-role"
        if handler.path == "/latest/meta-data/iam/security-credentials/builder-role":
            return 200, json.dumps({"Code": "Success", "AccessKeyId": access, "SecretAccessKey": secret,
                                    "Token": token, "Expiration": expiry()}).encode()
        return 404, b""

    url, asked = fake(imds)
    aws(monkeypatch, tmp_path, AWS_ENDPOINT_URL=s3.endpoint, AWS_EC2_METADATA_SERVICE_ENDPOINT=url + "/",
        AWS_CONFIG_FILE="/nonexistent", AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
    keys, _ = served(s3)
    assert keys.source == "instance metadata (the instance's role), resolved by botocore", keys.source
    assert "PUT /latest/api/token" in asked and keys.frozen()[2] == token, asked


def test_a_container_s_credentials_endpoint(s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            fake: Callable[..., tuple[str, list[str]]]) -> None:
    """An ECS task or an EKS pod (Pod Identity): its agent's endpoint, with its authorization token."""
    access, secret, token = role(s3)

    def agent(handler: Any) -> tuple[int, bytes]:
        if handler.headers.get("Authorization") != "agent-token":
            return 401, b""
        return 200, json.dumps({"AccessKeyId": access, "SecretAccessKey": secret, "Token": token,
                                "Expiration": expiry()}).encode()

    url, asked = fake(agent)
    aws(monkeypatch, tmp_path, AWS_ENDPOINT_URL=s3.endpoint, AWS_CONTAINER_CREDENTIALS_FULL_URI=url + "/creds",
        AWS_CONTAINER_AUTHORIZATION_TOKEN="agent-token", AWS_CONFIG_FILE="/nonexistent",
        AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_EC2_METADATA_DISABLED="true")
    keys, _ = served(s3)
    assert keys.source == "the container's role (ECS, EKS Pod Identity), resolved by botocore", keys.source
    assert asked == ["GET /creds"] and keys.frozen()[2] == token, asked
