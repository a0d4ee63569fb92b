"""What ``status`` says of the levels: a bounded probe of the shared one, both levels described
(where, trust, writes, signing), as JSON and human text. Their numbers are shown by
``_record/show``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from gkx_autocache._backends.choose import backend_for, row_for
from gkx_autocache._backends.port import Uncounted
from gkx_autocache._layout import ENTRY_SUFFIX, SEAL_SIDECAR, key_match
from gkx_autocache._settings import no_uploads
from gkx_autocache._shared.calls import Progress, bounded, describe
from gkx_autocache._shared.setup import problem, signing_key


def probe(backend: Any, timeout: float) -> dict[str, Any]:
    """Whether the shared level answers, bounded by the timeout (``status`` only): for a bucket, a
    listing of its version prefix; for a directory, its trust and its entries."""
    started = time.monotonic()

    def look(progress: Progress) -> dict[str, Any]:
        found: dict[str, Any] = {}
        if backend.lists:
            names = backend.listing(progress)
            if isinstance(names, Uncounted):  # it answered, and cannot say how many: never "more than 1000"
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


def described(backend: Any, timeout: float) -> dict[str, str]:
    """What the backend says of itself (its client, its credentials' source), resolved within the
    timeout (botocore may ask a credential process, SSO or instance metadata)."""
    try:
        said: dict[str, str] = bounded(lambda progress: backend.describe(), timeout)
    except Exception as exc:
        return {"credentials": f"not resolved: {describe(exc)}"}
    return said


UNCHECKED = ("not set, and this level's entries carry signatures: this process does not check them (an entry "
             "planted there is loaded); set GKX_JAX_CACHE_SIGNING_KEY to check them")


def describe_levels(settings: Any, location: Any, jax_version: str | None, env: Mapping[str, str],
                    probing: bool) -> dict[str, Any] | None:
    """Both levels for ``status``: where each is, its trust, whether the shared one is written and
    signed, and (with ``probing``) whether it answers. None without a shared level."""
    shared = settings["shared"]
    if shared is None:
        return None
    secret = signing_key(env)
    local = {"dir": location.version_dir if location is not None else None,
             "trust": ("a team directory (trust_shared)" if getattr(location, "team", False) else
                       "not checked on Windows" if getattr(location, "stock", False) else "private to you")}
    row = row_for(shared)
    info: dict[str, Any] = {
        "url": shared, "origin": settings.origin("shared"), "kind": row.kind,
        "trust": row.team_trust if settings["trust_shared"] else row.trust,
        "writes": no_uploads(settings["shared_write"], env) or f"on (shared_write = {settings['shared_write']})",
        "timeout": settings["shared_timeout"],
        "signing": ("set (env GKX_JAX_CACHE_SIGNING_KEY): uploads are signed, unsigned entries never loaded"
                    if secret is not None else "not set: entries are neither signed nor checked"),
        "cap": row.cap,
    }
    why = problem(settings, location) if location is not None else "no local level"
    if why is not None or jax_version is None:
        info["unused"] = why or "JAX is not installed"
        return {"local": local, "shared": info}
    backend = backend_for(shared, jax_version, bool(settings["trust_shared"]), env,
                          bool(settings["shared_credentials_over_http"]))
    info["version_dir"] = backend.where
    try:  # which client, and whose credentials (never their value)
        info.update(described(backend, settings["shared_timeout"]))
        info["probe"] = probe(backend, settings["shared_timeout"]) if probing else "skipped (--no-probe)"
    finally:
        backend.forget()  # its kept connections closed: status is done with it
    if secret is None and isinstance(info["probe"], dict) and info["probe"].get("signed"):
        info["signing"] = UNCHECKED
    return {"local": local, "shared": info}


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
    if shared.get("credentials"):
        lines.append(f"           credentials: {shared['credentials']}")
    lines += [f"           uploads: {shared['writes']}; timeout {shared['timeout']:g} s",
              f"           signing key: {shared['signing']}", f"           cap: {shared['cap']}"]
    return lines
