"""How many of the suite's test functions need a virtual environment (issue 60: at most 45 %; issue 68: 30 %).

    python benchmarks/venv_share.py [--list] [pytest arguments, e.g. tests/test_cli.py]

Collects the suite (no test runs) and counts test functions, a parametrized test once. A test
function needs a venv when conftest's venv fixtures (`venv`, `bare_venv`) are in its fixture
closure, or it or a fixture in that closure calls `make_venv` itself (a test that builds a second
environment, or a scenario built once). It needs one *of its own* when that venv is made for it
alone: a function-scoped fixture or its own body. One shared by a module or a session (a scenario
several tests assert on) is counted apart. Prints each count and its percentage; `--list` also
prints each function that needs a venv of its own, by file.
"""

from __future__ import annotations

import inspect
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV_FIXTURES = ("venv", "bare_venv")


def _code_names(code: Any) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if inspect.iscode(const):
            names |= _code_names(const)
    return names


def _calls_make_venv(function: Any, seen: set[int] | None = None) -> bool:
    """Whether ``function``, or a function of its module it calls (at any depth), calls ``make_venv``."""
    seen = set() if seen is None else seen
    function = inspect.unwrap(function)
    code = getattr(function, "__code__", None)
    if code is None or id(code) in seen:
        return False
    seen.add(id(code))
    names = _code_names(code)
    if "make_venv" in names:
        return True
    module_globals = getattr(function, "__globals__", {})
    return any(inspect.isfunction(module_globals.get(name)) and module_globals[name].__module__ == function.__module__
               and _calls_make_venv(module_globals[name], seen) for name in names)


class Counter:
    def __init__(self) -> None:
        # function id -> "own" | "shared" | "none"; the strongest over its parametrized items
        self.kind: dict[str, str] = {}

    def _kind(self, item: pytest.Item) -> str:
        info = getattr(item, "_fixtureinfo", None)
        function = getattr(item, "function", None)
        if info is None or function is None:
            return "none"
        if _calls_make_venv(function):
            return "own"
        found = "none"
        for name in info.names_closure:
            for fixturedef in info.name2fixturedefs.get(name, ()):
                makes = name in VENV_FIXTURES or _calls_make_venv(fixturedef.func)
                if not makes:
                    continue
                if fixturedef.scope == "function":
                    return "own"
                found = "shared"
        return found

    @pytest.hookimpl
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        rank = {"none": 0, "shared": 1, "own": 2}
        for item in session.items:
            function = item.nodeid.split("[", 1)[0]
            kind = self._kind(item)
            if rank[kind] >= rank[self.kind.get(function, "none")]:
                self.kind[function] = kind


def main(argv: list[str]) -> int:
    listing = "--list" in argv
    args = [a for a in argv if a != "--list"] or [str(ROOT / "tests")]
    counter = Counter()
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:gkx_autocache",
                        "--rootdir", str(ROOT), *args], plugins=[counter])
    if code not in (0, 5):
        return int(code)
    total = len(counter.kind)
    own = [f for f, k in counter.kind.items() if k == "own"]
    shared = [f for f, k in counter.kind.items() if k == "shared"]
    if listing:
        by_file: dict[str, list[str]] = defaultdict(list)
        for function in own:
            path, _, name = function.partition("::")
            by_file[path].append(name)
        for path in sorted(by_file):
            print(f"{path}: {len(by_file[path])}")
            for name in by_file[path]:
                print(f"    {name}")
    print(f"test functions: {total}")
    print(f"need a venv of their own: {len(own)} ({100 * len(own) / max(total, 1):.1f} %)")
    print(f"share a venv made once for a module or session: {len(shared)} ({100 * len(shared) / max(total, 1):.1f} %)")
    print(f"need a venv, either way: {len(own) + len(shared)} ({100 * (len(own) + len(shared)) / max(total, 1):.1f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
