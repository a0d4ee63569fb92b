"""A real HTTP cache for the shared level's tests (SPEC §14): Debian's nginx with its WebDAV module
(``PUT`` with the path created, ``GET`` with ``Range``, ``HEAD``), started per test on a free port
of 127.0.0.1 with its root in a temporary directory. ``.ci/run`` installs ``nginx-light``."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import servers
from conftest import free_port, stop

TOKEN = "s3cret-token-Zq9"  # a bearer token nginx requires where `auth` is "bearer"
USER, PASSWORD = "alice", "pa55-Wq7"  # basic, where `auth` is "basic"


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None)


class Nginx:
    """nginx serving ``root`` over WebDAV at ``url``; ``auth``: None, ``"bearer"`` (``TOKEN``) or
    ``"basic"`` (``USER``/``PASSWORD``); ``location``: nginx lines that replace the WebDAV location
    (a ``return 503``, a redirect); ``http``: more lines for its ``http`` block (``keepalive_timeout 1s;``);
    ``tls``: a certificate and its key (``forward.certificate``), served over https."""

    def __init__(self, base: Path, auth: str | None = None, location: str | None = None, http: str = "",
                 tls: tuple[Path, Path] | None = None) -> None:
        binary = nginx_binary()
        if binary is None:
            if os.environ.get("CI"):
                pytest.fail("nginx is not installed: .ci/run installs nginx-light")
            pytest.skip("nginx is not installed (apt-get install nginx-light)")
        self.base = base
        self.root = base / "root"
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}/cache"
        listen = f"listen 127.0.0.1:{self.port} ssl; ssl_certificate {tls[0]}; ssl_certificate_key {tls[1]};" if tls \
            else f"listen 127.0.0.1:{self.port};"
        guard = ""
        if auth == "bearer":
            guard = f'if ($http_authorization != "Bearer {TOKEN}") {{ return 401; }}'
        elif auth == "basic":
            (base / "htpasswd").write_text(f"{USER}:{{PLAIN}}{PASSWORD}\n")
            guard = f'auth_basic "cache"; auth_basic_user_file {base}/htpasswd;'
        body = location or f"""
            dav_methods PUT DELETE;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
            {guard}"""
        temp = " ".join(f"{kind}_temp_path {base}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        user = "user root;" if os.geteuid() == 0 else ""
        (base / "nginx.conf").write_text(f"""
worker_processes 1;
daemon off;
pid {base}/nginx.pid;
error_log {base}/error.log;
{user}
events {{ worker_connections 64; }}
http {{
    access_log {base}/access.log;
    {temp}
    client_max_body_size 0;
    {http}
    server {{
        {listen}
        root {self.root};
        location / {{ {body} }}
    }}
}}
""")
        self.process = servers.start([binary, "-p", str(base), "-c", str(base / "nginx.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                import ssl

                unchecked = ssl._create_unverified_context()  # (only whether it answers)
                urllib.request.urlopen(f"{self.url.rsplit('/', 1)[0]}/", timeout=2, context=unchecked).close()
                break
            except urllib.error.HTTPError:
                break  # it answers
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"nginx did not start: {(base / 'error.log').read_text(errors='replace')[-800:]}") from None
                time.sleep(0.05)

    def files(self) -> dict[str, int]:
        """``path under the cache URL -> bytes`` of what nginx holds."""
        top = self.root / "cache"
        return {str(p.relative_to(top)): p.stat().st_size for p in top.rglob("*") if p.is_file()} if top.exists() else {}

    def requests(self) -> list[str]:
        """The access log's request lines (``GET /cache/... HTTP/1.1``), in order."""
        log = self.base / "access.log"
        return [line.split('"')[1] for line in log.read_text().splitlines() if '"' in line] if log.exists() else []

    def close(self) -> None:
        stop(self.process)
