"""The shared level in an S3 bucket spoken directly: an HTTP cache's requests (``http.py``: ranged
reads, whole-object ``PUT``s, packs read as a stream) signed with AWS Signature Version 4, and one
bounded ``ListObjectsV2`` page. It serves where the credentials are static keys (the environment's,
or a profile's in ``~/.aws``) and every setting that could change a request is one it reads; anything
else (a role, SSO, a credential process, instance metadata, a proxy, fsspec's own S3 settings) is
s3fs's (``bucket.py``), as before. A fresh machine then imports no client library: s3fs, aiobotocore
and botocore cost about 0.6 s and 35 MiB before the first request (issue 42).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import sys
import time
from collections.abc import Mapping
from typing import Any, NamedTuple
from urllib.parse import quote, unquote, urlsplit

from gkx_autocache._shared.bucket import LIST_LIMIT
from gkx_autocache._shared.calls import Progress
from gkx_autocache._shared.http import HttpCache, HttpError

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
ERROR_LIMIT = 64 << 10  # an error's XML body: a few hundred bytes
LISTING_LIMIT = 4 << 20  # a page of 1000 names
ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
# settings that change how a request is made or where it goes, which this client does not read
NOT_READ_ENVS = ("AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT", "AWS_S3_USE_ARN_REGION",
                 "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "AWS_S3_DISABLE_MULTIREGION_ACCESS_POINTS")
PROXY_ENVS = ("http_proxy", "https_proxy", "all_proxy")  # any case, as urllib reads them
# what a profile may hold for this client to serve it: what it reads, and what changes no request
# of its own (the CLI's output, botocore's retries and checksums); anything else (a role, SSO, a
# credential process, FIPS, dual-stack, nested ``s3 =`` settings) is s3fs's
CONFIG_READ = frozenset({"region", "endpoint_url", "ca_bundle", "aws_access_key_id", "aws_secret_access_key",
                         "aws_session_token", "aws_security_token", "output", "cli_pager", "cli_timestamp_format",
                         "cli_binary_format", "cli_auto_prompt", "cli_history", "max_attempts", "retry_mode",
                         "parameter_validation", "tcp_keepalive", "request_checksum_calculation",
                         "response_checksum_validation", "metadata_service_timeout", "metadata_service_num_attempts"})
CREDENTIALS_READ = frozenset({"aws_access_key_id", "aws_secret_access_key", "aws_session_token", "aws_security_token"})
FILE_LIMIT = 1 << 20  # an AWS ini file longer than this is s3fs's to read
REGION = re.compile(r"[a-z]{2}(?:-[a-z0-9]+){1,4}")  # eu-west-1, us-gov-east-1: never a host of another name
# AWS's main partition and GovCloud, whose hosts are ``amazonaws.com`` (botocore's pattern); China,
# the ISO partitions and the European sovereign cloud have domains of their own: s3fs's
MAIN_PARTITION = re.compile(r"(?:us|eu|ap|sa|ca|me|af|il|mx)-[a-z]+-\d+|us-gov-[a-z]+-\d+")
VIRTUAL_HOST = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")  # a bucket that is one DNS label: its own host
BACKOFF = (0.1, 0.4, 1.2)  # seconds before asking again after a 5xx (S3's SlowDown): within shared_timeout


class Keys(NamedTuple):
    """What signs a request, and where it goes."""

    access: str
    secret: str
    token: str | None
    region: str
    endpoint: str | None  # scheme://host[:port][/path], None for AWS's own
    source: str  # for ``status``: where the keys were read (never their value)
    cafile: str | None = None  # AWS_CA_BUNDLE, the profile's ca_bundle, or REQUESTS_CA_BUNDLE


def keys(env: Mapping[str, str] = os.environ, bucket: str = "") -> Keys | str:
    """The static keys and settings for a direct client of ``bucket``, or why s3fs is used instead:
    the environment and the profile as botocore reads them (``AWS_DEFAULT_PROFILE`` before
    ``AWS_PROFILE``; the region from ``AWS_DEFAULT_REGION``, not ``AWS_REGION``; the environment's
    keys before a profile's; profile sections named as botocore names them, the later one winning);
    a setting this client does not read sends the level to s3fs, never to another place. Nothing is
    fetched; never raises."""
    try:
        return _keys(env, bucket)
    except Exception as exc:  # never the user's import: s3fs reads what this did not
        return f"the settings could not be read here ({type(exc).__name__})"


def _keys(env: Mapping[str, str], bucket: str) -> Keys | str:
    if any(k.startswith("FSSPEC_S3") for k in env) or _fsspec_config(env):
        return "fsspec has S3 settings of its own"
    if setting := next((k for k in env if k.lower() in PROXY_ENVS and env[k]), None):
        return f"{setting} is set"
    if setting := next((k for k in NOT_READ_ENVS if env.get(k)), None):
        return f"{setting} is set"
    if sys.platform in ("darwin", "win32") and _system_proxy():
        return "the system has a proxy"
    if bucket.endswith("--x-s3") or bucket.startswith("arn:"):
        return "a directory bucket or an access point"
    if bool(env.get("AWS_ACCESS_KEY_ID")) != bool(env.get("AWS_SECRET_ACCESS_KEY")):
        return "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set together"
    if env.get("AWS_WEB_IDENTITY_TOKEN_FILE") and not env.get("AWS_ACCESS_KEY_ID"):
        return "a web identity role"
    named = env.get("AWS_DEFAULT_PROFILE") or env.get("AWS_PROFILE")
    profile = named or "default"
    config = _profiles(env.get("AWS_CONFIG_FILE", "~/.aws/config"), env, prefixed=True)
    credentials = _profiles(env.get("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"), env, prefixed=False)
    if isinstance(config, str) or isinstance(credentials, str):
        return str(config if isinstance(config, str) else credentials)
    mine, keyed = config.get(profile), credentials.get(profile)
    if named and mine is None and keyed is None:
        return f"the profile {profile!r} is in neither ~/.aws file"
    mine, keyed = mine or {}, keyed or {}
    if unread := sorted(set(mine) - CONFIG_READ) or sorted(set(keyed) - CREDENTIALS_READ):
        return f"the profile {profile!r} has {unread[0]}"
    endpoint = next((env[k] for k in ENDPOINT_ENVS if env.get(k)), None) or mine.get("endpoint_url")
    region = env.get("AWS_DEFAULT_REGION") or mine.get("region") or "us-east-1"
    origin = _origin(endpoint) if endpoint else None
    if endpoint and origin is None:
        return f"the endpoint {endpoint!r} is not a plain http(s) URL of a host"
    if origin is None and not MAIN_PARTITION.fullmatch(region):
        return f"the region {region!r} is outside AWS's main partition"
    cafile = env.get("AWS_CA_BUNDLE") or mine.get("ca_bundle") or env.get("REQUESTS_CA_BUNDLE") or None
    if env.get("AWS_ACCESS_KEY_ID"):
        token = next((env[k] for k in ("AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN") if env.get(k)), "")
        return Keys(env["AWS_ACCESS_KEY_ID"].strip(), env["AWS_SECRET_ACCESS_KEY"].strip(), token.strip() or None,
                    region, origin, "the environment's keys (AWS_ACCESS_KEY_ID)", cafile)
    for found, where in ((keyed, "~/.aws/credentials"), (mine, "~/.aws/config")):
        if "aws_access_key_id" in found:  # (the first file that names a key is botocore's, empty or not)
            if not (found["aws_access_key_id"] and found.get("aws_secret_access_key")):
                return f"the profile {profile!r} in {where} has a key without its secret"
            token = next((found[k] for k in ("aws_security_token", "aws_session_token") if k in found), "")
            return Keys(found["aws_access_key_id"], found["aws_secret_access_key"], token or None, region, origin,
                        f"the profile {profile!r} in {where}", cafile)
    return "no static keys (the environment, ~/.aws): a role or instance credentials"


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


def _profiles(setting: str, env: Mapping[str, str], prefixed: bool) -> dict[str, dict[str, str]] | str:
    """An AWS ini file's profiles by name, as botocore reads them: the path's variables and ``~``
    expanded, an empty setting no file, a path that is no regular file skipped; in the config
    file (``prefixed``) ``[default]`` and ``[profile <name>]`` (split as a shell splits it: two
    words), a later section of one name taking its place. Why not, where the file does not parse
    or is too long."""
    if not setting:
        return {}
    path = _expand(setting, env)
    if not os.path.isfile(path):  # no file, a folder, a FIFO, a device: botocore reads none of them
        return {}
    if os.path.getsize(path) > FILE_LIMIT:
        return f"{setting} is longer than {FILE_LIMIT >> 20} MiB"
    import configparser

    parser = configparser.RawConfigParser()
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError):
        return f"{setting} does not parse"
    found: dict[str, dict[str, str]] = {}
    for section in parser.sections():
        name: str | None = section
        if prefixed and section != "default":
            name = _profile_name(section)
        if name is not None:
            found[name] = {k: v for k, v in parser.items(section)}
    return found


def _expand(path: str, env: Mapping[str, str]) -> str:
    """``os.path.expandvars`` then ``expanduser`` (botocore's order), read from ``env``."""
    path = re.sub(r"\$(\w+)|\$\{([^}]*)\}", lambda m: env.get(m[1] or m[2], m[0]), path)
    if path == "~" or path.startswith("~/"):
        home = env.get("HOME") or os.path.expanduser("~")
        return home + path[1:]
    return os.path.expanduser(path)


def _profile_name(section: str) -> str | None:
    """``[profile <name>]``'s name as botocore's ``shlex`` split gives it, or None for a section
    that names no profile."""
    if not section.startswith("profile"):
        return None
    import shlex

    try:
        words = shlex.split(section)
    except ValueError:
        return None
    return words[1] if len(words) == 2 else None


def _system_proxy() -> bool:
    """Whether macOS's or Windows' own settings name a proxy (urllib reads them, and botocore)."""
    import urllib.request

    return bool(urllib.request.getproxies())


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


class S3(HttpCache):
    """``s3://bucket/prefix``, through ``http.py``'s pool of keep-alive connections: AWS's own
    endpoint by its virtual host (``bucket.s3.region.amazonaws.com``), another (MinIO, moto, R2)
    by path (``endpoint/bucket/...``)."""

    said = "the bucket's endpoint"
    sealed = False  # stock JAX writes entries here without a seal (a ``dir = s3://`` user)

    def __init__(self, version_url: str, found: Keys) -> None:
        super().__init__(version_url, env={})  # no bearer token or ~/.netrc entry: each request is signed
        self._keys = found
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
                time.sleep(BACKOFF[retries])  # S3 asks to be asked again (SlowDown): as botocore does
                retries += 1
            else:
                return connection, response, url
            response.read(ERROR_LIMIT)
            connection.close()

    def _error(self, response: Any, url: str, more: str = "") -> OSError:
        """S3's error in one line: its code and message from the XML body."""
        code = message = ""
        if response.status >= 400 and response.getheader("Content-Type", "").endswith("xml"):
            text = response.read(ERROR_LIMIT).decode("utf-8", "replace")
            code, message = _tag(text, "Code"), _tag(text, "Message")
        name = unquote(url[len(self.base):].split("?")[0]) if url.startswith(self.base + "/") else ""
        return HttpError(response.status, f"{code or response.reason}{f' ({message})' if message else ''}{more}",
                         self.where + name, credentials=self._keys.source)

    def listing(self, progress: Progress) -> dict[str, int] | str:
        """``{name: bytes}`` directly under the version prefix from one page (``LIST_LIMIT`` names),
        or "more than …" where the page does not hold them all. Raises on errors (a bucket that
        does not exist, keys it refuses)."""
        prefix = f"{self.prefix}/" if self.prefix else ""
        query = f"delimiter=%2F&list-type=2&max-keys={LIST_LIMIT}&prefix={quote(prefix, safe='-_.~')}"
        connection, response, url = self._request("GET", "", query=query)
        if response.status != 200:
            error = self._error(response, url)
            connection.close()
            raise error
        text = response.read(LISTING_LIMIT + 1)
        if len(text) > LISTING_LIMIT:
            connection.close()
            raise HttpError(200, f"a listing longer than {LISTING_LIMIT} bytes (not read)", url)
        self._done(connection, response)
        progress.tick()
        return _names(text.decode("utf-8", "replace"), prefix)


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


def sign(method: str, url: str, headers: dict[str, str], body: bytes | None, found: Keys, region: str,
         now: float | None = None) -> dict[str, str]:
    """``headers`` with AWS Signature Version 4's (``Authorization``, ``x-amz-date``,
    ``x-amz-content-sha256``, the session token). ``url``'s path and query are as they will be
    sent: already quoted, the query's names in order."""
    parts = urlsplit(url)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    payload = hashlib.sha256(body).hexdigest() if body else EMPTY_SHA256
    signed = {"host": parts.netloc, "x-amz-content-sha256": payload, "x-amz-date": stamp}
    if found.token:
        signed["x-amz-security-token"] = found.token
    names = ";".join(sorted(signed))
    canonical = "\n".join([method, parts.path or "/", parts.query,
                           "".join(f"{k}:{signed[k]}\n" for k in sorted(signed)), names, payload])
    scope = f"{stamp[:8]}/{region}/s3/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    key = f"AWS4{found.secret}".encode()
    for part in (stamp[:8], region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    out = {**headers, **{"Host" if k == "host" else k: v for k, v in signed.items()}}  # sent as signed
    out["Authorization"] = f"AWS4-HMAC-SHA256 Credential={found.access}/{scope}, SignedHeaders={names}, Signature={signature}"
    return out
