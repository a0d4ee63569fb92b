"""Names on disk (SPEC §7), shared by the store, the ledger, trust, pruning, the CLI and bundles, and
the start-up hook's two names (its finder's, its target's). A leaf: stdlib only, nothing of the package. ::

    <root>/CACHEDIR.TAG                   only when the package created <root>
    <root>/jax-<jax version>/             one version directory per JAX version
        CACHEDIR.TAG                      the package's own tag text (TAG)
        <key>-cache                       JAX's entry, JAX's name and format
        <key>-gkx-compile, -gkx-record    the package's sidecars begin with the key (a record: §18)
        <key>-gkx-shared                  a shared level's seal: size, sha256, compile time, HMAC (§14);
                                          beside a local entry, the seal a signing key vouched for it with
        <hash>-gkx-manifest, -gkx-pack    a shared level's: what a program's run looked up (prefetch, §14)
        .<name>.<pid>.<thread>.tmp        temporary files begin with a dot
        .gkx-autocache/                   the package's bookkeeping
            store.json                    which store serves the directory (for `status`)
            ledger/<pid>-<ns>.jsonl       one append-only ledger per process
            summary.json                  the ledgers of finished processes, folded
            index                         what each entry's key was made of (for `explain`)
            prune.lock, fold.lock         taken (non-blocking) to prune and fold; fold.lock: O_EXCL, no flock
            no-flock                      this file system has no working flock (said once)
            leases/<key>                  a key a process compiles now: host, pid, expected time (O_EXCL)
            programs/<program>, rebuild.lock  a program's records, one line each; one rebuild at a time

A key is JAX's: the function's module name, a dash, a sha256 in hex (``jit_step-<64 hex>``).
A bucket (``s3://``, ``gs://``) has the same names under its version prefix, and so has a shared
level (SPEC §14), a bucket or a directory.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

TARGET = "jax"  # the module whose import configures the cache (``__init__`` and the .pth line keep copies)
FINDER = "GkxAutocacheFinder"  # the finder's name, the package's class and the .pth line's function alike
VERSION_PREFIX = "jax-"
TAG_NAME = "CACHEDIR.TAG"
TAG = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by gkx-autocache (JAX compilation cache).\n"
    "# For information about cache directory tags, see https://bford.info/cachedir/\n"
)
ENTRY_SUFFIX = "-cache"
COMPILE_SIDECAR = "-gkx-compile"
SEAL_SIDECAR = "-gkx-shared"  # beside an entry of a shared level (SPEC §14), written before it
MANIFEST_SUFFIX = "-gkx-manifest"  # in a shared level: the keys a program's run looked up (prefetch)
PACK_SUFFIX = "-gkx-pack"  # beside a manifest in a bucket: the first of its entries, with their seals, in one object
AUTOTUNE_SUFFIX = "-gkx-autotune"  # beside a manifest: XLA's GPU autotune results (``_autotune``), its SHA-256 in it
RECORD_SIDECAR = "-gkx-record"  # beside an entry: its module and what its compile options are built from (rebuild)
META_DIR = ".gkx-autocache"
LEDGER_DIR = "ledger"
LEASE_DIR = "leases"  # a key's lease while a process compiles it (``_local.lease``)
LEDGER_SUFFIX = ".jsonl"
VERDICT_FILE = "store.json"
SUMMARY_FILE = "summary.json"
COUNT_FILE = "count"  # the entries and bytes of the version directory, as of its modification time (``_entries.count``)
LOCK_FILE = "prune.lock"
EXCL_LOCK_FILE = "fold.lock"
NO_FLOCK_FILE = "no-flock"
INDEX_FILE = "index"
PROGRAMS_DIR = "programs"
REBUILD_LOCK = "rebuild.lock"
TMP_SUFFIX = ".tmp"

JAX_ATIME = "-atime"  # JAX's own LRU cache's access time beside an entry (its max_size)
# Every suffix the package reads and removes: JAX's two and the package's own. A file beside them
# with another suffix (a model's ``weights-<sha256>-weights``) is not the cache's: never touched.
OWN_SUFFIXES = (COMPILE_SIDECAR, SEAL_SIDECAR, MANIFEST_SUFFIX, PACK_SUFFIX, AUTOTUNE_SUFFIX, RECORD_SIDECAR)  # the package's alone
KNOWN_SUFFIXES = (ENTRY_SUFFIX, JAX_ATIME, *OWN_SUFFIXES)
_KEY = (r"(?P<key>[^/\\\s]+-[0-9a-f]{64})(?P<suffix>" + "|".join(KNOWN_SUFFIXES) + ")")  # compiled on first use
_TMP = r"\.(?P<name>.+)\.\d+\.\d+" + re.escape(TMP_SUFFIX)  # ``tmp_name``'s: the name it replaces, a pid, a thread


def version_name(jax_version: str) -> str:
    return VERSION_PREFIX + jax_version


def is_url(path: str) -> bool:
    """``s3://…`` and ``gs://…`` (any ``scheme://``): a bucket, not a local directory."""
    return "://" in path


def is_own_tag(data: bytes) -> bool:
    """The package's own tag, whole: cargo, ccache and borg write the same first line."""
    return data == TAG.encode()


# The two names that make up nearly all of a cache: an ASCII identifier, a sha256 in hex, and the
# entry's or its compile-time sidecar's suffix; what the pattern takes among them (the tests check).
_COMMON = rf"[A-Za-z_][A-Za-z0-9_]*-[0-9a-f]{{64}}(?:{ENTRY_SUFFIX}|{COMPILE_SIDECAR})"
_compiled: list[re.Pattern[str]] = []


def _patterns() -> list[re.Pattern[str]]:
    if not _compiled:
        _compiled.extend((re.compile(_KEY), re.compile(_COMMON), re.compile(_TMP)))
    return _compiled


def common_name() -> Callable[[str], re.Match[str] | None]:
    """The test, one C call, for the two common names (``jit_f-<64 hex>-cache``, ``-gkx-compile``):
    a name it matches is one ``key_match`` takes, so a loop over a whole directory needs nothing
    more for them (``count``)."""
    return _patterns()[1].fullmatch


def key_match(name: str) -> tuple[str, str] | None:
    """``(key, suffix)`` of an entry or a sidecar, else None: the whole name, printable, with no
    separator or white space (a bundle's member name is outside input). The two common names are
    read by the shorter pattern first: 200 000 full patterns were a third of ``status`` and
    ``prune`` on 100 000 entries. The tests check that both ways agree."""
    patterns = _patterns()
    if patterns[1].fullmatch(name) is not None:
        suffix = ENTRY_SUFFIX if name.endswith(ENTRY_SUFFIX) else COMPILE_SIDECAR
        return name[:-len(suffix)], suffix
    # Non-ASCII names (3.13's identifiers take invisible joiners) and the rare suffixes: the pattern.
    match = patterns[0].fullmatch(name) if name.isprintable() else None
    return (match["key"], match["suffix"]) if match else None


def is_temporary(name: str, bookkeeping: bool = False) -> bool:
    """Whether ``name`` is one of the package's own temporary files (``tmp_name``'s pattern, with
    its pid and thread), of an entry or a sidecar (``bookkeeping``: of any file of the package's own
    folder). Another tool's hidden ``.draft.tmp`` beside the cache is not."""
    if not (name.startswith(".") and name.endswith(TMP_SUFFIX)):
        return False
    match = _patterns()[2].fullmatch(name)
    return match is not None and (bookkeeping or key_match(match["name"]) is not None)


def function_name(key: str) -> str:
    """JAX's keys begin with the module name: ``jit_step-<sha256>`` -> ``jit_step``."""
    return key.rsplit("-", 1)[0]


def tmp_name(name: str, pid: int, thread: int) -> str:
    """A temporary file's name beside ``name``: hidden, and unique per process and thread."""
    return f".{name}.{pid}.{thread}{TMP_SUFFIX}"
