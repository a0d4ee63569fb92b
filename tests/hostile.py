"""Endpoints that misbehave, for the shared level's tests (SPEC §14): a proxy in front of a real
S3 server (moto's), HTTP-aware enough to count requests, slow them down, and lie about object
bodies; a server that accepts connections and never answers; and one that answers a byte a
second. They run on threads of the test process, on 127.0.0.1."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from typing import Any

MODES = ("forward", "truncate", "short", "lie", "long", "norange", "hang", "drip")


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def _read_until(sock: socket.socket, buffer: bytearray, marker: bytes) -> bytes | None:
    while marker not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buffer += chunk
    end = buffer.index(marker) + len(marker)
    head = bytes(buffer[:end])
    del buffer[:end]
    return head


def _read_exactly(sock: socket.socket, buffer: bytearray, n: int) -> bytes:
    while len(buffer) < n:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed in a body")
        buffer += chunk
    body = bytes(buffer[:n])
    del buffer[:n]
    return body


def _relay(sock: socket.socket, buffer: bytearray, to: socket.socket, n: int) -> None:
    """Send ``n`` bytes of a body from ``sock`` (after what ``buffer`` holds) to ``to`` as they come."""
    while n:
        if not buffer:
            chunk = sock.recv(min(n, 65536))
            if not chunk:
                raise ConnectionError("closed in a body")
            buffer += chunk
        part = bytes(buffer[:n])
        del buffer[:len(part)]
        to.sendall(part)
        n -= len(part)


def _read_chunked(sock: socket.socket, buffer: bytearray) -> bytes:
    raw = b""
    while True:
        line = _read_until(sock, buffer, b"\r\n")
        if line is None:
            raise ConnectionError("closed in a chunked body")
        raw += line
        size = int(line.split(b";")[0].strip() or b"0", 16)
        raw += _read_exactly(sock, buffer, size + 2)
        if size == 0:
            return raw


def _headers(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    fields = {}
    for item in lines[1:]:
        if ":" in item:
            name, _, value = item.partition(":")
            fields[name.strip().lower()] = value.strip()
    return lines[0], fields


def _replace_header(head: bytes, name: str, value: str | None) -> bytes:
    lines = head.decode("latin-1").split("\r\n")
    kept = [ln for ln in lines if not ln.lower().startswith(name.lower() + ":")]
    if value is not None:
        kept.insert(1, f"{name}: {value}")
    return "\r\n".join(kept).encode("latin-1")


def _body(sock: socket.socket, buffer: bytearray, fields: dict[str, str], bodyless: bool) -> bytes:
    if bodyless:
        return b""
    if "chunked" in fields.get("transfer-encoding", "").lower():
        return _read_chunked(sock, buffer)
    return _read_exactly(sock, buffer, int(fields.get("content-length", "0") or 0))


class _Listening:
    """A server of its own on 127.0.0.1, answering in threads until ``close``."""

    def _listen(self, handler: type[socketserver.BaseRequestHandler]) -> None:
        self.server = _Server(("127.0.0.1", 0), handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Proxy(_Listening):
    """In front of ``upstream`` (a port of 127.0.0.1). ``mode`` says what it does to the bodies of
    object reads (a GET of an entry, ``...-cache``): ``forward`` nothing; ``truncate`` sends half
    and closes the connection; ``short`` says and sends 10 bytes fewer; ``long`` sends 10 bytes
    more than the object has; ``lie`` sends other bytes of the same length; ``norange`` strips the
    ``Range`` header from every request, so a ranged read gets the whole object (200), as from an
    endpoint that ignores ``Range``; ``hang`` never answers a read of an entry or a pack; ``drip`` sends
    a pack at once up to the middle of its middle record's entry, then a byte every 40 ms (a bad
    proxy, a congested link: that record in flight, its lookup waiting). ``delay`` seconds
    before each request is forwarded: only where its path holds ``only``, and only ``slow_after``
    seconds after the first read of an entry (a server that slows down); ``pace``: the bodies of
    entry reads sent at that many bytes a second. ``requests`` lists ``(method, path)`` as they
    come; ``peak`` is the most requests it held at once."""

    def __init__(self, upstream: int, mode: str = "forward", delay: float = 0.0, only: str | None = None,
                 slow_after: float = 0.0, pace: int = 0) -> None:
        assert mode in MODES
        self.upstream = upstream
        self.mode = mode
        self.delay = delay
        self.only = only
        self.slow_after = slow_after
        self.pace = pace
        self.first_read: float | None = None  # when the first entry read came
        self.requests: list[tuple[str, str]] = []
        self._closed = threading.Event()
        self.active = 0  # requests forwarded and not yet answered
        self.peak = 0  # the most of them at once: whether a client asks in parallel
        self._count = threading.Lock()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                try:
                    proxy._serve(self.request)
                except (OSError, ConnectionError, ValueError):
                    pass

        self._listen(Handler)

    def close(self) -> None:
        self._closed.set()
        super().close()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream))
        inbound, outbound = bytearray(), bytearray()
        try:
            while True:
                head = _read_until(client, inbound, b"\r\n\r\n")
                if head is None:
                    return
                line, fields = _headers(head)
                method, path = line.split(" ")[:2]
                self.requests.append((method, path))
                if fields.get("expect", "").lower() == "100-continue":
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    head = _replace_header(head[:-4], "Expect", None) + b"\r\n\r\n"
                body = _body(client, inbound, fields, bodyless=False)
                if self.mode == "hang" and method == "GET" and path.split("?")[0].endswith(("-cache", "-gkx-pack")):
                    self._closed.wait()  # an entry read never answered, until the proxy closes
                    return
                if self.mode == "norange":
                    head = _replace_header(head[:-4], "Range", None) + b"\r\n\r\n"
                with self._count:
                    self.active += 1
                    self.peak = max(self.peak, self.active)
                    reading = method == "GET" and path.split("?")[0].endswith("-cache")
                    if reading and self.first_read is None:
                        self.first_read = time.monotonic()
                    since = time.monotonic() - self.first_read if self.first_read is not None else 0.0
                try:
                    if self.delay and (self.only is None or self.only in path) and since >= self.slow_after:
                        time.sleep(self.delay)
                    upstream.sendall(head + body)
                    while True:
                        rhead = _read_until(upstream, outbound, b"\r\n\r\n")
                        if rhead is None:
                            return
                        status, rfields = _headers(rhead)
                        code = int(status.split(" ")[1])
                        if code >= 200:
                            break
                        client.sendall(rhead)
                    if self.mode == "norange" and method == "GET" and code == 200 and "content-length" in rfields:
                        # as a server that ignores Range: the head at once, then the whole body as it comes
                        client.sendall(rhead)
                        _relay(upstream, outbound, client, int(rfields["content-length"]))
                        continue
                    rbody = _body(upstream, outbound, rfields, bodyless=method == "HEAD" or code in (204, 304))
                finally:
                    with self._count:
                        self.active -= 1
                entry = method == "GET" and path.split("?")[0].endswith("-cache") and code in (200, 206)
                if self.mode == "drip" and method == "GET" and path.split("?")[0].endswith("-gkx-pack"):
                    fast = _middle_of_middle_record(rbody)
                    client.sendall(rhead + rbody[:fast])
                    for i in range(fast, len(rbody)):
                        if self._closed.wait(0.04):
                            return
                        client.sendall(rbody[i:i + 1])
                    continue
                if entry and self.pace and self.mode == "forward":  # a link of that many bytes a second
                    client.sendall(rhead)
                    for at in range(0, len(rbody), 16 << 10):
                        client.sendall(rbody[at:at + (16 << 10)])
                        if self._closed.wait(len(rbody[at:at + (16 << 10)]) / self.pace):
                            return
                elif not entry or self.mode in ("forward", "norange", "drip") or "chunked" in rfields.get("transfer-encoding", ""):
                    client.sendall(rhead + rbody)
                elif self.mode == "truncate":
                    client.sendall(rhead + rbody[: len(rbody) // 2])
                    return  # closed in the middle of the body
                elif self.mode == "short":
                    cut = max(len(rbody) - 10, 1)
                    client.sendall(_replace_header(rhead[:-4], "Content-Length", str(cut)) + b"\r\n\r\n" + rbody[:cut])
                elif self.mode == "long":
                    more = rbody + b"\0" * 10
                    client.sendall(_replace_header(rhead[:-4], "Content-Length", str(len(more))) + b"\r\n\r\n" + more)
                elif self.mode == "lie":
                    client.sendall(rhead + bytes(b ^ 0x5A for b in rbody))
        finally:
            upstream.close()
            client.close()


def _middle_of_middle_record(data: bytes) -> int:
    """Where a pack's middle record's entry is half sent."""
    from gkx_autocache._shared import pack

    at, ends = len(pack.MAGIC), list[tuple[int, int]]()
    while at + pack.HEAD.size <= len(data):
        key, seal, size = (int(n) for n in pack.HEAD.unpack(data[at:at + pack.HEAD.size]))
        start = at + pack.HEAD.size + key + seal
        ends.append((start, start + size))
        at = start + size
    start, end = ends[len(ends) // 2]
    return (start + end) // 2


class Silent(_Listening):
    """Accepts every connection, reads what it is sent, and never answers (``dribble``: answers a
    byte a second, forever)."""

    def __init__(self, dribble: bool = False) -> None:
        self.dribble = dribble
        self.connections = 0
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                owner.connections += 1
                sock: Any = self.request
                try:
                    sock.recv(65536)
                    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 1000000
                    for i in range(len(reply)) if owner.dribble else []:
                        sock.sendall(reply[i:i + 1])
                        time.sleep(1.0)
                    while not owner.dribble and sock.recv(65536):
                        pass
                except OSError:
                    pass

        self._listen(Handler)
