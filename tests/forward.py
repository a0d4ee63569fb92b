"""A real forward proxy for the shared level's tests (SPEC §14, amended 2026-12-06): Debian's
tinyproxy, started per test on a free port of 127.0.0.1, which tunnels ``CONNECT`` and forwards
absolute-form requests, logging each; and a self-signed certificate for 127.0.0.1, for https
servers behind it (nginx, moto). ``.ci/run`` installs tinyproxy."""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import servers
from conftest import free_port, stop


def certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for ``127.0.0.1`` and ``localhost``, and its key (PEM files): it is
    its own authority, so a client given it (``SSL_CERT_FILE``, ``AWS_CA_BUNDLE``) verifies it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gkx-autocache test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


class Tinyproxy:
    """tinyproxy on a free port of 127.0.0.1; ``requests()``: the request lines it was sent
    (``CONNECT 127.0.0.1:443 HTTP/1.1``, ``GET http://127.0.0.1:80/x HTTP/1.1``)."""

    def __init__(self, base: Path) -> None:
        binary = shutil.which("tinyproxy") or next((p for p in ("/usr/bin/tinyproxy", "/usr/sbin/tinyproxy")
                                                     if os.path.exists(p)), None)
        if binary is None:
            if os.environ.get("CI"):
                pytest.fail("tinyproxy is not installed: .ci/run installs it")
            pytest.skip("tinyproxy is not installed (apt-get install tinyproxy)")
        base.mkdir(parents=True, exist_ok=True)
        self.base = base
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (base / "tinyproxy.conf").write_text(f"""
Port {self.port}
Listen 127.0.0.1
Timeout 60
LogFile "{base}/tinyproxy.log"
LogLevel Connect
PidFile "{base}/tinyproxy.pid"
MaxClients 100
Allow 127.0.0.1
DisableViaHeader Yes
""")
        self.process = servers.start([binary, "-d", "-c", str(base / "tinyproxy.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError("tinyproxy did not start") from None
                time.sleep(0.05)

    def requests(self) -> list[str]:
        log = self.base / "tinyproxy.log"
        found = []
        for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
            if "Request (file descriptor" in line:
                found.append(line.split("): ", 1)[1].strip())
        return found

    def close(self) -> None:
        stop(self.process)
