"""gkx-autocache: JAX's persistent compilation cache, on for every process in the environment.

This module is imported at every interpreter start (by ``gkx_autocache.pth``), so it imports
nothing: the public names are loaded on first use.
"""

__all__ = ["AutocacheWarning", "install"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gkx_autocache._bootstrap import install
    from gkx_autocache._diagnostics import AutocacheWarning


def __getattr__(name: str) -> object:
    if name == "install":
        from gkx_autocache._bootstrap import install

        return install
    if name == "AutocacheWarning":
        from gkx_autocache._diagnostics import AutocacheWarning

        return AutocacheWarning
    raise AttributeError(f"module 'gkx_autocache' has no attribute {name!r}")
