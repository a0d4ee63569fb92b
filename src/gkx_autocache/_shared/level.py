"""The shared level (SPEC §14): a second store behind the local one, in a bucket (``s3://``,
``gs://``, through fsspec) or a directory (a team directory, or a read-only one baked into an
image). The store asks it on a local miss and hands it each local write; it knows nothing of the
CLI. Nothing here runs at interpreter start or on ``import jax`` beyond building the object: the
first shared access is the first local miss.

Why this shape:
- Every call to the shared level runs in a daemon thread, and the caller waits while it makes
  progress: a request that completes (a block of an entry, a listing, an upload) is progress.
  ``shared_timeout`` without any is a stall, whatever the client does meanwhile (botocore's own
  retries multiply its socket timeouts, and a server that sends a byte a second resets them all).
  Blocks start at 256 KiB and grow with the measured rate, so a large entry on a slow link is not
  cut while it arrives; a link that cannot move 256 KiB in ``shared_timeout`` is a stall.
- The first stall or error turns the level off for the rest of the process, with one warning;
  the run goes on with the local level. A dead or silent endpoint costs a run one timeout.
- A bucket's version prefix is listed once, at the first local miss (at most ``LIST_LIMIT``
  names, one request on S3): every miss of a key it does not hold is then answered without a
  round trip, so a cold run against an empty bucket pays one request, not one per compile. The
  listing is renewed after ``LIST_TTL`` (entries others upload meanwhile); longer listings are
  not used, and each miss asks for its key.
- A writer's local hit heals the bucket: where the listing lacks the entry, it is queued for upload
  like a compile (a warm local level never reads the bucket, so an entry lost there would never
  come back). The listing for that is taken by the upload worker, never on the compile path; a
  failure of it stops the healing quietly (a run of local hits needs nothing of the bucket).
- Reads of a bucket stream the body and stop at the length asked for (an endpoint that ignores
  ``Range`` sends whole objects: one 4 KiB read must not hold 1 GB); a whole object sent for a
  ranged read turns the level off, naming it. A refused connection is not retried (botocore's
  backoff would outlast ``shared_timeout`` and be told as a stall).
- Each entry is written with a seal, ``<key>-gkx-shared`` (a small JSON object: the key, the
  entry's size and SHA-256, its compile time and when it was written, and with a signing key an
  HMAC-SHA256 over all of them), uploaded before the entry. A read fetches the seal and the
  entry's first block at once (one round trip), and an entry whose bytes do not match its seal
  (a partial body, a wrong size, another object's bytes) is never served. With a signing key,
  an entry without a valid HMAC is never served either ("not signed"). The compile time in the
  seal travels with the entry, so time saved stays true after a backfill.
- Uploads leave the compile path through a queue bounded in bytes (beyond it: skipped and
  counted), drained by one daemon thread; at exit, what is pending gets one ``shared_timeout``
  in all (the rest is dropped, counted, one warning). An object is one PUT of the whole bytes
  (S3 and GCS store an object whole or not at all, multipart uploads included: it appears at
  completion); a directory gets a temporary file and a rename (``_files.atomic``). An upload
  lost to ``os._exit`` or a kill is a later miss, never a partial object.
- ``fork``: threads do not survive it, and a lock held by one of them would stay held in the
  child. The child starts with an empty queue (the parent uploads its own), new locks, no
  worker, and its own filesystem object (fsspec's event loop thread is the parent's).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from gkx_autocache import _files, _trust
from gkx_autocache._diagnostics import human_bytes, logger, plural, warn
from gkx_autocache._layout import COMPILE_SIDECAR, ENTRY_SUFFIX, SEAL_SIDECAR, is_url, key_match, version_name

FIRST_BLOCK = 256 << 10  # most CPU entries fit in one block: one round trip
MAX_BLOCK = 64 << 20
LIST_LIMIT = 1000  # one S3 listing page
LIST_TTL = 60.0
HEAL_GRACE = 2.0  # at exit, the most a run of local hits waits for the listing its healing needs
NOT_LISTED = "not counted: this filesystem cannot list a bounded page"
QUEUE_BYTES = 256 << 20  # entries waiting to be uploaded, held in memory
SEAL_LIMIT = 4096
MAX_ENTRY = 8 << 30  # without a cap, the most read of one shared entry (a lying seal cannot ask for more)
SEAL_FORMAT = 1
DOMAIN = b"gkx-autocache shared entry v1\0"

# The per-level numbers, the same names for both levels (SPEC §14). Summed over processes by the
# ledger as they are; ``shown`` turns read_secs and reads into the mean read time.
COUNTS = ("hits", "misses", "backfills", "uploads", "errors", "timeouts", "rejected", "skipped", "dropped",
          "requests", "bytes_read", "bytes_written", "read_secs", "reads")


class Stalled(Exception):
    """No progress for ``shared_timeout`` seconds."""


class ShuttingDown(Exception):
    """No new thread can be started: the interpreter is exiting (Python 3.12 refuses them from the
    start of its finalisation, ``threading``'s at-exit hooks included)."""


class Progress:
    """Ticked by a call to the shared level each time a request completes."""

    __slots__ = ("at",)

    def __init__(self) -> None:
        self.at = time.monotonic()

    def tick(self) -> None:
        self.at = time.monotonic()


def bounded(func: Callable[[Progress], Any], timeout: float) -> Any:
    """``func(progress)`` in a daemon thread: its result or its exception, or Stalled once
    ``progress`` has not been ticked for ``timeout`` seconds (the thread is then left behind,
    stuck in the client; being a daemon, it never holds the process up)."""
    progress = Progress()
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = func(progress)
        except BaseException as exc:  # everything reaches the caller: nothing for threading's excepthook
            box["error"] = exc
        finally:
            done.set()

    try:
        threading.Thread(target=run, name="gkx-autocache-shared", daemon=True).start()
    except RuntimeError as exc:
        raise ShuttingDown(str(exc)) from None
    while not done.is_set():
        left = progress.at + timeout - time.monotonic()
        if left <= 0:
            raise Stalled(f"no progress for {timeout:g} s")
        done.wait(left)
    if "error" in box:
        raise box["error"]
    return box["value"]


def describe(exc: BaseException) -> str:
    """An error of the shared level in one short line; a refused connection names its endpoint."""
    if _refused(exc):
        url = str((getattr(exc, "kwargs", None) or {}).get("endpoint_url") or "")
        where = "/".join(url.split("/", 3)[:3]) if "://" in url else "the endpoint"
        return f"the connection was refused by {where} (nothing listens there: a server stopped, or a wrong endpoint)"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:240] if text else type(exc).__name__


class Refused(Exception):
    """The entry is there but must not be served: a miss, named ``rejected: <why>``."""


# -- seals --------------------------------------------------------------------------------------


def seal_body(key: str, data: bytes, compile_secs: float | None, written: float) -> dict[str, Any]:
    return {"format": SEAL_FORMAT, "key": key, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "compile": None if compile_secs is None else round(compile_secs, 6), "written": round(written, 3)}


def mac(secret: bytes, body: dict[str, Any]) -> str:
    """HMAC-SHA256 over the seal's fields (the key, the entry's size and SHA-256, so its bytes, the
    compile time and the write time), in one canonical form."""
    fields = {k: v for k, v in body.items() if k != "hmac"}
    message = DOMAIN + json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def make_seal(key: str, data: bytes, compile_secs: float | None, written: float, secret: bytes | None) -> bytes:
    body = seal_body(key, data, compile_secs, written)
    if secret is not None:
        body["hmac"] = mac(secret, body)
    return json.dumps(body, separators=(",", ":")).encode()


def read_seal(raw: bytes, key: str, limit: int) -> dict[str, Any]:
    """The seal's fields, checked for shape (a bucket or a team member can write anything there).
    Raises Refused."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise Refused("the shared entry's seal is not valid JSON") from None
    if not isinstance(body, dict) or body.get("format") != SEAL_FORMAT:
        raise Refused("the shared entry's seal is of an unknown format")
    size, digest = body.get("bytes"), body.get("sha256")
    if body.get("key") != key:
        raise Refused("the shared entry's seal names another key")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= limit:
        raise Refused(f"the shared entry's seal gives an impossible size ({str(size)[:40]})")
    if not _hex64(digest):
        raise Refused("the shared entry's seal has no SHA-256")
    if "hmac" in body and not _hex64(body["hmac"]):  # compare_digest raises on a non-ASCII string
        raise Refused("the shared entry's seal has a malformed signature")
    from gkx_autocache._store import MAX_COMPILE_SECS

    for name, most in (("compile", MAX_COMPILE_SECS), ("written", 1e11)):  # a claim beyond them is no figure
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not 0 <= value <= most):
            body[name] = None
    return body


def _hex64(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def head_problem(head: bytes) -> str | None:
    """Why an entry's first bytes cannot begin an executable JAX wrote (it compresses each with
    zstd or zlib), or None: a planted file of zeros is refused before the rest is read."""
    from gkx_autocache._store import compression_of

    return None if compression_of(head[:4]) else "the shared entry is not a compressed executable"


def _read_exactly(fd: int, size: int, progress: Progress) -> bytes:
    """``size`` bytes of the file, by blocks (each one progress), and not one more: a file that
    grew or shrank while it was read is refused."""
    if size <= 0:  # no first block to check: an empty file is no executable
        raise Refused("the shared entry is empty")
    chunks: list[bytes] = []
    left = size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20 if chunks else FIRST_BLOCK))
        if not chunk:
            break
        if not chunks and (why := head_problem(chunk)):
            raise Refused(why)
        chunks.append(chunk)
        left -= len(chunk)
        progress.tick()
    if left or os.read(fd, 1):
        raise Refused("the shared entry changed size while it was read")
    return b"".join(chunks)


# -- where the shared level is ------------------------------------------------------------------


class RangeIgnored(OSError):
    """The endpoint answered a ranged read with the whole object: every read would do the same, so
    the level turns off (one line naming it), rather than each entry being rejected in turn."""


def _refused(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a connection refused (botocore's EndpointConnectionError keeps the
    client's error, aiohttp's keeps the OSError)."""
    seen = 0
    while exc is not None and seen < 6:
        if isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == errno.ECONNREFUSED:
            return True
        exc = (getattr(exc, "os_error", None) or (getattr(exc, "kwargs", None) or {}).get("error")
               or exc.__cause__ or exc.__context__)
        seen += 1
    return False


def _no_retry_when_refused(caught_exception: BaseException | None = None, **kwargs: Any) -> bool | None:
    """botocore's ``needs-retry`` handler, registered first: a refused connection is not retried
    (botocore's default retries it with backoff for up to ~15 s, longer than ``shared_timeout``'s
    default, and the level was then told to be stalled). False is "no retry" to aiobotocore's
    emitter; None leaves the decision to botocore's own handler."""
    return False if _refused(caught_exception) else None


async def _hooked(fs: Any, path: str) -> None:
    """Register ``_no_retry_when_refused`` on s3fs's client for ``path``'s bucket, once."""
    get_s3 = getattr(fs, "get_s3", None)
    if get_s3 is None or not hasattr(fs, "_call_s3"):
        return
    await fs.set_session()
    client = await get_s3(path.split("/", 1)[0])
    if not getattr(client, "_gkx_refusal", False):
        client.meta.events.register_first("needs-retry.s3", _no_retry_when_refused)
        client._gkx_refusal = True


async def _read_range(fs: Any, path: str, start: int, end: int) -> bytes | None:
    """Bytes ``start`` to ``end`` of an S3 object, None when it is not there. The body is read as a
    stream and stopped at the length asked for: s3fs's ``_cat_file`` reads whatever it is sent, so
    an endpoint that ignores ``Range`` would have a whole object (1 GB) held for a 4 KiB read.
    Raises RangeIgnored (the whole object, 200), Refused (a 206 longer than its range)."""
    bucket, key = path.split("/", 1)
    try:
        resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
    except FileNotFoundError:
        return None
    body = resp["Body"]
    asked = end - start
    try:
        ranged = bool(resp.get("ContentRange"))
        length = resp.get("ContentLength")
        if not ranged and (start > 0 or (isinstance(length, int) and length > asked)):
            raise RangeIgnored(f"the bucket's endpoint ignores Range: it answered a read of {human_bytes(asked)} of "
                               f"{key.rsplit('/', 1)[-1]} with the whole object"
                               f"{f' ({human_bytes(length)})' if isinstance(length, int) else ''}")
        chunks, have = [], 0
        while have <= asked and (chunk := await body.read(min(1 << 20, asked + 1 - have))):
            chunks.append(chunk)
            have += len(chunk)
        if have > asked and not ranged:
            raise RangeIgnored(f"the bucket's endpoint ignores Range: it sent more than the {human_bytes(asked)} "
                               f"asked of {key.rsplit('/', 1)[-1]}")
        if have > asked:
            raise Refused(f"the shared entry sent more than the {asked} bytes of its range")
        if ranged and (why := _wrong_range(str(resp.get("ContentRange")), start, end, have)):
            raise Refused(f"the shared entry sent {why}")
        return b"".join(chunks)
    finally:
        body.close()  # a body left unread is dropped with its connection, never read on


def _wrong_range(content_range: str, start: int, end: int, have: int) -> str | None:
    """Why a 206's ``Content-Range`` (``bytes first-last/total``) is not bytes ``start`` to ``end``
    (fewer only where the object ends there) with ``have`` bytes of body, or None."""
    import re

    match = re.fullmatch(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*", content_range)
    if match is None:
        return f"a range it does not say ({content_range[:60]!r})"
    first, last = int(match[1]), int(match[2])
    total = int(match[3]) if match[3] != "*" else None
    if first != start or last < first or last > end - 1 or (last < end - 1 and last + 1 != total):
        return f"bytes {first}-{last} of {match[3]} for a range of {start}-{end - 1}"
    if have != last + 1 - first:
        return f"{have} bytes for a range of {last + 1 - first} (a partial body)"
    return None


def _within(data: bytes, asked: int, name: str) -> bytes:
    """A ranged read through fsspec's generic path (gcsfs): the whole body is read by the library
    before it can be looked at, so this bounds what is kept, not what was held."""
    if len(data) > asked:
        raise RangeIgnored(f"the bucket's endpoint ignores Range: it sent {human_bytes(len(data))} for a read of "
                           f"{human_bytes(asked)} of {name}")
    return data


class Bucket:
    """``s3://`` and ``gs://`` through fsspec (the ``remote`` extra): endpoint and credentials are
    the filesystem library's, as for a remote ``dir`` (SPEC §9). On S3 the reads are s3fs's
    ``get_object`` with the body streamed (``_read_range``); gcsfs (no server to test against here)
    goes through fsspec's ``cat_ranges``, its lengths checked after."""

    kind = "bucket"

    def __init__(self, version_url: str) -> None:
        self.where = version_url
        self._fs: Any = None
        self._path = ""

    def filesystem(self) -> tuple[Any, str]:
        if self._fs is None:
            from gkx_autocache import _remote

            self._fs, self._path = _remote.filesystem(self.where, own=True)  # its client gets _hooked
        return self._fs, self._path

    def _run(self, make: Callable[[Any, str], Any]) -> Any:
        """``make(fs, path)``'s coroutine on fsspec's event loop, the refusal handler registered."""
        import fsspec.asyn

        fs, path = self.filesystem()

        async def go() -> Any:
            await _hooked(fs, path)
            return await make(fs, path)

        return fsspec.asyn.sync(fs.loop, go)

    def _streams(self) -> bool:
        return hasattr(self.filesystem()[0], "_call_s3")  # s3fs

    def forget(self) -> None:
        """After ``fork``: the parent's filesystem object runs on the parent's event loop thread."""
        self._fs = None

    def prepare(self, progress: Progress, create: bool = True) -> bool:
        return True  # whether a bucket takes writes is known at the first upload

    def listing(self, progress: Progress) -> dict[str, int] | str:
        """``{name: bytes}`` directly under the version prefix, or why there is no listing to use:
        more than ``LIST_LIMIT`` names, or a filesystem that cannot list a bounded page. Raises on
        errors, a bucket that does not exist included (on S3)."""
        fs, path = self.filesystem()
        lsdir, list_objects = getattr(fs, "_lsdir", None), getattr(fs, "_list_objects", None)
        if lsdir is not None and "max_items" in _parameters(lsdir):  # s3fs
            infos = self._run(lambda fs, path: lsdir(path, refresh=True, max_items=LIST_LIMIT + 1))
            fs.invalidate_cache(path)  # a page is no complete listing: keep it out of fsspec's cache
        elif list_objects is not None and "max_results" in (_parameters(list_objects)
                                                            + _parameters(getattr(fs, "_do_list_objects", None))):
            # gcsfs: ``_list_objects(path, prefix, versions, **kwargs)`` hands max_results to
            # ``_do_list_objects``, which pages up to it (not tested here: no GCS server)
            fs.invalidate_cache(path)  # a cached listing would be returned whole, unbounded
            try:
                infos = self._run(lambda fs, path: list_objects(path, max_results=LIST_LIMIT + 1))
            except FileNotFoundError:  # gcsfs, for an empty prefix: it looks for an object of its name
                infos = []
        else:
            return NOT_LISTED
        progress.tick()
        names = {}
        for info in infos:
            if info.get("type") != "directory":
                names[str(info["name"]).rstrip("/").rsplit("/", 1)[-1]] = int(info.get("size") or 0)
        return names if len(infos) <= LIST_LIMIT else f"more than {LIST_LIMIT}"

    def first(self, key: str, progress: Progress) -> tuple[bytes | None, bytes | None]:
        """The seal and the entry's first block, at once (one round trip); None for each that is
        not there."""
        fs, path = self.filesystem()
        names = [f"{path}/{key}{SEAL_SIDECAR}", f"{path}/{key}{ENTRY_SUFFIX}"]
        if self._streams():
            import asyncio

            got = self._run(lambda fs, path: asyncio.gather(_read_range(fs, names[0], 0, SEAL_LIMIT),
                                                            _read_range(fs, names[1], 0, FIRST_BLOCK),
                                                            return_exceptions=True))
        else:
            got = fs.cat_ranges(names, [0, 0], [SEAL_LIMIT, FIRST_BLOCK], on_error="return")
        progress.tick()
        found: list[bytes | None] = []
        for item, asked, name in zip(got, (SEAL_LIMIT, FIRST_BLOCK), names, strict=True):
            if item is None or isinstance(item, FileNotFoundError):
                found.append(None)
            elif isinstance(item, BaseException):
                raise item
            else:
                found.append(_within(bytes(item), asked, name.rsplit("/", 1)[-1]))
        return found[0], found[1]

    def small(self, name: str) -> bytes:
        """The first ``SEAL_LIMIT`` bytes of an object (``status``'s look at a seal)."""
        fs, path = self.filesystem()
        where = f"{path}/{name}"
        if self._streams():  # never more than asked for, whatever the endpoint sends
            return self._run(lambda fs, path: _read_range(fs, where, 0, SEAL_LIMIT)) or b""
        return _within(bytes(fs.cat_file(where, start=0, end=SEAL_LIMIT)), SEAL_LIMIT, name)

    def block(self, key: str, start: int, end: int) -> bytes:
        fs, path = self.filesystem()
        name = f"{path}/{key}{ENTRY_SUFFIX}"
        if self._streams():
            return self._run(lambda fs, path: _read_range(fs, name, start, end)) or b""
        return _within(bytes(fs.cat_file(name, start=start, end=end)), end - start, key + ENTRY_SUFFIX)

    def size(self, key: str) -> int:
        fs, path = self.filesystem()
        return int(fs.info(f"{path}/{key}{ENTRY_SUFFIX}")["size"])

    def compile_secs(self, key: str) -> float | None:
        return None  # a bucket's entries carry theirs in the seal

    def write(self, name: str, data: bytes) -> None:
        """One PUT of the whole bytes: the object appears whole or not at all."""
        self._run(lambda fs, path: fs._pipe_file(f"{path}/{name}", data))


class Directory:
    """A team directory (``trust_shared``) or a read-only one baked into an image, trusted by the
    rules of §8 before it is read."""

    kind = "directory"

    def __init__(self, root: str, jax_version: str, team: bool) -> None:
        self.root = root
        self.where = os.path.join(root, version_name(jax_version))
        self.jax_version = jax_version
        self.team = team

    def forget(self) -> None:
        pass

    def prepare(self, progress: Progress, create: bool = True) -> bool:
        """Check (and, with ``create``, where it may be written and is missing, create) the version
        directory; whether this user may write it. Raises the refusal (an OSError: one line)."""
        from gkx_autocache import _cache

        try:
            prepared = _cache.prepare(self.root, self.jax_version, self.team,
                                      create=create and os.access(self.root, os.W_OK))
        except _cache.Refused as exc:
            raise PermissionError(errno.EACCES, str(exc)) from None
        if not os.path.isdir(prepared.version_dir):
            raise FileNotFoundError(errno.ENOENT, f"{prepared.version_dir} does not exist"
                                                  f"{' and cannot be created here' if create else ''}")
        self.where = prepared.version_dir
        progress.tick()
        return prepared.writable

    def listing(self, progress: Progress) -> dict[str, int] | str:
        return "a directory is not listed"  # a lookup of a missing file is as cheap as a listing would be

    def _open(self, name: str) -> tuple[int, os.stat_result] | None:
        """A descriptor of the file and its ``fstat``, never through a symlink, only if its owner and
        mode may be trusted; None when it is not there. Raises Refused."""
        try:
            fd = _files.open_regular(os.path.join(self.where, name))
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            if exc.errno == errno.ELOOP:
                raise Refused("the shared entry is a symlink: never read") from None
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EINVAL):
                raise Refused(f"the shared entry cannot be read ({exc.strerror})") from None
            raise
        st = os.fstat(fd)
        why = _trust.entry_problem(st, self.team)
        if why:
            os.close(fd)
            raise Refused(f"the shared entry: {why}")
        return fd, st

    def small(self, name: str) -> bytes:
        """The first ``SEAL_LIMIT`` bytes of a file (``status``'s look at a seal); empty when it is
        not there or not to be read."""
        opened = self._open(name)
        if opened is None:
            return b""
        try:
            return os.read(opened[0], SEAL_LIMIT)
        finally:
            os.close(opened[0])

    def read(self, key: str, progress: Progress, admit: Callable[[bytes | None], tuple[int, bool]]) -> bytes | None:
        """The entry, or None when it is not there. Its seal is read and ``admit``-ted (checked, and
        with a signing key its HMAC) before a byte of the entry is: ``admit`` gives the size the
        entry must have (``exact``), or the most it may have. A planted sparse file of gigabytes
        costs a reader an ``fstat``, never its memory. Read by blocks, each one progress."""
        opened = self._open(key + ENTRY_SUFFIX)
        if opened is None:
            return None
        fd, st = opened
        try:
            seal = self._open(key + SEAL_SIDECAR)
            raw_seal = None
            if seal is not None:
                try:
                    raw_seal = os.read(seal[0], SEAL_LIMIT)
                finally:
                    os.close(seal[0])
            size, exact = admit(raw_seal)
            if st.st_size != size if exact else st.st_size > size:
                said = f"its seal says {size} bytes" if exact else f"the most read of one entry is {human_bytes(size)}"
                raise Refused(f"the shared entry has {st.st_size} bytes where {said}")
            return _read_exactly(fd, st.st_size, progress)
        finally:
            os.close(fd)

    def block(self, key: str, start: int, end: int) -> bytes:
        raise AssertionError("a directory's entry is read whole")  # first() returns it all

    def size(self, key: str) -> int:
        raise AssertionError("a directory's entry is read whole")

    def compile_secs(self, key: str) -> float | None:
        """From the store's own sidecar: a directory baked from a local level has no seals."""
        from gkx_autocache._store import read_compile_secs

        return read_compile_secs(os.path.join(self.where, key + COMPILE_SIDECAR))

    def write(self, name: str, data: bytes) -> None:
        """A temporary file and a rename: never a partial file under the entry's name."""
        with _files.atomic(os.path.join(self.where, name), _files.file_mode(self.team)) as f:
            f.write(data)


# -- the level ----------------------------------------------------------------------------------


class Found:
    __slots__ = ("data", "compile_secs", "written")

    def __init__(self, data: bytes, compile_secs: float | None, written: float) -> None:
        self.data = data
        self.compile_secs = compile_secs
        self.written = written


def zero() -> dict[str, float]:
    return dict.fromkeys(COUNTS, 0)


class Level:
    """The shared level of this process: reads, the upload queue and its worker, the seals, the
    off-switch, and the numbers of both levels (the store reports its local hits and misses)."""

    def __init__(self, url: str, backend: Any, *, local: str, timeout: float, writes: str | None,
                 secret: bytes | None, max_entry: int = MAX_ENTRY, origin: str = "shared",
                 queue_bytes: int = QUEUE_BYTES) -> None:
        self.url = url  # as the user wrote it, for messages
        self.backend = backend
        self.local_dir = local
        self.timeout = timeout
        self.writes = writes  # None: uploads on; else why not ("shared_write = never", ...)
        self._secret = secret
        self.max_entry = max_entry
        self.origin = origin
        self.queue_bytes = queue_bytes
        self.counts = {"local": zero(), "shared": zero()}
        self.off: tuple[str, float] | None = None  # (why, when) once turned off
        self._prepared: bool | None = None  # None: not yet; else whether it may be written
        self._listing: dict[str, int] | None = None
        self._listed_at = -LIST_TTL
        self._closed = False
        self._healing = True  # off after a failure of the worker's own listing (quietly: see _ensure)
        self._healed: set[str] = set()  # keys queued to heal the bucket, once each
        self._reset_threads()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forked)

    def _reset_threads(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Lock()  # one thread prepares and lists; the others wait for it
        self._changed = threading.Condition(self._lock)
        self._queue: deque[tuple[str, bytes, float | None, float, bool]] = deque()  # (..., check the listing)
        self._queued = 0  # bytes in the queue and in flight
        self._busy = False
        self._healing_now = False  # the item in flight is an entry to heal (no upload of this run's)
        self._worker: threading.Thread | None = None

    def _forked(self) -> None:
        self._reset_threads()
        self.counts = {"local": zero(), "shared": zero()}
        self.backend.forget()

    # -- counting --------------------------------------------------------------------------------

    def count(self, level: str, **add: float) -> None:
        with self._lock:
            counts = self.counts[level]
            for name, n in add.items():
                counts[name] += n

    def local_hit(self, nbytes: int, secs: float, key: str | None = None, data: bytes | None = None,
                  compile_secs: float | None = None, written: float = 0.0) -> None:
        self.count("local", hits=1, bytes_read=nbytes, read_secs=secs, reads=1)
        if key is not None and data is not None:
            self._heal(key, data, compile_secs, written)

    def _heal(self, key: str, data: bytes, compile_secs: float | None, written: float) -> None:
        """A writer's local hit: queued for upload where the bucket's listing lacks it (a warm
        local level never reads the bucket, so nothing else would ever put an entry back that was
        lost there). Never a round trip here: the listing, if not yet taken, is taken by the
        upload worker, which checks each entry against it; without a usable listing (more than
        LIST_LIMIT names), nothing is healed."""
        if (self.writes is not None or self.off is not None or self._closed or not self._healing
                or self.backend.kind != "bucket" or key in self._healed or not _process_0()):
            return
        listing = self._listing
        listed = self._listed_at != -LIST_TTL  # (the worker may be taking it now: not yet)
        if (listing is None and listed) or (listing is not None and key + ENTRY_SUFFIX in listing):
            return
        self._healed.add(key)
        self._enqueue(key, data, compile_secs, written or time.time(), check=True)

    def local_miss(self) -> None:
        self.count("local", misses=1)

    def record(self) -> dict[str, Any]:
        """Both levels' numbers as a ledger record: the ledger sums them over processes."""
        with self._lock:
            return {"e": "levels", **{level: {k: round(v, 6) if isinstance(v, float) else v
                                              for k, v in counts.items() if v}
                                      for level, counts in self.counts.items()}}

    def snapshot(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {level: dict(counts) for level, counts in self.counts.items()}

    @property
    def off_note(self) -> str | None:
        """For a miss while the level is off: what turned it off, and when."""
        if self.off is None:
            return None
        why, when = self.off
        return f"{why} at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(when))}"

    def turn_off(self, why: str, timed_out: bool = False) -> None:
        """The first stall or error: the level is off for the rest of the process, one warning."""
        with self._lock:
            if self.off is not None:
                return
            self.off = (why, time.time())
            counts = self.counts["shared"]
            counts["timeouts" if timed_out else "errors"] += 1
            counts["dropped"] += len(self._queue)
            self._queue.clear()
            self._queued = 0
            self._changed.notify_all()
        fix = f"raise shared_timeout ({self.origin})" if timed_out else "check its endpoint and credentials"
        warn("shared:off", f"the shared level {self.url} is off for the rest of this process after {why}; the run "
                           f"goes on with the local level {self.local_dir}; fix: `gkx-autocache status` probes it, "
                           f"or {fix}")

    # -- reading ---------------------------------------------------------------------------------

    def _ensure(self, quiet: bool = False) -> bool:
        """Prepare the level (trust, the version directory) and list a bucket's version prefix, once
        (and the listing again after LIST_TTL); whether it is usable. ``quiet``: for healing alone
        (a run of local hits), a failure stops the healing with a debug line and leaves the level
        on: such a run needs nothing of the bucket, and a later miss says what is wrong."""
        if self._prepared is not None and (self._listing is None or time.monotonic() - self._listed_at < LIST_TTL):
            return self.off is None
        with self._ready:
            if self.off is not None:
                return False
            try:
                if self._prepared is None:
                    self._prepared = bool(bounded(self.backend.prepare, self.timeout))
                if time.monotonic() - self._listed_at >= LIST_TTL:
                    names = bounded(self.backend.listing, self.timeout)
                    self._listing = names if isinstance(names, dict) else None
                    self._listed_at = time.monotonic()
                    if self.backend.kind == "bucket":
                        self.count("shared", requests=1)
                    else:
                        self._listed_at = float("inf")  # a directory is never listed
            except ShuttingDown:  # at exit: the listing stays as it is; nothing is wrong with the level
                return self.off is None and self._prepared is not None
            except Exception as exc:
                if quiet:
                    self._healing = False
                    logger.debug("the shared level %s is not healed: %s", self.url, describe(exc))
                    return False
                if isinstance(exc, Stalled):
                    self.turn_off(str(exc), timed_out=True)
                else:
                    self.turn_off(describe(exc))
        return self.off is None

    def get(self, key: str) -> Found | str | None:
        """The entry from the shared level (``Found``), why it must not be served (a string), or
        None for a miss. Never raises."""
        if self.off is not None or not self._ensure():
            self.count("shared", misses=1)
            return None
        listing = self._listing
        if listing is not None and key + ENTRY_SUFFIX not in listing:
            self.count("shared", misses=1)  # answered by the listing: no round trip
            return None
        started = time.perf_counter()
        try:
            found: Found | None = bounded(lambda progress: self._fetch(key, progress), self.timeout)
        except ShuttingDown:  # a compile while the interpreter exits: a miss, nothing wrong with the level
            self.count("shared", misses=1)
            return None
        except Refused as exc:
            self.count("shared", rejected=1, misses=1)
            logger.debug("shared entry %s not served: %s", key, exc)
            return str(exc)
        except Stalled as exc:
            self.count("shared", misses=1)
            self.turn_off(str(exc), timed_out=True)
            return None
        except Exception as exc:
            self.count("shared", misses=1)
            self.turn_off(describe(exc))
            return None
        if found is None:
            self.count("shared", misses=1)
            return None
        self.count("shared", hits=1, bytes_read=len(found.data), read_secs=time.perf_counter() - started, reads=1)
        return found

    def _admit(self, key: str, raw_seal: bytes | None) -> dict[str, Any] | None:
        """The entry's seal, checked for shape and, with a signing key, its HMAC: all before the
        entry is read beyond its first block. None for an unsealed entry a keyless reader takes.
        Raises Refused."""
        if raw_seal is None:
            if self._secret is not None:
                raise Refused("not signed")
            return None
        seal = read_seal(raw_seal, key, self.max_entry)
        if self._secret is not None and not hmac.compare_digest(seal.get("hmac") or "", mac(self._secret, seal)):
            raise Refused("not signed: its signature does not match (another key, or altered)")
        return seal

    def _fetch(self, key: str, progress: Progress) -> Found | None:
        backend = self.backend
        seal: dict[str, Any] | None = None

        def admit(raw_seal: bytes | None) -> tuple[int, bool]:
            nonlocal seal
            seal = self._admit(key, raw_seal)
            return (seal["bytes"], True) if seal is not None else (self.max_entry, False)

        if backend.kind == "directory":
            data = backend.read(key, progress, admit)
            if data is None:
                return None
        else:
            raw_seal, data = backend.first(key, progress)
            self.count("shared", requests=2)  # (to a bucket, where each is a round trip's worth)
            if data is None:
                return None
            size, exact = admit(raw_seal)
            if not exact and len(data) == FIRST_BLOCK:
                size = backend.size(key)  # unsealed (stock JAX wrote it) and longer than one block
                self.count("shared", requests=1)
                progress.tick()
            elif not exact:
                size = len(data)
            if size > self.max_entry:
                raise Refused(f"the shared entry has {human_bytes(size)}, more than the most read of one entry "
                              f"({human_bytes(self.max_entry)})")
            if why := head_problem(data):
                raise Refused(why)
            data = self._rest(key, data, size, progress)
            if len(data) != size:
                raise Refused(f"the shared entry sent {len(data)} bytes where {size} were expected (a partial body or a wrong size)")
        if seal is not None and not hmac.compare_digest(hashlib.sha256(data).hexdigest(), str(seal["sha256"])):
            raise Refused("the shared entry's bytes do not match its seal (SHA-256)")
        compile_secs = seal.get("compile") if seal is not None else None
        if compile_secs is None:
            compile_secs = backend.compile_secs(key)
        return Found(data, compile_secs, float(seal.get("written") or 0.0) if seal is not None else 0.0)

    def _rest(self, key: str, data: bytes, size: int, progress: Progress) -> bytes:
        """The rest of an entry after its first block, by ranged requests that grow with the rate
        measured (to what arrives in a quarter of the timeout), each one progress."""
        if len(data) >= size or self.backend.kind != "bucket" or len(data) < FIRST_BLOCK:
            return data  # all there, or the object ended early: a partial body, refused by the caller
        chunks = [data]
        have = len(data)
        block = FIRST_BLOCK
        while have < size:
            started = time.monotonic()
            chunk = self.backend.block(key, have, min(have + block, size))
            self.count("shared", requests=1)  # (a bucket's: a directory's entry is read whole)
            if len(chunk) != min(block, size - have):  # an object shorter or longer than its seal says
                raise Refused(f"the shared entry sent {len(chunk)} bytes for a range of {min(block, size - have)}")
            progress.tick()
            chunks.append(chunk)
            have += len(chunk)
            rate = len(chunk) / max(time.monotonic() - started, 1e-3)
            block = int(min(max(rate * self.timeout / 4, FIRST_BLOCK), MAX_BLOCK))
        return b"".join(chunks)

    # -- writing ---------------------------------------------------------------------------------

    def put(self, key: str, data: bytes, compile_secs: float | None) -> None:
        """Queue the entry (just written to the local level) for upload; never blocks."""
        if self.writes is not None or self.off is not None or self._closed or not _process_0():
            return
        self._enqueue(key, data, compile_secs, time.time(), check=False)

    def _enqueue(self, key: str, data: bytes, compile_secs: float | None, written: float, check: bool) -> None:
        with self._lock:
            if self.off is not None:
                return
            if self._queued + len(data) > self.queue_bytes:
                if not check:  # (an entry to heal may be in the bucket already: not counted)
                    self.counts["shared"]["skipped"] += 1  # beyond the queue's bound: the compile path never waits
                return
            self._queue.append((key, data, compile_secs, written, check))
            self._queued += len(data)
            if self._worker is None:
                self._worker = threading.Thread(target=self._drain, name="gkx-autocache-upload", daemon=True)
                self._worker.start()
            self._changed.notify_all()

    def _uploads_pending(self) -> bool:
        """Under the lock: whether an upload of this run's (not an entry to heal) is queued or in flight."""
        return (self._busy and not self._healing_now) or any(not item[4] for item in self._queue)

    def _drain(self) -> None:
        """The upload worker: one entry at a time, each bounded like a read."""
        while True:
            with self._lock:
                while not self._queue:
                    self._changed.wait()
                item = self._queue.popleft()
                self._busy = True
                self._healing_now = item[4]
            try:
                self._upload(item)
            except BaseException:  # pragma: no cover - _upload never raises; nothing reaches excepthook
                pass
            finally:
                with self._lock:
                    self._busy = False
                    self._queued = max(self._queued - len(item[1]), 0) if self.off is None else 0
                    self._changed.notify_all()

    def _upload(self, item: tuple[str, bytes, float | None, float, bool]) -> None:
        key, data, compile_secs, written, check = item
        if check and not self._healing:
            return
        if not self._ensure(quiet=check):
            return
        if check and (self._listing is None or key + ENTRY_SUFFIX in self._listing):
            return  # the bucket has it, or there is no listing to tell
        if not self._prepared:  # a read-only shared directory is never written
            with self._lock:
                self.writes = "the shared directory is read-only here"
                self._queue.clear()
            return
        seal = make_seal(key, data, compile_secs, written, self._secret)

        def upload(progress: Progress) -> None:
            self.backend.write(key + SEAL_SIDECAR, seal)  # before the entry: a reader that sees it sees its seal
            progress.tick()
            if self.backend.kind == "directory" and compile_secs is not None:
                self.backend.write(key + COMPILE_SIDECAR, f"{compile_secs:.6f}".encode())
            self.backend.write(key + ENTRY_SUFFIX, data)
            progress.tick()

        try:
            try:
                bounded(upload, self.timeout)
            except ShuttingDown:  # at exit this worker uploads itself: ``finish``'s deadline bounds it
                upload(Progress())
        except Stalled as exc:
            self.turn_off(f"an upload made {exc}", timed_out=True)
            return
        except Exception as exc:
            self.turn_off(describe(exc))
            return
        self.count("shared", uploads=1, bytes_written=len(data) + len(seal),
                   requests=2 if self.backend.kind == "bucket" else 0)
        listing = self._listing
        if listing is not None:
            listing[key + ENTRY_SUFFIX] = len(data)

    def finish(self, recorder: Any = None) -> None:
        """At exit: what is pending gets one ``shared_timeout`` in all; the rest is dropped,
        counted, with one warning. Then both levels' numbers go to the ledger."""
        started = time.monotonic()
        deadline = started + self.timeout
        with self._lock:
            self._closed = True
            while (self._queue or self._busy) and self.off is None:
                left = deadline - time.monotonic()
                if self._listed_at == -LIST_TTL and not self._uploads_pending():
                    # healing alone, its listing not taken yet: a run of local hits needs nothing of
                    # the bucket, and an endpoint that does not answer must not cost its exit a timeout
                    left = min(left, started + HEAL_GRACE - time.monotonic())
                if left <= 0:
                    break
                self._changed.wait(left)
            listing = self._listing  # an entry to heal is an upload only where the listing lacks it
            pending = [item for item in self._queue
                       if not item[4] or (listing is not None and item[0] + ENTRY_SUFFIX not in listing)]
            left_over = len(pending) + (self._busy and not self._healing_now) if self.off is None else 0
            self.counts["shared"]["dropped"] += left_over
            self._queue.clear()
        if left_over:
            warn("shared:exit", f"{left_over} uploads to the shared level {self.url} were dropped at exit: they did "
                                f"not finish within shared_timeout ({self.timeout:g} s, {self.origin}); they are "
                                "compiled again by a later run")
        if recorder is not None:
            try:
                recorder.levels_record(self.record())
            except Exception as exc:
                logger.debug("per-level numbers not recorded: %s", exc)


def _process_0() -> bool:
    """JAX's rule for the shared level: only process 0 of a multi-process run writes."""
    import sys

    distributed = sys.modules.get("jax._src.distributed")
    state = getattr(distributed, "global_state", None)
    return getattr(state, "process_id", 0) == 0


def _parameters(func: Any) -> list[str]:
    import inspect

    try:
        return list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return []


def _signature_text(func: Any) -> str:
    import inspect

    try:
        return str(inspect.signature(func))
    except (TypeError, ValueError):
        return ""


# -- settings into a level ----------------------------------------------------------------------


def uploads(setting: str, env: Mapping[str, str]) -> str | None:
    """None when this process uploads, else why not, per ``shared_write``."""
    from gkx_autocache._settings import is_ci

    if setting == "never":
        return "shared_write = never"
    if setting == "ci" and not is_ci(env):
        return "shared_write = ci, and CI is not set to a true value here"
    return None


def same_place(shared: str, local_root: str | None) -> bool:
    if local_root is None or is_url(shared):
        return False
    return os.path.realpath(shared) == os.path.realpath(local_root)


def problem(settings: Any, location: Any) -> str | None:
    """Why the ``shared`` setting cannot be used with this local level, or None."""
    from gkx_autocache import _cache

    shared = settings["shared"]
    if location.kind == _cache.REMOTE:
        return ("dir is itself a bucket (JAX's stock cache serves it, uncapped); set dir to a local directory to "
                "keep a local level in front of the bucket")
    if location.kind == _cache.OWN:
        return "JAX's own setting chose the directory (JAX's stock cache serves it)"
    if same_place(shared, location.root):
        return "it is the same directory as dir"
    if is_url(shared):  # fsspec and its backend; not etils, which only JAX's own remote cache needs
        import importlib.util

        from gkx_autocache import _remote

        missing = [name for name in ("fsspec", _remote.BACKENDS[_remote.scheme(shared)])
                   if importlib.util.find_spec(name) is None]
        return f"{', '.join(missing)} not installed: pip install '{_remote.EXTRA}'" if missing else None
    return None


def setup(settings: Any, location: Any, jax_version: str, env: Mapping[str, str]) -> tuple[Level | None, list[tuple[str, str]]]:
    """The shared level for this process, or None; and the problems worth a warning (each one
    line: the run goes on with the local level). Builds objects only: no I/O."""
    shared = settings["shared"]
    if shared is None or not location.version_dir:
        return None, []
    where = settings.origin("shared")
    why = problem(settings, location)
    if why is not None:
        return None, [(f"shared:{shared}", f"{where}: shared {shared} not used, {why}; running with the local level only")]
    backend = backend_for(shared, jax_version, bool(settings["trust_shared"]))
    cap = settings["max_size"]
    level = Level(shared, backend, local=location.version_dir, timeout=settings["shared_timeout"],
                  writes=uploads(settings["shared_write"], env), secret=_signing_key(env),
                  max_entry=min(cap, MAX_ENTRY) if cap else MAX_ENTRY,
                  origin=settings.origin("shared_timeout"))
    return level, []


def backend_for(shared: str, jax_version: str, team: bool) -> Bucket | Directory:
    if is_url(shared):
        return Bucket(f"{shared.rstrip('/')}/{version_name(jax_version)}")
    return Directory(shared, jax_version, team)


def _signing_key(env: Mapping[str, str]) -> bytes | None:
    from gkx_autocache._settings import signing_key

    return signing_key(env)


def at_exit(level: Level, recorder: Any) -> None:
    """Finish the uploads while thread pools still take work (s3fs and gcsfs need them; by the
    time ``atexit`` runs, ``concurrent.futures`` refuses new futures), and before the ledger is
    closed. ``threading._register_atexit`` hooks run last-registered first, before ``atexit``."""
    import concurrent.futures.thread  # noqa: F401  (registers its hook before ours)

    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(level.finish, recorder)
            return
    except RuntimeError:  # already shutting down
        return
    import atexit

    atexit.register(level.finish, recorder)


# -- rank-local writes (SPEC §14, multi-host) ---------------------------------------------------


def rank_local_writes(jax: Any, version_dir: str) -> str | None:
    """With a shared level, the local level is this host's own: let every rank write its own
    compiles there (process 0 alone still writes the shared level, JAX's rule, which is there to
    spare a shared file system or bucket many writers). On CPU each rank's keys include its
    devices, so without this a rank other than 0 would compile again on every run. Why not, or
    None. Guarded like the store: JAX's own rule stays if the seam has changed."""
    try:
        from jax._src import compilation_cache as cc
        from jax._src import compiler, distributed
    except Exception as exc:  # pragma: no cover - a JAX without the modules
        return f"jax._src.compiler cannot be imported ({exc})"
    write = getattr(compiler, "_cache_write", None)
    put = getattr(cc, "put_executable_and_time", None)
    if (write is None or _parameters(write)[:5] != ["cache_key", "compile_time_secs", "module_name", "backend", "executable"]
            or put is None or _parameters(put) != ["cache_key", "module_name", "executable", "backend", "compile_time"]
            or not hasattr(getattr(distributed, "global_state", None), "process_id")):
        return "jax._src.compiler._cache_write or compilation_cache.put_executable_and_time has changed"

    def _cache_write(cache_key: str, compile_time_secs: float, module_name: str, backend: Any, executable: Any,
                     *rest: Any, **kwargs: Any) -> None:
        try:
            other_rank = distributed.global_state.process_id != 0 and jax.config.jax_compilation_cache_dir == version_dir
            callbacks = rest[0] if rest else kwargs.get("host_callbacks")
            minimum = jax.config.jax_persistent_cache_min_compile_time_secs
        except Exception:
            other_rank = False
        if not other_rank or callbacks or compile_time_secs < minimum:  # JAX's other reasons stay JAX's
            return write(cache_key, compile_time_secs, module_name, backend, executable, *rest, **kwargs)  # type: ignore[no-any-return]
        try:
            put(cache_key, module_name, executable, backend, int(compile_time_secs))
        except Exception as exc:
            logger.debug("rank-local write of %s failed: %s", cache_key, exc)
        return None

    _cache_write.__wrapped__ = write  # type: ignore[attr-defined]
    compiler._cache_write = _cache_write
    return None


# -- status -------------------------------------------------------------------------------------


def probe(backend: Any, timeout: float) -> dict[str, Any]:
    """Whether the shared level answers, bounded by the timeout (``status`` only): for a bucket, a
    listing of its version prefix; for a directory, its trust and its entries."""
    started = time.monotonic()

    def look(progress: Progress) -> dict[str, Any]:
        found: dict[str, Any] = {}
        if backend.kind == "bucket":
            names = backend.listing(progress)
            if names == NOT_LISTED:  # it answered, and cannot say how many: never "more than 1000"
                return {"entries": None, "listing": names}
            if isinstance(names, str):
                return {"entries": names}
        else:
            found["writable"] = backend.prepare(progress, create=False)  # status creates nothing
            names = {n: 0 for n in os.listdir(backend.where)}
        found["entries"] = sum(1 for n in names if (m := key_match(n)) and m[1] == ENTRY_SUFFIX)
        seal = next((n for n in names if n.endswith(SEAL_SIDECAR) and key_match(n)), None)
        if seal is not None:  # whether its writers sign: a reader without the key checks nothing
            found["signed"] = b'"hmac"' in backend.small(seal)
        return found

    try:
        found = bounded(look, timeout)
    except Exception as exc:
        return {"answers": False, "error": describe(exc), "secs": round(time.monotonic() - started, 3)}
    return {"answers": True, **found, "secs": round(time.monotonic() - started, 3)}


UNCHECKED = ("not set, and this level's entries carry signatures: this process does not check them (an entry "
             "planted there is loaded); set GKX_JAX_CACHE_SIGNING_KEY to check them")


def describe_levels(settings: Any, location: Any, jax_version: str | None, env: Mapping[str, str],
                    probing: bool) -> dict[str, Any] | None:
    """Both levels for ``status``: where each is, its trust, whether the shared one is written and
    signed, and (with ``probing``) whether it answers. None without a shared level."""
    shared = settings["shared"]
    if shared is None:
        return None
    secret = _signing_key(env)
    local = {"dir": location.version_dir if location is not None else None,
             "trust": ("a team directory (trust_shared)" if getattr(location, "team", False) else "private to you")}
    info: dict[str, Any] = {
        "url": shared, "origin": settings.origin("shared"), "kind": "bucket" if is_url(shared) else "directory",
        "trust": ("the bucket's access policy" if is_url(shared) else
                  "a team directory (trust_shared)" if settings["trust_shared"] else "yours or root's, no one else's"),
        "writes": uploads(settings["shared_write"], env) or f"on (shared_write = {settings['shared_write']})",
        "timeout": settings["shared_timeout"],
        "signing": ("set (env GKX_JAX_CACHE_SIGNING_KEY): uploads are signed, unsigned entries never loaded"
                    if secret is not None else "not set: entries are neither signed nor checked"),
        "cap": "none: the shared level is never pruned by itself; `gkx-autocache prune --shared` or a bucket "
               "lifecycle rule keeps it",
    }
    why = problem(settings, location) if location is not None else "no local level"
    if why is not None or jax_version is None:
        info["unused"] = why or "JAX is not installed"
        return {"local": local, "shared": info}
    backend = backend_for(shared, jax_version, bool(settings["trust_shared"]))
    info["version_dir"] = backend.where
    info["probe"] = probe(backend, settings["shared_timeout"]) if probing else "skipped (--no-probe)"
    if secret is None and isinstance(info["probe"], dict) and info["probe"].get("signed"):
        info["signing"] = UNCHECKED
    return {"local": local, "shared": info}


def shown(counts: dict[str, Any]) -> dict[str, Any]:
    """One level's numbers as ``stats --json`` and ``status`` show them: the sums, and the mean
    read time in place of its two parts."""
    out = {name: counts.get(name, 0) for name in COUNTS if name not in ("read_secs", "reads")}
    reads = counts.get("reads", 0)
    out["mean_read_secs"] = round(counts.get("read_secs", 0.0) / reads, 6) if reads else None
    return out


def line(levels: dict[str, Any]) -> str:
    """``local 9 hits, 2 misses, 0.3 ms a read; shared 3 hits (3 backfilled), 4 uploads, ...``, from
    the levels as ``shown`` gives them."""
    parts = []
    for level in ("local", "shared"):
        c = levels.get(level) or {}
        mean = c.get("mean_read_secs")
        text = f"{level} {plural(int(c.get('hits', 0)), 'hit')}, {plural(int(c.get('misses', 0)), 'miss', 'misses')}"
        if level == "shared":
            text += (f" ({int(c.get('backfills', 0))} backfilled, {int(c.get('rejected', 0))} rejected), "
                     f"{int(c.get('uploads', 0))} uploads")
            for name in ("skipped", "dropped", "errors", "timeouts"):
                if c.get(name):
                    text += f", {int(c[name])} {'uploads ' + name if name in ('skipped', 'dropped') else name}"
        if mean is not None:
            text += f", {mean * 1000:.1f} ms a read"
        parts.append(text)
    return "; ".join(parts)


def level_lines(levels: dict[str, Any]) -> list[str]:
    """``status``'s human text for both levels."""
    local, shared = levels["local"], levels["shared"]
    lines = ["levels", f"  local    {local['dir'] or 'none'}  ({local['trust']})",
             f"  shared   {shared.get('version_dir') or shared['url']}  ({shared['kind']}; trust: {shared['trust']})"]
    if shared.get("unused"):
        lines.append(f"           not used: {shared['unused']}")
        return lines
    found = shared.get("probe")
    if isinstance(found, dict) and found.get("answers") and found.get("entries") is None:
        lines.append(f"           answers in {found['secs']:.2f} s; entries {found.get('listing') or 'not counted'}")
    elif isinstance(found, dict) and found.get("answers"):
        lines.append(f"           answers: {found['entries']} entries, in {found['secs']:.2f} s")
    elif isinstance(found, dict):
        lines.append(f"           does not answer (in {found['secs']:.1f} s): {found['error']}")
    else:
        lines.append(f"           probe {found}")
    lines += [f"           uploads: {shared['writes']}; timeout {shared['timeout']:g} s",
              f"           signing key: {shared['signing']}", f"           cap: {shared['cap']}"]
    return lines
