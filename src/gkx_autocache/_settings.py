"""Settings: every value resolved with its origin. Pure: the environment, prefix and files come in.

The order, highest first (SPEC §3):

1. JAX's own explicit settings (``JAX_COMPILATION_CACHE_DIR`` and friends, or a value already
   changed in ``jax.config``): the caller passes them in as ``jax_explicit``, and the key is left
   exactly as the user set it.
2. ``GKX_JAX_CACHE*`` environment variables.
3. The environment's policy file, ``<sys.prefix>/gkx-autocache.toml``.
4. The user's config file, ``<user config dir>/config.toml``.
   (``GKX_JAX_CACHE_CONFIG_FILE`` names one file read in place of both, as ``PIP_CONFIG_FILE``
   does for pip; ``/dev/null`` reads none: a CI job or a test isolated from every file.)
5. The defaults.

A bad value in one source is skipped with a problem reported, and the next source down applies.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from gkx_autocache import _policy
from gkx_autocache._backends.schemes import SCHEMES
from gkx_autocache._diagnostics import shown
from gkx_autocache._layout import is_url

FALSE = frozenset({"0", "off", "false", "no", "none", "disable", "disabled"})
TRUE = frozenset({"1", "on", "true", "yes", "enable", "enabled"})
XLA_CACHES = ("all", "none", "xla_gpu_per_fusion_autotune_cache_dir", "xla_gpu_kernel_cache_file")


class BadValue(ValueError):
    """A value that does not parse; its message says what was expected."""


def parse_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str):
        word = raw.strip().lower()
        if word in TRUE:
            return True
        if word in FALSE:
            return False
    raise BadValue(f"expected a boolean (1/0, on/off, true/false, yes/no), got {shown(raw)}")


MAX_BYTES = 1 << 60  # an exbibyte: a size beyond any disk is a typo, not a setting
MAX_SECS = 1e9  # thirty years


def parse_float(raw: Any) -> float:
    try:
        value = float(raw.strip() if isinstance(raw, str) else raw) if not isinstance(raw, bool) else math.nan
    except (TypeError, ValueError, OverflowError):  # OverflowError: a TOML integer beyond any float
        value = math.nan
    if not 0 <= value <= MAX_SECS:  # NaN fails this too
        raise BadValue(f"expected a number of seconds from 0 to {MAX_SECS:g}, got {shown(raw)}")
    return value


def parse_entry_size(raw: Any) -> int:
    value = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str):
        try:
            value = int(raw.strip())
        except ValueError:  # also more digits than int() takes
            pass
    if value is None or not -1 <= value <= MAX_BYTES:
        raise BadValue(f"expected a whole number of bytes from -1 to {MAX_BYTES}, got {shown(raw)}")
    return value


_SIZE = r"(?i)^\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmgt])(i)?)?b?\s*$"  # compiled on first use, not on import
_POWER = {"k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(raw: Any) -> int:
    """``"5GiB"``, ``"800MB"``, ``"1.5G"``, ``123``; ``K``/``KB`` = 1000, ``KiB`` = 1024. Exact
    arithmetic (``Decimal``), so that no number of digits overflows."""
    value = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, float) and math.isfinite(raw) and 0 <= raw <= MAX_BYTES:
        value = int(raw)
    elif isinstance(raw, str) and len(raw) <= 100 and (match := re.match(_SIZE, raw)):
        from decimal import Decimal

        number, unit, binary = match.groups()
        scale = (1024 if binary else 1000) ** _POWER[unit.lower()] if unit else 1
        value = int(Decimal(number) * scale)
    if value is None or not 0 <= value <= MAX_BYTES:
        raise BadValue(f"expected a size like 5GiB, 800MB or a byte count up to 1EiB (0 = no cap), got {shown(raw)}")
    return value


_AGE = r"\s*(\d{1,12}(?:\.\d{0,12})?)\s*([smhdwSMHDW])\s*"
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(raw: str) -> float:
    """``"30d"``, ``"12h"``, ``"45m"``, ``"90s"``, ``"2w"``: seconds (``prune --older-than``)."""
    match = re.fullmatch(_AGE, raw)
    if match is None:
        raise BadValue(f"expected an age like 30d, 12h or 45m, got {shown(raw)}")
    return float(match[1]) * _AGE_UNITS[match[2].lower()]


def parse_xla_caches(raw: Any) -> str:
    if isinstance(raw, str) and raw.strip() in XLA_CACHES:
        return str(raw.strip())
    raise BadValue(f"expected one of {', '.join(XLA_CACHES)}, got {shown(raw)}")


def parse_cpu_target(raw: Any) -> str:
    from gkx_autocache._cpu_target import NAMES

    if isinstance(raw, str) and raw.strip().lower() in NAMES:
        return raw.strip().lower()
    raise BadValue(f"expected one of {', '.join(NAMES)}, got {shown(raw)}")


SHARED_WRITE = ("always", "ci", "never")
MAX_TIMEOUT = 3600.0  # an hour without progress is a dead endpoint, not a setting


def parse_shared_write(raw: Any) -> str:
    if isinstance(raw, str) and raw.strip().lower() in SHARED_WRITE:
        return raw.strip().lower()
    raise BadValue(f"expected one of {', '.join(SHARED_WRITE)}, got {shown(raw)}")


def parse_timeout(raw: Any) -> float:
    """Seconds without progress before the shared level is turned off: more than 0 (0 would turn
    it off at once), at most an hour; NaN and infinities are bad values."""
    try:
        value = float(raw.strip() if isinstance(raw, str) else raw) if not isinstance(raw, bool) else math.nan
    except (TypeError, ValueError, OverflowError):
        value = math.nan
    if not 0 < value <= MAX_TIMEOUT:  # NaN fails this too
        raise BadValue(f"expected a number of seconds above 0 and at most {MAX_TIMEOUT:g}, got {shown(raw)}")
    return value


SIGNING_KEY_ENV = "GKX_JAX_CACHE_SIGNING_KEY"
CONFIG_FILE_ENV = "GKX_JAX_CACHE_CONFIG_FILE"


def config_files(env: Mapping[str, str], prefix: str, user_file: str | None) -> list[str | None]:
    """The settings files read, highest first: the policy file and the user's, or the one
    ``CONFIG_FILE_ENV`` names (``os.devnull``: none)."""
    named = env.get(CONFIG_FILE_ENV, "").strip()
    if named:
        return [] if named == os.devnull else [os.path.abspath(os.path.expanduser(named))]
    return [_policy.policy_path(prefix), user_file or _policy.user_path()]


def signing_key(env: Mapping[str, str] = os.environ) -> bytes | None:
    """The shared level's signing key (SPEC §14): a secret, so from the environment only (as CI
    systems pass secrets), never from a settings file, and never printed. Its UTF-8 bytes as they
    are (not stripped: a key is not a word); an empty variable is a bad setting
    (``EMPTY_SIGNING_KEY``), skipped: as if unset."""
    value = env.get(SIGNING_KEY_ENV, "")
    return value.encode("utf-8", "surrogateescape") if value else None


EMPTY_SIGNING_KEY = (f"env {SIGNING_KEY_ENV} skipped, it is set but empty (a CI secret not passed to this job?), so "
                     "the shared level's entries are neither signed nor checked; pass the secret, or unset the variable")


def remote_signing_note(url: str) -> str:
    """With ``dir`` a bucket, JAX's stock cache reads it: nothing checks a signature (SPEC §14)."""
    return (f"GKX_JAX_CACHE_SIGNING_KEY protects nothing with dir = {url}: JAX's stock cache reads the bucket and "
            "checks no signature; keep dir local and set shared = the bucket to have entries signed and checked")


def is_ci(env: Mapping[str, str] = os.environ) -> bool:
    """``CI`` set to anything but a false spelling (``CI=false`` is not CI)."""
    value = env.get("CI", "").strip()
    return bool(value) and value.lower() not in FALSE


def no_uploads(setting: str, env: Mapping[str, str] = os.environ) -> str | None:
    """None when this process uploads to the shared level, else why not, per ``shared_write``."""
    if setting == "never":
        return "shared_write = never"
    if setting == "ci" and not is_ci(env):
        return "shared_write = ci, and CI is not set to a true value here"
    return None


_VAR = r"\$(?:(\w+)|\{([^}]*)\})"  # $NAME or ${NAME}


def parse_dir(raw: Any, base: str | None, env: Mapping[str, str] = os.environ, shared: bool = False) -> str:
    """A path with ``~`` and ``$VARS`` expanded (from ``env``), absolute against ``base``; a URL
    verbatim, of a scheme the table of levels has (``_backends/schemes``): for ``dir``, those JAX's
    own cache can hold; for ``shared``, every level's. A ``$VAR`` that is not set, or a ``~user``
    that does not exist, is a bad value, never a literal directory of that name; so is a relative
    path when ``base`` is None (the current directory was deleted)."""
    rows = {scheme: row for scheme, row in SCHEMES.items() if shared or row.as_dir is not None}
    forms = list(dict.fromkeys(row.form for row in rows.values()))
    said = f"a {', '.join(forms[:-1])} or {forms[-1]} URL" if len(forms) > 1 else f"a {forms[0]} URL"
    if not isinstance(raw, str) or not raw.strip():
        raise BadValue(f"expected a directory path or {said}, got {shown(raw)}")
    text: str = raw.strip()
    if is_url(text):
        scheme, _, rest = text.partition("://")
        row = rows.get(scheme.lower())
        if row is None or not rest.strip("/"):
            raise BadValue(f"expected a directory path or {said}, got {shown(raw)}")
        if row.no_user and "@" in rest.split("/", 1)[0]:  # (an HTTP cache's credentials: never shown, so never in a URL)
            raise BadValue(row.no_user)
        if row.no_query and ("?" in rest or "#" in rest):  # (an object's name is added to its path)
            raise BadValue(f"{row.no_query}, got the URL up to its '?' or '#': "
                           f"{shown(text.split('?', 1)[0].split('#', 1)[0])}")
        return text
    if "\0" in text:
        raise BadValue(f"a path cannot hold a NUL character, got {shown(raw)}")

    def variable(match: re.Match[str]) -> str:
        name = match[1] or match[2]
        value = env.get(name)
        if value is None:
            raise BadValue(f"{shown('$' + name)} is not set, in {shown(raw)}; set it, or write the path out")
        return value

    path = re.sub(_VAR, variable, text)
    if path.startswith("~"):
        home = env.get("HOME") if path == "~" or path.startswith("~/") else None
        path = os.path.join(home, path[2:]) if home else os.path.expanduser(path)
        # Left as it was: no HOME, and a uid the password database does not know (docker run --user).
        if path.startswith("~/") or path == "~":
            raise BadValue(f"~ has no home here (HOME is not set), in {shown(raw)}; set HOME, or write the path out")
        if path.startswith("~"):
            raise BadValue(f"{shown(path.split('/')[0])} is not a user here, in {shown(raw)}")
    if base is None and not os.path.isabs(path):
        raise BadValue(f"{shown(raw)} is relative and the current directory no longer exists (it was deleted); "
                       "write the path out, or run from a directory that exists")
    return os.path.normpath(os.path.join(base or "", path))


def current_dir() -> str | None:
    """The current directory, or None when it no longer exists (deleted under the process): that
    is no reason to lose a run, or a command, that does not need it."""
    try:
        return os.getcwd()
    except OSError:
        return None


def unset_variables(raw: str, env: Mapping[str, str] = os.environ) -> list[str]:
    """The ``$VARS`` of a ``dir`` path that ``env`` does not set, among names a shell can set:
    a policy file is shared, and another user may set what the one editing it does not."""
    if is_url(raw):
        return []
    names = {match[1] or match[2] for match in re.finditer(_VAR, raw)}
    return sorted(n for n in names if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) and n not in env)


# Plain classes, not NamedTuples, on the way of every `import jax`: a NamedTuple class costs ~0.3 ms
# to create.


class Key:
    """A setting: its name, environment variable, JAX option (where it has one), default and parser."""

    __slots__ = ("name", "env", "jax_option", "default", "parse")

    def __init__(self, name: str, env: str, jax_option: str | None, default: Any, parse: Callable[[Any], Any]) -> None:
        self.name, self.env, self.jax_option, self.default, self.parse = name, env, jax_option, default, parse


KEYS = {
    k.name: k
    for k in (
        Key("enabled", "GKX_JAX_CACHE", None, True, parse_bool),
        Key("dir", "GKX_JAX_CACHE_DIR", "jax_compilation_cache_dir", None, lambda raw: raw),
        Key("min_compile_time_secs", "GKX_JAX_CACHE_MIN_COMPILE_TIME_SECS",
            "jax_persistent_cache_min_compile_time_secs", 0.0, parse_float),
        Key("min_entry_size_bytes", "GKX_JAX_CACHE_MIN_ENTRY_SIZE_BYTES",
            "jax_persistent_cache_min_entry_size_bytes", -1, parse_entry_size),
        Key("xla_caches", "GKX_JAX_CACHE_XLA_CACHES", "jax_persistent_cache_enable_xla_caches",
            None, parse_xla_caches),
        Key("max_size", "GKX_JAX_CACHE_MAX_SIZE", None, 5 * 1024**3, parse_size),
        Key("cpu_target", "GKX_JAX_CACHE_CPU_TARGET", None, "host", parse_cpu_target),
        Key("report", "GKX_JAX_CACHE_REPORT", None, False, parse_bool),
        Key("trust_shared", "GKX_JAX_CACHE_TRUST_SHARED", None, False, parse_bool),
        Key("read_untrusted_dir", "GKX_JAX_CACHE_READ_UNTRUSTED_DIR", None, False, parse_bool),
        Key("shared", "GKX_JAX_CACHE_SHARED", None, None, lambda raw: raw),
        Key("shared_write", "GKX_JAX_CACHE_SHARED_WRITE", None, "always", parse_shared_write),
        Key("shared_timeout", "GKX_JAX_CACHE_SHARED_TIMEOUT", None, 10.0, parse_timeout),
        Key("rebuild_ahead", "GKX_JAX_CACHE_REBUILD_AHEAD", None, True, parse_bool),
        Key("shared_credentials_over_http", "GKX_JAX_CACHE_SHARED_CREDENTIALS_OVER_HTTP", None, False, parse_bool),
    )
}


DEFAULTS_WRITTEN = {"max_size": "5GiB"}  # defaults shown as a person would write them


# JAX's own defaults for the options the package sets (the same in JAX 0.10 and 0.12). A value in
# jax.config that differs from these was set by the user, and is left as they set it.
JAX_DEFAULTS: dict[str, Any] = {
    "jax_compilation_cache_dir": None,
    "jax_persistent_cache_min_compile_time_secs": 1.0,
    "jax_persistent_cache_min_entry_size_bytes": 0,
    "jax_persistent_cache_enable_xla_caches": "xla_gpu_per_fusion_autotune_cache_dir",
}


def jax_explicit(env: Mapping[str, str] = os.environ, jax_config: Any = None) -> dict[str, tuple[Any, str]]:
    """Layer 1: the keys whose JAX option the user set themselves, ``key -> (value, origin)``.

    From the ``JAX_*`` variables alone when ``jax_config`` is None (the CLI does not import jax).
    """
    explicit: dict[str, tuple[Any, str]] = {}
    for key in KEYS.values():
        option = key.jax_option
        if option is None:
            continue
        variable = option.upper()
        if jax_config is not None and not hasattr(jax_config, option):
            continue  # an option this JAX does not have (xla_caches before 0.4.36): nobody set it
        value = getattr(jax_config, option) if jax_config is not None else env.get(variable, "").strip()
        if env.get(variable, "").strip():
            explicit[key.name] = (value, f"JAX ({variable})")
        elif jax_config is not None and value != JAX_DEFAULTS[option]:
            explicit[key.name] = (value, f"JAX (jax.config {option})")
    return explicit


def validate(key: str, raw: Any, base: str | None, env: Mapping[str, str] = os.environ) -> Any:
    """Parse ``raw`` for ``key``; a relative ``dir`` or ``shared`` is taken against ``base`` (None:
    there is no current directory, and a relative value is a bad one). Raises BadValue."""
    if key in ("dir", "shared"):
        return parse_dir(raw, base, env, shared=key == "shared")
    return KEYS[key].parse(raw)


class Resolved:
    """A setting's value, where it came from, and how the user wrote it."""

    __slots__ = ("value", "origin", "written")

    def __init__(self, value: Any, origin: str, written: str | None = None) -> None:
        self.value = value
        self.origin = origin  # "default", "env GKX_JAX_CACHE_DIR", a file's path, "JAX (JAX_COMPILATION_CACHE_DIR)"
        self.written = written  # as the user wrote it ("5GiB", "$SCRATCH/jax"); None for a default

    def __repr__(self) -> str:
        return f"Resolved({self.value!r}, {self.origin!r}, {self.written!r})"

    def shown(self) -> str:
        """The value as the user wrote it (``5GiB``, not ``5368709120``), or the default's words."""
        if self.written is not None:
            return self.written
        if self.value is None:
            return "unset"
        if isinstance(self.value, bool):
            return "true" if self.value else "false"
        return str(self.value)


class Settings:
    """Every key's value with its origin, the problems worth a warning, and what became of each
    settings file. (Plain and named-tuple classes on this path: creating a dataclass costs about
    1 ms of ``import jax``.)"""

    def __init__(self, values: dict[str, Resolved]) -> None:
        self.values = values
        self.problems: list[tuple[str, str]] = []  # (cause, one-line message)
        self.skipped: dict[str, tuple[str, str, str]] = {}  # key -> (origin, as written, why): the highest skipped
        self.files: dict[str, _policy.FileVerdict] = {}

    def __getitem__(self, key: str) -> Any:
        return self.values[key].value

    def origin(self, key: str) -> str:
        return self.values[key].origin

    def from_jax(self, key: str) -> bool:
        return self.values[key].origin.startswith("JAX")


def resolve(
    env: Mapping[str, str] = os.environ,
    prefix: str = sys.prefix,
    user_file: str | None = None,
    cwd: str | None = None,
    jax_explicit: Mapping[str, tuple[Any, str]] | None = None,
) -> Settings:
    """Resolve every key; ``jax_explicit`` maps a key to ``(value, origin)`` for JAX options the
    user set themselves. ``user_file`` defaults to platformdirs' user config path; ``cwd`` to the
    current directory, which may no longer exist: that matters only to a relative ``dir``."""
    settings = Settings(values={})
    layers: list[tuple[str, Mapping[str, Any], str | None]] = []  # (origin, raw values, base for dir)
    env_values = {k.name: env[k.env] for k in KEYS.values() if env.get(k.env, "").strip()}
    layers.append(("env", env_values, current_dir() if cwd is None else cwd))
    for path in config_files(env, prefix, user_file):
        if path is None:  # a user without a home has no user config file
            continue
        verdict = _policy.read(path)
        settings.files[path] = verdict
        if verdict.problem:
            settings.problems.append((f"file:{path}", verdict.problem))
        for unknown in sorted(set(verdict.data) - set(KEYS)):
            message = f"{path}: unknown key {shown(unknown)} skipped; known keys: {', '.join(KEYS)}"
            if unknown == "signing_key":  # a secret: never read from a file, and its value never shown
                message = f"{path}: signing_key skipped: a secret is read from {SIGNING_KEY_ENV} only; remove it"
            settings.problems.append((f"key:{path}:{unknown}", message))
        layers.append((path, verdict.data, os.path.dirname(path)))

    for key in KEYS.values():
        if jax_explicit and key.name in jax_explicit:
            value, origin = jax_explicit[key.name]
            settings.values[key.name] = Resolved(value, origin, str(value))
            continue
        settings.values[key.name] = Resolved(key.default, "default", DEFAULTS_WRITTEN.get(key.name))
        for origin, data, base in layers:
            if key.name not in data:
                continue
            where = f"env {key.env}" if origin == "env" else origin
            try:
                raw = data[key.name]
                written = raw if isinstance(raw, str) else ("true" if raw else "false") if isinstance(raw, bool) else str(raw)
                settings.values[key.name] = Resolved(validate(key.name, raw, base, env), where, written.strip())
                break
            except BadValue as exc:
                settings.problems.append(
                    (f"value:{where}:{key.name}", f"{where}: {key.name} skipped, {exc}; fix or remove it")
                )
                settings.skipped.setdefault(key.name, (where, str(data[key.name]).strip(), str(exc)))
    # Said only where a shared level would use the key: without one an empty key changes nothing
    # (the local level is never signed), and a CI template that sets it for every job stays quiet.
    if env.get(SIGNING_KEY_ENV) == "" and settings["shared"] is not None:
        settings.problems.append(("signing:empty", EMPTY_SIGNING_KEY))
    return settings
