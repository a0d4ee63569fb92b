"""One process's cache (SPEC §1): what a process holds once the package has configured its JAX:
its recorder (its counts and its ledger) and its levels (``_chain``), built once, in order, by
``_configure`` (a test builds another). ``current`` is the package's one piece of process state:
the report line, the pytest line and the Python API read it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (types only: nothing to compile on import jax)
    from gkx_autocache._chain import Chain
    from gkx_autocache._record.recorder import Recorder


class Process:
    """``recorder``, and ``levels``: the chain of the package's own directory where a shared level
    stands behind the local one (None: one level, whose numbers the recorder's counts are)."""

    def __init__(self, recorder: Recorder, levels: Chain | None) -> None:
        self.recorder = recorder
        self.levels = levels
        self.command: str | None = None  # the package's own command this process runs (``rebuild``)

    def runs_command(self, name: str) -> None:
        """This process runs the package's own command ``name`` (``rebuild``): its report line says
        what it rebuilt as the command's, not as rebuilt ahead of a program."""
        self.command = name

    def snapshot(self, used: str | None = None) -> dict[str, Any]:
        """This process's counts, as ``report`` and the pytest summary show them (``Recorder.snapshot``),
        with both levels' numbers where the store served the directory JAX uses now."""
        shown = self.recorder.snapshot(used)
        if self.command is not None:  # (what it rebuilt is the command's, not rebuilt ahead of a program)
            shown["command"] = self.command
        levels = self.levels
        if shown.get("store") and levels is not None:
            shown["levels"] = levels.numbers()
            shown["shared"] = {"url": levels.url, "signed": levels.signs}
        return shown


current: Process | None = None  # set once a process's JAX is configured (``begin``)


def begin(process: Process) -> None:
    """This process's cache, from now on: the package's one ``global``."""
    global current
    current = process


def snapshot() -> dict[str, Any] | None:
    """This process's counts, for the directory JAX uses now; None where JAX was not configured."""
    process = current
    if process is None:
        return None
    jax = sys.modules.get("jax")
    used = getattr(getattr(jax, "config", None), "jax_compilation_cache_dir", None)
    return process.snapshot(str(used) if used else process.recorder.directory)


def report_at_exit() -> None:
    """With ``report``: this process's line on stderr at exit (what no pytest session's line counted
    already), after the ledger's last counts."""
    import atexit

    from gkx_autocache._record import show  # noqa: F401  (now: at exit the package's files may be gone)

    atexit.register(_report)


def _report() -> None:
    try:
        snap = snapshot()
        plugin = sys.modules.get("gkx_autocache._pytest_plugin")
        if snap is not None and plugin is not None:
            snap = plugin.uncounted(snap)  # what no pytest session's line counted already
        if snap is not None:
            from gkx_autocache._record.show import summary_line

            print(summary_line(snap), file=sys.stderr, flush=True)
    except Exception:
        pass
