"""The shared level in an S3 bucket spoken directly: an HTTP cache's requests (``http.py``: ranged
reads, whole-object ``PUT``s, packs read as a stream, through the environment's proxy) signed with
AWS Signature Version 4, and one bounded ``ListObjectsV2`` page. Its credentials, region, endpoint
and CA bundle are botocore's, resolved by botocore's own session at the first request (a profile's
keys, a role, SSO, a credential process, instance or container metadata, a web identity: with
refresh), or, where the environment holds the keys and no ``~/.aws/config`` could change a
request, read from the environment with nothing imported. What this client does not do (fsspec's
own S3 settings, FIPS or dual-stack endpoints, a profile's ``s3`` settings, other partitions, a
directory bucket or an access point) is s3fs's (``bucket.py``). A fresh machine then imports no
s3fs, aiobotocore or aiohttp: about 0.6 s and 35 MiB before the first request (issue 42).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from gkx_autocache._backends.bucket import LIST_LIMIT, Bucket
from gkx_autocache._backends.http import HttpCache, HttpError
from gkx_autocache._backends.port import Listed, Progress
from gkx_autocache._layout import version_name
from gkx_autocache._shared.calls import waiting

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
ERROR_LIMIT = 64 << 10  # an error's XML body: a few hundred bytes
LISTING_LIMIT = 4 << 20  # a page of 1000 names
ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
# settings of the environment that change how a request is made or where it goes, which this client
# does not do: s3fs's
NOT_READ_ENVS = ("AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT", "AWS_S3_USE_ARN_REGION",
                 "AWS_S3_DISABLE_MULTIREGION_ACCESS_POINTS")
FILE_LIMIT = 1 << 20  # what is read of a file of fsspec's configuration
REGION = re.compile(r"[a-z]{2}(?:-[a-z0-9]+){1,4}")  # eu-west-1, us-gov-east-1: never a host of another name
# AWS's main partition and GovCloud, whose hosts are ``amazonaws.com`` (botocore's pattern); China,
# the ISO partitions and the European sovereign cloud have domains of their own: s3fs's
MAIN_PARTITION = re.compile(r"(?:us|eu|ap|sa|ca|me|af|il|mx)-[a-z]+-\d+|us-gov-[a-z]+-\d+")
VIRTUAL_HOST = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")  # a bucket that is one DNS label: its own host
BACKOFF = (0.1, 0.4, 1.2)  # seconds before asking again after a 5xx (S3's SlowDown), each from half to 1.5 times
# botocore's names for where its credentials came from, in words for ``status``
METHODS = {"env": "the environment's keys", "shared-credentials-file": "the profile's keys in ~/.aws/credentials",
           "config-file": "the profile's keys in ~/.aws/config", "custom-process": "a credential process",
           "sso": "SSO (its cached token)", "iam-role": "instance metadata (the instance's role)",
           "container-role": "the container's role (ECS, EKS Pod Identity)", "assume-role": "an assumed role",
           "assume-role-with-web-identity": "a web identity (EKS, GitHub's OIDC)"}


class Keys:
    """What signs a request, and where it goes: static keys, or botocore's credentials (``frozen``
    on each request: refreshed before they expire, by botocore's own lock)."""

    __slots__ = ("access", "secret", "token", "region", "endpoint", "source", "cafile", "credentials")

    def __init__(self, access: str, secret: str, token: str | None, region: str, endpoint: str | None, source: str,
                 cafile: str | None = None, credentials: Any = None) -> None:
        self.access, self.secret, self.token = access, secret, token
        self.region = region
        self.endpoint = endpoint  # scheme://host[:port][/path], None for AWS's own
        self.source = source  # for ``status``: where the keys came from (never their value)
        self.cafile = cafile  # AWS_CA_BUNDLE, the profile's ca_bundle, or REQUESTS_CA_BUNDLE
        self.credentials = credentials  # botocore's, or None for static keys

    def replaced(self, **changes: Any) -> Keys:
        fields = {name: getattr(self, name) for name in self.__slots__}
        return Keys(**{**fields, **changes})

    def frozen(self) -> tuple[str, str, str | None]:
        """The access key, secret and token to sign one request with."""
        if self.credentials is None:
            return self.access, self.secret, self.token
        now = self.credentials.get_frozen_credentials()
        return now.access_key, now.secret_key, now.token or None


def route(env: Mapping[str, str], bucket: str = "") -> str | None:
    """Why s3fs serves ``bucket`` rather than this client, from the environment alone (nothing read
    beyond fsspec's configuration folder, nothing imported: this runs on ``import jax``), or None."""
    if any(k.startswith("FSSPEC_S3") for k in env) or _fsspec_config(env):
        return "fsspec has S3 settings of its own"
    if setting := next((k for k in NOT_READ_ENVS if env.get(k)), None):
        return f"{setting} is set"
    if bucket.endswith("--x-s3") or bucket.startswith("arn:"):
        return "a directory bucket or an access point"
    return None


def keys(env: Mapping[str, str] = os.environ, bucket: str = "") -> Keys | str:
    """The keys and settings for a direct client of ``bucket``, or why s3fs serves it. The
    environment's keys, where no config file could change a request, are read here with nothing
    imported; anything else is botocore's session's (``os.environ`` and the ``~/.aws`` files, as
    botocore reads them): its credentials (every provider it has, refreshed by it), region,
    endpoint and CA bundle. May fetch (a credential process, instance metadata, SSO): call it
    bounded. Never raises."""
    try:
        if (why := route(env, bucket)) is not None:
            return why
        config = env.get("AWS_CONFIG_FILE", os.path.join(env.get("HOME") or os.path.expanduser("~"), ".aws", "config"))
        if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY") and not (config and os.path.isfile(
                os.path.expandvars(os.path.expanduser(config)))):
            return _from_environment(env)
        return _from_botocore(env)
    except Exception as exc:  # never the user's run: s3fs reads what this did not
        return f"the settings could not be read here ({type(exc).__name__}: {str(exc)[:120]})"


def _from_environment(env: Mapping[str, str]) -> Keys | str:
    """Static keys, region and endpoint from the environment alone, as botocore reads them
    (``AWS_SECURITY_TOKEN`` before ``AWS_SESSION_TOKEN``; the region from ``AWS_DEFAULT_REGION``)."""
    ignore = env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").strip().lower() == "true"
    endpoint = None if ignore else next((env[k] for k in ENDPOINT_ENVS if env.get(k)), None)
    token = next((env[k] for k in ("AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN") if env.get(k)), "")
    return _checked(env["AWS_ACCESS_KEY_ID"].strip(), env["AWS_SECRET_ACCESS_KEY"].strip(), token.strip() or None,
                    env.get("AWS_DEFAULT_REGION") or "us-east-1", endpoint,
                    "the environment's keys (AWS_ACCESS_KEY_ID)",
                    env.get("AWS_CA_BUNDLE") or env.get("REQUESTS_CA_BUNDLE") or None)


def _from_botocore(env: Mapping[str, str]) -> Keys | str:
    """botocore's session decides: the profile, the credentials (any provider), the region, the
    endpoint and the CA bundle; a setting that changes a request in a way this client does not
    follow sends the level to s3fs."""
    try:
        import botocore.exceptions
        import botocore.session
        from botocore.configprovider import ConfiguredEndpointProvider
    except ImportError:
        return "botocore is not installed here (pip install 'gkx-autocache[remote]')"
    session = botocore.session.Session()
    try:
        scoped = session.get_scoped_config()
    except botocore.exceptions.ProfileNotFound as exc:
        return f"the profile {str(exc).split(' ')[-1] or '?'} is in neither ~/.aws file"
    for name in ("use_fips_endpoint", "use_dualstack_endpoint"):
        if str(session.get_config_variable(name) or "").lower() == "true":
            return f"the profile has {name}"
    if scoped.get("s3"):  # addressing_style, use_accelerate_endpoint, ...: botocore's requests differ
        return "the profile has s3 settings"
    region = session.get_config_variable("region") or "us-east-1"
    endpoint = None
    if str(session.get_config_variable("ignore_configured_endpoint_urls") or "").lower() != "true":
        endpoint = ConfiguredEndpointProvider(full_config=session.full_config, scoped_config=scoped,
                                              client_name="s3", environ=os.environ).provide()
    credentials = session.get_credentials()
    if credentials is None:
        return "botocore finds no credentials (the environment, ~/.aws, SSO, a credential process, metadata)"
    profile = session.profile or env.get("AWS_DEFAULT_PROFILE") or env.get("AWS_PROFILE")
    source = METHODS.get(credentials.method, f"botocore's {credentials.method}")
    source += f" (the profile {profile!r})" if profile and credentials.method != "env" else ""
    return _checked("", "", None, region, endpoint, f"{source}, resolved by botocore",
                    session.get_config_variable("ca_bundle") or env.get("REQUESTS_CA_BUNDLE") or None, credentials)


def _checked(access: str, secret: str, token: str | None, region: str, endpoint: str | None, source: str,
             cafile: str | None, credentials: Any = None) -> Keys | str:
    origin = _origin(endpoint) if endpoint else None
    if endpoint and origin is None:
        return f"the endpoint {endpoint!r} is not a plain http(s) URL of a host"
    if origin is None and not MAIN_PARTITION.fullmatch(region):
        return f"the region {region!r} is outside AWS's main partition"
    return Keys(access, secret, token, region, origin, source, cafile, credentials)


def _origin(endpoint: str) -> str | None:
    """``scheme://host[:port][/path]`` as botocore sends it (the host in lower case, a default
    port left out: what the ``Host`` header and the signature carry), or None for no plain http(s)
    URL of a host (a path only of unreserved characters)."""
    try:
        parts = urlsplit(endpoint.strip())
        scheme, port, host = parts.scheme.lower(), parts.port, parts.hostname
    except ValueError:  # an unclosed IPv6 bracket, a port that is no number, NFKC's refusals
        return None
    if (scheme not in ("http", "https") or not host or parts.username or parts.query or parts.fragment
            or not re.fullmatch(r"[A-Za-z0-9._~/-]*", parts.path) or not re.fullmatch(r"[A-Za-z0-9.:-]+", host)):
        return None
    host = f"[{host.lower()}]" if ":" in host else host.lower()
    default = 443 if scheme == "https" else 80
    return f"{scheme}://{host}{f':{port}' if port not in (None, default) else ''}{parts.path.rstrip('/')}"


def _fsspec_config(env: Mapping[str, str]) -> bool:
    """Whether fsspec's configuration folder says anything of S3 (s3fs would act on it)."""
    folder = env.get("FSSPEC_CONFIG_DIR") or os.path.expanduser("~/.config/fsspec")
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):  # (a FIFO would hang the read)
            continue
        try:
            with open(path, "rb") as f:
                if b"s3" in f.read(FILE_LIMIT):
                    return True
        except OSError:
            continue
    return False


class Deferred:
    """``s3://``, its client chosen at the first request (the level's first call, bounded): this
    package's own (``S3``) where ``keys`` resolves, else s3fs's (``Bucket``). Nothing is read or
    imported before: a run of local hits never resolves a credential (SPEC §14: a run that needs no
    request costs what a run without a shared level costs)."""

    lists = True  # (``port.Backend``)
    sealed = False  # stock JAX writes entries here without a seal (a ``dir = s3://`` user)
    said = "the bucket's endpoint"

    def __init__(self, version_url: str, env: Mapping[str, str] = os.environ) -> None:
        self.where = version_url
        self._env = env
        self._chosen: S3 | Bucket | None = None
        self.why: str | None = None  # why s3fs serves it, once chosen
        self._choosing = threading.Lock()

    @classmethod
    def opened(cls, url: str, jax_version: str, env: Mapping[str, str], *, team: bool,
               over_http: bool) -> Deferred | Bucket:
        """``schemes``' factory: this package's client or s3fs, chosen at the first request; s3fs at
        once where the environment alone says so (``route``)."""
        version_url = f"{url.rstrip('/')}/{version_name(jax_version)}"
        why = route(env, url[len("s3://"):].split("/", 1)[0])
        return cls(version_url, env) if why is None else Bucket(version_url, said=f"s3fs's own ({why})")

    def chosen(self) -> S3 | Bucket:
        with self._choosing:
            if self._chosen is None:
                found = keys(self._env, self.where[len("s3://"):].split("/", 1)[0])
                if isinstance(found, str):
                    self.why, self._chosen = found, Bucket(self.where)
                else:
                    self._chosen = S3(self.where, found, self._env)
            return self._chosen

    @property
    def credentials(self) -> str:
        """Which client, and whose credentials (never their value), for ``status``."""
        chosen = self.chosen()
        return (f"s3fs's own ({self.why})" if isinstance(chosen, Bucket) else
                f"{chosen.keys.source}, signed here (no client library)")

    def describe(self) -> dict[str, str]:
        return {"credentials": self.credentials}

    def caution(self) -> str | None:
        return None  # (each request is signed: no credential is sent as it is)

    def forget(self) -> None:
        self._choosing = threading.Lock()
        if self._chosen is not None:
            self._chosen.forget()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.chosen(), name)


class S3(HttpCache):
    """``s3://bucket/prefix``, through ``http.py``'s pool of keep-alive connections: AWS's own
    endpoint by its virtual host (``bucket.s3.region.amazonaws.com``), another (MinIO, moto, R2)
    by path (``endpoint/bucket/...``)."""

    said = "the bucket's endpoint"
    sealed = False  # stock JAX writes entries here without a seal (a ``dir = s3://`` user)

    def __init__(self, version_url: str, found: Keys, env: Mapping[str, str] = os.environ) -> None:
        super().__init__(version_url, env, signed=True)  # no bearer token or ~/.netrc entry: each request is signed
        self._keys = self.keys = found
        self.bucket, _, self.prefix = version_url[len("s3://"):].rstrip("/").partition("/")
        self._aim(found.region)

    @property
    def region(self) -> str:
        return self.aimed[0]

    @property
    def root(self) -> str:
        return self.aimed[1]

    @property
    def cafile(self) -> str | None:  # type: ignore[override]
        """Read at the first https connection, not on ``import jax`` (certifi's import: 7.5 ms)."""
        return self._keys.cafile or _certifi()

    def _aim(self, region: str) -> None:
        """Where requests go, for the region as it is now known: ``(region, root, base)`` set at
        once (the prefetch's threads read them together)."""
        if self._keys.endpoint is not None:
            root = f"{self._keys.endpoint}/{quote(self.bucket)}"
        elif VIRTUAL_HOST.fullmatch(self.bucket):  # one DNS label (the certificate covers one): its own host
            root = f"https://{self.bucket}.s3.{region}.amazonaws.com"
        else:
            root = f"https://s3.{region}.amazonaws.com/{quote(self.bucket)}"
        self.aimed = (region, root, f"{root}/{quote(self.prefix)}" if self.prefix else root)
        self.base = self.aimed[2]  # (``http.py``'s name for where requests go)
        with self._lock:  # another host: a kept connection would carry the request elsewhere
            kept, self._idle = self._idle, []
        for connection in kept:
            connection.close()

    def _request(self, method: str, name: str, headers: dict[str, str] | None = None,
                 body: bytes | None = None, query: str = "") -> tuple[Any, Any, str]:
        """``method`` of ``name`` under the version prefix (``query`` of the bucket itself), signed;
        no redirect followed. A bucket in another region than the one configured says so
        (``x-amz-bucket-region``): the request is made once more there."""
        moved_once, retries = False, 0
        while True:
            region, root, base = self.aimed
            url = f"{root}{'' if urlsplit(root).path else '/'}?{query}" if query else f"{base}/{quote(name)}"
            sent = sign(method, url, dict(headers or {}), body, self._keys, region)
            connection, response = self._send(url, method, sent, body)
            moved = response.getheader("x-amz-bucket-region") or ""
            if (response.status in (301, 307, 400) and moved != region and not moved_once
                    and (MAIN_PARTITION if self._keys.endpoint is None else REGION).fullmatch(moved)):
                moved_once = True
                self._aim(moved)
            elif response.status in (500, 502, 503, 504) and retries < len(BACKOFF):
                # S3 asks to be asked again (SlowDown), as botocore does: after a backoff with
                # jitter (8 prefetch workers must not come back in step), which is progress
                import random  # (not on import jax: a throttled request is rare)

                response.read(ERROR_LIMIT)
                response.close()
                connection.close()
                waiting(BACKOFF[retries] * random.uniform(0.5, 1.5))
                retries += 1
                continue
            else:
                return connection, response, url
            response.read(ERROR_LIMIT)
            connection.close()

    def describe(self) -> dict[str, str]:
        return {"credentials": f"{self.keys.source}, signed here (no client library)"}

    def _error(self, response: Any, url: str, more: str = "") -> OSError:
        """S3's error in one line: its code and message from the XML body."""
        code = message = ""
        if response.status >= 400 and response.getheader("Content-Type", "").endswith("xml"):
            text = response.read(ERROR_LIMIT).decode("utf-8", "replace")
            code, message = _tag(text, "Code"), _tag(text, "Message")
        name = unquote(url[len(self.base):].split("?")[0]) if url.startswith(self.base + "/") else ""
        return HttpError.of(response.status, f"{code or response.reason}{f' ({message})' if message else ''}{more}",
                            self.where + name, self._keys.source, too_large=code == "EntityTooLarge")

    def listing(self, progress: Progress) -> dict[str, int] | str:
        """``{name: bytes}`` directly under the version prefix from one page (``LIST_LIMIT`` names),
        or "more than …" where the page does not hold them all. Raises on errors (a bucket that
        does not exist, keys it refuses)."""
        prefix = f"{self.prefix}/" if self.prefix else ""
        query = f"delimiter=%2F&list-type=2&max-keys={LIST_LIMIT}&prefix={quote(prefix, safe='-_.~')}"
        connection, response, url = self._request("GET", "", query=query)
        if response.status != 200:
            error = self._error(response, url)
            response.close()
            connection.close()
            raise error
        text = response.read(LISTING_LIMIT + 1)
        if len(text) > LISTING_LIMIT:
            response.close()
            connection.close()
            raise HttpError(200, f"a listing longer than {LISTING_LIMIT} bytes (not read)", url)
        self._done(connection, response)
        progress.tick()
        return _names(text.decode("utf-8", "replace"), prefix)

    def names(self, progress: Progress) -> list[Listed]:
        """Every object directly under the version prefix: ``ListObjectsV2`` page after page, each a
        tick."""
        prefix = f"{self.prefix}/" if self.prefix else ""
        found: list[Listed] = []
        token = ""
        while True:
            after = f"continuation-token={quote(token, safe='')}&" if token else ""  # (names in order: signed so)
            query = f"{after}delimiter=%2F&list-type=2&max-keys={LIST_LIMIT}&prefix={quote(prefix, safe='-_.~')}"
            connection, response, url = self._request("GET", "", query=query)
            if response.status != 200:
                error = self._error(response, url)
                response.close()
                connection.close()
                raise error
            text = response.read(LISTING_LIMIT + 1).decode("utf-8", "replace")
            self._done(connection, response)
            progress.tick()
            found += _page(text, prefix)
            token = _tag(text, "NextContinuationToken") if re.search(r"<IsTruncated>\s*true", text) else ""
            if not token:
                return found


def _certifi() -> str | None:
    """certifi's bundle where it is installed: the certificates botocore, and so s3fs, trust."""
    try:
        import certifi
    except ImportError:
        return None
    where: str = certifi.where()
    return where


def _tag(text: str, name: str) -> str:
    found = re.search(rf"<{name}>([^<]{{0,300}})</{name}>", text)
    return " ".join(found[1].split()) if found else ""


def _names(text: str, prefix: str) -> dict[str, int] | str:
    """A ``ListObjectsV2`` page's objects directly under ``prefix``, by name, with their sizes; or
    why the page is not the whole listing."""
    import html

    if "<ListBucketResult" not in text:
        raise HttpError(200, "an answer that is not a listing", prefix or "/")
    if re.search(r"<IsTruncated>\s*true\s*</IsTruncated>", text):
        return f"more than {LIST_LIMIT}"
    names: dict[str, int] = {}
    for block in re.findall(r"<Contents>(.*?)</Contents>", text, re.S):
        key = re.search(r"<Key>([^<]{1,3100})</Key>", block)  # S3's keys: 1024 bytes, escaped; whitespace kept
        size = re.search(r"<Size>\s*([0-9]{1,15})\s*</Size>", block)
        full = html.unescape(key[1]) if key else ""
        name = full[len(prefix):] if full.startswith(prefix) else ""
        if name and "/" not in name:
            names[name] = int(size[1]) if size else 0
    return names


def _page(text: str, prefix: str) -> list[Listed]:
    """A ``ListObjectsV2`` page's objects directly under ``prefix``: name, size, last write."""
    import html
    from datetime import datetime

    if "<ListBucketResult" not in text:
        raise HttpError(200, "an answer that is not a listing", prefix or "/")
    found: list[Listed] = []
    for block in re.findall(r"<Contents>(.*?)</Contents>", text, re.S):
        key = re.search(r"<Key>([^<]{1,3100})</Key>", block)
        full = html.unescape(key[1]) if key else ""
        name = full[len(prefix):] if full.startswith(prefix) else ""
        if not name or "/" in name:
            continue
        size, stamp = _tag(block, "Size"), _tag(block, "LastModified")
        try:
            written = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else 0.0
        except ValueError:
            written = 0.0
        found.append((name, int(size) if size.isdigit() else 0, written))
    return found


def sign(method: str, url: str, headers: dict[str, str], body: bytes | None, found: Keys, region: str,
         now: float | None = None) -> dict[str, str]:
    """``headers`` with AWS Signature Version 4's (``Authorization``, ``x-amz-date``,
    ``x-amz-content-sha256``, the session token). ``url``'s path and query are as they will be
    sent: already quoted, the query's names in order."""
    access, secret, token = found.frozen()
    parts = urlsplit(url)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    payload = hashlib.sha256(body).hexdigest() if body else EMPTY_SHA256
    signed = {"host": parts.netloc, "x-amz-content-sha256": payload, "x-amz-date": stamp}
    if token:
        signed["x-amz-security-token"] = token
    names = ";".join(sorted(signed))
    canonical = "\n".join([method, parts.path or "/", parts.query,
                           "".join(f"{k}:{signed[k]}\n" for k in sorted(signed)), names, payload])
    scope = f"{stamp[:8]}/{region}/s3/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    key = f"AWS4{secret}".encode()
    for part in (stamp[:8], region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out = {**headers, **{"Host" if k == "host" else k: v for k, v in signed.items()}}  # sent as signed
    out["Authorization"] = f"AWS4-HMAC-SHA256 Credential={access}/{scope}, SignedHeaders={names}, Signature={signature}"
    return out
