"""What explaining misses (SPEC §13) needs on every run, set up at ``import jax``: each key's parts,
kept per thread as JAX hashes them, and JAX's write seam, where it decides not to write.

The explainer itself (``_explain``, and the index it reads) is imported at the first miss or
write, never on a run where every lookup hits: those modules were a third of the package's own
time on such a run, and three quarters of it without bytecode.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from gkx_autocache._diagnostics import logger, plural
from gkx_autocache._jax import caching as jax_caching
from gkx_autocache._jax import callbacks as jax_callbacks
from gkx_autocache._jax import hooks as jax_hooks
from gkx_autocache._key import PARTS

if TYPE_CHECKING:
    from gkx_autocache._record.recorder import Run


class Watch:
    """The listener on the key's parts, and what the recorder asks: the cause of a miss, the index
    lines of a written entry. Those questions go to the explainer, made at the first of them. Made
    before the key's seam and the recorder, which are given it; it listens, and answers, once
    ``install`` starts it (where explanations are available), and is silent before."""

    def __init__(self) -> None:
        self.version_dir: str | None = None  # whose evidence explains a miss; None: not started
        self.load: Any = None
        self.thread = threading.local()  # the key being computed on this thread: its parts
        self._explainer: Any = None
        self._lock = threading.Lock()

    def start(self, version_dir: str, load: Any = None) -> None:
        """Explain the misses of ``version_dir``; ``load()`` reads its evidence, at the first miss."""
        self.version_dir, self.load = version_dir, load

    # -- the seam: called for each part of each key -----------------------------------------------

    def on_part(self, hash_obj: Any, name: str, hashfn: Any, hook: str | None = None,
                package: str | None = None) -> None:
        if self.version_dir is None:
            return
        pending = self.thread
        if name == PARTS[0]:
            pending.parts = [(name, hashfn)]
            pending.computation = hash_obj.digest()  # the first part: its own hash
            pending.final = pending.facts = None
            pending.key_hash = hash_obj  # the key, once its last part is in (a JAX whose last part is another)
            return
        parts = getattr(pending, "parts", None)
        if parts is None:
            return
        parts.append((name, hashfn))
        if name == "compression":  # the key as far as the hook: what stock JAX's key goes on from
            pending.before_hook = hash_obj.copy()
        elif name == PARTS[-1]:
            pending.final = hash_obj.digest().hex()
            pending.hook, pending.package = hook, package

    def move(self, version_dir: str) -> None:
        """The recorder moved to another directory (``_adopted``): its records are the evidence now."""
        with self._lock:
            if self.version_dir is not None:
                self.version_dir = version_dir
                self._explainer = None

    def forget(self) -> None:
        """The key was served: let go of its part functions now, while JAX still holds what they
        refer to (the module, the compile options). Held until the next key instead, they made
        the previous module's teardown land inside JAX's key computation: ~0.3 ms a key."""
        self.thread.parts = None

    # -- the recorder's questions, for the explainer --------------------------------------------------

    def cause(self, key: str, run: Run) -> dict[str, Any]:
        """``{"cause": ..., "detail": ...}`` for a miss of ``key`` in ``run``; never raises."""
        if self.version_dir is None:
            return {}
        try:
            explainer = self.explainer()
        except Exception as exc:  # an explanation must never cost a compile (nor the package's files gone)
            logger.debug("miss of %s not explained: %s", key, exc)
            return {"detail": f"not explained: {type(exc).__name__}: {exc}"[:200]}  # a miss without a cause
        return explainer.cause(key, run)  # type: ignore[no-any-return]

    def ingredients(self, key: str, run: Run) -> dict[str, Any]:
        """A written entry's index lines, for its ledger record; never raises."""
        if self.version_dir is None:
            return {}
        try:
            return self.explainer().ingredients(key, run)  # type: ignore[no-any-return]
        except Exception:
            return {}

    def forget_given(self) -> None:
        """This process begins another ledger: the explainer gives its tables again."""
        if self._explainer is not None:
            self._explainer.forget_given()

    def after_fork(self) -> None:
        """A lock another thread of the parent held at the fork stays held in the child."""
        self._lock = threading.Lock()
        if self._explainer is not None:
            self._explainer.after_fork()

    def explainer(self) -> Any:
        """The explainer, made at the first question."""
        with self._lock:
            if self._explainer is None:
                assert self.version_dir is not None
                from gkx_autocache._explain import explainer as _explain

                self._explainer = _explain.Explainer(self.version_dir, self.load, thread=self.thread)
            return self._explainer


def install(jax: Any, keys: Any, watch: Watch, recorder: Any, version_dir: str, load: Any = None,
            origins: dict[str, tuple[Any, str]] | None = None) -> str | None:
    """Wrap the write seam and start ``watch`` (the key's seam ``keys`` and the recorder hold it); return why
    explanations are unavailable (nothing else changes). ``load()`` reads the directory's evidence,
    at the first miss; ``origins``: the value applied and its source for each threshold
    (``min_compile_time_secs``), which an uncached compile names."""
    origins = origins or {}
    seam = keys  # the key's seam (``_key.Seam``): it hands ``watch`` each part
    if seam is None or not seam.parts:
        return jax_hooks.PARTS_CHANGED
    if seam.listener is not watch:  # installed before, by another (JAX's key seam is wrapped once a process)
        return "the key's parts are handed to another listener"

    def wrap(write: Any) -> Any:
        def _cache_write(cache_key: str, compile_time_secs: float, module_name: str, backend: Any, executable: Any,
                         *rest: Any, **kwargs: Any) -> None:
            reason = _not_written(jax, compile_time_secs, jax_callbacks.host_callbacks(rest, kwargs), backend, origins)
            before = recorder.writes
            write(cache_key, compile_time_secs, module_name, backend, executable, *rest, **kwargs)
            try:
                if jax.config.jax_compilation_cache_dir != version_dir:
                    return  # the user's code chose another directory: its compiles are not ours to count
                if reason is None and recorder.writes == before and recorder.store_serving:
                    from gkx_autocache import _causes as causes

                    minimum = jax.config.jax_persistent_cache_min_entry_size_bytes
                    origin = _origin(origins, "min_entry_size_bytes", minimum)
                    reason = ((causes.BELOW_MIN_ENTRY_SIZE, f"min_entry_size_bytes {minimum} bytes ({origin})", origin)
                              if minimum > 0 else None)
                if reason is not None and recorder.totals.writes == before:  # a rank's own local write (SPEC §14) is one
                    recorder.uncached(cache_key, *reason, secs=compile_time_secs)
            except Exception:
                pass

        return _cache_write

    why = jax_caching.wrap_cache_write(wrap)
    if why is not None:
        return why
    watch.start(version_dir, load)
    return None


def _origin(origins: dict[str, tuple[Any, str]], key: str, value: Any) -> str:
    """Where a threshold JAX applies came from: the source the package resolved, where JAX's option
    still holds that value; else the program set it (``jax.config.update``)."""
    applied, origin = origins.get(key, (None, ""))
    return origin if origin and applied == value else "jax.config, set by the program"


def _not_written(jax: Any, compile_time_secs: float, host_callbacks: Any, backend: Any,
                 origins: dict[str, tuple[Any, str]]) -> tuple[str, ...] | None:
    """Why JAX will not write this compile, by JAX's own rules, before it decides: a reason, its
    detail, where a threshold came from, and who put host callbacks there."""
    try:
        from gkx_autocache import _causes as causes  # at the first compile: a run where every lookup hits has none

        if jax.process_index() != 0:
            return causes.NOT_PROCESS_0, f"process {jax.process_index()}: only process 0 of a multi-process run writes"
        kept = jax_callbacks.callbacks_kept(host_callbacks, backend)
        if kept is not None:
            by = jax_callbacks.callbacks_by(host_callbacks)
            what = f"{plural(len(host_callbacks), 'host callback')} {causes.CALLBACKS_BY.get(by, f'of {by}')}"
            return causes.HOST_CALLBACKS, f"{what} in the function: {kept}", "", by
        minimum = jax.config.jax_persistent_cache_min_compile_time_secs
        if compile_time_secs < minimum:
            origin = _origin(origins, "min_compile_time_secs", minimum)
            return (causes.BELOW_MIN_COMPILE_TIME,
                    f"min_compile_time_secs {minimum:g} s ({origin}); it took {compile_time_secs:.2f} s", origin)
    except Exception:
        pass
    return None
