"""``gkx-autocache status``: the document ``_status`` gathers, printed as it is (``--json``) or
drawn as text."""

from __future__ import annotations

import argparse
import time
from typing import Any

from gkx_autocache import _cache, _mount
from gkx_autocache._cli.output import OK, emit, table
from gkx_autocache._cli.stats import stats_line
from gkx_autocache._context import load_context
from gkx_autocache._diagnostics import human_bytes, plural
from gkx_autocache._status import features_said, gather


def cmd_status(args: argparse.Namespace) -> int:
    data = gather(load_context(), probe=not getattr(args, "no_probe", False))
    emit(args, text(data), data)
    return OK


def features_line(found: dict[str, str | None] | None) -> str | None:
    return None if found is None else f"  features {features_said(found)}"


STORES = {"gkx-autocache": "the package's own: JAX reads and writes its entries through gkx-autocache",
          "jax": "JAX's stock cache", "none": "none"}


def cpu_line(cpu: dict[str, Any]) -> str:
    """What CPU entries are keyed on here, and what the CPU has that its kernel does not say."""
    machine, _, words = cpu["isa"].partition(":")
    features = [w for w in words.split(",") if w and w != "cpuid"]
    said = f"{machine}, {plural(len(features), 'feature')} read from {cpu['source']}"
    if cpu["kernel_hides"]:
        said += f"; the kernel's flags do not list {', '.join(cpu['kernel_hides'])}, which CPU entries are keyed on too"
    return said


def text(data: dict[str, Any]) -> str:
    files, directory = data["start_files"], data["directory"]
    lines = [
        f"gkx-autocache {data['package']}  Python {data['python']}  JAX {data['jax'] or '(not installed)'}"
        f"  jaxlib {data['jaxlib'] or '(not installed)'}",
        f"hook        {'live in this interpreter' if data['hook_live'] else 'not live in this interpreter'}; "
        + (("the cache is disabled here" if not data["settings"]["enabled"]["value"] else
            f"{files['gkx_autocache.pth']} configures JAX in every process of this environment that imports it")
           if files["gkx_autocache.pth"] else "gkx_autocache.pth NOT installed"),
        f"cpu         {cpu_line(data['cpu'])}",
        "settings",
    ]
    lines.extend(table([(key, entry["effective"], entry["origin"]) for key, entry in data["settings"].items()], "  "))
    for path, verdict in data["files"].items():
        lines.append(f"  file {path}: {verdict}")
    lines.append("directory")
    if directory["version_dir"]:
        kind = directory["kind"]
        trust = {_cache.LOCAL: "trusted", _cache.OWN: "trusted, yours: set by JAX's own setting" if directory["trusted"]
                 else "refused: no entry read" if directory.get("unread") else "not trusted: read unchecked (read_untrusted_dir)",
                 _cache.REMOTE: "remote: trust is the bucket's access policy",
                 _cache.STOCK: "trust not checked on Windows"}[kind]
        state = ("writable" if directory["writable"] else "read-only") + f", {trust}"
        if directory["root"]:
            lines.append(f"  root     {directory['root']}")
        lines.append(f"  version  {directory['version_dir']}  ({state}{'' if directory['exists'] else ', not created yet'})")
        if directory.get("mount"):
            lines.append(f"  mount    {directory['mount']}")
    if directory.get("moved"):
        moved = directory["moved"]
        lines.append(f"  moved    JAX's directory is {moved['dir']}, set by {moved['by']} "
                     f"({time.strftime('%Y-%m-%d %H:%M', time.localtime(moved['t']))}): the store serves it, and "
                     "gkx-autocache explain follows it there")
    for refused in directory.get("refused", []):
        lines.append(f"  refused  {refused['path']}: {refused['why']}")
    store = data["store"]
    if store:
        served = STORES.get(store["store"], store["store"] or ("not recorded" if directory.get("mount") else "not recorded yet"))
        lines.append(f"  store    {served}{': ' + store['reason'] if store.get('reason') else ''}")
    if (features_text := features_line(data.get("features"))) is not None:
        lines.append(features_text)
    for version in data["versions_present"]:
        mark = "" if not version["installed"] else (" (this JAX's)" if directory.get("kind") == _cache.STOCK
                                                    or directory.get("mount") else
                                                    " (this JAX's: allocated blocks, what max_size caps)")
        lines.append(f"  {version['version']:<18} {plural(version['entries'], 'entry', 'entries'):>13}  "
                     f"{human_bytes(version['bytes']):>10} on disk{mark}")
    levels = data.get("levels")
    if levels:
        from gkx_autocache._shared.probe import level_lines

        lines.extend(level_lines(levels))
    stats = data["stats"]
    if stats:
        since = (f"the last reset ({time.strftime('%Y-%m-%d %H:%M', time.localtime(data['stats_reset_at']))})"
                 if data.get("stats_reset_at") else "the directory was made")
        lines.append(f"stats       every process since {since}: {stats_line(stats)} (compressed)")
        if stats.get("levels"):
            from gkx_autocache._record.show import line

            lines.append(f"            {line(stats['levels'])}")
    elif data.get("stats_reset_at"):
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(data["stats_reset_at"]))
        lines.append(f"stats       no lookups since the last reset (stats --reset, {when})")
    elif directory.get("kind") == _cache.OWN and not directory["trusted"]:
        lines.append(f"stats       {_cache.NOT_KEPT.format(dir=directory['version_dir'])}")
    elif directory.get("kind") == _cache.STOCK:
        lines.append("stats       not kept on Windows: JAX's own cache keeps no records")
    elif directory.get("mount"):
        lines.append(f"stats       {_mount.UNKEPT.format(dir=directory['version_dir'])}")
    elif not directory["version_dir"]:
        lines.append("stats       none: no directory is used here" + ("" if data["settings"]["enabled"]["value"]
                                                                      else " (the cache is disabled)"))
    else:
        lines.append("stats       none yet: no process has looked up an entry in this directory")
    if data["attention"]:
        lines.append("attention")
        lines.extend(f"  - {a}" for a in data["attention"])
    return "\n".join(lines)
