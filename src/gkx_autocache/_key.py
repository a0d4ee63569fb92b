"""JAX's cache key (SPEC §13, §15): the seam on its parts, and the host's ISA in its hook part.

JAX's key is one sha256 over eight parts, hashed in turn into one object by
JAX's ``cache_key.get``: the computation, the jaxlib version, the backend version, the XLA
flags, the compile options, the accelerator config, the compression and a custom hook. After each
part, ``get`` calls the module function ``_log_cache_key_hash(hash_obj, name, hashfn)`` (the same
in JAX 0.10 to 0.12), which hashes the part again for DEBUG logs only when that logger is on. The
seam wraps it (through ``_jax``), and on every key:

- at ``custom_hook``, it checks that the hook is still the package's (a user's code may replace it
  after ``import jax``: then the seam adds the ISA itself, which makes the same key, and says so);
- it hands every part to a listener (``_explain.seam``), kept for the explainer.

The custom hook is JAX's part meant for additions to the key, called on every key. The package's
hook returns the user's own hook's string (chained) and this host's ISA (``_isa``): XLA:CPU code is
built for the host's instruction set, and JAX's key says only ``cpu``. Every key gets it, GPU and
TPU keys too, whatever the key's platform: XLA:GPU compiles host-offloaded computations
(``compute_on('device_host')``) and the host side of Mosaic GPU kernels with XLA:CPU, for the
compiling host, and stores that object code in the entry; XLA loads it without checking the CPU
(read in XLA's and JAX's source, 2026-12: ``docs/isa.md``). TPU's libtpu is closed. A miss is
cheaper than a crash.

Never raises into JAX: JAX catches only its own runtime error around the key, so an exception here
would break every ``jit``. The ISA is read once, at the first key, never at interpreter start.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

from gkx_autocache import _cpu_target, _isa
from gkx_autocache._diagnostics import logger
from gkx_autocache._jax import callbacks as jax_callbacks
from gkx_autocache._jax import hooks as jax_hooks

ISA_MARK = "gkx-autocache-isa="  # what the package's part of the hook's string ends with: the ISA
CALLBACKS_MARK = "gkx-autocache-callbacks=by-index;"  # before it, on a compile whose callbacks the package hands back
# The parts, in the order JAX hashes them (``last_serialized`` names them so at the seam).
PARTS = ("computation", "jax_lib version", "backend version", "XLA flags", "compile_options", "accelerator_config",
         "compression", "custom_hook")


class Listener(Protocol):
    """Who is handed every part (``_explain.seam.Watch``), with, at the last, what the hook part
    hashed (``hook``: None where the user's own hook replaced the package's) and what the package
    added to it (``package``: the seam chains it after the user's hook where that replaced its own)."""

    def on_part(self, hash_obj: Any, name: str, hashfn: Any, hook: str | None = None,
                package: str | None = None) -> None: ...


class Seam:
    """What the seam knows of the key being computed on each thread, and what it has noticed.
    ``listener`` is handed every part; ``on_replaced(note)`` is told once that the user's code
    replaced the package's hook (status's verdict file says it); ``target``: this process's
    ``cpu_target`` (``_cpu_target.Target``), which CPU keys hold where it is taken."""

    def __init__(self, listener: Listener | None = None, on_replaced: Callable[[str], None] | None = None,
                 target: _cpu_target.Target = _cpu_target.NONE) -> None:
        self.hook: Any = None  # the package's hook, once in place
        self.thread = threading.local()  # the hook text of the key being computed on this thread
        self.listener = listener
        self.replaced: str | None = None  # the user's hook that replaced the package's, once noticed
        self.on_replaced = on_replaced
        self.target = target
        self.parts = False  # whether _log_cache_key_hash is wrapped: the parts are seen

    def note(self, text: str, part: str) -> None:
        """The package's hook made ``text`` on this thread, ``part`` of it its own."""
        self.thread.text, self.thread.part = text, part

    def on_part(self, hash_obj: Any, name: str, hashfn: Any) -> None:
        if name == "backend version":  # before the hook's part: the platform the key is for (cpu_target)
            self.thread.platform = jax_hooks.key_platform(hashfn)
        if name == "custom_hook" and self.hook is not None:  # the package's hook in place, or replaced since
            thread = self.thread
            hook = jax_hooks.current_hook()
            if hook is not self.hook:
                self._noticed(hook)
                thread.text = None  # the user's string is not known here
                thread.part = self.package_part()
                hash_obj.update(thread.part.encode())  # the same key as the hook's own, chained
            thread.last, thread.text = getattr(thread, "text", None), None
            thread.last_part, thread.part = getattr(thread, "part", None), None
        if name == "custom_hook":
            self.thread.platform = None
        if self.listener is not None:
            last = name == PARTS[-1]
            self.listener.on_part(hash_obj, name, hashfn, self.last() if last else None,
                                  getattr(self.thread, "last_part", None) if last else None)

    def _noticed(self, current: Any) -> None:
        if self.replaced is not None:
            return
        self.replaced = f"{getattr(current, '__module__', '?')}.{getattr(current, '__qualname__', repr(current))}"[:200]
        logger.debug("%s was replaced by %s: the ISA is added by the seam", jax_hooks.HOOK, self.replaced)
        if self.on_replaced is not None:
            self.on_replaced(self.replaced_note() or "")

    def targeted(self) -> bool:
        """Whether this thread's last key holds a ``cpu_target`` (its entry's features are then checked)."""
        return _isa.TARGET_MARK in (isa_of(getattr(self.thread, "last_part", None) or "") or "")

    def last(self) -> str | None:
        """What the hook part of this thread's last key hashed, where known (None where the user's own
        hook replaced the package's)."""
        return getattr(self.thread, "last", None)

    def package_part(self) -> str:
        """What the package adds to the hook's string: the host's ISA (a CPU key's, the ``cpu_target``
        where one is taken), after a mark where this thread's compile has host callbacks that the
        package hands back (``_jax.callbacks.handing_callbacks``)."""
        keyed = self.target.keys(getattr(self.thread, "platform", None))
        return ((CALLBACKS_MARK if jax_callbacks.handing_callbacks() else "")
                + (ISA_MARK + self.target.isa_text() if keyed else isa_suffix()))

    def replaced_note(self) -> str | None:
        """What ``status`` says when the user's code replaced the package's key hook after ``import jax``."""
        if self.replaced is None:
            return None
        return (f"{jax_hooks.HOOK} was replaced after import jax (by {self.replaced}): CPU keys still get the "
                "ISA, added by gkx-autocache's key seam; chain the hook you replace to keep yours and ours in one place")


_suffix: list[str] = []


def isa_suffix() -> str:
    """The package's part of the hook's string, computed once: ``gkx-autocache-isa=x86_64:...``.
    Where the ISA cannot be read, the host's name stands in: a key of this host alone."""
    if not _suffix:
        try:
            from gkx_autocache import _isa

            text = _isa.isa()
        except Exception as exc:
            import socket

            logger.debug("the ISA cannot be read (%s): keyed by host name", exc)
            text = f"unknown:host={socket.gethostname()}"
        _suffix.append(ISA_MARK + text)
    return _suffix[0]


def without_callbacks(text: str) -> str:
    """A hook part's string less the mark of host callbacks (which follow the computation)."""
    return text.replace(CALLBACKS_MARK, "")


def isa_of(text: str) -> str | None:
    """The ISA in a hook part's string (what ``isa_suffix`` added), or None where there is none."""
    at = text.rfind(ISA_MARK)
    return text[at + len(ISA_MARK):] if at >= 0 else None


def install(jax: Any, listener: Listener | None = None, on_replaced: Callable[[str], None] | None = None,
            target: _cpu_target.Target = _cpu_target.NONE) -> tuple[Seam, str | None]:
    """Put the package's hook in place (chaining the one set before) and wrap the parts' seam, which
    hands them to ``listener``; the seam, and why CPU entries are not keyed by ISA (or None)."""
    current = Seam(listener, on_replaced, target)

    def wrap(previous: Any) -> Any:
        def custom_hook() -> str:
            base = previous()
            if not isinstance(base, str):  # the user's hook: JAX says what is wrong with it, as before
                return base  # type: ignore[no-any-return]
            part = current.package_part()
            text = base + part
            current.note(text, part)
            return text

        current.hook = custom_hook
        return custom_hook

    why = jax_hooks.install_hook(wrap)  # without the hook, the parts are still watched: explain needs them alone
    current.parts = jax_hooks.watch_key_parts(current.on_part)
    return current, why
