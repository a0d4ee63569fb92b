"""A slow server never holds a ``jit`` (SPEC §14, amended 2026-12-06; issue 57 H3): a lookup's read
of an entry, and a prefetch worker's, has a wall-clock bound that does not grow with its blocks
(no longer than compiling it took, never less than a link that works needs), and a rate below a
floor for ``shared_timeout`` is a stall. In-process, against real servers (nginx's WebDAV, moto's
S3 through the package's own client and through s3fs) behind ``hostile.Proxy``, which delays and
paces what they answer."""

from __future__ import annotations

import hashlib
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import S3, local_at
from hostile import Proxy
from test_activation import VERSION_DIR
from webdav import Nginx

from gkx_autocache import _diagnostics
from gkx_autocache._diagnostics import AutocacheWarning
from gkx_autocache._entry import Entry as Found
from gkx_autocache._shared import calls
from gkx_autocache._shared.level import Level
from gkx_autocache._shared.seal import make_seal

TIMEOUT = 2.5
SECRET = b"the team's signing key"  # a signed seal's compile time bounds a read; an unsigned one's never does
KINDS = ["http", "s3", "s3fs"]  # nginx; moto through the package's own S3 client; through s3fs


def key(name: str) -> str:
    return f"jit_{name}-{hashlib.sha256(name.encode()).hexdigest()}"


def entry(size: int) -> bytes:
    """``size`` bytes that begin as JAX's entries do (a zlib frame), of random content."""
    return zlib.compress(os.urandom(size), 0)[:size]


@dataclass
class Server:
    """Where the entries are (``put``), and a level that reads them through a proxy (``level``)."""

    put: Callable[..., None]  # (name, data, compile_secs, secret=SECRET): an entry and its seal
    level: Callable[..., tuple[Level, Proxy]]  # (timeout=TIMEOUT, secret=SECRET, **proxying)


@pytest.fixture
def server(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """nginx over WebDAV, or a bucket of moto's read by the package's own S3 client or by s3fs;
    each level reads through its own ``Proxy`` (closed after the test)."""
    from gkx_autocache._backends import s3 as direct
    from gkx_autocache._backends.bucket import Bucket
    from gkx_autocache._backends.http import HttpCache

    monkeypatch.setattr(_diagnostics, "_said", set())  # (a warning is said once a process)
    proxies: list[Proxy] = []
    levels: list[Level] = []
    local = tmp_path / "local"
    local.mkdir()

    def make(backend: Any, url: str, proxy: Proxy, timeout: float, secret: bytes | None) -> tuple[Level, Proxy]:
        proxies.append(proxy)
        levels.append(level := Level(url, backend, local=local_at(local), timeout=timeout, writes="never", secret=secret))
        return level, proxy

    before = set(threading.enumerate())  # (another test's thread left stuck on a silent server is not waited for)

    def close() -> None:
        deadline = time.monotonic() + 15  # the reads given up on end at their next part, or their request's answer
        while time.monotonic() < deadline and any(t.name.startswith("gkx-autocache") and t not in before
                                                  for t in threading.enumerate()):
            time.sleep(0.05)
        for level in levels:
            level.channel.backend.forget()  # its kept connections closed (a level lives as long as its process)
        for proxy in proxies:
            proxy.close()

    kind = request.param
    if kind == "http":
        nginx = Nginx(tmp_path / "nginx")
        origin = HttpCache(f"{nginx.url}/{VERSION_DIR}", env={})

        def upload(name: str, data: bytes, compile_secs: float | None, secret: bytes | None = SECRET) -> None:
            origin.write(name + "-gkx-shared", make_seal(name, data, compile_secs, time.time(), secret))
            origin.write(name + "-cache", data)

        def reader(timeout: float = TIMEOUT, secret: bytes | None = SECRET, **proxying: Any) -> tuple[Level, Proxy]:
            proxy = Proxy(nginx.port, **proxying)
            url = f"{proxy.endpoint}/cache"
            return make(HttpCache(f"{url}/{VERSION_DIR}", env={}), url, proxy, timeout, secret)

        yield Server(upload, reader)
        close()
        origin.forget()
        nginx.close()
        return
    bucket: S3 = request.getfixturevalue("s3")
    port = int(bucket.endpoint.rsplit(":", 1)[1])

    def put(name: str, data: bytes, compile_secs: float | None, secret: bytes | None = SECRET) -> None:
        client = bucket.client()
        prefix = f"team/{VERSION_DIR}/{name}"
        client.put_object(Bucket=bucket.bucket, Key=prefix + "-gkx-shared",
                          Body=make_seal(name, data, compile_secs, time.time(), secret))
        client.put_object(Bucket=bucket.bucket, Key=prefix + "-cache", Body=data)

    def level(timeout: float = TIMEOUT, secret: bytes | None = SECRET, **proxying: Any) -> tuple[Level, Proxy]:
        proxy = Proxy(port, **proxying)
        url = f"s3://{bucket.bucket}/team"
        env = {**bucket.env, "AWS_ENDPOINT_URL": proxy.endpoint}
        if kind == "s3":
            found = direct.keys(env, bucket.bucket)
            assert not isinstance(found, str), found
            return make(direct.S3(f"{url}/{VERSION_DIR}", found), url, proxy, timeout, secret)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return make(Bucket(f"{url}/{VERSION_DIR}"), url, proxy, timeout, secret)

    yield Server(put, level)
    close()


def timed(level: Level, name: str) -> tuple[Found | str | None, float]:
    started = time.monotonic()
    answer = level.read(key(name))
    return (answer.found if answer.found is not None else answer.refused), time.monotonic() - started


@pytest.mark.parametrize("server", KINDS, indirect=True)
def test_a_server_that_answers_each_block_just_under_the_timeout_holds_a_lookup_no_longer_than_its_compile(
        server: Server) -> None:
    """Every read answered 1.75 s late (a congested proxy; the timeout is 2.5 s): a 4 MiB entry of
    16 blocks whose compile took 1 s is given up after its first round trip (it took 28 s and more
    before: a block's progress reset the timeout), compiled here, with one warning; the level
    stays on, and serves the next entry, one block long."""
    server.put(key("big"), entry(4 << 20), 1.0)
    server.put(key("small"), small := entry(100 << 10), 1.0)
    level, _ = server.level(delay=1.75, only="-cache")
    assert level.channel.ensure()
    with pytest.warns(AutocacheWarning, match="slower than compiling.*stays on"):
        found, took = timed(level, "big")
    assert found is None and took < 7.0 and level.channel.off is None, (found, took, level.channel.off)
    found, _ = timed(level, "small")
    assert isinstance(found, Found) and found.data == small
    shared = level.snapshot()
    assert shared["slow"] == 1 and shared["hits"] == 1 and shared["timeouts"] == 0, shared


@pytest.mark.parametrize("server", ["http", "s3fs"], indirect=True)  # (s3 reads on http's transport)
def test_a_server_that_slows_down_just_before_the_bound_is_left_at_the_bound(server: Server) -> None:
    """2 MiB a second, then from 2.5 s each request 1.2 s late (under the timeout, above the rate
    floor): an 8 MiB entry whose compile took 3.5 s is given up at 3.5 s, not read on block by
    block (about 12 s more before)."""
    server.put(key("big"), entry(8 << 20), 3.5)
    level, _ = server.level(pace=2 << 20, delay=1.2, slow_after=2.5)
    assert level.channel.ensure()
    with pytest.warns(AutocacheWarning, match=r"not read within 3\.5 s \(its compile took 3\.50 s\)"):
        found, took = timed(level, "big")
    assert found is None and 3.3 < took < 5.5 and level.channel.off is None, (found, took, level.channel.off)


@pytest.mark.parametrize("server", ["s3"], indirect=True)
def test_a_server_slow_only_on_the_largest_entry_costs_that_entry_only(server: Server) -> None:
    """The attack on a bound per entry: only the largest entry's requests are late. It is compiled
    here after its bound; the others, before and after it, are served."""
    server.put(key("a"), a := entry(200 << 10), 0.5)
    server.put(key("large"), entry(6 << 20), 0.5)
    server.put(key("b"), b := entry(300 << 10), 0.5)
    level, _ = server.level(delay=1.75, only=key("large"))
    assert level.channel.ensure()
    assert getattr(level.read(key("a")).found, "data", None) == a
    with pytest.warns(AutocacheWarning, match="slower than compiling"):
        found, took = timed(level, "large")
    assert found is None and took < 7.0, took
    assert getattr(level.read(key("b")).found, "data", None) == b and level.channel.off is None


@pytest.mark.parametrize("server", ["http"], indirect=True)
def test_a_rate_below_the_floor_is_a_stall_that_turns_the_level_off(server: Server) -> None:
    """At a timeout of 6 s, each block of 256 KiB answered 4.6 s late (56 KiB/s, under the floor of
    64 KiB/s), an entry whose seal claims an hour of compile: a stall once a timeout of it has been
    measured, the level off with one warning (each block's answer was progress: 37 s before)."""
    server.put(key("big"), entry(2 << 20), 3600.0)
    level, _ = server.level(timeout=6.0, delay=4.6, only="-cache")
    assert level.channel.ensure()
    with pytest.warns(AutocacheWarning, match="less than 64 KiB/s for 6 s"):
        found, took = timed(level, "big")
    assert found is None and took < 10.0 and level.channel.off is not None, (took, level.channel.off)


@pytest.mark.parametrize("server", ["http"], indirect=True)
def test_a_seal_whose_compile_time_is_tiny_still_gets_its_entry_read(server: Server) -> None:
    """A seal that says the compile took nothing (a bug, or a liar): the entry is read all the same
    where the link works (a second, and a second per 16 MiB), never refused by that claim."""
    server.put(key("big"), big := entry(6 << 20), 0.0)
    level, _ = server.level()
    assert level.channel.ensure()
    found, _ = timed(level, "big")
    assert isinstance(found, Found) and found.data == big and level.snapshot()["slow"] == 0


@pytest.mark.parametrize("server", ["http", "s3"], indirect=True)
def test_an_unsigned_seal_never_sets_how_long_a_read_may_take(server: Server) -> None:
    """Issue 67's L10: a keyless reader takes unsigned seals, and a level writer's seal claimed 250 s
    of compile: one `jit` waited 49 s, with no warning, for a 3.3 MB entry dripped at ~70 KB/s (above
    the rate floor). Its claim is no one's word now: the read gets what a working link needs, or one
    shared_timeout, and the warning says why; with the signing key, the signed claim of the same
    writer still buys its time (``test_a_server_that_slows_down...``)."""
    server.put(key("claimed"), entry(3_300_000), 250.0, secret=None)
    level, _ = server.level(timeout=10.0, secret=None, pace=70 << 10)  # (the default timeout, as it was found)
    assert level.channel.ensure()
    with pytest.warns(AutocacheWarning, match="not read within 10.0 s .its seal is not signed, so its compile time is not taken"):
        found, took = timed(level, "claimed")
    assert found is None and took < 14.0 and level.channel.off is None, (found, took, level.channel.off)


@pytest.mark.parametrize("server", ["http"], indirect=True)
def test_a_read_longer_than_compiling_its_function_here_is_said(server: Server) -> None:
    """Issue 67's L10, the other half: a read that outlasts the compile time this process measured for
    the same function is said, once, where the bound let it finish (the link is slower than compiling)."""
    server.put(key("f"), data := entry(200 << 10), None, secret=None)
    level, _ = server.level(secret=None, delay=1.2, only="-cache")
    assert level.channel.ensure()
    level.put(key("f") + "0", b"x", 0.05)  # this process compiled another shape of jit_f in 0.05 s
    with pytest.warns(AutocacheWarning, match=r"reading jit_f from the shared level .* took [0-9.]+ s, where this process compiles jit_f in 0\.05 s"):
        found, took = timed(level, "f")
    assert isinstance(found, Found) and found.data == data and took > 1.0, took


@pytest.mark.parametrize("server", ["s3"], indirect=True)
def test_a_dripping_prefetch_holds_its_lookup_no_longer_than_the_entry_is_worth(
        server: Server, tmp_path: Path) -> None:
    """A prefetch worker's fetch through a server that answers each read 1.75 s late: the lookup
    that waits for it is let go at the entry's bound (it waited for the whole read before), and
    does not read it again: it compiles."""
    from gkx_autocache._shared.prefetch import Prefetch

    server.put(key("big"), entry(4 << 20), 1.0)
    level, _ = server.level(delay=1.5, only="-cache")
    assert level.channel.ensure()
    ahead = Prefetch(level.channel, level.reader, level.local, 1 << 30)
    level._prefetch = ahead
    with ahead.flights.lock:
        ahead.flights.pending[key("big")] = 4 << 20
    with pytest.warns(AutocacheWarning, match="slower than compiling"):
        ahead._spawn()
        deadline = time.monotonic() + 5
        while key("big") not in ahead.flights.flight and time.monotonic() < deadline:
            time.sleep(0.01)
        started = time.monotonic()
        ahead.wait(key("big"))
        waited = time.monotonic() - started
        found, took = timed(level, "big")
    assert waited < 7.0 and found is None and took < 0.5 and level.channel.off is None, (waited, took)


def test_the_bound_a_seal_buys_is_between_what_a_link_needs_and_thirty_timeouts() -> None:
    """``worth``: a tiny or absent compile time never buys less than a link that works needs; a
    huge one (an hour, a debugger's pause counted as compile) never more than 30 timeouts."""
    assert calls.worth(1 << 20, 0.0, 10.0)[0] == pytest.approx(1.0625)
    assert calls.worth(160 << 20, 0.001, 10.0)[0] == pytest.approx(11.0)
    assert calls.worth(1 << 20, 4.0, 10.0)[0] == 4.0
    assert calls.worth(1 << 20, 3600.0, 10.0)[0] == 300.0
    assert calls.worth(1 << 20, None, 10.0)[0] == 10.0


def test_a_read_that_keeps_moving_ends_at_its_bound_and_its_thread_stops_reading() -> None:
    """``bounded``: a read that receives well above the floor, past the deadline its seal set, is
    TooSlow at the deadline, and its thread is told to stop at its next part."""
    stopped = threading.Event()

    def read(progress: calls.Progress) -> None:
        progress.meter()
        progress.bound(*calls.worth(1 << 20, 3600.0, 0.05))  # 30 timeouts: 1.5 s
        try:
            while True:
                time.sleep(0.01)
                progress.got(64 << 10)
                progress.tick()
        except calls.Abandoned:
            stopped.set()

    started = time.monotonic()
    with pytest.raises(calls.TooSlow, match="30 shared_timeouts"):
        calls.bounded(read, 0.05)
    assert 1.4 < time.monotonic() - started < 3.0
    assert stopped.wait(2.0)
