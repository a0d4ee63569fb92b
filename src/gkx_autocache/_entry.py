"""An entry as the levels pass it, one type for all of them (SPEC §14): its bytes, what compiling
it cost, when it was written, and the seal kept with it; and what a level answers a lookup
(``Answer``). A leaf: the levels, the chain and the store all speak it.
"""

from __future__ import annotations

from typing import NamedTuple


class Entry(NamedTuple):
    """``compile_secs``: what compiling it cost (None: not known, or not to be believed: an
    unsigned seal's); ``written``: when it was written (0.0: not known); ``seal``: the seal kept
    with it where a signing key vouched for it (None: none)."""

    data: bytes
    compile_secs: float | None = None
    written: float = 0.0
    seal: bytes | None = None


class Answer(NamedTuple):
    """A level's answer to a lookup: the entry (``found``), or why it must not be served
    (``refused``), or neither (``MISS``)."""

    found: Entry | None = None
    refused: str | None = None


MISS = Answer()
