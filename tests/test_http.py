"""The shared level in an HTTP(S) cache (SPEC §14, amended 2026-12-04): ``shared = http://…``
against a real server, Debian's nginx with WebDAV (``tests/webdav.py``), honest and lying (the
bucket's proxy, ``tests/hostile.py``): entries and seals by PUT, lookups by ranged GET, a fresh
machine from the pack, credentials from the environment or ``~/.netrc``, never printed, never sent
to another origin."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import InProcess, local_at
from hostile import Proxy, Silent
from test_activation import VERSION_DIR
from test_levels import FUNCTIONS, report
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


def test_entries_go_up_by_put_and_a_fresh_machine_is_served(here: InProcess, tmp_path: Path, nginx: Nginx) -> None:
    """A writer uploads each entry with its seal (signed: the key is set), and its program's manifest
    and pack; a fresh machine with the key is served every entry, most from the pack, and the
    next run is all local. `status` says the level answers."""
    key = {"GKX_JAX_CACHE_SIGNING_KEY": "k" * 32}
    cold, err = here.run_program(http_env(nginx.url, tmp_path / "w", **key), FUNCTIONS)
    assert not warned(err), err
    held = nginx.files()
    names = entries(nginx)
    assert len(names) == cold["requests"] > 0, held
    for name in names:
        seal = json.loads((nginx.root / "cache" / name.replace("-cache", "-gkx-shared")).read_bytes())
        assert seal["bytes"] == names[name] and "hmac" in seal, seal
    assert any(n.endswith("-gkx-pack") for n in held) and any(n.endswith("-gkx-manifest") for n in held), held
    env = http_env(nginx.url, tmp_path / "fresh", **key)
    fresh, err = here.run_program(env, FUNCTIONS, ahead=True)  # (its prefetch lands while it traces)
    assert fresh["hits"] == fresh["requests"] and fresh["result"] == cold["result"], err
    assert report(err)["shared"] == fresh["requests"] and "prefetched" in err, err
    again, err = here.run_program(env, FUNCTIONS)
    assert report(err)["local"] == again["requests"], err
    status = json.loads(here.cli("--json", "status", env=env).stdout)
    shared = status["levels"]["shared"]
    assert shared["kind"] == "http" and shared["probe"]["answers"] is True, shared
    refused = here.cli("clear", "--shared", "--yes", env=env)
    assert refused.returncode != 0 and "HTTP cache, which cannot be listed" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_each_entry_is_read_by_ranges_and_checked(here: InProcess, tmp_path: Path, nginx: Nginx) -> None:
    """Without the pack, each lookup reads the seal and the entry's first block by ranged GETs; an
    entry whose bytes were swapped on the server is refused by its seal (`rejected`), the rest served."""
    cold, _ = here.run_program(http_env(nginx.url, tmp_path / "w"), FUNCTIONS)
    assert drop_packs(nginx) == 1
    names = sorted(entries(nginx))
    top = nginx.root / "cache"
    first, second = (top / names[0]).read_bytes(), (top / names[1]).read_bytes()
    (top / names[0]).write_bytes(second)
    (top / names[1]).write_bytes(first)
    env = http_env(nginx.url, tmp_path / "r")
    out, err = here.run_program(env, FUNCTIONS)
    assert out["result"] == cold["result"] and report(err)["shared"] == len(names) - 2, err
    explained = json.loads(here.cli("--json", "explain", env=env).stdout)
    (rejected,) = [g for g in explained["groups"] if g["cause"] == "rejected"]
    assert rejected["count"] == 2, explained


@pytest.mark.parametrize("mode", ["norange", "lie", "truncate", "hang"])
def test_a_lying_or_hanging_server_never_gets_an_entry_loaded(tmp_path: Path, nginx: Nginx, monkeypatch: pytest.MonkeyPatch,
                                                              mode: str) -> None:
    """In front of the cache: a proxy that strips Range (a planted 64 MiB entry comes whole for a
    read of its first block), sends other bytes, cuts a body, or never answers a read. No lookup
    returns bytes other than the entry's own, with at most one warning; `hang` costs one timeout.
    (In-process: the level is what a fresh JAX process would ask.)"""
    import os
    import time
    import warnings

    from gkx_autocache import _diagnostics
    from gkx_autocache._backends.http import HttpCache
    from gkx_autocache._entry import Entry as Found
    from gkx_autocache._shared.level import Level
    from gkx_autocache._shared.seal import make_seal

    origin = HttpCache(f"{nginx.url}/{VERSION_DIR}", env={})
    kept = {f"jit_{n}-" + n * 32: b"\x78\x01" + os.urandom(size) for n, size in (("aa", 3000), ("bb", 300 << 10))}
    for key, data in kept.items():
        origin.write(key + "-gkx-shared", make_seal(key, data, 1.0, time.time(), None))
        origin.write(key + "-cache", data)
    origin.forget()
    if mode == "norange":  # an entry smaller than the first block is the whole object either way: served
        for name in entries(nginx):
            with open(nginx.root / "cache" / name, "r+b") as f:
                f.truncate(64 << 20)
    monkeypatch.setattr(_diagnostics, "_said", set())
    proxy = Proxy(nginx.port, mode=mode)
    url = nginx.url.replace(f":{nginx.port}/", f":{proxy.port}/")
    level = Level(url, HttpCache(f"{url}/{VERSION_DIR}", env={}), local=local_at(tmp_path / "r"), timeout=2.0,
                  writes="never", secret=None)
    started = time.monotonic()
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            got = [level.read(key).found for key in kept]
    finally:
        level.channel.backend.forget()
        proxy.close()
    assert not any(isinstance(found, Found) and found.data != kept[key] for found, key in zip(got, kept, strict=True))
    told = [str(w.message) for w in said]
    assert len(told) <= 1, told
    if mode == "norange":
        assert "ignores Range" in told[0], told
    if mode == "hang":
        assert "no progress for 2 s" in told[0] and time.monotonic() - started < 2 + 3, told


def looked_up(url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timeout: float = 5.0,
              **env: str) -> tuple[object, list[str], object]:
    """One lookup of a level on ``url`` in this process (a warning is said once a process: counted
    afresh): what it returned, the warnings, and the level's off-switch."""
    from gkx_autocache import _diagnostics
    from gkx_autocache._backends.http import HttpCache
    from gkx_autocache._shared.level import Level

    monkeypatch.setattr(_diagnostics, "_said", set())
    level = Level(url, HttpCache(f"{url}/{VERSION_DIR}", env=env), local=local_at(tmp_path / "local"), timeout=timeout,
                  writes="never", secret=None)
    try:
        with pytest.warns(Warning) as said:
            answer = level.read("jit_f-" + "ab" * 32)
            found = answer.found if answer.found is not None else answer.refused
    finally:
        level.channel.backend.forget()
    return found, [str(w.message) for w in said], level.channel.off


def test_a_server_error_or_a_dead_server_turns_the_level_off_with_one_line(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache that answers 503 to everything, and one that accepts connections and never answers:
    a miss, the level off, one warning naming what happened (in-process: a fresh JAX process adds
    nothing to what the level does)."""
    failing = Nginx(tmp_path / "n503", location="return 503;")
    try:
        found, said, off = looked_up(failing.url, tmp_path, monkeypatch)
    finally:
        failing.close()
    assert found is None and off is not None and len(said) == 1 and "answered 503" in said[0], said
    silent = Silent()
    try:
        found, said, off = looked_up(f"{silent.endpoint}/cache", tmp_path, monkeypatch, timeout=1.0)
    finally:
        silent.close()
    assert found is None and off is not None and len(said) == 1 and "no progress for 1 s" in said[0], said


def test_credentials_come_from_the_environment_or_netrc_and_are_never_printed(here: InProcess, tmp_path: Path) -> None:
    """A cache that wants a bearer token: without it, 401 in one line that names where credentials
    come from, never the token; with it, served. One that wants basic: from ~/.netrc."""
    bearer = Nginx(tmp_path / "bearer", auth="bearer")
    try:
        out, err = here.run_program(http_env(bearer.url, tmp_path / "a", GKX_JAX_CACHE_SHARED_TOKEN="wrong-Xy1"), FUNCTIONS)
        (warning,) = warned(err)
        assert "401" in warning and "GKX_JAX_CACHE_SHARED_TOKEN" in warning and "wrong-Xy1" not in err, err
        env = http_env(bearer.url, tmp_path / "b", GKX_JAX_CACHE_SHARED_TOKEN=TOKEN)
        cold, err = here.run_program(env, FUNCTIONS)
        assert not warned(err) and entries(bearer), err
        fresh, err = here.run_program({**env, "GKX_JAX_CACHE_DIR": str(tmp_path / "c")}, FUNCTIONS)
        assert fresh["hits"] == fresh["requests"] == len(FUNCTIONS), err
        for command in (("status",), ("--json", "status"), ("stats",)):
            shown = here.cli(*command, env=env)
            assert TOKEN not in shown.stdout + shown.stderr
    finally:
        bearer.close()
    basic = Nginx(tmp_path / "basic", auth="basic")
    home = tmp_path / "netrc-home"  # ("home" is the process's own)
    home.mkdir()
    (home / ".netrc").write_text(f"machine 127.0.0.1 login {USER} password {PASSWORD}\n")
    (home / ".netrc").chmod(0o600)
    try:
        env = http_env(basic.url, tmp_path / "d", HOME=str(home))
        cold, err = here.run_program(env, FUNCTIONS)
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


def test_a_redirect_to_another_host_never_gets_the_credentials(tmp_path: Path) -> None:
    """A cache that redirects every read to another origin (a port of its own here): the read
    follows, without the token, and finds nothing there."""
    from gkx_autocache._backends.http import HttpCache

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recording)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    port = other.server_address[1]
    redirecting = Nginx(tmp_path / "r", location=f"return 302 http://127.0.0.1:{port}$request_uri;")
    _Recording.seen = []
    cache = HttpCache(f"{redirecting.url}/{VERSION_DIR}", env={"GKX_JAX_CACHE_SHARED_TOKEN": TOKEN})
    try:
        assert cache.small("jit_f-" + "ab" * 32 + "-gkx-shared") == b""
    finally:
        cache.forget()
        redirecting.close()
        other.shutdown()
        other.server_close()
    assert _Recording.seen, "no read was redirected"
    assert not any("Authorization" in h or TOKEN in json.dumps(h) for h in _Recording.seen), _Recording.seen


def test_an_http_url_is_a_shared_level_only_and_holds_no_credentials() -> None:
    def problems(**env: str) -> list[str]:
        settings = _settings.resolve(env=env, prefix="/nonexistent", user_file="/nonexistent")
        return [m for _, m in settings.problems]

    assert problems(GKX_JAX_CACHE_SHARED="https://cache.example/jax") == []
    assert "expected a directory path or a gs://bucket or s3://bucket URL" in problems(GKX_JAX_CACHE_DIR="https://x/y")[0]
    (said,) = problems(GKX_JAX_CACHE_SHARED="https://bob:hunter2@cache.example/jax")
    assert "GKX_JAX_CACHE_SHARED_TOKEN" in said and "hunter2" not in said, said


def test_the_version_directory_is_the_same_layout_as_a_buckets(here: InProcess, tmp_path: Path, nginx: Nginx) -> None:
    """`<url>/jax-<version>/<key>-cache` and `<key>-gkx-shared`: what `status` and docs/levels.md say."""
    here.run_program(http_env(nginx.url, tmp_path / "w"), FUNCTIONS)
    assert all(name.startswith(f"{VERSION_DIR}/") for name in nginx.files()), nginx.files()


# -- what the attack found (2026-12-05) ----------------------------------------------------------------


class _KeepAlive(http.server.BaseHTTPRequestHandler):
    """Another origin that keeps its connections (HTTP/1.1): what it is asked, with the headers."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, dict[str, str]]] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        type(self).seen.append((self.command, dict(self.headers)))
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = do_PUT = _answer  # noqa: N815

    def log_message(self, *args: Any) -> None:
        pass


def test_a_connection_a_redirect_opened_elsewhere_is_never_used_for_the_cache(here: InProcess, tmp_path: Path) -> None:
    """Reads of entries redirected to another origin that keeps its connections: the cache's
    uploads and later reads still go to the cache, and the other origin never gets the token nor
    an upload (a kept connection is kept only for the cache's own origin)."""
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    port = other.server_address[1]
    location = f"""
        dav_methods PUT DELETE; create_full_put_path on; dav_access user:rw group:r all:r;
        location ~ -cache$ {{ if ($request_method = GET) {{ return 302 http://127.0.0.1:{port}$request_uri; }} }}"""
    cache = Nginx(tmp_path / "n", location=location)
    try:
        out, err = here.run_program(http_env(cache.url, tmp_path / "a", GKX_JAX_CACHE_SHARED_TOKEN=TOKEN), FUNCTIONS)
    finally:
        cache.close()
        other.shutdown()
        other.server_close()
    assert _KeepAlive.seen and all(method == "GET" for method, _ in _KeepAlive.seen), _KeepAlive.seen
    assert not any("Authorization" in headers for _, headers in _KeepAlive.seen), _KeepAlive.seen
    assert len(entries(cache)) == out["requests"] and not warned(err), err  # every upload reached the cache


def test_a_token_with_a_newline_is_used_stripped_or_never_shown(here: InProcess, tmp_path: Path) -> None:
    """A token mounted from a file ends with a newline: it is stripped. One with a control character
    inside cannot be sent: the level is off with one line that does not show it, anywhere."""
    bearer = Nginx(tmp_path / "bearer", auth="bearer")
    try:
        out, err = here.run_program(http_env(bearer.url, tmp_path / "a", GKX_JAX_CACHE_SHARED_TOKEN=TOKEN + "\n"), FUNCTIONS)
        assert not warned(err) and entries(bearer), err
        env = http_env(bearer.url, tmp_path / "b", GKX_JAX_CACHE_SHARED_TOKEN="tok\ren-Zq8")
        out, err = here.run_program(env, FUNCTIONS)
    finally:
        bearer.close()
    (warning,) = warned(err)
    assert "header is not valid" in warning and "en-Zq8" not in err, err
    for command in (("status",), ("--json", "status"), ("explain",), ("--json", "explain")):
        shown = here.cli(*command, env=env)
        assert "en-Zq8" not in shown.stdout + shown.stderr, command
    assert not any("en-Zq8" in p.read_text(errors="replace") for p in (tmp_path / "b").rglob("*") if p.is_file())


def test_a_connection_the_server_closed_meanwhile_is_tried_again_on_a_new_one(here: InProcess, tmp_path: Path) -> None:
    """nginx closes a kept connection after its keepalive_timeout (75 s by default; 1 s here): the
    next request on it is tried once on a new connection, and the level stays on."""
    cache = Nginx(tmp_path / "n", http="keepalive_timeout 1s;")
    try:
        with here.process(http_env(cache.url, tmp_path / "a")) as ran:
            ran.jit("sin")
            time.sleep(2.5)  # longer than the cache keeps an idle connection
            ran.jit("cos")
    finally:
        cache.close()
    assert not warned(ran.stderr), ran.stderr
    assert "2 uploaded" in ran.stderr or len(entries(cache)) >= 2, ran.stderr


class _Big404(http.server.BaseHTTPRequestHandler):
    """A 404 with a 200 KiB body, kept alive: a client that reads a part of it must not reuse the connection."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        body = b"x" * (200 << 10)
        self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_response_not_read_to_its_end_never_answers_the_next_request() -> None:
    from gkx_autocache._backends.http import HttpCache

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Big404)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cache = HttpCache(f"http://127.0.0.1:{server.server_address[1]}/cache/{VERSION_DIR}", env={})
        assert [cache.small("one"), cache.small("two"), cache.small("three")] == [b"", b"", b""]
    finally:
        server.shutdown()
        server.server_close()


def test_an_entry_without_its_seal_is_refused_without_a_key_too(here: InProcess, tmp_path: Path, nginx: Nginx) -> None:
    """The package puts every entry of an HTTP cache there with its seal: one without (another's bytes
    a server serves, a seal taken away) is refused by a reader without the key as well."""
    cold, _ = here.run_program(http_env(nginx.url, tmp_path / "w"), FUNCTIONS)
    drop_packs(nginx)
    name = sorted(entries(nginx))[0]
    (nginx.root / "cache" / name.replace("-cache", "-gkx-shared")).unlink()
    env = http_env(nginx.url, tmp_path / "r")
    out, err = here.run_program(env, FUNCTIONS)
    assert report(err)["shared"] == out["requests"] - 1 and out["result"] == cold["result"], err
    explained = json.loads(here.cli("--json", "explain", env=env).stdout)
    (rejected,) = [g for g in explained["groups"] if g["cause"] == "rejected"]
    assert "no seal" in rejected["functions"][0]["detail"], rejected


def test_an_http_url_takes_no_query() -> None:
    settings = _settings.resolve(env={"GKX_JAX_CACHE_SHARED": "https://c.example/jax?access_token=abc123"},
                                 prefix="/nonexistent", user_file="/nonexistent")
    (said,) = [m for _, m in settings.problems]
    assert "takes no query" in said and "abc123" not in said and settings["shared"] is None, said


# -- ~/.netrc's default entry, and credentials over plain http:// (issue 57 L7) --------------------


def own_address() -> str:
    """This machine's address on its network (not loopback): what another machine reaches it by."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.123", 9))  # (no packet is sent: only the route is chosen)
            address = str(probe.getsockname()[0])
        except OSError:
            address = ""
    if not address or address.startswith("127."):
        pytest.skip("this machine has no address but loopback")
    return address


def netrc(home: Path, text: str) -> None:
    home.mkdir(exist_ok=True)
    (home / ".netrc").write_text(text)
    (home / ".netrc").chmod(0o600)  # (the standard library refuses one others can read)


def sent(url: str, **kwargs: Any) -> list[dict[str, str]]:
    """The headers an HTTP level's read of one object sent to ``url``'s server (``_Recording``)."""
    from gkx_autocache._backends.http import HttpCache

    _Recording.seen = []
    cache = HttpCache(f"{url}/{VERSION_DIR}", **kwargs)
    try:
        assert cache.small("one") == b""
    finally:
        cache.forget()
    return list(_Recording.seen)


@pytest.fixture
def recording() -> Iterator[int]:
    """A server that records what it is sent, on every address of this machine: its port."""
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), _Recording)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


def test_netrc_s_default_entry_is_never_sent_only_the_machine_entry_of_the_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recording: int) -> None:
    """The standard library answers any host with ~/.netrc's ``default`` login: the HTTP level
    sent it to whatever cache it was pointed at. Now only a ``machine`` entry that names the host
    is used, and `status` says which entry, or why none."""
    from gkx_autocache._backends.http import credentials_source

    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    netrc(home, "machine elsewhere.example login bob password b0b-Pw\ndefault login alice password d3fault-Pw\n")
    url = f"http://127.0.0.1:{recording}/cache"
    assert not any("Authorization" in h for h in sent(url, env={})), _Recording.seen
    said = credentials_source(url, {})
    assert "no machine 127.0.0.1 entry" in said and "default entry is never sent" in said and str(home) in said, said
    netrc(home, "machine 127.0.0.1 login alice password m4chine-Pw\ndefault login x password y\n")
    (headers,) = sent(url, env={})
    assert headers.get("Authorization", "").startswith("Basic "), headers
    assert credentials_source(url, {}) == f"basic, from the machine 127.0.0.1 entry of {home / '.netrc'}"


def test_no_credential_crosses_the_network_in_clear_unless_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recording: int) -> None:
    """Over plain http:// to this machine's network address (not loopback), neither the token nor
    the host's ~/.netrc entry is sent, and the level says so in one warning at `import jax` and in
    `status`; ``shared_credentials_over_http`` sends them; over loopback they are sent."""
    from types import SimpleNamespace

    from gkx_autocache._backends.http import credentials_source
    from gkx_autocache._shared import setup

    address = own_address()
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    netrc(home, f"machine {address} login alice password n3t-Pw\n")
    url = f"http://{address}:{recording}/cache"
    for env in ({}, {"GKX_JAX_CACHE_SHARED_TOKEN": "t0ken-Zz"}):
        assert not any("Authorization" in h for h in sent(url, env=env)), _Recording.seen
        assert "not sent, it would cross the network in clear" in credentials_source(url, env)
    (headers,) = sent(url, env={}, over_http=True)
    assert headers.get("Authorization", "").startswith("Basic "), headers
    (headers,) = sent(f"http://127.0.0.1:{recording}/cache", env={"GKX_JAX_CACHE_SHARED_TOKEN": "t0ken-Zz"})
    assert headers.get("Authorization") == "Bearer t0ken-Zz", headers

    location = SimpleNamespace(version_dir=str(tmp_path / "local"), remote=False, users_own=False, stock=False,
                               root=str(tmp_path), team=False)
    for asked, warned in (({}, True), ({"GKX_JAX_CACHE_SHARED_CREDENTIALS_OVER_HTTP": "1"}, False)):
        env = {"GKX_JAX_CACHE_SHARED": url, **asked}
        settings = _settings.resolve(env=env, prefix="/nonexistent", user_file="/nonexistent")
        level, problems = setup.level_for(settings, location, "0.4.30", env, local_at(tmp_path / "local"))
        assert level is not None
        level.channel.backend.forget()
        said = [message for cause, message in problems if cause == "shared:cleartext"]
        assert bool(said) == warned, problems
        if warned:
            assert "not sent" in said[0] and "https://" in said[0] and "shared_credentials_over_http" in said[0]
            assert "n3t-Pw" not in said[0], said


# -- a server's limit on a body skips an entry, not the level (issue 61) --------------------------------


def test_an_entry_above_the_server_s_body_limit_is_skipped_and_the_level_stays_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nginx set up as the docs said answers a 1.3 MiB entry `413 Request Entity Too Large` (its
    client_max_body_size is 1 MiB by default): that entry is skipped, with one warning naming the
    setting that raises the limit; the entries after it are uploaded (the level turned off before,
    and a fresh machine missed them), and one as large is not sent again."""
    import os
    import time

    from gkx_autocache import _diagnostics
    from gkx_autocache._backends.http import HttpCache
    from gkx_autocache._diagnostics import AutocacheWarning
    from gkx_autocache._entry import Entry as Found
    from gkx_autocache._shared.level import Level

    monkeypatch.setattr(_diagnostics, "_said", set())
    cache = Nginx(tmp_path / "n", location="dav_methods PUT DELETE; create_full_put_path on; "
                                          "dav_access user:rw group:r all:r; client_max_body_size 1m;")
    url = cache.url
    entries = {f"jit_{name}-" + name * 32: b"\x78\x01" + os.urandom(size)
               for name, size in (("aa", 100 << 10), ("bb", 1300 << 10), ("cc", 200 << 10), ("dd", 1400 << 10))}
    level = Level(url, HttpCache(f"{url}/{VERSION_DIR}", env={}), local=local_at(tmp_path / "l"), timeout=30.0,
                  writes=None, secret=None)
    try:
        with pytest.warns(AutocacheWarning, match=r"refused an entry of 1\.3 MiB.*client_max_body_size") as said:
            level.uploads.start()
            for key, data in entries.items():
                level.put(key, data, 1.0, written=time.time())
            level.finish()
        assert len(said) == 1 and level.channel.off is None, [str(w.message) for w in said]
        held = {name.removesuffix("-cache") for name in entries_of(cache)}
        assert held == {key for key in entries if key.startswith(("jit_aa", "jit_cc"))}, held
        shared = level.snapshot()
        assert shared["uploads"] == 2 and shared["skipped"] == 2 and shared["errors"] == 0, shared
        fresh = Level(url, HttpCache(f"{url}/{VERSION_DIR}", env={}), local=local_at(tmp_path / "f"), timeout=5.0,
                      writes="never", secret=None)
        key = next(k for k in entries if k.startswith("jit_cc"))
        found = fresh.read(key).found
        assert isinstance(found, Found) and found.data == entries[key]
        fresh.channel.backend.forget()
    finally:
        level.channel.backend.forget()
        cache.close()


def entries_of(server: Nginx) -> dict[str, int]:
    return {name.split("/")[-1]: size for name, size in server.files().items() if name.endswith("-cache")}
