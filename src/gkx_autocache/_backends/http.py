"""The shared level in an HTTP(S) cache (``http://``, ``https://``; SPEC §14): the protocol ccache,
sccache, Gradle and Bazel's remote caches speak, ``GET``, ``PUT`` and ``HEAD`` of whole objects, on
the bucket's layout (``<url>/jax-<version>/<key>-cache``, its seal ``<key>-gkx-shared``, the
programs' manifests and packs). nginx with WebDAV and Artifactory's generic repositories hold it as
it is; bazel-remote's ``/ac/`` wants sha256 names (docs/levels.md). The standard library's
``http.client`` only: a fresh machine imports no client library.

Credentials: a bearer token from ``GKX_JAX_CACHE_SHARED_TOKEN``, else the ``~/.netrc`` entry that
names the host (basic; never its ``default``); never printed, never sent in clear over ``http://`` to
another machine unless asked (``shared_credentials_over_http``), and never sent where a redirect
leads to another origin (a read follows at most three redirects; an upload follows none). An HTTP cache cannot be listed: the
level answers each lookup by its own requests, and heals nothing (its server keeps it).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urljoin, urlsplit

from gkx_autocache._backends import bucket
from gkx_autocache._backends.bucket import RangeIgnored, wrong_range
from gkx_autocache._backends.port import Failure, Listed, Progress, Refused, TooLarge, Uncounted
from gkx_autocache._diagnostics import human_bytes, one_line
from gkx_autocache._formats import SEAL_LIMIT
from gkx_autocache._layout import ENTRY_SUFFIX, SEAL_SIDECAR, version_name
from gkx_autocache._shared.calls import FIRST_BLOCK, bounded

TOKEN_ENV = "GKX_JAX_CACHE_SHARED_TOKEN"
REDIRECTS = 3
POOL = 4  # idle connections kept for the next request
PROBE = "gkx-autocache-probe"  # the name a HEAD asks for to see that the cache answers
NO_LISTING = Uncounted("not counted: an HTTP cache cannot be listed")



class EndpointRefused(ConnectionRefusedError):
    """A refused connection, named with its endpoint (``calls.describe``)."""

    def __init__(self, exc: ConnectionRefusedError, endpoint: str) -> None:
        super().__init__(*exc.args)
        self.endpoint = endpoint

class HttpError(OSError):
    """The server answered with an error status; the message is one line, without credentials."""

    def __init__(self, status: int, reason: str, url: str,
                 credentials: str = f"{TOKEN_ENV}, or a ~/.netrc entry for the host") -> None:
        self.hint = f"(credentials: {credentials})" if status in (401, 403) else ""
        super().__init__(one_line(f"{url} answered {status} {reason}{' ' + self.hint if self.hint else ''}"))
        self.status = status  # (a server's words in it: escaped)

    @classmethod
    def of(cls, status: int, reason: str, url: str, credentials: str | None = None,
           too_large: bool = False) -> HttpError:
        """The error for a status: a refusal for the body's size (413, or a store's own code for one:
        ``too_large``) is ``BodyTooLarge``, that object's and not the level's."""
        made = BodyTooLarge if status == 413 or too_large else cls
        return made(status, reason, url) if credentials is None else made(status, reason, url, credentials)


class BodyTooLarge(HttpError, TooLarge):
    """An upload the server refused for its size: that entry is skipped, not the level."""

    fix = ("raise the server's limit on a request's body (nginx: client_max_body_size, 1 MiB by default: "
           "client_max_body_size 0 takes any size)")


def origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)


def loopback(host: str) -> bool:
    """Whether ``host`` names this machine (``localhost``, 127.0.0.0/8, ``::1``): what plain
    ``http://`` may carry credentials to without anyone on a network path reading them."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    import ipaddress

    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def credentials(url: str, env: Any = os.environ, over_http: bool = False,
                hop: str | None = None) -> tuple[str | None, str, bool]:
    """The ``Authorization`` header for the cache at ``url`` (``Bearer`` from ``TOKEN_ENV``, else
    ``Basic`` from the ``~/.netrc`` entry that names the host: never its ``default`` entry, which
    the standard library gives for any host), and where it comes from, for ``status`` and the
    warning (never its value), and whether it is withheld: over plain ``http://`` to a host that is
    not this machine anyone on the path reads it, so it is sent there only with ``over_http``
    (``shared_credentials_over_http``). ``hop``: the http:// proxy a request goes to first, which
    reads it as well."""
    scheme, host, _ = origin(url)
    token = env.get(TOKEN_ENV, "").strip()  # a secret mounted from a file ends with a newline
    if token:
        header, said = f"Bearer {token}", f"a bearer token ({TOKEN_ENV})"
    else:
        import netrc

        path = os.path.join(os.path.expanduser("~"), ".netrc")
        try:
            hosts = netrc.netrc().hosts
        except FileNotFoundError:
            return None, f"none ({TOKEN_ENV} unset, no ~/.netrc)", False
        except OSError as exc:
            return None, f"none ({TOKEN_ENV} unset, {path} cannot be read: {exc.strerror or type(exc).__name__})", False
        except netrc.NetrcParseError as exc:  # its message may quote the file: a password
            why = ("readable by others, which the standard library refuses" if "permissive" in str(exc)
                   else f"does not parse at line {exc.lineno}")
            return None, f"none ({TOKEN_ENV} unset, {path} {why})", False
        found = hosts.get(host) if host != "default" else None
        if not found:
            also = "; its default entry is never sent" if "default" in hosts else ""
            return None, f"none ({TOKEN_ENV} unset, no machine {host} entry in {path}{also})", False
        import base64

        login, _account, password = found
        header = "Basic " + base64.b64encode(f"{login}:{password or ''}".encode()).decode()
        said = f"basic, from the machine {host} entry of {path}"
    exposed = host if not loopback(host) else hop if hop is not None and not loopback(hop) else None
    if scheme == "http" and exposed is not None and not over_http:
        return None, f"{said}: not sent, it would cross the network in clear to {exposed} (http://)", True
    return header, said, False


def credentials_source(url: str, env: Any = os.environ, over_http: bool = False) -> str:
    """Where the credentials for ``url`` come from, for ``status`` (never their value)."""
    return credentials(url, env, over_http)[1]


def withheld_note(url: str, said: str) -> str:
    """The one warning for credentials not sent over plain ``http://`` (``credentials``)."""
    host = origin(url)[1]
    return (f"the credentials for {url} ({said.rsplit(': not sent', 1)[0]}) are not sent: over http:// they would cross the "
            f"network in clear to {host}, which is not this machine; the level is used without them; fix: use "
            "https://, or set shared_credentials_over_http = true where the network is private")


def _body(response: Any, most: int, progress: Progress | None) -> bytes:
    """At most ``most`` bytes of a response's body, by the parts the socket gives (``read1``), each
    told to ``progress``, which raises where its caller stopped waiting."""
    chunks, have = [], 0
    while have < most:
        chunk = response.read1(min(most - have, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        have += len(chunk)
        if progress is not None:
            progress.got(len(chunk))
    if response.length == 0 and not response.isclosed():
        response.read()  # (read1 leaves a body read to its end open: this closes it, so it is kept)
    return b"".join(chunks)


class HttpCache:
    """``http://`` and ``https://``: an object store (ranged reads, whole-object writes, packs read as
    a stream), like a bucket, through one small pool of keep-alive connections."""

    lists = True  # (``port.Backend``)
    sealed = True  # the package writes every entry here with its seal (stock JAX cannot write here)

    said = "the HTTP cache"  # in messages
    cafile: str | None = None  # the certificates https is checked against (None: the system's, or SSL_CERT_FILE)

    @classmethod
    def opened(cls, url: str, jax_version: str, env: Any, *, team: bool, over_http: bool) -> HttpCache:
        """``schemes``' factory: the cache's version URL."""
        return cls(f"{url.rstrip('/')}/{version_name(jax_version)}", env, over_http)

    def __init__(self, version_url: str, env: Any = os.environ, over_http: bool = False, signed: bool = False) -> None:
        from gkx_autocache._backends import proxies

        self.where = version_url.rstrip("/")
        self.base = self.where  # what requests go to (a bucket's differs from its s3:// name: ``s3.py``)
        self._env = env
        self._found: dict[str, str] | None = None  # the proxy settings, read at the first connection
        self._auth: str | None = None
        self.credentials, self.withheld = "", False
        if not signed:  # (a bucket signs each request: ``s3.py``)
            try:  # (the environment's alone: on macOS the system's are read at the first request, not here)
                named = proxies.settings(env, system=False)
                first = proxies.proxy_for(version_url, named) if named else None
            except proxies.Unsupported:  # said at the first request, which it fails
                first = None
            hop = first.host if first is not None and first.scheme == "http" else None
            self._auth, self.credentials, self.withheld = credentials(version_url, env, over_http, hop)
        self._idle: list[Any] = []
        self._lock = threading.Lock()

    def forget(self) -> None:
        """After ``fork``: the parent's connections are its own (this process's copies are closed:
        the parent's stay open)."""
        for connection in self._idle:
            connection.close()
        self._idle = []
        self._lock = threading.Lock()

    def streams(self) -> bool:
        return True

    def prepare(self, progress: Progress, create: bool = True) -> bool:
        return True  # whether the server takes writes is known at the first upload

    # -- requests ------------------------------------------------------------------------------------

    def _connection(self, url: str) -> tuple[Any, bool]:
        """A connection to ``url``'s origin, and whether it was kept from an earlier request (only
        the cache's own origin's are kept: ``_done``). Through the proxy the environment names for
        it (``proxies``): an https origin by a tunnel (``CONNECT``: the request stays encrypted end
        to end), an http one by asking the proxy for the whole URL."""
        import http.client

        from gkx_autocache._backends import proxies

        scheme, host, port = target = origin(url)
        if target == origin(self.base):
            with self._lock:
                if self._idle:
                    return self._idle.pop(), True
        if self._found is None:
            self._found = proxies.settings(self._env)
        proxy = proxies.proxy_for(url, self._found) if self._found else None
        connection: Any
        if scheme == "https":
            import ssl

            context = ssl.create_default_context(cafile=self.cafile)
            if proxy is None:
                connection = http.client.HTTPSConnection(host, port, context=context)
            else:
                connection = http.client.HTTPSConnection(proxy.host, proxy.port, context=context)
                connection.set_tunnel(host, port, headers=proxy.headers())
        elif proxy is not None and proxy.scheme == "https":
            import ssl

            context = ssl.create_default_context(cafile=self.cafile)
            connection = http.client.HTTPSConnection(proxy.host, proxy.port, context=context)
        else:
            connection = http.client.HTTPConnection(*((proxy.host, proxy.port) if proxy else (host, port)))
        connection.gkx_origin = target  # what it reaches, whatever it connects to (a proxy)
        connection.gkx_proxy = proxy if scheme == "http" else None  # asked for whole URLs
        return connection, False

    def _done(self, connection: Any, response: Any) -> None:
        """After a response: its connection serves the next request only where its body was read to
        the end (unread bytes would be read as the next response) and it is the cache's own origin's
        (a redirect's elsewhere never gets the next request, nor its credentials)."""

        whole = response.isclosed()  # http.client closes a response once its body is all read
        response.close()
        ours = getattr(connection, "gkx_origin", None) == origin(self.base)
        if not whole or not ours or response.will_close or connection.sock is None:
            connection.close()
            return
        with self._lock:
            if len(self._idle) < POOL:
                self._idle.append(connection)
                return
        connection.close()

    def _send(self, url: str, method: str, headers: dict[str, str], body: bytes | None) -> tuple[Any, Any]:
        """One request and its response's headers. A kept connection the server has closed since
        (nginx closes idle ones after 75 s), or one reset before its answer, is tried once more on
        a new one (every request here is idempotent: whole objects); a header the request cannot
        hold is named, never shown (a token with a newline in it)."""
        import http.client

        parts = urlsplit(url)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        for attempt in range(2):
            connection, kept = self._connection(url) if attempt == 0 else (self._fresh(url), False)
            proxy = connection.gkx_proxy
            try:
                if proxy is not None:  # an http origin through a proxy: the whole URL, asked of the proxy
                    connection.request(method, f"{parts.scheme}://{parts.netloc}{path}", body=body,
                                       headers={**headers, **proxy.headers()})
                else:
                    connection.request(method, path, body=body, headers=headers)
                return connection, connection.getresponse()
            except ConnectionRefusedError as exc:  # named with its endpoint (``calls.describe``)
                connection.close()
                raise EndpointRefused(exc, f"{parts.scheme}://{parts.netloc}") from exc
            except ValueError as exc:  # http.client's "Invalid header value b'...'" would print the credentials
                connection.close()
                if isinstance(exc, OSError):  # a certificate that does not verify (ssl's error is both)
                    raise
                if "header" not in str(exc).lower():  # a URL http.client or the IDNA codec refuses
                    raise OSError(f"{url}: not a URL this client can ask ({type(exc).__name__})") from None
                raise OSError(f"{url}: a request header is not valid (a credential with a newline or another "
                              "control character? it is not shown)") from None
            except (http.client.RemoteDisconnected, http.client.BadStatusLine, ConnectionResetError,
                    BrokenPipeError):
                # A kept connection the server closed since, or a connection reset on its way (a
                # proxy, a load balancer): asked once more on a new one, as botocore does.
                connection.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _fresh(self, url: str) -> Any:
        with self._lock:
            kept, self._idle = self._idle, []
        for connection in kept:  # kept as long as the one that failed: as likely closed
            connection.close()
        return self._connection(url)[0]

    def _request(self, method: str, name: str, headers: dict[str, str] | None = None,
                 body: bytes | None = None) -> tuple[Any, Any, str]:
        """``(connection, response, the URL that answered)`` for ``method`` of ``name`` under the
        version URL, the headers read. A read follows redirects, the credentials only while they stay on the cache's origin,
        never from https to http; an upload follows none."""
        url = f"{self.base}/{name}"
        for _hop in range(REDIRECTS + 1):
            sent = dict(headers or {})
            if self._auth is not None and origin(url) == origin(self.base):
                sent["Authorization"] = self._auth
            connection, response = self._send(url, method, sent, body)
            if response.status not in (301, 302, 303, 307, 308) or method not in ("GET", "HEAD"):
                return connection, response, url
            location = urljoin(url, response.getheader("Location") or "")
            response.read(64 << 10)
            self._done(connection, response)
            if origin(url)[0] == "https" and origin(location)[0] != "https":
                raise HttpError(response.status, f"{response.reason} to {origin(location)[0]}:// (from https: not "
                                                  "followed)", url)
            url = location
        raise HttpError(response.status, f"{response.reason} (more than {REDIRECTS} redirects: not followed)", url)

    def _read(self, name: str, start: int, end: int, progress: Progress | None = None) -> bytes | None:
        """Bytes ``start`` to ``end`` of an object, None when it is not there; never more than asked
        for is held (an endpoint that ignores ``Range`` raises RangeIgnored; a 206 that is not the
        range asked, EntryRefused), as a bucket's ``_read_range``. The body is read as it comes,
        each part told to ``progress`` (a metered read's rate and bound). A connection reset in the
        body is read again once, on a new connection."""
        import http.client

        try:
            return self._read_once(name, start, end, progress)
        except (ConnectionResetError, http.client.IncompleteRead):
            return self._read_once(name, start, end, progress)

    def _read_once(self, name: str, start: int, end: int, progress: Progress | None) -> bytes | None:
        connection, response, url = self._request("GET", name, {"Range": f"bytes={start}-{end - 1}"})
        try:
            if response.status == 404:
                response.read(64 << 10)
                self._done(connection, response)
                return None
            if response.status not in (200, 206):
                raise self._error(response, url)
            asked = end - start
            ranged = response.status == 206
            length = response.length
            if not ranged and (start > 0 or (length is not None and length > asked)):
                raise RangeIgnored(f"{self.said} ignores Range: it answered a read of {human_bytes(asked)} of "
                                   f"{name} with the whole object"
                                   f"{f' ({human_bytes(length)})' if length is not None else ''}")
            data = _body(response, asked + 1, progress)
            if len(data) > asked:
                raise Refused(f"the shared entry sent more than the {asked} bytes of its range")
            if ranged and (why := wrong_range(str(response.getheader("Content-Range")), start, end, len(data))):
                raise Refused(f"the shared entry sent {why}")
            self._done(connection, response)
            return data
        except BaseException:
            response.close()  # (a response the server closes after holds the socket, not the connection)
            connection.close()
            raise

    def _error(self, response: Any, url: str, more: str = "") -> OSError:
        """The error a response that is not the one asked for stands for, in one line."""
        return HttpError.of(response.status, f"{response.reason}{more}", url)

    def listing(self, progress: Progress) -> dict[str, int] | str:
        """No listing: one ``HEAD`` of a name no entry has says whether the cache answers, and takes
        these credentials (a 404 or a 200; a directory's own URL is no object to ask for)."""
        connection, response, url = self._request("HEAD", PROBE)
        response.read()
        self._done(connection, response)
        if response.status not in (200, 404):
            raise self._error(response, url)
        progress.tick()
        return NO_LISTING

    def read(self, key: str, progress: Progress, admit: Callable[[bytes | None, int], tuple[int, bool]]) -> bytes | None:
        raise AssertionError("an object store's entry is read by ranges")  # first(), then block()

    def first(self, key: str, progress: Progress) -> tuple[bytes | None, bytes | None]:
        """The seal and the entry's first block, asked at once (two connections)."""
        box: dict[str, Any] = {}

        def seal() -> None:
            try:
                box["seal"] = self._read(key + SEAL_SIDECAR, 0, SEAL_LIMIT, progress)
            except BaseException as exc:
                box["error"] = exc

        other = threading.Thread(target=seal, name="gkx-autocache-shared-seal", daemon=True)
        other.start()
        entry = self._read(key + ENTRY_SUFFIX, 0, FIRST_BLOCK, progress)
        other.join()
        if "error" in box:
            raise box["error"]
        progress.tick()
        return box["seal"], entry

    def small(self, name: str, limit: int = SEAL_LIMIT) -> bytes:
        return self._read(name, 0, limit) or b""

    def block(self, key: str, start: int, end: int, progress: Progress | None = None) -> bytes:
        return self._read(key + ENTRY_SUFFIX, start, end, progress) or b""

    def size(self, key: str) -> int:
        connection, response, url = self._request("HEAD", key + ENTRY_SUFFIX)
        response.read()
        self._done(connection, response)
        if response.status != 200 or response.getheader("Content-Length") is None:
            raise self._error(response, url)
        return int(response.getheader("Content-Length") or 0)

    def compile_secs(self, key: str) -> float | None:
        return None  # carried by the seal

    def write(self, name: str, data: bytes) -> None:
        """One ``PUT`` of the whole bytes: the server stores the object whole or not at all."""
        connection, response, url = self._request("PUT", name, {"Content-Type": "application/octet-stream"}, data)
        if response.status not in (200, 201, 204):
            error = self._error(response, url, " (a redirect: an upload follows none)" if 300 <= response.status < 400 else "")
            response.close()  # (where the server closes after it, the response holds the socket)
            connection.close()
            raise error
        response.read(64 << 10)
        self._done(connection, response)

    def describe(self) -> dict[str, str]:
        """Which credentials, never their value."""
        return {"credentials": self.credentials}

    def caution(self) -> str | None:
        return withheld_note(self.where, self.credentials) if self.withheld else None

    def names(self, progress: Progress) -> list[Listed]:
        raise Failure(f"{self.where}: an HTTP cache cannot be listed")

    def remove(self, name: str) -> None:
        """One ``DELETE``; an object already gone is no error."""
        connection, response, url = self._request("DELETE", name)
        if response.status not in (200, 202, 204, 404):
            error = self._error(response, url)
            response.close()
            connection.close()
            raise error
        response.read(64 << 10)
        self._done(connection, response)

    def stream(self, name: str, timeout: float) -> Stream | None:
        """An object as it arrives (a pack); None where it is not there."""
        connection, response, url = self._request("GET", name)
        if response.status == 404:
            response.read(64 << 10)
            self._done(connection, response)
            return None
        if response.status != 200:
            error = self._error(response, url)
            response.close()
            connection.close()
            raise error
        return Stream(connection, response, timeout)


class Stream(bucket.Stream):
    """A response body read in parts, each a bounded call: a bucket's ``Stream`` (``take(n)``, and
    progress only every ``PROGRESS`` bytes, so a byte-a-second drip stalls within one timeout) over
    ``http.client``'s response instead of aiobotocore's body."""

    def __init__(self, connection: Any, response: Any, timeout: float) -> None:
        super().__init__(None, response, timeout)
        self.connection = connection
        self.response = response

    def _more(self, need: int) -> bytes:
        def read(progress: Progress) -> bytes:
            chunks, have, since = [], 0, 0
            while have < need:
                chunk = self.response.read1(min(max(need - have, self.PART), self.PROGRESS))
                if not chunk:
                    break
                chunks.append(chunk)
                have += len(chunk)
                since += len(chunk)
                if since >= self.PROGRESS:
                    progress.tick()
                    since = 0
            return b"".join(chunks)

        data: bytes = bounded(read, self.timeout)
        return data

    def close(self) -> None:
        self.response.close()  # where the server closes after each response, the response holds the socket
        self.connection.close()  # a body left unread: the connection goes with it
