"""The shared level in Azure Blob Storage (``az://container/prefix``): an HTTP cache's requests
(``http.py``: ranged reads, whole-blob ``PUT``s, packs read as a stream, through the environment's
proxy) on the Blob service's REST API, and one bounded List Blobs page (XML, ``NextMarker``). No
client library: a fresh machine imports none.

The account and its credentials are the environment's, as Azure's tools name them:
``AZURE_STORAGE_CONNECTION_STRING`` (its ``AccountKey`` or ``SharedAccessSignature``, its
``BlobEndpoint``; Azurite's ``UseDevelopmentStorage=true``), else ``AZURE_STORAGE_ACCOUNT`` with
``AZURE_STORAGE_KEY`` (Shared Key: each request signed here) or ``AZURE_STORAGE_SAS_TOKEN``, else a
bearer token from ``azure-identity``'s ``DefaultAzureCredential`` where that is installed, else none
(a public container's reads). A SAS or a bearer token is never sent over plain ``http://`` to a
machine that is not this one unless asked (``shared_credentials_over_http``); none is ever printed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import threading
import time
from collections.abc import Mapping
from email.utils import formatdate
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from gkx_autocache._backends import proxies
from gkx_autocache._backends.bucket import LIST_LIMIT
from gkx_autocache._backends.http import BodyTooLarge, HttpCache, HttpError, loopback, origin
from gkx_autocache._backends.port import Failure, Listed, Progress
from gkx_autocache._layout import version_name
from gkx_autocache._shared.calls import waiting

VERSION = "2023-11-03"  # the Blob service's API version asked for: Put Blob takes up to 5000 MiB
SCOPE = "https://storage.azure.com/.default"  # what a bearer token is asked for
ERROR_LIMIT = 64 << 10
LISTING_LIMIT = 4 << 20  # a page of 1000 names
BACKOFF = (0.1, 0.4, 1.2)  # after a 500 or 503 (ServerBusy), each from half to 1.5 times, as the SDK retries
# Azurite's development account (its documented key: the emulator's, no secret)
DEVELOPMENT = ("devstoreaccount1", "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==",
               "http://127.0.0.1:10000/devstoreaccount1")


class Account:
    """Where requests go and how they are authorized: ``how`` is ``key`` (Shared Key, ``secret`` the
    account key), ``sas`` (``secret`` the token's query), ``bearer`` (``DefaultAzureCredential``) or
    ``none``; ``source`` says where they came from (never their value); ``problem``, why there is no
    account to use (said at the first request)."""

    __slots__ = ("name", "endpoint", "how", "secret", "source", "problem")

    def __init__(self, name: str, endpoint: str, how: str, secret: str, source: str, problem: str | None = None) -> None:
        self.name, self.endpoint, self.how, self.secret, self.source, self.problem = (
            name, endpoint.rstrip("/"), how, secret, source, problem)


def account(env: Mapping[str, str]) -> Account:
    """The account, endpoint and credentials, from the environment alone (nothing imported)."""
    said = "AZURE_STORAGE_CONNECTION_STRING"
    if text := env.get(said, "").strip():
        fields = {k.strip().lower(): v.strip() for k, _, v in (p.partition("=") for p in text.split(";")) if k.strip()}
        if fields.get("usedevelopmentstorage", "").lower() == "true":
            name, key, endpoint = DEVELOPMENT
            return Account(name, endpoint, "key", key, f"the account key of Azurite's development account ({said})")
        name = fields.get("accountname", "")
        suffix = fields.get("endpointsuffix", "core.windows.net")
        endpoint = fields.get("blobendpoint") or (
            f"{fields.get('defaultendpointsprotocol', 'https')}://{name}.blob.{suffix}" if name else "")
        if not endpoint:
            return Account("", "", "none", "", said, f"{said} names neither an AccountName nor a BlobEndpoint")
        if not name:  # the account is the endpoint's first path segment (Azurite's), or its host's first label
            parts = urlsplit(endpoint)
            name = parts.path.strip("/").split("/")[0] or (parts.hostname or "").split(".")[0]
        if fields.get("accountkey"):
            return Account(name, endpoint, "key", fields["accountkey"], f"the account key of {name} ({said})")
        if fields.get("sharedaccesssignature"):
            return _sas(name, endpoint, fields["sharedaccesssignature"], f"a SAS token ({said})")
        return _identity(name, endpoint, f"{said}, which holds no key")
    name = env.get("AZURE_STORAGE_ACCOUNT", "").strip() or env.get("AZURE_STORAGE_ACCOUNT_NAME", "").strip()
    if not name:
        return Account("", "", "none", "", "none", "no storage account is named: set AZURE_STORAGE_CONNECTION_STRING, "
                                                   "or AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or "
                                                   "AZURE_STORAGE_SAS_TOKEN")
    endpoint = f"https://{name}.blob.core.windows.net"
    for variable in ("AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY"):
        if key := env.get(variable, "").strip():
            return Account(name, endpoint, "key", key, f"the account key of {name} ({variable})")
    if token := env.get("AZURE_STORAGE_SAS_TOKEN", "").strip():
        return _sas(name, endpoint, token, "a SAS token (AZURE_STORAGE_SAS_TOKEN)")
    return _identity(name, endpoint, "neither AZURE_STORAGE_KEY nor AZURE_STORAGE_SAS_TOKEN is set")


def _sas(name: str, endpoint: str, token: str, source: str) -> Account:
    token = token.lstrip("?")
    # (never a character that would make a URL http.client refuses, and print it in its error)
    if not re.fullmatch(r"[A-Za-z0-9%&=._~+/:,-]+", token):
        return Account(name, endpoint, "sas", "", source, f"{source} holds characters a URL's query cannot carry")
    return Account(name, endpoint, "sas", token, source)


def _identity(name: str, endpoint: str, why: str) -> Account:
    import importlib.util

    try:
        installed = importlib.util.find_spec("azure.identity") is not None
    except (ModuleNotFoundError, ValueError):  # (no ``azure`` namespace at all; a module without its spec)
        installed = False
    if installed:
        return Account(name, endpoint, "bearer", "", "a bearer token from DefaultAzureCredential (azure-identity)")
    return Account(name, endpoint, "none", "", f"none ({why}, and azure-identity is not installed): a public "
                                               "container's reads only")


class BlobTooLarge(BodyTooLarge):
    """A blob the service refused for its size (``RequestBodyTooLarge``): that entry only."""

    fix = ("Azure takes at most 5000 MiB in one Put Blob; where a proxy or gateway in front of it refused the body, "
           "raise its limit on a request's body")


class Azure(HttpCache):
    """``az://container/prefix``, through ``http.py``'s pool of keep-alive connections: the account's
    endpoint by its own host (``account.blob.core.windows.net``), or a ``BlobEndpoint`` (Azurite's
    ``http://127.0.0.1:10000/devstoreaccount1``) by path."""

    said = "the storage account's endpoint"
    sealed = True  # only this package writes entries there (JAX's own cache cannot have an az:// dir)

    def __init__(self, version_url: str, found: Account, env: Mapping[str, str] = os.environ,
                 over_http: bool = False) -> None:
        super().__init__(version_url, env, signed=True)  # no bearer token or ~/.netrc entry: authorized here
        self.account = found
        self.container, _, self.prefix = version_url.split("://", 1)[1].strip("/").partition("/")
        self.root = f"{found.endpoint}/{quote(self.container)}"
        self.base = f"{self.root}/{quote(self.prefix)}"
        self._token: tuple[str, float] | None = None  # a bearer token and when it expires
        self._identity: Any = None
        self._token_lock = threading.Lock()
        self.withheld = found.how in ("sas", "bearer") and not over_http and (hop := self._clear(env)) is not None
        self.credentials = (f"{found.source}: not sent, it would cross the network in clear to {hop} (http://)"
                            if self.withheld else found.source)

    @classmethod
    def opened(cls, url: str, jax_version: str, env: Mapping[str, str], *, team: bool, over_http: bool) -> Azure:
        """``schemes``' factory: the container's version prefix, the account from the environment."""
        return cls(f"{url.rstrip('/')}/{version_name(jax_version)}", account(env), env, over_http)

    def _clear(self, env: Mapping[str, str]) -> str | None:
        """The machine a token sent over plain ``http://`` would cross the network to, in clear (the
        endpoint, or the http:// proxy before it), or None."""
        scheme, host, _ = origin(self.account.endpoint)
        if scheme != "http":
            return None
        try:
            hop = proxies.proxy_for(self.account.endpoint, proxies.settings(env, system=False))
        except proxies.Unsupported:
            hop = None
        return host if not loopback(host) else hop.host if hop is not None and not loopback(hop.host) else None

    def describe(self) -> dict[str, str]:
        """Whose credentials (never their value); a bearer token is asked for, to say it resolves."""
        if self.account.how == "bearer" and not self.withheld:
            self._bearer()
        signed = ", signed here (no client library)" if self.account.how == "key" else ""
        return {"credentials": f"{self.credentials}{signed}" if self.account.problem is None else self.account.problem}

    def caution(self) -> str | None:
        if not self.withheld:
            return None
        return (f"the credentials for {self.where} ({self.account.source}) are not sent: over http:// they would cross "
                f"the network in clear; the level is used without them; fix: use https://, or set "
                "shared_credentials_over_http = true where the network is private")

    def _bearer(self) -> str:
        """A token from ``DefaultAzureCredential``, asked again 5 minutes before it expires."""
        with self._token_lock:
            if self._token is None or self._token[1] - time.time() < 300:
                if self._identity is None:
                    from azure.identity import DefaultAzureCredential

                    self._identity = DefaultAzureCredential()
                got = self._identity.get_token(SCOPE)
                self._token = (str(got.token), float(got.expires_on))
            return self._token[0]

    def _request(self, method: str, name: str, headers: dict[str, str] | None = None,
                 body: bytes | None = None, query: str = "") -> tuple[Any, Any, str]:
        """``method`` of the blob ``name`` under the version prefix (``query``: of the container
        itself), authorized; no redirect followed; a 500 or 503 asked again after a backoff."""
        found = self.account
        if found.problem is not None:
            raise Failure(f"{self.where}: {found.problem}")
        retries = 0
        while True:
            url = f"{self.root}?{query}" if query else f"{self.base}/{quote(name)}"
            if found.how == "sas" and not self.withheld:
                url += f"{'&' if '?' in url else '?'}{found.secret}"
            # (formatdate, not strftime: a program's LC_TIME would put its own day names in the date)
            sent = {**(headers or {}), "x-ms-version": VERSION, "x-ms-date": formatdate(usegmt=True)}
            if method == "PUT":
                sent.update({"x-ms-blob-type": "BlockBlob", "Content-Length": str(len(body or b""))})
            if found.how == "key":
                sent["Authorization"] = f"SharedKey {found.name}:{sign(method, url, sent, found.name, found.secret)}"
            elif found.how == "bearer" and not self.withheld:
                sent["Authorization"] = f"Bearer {self._bearer()}"
            connection, response = self._send(url, method, sent, body)
            if response.status not in (500, 503) or retries == len(BACKOFF):
                return connection, response, url
            import random  # (not on import jax: a throttled request is rare)

            response.read(ERROR_LIMIT)
            response.close()
            connection.close()
            waiting(BACKOFF[retries] * random.uniform(0.5, 1.5))
            retries += 1

    def _error(self, response: Any, url: str, more: str = "") -> OSError:
        """The service's error in one line: its code (a HEAD has only the header) and message; the
        blob's ``az://`` name, never the URL (a SAS token is in its query)."""
        code, message = response.getheader("x-ms-error-code") or "", ""
        if response.status >= 400 and "xml" in response.getheader("Content-Type", ""):
            text = response.read(ERROR_LIMIT).decode("utf-8", "replace")
            code, message = _tag(text, "Code") or code, _tag(text, "Message").split(" RequestId:")[0]
        path, under = urlsplit(url).path, urlsplit(self.base).path + "/"
        name = "/" + unquote(path[len(under):]) if path.startswith(under) else ""
        reason = f"{code or response.reason}{f' ({message})' if message else ''}{more}"
        if response.status == 413 or code == "RequestBodyTooLarge":
            return BlobTooLarge(response.status, reason, self.where + name, self.account.source)
        return HttpError.of(response.status, reason, self.where + name, self.account.source)

    def _page(self, marker: str) -> tuple[list[Listed], str, str]:
        """One List Blobs page of the version prefix: its blobs directly under it, the next marker,
        and the text (for "more than 1000")."""
        prefix = f"{self.prefix}/" if self.prefix else ""
        query = (f"comp=list&delimiter=%2F{f'&marker={quote(marker, safe=str())}' if marker else ''}"
                 f"&maxresults={LIST_LIMIT}&prefix={quote(prefix, safe='')}&restype=container")
        connection, response, url = self._request("GET", "", query=query)
        if response.status != 200:
            error = self._error(response, url)
            response.close()
            connection.close()
            raise error
        text = response.read(LISTING_LIMIT + 1).decode("utf-8", "replace")
        if len(text) > LISTING_LIMIT:
            response.close()
            connection.close()
            raise HttpError(200, f"a listing longer than {LISTING_LIMIT} bytes (not read)", self.where)
        self._done(connection, response)
        if "<EnumerationResults" not in text:
            raise HttpError(200, "an answer that is not a listing", self.where)
        return _blobs(text, prefix), _tag(text, "NextMarker"), text

    def listing(self, progress: Progress) -> dict[str, int] | str:
        """``{name: bytes}`` directly under the version prefix from one page, or "more than …"."""
        found, more, _ = self._page("")
        progress.tick()
        return f"more than {LIST_LIMIT}" if more else {name: size for name, size, _ in found}

    def names(self, progress: Progress) -> list[Listed]:
        """Every blob directly under the version prefix, page after page (``NextMarker``)."""
        found, marker = [], ""
        while True:
            page, marker, _ = self._page(marker)
            found += page
            progress.tick()
            if not marker:
                return found


def _tag(text: str, name: str) -> str:
    match = re.search(rf"<{name}>([^<]{{0,3000}})</{name}>", text)
    return " ".join(match[1].split()) if match else ""


def _blobs(text: str, prefix: str) -> list[Listed]:
    import html
    from email.utils import parsedate_to_datetime

    found: list[Listed] = []
    for block in re.findall(r"<Blob>(.*?)</Blob>", text, re.S):
        name = re.search(r"<Name>([^<]{1,3100})</Name>", block)
        full = html.unescape(name[1]) if name else ""
        short = full[len(prefix):] if full.startswith(prefix) else ""
        if not short or "/" in short:
            continue
        size, stamp = _tag(block, "Content-Length"), _tag(block, "Last-Modified")
        try:
            written = parsedate_to_datetime(stamp).timestamp() if stamp else 0.0
        except (TypeError, ValueError):
            written = 0.0
        found.append((short, int(size) if size.isdigit() else 0, written))
    return found


def sign(method: str, url: str, headers: Mapping[str, str], name: str, key: str) -> str:
    """Shared Key's signature of a request (the Blob service's string-to-sign, version 2009-09-19
    and later): its standard headers, its ``x-ms-`` headers in order, and the account and path with
    the query's names in order, their values decoded."""
    parts = urlsplit(url)
    sent = {k.lower(): v for k, v in headers.items()}
    standard = [sent.get(h, "") for h in ("content-encoding", "content-language", "content-length", "content-md5",
                                          "content-type", "date", "if-modified-since", "if-match", "if-none-match",
                                          "if-unmodified-since", "range")]
    if standard[2] == "0":  # (an empty body's length is signed as nothing)
        standard[2] = ""
    ms = "".join(f"{k}:{' '.join(v.split())}\n" for k, v in sorted(sent.items()) if k.startswith("x-ms-"))
    values: dict[str, list[str]] = {}
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        values.setdefault(k.lower(), []).append(v)
    resource = f"/{name}{parts.path or '/'}" + "".join(f"\n{k}:{','.join(sorted(v))}" for k, v in sorted(values.items()))
    to_sign = "\n".join([method, *standard]) + "\n" + ms + resource
    try:
        secret = base64.b64decode(key, validate=True)
    except ValueError:
        raise Failure("the account key is not base64 (as the portal shows it): check AZURE_STORAGE_KEY or the "
                      "connection string's AccountKey") from None
    return base64.b64encode(hmac.new(secret, to_sign.encode(), hashlib.sha256).digest()).decode()
