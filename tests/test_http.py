"""The shared level in an HTTP(S) cache (SPEC §14, amended 2026-12-04): ``shared = http://…``
against a real server, Debian's nginx with WebDAV (``tests/webdav.py``), honest and lying (the
bucket's proxy, ``tests/hostile.py``): entries and seals by PUT, lookups by ranged GET, a fresh
machine from the pack, credentials from the environment or ``~/.netrc``, never printed, never sent
to another origin."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Venv, run_program
from hostile import Proxy, Silent
from test_activation import VERSION_DIR
from test_levels import report
from webdav import PASSWORD, TOKEN, USER, Nginx

from gkx_autocache import _settings


def warned(stderr: str) -> list[str]:
    """The package's warnings (not its report line)."""
    return [line for line in stderr.splitlines() if "AutocacheWarning" in line]


def http_env(url: str, local: Path, **extra: str) -> dict[str, str]:
    return {"GKX_JAX_CACHE_DIR": str(local), "GKX_JAX_CACHE_SHARED": url, "GKX_JAX_CACHE_REPORT": "1",
            "GKX_JAX_CACHE_SHARED_TIMEOUT": "5", **extra}


@pytest.fixture
def nginx(tmp_path: Path) -> Iterator[Nginx]:
    server = Nginx(tmp_path / "nginx")
    yield server
    server.close()


def entries(server: Nginx) -> dict[str, int]:
    return {name: size for name, size in server.files().items() if name.endswith("-cache")}


def drop_packs(server: Nginx) -> int:
    packs = list((server.root / "cache").rglob("*-gkx-pack"))
    for pack in packs:
        pack.unlink()
    return len(packs)


def test_entries_go_up_by_put_and_a_fresh_machine_is_served(venv: Venv, tmp_path: Path, nginx: Nginx) -> None:
    """A writer uploads each entry with its seal (signed: the key is set), and its program's manifest
    and pack; a fresh machine with the key is served every entry, most from the pack, and the
    next run is all local. `status` says the level answers."""
    key = {"GKX_JAX_CACHE_SIGNING_KEY": "k" * 32}
    cold, err = run_program(venv, env=http_env(nginx.url, tmp_path / "w", **key))
    assert not warned(err), err
    held = nginx.files()
    names = entries(nginx)
    assert len(names) == cold["requests"] > 0, held
    for name in names:
        seal = json.loads((nginx.root / "cache" / name.replace("-cache", "-gkx-shared")).read_bytes())
        assert seal["bytes"] == names[name] and "hmac" in seal, seal
    assert any(n.endswith("-gkx-pack") for n in held) and any(n.endswith("-gkx-manifest") for n in held), held
    env = http_env(nginx.url, tmp_path / "fresh", **key)
    fresh, err = run_program(venv, env=env)
    assert fresh["hits"] == fresh["requests"] and fresh["result"] == cold["result"], err
    assert report(err)["shared"] == fresh["requests"] and "prefetched" in err, err
    again, err = run_program(venv, env=env)
    assert report(err)["local"] == again["requests"], err
    status = json.loads(venv.cli("--json", "status", env=env).stdout)
    shared = status["levels"]["shared"]
    assert shared["kind"] == "http" and shared["probe"]["answers"] is True, shared
    refused = venv.cli("clear", "--shared", "--yes", env=env)
    assert refused.returncode != 0 and "HTTP cache, which cannot be listed" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_each_entry_is_read_by_ranges_and_checked(venv: Venv, tmp_path: Path, nginx: Nginx) -> None:
    """Without the pack, each lookup reads the seal and the entry's first block by ranged GETs; an
    entry whose bytes were swapped on the server is refused by its seal (`rejected`), the rest served."""
    cold, _ = run_program(venv, env=http_env(nginx.url, tmp_path / "w"))
    assert drop_packs(nginx) == 1
    names = sorted(entries(nginx))
    top = nginx.root / "cache"
    first, second = (top / names[0]).read_bytes(), (top / names[1]).read_bytes()
    (top / names[0]).write_bytes(second)
    (top / names[1]).write_bytes(first)
    env = http_env(nginx.url, tmp_path / "r")
    out, err = run_program(venv, env=env)
    assert out["result"] == cold["result"] and report(err)["shared"] == len(names) - 2, err
    explained = json.loads(venv.cli("--json", "explain", env=env).stdout)
    (rejected,) = [g for g in explained["groups"] if g["cause"] == "rejected"]
    assert rejected["count"] == 2, explained


@pytest.mark.parametrize("mode", ["norange", "lie", "truncate", "hang"])
def test_a_lying_or_hanging_server_never_gets_an_entry_loaded(venv: Venv, tmp_path: Path, nginx: Nginx,
                                                              mode: str) -> None:
    """In front of the cache: a proxy that strips Range (a planted 64 MiB entry comes whole for a
    read of its first block), sends other bytes, cuts a body, or never answers a read. No entry it
    serves is loaded, the run finishes with the right result, with at most one warning; `hang`
    costs one timeout."""
    cold, _ = run_program(venv, env=http_env(nginx.url, tmp_path / "w"))
    drop_packs(nginx)
    if mode == "norange":  # an entry smaller than the first block is the whole object either way: served
        for name in entries(nginx):
            with open(nginx.root / "cache" / name, "r+b") as f:
                f.truncate(64 << 20)
    proxy = Proxy(nginx.port, mode=mode)
    try:
        url = nginx.url.replace(f":{nginx.port}/", f":{proxy.port}/")
        out, err = run_program(venv, env=http_env(url, tmp_path / "r", GKX_JAX_CACHE_SHARED_TIMEOUT="2"))
    finally:
        proxy.close()
    assert out["result"] == cold["result"] and report(err)["shared"] == 0, err
    warnings = warned(err)
    assert len(warnings) <= 1, err
    if mode == "norange":
        assert "ignores Range" in warnings[0], warnings
    if mode == "hang":
        assert "no progress for 2 s" in warnings[0], warnings


def test_a_server_error_or_a_dead_server_turns_the_level_off_with_one_line(venv: Venv, tmp_path: Path) -> None:
    """A cache that answers 503 to everything, and one that accepts connections and never answers:
    the run finishes uncached-from-the-level with one warning naming what happened."""
    failing = Nginx(tmp_path / "n503", location="return 503;")
    try:
        out, err = run_program(venv, env=http_env(failing.url, tmp_path / "a"))
    finally:
        failing.close()
    (warning,) = warned(err)
    assert "answered 503" in warning and out["hits"] == 0, warning
    silent = Silent()
    try:
        out, err = run_program(venv, env=http_env(f"{silent.endpoint}/cache", tmp_path / "b",
                                                  GKX_JAX_CACHE_SHARED_TIMEOUT="1"))
    finally:
        silent.close()
    (warning,) = warned(err)
    assert "no progress for 1 s" in warning and out["hits"] == 0, warning


def test_credentials_come_from_the_environment_or_netrc_and_are_never_printed(venv: Venv, tmp_path: Path) -> None:
    """A cache that wants a bearer token: without it, 401 in one line that names where credentials
    come from, never the token; with it, served. One that wants basic: from ~/.netrc."""
    bearer = Nginx(tmp_path / "bearer", auth="bearer")
    try:
        out, err = run_program(venv, env=http_env(bearer.url, tmp_path / "a", GKX_JAX_CACHE_SHARED_TOKEN="wrong-Xy1"))
        (warning,) = warned(err)
        assert "401" in warning and "GKX_JAX_CACHE_SHARED_TOKEN" in warning and "wrong-Xy1" not in err, err
        env = http_env(bearer.url, tmp_path / "b", GKX_JAX_CACHE_SHARED_TOKEN=TOKEN)
        cold, err = run_program(venv, env=env)
        assert not warned(err) and entries(bearer), err
        fresh, err = run_program(venv, env={**env, "GKX_JAX_CACHE_DIR": str(tmp_path / "c")})
        assert fresh["hits"] == fresh["requests"], err
        for command in (("status",), ("--json", "status"), ("stats",)):
            shown = venv.cli(*command, env=env)
            assert TOKEN not in shown.stdout + shown.stderr
    finally:
        bearer.close()
    basic = Nginx(tmp_path / "basic", auth="basic")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".netrc").write_text(f"machine 127.0.0.1 login {USER} password {PASSWORD}\n")
    (home / ".netrc").chmod(0o600)
    try:
        env = http_env(basic.url, tmp_path / "d", HOME=str(home))
        cold, err = run_program(venv, env=env)
        assert not warned(err) and entries(basic), err
        assert PASSWORD not in err
    finally:
        basic.close()


class _Recording(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        type(self).seen.append(dict(self.headers))
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET  # noqa: N815

    def log_message(self, *args: Any) -> None:
        pass


def test_a_redirect_to_another_host_never_gets_the_credentials(venv: Venv, tmp_path: Path) -> None:
    """A cache that redirects every read to another origin (a port of its own here): the reads
    follow, without the token; the run finishes."""
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recording)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    port = other.server_address[1]
    redirecting = Nginx(tmp_path / "r", location=f"return 302 http://127.0.0.1:{port}$request_uri;")
    try:
        out, err = run_program(venv, env=http_env(redirecting.url, tmp_path / "a", GKX_JAX_CACHE_SHARED_TOKEN=TOKEN))
    finally:
        redirecting.close()
        other.shutdown()
        other.server_close()
    assert _Recording.seen, "no read was redirected"
    assert not any("Authorization" in h or TOKEN in json.dumps(h) for h in _Recording.seen), _Recording.seen
    assert out["hits"] == 0 and TOKEN not in err


def test_an_http_url_is_a_shared_level_only_and_holds_no_credentials() -> None:
    def problems(**env: str) -> list[str]:
        settings = _settings.resolve(env=env, prefix="/nonexistent", user_file="/nonexistent")
        return [m for _, m in settings.problems]

    assert problems(GKX_JAX_CACHE_SHARED="https://cache.example/jax") == []
    assert "expected a directory path or a gs://bucket or s3://bucket URL" in problems(GKX_JAX_CACHE_DIR="https://x/y")[0]
    (said,) = problems(GKX_JAX_CACHE_SHARED="https://bob:hunter2@cache.example/jax")
    assert "GKX_JAX_CACHE_SHARED_TOKEN" in said and "hunter2" not in said, said


def test_the_version_directory_is_the_same_layout_as_a_buckets(venv: Venv, tmp_path: Path, nginx: Nginx) -> None:
    """`<url>/jax-<version>/<key>-cache` and `<key>-gkx-shared`: what `status` and docs/levels.md say."""
    run_program(venv, env=http_env(nginx.url, tmp_path / "w"))
    assert all(name.startswith(f"{VERSION_DIR}/") for name in nginx.files()), nginx.files()
