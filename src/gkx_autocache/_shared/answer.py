"""What the shared level answers a lookup (``level.Level.get``), one type: the entry, checked
(``found``), or why it must not be served (``refused``), or neither (``MISS``). A leaf: the store
answers its own lookups with ``MISS`` where there is no shared level.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from gkx_autocache._shared.reads import Found


class Answer(NamedTuple):
    found: Found | None = None
    refused: str | None = None


MISS = Answer()
