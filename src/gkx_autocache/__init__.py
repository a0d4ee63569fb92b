"""gkx-autocache: JAX's persistent compilation cache, on for every process in the environment.

This module is the start-up hook. ``gkx_autocache.pth`` (or ``gkx_autocache.start`` on Python >=
3.15) runs ``install()`` at every interpreter start: it puts a finder on ``sys.meta_path`` that
configures JAX right after ``import jax``, and does nothing else. One module, not a package
``__init__`` plus a submodule: each module found and loaded costs start-up time in every process
of the environment, JAX or not. Don't import any costly module here: no ``typing``, ``pathlib``,
``importlib.util``, ``threading``. It is compiled from source on every start where bytecode is not
written (uv installs, ``PYTHONDONTWRITEBYTECODE``), so keep it short, too. Everything else lives in
``_configure`` and is imported on the first ``import jax`` only.
"""

import os
import sys

__all__ = ["AutocacheWarning", "install"]

TARGET = "jax"
_FALSE = ("0", "off", "false", "no", "none", "disable", "disabled")


def install() -> None:
    """Arrange for JAX's persistent cache to be configured when ``jax`` is imported.

    Idempotent (CPython runs a ``.pth`` line twice in some venvs) and never raises.
    """
    try:
        if _off(os.environ.get("GKX_JAX_CACHE")):
            return
        if TARGET in sys.modules:  # jax came first: configure now.
            _configure_now(sys.modules[TARGET])
        elif not any(type(f) is PostImportFinder for f in sys.meta_path):
            sys.meta_path.insert(0, PostImportFinder())
    except Exception:  # a cache must never cost the user their interpreter
        pass


def _off(value: "str | None") -> bool:
    return value is not None and value.strip().lower() in _FALSE


def _configure_now(module: object) -> None:
    from gkx_autocache._configure import configure

    configure(module)


class PostImportFinder:
    """Finds nothing itself: for ``jax``, wraps the real loader so that configuration runs once
    the module body has run, then takes itself off ``sys.meta_path``."""

    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name != TARGET:
            return None
        # Ask the finders after this one directly: importlib.util.find_spec would re-enter the
        # import system, and find us again.
        finders = sys.meta_path
        after = finders[finders.index(self) + 1 :] if self in finders else finders
        for finder in after:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ConfiguringLoader(spec.loader, self)
        return spec


class _ConfiguringLoader:
    """Delegates to the real loader; after a successful ``exec_module``, puts the real loader
    back on the module (so nothing of ours stays visible) and configures."""

    def __init__(self, loader, finder: PostImportFinder) -> None:  # type: ignore[no-untyped-def]
        self._loader = loader
        self._finder = finder

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self._loader, name)

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
        try:
            self._loader.exec_module(module)
        except BaseException as exc:
            # The user's exception, unchanged: drop this frame and re-raise bare. The finder
            # stays, so that a retry after the user fixes the cause is configured.
            tb = exc.__traceback__
            exc.__traceback__ = tb.tb_next if tb is not None else None
            raise
        finally:
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self._loader
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._loader
        # Rebind rather than mutate: importlib may be iterating over the list right now.
        sys.meta_path = [f for f in sys.meta_path if f is not self._finder]
        try:
            _configure_now(module)
        except Exception:
            pass


def __getattr__(name: str) -> object:
    """``gkx_autocache.AutocacheWarning``, loaded on first use."""
    if name == "AutocacheWarning":
        from gkx_autocache._diagnostics import AutocacheWarning

        return AutocacheWarning
    raise AttributeError(f"module 'gkx_autocache' has no attribute {name!r}")
