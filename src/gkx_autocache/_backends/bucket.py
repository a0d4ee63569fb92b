"""The shared level in a bucket (``s3://``, ``gs://``, through fsspec): bounded listings of its
version prefix, ranged reads that never hold more than was asked for, and whole-object writes.
Design: docs/how-it-works.md.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from gkx_autocache._backends.port import Listed, Progress, Refused, TooLarge, Uncounted
from gkx_autocache._diagnostics import human_bytes
from gkx_autocache._formats import SEAL_LIMIT
from gkx_autocache._jax import versions as jax_versions
from gkx_autocache._layout import ENTRY_SUFFIX, SEAL_SIDECAR, version_name
from gkx_autocache._shared.calls import FIRST_BLOCK, bounded, refused

LIST_LIMIT = 1000  # one S3 listing page
NOT_LISTED = Uncounted("not counted: this filesystem cannot list a bounded page")


class RangeIgnored(OSError):
    """The endpoint answered a ranged read with the whole object: every read would do the same, so
    the level turns off (one line naming it), rather than each entry being rejected in turn."""



def _no_retry_when_refused(caught_exception: BaseException | None = None, **kwargs: Any) -> bool | None:
    """botocore's ``needs-retry`` handler, registered first: a refused connection is not retried
    (botocore's default retries it with backoff for up to ~15 s, longer than ``shared_timeout``'s
    default, and the level was then told to be stalled). False is "no retry" to aiobotocore's
    emitter; None leaves the decision to botocore's own handler."""
    return False if refused(caught_exception) else None


_hooked_clients: weakref.WeakSet[Any] = weakref.WeakSet()  # s3fs's clients, each hooked once


async def _hooked(fs: Any, path: str) -> None:
    """Register ``_no_retry_when_refused`` on s3fs's client for ``path``'s bucket, once."""
    get_s3 = getattr(fs, "get_s3", None)
    if get_s3 is None or not hasattr(fs, "_call_s3"):
        return
    await fs.set_session()
    client = await get_s3(path.split("/", 1)[0])
    if client not in _hooked_clients:
        client.meta.events.register_first("needs-retry.s3", _no_retry_when_refused)
        _hooked_clients.add(client)


async def _read_range(fs: Any, path: str, start: int, end: int, progress: Progress | None = None) -> bytes | None:
    """Bytes ``start`` to ``end`` of an S3 object, None when it is not there. The body is read as a
    stream and stopped at the length asked for: s3fs's ``_cat_file`` reads whatever it is sent, so
    an endpoint that ignores ``Range`` would have a whole object (1 GB) held for a 4 KiB read.
    Raises RangeIgnored (the whole object, 200), EntryRefused (a 206 longer than its range). Each
    part is told to ``progress`` (a metered read's rate and bound)."""
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
            if progress is not None:
                progress.got(len(chunk))
        if have > asked and not ranged:
            raise RangeIgnored(f"the bucket's endpoint ignores Range: it sent more than the {human_bytes(asked)} "
                               f"asked of {key.rsplit('/', 1)[-1]}")
        if have > asked:
            raise Refused(f"the shared entry sent more than the {asked} bytes of its range")
        if ranged and (why := wrong_range(str(resp.get("ContentRange")), start, end, have)):
            raise Refused(f"the shared entry sent {why}")
        return b"".join(chunks)
    finally:
        body.close()  # a body left unread is dropped with its connection, never read on


def wrong_range(content_range: str, start: int, end: int, have: int) -> str | None:
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

    lists = True  # (``port.Backend``)
    sealed = False  # stock JAX writes entries here without a seal (a ``dir = s3://`` user)

    def __init__(self, version_url: str, said: str | None = None) -> None:
        self.where = version_url
        self.said = said  # for ``status``: why s3fs serves an ``s3://`` level (``s3.Deferred.opened``)
        self._fs: Any = None
        self._path = ""

    @classmethod
    def opened(cls, url: str, jax_version: str, env: Any, *, team: bool, over_http: bool) -> Bucket:
        """``schemes``' factory: the bucket's version prefix, through fsspec."""
        return cls(f"{url.rstrip('/')}/{version_name(jax_version)}")

    def describe(self) -> dict[str, str]:
        return {"credentials": self.said} if self.said else {}

    def caution(self) -> str | None:
        return None

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

    def streams(self) -> bool:
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
        if lsdir is not None and "max_items" in jax_versions.parameters(lsdir):  # s3fs
            infos = self._run(lambda fs, path: lsdir(path, refresh=True, max_items=LIST_LIMIT + 1))
            fs.invalidate_cache(path)  # a page is no complete listing: keep it out of fsspec's cache
        elif list_objects is not None and "max_results" in (jax_versions.parameters(list_objects)
                                                            + jax_versions.parameters(getattr(fs, "_do_list_objects", None))):
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

    def read(self, key: str, progress: Progress, admit: Callable[[bytes | None, int], tuple[int, bool]]) -> bytes | None:
        raise AssertionError("an object store's entry is read by ranges")  # first(), then block()

    def first(self, key: str, progress: Progress) -> tuple[bytes | None, bytes | None]:
        """The seal and the entry's first block, at once (one round trip); None for each that is
        not there."""
        fs, path = self.filesystem()
        names = [f"{path}/{key}{SEAL_SIDECAR}", f"{path}/{key}{ENTRY_SUFFIX}"]
        if self.streams():
            import asyncio

            got = self._run(lambda fs, path: asyncio.gather(_read_range(fs, names[0], 0, SEAL_LIMIT, progress),
                                                            _read_range(fs, names[1], 0, FIRST_BLOCK, progress),
                                                            return_exceptions=True))
        else:
            got = fs.cat_ranges(names, [0, 0], [SEAL_LIMIT, FIRST_BLOCK], on_error="return")
            progress.got(sum(len(item) for item in got if isinstance(item, bytes)))
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

    def small(self, name: str, limit: int = SEAL_LIMIT) -> bytes:
        """The first ``limit`` bytes of an object (a seal for ``status``, a manifest); empty when
        it is not there."""
        fs, path = self.filesystem()
        where = f"{path}/{name}"
        if self.streams():  # never more than asked for, whatever the endpoint sends
            return self._run(lambda fs, path: _read_range(fs, where, 0, limit)) or b""
        try:
            return _within(bytes(fs.cat_file(where, start=0, end=limit)), limit, name)
        except FileNotFoundError:
            return b""

    def stream(self, name: str, timeout: float) -> Stream | None:
        """An object as it arrives (a pack), each read of it bounded by ``timeout`` without
        progress; None where it is not there or this filesystem cannot stream one (gcsfs: each
        entry is then read on its own)."""
        if not self.streams():
            return None
        fs, path = self.filesystem()
        bucket, key = f"{path}/{name}".split("/", 1)
        try:
            resp = self._run(lambda fs, path: fs._call_s3("get_object", Bucket=bucket, Key=key))
        except FileNotFoundError:
            return None
        return Stream(fs.loop, resp["Body"], timeout)

    def block(self, key: str, start: int, end: int, progress: Progress | None = None) -> bytes:
        fs, path = self.filesystem()
        name = f"{path}/{key}{ENTRY_SUFFIX}"
        if self.streams():
            return self._run(lambda fs, path: _read_range(fs, name, start, end, progress)) or b""
        data = _within(bytes(fs.cat_file(name, start=start, end=end)), end - start, key + ENTRY_SUFFIX)
        if progress is not None:  # (gcsfs: the whole block at once)
            progress.got(len(data))
        return data

    def size(self, key: str) -> int:
        fs, path = self.filesystem()
        return int(fs.info(f"{path}/{key}{ENTRY_SUFFIX}")["size"])

    def compile_secs(self, key: str) -> float | None:
        return None  # a bucket's entries carry theirs in the seal

    def write(self, name: str, data: bytes) -> None:
        """One PUT of the whole bytes: the object appears whole or not at all. S3 refuses one above
        5 GiB (``EntityTooLarge``): that object's refusal (``port.TooLarge``), not the level's."""
        try:
            self._run(lambda fs, path: fs._pipe_file(f"{path}/{name}", data))
        except Exception as exc:
            if "EntityTooLarge" in str(exc):
                raise TooLarge(" ".join(str(exc).split())) from exc
            raise

    def names(self, progress: Progress) -> list[Listed]:
        """Every object directly under the version prefix, as fsspec lists it (all its pages)."""
        from gkx_autocache._remote import written

        try:
            infos = self._run(lambda fs, path: fs._ls(path, detail=True, refresh=True))
        except FileNotFoundError:
            return []
        progress.tick()
        return [(str(info["name"]).rstrip("/").rsplit("/", 1)[-1], int(info.get("size") or 0), written(info))
                for info in infos if info.get("type") != "directory"]

    def remove(self, name: str) -> None:
        try:
            self._run(lambda fs, path: fs._rm_file(f"{path}/{name}"))
        except FileNotFoundError:
            pass


class Stream:
    """An S3 object's body, read on fsspec's event loop in parts of 1 MiB or more (one hand-over
    to the loop's thread for many small records), each part a bounded call: ``take(n)``, its next
    ``n`` bytes (fewer only at its end); ``close()`` drops the connection of a body left unread
    (on the loop's thread). Progress is ``PROGRESS`` bytes received, never one chunk: an endpoint
    that drips a byte at a time (a bad proxy) stalls within one timeout."""

    PART = 1 << 20
    PROGRESS = 64 << 10

    def __init__(self, loop: Any, body: Any, timeout: float) -> None:
        self.loop = loop
        self.body = body
        self.timeout = timeout
        self.held = b""
        self.at = 0

    def take(self, n: int) -> bytes:
        if len(self.held) - self.at < n:
            self.held, self.at = self.held[self.at:] + self._more(n - (len(self.held) - self.at)), 0
        taken = self.held[self.at:self.at + n]
        self.at += len(taken)
        return taken

    def _more(self, need: int) -> bytes:
        """At least ``need`` more bytes (fewer at the end), and what else has come, to 1 MiB."""
        import fsspec.asyn

        async def go(progress: Progress) -> bytes:
            chunks, have, since = [], 0, 0
            while have < need and (chunk := await self.body.read(max(need - have, self.PART))):
                chunks.append(chunk)
                have += len(chunk)
                since += len(chunk)
                if since >= self.PROGRESS:
                    progress.tick()
                    since = 0
            return b"".join(chunks)

        data: bytes = bounded(lambda progress: fsspec.asyn.sync(self.loop, go, progress), self.timeout)
        return data

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.body.close)
