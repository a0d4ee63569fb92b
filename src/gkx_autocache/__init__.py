"""gkx-autocache: JAX's persistent compilation cache, on for every process in the environment.

This module is the finder that configures JAX right after ``import jax``, and ``install()``, which
puts it on ``sys.meta_path``. Its cost rule, and why:

- It is not imported at interpreter start. ``gkx_autocache.pth`` defines a finder of the same name
  in its one line, run by ``exec``, and that finder imports this module only when ``jax`` is
  imported. Importing any module from source at start-up would call the builtin ``compile()``, and
  the first call in a process initialises CPython's AST types: about 10 million instructions (3 ms)
  in every process of the environment, wherever bytecode is not written (uv installs,
  ``PYTHONDONTWRITEBYTECODE``, read-only site-packages). ``exec`` of a source string does not.
- On Python >= 3.15, ``gkx_autocache.start`` (PEP 829) names ``install``, so site imports this module
  at every start, and skips the ``.pth`` line. There the bytecode the installer wrote is what keeps
  it cheap; without bytecode every start pays the compile. So: stdlib only, ``os`` and ``sys`` at
  import, nothing costly (no ``typing``, ``pathlib``, ``importlib.util``, ``threading``: the
  annotations below are for mypy only), and short. Everything else lives in ``_configure`` and is
  imported on the first ``import jax`` only.

Both finders, this module's class and the ``.pth`` line's function, are named ``GkxAutocacheFinder``:
recognise the finder by that name (``is_finder``), never by identity (docs/how-it-works.md).

PYTEST_DONT_REWRITE: the package ships a pytest plugin, so pytest marks it for assertion rewriting,
and warns (an error under ``filterwarnings = error``) when a session starts in a process that
imported ``jax`` already, which imported this module (``pytest.main()`` in a notebook).
"""

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # for mypy only: importing typing at run time costs every process of a 3.15 venv
    import weakref
    from collections.abc import Sequence
    from importlib.abc import Loader as _Loader
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any
else:
    _Loader = object

__all__ = ["FINDER", "AutocacheError", "AutocacheWarning", "GkxAutocacheFinder", "explain", "find_spec", "install",
           "is_finder", "stats", "status"]

TARGET = "jax"
FINDER = "GkxAutocacheFinder"
_FALSE = ("0", "off", "false", "no", "none", "disable", "disabled")


def install() -> None:
    """Arrange for JAX's persistent cache to be configured when ``jax`` is imported.

    What the ``.pth`` line does, for callers that import the package (``gkx_autocache.start`` on
    Python >= 3.15), and one thing more: a ``jax`` imported already is configured now (the line,
    whose every token costs every start, leaves that to a later ``install()``). Idempotent,
    whichever of the two finders is already in place; never raises.
    """
    try:
        if _off(os.environ.get("GKX_JAX_CACHE")):
            return
        if TARGET in sys.modules:  # jax came first: configure now; a finder would never fire.
            sys.meta_path = [f for f in sys.meta_path if not is_finder(f)]
            _configure_now(sys.modules[TARGET])
        elif not any(is_finder(f) for f in sys.meta_path):
            sys.meta_path.insert(0, GkxAutocacheFinder)
    except Exception:  # a cache must never cost the user their interpreter
        pass


def is_finder(obj: object) -> bool:
    """Whether ``obj`` is the finder: this module's class or the ``.pth`` line's function, both named
    ``GkxAutocacheFinder``."""
    # type(is_finder) is types.FunctionType, which would import types at every start of Python >= 3.15.
    try:
        return isinstance(obj, (type, type(is_finder))) and obj.__name__ == FINDER
    except Exception:  # another finder on sys.meta_path whose __class__ or __name__ raises
        return False


def _off(value: "str | None") -> bool:
    return value is not None and value.strip().lower() in _FALSE


def _configure_now(module: object) -> None:
    from gkx_autocache._configure import configure

    configure(module)


class GkxAutocacheFinder:
    """Finds nothing itself: for ``jax``, wraps the real loader so that configuration runs once the
    module body has run, then takes the finder off ``sys.meta_path``. When ``GKX_JAX_CACHE`` says
    off at that moment, it leaves at once and touches nothing.

    The ``.pth`` line's finder hands ``find_spec`` for ``jax`` over to this one, so it acts for
    whichever finder of this name is on ``sys.meta_path``.
    """

    @staticmethod
    def find_spec(name: str, path: "Sequence[str] | None" = None,
                  target: "ModuleType | None" = None) -> "ModuleSpec | None":
        if name != TARGET:
            return None
        finders = sys.meta_path
        mine = [i for i, f in enumerate(finders) if is_finder(f)]
        if not mine:  # already gone: another thread configured jax, or is configuring it
            return None
        finder = finders[mine[0]]
        if _off(os.environ.get("GKX_JAX_CACHE")):
            # The opt-out, checked here and not by the .pth line, whose every token costs every
            # process of the environment: reading it there cost 0.16 M instructions per start
            # (README, Benchmarks). Nothing of jax is touched, and the finder leaves as if it had
            # never been there.
            sys.meta_path = [f for f in finders if f is not finder]
            return None
        # Ask the finders after this one directly: importlib.util.find_spec would re-enter the
        # import system, and find us again.
        spec: ModuleSpec | None = None
        for other in finders[mine[0] + 1 :]:
            find = getattr(other, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            import weakref

            spec.loader = _ConfiguringLoader(spec.loader, finder)
            # A spec asked for before the import (importlib.util.find_spec: "is jax installed?")
            # outlives it: the import gives it JAX's own loader back. Weakly, as such checks drop
            # theirs and may ask again and again.
            _handed_out[:] = [ref for ref in _handed_out if ref() is not None] + [weakref.ref(spec)]
        return spec


# The specs whose loader the finder wrapped, until jax is imported.
_handed_out: "list[weakref.ref[ModuleSpec]]" = []


# What the .pth line's finder calls for jax. It passes the name only: while a finder is on
# sys.meta_path, jax has not been imported, so importlib asks with no path and no target.
find_spec = GkxAutocacheFinder.find_spec


class _ConfiguringLoader(_Loader):
    """Delegates to the real loader; after a successful ``exec_module``, puts the real loader
    back on the module and on every spec the finder handed out (so nothing of ours stays
    visible) and configures."""

    def __init__(self, loader: "_Loader", finder: object) -> None:
        self._loader = loader
        self._finder = finder

    def __getattr__(self, name: str) -> "Any":
        return getattr(self._loader, name)

    def create_module(self, spec: "ModuleSpec") -> "ModuleType | None":
        return self._loader.create_module(spec)

    def exec_module(self, module: "ModuleType") -> None:
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
            while _handed_out:
                early = _handed_out.pop()()
                if early is not None and isinstance(early.loader, _ConfiguringLoader):
                    early.loader = early.loader._loader
            _configure_now(module)
        except Exception:
            pass


def __getattr__(name: str) -> object:
    """``gkx_autocache.AutocacheWarning``, and the Python API (``stats()``, ``explain()``,
    ``status()``, ``AutocacheError``: ``_api``), loaded on first use: nothing at start-up."""
    if name == "AutocacheWarning":
        from gkx_autocache._diagnostics import AutocacheWarning

        return AutocacheWarning
    if name in ("stats", "explain", "status", "AutocacheError"):
        from gkx_autocache import _api

        return getattr(_api, name)
    raise AttributeError(f"module 'gkx_autocache' has no attribute {name!r}")


def __dir__() -> "list[str]":
    """The module's names with the API ``__getattr__`` loads on first use (tab completion, ``help()``),
    less the modules it imports for its own use: listing them loads nothing."""
    return sorted({*globals(), *__all__} - {"os", "sys", "TYPE_CHECKING"})
