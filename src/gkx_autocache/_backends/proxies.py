"""Which forward proxy a request of the shared level goes through (SPEC §14, amended 2026-12-06):
``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY`` and ``NO_PROXY``, in either case, the lower case
first, as the standard library, curl, requests and botocore read them (``HTTP_PROXY`` is not read
where ``REQUEST_METHOD`` says the process is a CGI script: "httpoxy"); on macOS and Windows, where
the environment names none, the system's own settings. ``NO_PROXY``: hosts, domain suffixes
(``.corp`` or ``corp``), ``host:port``, IP addresses and CIDR blocks (``10.0.0.0/8``, as requests
and curl take them), ``*`` for all.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit


class Unsupported(OSError):
    """A proxy this transport cannot speak through (SOCKS, TLS to the proxy for an https target)."""


class Proxy:
    """Where requests for one origin go instead, and the ``Proxy-Authorization`` they carry."""

    __slots__ = ("scheme", "host", "port", "authorization", "shown")

    def __init__(self, scheme: str, host: str, port: int, authorization: str | None, shown: str) -> None:
        self.scheme, self.host, self.port, self.authorization, self.shown = scheme, host, port, authorization, shown

    def headers(self) -> dict[str, str]:
        return {"Proxy-Authorization": self.authorization} if self.authorization else {}


def settings(env: Mapping[str, str] = os.environ, system: bool = True) -> dict[str, str]:
    """``{"https": url, "http": url, "all": url, "no": hosts}`` from the environment: upper case,
    then lower case over it (the standard library's order); on macOS and Windows (``system``) the
    system's where the environment names none."""
    found: dict[str, str] = {}
    for lower in (False, True):
        for name, value in env.items():
            if name.endswith(("_proxy", "_PROXY")) and (name.islower() if lower else not name.islower()) and value:
                found[name[:-len("_proxy")].lower()] = value.strip()
    if "REQUEST_METHOD" in env:  # a CGI script: a request's Proxy header arrives as HTTP_PROXY (httpoxy)
        found.pop("http", None)
    if system and not {"http", "https", "all"} & set(found) and sys.platform in ("darwin", "win32"):
        import urllib.request

        found.update({k: v for k, v in urllib.request.getproxies().items() if k in ("http", "https", "no")})
    return found


def proxy_for(url: str, found: Mapping[str, str]) -> Proxy | None:
    """The proxy a request of ``url`` goes through (``found``: ``settings``), or None for a direct
    connection. Raises Unsupported for a proxy this transport cannot use."""
    parts = urlsplit(url)
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    port = parts.port or (443 if scheme == "https" else 80)
    chosen = found.get(scheme) or found.get("all")
    if not chosen or bypassed(host, port, found.get("no", "")):
        return None
    return parse(chosen, scheme)


def parse(value: str, for_scheme: str) -> Proxy:
    """A proxy URL (``http://user:pass@proxy:3128``; without a scheme, ``http://``), as a Proxy."""
    text = value if "://" in value else f"http://{value}"
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = None
        scheme = "bad"
    shown = f"{scheme}://{parts.hostname or ''}{f':{port}' if port else ''}"  # never its password
    if scheme not in ("http", "https") or not parts.hostname:
        raise Unsupported(f"the proxy {shown} is not one this transport speaks through (an http:// or https:// "
                          "forward proxy; SOCKS is not)")
    if scheme == "https" and for_scheme == "https":
        raise Unsupported(f"the proxy {shown} is reached over TLS, and an https:// request through it would be TLS "
                          "inside TLS, which this transport does not do: give the proxy as http://host:port (CONNECT "
                          "keeps the request encrypted end to end)")
    authorization = None
    if parts.username is not None:
        import base64

        login = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(login.encode()).decode()
    return Proxy(scheme, parts.hostname.lower(), port or (443 if scheme == "https" else 80), authorization, shown)


def bypassed(host: str, port: int, no_proxy: str) -> bool:
    """Whether ``NO_PROXY`` sends ``host:port`` direct."""
    entries = [e.strip().lower() for e in no_proxy.replace(" ", ",").split(",") if e.strip()]
    if "*" in entries:
        return True
    if not entries:
        return False
    import ipaddress

    try:
        address: Any = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in entries:
        name, only = entry, None
        if entry.startswith("["):  # [::1] or [::1]:8080
            name, _, rest = entry[1:].partition("]")
            only = rest[1:] if rest.startswith(":") else None
        elif entry.count(":") == 1:  # host:port (an IPv6 address has more colons)
            name, only = entry.split(":")
        if only is not None and only != str(port):
            continue
        if address is not None:
            try:
                if address in ipaddress.ip_network(name, strict=False):
                    return True
                continue
            except ValueError:
                pass  # a name: compared as text below
        name = name.lstrip(".")
        if name and (host == name or host.endswith("." + name)):
            return True
    return False
