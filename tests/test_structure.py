"""The package's shape (STYLE.md): the arrows between its modules go one way."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "gkx_autocache"


def module_of(path: Path) -> str:
    """`_cache` for `_cache.py`, `_shared.level` for `_shared/level.py`, `__init__` for the package's."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1]) if parts[-1] == "__init__" and len(parts) > 1 else ".".join(parts)


def is_module(name: str) -> bool:
    path = PACKAGE.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imports() -> dict[str, set[str]]:
    """Each module's imports of the package's own modules, inside functions too."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_of(path)
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gkx_autocache"):
                base = node.module.removeprefix("gkx_autocache").lstrip(".")
                names = [f"{base}.{a.name}" if base else a.name for a in node.names]
                submodules = {name for name in names if is_module(name)}
                found.update(submodules)
                if len(submodules) < len(names):
                    found.add(base or "__init__")
            elif isinstance(node, ast.Import):
                found.update(a.name.removeprefix("gkx_autocache.") for a in node.names if a.name.startswith("gkx_autocache."))
        graph[module] = found - {module}
    return graph


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle() -> None:
    """No circle among the package's modules, counting imports inside functions; the start-up
    module reaching `_configure` lazily (on `import jax`), and its lazy re-export of
    `AutocacheWarning`, are the allowed back-edges."""
    graph = imports()
    graph["__init__"] -= {"_configure", "_diagnostics"}
    assert cycle(graph) is None, " -> ".join(cycle(graph) or [])


def test_no_module_but_the_start_up_module_imports_it() -> None:
    """`__init__` reaches `_api` lazily for the public names; a module of the package importing
    `__init__` back would close a circle (the constants it shares are `_layout`'s)."""
    assert [module for module, found in imports().items() if "__init__" in found] == []


def test_the_start_up_names_agree_with_the_layout() -> None:
    """`__init__` and the .pth line keep literal copies of the finder's name, the target and the
    opt-out words (importing `_layout` or `_settings` at start-up would cost every process):
    they are the same as `_layout`'s and `_settings`'s."""
    import gkx_autocache
    from gkx_autocache import _layout, _settings

    assert (gkx_autocache.TARGET, gkx_autocache.FINDER) == (_layout.TARGET, _layout.FINDER)
    assert frozenset(gkx_autocache._FALSE) == _settings.FALSE
    line = (PACKAGE.parent.parent / "gkx_autocache.pth").read_text()
    assert f'"{_layout.FINDER}" in' in line and f"def {_layout.FINDER}(" in line
    assert f'if name == "{_layout.TARGET}"' in line


def test_the_command_line_loads_a_command_s_module_only_when_it_runs() -> None:
    """`_cli.main` imports none of the commands' modules at its top level: `--version` and `dir`
    load none of them, and each command loads only its own."""
    tree = ast.parse((PACKAGE / "_cli" / "main.py").read_text())
    top = {node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.module}
    top |= {f"{node.module}.{a.name}" for node in tree.body if isinstance(node, ast.ImportFrom) and node.module
            for a in node.names}
    commands = {"status", "stats", "explain", "ci", "manage", "config", "demo"}
    assert not {f"gkx_autocache._cli.{name}" for name in commands} & top


def test_the_leaves_import_nothing_of_the_package_but_the_layout() -> None:
    """`_layout` is a leaf; `_remote` knows fsspec and the layout, not the ledger or entry rules."""
    graph = imports()
    assert graph["_layout"] == set()
    assert graph["_remote"] <= {"_layout"}
    assert graph["_trust"] == set()


def test_cycle_finder_finds_a_circle() -> None:
    """The check above can fail."""
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
