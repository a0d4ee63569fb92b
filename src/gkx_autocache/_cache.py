"""The cache directory (SPEC §4): where it is, and creating it safely. The names inside it are
``_layout``'s; who may write it is ``_trust``'s."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
from collections.abc import Iterator
from typing import Any

from gkx_autocache import _files, _mount, _trust
from gkx_autocache._diagnostics import logger
from gkx_autocache._layout import TAG, TAG_NAME, is_url, version_name
from gkx_autocache._userdirs import user_dir


def in_virtualenv(prefix: str = sys.prefix, base_prefix: str = sys.base_prefix) -> bool:
    """A venv (prefix differs from the base) or a conda environment (has conda-meta)."""
    return prefix != base_prefix or os.path.isdir(os.path.join(prefix, "conda-meta"))


def throwaway(prefix: str = sys.prefix) -> str | None:
    """Who rebuilds this environment for every run, so that a cache inside it would be cold every
    time (SPEC §4, amended 2026-12-04), or None: uv (``uv run --with``, ``uvx``: an environment in
    uv's cache, ``builds-v0/.tmp…``, ``archive-v0/…``, ``environments-v2/…``), pipx (``pipx run``:
    ``<PIPX_HOME>/.cache/<hash>``) or nox (``.nox/<session>``, recreated unless reused). By the
    names of the folders above it: string tests, cheap on the way of every ``import jax``."""
    parent = os.path.dirname(os.path.normpath(prefix))
    bucket, _, version = os.path.basename(parent).rpartition("-v")
    uv_cache = os.path.dirname(parent)  # uv's cache: ~/.cache/uv, or UV_CACHE_DIR
    named = os.environ.get("UV_CACHE_DIR", "")
    if bucket in ("builds", "archive", "environments") and version.isdigit() and (
            os.path.basename(uv_cache) == "uv" or (named and os.path.realpath(named) == os.path.realpath(uv_cache))):
        return "uv run --with and uvx"
    if os.path.basename(parent) == ".cache" and os.path.basename(os.path.dirname(parent)) in ("pipx", ".pipx"):
        return "pipx run"
    if os.path.basename(parent) == ".nox" and not os.path.basename(os.path.normpath(prefix)).startswith("."):
        return "nox"
    return None


def venv_root(prefix: str = sys.prefix) -> str:
    return os.path.join(prefix, ".cache", "gkx", "jax")


def user_root() -> str | None:
    """platformdirs' user cache path: ``~/.cache/gkx/jax`` on Linux, honouring XDG_CACHE_HOME; None
    for a user without a home (``user_dir``)."""
    cache = user_dir("cache", "gkx")
    return None if cache is None else os.path.join(cache, "jax")


def temp_root() -> str | None:
    """The user's own folder in the temporary directory, ``/tmp/gkx-<uid>/jax``: the default where
    the user cache cannot be used (``docker run --user 12345``: no passwd entry, HOME unset or
    ``/``). ``/tmp`` is root's and sticky, which the trust rules accept; the folder is made 0700,
    and one someone else made is refused. None where there is no uid (Windows)."""
    if not hasattr(os, "getuid"):
        return None
    import tempfile

    folder = tempfile.gettempdir()
    # tempfile takes a relative TMPDIR against the current directory, and falls back to the current
    # directory itself: a checkout would then choose the cache, as a relative XDG_CACHE_HOME would.
    named = {os.path.normpath(os.environ.get(v, "")) for v in ("TMPDIR", "TEMP", "TMP")}
    if folder not in {n for n in named if os.path.isabs(n)} | {"/tmp", "/var/tmp", "/usr/tmp"}:
        logger.debug("the temporary directory %s is not one the environment names absolutely: not used", folder)
        return None
    return os.path.join(folder, f"gkx-{os.getuid()}", "jax")


def homeless() -> bool:
    """Whether this user has no home of their own to cache in: ``docker run --user 12345`` sets
    HOME to ``/``, and no XDG_CACHE_HOME; the temporary directory is then its cache, said by
    ``status`` alone. (A broken XDG_CACHE_HOME, or a home that cannot be written, is said.)"""
    from gkx_autocache._userdirs import home

    return not os.path.isabs(os.environ.get("XDG_CACHE_HOME", "").strip()) and home() in (None, os.sep)


def squatted(temp: str) -> int | None:
    """The uid of someone else who made the user's folder of the temporary directory
    (``/tmp/gkx-<uid>``) first, or None: its name is known to every local user, and refused once
    made by another (SPEC §8), which would turn caching off for the uid."""
    try:
        st = os.lstat(os.path.dirname(temp))
    except OSError:
        return None
    return st.st_uid if st.st_uid != os.getuid() else None


def private_temp_root(temp: str, create: bool) -> str | None:
    """The user's second folder there, ``gkx-<uid>-<random>`` (``mkdtemp``: 0700, a name no one
    can guess), found again by the next run among the names of that prefix by its owner and mode,
    which no one else can give a folder of theirs; None where there is none (``create`` False: the
    commands make nothing) or it cannot be made."""
    import tempfile

    folder, base = os.path.split(os.path.dirname(temp))
    prefix, uid = base + "-", os.getuid()
    try:
        names = sorted(name for name in os.listdir(folder) if name.startswith(prefix))
    except OSError:
        return None
    for name in names:
        try:
            st = os.lstat(os.path.join(folder, name))
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and stat.S_IMODE(st.st_mode) == 0o700:
            return os.path.join(folder, name, "jax")
    if not create:
        return None
    try:
        return os.path.join(tempfile.mkdtemp(prefix=prefix, dir=folder), "jax")
    except OSError as exc:
        logger.debug("no private folder in %s: %s", folder, exc)
        return None


class DirectoryRefused(Exception):
    """The directory cannot hold the cache; the message says why, in words for the user."""

    @property
    def cause(self) -> str:
        """Why, without the trust rules' fix (``chmod o-w``, which is no fix for someone else's
        directory)."""
        return str(self).split("; ", 1)[0]


def refused_note(what: str, refused: DirectoryRefused, unread: bool) -> str:
    """The one warning for a directory JAX was given that the trust rules refuse (SPEC §5/§8, amended
    2026-12-06): what happens instead, and a fix the user can make whoever owns it. ``unread``:
    JAX reads no entry of it (the default); else ``read_untrusted_dir`` let JAX's own cache read it."""
    if not unread:
        return (f"{what} is not served by gkx-autocache's store, {refused.cause}; JAX's own cache reads it unchecked, "
                "as read_untrusted_dir asks")
    return (f"{what} is refused, {refused.cause}: JAX reads no entry from it and writes none, so those compiles are "
            "not cached; give JAX a directory of your own (or leave jax_compilation_cache_dir unset: gkx-autocache's "
            "own directory serves), or set read_untrusted_dir = true to let JAX's own cache read it unchecked")


class Prepared:
    """A checked directory: its root, its version directory, whether this process can write it, and
    the bucket mount it lies on (``_mount``), if any. A plain class: a NamedTuple costs ~0.3 ms to
    create, on the way of every `import jax`."""

    __slots__ = ("root", "version_dir", "writable", "mount")

    def __init__(self, root: str, version_dir: str, writable: bool, mount: _mount.Mount | None = None) -> None:
        self.root, self.version_dir, self.writable, self.mount = root, version_dir, writable, mount


def prepare(root: str, jax_version: str | None, team: bool = False, create: bool = True) -> Prepared:
    """Create (if needed) and check ``root/jax-<version>``; with no version, ``root`` itself (a
    directory someone else gave JAX, ``_adopted``), tagged only where created. Raises DirectoryRefused.

    ``root`` is made canonical first: where XLA's GPU caches are on, the path enters JAX's cache
    key, so two spellings of one directory would never hit each other. With ``create=False``
    (the CLI) nothing is created, and a missing directory is judged by where it would be made.
    """
    fuse = _mount.fuse_mount(root, fresh=True)  # (the mounts read again: a framework may name one mounted since)
    if (planted := _trust.links_problem(root) or _mount.link_problem(root)) is not None:
        raise DirectoryRefused(planted)
    root = os.path.realpath(os.path.abspath(root))
    version_dir = os.path.join(root, version_name(jax_version)) if jax_version is not None else root
    if os.path.islink(version_dir):  # nothing of the package ever passes through a symlink below the root
        raise DirectoryRefused(f"{version_dir} is a symlink; the package makes its version directories itself: remove the link")
    if fuse is not None and (problem := fuse.problem()):
        raise DirectoryRefused(problem)
    mount = fuse if fuse is not None and fuse.tool is not None else None  # a bucket: files written whole
    nearest = _nearest_existing(root)
    problem = _trust.ancestors_problem(root if nearest == root else os.path.join(nearest, "x"), team)
    if problem:
        raise DirectoryRefused(problem)
    created = False
    for path in dict.fromkeys((root, version_dir)):
        if create and _make_dir(path, team, mount is not None):
            created = True
        if path == root and created and (problem := _trust.ancestors_problem(root, team)):
            raise DirectoryRefused(problem)  # again, now that they exist: one may have been swapped in meanwhile
        if not create and not os.path.lexists(path):
            parent = _nearest_existing(path)
            if not os.access(parent, os.W_OK | os.X_OK):  # the run would fail to make it: said as the run says it
                raise DirectoryRefused(f"it cannot be created: {os.strerror(errno.EACCES)} ({path})")
            continue
        problem = _trust.directory_problem(path, team)
        if problem:
            raise DirectoryRefused(problem if path == root else f"{version_dir}: {problem}")
    if create and (jax_version is not None or created) and not os.path.lexists(os.path.join(version_dir, TAG_NAME)):
        _write_tag(version_dir, mount is None)  # one someone else made (trusted, above) is the cache's all the same
    if mount is not None and (problem := _mount_files_problem(version_dir, team)):
        raise DirectoryRefused(problem)
    writable = os.access(version_dir if os.path.isdir(version_dir) else _nearest_existing(version_dir), os.W_OK)
    return Prepared(root, version_dir, writable, mount)


LOCAL, REMOTE, OWN, STOCK = "local", "remote", "own", "stock"
STOCK_NOTE = ("on Windows JAX's own cache serves {dir}, with gkx-autocache's thresholds; the package's store, cap, "
              "trust checks, records and explanations are POSIX-only and do not run here")
NOT_KEPT = ("not kept: {dir} is your own JAX directory (JAX_COMPILATION_CACHE_DIR), which gkx-autocache leaves as "
            "you set it, with no records (each run's report line still counts its lookups)")


class Location:
    """Where JAX's entries go, and what kind of place it is (a plain class: a dataclass costs
    about 1 ms of ``import jax`` to create):

    - ``local``: a directory the package resolved and checked: its store, cap and ledger serve it;
    - ``remote``: a bucket (``s3://``, ``gs://``): JAX's stock cache, uncapped (SPEC §9);
    - ``own``: the user's own JAX setting (``JAX_COMPILATION_CACHE_DIR``, ``jax.config``): JAX's
      stock cache, the thresholds only, nothing checked or counted (SPEC §5);
    - ``stock``: on Windows, the directory the package chose for JAX's stock cache (``windows``).

    ``version_dir`` is None when no directory can be used; ``problems`` then say why.
    """

    def __init__(self, kind: str | None = None, version_dir: str | None = None, root: str | None = None,
                 writable: bool = False, rule: str = "", team: bool = False, mount: _mount.Mount | None = None) -> None:
        self.kind = kind
        self.version_dir = version_dir
        self.root = root
        self.writable = writable
        self.rule = rule  # how it was chosen, for `status`
        self.team = team  # a team directory (§8): group-writable entries and bookkeeping
        self.mount = mount  # the bucket mount it lies on: written whole, no bookkeeping (``_mount``)
        self.served = kind == LOCAL  # the store serves it (the user's own JAX directory, where trusted, too)
        self.refused = False  # the user's own JAX directory, refused by the trust rules: JAX reads none of it
        self.tried: list[tuple[str, str]] = []  # (root, why not)
        self.problems: list[tuple[str, str]] = []  # (cause, one-line message)

    @property
    def local(self) -> bool:
        """A local directory the store serves, its records and explanations kept."""
        return self.served and self.version_dir is not None

    @property
    def packages(self) -> bool:
        """The package's own choice of directory: capped at ``max_size`` by default."""
        return self.kind == LOCAL

    @property
    def remote(self) -> bool:
        """A bucket as JAX's own directory: JAX's stock cache, uncapped (SPEC §9)."""
        return self.kind == REMOTE

    @property
    def users_own(self) -> bool:
        """Chosen by the user's own JAX setting (SPEC §5): its thresholds are left as they are."""
        return self.kind == OWN

    @property
    def stock(self) -> bool:
        """On Windows: the directory the package chose, served by JAX's stock cache."""
        return self.kind == STOCK

    @property
    def keeps_books(self) -> bool:
        """Whether the ledger, the verdict and the cap are kept here: a local directory the package
        resolved and may write, not on a bucket mount (which has no appends, locks or replaces)."""
        return self.local and self.writable and self.mount is None

    @property
    def stock_reason(self) -> str | None:
        """Why JAX's stock cache, not the package's store, serves it (as ``status`` says it), or None."""
        if self.refused:
            return "refused by the trust rules: JAX reads no entry from it and writes none (see attention)"
        if self.users_own and not self.local:
            return ("the directory is the user's own (JAX_COMPILATION_CACHE_DIR), and not one gkx-autocache's store "
                    "may serve")
        if self.remote:
            return "remote directories use JAX's stock cache, uncapped; their trust is the bucket's access policy"
        if self.stock:
            return "on Windows the package's store is not used (it is POSIX-only)"
        return None


def locate(settings: Any, jax_version: str, prefix: str = sys.prefix, create: bool = True) -> Location:
    """The version directory for JAX and its kind (SPEC §4, §5, §9): the one answer configuration
    and every command use.

    The user's own JAX directory is taken as it is. An explicit ``dir`` is used or refused, never
    replaced: the user asked for that place. The default is the environment's own
    ``<prefix>/.cache/gkx/jax``, else the user cache, else the user's own folder of the temporary
    directory; failing over between them is normal (a shared conda environment, someone else's
    venv, a uid without a home) and silent. A URL is kept verbatim, with the
    version added. With ``create=False`` (the commands) nothing is created.
    """
    if settings.from_jax("dir"):  # served by the store as it is, where local and trusted (SPEC §5, amended 2026-12-04)
        own = str(settings["dir"])
        rule = settings.origin("dir")
        if is_url(own) or os.name == "nt":
            return Location(OWN, own, writable=is_url(own) or os.access(own, os.W_OK), rule=rule)
        try:
            prepared = prepare(own, None, create=create)
        except DirectoryRefused as exc:
            location = Location(OWN, own, writable=os.access(own, os.W_OK), rule=rule)
            location.tried.append((own, str(exc)))
            location.refused = not settings["read_untrusted_dir"]
            location.problems.append((f"dir:{own}", refused_note(f"{rule}: {own}", exc, location.refused)))
            return location
        found = Location(OWN, prepared.version_dir, prepared.root, prepared.writable, rule, mount=prepared.mount)
        found.served = True
        return found
    explicit = settings["dir"]
    if os.name == "nt" and not (explicit is not None and is_url(explicit)):
        return windows(settings, jax_version, create)
    grouped = team(settings, explicit)
    if explicit is not None:
        where = settings.origin("dir")
        location = Location(rule=f"dir from {where}")
        if is_url(explicit):  # kept verbatim; the bucket's access policy is its trust (§9)
            from gkx_autocache import _remote

            why = _remote.unsupported(explicit)
            if why is None:
                root = explicit.rstrip("/")
                return Location(REMOTE, f"{root}/{version_name(jax_version)}", root, True, location.rule)
        else:
            try:
                prepared = prepare(explicit, jax_version, grouped, create)
            except DirectoryRefused as exc:
                why = str(exc)
            else:
                if not prepared.writable:
                    logger.debug("%s is read-only: entries are read, none are written", prepared.version_dir)
                return Location(LOCAL, prepared.version_dir, prepared.root, prepared.writable, location.rule, grouped,
                                prepared.mount)
        location.tried.append((explicit, why))
        location.problems.append((f"dir:{explicit}", f"{where}: dir {explicit} not used, {why}; running uncached"))
        return location

    location = Location()

    def roots() -> Iterator[tuple[str, str]]:  # the user root is computed only when needed
        rebuilt = throwaway(prefix) if in_virtualenv(prefix) else None
        if in_virtualenv(prefix) and rebuilt is None:
            yield venv_root(prefix), "default: the environment's own"
        user = user_root()
        if user is not None:
            yield user, f"default: the user cache, as {rebuilt} rebuild their environments" if rebuilt else \
                "default: the user cache"
        temp = temp_root()
        if temp is not None:
            why = "the user cache cannot be used" if user else "this user has no home directory"
            logger.debug("%s: the temporary directory's %s is next", why, temp)
            yield temp, f"default: the temporary directory, as {why}"
            if (squatter := squatted(temp)) is not None and (second := private_temp_root(temp, create)) is not None:
                yield second, (f"default: a private folder of the temporary directory, as {why} and "
                               f"{os.path.dirname(temp)} is uid {squatter}'s")

    for root, rule in roots():
        grouped = team(settings, root)
        try:
            prepared = prepare(root, jax_version, grouped, create)
        except DirectoryRefused as exc:
            location.tried.append((root, str(exc)))
            logger.debug("default directory %s refused: %s", root, exc)
            continue
        if prepared.writable:
            found = Location(LOCAL, prepared.version_dir, prepared.root, True, rule, grouped, prepared.mount)
            found.tried = location.tried
            user = user_root()
            if "temporary directory" in rule and (broken := dict(location.tried).get(user or "")) is not None \
                    and not homeless():
                # Said: a cache setting the user may not know is broken, and a cache cleared at reboot.
                found.problems.append(("dir:user-cache", f"the user cache {user} cannot be used, {broken}; caching in "
                                                         f"{prepared.root} instead, which is cleared at reboot: fix "
                                                         "XDG_CACHE_HOME (or HOME), or set GKX_JAX_CACHE_DIR"))
            return found
        location.tried.append((root, "not writable"))
        logger.debug("default directory %s is not writable", prepared.version_dir)
    reasons = "; ".join(f"{root}: {why}" for root, why in location.tried)
    location.problems.append(("dir:default", f"no usable cache directory ({reasons}); set GKX_JAX_CACHE_DIR; running uncached"))
    return location


def windows(settings: Any, jax_version: str, create: bool = True) -> Location:
    """Windows (issue 46): JAX's stock cache in ``dir``, else in the user cache
    (``%LOCALAPPDATA%\\gkx\\gkx\\Cache\\jax``), with the package's thresholds. The store works
    through POSIX descriptors (``O_NOFOLLOW``, ``dir_fd``, ``fchmod``) and its trust rules read
    POSIX owners and modes: neither has a sound Windows form here, so neither runs, and
    ``STOCK_NOTE`` says so. The user cache lies in the profile, which Windows' default ACLs give to
    the user alone; a ``dir`` elsewhere is not checked."""
    explicit = settings["dir"]
    rule = f"dir from {settings.origin('dir')}" if explicit is not None else "default: the user cache"
    root = str(explicit) if explicit is not None else user_root()
    location = Location(rule=rule)
    if root is None:
        location.problems.append(("dir:default", "no user cache directory; set GKX_JAX_CACHE_DIR; running uncached"))
        return location
    root = os.path.abspath(root)
    version_dir = os.path.join(root, version_name(jax_version))
    try:
        if create and not os.path.isdir(version_dir):
            os.makedirs(version_dir, exist_ok=True)  # processes that start together: each may make it
            with contextlib.suppress(FileExistsError), open(os.path.join(version_dir, TAG_NAME), "xb") as f:
                f.write(TAG.encode("ascii"))  # `clear` knows a cache by its tag
        elif not create and not os.path.isdir(nearest := _nearest_existing(version_dir)):  # judged as a run would
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), nearest)
    except OSError as exc:
        why = f"it cannot be created: {exc.strerror or exc} ({exc.filename or version_dir})"
        location.tried.append((root, why))
        where = f"{settings.origin('dir')}: dir {root}" if explicit is not None else f"the user cache {root}"
        fix = "" if explicit is not None else "; set GKX_JAX_CACHE_DIR"
        location.problems.append((f"dir:{root}", f"{where} not used, {why}{fix}; running uncached"))
        return location
    writable = os.access(version_dir if os.path.isdir(version_dir) else _nearest_existing(version_dir), os.W_OK)
    return Location(STOCK, version_dir, root, writable, rule)


def team(settings: Any, root: str | None) -> bool:
    """Whether ``trust_shared`` makes the local directory a team directory. With a shared level
    that is a directory, ``trust_shared`` is that level's (SPEC §14, amended 2026-12-02): the local
    level is then always private, a group-writable one refused, whoever made it so (a member who
    swapped a directory, a mistake). Otherwise ``trust_shared`` is the local directory's."""
    if not settings["trust_shared"]:
        return False
    other = settings.values["shared"].value if "shared" in settings.values else None
    return other is None or is_url(other)


def _nearest_existing(path: str) -> str:
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _mount_files_problem(version_dir: str, team: bool) -> str | None:
    """On a bucket mount, why the files it makes (of the mode its options give every file, as its
    tag shows) could not be trusted as entries, or None: else each entry written would be refused
    when read, run after run."""
    try:
        st = os.lstat(os.path.join(version_dir, TAG_NAME))
    except OSError:
        return None  # (a read-only mount: nothing is written there)
    if not stat.S_ISREG(st.st_mode):  # (a folder of that name in the bucket would hide the mode files get)
        return f"its {TAG_NAME} is not a file: the mode the mount gives files cannot be seen"
    why = _trust.entry_problem(st, team)
    if why is None:
        return None
    return (f"the files of this bucket mount show mode {stat.S_IMODE(st.st_mode):04o}, so each entry would be refused "
            f"({why}); mount it with a file mode of 0644, or 0660 and trust_shared for a team")


def _make_dir(path: str, team: bool, mounted: bool) -> bool:
    try:
        return _files.make_dir(path, team, TAG, mounted)
    except FileExistsError:
        raise DirectoryRefused(f"it cannot be created: {path} exists and is not a directory") from None
    except OSError as exc:
        raise DirectoryRefused(f"it cannot be created: {exc.strerror} ({path})") from None


def _write_tag(path: str, chmod: bool) -> None:
    """Through a descriptor opened without following a link at any level: never into a
    directory swapped in meanwhile. Without ``chmod`` (a bucket mount), in the mount's mode."""
    try:
        fd = _files.open_dir(path, search=True)
    except OSError:
        return
    try:
        _files.write_new_at(TAG_NAME, TAG.encode("ascii"), fd, chmod=chmod)
    finally:
        os.close(fd)
