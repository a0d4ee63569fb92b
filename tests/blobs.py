"""A real Azure Blob Storage service for the Azure level's tests: Azurite, Microsoft's emulator (the
npm package ``azurite``, which ``.ci/run`` installs into ``.azurite/``), on a free port of
127.0.0.1, in memory, its telemetry off; in a session of its own, ended with the tests that started
it (and at exit, and on Ctrl-C: pytest tears fixtures down then). Its containers are made public,
so that what the level wrote is read back here without its signing code (``objects``)."""

from __future__ import annotations

import atexit
import base64
import hashlib
import hmac
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
import uuid
from email.utils import formatdate
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
from conftest import ROOT, free_port

BINARY = ROOT / ".azurite" / "node_modules" / ".bin" / "azurite-blob"
ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="  # the emulator's own


def installed() -> Path:
    """Azurite's command, or the test skipped (failed under CI, which must have it)."""
    if not BINARY.exists():
        if os.environ.get("CI"):
            pytest.fail("azurite is not installed: .ci/run installs it (npm install --prefix .azurite azurite)")
        pytest.skip("azurite is not installed (npm install --prefix .azurite azurite, or run .ci/run)")
    return BINARY


class Azurite:
    """Azurite's Blob service at ``endpoint`` (``http://127.0.0.1:<port>/devstoreaccount1``);
    ``tls``: a certificate and its key, served over https with OAuth checked (``--oauth basic``: a
    bearer token's issuer, audience and lifetime, as Azure checks them, not its signature)."""

    def __init__(self, base: Path, tls: tuple[Path, Path] | None = None) -> None:
        binary = installed()
        base.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}/{ACCOUNT}"
        more = ["--cert", str(tls[0]), "--key", str(tls[1]), "--oauth", "basic"] if tls else []
        # Its own trust, not SSL_CERT_FILE's: from Python 3.12 urlopen keeps one opener, and its
        # context, built by whichever test used it first in this process (before the certificate).
        self.context = ssl.create_default_context(cafile=str(tls[0])) if tls else None
        self.log = base / "azurite.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [str(binary), "--silent", "--inMemoryPersistence", "--disableTelemetry", "--blobHost", "127.0.0.1",
                 "--blobPort", str(self.port), "--loose", "--skipApiVersionCheck", *more],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=base)
        atexit.register(self.close)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"azurite did not start: {self.log.read_text()[-2000:]}") from None
                time.sleep(0.1)

    def close(self) -> None:
        """Its whole session ended (node and anything it started)."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.process.wait(timeout=10)

    def connection_string(self, key: str = KEY, sas: str | None = None) -> str:
        credential = f"SharedAccessSignature={sas}" if sas is not None else f"AccountKey={key}"
        return f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};{credential};BlobEndpoint={self.endpoint};"

    def env(self, **more: str) -> dict[str, str]:
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string(), **more}

    def container(self, public: bool = True) -> str:
        """A new container; ``public``: its blobs and its listing readable without credentials."""
        name = f"gkx-{uuid.uuid4().hex[:12]}"
        self.request("PUT", f"{name}?restype=container", {"x-ms-blob-public-access": "container"} if public else {})
        return name

    def request(self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
        """A request signed with Shared Key, written here from Azure's documentation (not the package's
        signing): for setting up."""
        date = formatdate(usegmt=True)
        sent = {"x-ms-date": date, "x-ms-version": "2021-08-06", **(headers or {})}
        resource, _, query = path.partition("?")
        params = sorted(p.split("=", 1) for p in query.split("&") if p)
        canonical = (f"/{ACCOUNT}/{ACCOUNT}/{resource}"
                     + "".join(f"\n{k.lower()}:{unquote(v)}" for k, v in params))
        ms = "".join(f"{k}:{v}\n" for k, v in sorted((k.lower(), v) for k, v in sent.items() if k.lower().startswith("x-ms-")))
        to_sign = f"{method}\n\n\n{len(body) or ''}\n\n\n\n\n\n\n\n\n{ms}{canonical}"
        signature = base64.b64encode(hmac.new(base64.b64decode(KEY), to_sign.encode(), hashlib.sha256).digest()).decode()
        sent["Authorization"] = f"SharedKey {ACCOUNT}:{signature}"
        request = urllib.request.Request(f"{self.endpoint}/{path}", data=body or None,
                                         headers=sent, method=method)
        with urllib.request.urlopen(request, timeout=30, context=self.context) as answer:
            return bytes(answer.read())

    def objects(self, container: str, prefix: str = "") -> dict[str, bytes]:
        """Every blob under ``prefix`` and its bytes, read anonymously (the container is public)."""
        text = urllib.request.urlopen(f"{self.endpoint}/{container}?restype=container&comp=list"
                                      f"&prefix={quote(prefix, safe='')}", timeout=30,
                                      context=self.context).read().decode()
        import html
        import re

        names = [html.unescape(n) for n in re.findall(r"<Blob><Name>([^<]*)</Name>", text)]
        return {name: urllib.request.urlopen(f"{self.endpoint}/{container}/{quote(name)}", timeout=30,
                                                       context=self.context).read()
                for name in names}

    def account_sas(self, permissions: str = "racwdl") -> str:
        """An account SAS for the Blob service (version 2019-12-12's string to sign), from the key."""
        fields = {"sv": "2019-12-12", "ss": "b", "srt": "sco", "sp": permissions, "se": "2099-01-01T00:00:00Z",
                  "spr": "https,http"}
        to_sign = "\n".join([ACCOUNT, fields["sp"], fields["ss"], fields["srt"], "", fields["se"], "", fields["spr"],
                             fields["sv"], ""])
        fields["sig"] = base64.b64encode(hmac.new(base64.b64decode(KEY), to_sign.encode(), hashlib.sha256).digest()).decode()
        return "&".join(f"{k}={quote(v, safe='')}" for k, v in fields.items())


def bearer_token(lifetime: int = 3600) -> str:
    """A token shaped as Microsoft Entra ID issues one for Storage (issuer, audience, lifetime):
    what Azurite's ``--oauth basic`` checks. Unsigned: Azurite does not check signatures."""
    def part(value: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    now = int(time.time())
    claims = {"aud": "https://storage.azure.com", "iss": "https://sts.windows.net/ab1f708d-50f6-404c-a006-d71b2ac7a606/",
              "iat": now - 60, "nbf": now - 60, "exp": now + lifetime, "oid": str(uuid.uuid4())}
    return f"{part({'typ': 'JWT', 'alg': 'RS256'})}.{part(claims)}.c2lnbmF0dXJl"
