"""Installed versions that make every ``import jax`` of the environment slower, found from the
distributions' metadata alone (nothing of them imported: ``status`` never imports jax or NumPy):
``status`` and ``explain`` name the cost and the fix. The ``[jax]`` extra holds them off where it
can (pyproject.toml); an environment made without it, or a NumPy pinned by hand, still gets them."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from gkx_autocache._context import distribution_version
from gkx_autocache._jax.versions import version_tuple

# ml_dtypes 0.7.0 registers its ufunc loops in quadratic time with a NumPy before 2.5: 0.47 -> 1.08 s
# of CPU for `import jax` (JAX 0.10.2, NumPy 2.4.6, Python 3.11, bytecode installed; medians of 7,
# docs/benchmarks.md). NumPy 2.5 needs Python 3.12, so 3.11's newest NumPy (2.4) always pays it.
SLOW_ML_DTYPES = (0, 7, 0)
FIXED_NUMPY = (2, 5, 0)


def slow_import(version: Callable[[str], str | None] = distribution_version,
                python: tuple[int, int] = (sys.version_info[0], sys.version_info[1])) -> dict[str, Any] | None:
    """What slows ``import jax`` here, as ``status --json`` and ``explain --json`` give it (``why``,
    ``cost``, ``fix``, the versions), or None where nothing known does (or JAX is not installed)."""
    if version("jax") is None:
        return None
    ml_dtypes, numpy = version("ml_dtypes"), version("numpy")
    found, base = version_tuple(ml_dtypes or ""), version_tuple(numpy or "")
    if found is None or base is None or found < SLOW_ML_DTYPES or base >= FIXED_NUMPY:
        return None
    if python >= (3, 12):
        fix = "pip install 'ml_dtypes<0.7', or a NumPy of 2.5 or later: pip install -U 'numpy>=2.5'"
    else:
        fix = "pip install 'ml_dtypes<0.7' (NumPy 2.5, which fixes it too, needs Python 3.12)"
    return {"ml_dtypes": ml_dtypes, "numpy": numpy,
            "why": f"ml_dtypes {ml_dtypes} with NumPy {numpy}: ml_dtypes 0.7 registers its loops in quadratic "
                     "time under a NumPy before 2.5",
            "cost": "about 0.6 s more CPU at every import jax (0.47 -> 1.08 s measured)", "fix": fix}


def said(found: dict[str, Any]) -> str:
    """The one line ``status`` and ``explain`` print."""
    return f"import jax is slow here: {found['why']}, {found['cost']}; fix: {found['fix']}"
