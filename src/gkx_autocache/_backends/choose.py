"""Which backend serves a ``shared`` URL or path, from the table (``schemes``): its row, what it
lacks here (the install check, with nothing imported), and the backend itself, its module imported
only when a level is made.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gkx_autocache._backends.schemes import PATH, SCHEMES, Row
from gkx_autocache._layout import is_url

if TYPE_CHECKING:
    from gkx_autocache._backends.port import Backend


def row_for(where: str) -> Row:
    """The table's row for a URL (its scheme) or a path (a directory). Raises KeyError for a scheme
    the table does not have (the settings refuse those first)."""
    return SCHEMES[where.split("://", 1)[0].lower()] if is_url(where) else PATH


def missing(where: str, as_dir: bool = False) -> str | None:
    """What the level at ``where`` needs and does not find here (``as_dir``: as JAX's own ``dir``),
    with the command that installs it, in words for the user; or None. ``find_spec`` of a top-level
    name only looks: nothing is imported, so this is cheap on ``import jax``."""
    import importlib.util

    row = row_for(where)
    needs = (row.as_dir or ()) if as_dir else row.needs
    absent = [name for name in needs if importlib.util.find_spec(name) is None]
    return f"{', '.join(absent)} not installed: pip install '{row.extra}'" if absent else None


def backend_for(shared: str, jax_version: str, team: bool, env: Mapping[str, str] = os.environ,
                over_http: bool = False) -> Backend:
    """The storage a ``shared`` setting names, for this JAX's version directory: built only, no
    request made. ``team``: ``trust_shared`` (a directory's rules); ``over_http``:
    ``shared_credentials_over_http`` (a credential sent over plain ``http://`` to another machine)."""
    import importlib

    row = row_for(shared)
    made: Backend = getattr(importlib.import_module(row.module), row.cls).opened(
        shared, jax_version, env, team=team, over_http=over_http)
    return made
