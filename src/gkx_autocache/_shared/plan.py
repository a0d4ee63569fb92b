"""What a prefetch (``prefetch.py``) fetches: this program's manifests as read through the channel
(``read``), and the GPU autotune results its own manifest names (``land_autotune``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from gkx_autocache import _autotune
from gkx_autocache._diagnostics import logger
from gkx_autocache._shared import pack
from gkx_autocache._shared.calls import ShuttingDown, bounded, describe
from gkx_autocache._shared.channel import Channel
from gkx_autocache._shared.local import LocalPort
from gkx_autocache._shared.manifest import MANIFEST_LIMIT, autotune_name, manifest_name, program
from gkx_autocache._shared.reads import Reader


@dataclass
class Plan:
    """The keys of this program's manifests, each once, with their sizes (a pytest-xdist worker's
    siblings' too, rotated so that workers begin at different places); those its own pack holds
    (``packed``, in the pack ``packs`` names, a bucket's, where the listing has it); its own
    manifest as read (``own``); the autotune object it names (object, SHA-256, size); ``stopped``:
    a manifest's request failed for that object alone (a 403), and nothing more is fetched."""

    keys: list[tuple[str, int]] = field(default_factory=list)
    packed: set[str] = field(default_factory=set)
    packs: list[str] = field(default_factory=list)
    own: list[tuple[str, int]] | None = None
    autotune: tuple[str, str, int] | None = None
    stopped: bool = False


def read(channel: Channel, reader: Reader) -> Plan:
    """This program's manifests, through ``channel``: a stall or a refused connection turns the
    level off (and the plan is empty), a manifest that does not decode is not used."""
    plan = Plan()
    ident, part, index, count = program()
    parts = [part] if count == 1 else [f"gw{i}" for i in range(count)]
    merged: dict[str, int] = {}
    listing = channel.listing
    for name_part in parts:
        name = manifest_name(ident, name_part)
        if listing is not None and name not in listing:
            continue  # the listing answers: no request
        try:
            data = bounded(functools.partial(_small, channel, name), channel.timeout)
            channel.count(requests=1 if channel.backend.lists else 0)
        except ShuttingDown:
            return plan  # (no keys yet: nothing to fetch)
        except Exception as exc:
            if channel.fault(exc):
                return plan
            logger.debug("prefetch stopped: %s", describe(exc))
            plan.stopped = True
            continue
        try:
            keys, held, tuned = reader.manifest(data, ident) if data else ([], 0, None)
        except Exception as exc:  # a hint: whatever is wrong with it, it is not used, and nothing else is wrong
            logger.debug("the manifest %s is not used: %s", name, describe(exc))
            continue
        packed_here = pack.name_for(name)
        listed = listing is None or packed_here in listing
        if held and listed and channel.backend.lists and name_part == part:
            plan.packs.append(packed_here)  # (a sibling's keys are the workers': claimed, each fetched once)
            plan.packed.update(key for key, _ in keys[:held])
        if name_part == part and (listed or not held):  # (a manifest whose pack is gone is written again)
            plan.own = keys
        if name_part == part and tuned is not None:
            plan.autotune = (autotune_name(name), *tuned)
        for key, size in keys:
            merged.setdefault(key, size)
    keys = list(merged.items())
    if count > 1 and keys:
        start = index * len(keys) // count
        keys = keys[start:] + keys[:start]
    plan.keys = keys
    return plan


def _small(channel: Channel, name: str, progress: Any) -> bytes:
    data: bytes = channel.backend.small(name, MANIFEST_LIMIT)
    return data


def land_autotune(channel: Channel, reader: Reader, local: LocalPort, autotune: tuple[str, str, int]) -> None:
    """This program's GPU autotune results, into the local level's folder before any miss is
    compiled (a miss waits for them, at most one ``shared_timeout``): read whole (at most
    ``_autotune.TOTAL_LIMIT``), checked against the SHA-256 its manifest holds (signed, with a
    signing key), each file a name XLA writes; one that is there already is kept. Whatever goes
    wrong (a slow link included) costs these results only, never the channel."""
    name, sha, size = autotune
    try:
        data = bounded(lambda progress: channel.backend.small(name, size + 1), channel.timeout)
        channel.count(requests=1 if channel.backend.lists else 0)
        if len(data) != size or _autotune.digest(data) != sha:
            raise ValueError("it does not match its manifest's SHA-256")
        verified = reader.signs  # (decode refused a manifest the key did not sign)
        landed = _autotune.land(local.path, _autotune.unpack(data), local.team, verified)
        logger.debug("prefetch: %d GPU autotune results landed", landed)
    except Exception as exc:
        logger.debug("the autotune object %s is not used: %s", name, describe(exc))
