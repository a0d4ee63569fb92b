"""The local level as the shared level sees it (SPEC §14): a port, not the whole. A prefetch lands
entries there and claims the ones it fetches; uploads read the entries they heal or pack; the
manifest names its GPU autotune results. ``_local.level.LocalLevel`` is it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gkx_autocache._entry import Entry
    from gkx_autocache._local.landing import Landings


class LocalPort(Protocol):
    """``path``: the local version directory; ``meta``: its bookkeeping folder; ``team``: a team
    directory (§8); ``writable``: whether an entry can land; ``landings``: what landed, not used yet."""

    path: str
    meta: str
    team: bool
    writable: bool
    landings: Landings

    def land(self, key: str, entry: Entry) -> tuple[bool, str | None]: ...

    def has(self, key: str) -> bool: ...

    def touched_since(self, key: str, when: float) -> bool: ...

    def claim(self, key: str, stale: float) -> str | None: ...

    def unclaim(self, claim: str) -> None: ...

    def uploadable(self, key: str) -> Entry | None: ...
