"""The package's shape (STYLE.md): the arrows between its modules go one way."""

from __future__ import annotations

import ast
import re
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
    """`_layout` and the table of levels (`_backends.schemes`) are leaves; `_remote` knows fsspec,
    the layout and the table, not the ledger or entry rules."""
    graph = imports()
    assert graph["_layout"] == set() and graph["_backends.schemes"] == set()
    assert graph["_remote"] <= {"_layout", "_backends.schemes"}
    assert graph["_trust"] == set()


def test_the_lower_rooms_import_nothing_of_the_higher_ones() -> None:
    """The arrows issue 43 turned around stay turned: the ledger and its index, the store, the
    entries and the shared level's directory import nothing of the explainer or the store above
    them, nor the shared level anything of the bookkeeping (the causes are a leaf, ``_causes``; the
    index is ``_record``'s; the sidecar ``_formats``'; a prefetch's room under the cap is handed to
    the level by ``_configure``); nothing outside the command line imports it (the API reads the
    commands' read models: ``_context``, ``_status``, ``_record.show``, ``_explain.report``)."""
    graph = imports()
    upward = {(module, found) for module, imported in graph.items() for found in imported
              if (module.startswith("_record") or module in ("_store", "_entries")) and found.startswith("_explain")
              or (module in ("_entries", "_backends.directory") and found == "_store")
              or (module.startswith("_shared") and found.startswith("_record"))
              or (module not in ("__main__",) and not module.startswith("_cli") and found.startswith("_cli"))}
    assert upward == set(), sorted(upward)
    assert graph["_causes"] <= {"_jax.hooks"}
    assert "_cache" not in graph["_policy"] and graph["_userdirs"] <= {"_diagnostics"}  # settings below the directory


# Another library's names the package must reach (fsspec's async methods; pytest's config, which
# plugins keep their state on), and a finder undoing its own loader: not the package's objects.
# Other libraries' names that have no public spelling: s3fs's calls, argparse's actions (what the
# completion script is made from: argparse has no public way to list a parser's options)
FOREIGN_PRIVATES = {"fs._call_s3", "fs._pipe_file", "fs._ls", "fs._rm_file", "config._gkx_autocache", "early.loader._loader",
                    "parser._actions", "command._actions", "sub._choices_actions"}


def private_reads(text: str) -> set[str]:
    """``obj._name`` where ``obj`` is neither ``self``/``cls`` nor a module the file imports."""
    tree = ast.parse(text)
    modules = {(a.asname or a.name).split(".")[0] for node in ast.walk(tree)
               if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
    return {ast.unparse(node) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls", *modules})}


def test_no_object_reads_another_s_private_names() -> None:
    """Objects talk through what they make public (issue 43: prefetch read 24 of the shared
    level's private names); JAX's own are `_jax`'s to name."""
    found = {module: names - FOREIGN_PRIVATES for module, text in sources().items()
             if not module.startswith("_jax.") and (names := private_reads(text)) - FOREIGN_PRIVATES}
    assert not found, found


def test_no_module_uses_another_module_s_private_names() -> None:
    """A module's ``_name`` is its own: another module that needs it gets a public name (issue 43:
    the bookkeeping's fold and reset called ``_locks._lock`` and ``_fold._fold``)."""
    used = []
    for module, text in sources().items():
        tree = ast.parse(text)
        own = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
               and node.module.startswith("gkx_autocache") for a in node.names if is_module(f"{node.module[14:]}.{a.name}".lstrip("."))}
        used += [f"{module}:{node.lineno} {ast.unparse(node)}" for node in ast.walk(tree)
                 if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in own
                 and node.attr.startswith("_") and not node.attr.startswith("__")]
        used += [f"{module}:{node.lineno} {a.name}" for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gkx_autocache")
                 for a in node.names if a.name.startswith("_") and not a.name.startswith("__")
                 and not is_module(f"{node.module[14:]}.{a.name}".lstrip("."))]
    assert not used, used


def test_the_private_name_finder_finds_one() -> None:
    """The check above can fail."""
    assert private_reads("import os\nclass A:\n    def f(self, level):\n        return level._queue, self._x, os._exit")\
        == {"level._queue"}


# Issue 43 wired 13 collaborators into objects after construction (the recorder's shared level, the
# key seam's listener, the shared level's callbacks into the store...); issue 60 the last one (the
# store ``attach``ed to the level). The check is general, not a list of names: a function sets an
# attribute only on what it created or owns, so that a back-reference or a late wiring fails.
# Owned: ``self``/``cls``; what the class made itself (``self.x = Thing()``, then ``self.x.y = ...``);
# a name the function (or the function around it) bound to a new object (a call's result, a literal);
# a module's own private state (``_current.progress``); Python's protocols (a dunder, ``__wrapped__``;
# the interpreter's ``sys.meta_path``, which the import hook rebinds). JAX's objects are patched in
# ``_jax`` alone.
# Other libraries' protocols: the import system's (a module spec's loader, which the import hook
# hands back), pytest's (a plugin keeps its state on pytest's config).
PYTHON_PROTOCOL = {"loader", "_gkx_autocache"}


def _new(value: ast.expr | None) -> bool:
    """A new object: a call's result (a class's instance, a factory's), or a literal; or one made
    unless given (``x if x is not None else threading.local()``)."""
    if isinstance(value, ast.IfExp):
        return _new(value.body) or _new(value.orelse)
    return isinstance(value, (ast.Call, ast.Dict, ast.List, ast.Set, ast.Tuple, ast.Lambda))


def _names(target: ast.expr) -> list[str]:
    """The names an assignment binds (``a``, ``a, b``), not those it reads (``a.b = ``, ``a[1] = ``)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _names(element)]
    return _names(target.value) if isinstance(target, ast.Starred) else []


def _bound_new(scope: ast.AST) -> set[str]:
    """The names ``scope`` binds to a new object, its inner functions' included: of a tuple, only
    those whose own value is new (``part, store = Part(), level.store``: ``part`` alone)."""
    return {name for node in ast.walk(scope) if isinstance(node, (ast.Assign, ast.AnnAssign))
            for t, v in _pairs(node) if v is None and _new(node.value) or v is not None and _new(v)
            for name in _names(t)}


def wirings(text: str) -> list[str]:
    """``obj.name = ...`` in any function, where ``obj`` is not the function's own (above)."""
    tree = ast.parse(text)
    own_globals = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                   for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                   if isinstance(t, ast.Name) and t.id.startswith("_")}
    own_globals |= {node.name for node in tree.body if isinstance(node, ast.ClassDef) and node.name.startswith("_")}
    found = []
    scopes: list[ast.Module | ast.ClassDef] = [tree, *(node for node in ast.walk(tree) if isinstance(node, ast.ClassDef))]
    for cls in scopes:
        made = {ast.unparse(t) for node in ast.walk(cls) if isinstance(node, (ast.Assign, ast.AnnAssign)) and _new(node.value)
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
        # Each outermost function, with the functions inside it: a closure sets what its function made.
        functions = [node for node in cls.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for function in functions:
            created = _bound_new(function) | {t.id for node in ast.walk(function) if isinstance(node, ast.Assign)
                                              for t, v in _pairs(node)  # (its own part, by another name)
                                              if isinstance(t, ast.Name) and v is not None and ast.unparse(v) in made}
            for node in ast.walk(function):
                targets = (node.targets if isinstance(node, ast.Assign)
                           else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
                for target in (t for whole in targets for t in ast.walk(whole)):
                    if (not isinstance(target, ast.Attribute) or not isinstance(target.ctx, ast.Store)
                            or not isinstance(node, ast.stmt)
                            or target.attr.startswith("__") or target.attr in PYTHON_PROTOCOL):
                        continue
                    obj = target.value
                    if (isinstance(obj, ast.Name) and obj.id in {"self", "cls", "sys", *created, *own_globals}
                            or ast.unparse(obj) in made):
                        continue
                    found.append(f"{node.lineno} {ast.unparse(target)}")
    return sorted(set(found), key=lambda line: int(line.split()[0]))


def test_collaborators_are_given_at_construction() -> None:
    """No function sets an attribute on an object or module it did not create (issue 43: 13 such
    wirings; issue 60: the last, ``attach``): a collaborator is a constructor's argument."""
    found = {module: names for module, text in sources().items()
             if not module.startswith("_jax.") and (names := wirings(text))}
    assert not found, found


def test_the_wiring_finder_finds_one() -> None:
    """The check above can fail: on a late wiring, a back-reference, a module's state set from
    outside; not on what the function or its object made."""
    assert wirings("def f(recorder, watch):\n    recorder.explainer = watch\n    self.levels = None\n")\
        == ["2 recorder.explainer"]
    assert wirings("class A:\n    def __init__(self, level):\n        self.part = Part()\n        level.owner = self\n"
                   "    def g(self):\n        self.part.x = 1\n        self.level.y = 2\n")\
        == ["4 level.owner", "7 self.level.y"]
    assert wirings("import _cpu_target\ndef f(t):\n    _cpu_target.active = t\n    x = Seam()\n    x.hook = t\n")\
        == ["3 _cpu_target.active"]


# The late wirings issue 68 found the check above missing, each a kind of its own (``late_wirings``):
# a name bound to a factory's result counted as the function's own (a factory may hand back a shared
# object); a tuple's names all counted new where one was; writes into another object's containers
# (a level popping its prefetch's dicts, uploads writing into the channel's listing); a method other
# than ``__init__`` that keeps a collaborator it is given (``landing.open(land, ...)``); and a
# constructor given a bound method of the object that keeps what it builds (a back-reference).
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "setdefault", "add",
            "discard", "appendleft", "popleft", "sort"}
VALUES = {"str", "int", "float", "bool", "bytes", "None", "dict", "list", "set", "tuple", "frozenset", "Any", "object",
          "Mapping", "Sequence", "Iterable", "Path", "Literal"}


def _class_made(value: ast.expr | None) -> bool:
    """A new object for certain: a class's instance (a capitalised name called), a literal, a lambda;
    a factory's result (``make_level(...)``) may be an object someone else holds."""
    if isinstance(value, ast.IfExp):
        return _class_made(value.body) or _class_made(value.orelse)
    if isinstance(value, ast.Call):
        name = value.func.attr if isinstance(value.func, ast.Attribute) else getattr(value.func, "id", "")
        return name[:1].isupper() or name in ("local", "Lock", "RLock", "Event", "Condition", "deque", "partial",
                                              "dict", "list", "set", "frozenset", "tuple")
    return isinstance(value, (ast.Dict, ast.List, ast.Set, ast.Tuple, ast.Lambda, ast.Constant, ast.JoinedStr))


def _pairs(node: ast.Assign | ast.AnnAssign) -> list[tuple[ast.expr, ast.expr | None]]:
    """Each name or attribute an assignment binds, with the value it gets (a tuple paired element by
    element; a tuple unpacked from one value: that value for each)."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    found: list[tuple[ast.expr, ast.expr | None]] = []
    for target in targets:
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(node.value, (ast.Tuple, ast.List)) \
                and len(target.elts) == len(node.value.elts):
            found.extend(zip(target.elts, node.value.elts, strict=True))
        elif isinstance(target, (ast.Tuple, ast.List)):
            found.extend((element, None) for element in target.elts)  # (from a call: a factory's)
        else:
            found.append((target, node.value))
    return found


def _params(function: ast.AST) -> set[str]:
    return {a.arg for node in ast.walk(function) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]} - {"self", "cls"}


def _active_classes() -> set[str]:
    """The package's classes that do things (a method besides dunders): its collaborators; the rest
    are records (a run, a receipt, an entry), which any code may fill."""
    return {node.name for text in sources().values() for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.ClassDef) and not any(b for b in node.bases if "NamedTuple" in ast.unparse(b))
            and any(isinstance(n, ast.FunctionDef) and not n.name.startswith("__") for n in node.body)}


def _collaborator(annotation: ast.expr | None, active: set[str]) -> bool:
    """A parameter's annotation that names another object that does things: a Callable, or one of
    the package's active classes (``_active_classes``), not a value or a record."""
    if annotation is None:
        return False
    names = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(annotation) if isinstance(n, (ast.Name, ast.Attribute))}
    return "Callable" in names or bool(names & active)


THREADS = ("Thread", "Timer")  # a thread runs a method of the object that keeps it: no back-reference


def late_wirings(text: str, active: set[str] | None = None) -> list[str]:
    """The late wirings ``wirings`` does not see (the comment above), ``"<line> <kind>: <code>"``: in
    a class's methods, where one object talks to another."""
    active = _active_classes() if active is None else active
    tree = ast.parse(text)
    found = []
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        methods = {node.name for node in cls.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for function in (node for node in cls.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))):
            annotations = {a.arg: a.annotation for a in [*function.args.args, *function.args.kwonlyargs]}
            held = {a for a, annotation in annotations.items() if _collaborator(annotation, active)}
            # Names for what ``self`` holds (``ahead = self._prefetch``): another object, by another name.
            aliases = {t.id for node in ast.walk(function) if isinstance(node, ast.Assign)
                       for t, v in _pairs(node) if isinstance(t, ast.Name) and isinstance(v, ast.Attribute)
                       and ast.unparse(v.value) == "self"}
            factory = {t.id for node in ast.walk(function) if isinstance(node, (ast.Assign, ast.AnnAssign))
                       for t, v in _pairs(node) if isinstance(t, ast.Name) and isinstance(v, ast.Call) and not _class_made(v)}

            def others(base: ast.expr, aliases: set[str] = aliases, held: set[str] = held) -> bool:
                """Another object's: what self holds, or a collaborator given."""
                root = ast.unparse(base.value) if isinstance(base, ast.Attribute) else ""
                return root.startswith("self.") or root in aliases or root in held

            for node in ast.walk(function):
                if isinstance(node, ast.Assign):
                    for target, value in _pairs(node):
                        if (function.name != "__init__" and not function.name.startswith("__")
                                and isinstance(target, ast.Attribute) and ast.unparse(target.value) == "self"
                                and isinstance(value, ast.Name) and value.id in held):
                            found.append(f"{node.lineno} method-call wiring: {ast.unparse(node)}")
                        if isinstance(target, ast.Subscript) and others(target.value):
                            found.append(f"{node.lineno} into another's data: {ast.unparse(target)}")
                        if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                                and target.value.id in factory and value is not None
                                and target.attr not in PYTHON_PROTOCOL
                                and any(isinstance(n, ast.Name) and n.id in ("self", *held) for n in ast.walk(value))):
                            found.append(f"{node.lineno} a factory's result wired: {ast.unparse(node)}")
                if not isinstance(node, ast.Call):
                    continue
                if (isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
                        and isinstance(node.func.value, ast.Attribute) and others(node.func.value)):
                    found.append(f"{node.lineno} into another's data: {ast.unparse(node)[:80]}")
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name not in THREADS and _class_made(node) and any(  # a constructor given a bound method of its keeper
                        isinstance(a, ast.Attribute) and ast.unparse(a.value) == "self" and a.attr in methods
                        for a in [*node.args, *(k.value for k in node.keywords)]):
                    found.append(f"{node.lineno} a bound method of its keeper: {ast.unparse(node)[:80]}")
    return sorted(set(found), key=lambda line: int(line.split()[0]))


def test_no_late_wiring_of_any_kind() -> None:
    """Issue 68: the check above stayed green over tuple aliases, factory results, writes into another
    object's containers and wiring by a method call; ``late_wirings`` finds each (shown failing below)."""
    active = _active_classes()  # (once: for each module, it parsed every module again, 43 s of CPU)
    found = {module: names for module, text in sources().items()
             if not module.startswith("_jax.") and (names := late_wirings(text, active))}
    assert not found, found


def test_the_late_wiring_finder_finds_each_kind() -> None:
    """Each kind, on a scratch example, found; and what is not one, not."""
    active = {"Level", "Channel", "Land", "Prefetch"}
    assert wirings("def f(level):\n    part, store = Part(), level.store\n    store.owner = level\n") == ["3 store.owner"]
    assert late_wirings("class A:\n    def f(self, level: Level):\n        uploads = make_uploads()\n"
                        "        uploads.level = level\n        summary = fold()\n        summary.size = 5\n", active) == [
        "4 a factory's result wired: uploads.level = level"]
    assert late_wirings("class A:\n    def get(self, key):\n        ahead = self._prefetch\n        ahead.refused.pop(key)\n"
                        "        self.counts.pop(key)\n", active) == ["4 into another's data: ahead.refused.pop(key)"]
    assert late_wirings("class A:\n    def f(self, channel: Channel):\n        channel.listing[name] = 1\n", active) == [
        "3 into another's data: channel.listing[name]"]
    assert late_wirings("class Landing:\n    def open(self, land: Land, writable: bool) -> None:\n"
                        "        self._land, self._writable = land, writable\n", active) == [
        "3 method-call wiring: self._land, self._writable = (land, writable)"]
    assert late_wirings("class Level:\n    def __init__(self):\n        self.uploads = Uploads(self.channel, self._read)\n"
                        "    def _read(self):\n        pass\n", active) == [
        "3 a bound method of its keeper: Uploads(self.channel, self._read)"]
    assert late_wirings("class Level:\n    def __init__(self, local):\n        self.uploads = Uploads(local.read)\n"
                        "        self.worker = threading.Thread(target=self._run)\n    def _run(self):\n        pass\n",
                        active) == []


def test_cycle_finder_finds_a_circle() -> None:
    """The check above can fail."""
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def sources() -> dict[str, str]:
    return {module_of(path): path.read_text() for path in sorted(PACKAGE.rglob("*.py"))}


def test_every_cause_is_named_once_with_its_fix() -> None:
    """Cause names and reasons are `_causes`' constants: no `{"cause": "<text>"}` elsewhere,
    and every cause and reason has its fix there (or one `fix_for` builds from a setting)."""
    from gkx_autocache import _causes as causes
    from gkx_autocache._explain.classify import LABELS

    literal = []
    for module, text in sources().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Dict):  # {"cause": ...}
                for key, value in zip(node.keys, node.values, strict=True):
                    if (isinstance(key, ast.Constant) and key.value == "cause"
                            and isinstance(value, (ast.Constant, ast.JoinedStr))):
                        literal.append(f"{module}:{node.lineno}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "uncached"
                    and len(node.args) > 1 and isinstance(node.args[1], (ast.Constant, ast.JoinedStr))):
                literal.append(f"{module}:{node.lineno}")  # recorder.uncached(key, <reason>, ...)
    assert not literal, literal
    named = {v for k, v in vars(causes).items()
             if k.isupper() and isinstance(v, str) and k not in ("NOT_CACHED", "EVERY_RUN", "HOOK")}
    built = {causes.EVICTED, causes.BELOW_MIN_COMPILE_TIME, causes.BELOW_MIN_ENTRY_SIZE, causes.WRITE_FAILED}
    changed = {causes.changed(label) for part, label in LABELS.items() if part not in ("computation", "XLA flags")}
    assert named - built - set(causes.FIXES) == set()
    assert changed - set(causes.FIXES) == set(), changed - set(causes.FIXES)


def test_jax_internals_are_named_in_the_jax_adapter_alone() -> None:
    """`jax._src` is reached through the `_jax` folder only: one place knows each JAX line's seams."""
    named = sorted(module for module, text in sources().items() if "jax._src" in text)
    assert named and all(module.startswith("_jax.") for module in named), named


def test_no_module_is_a_drawer() -> None:
    """No module over 800 lines (the command line's over 450), no module docstring over 25 lines:
    the design reasoning lives in docs/how-it-works.md, once. The ceiling is generous on purpose: a
    size is a symptom, never a target (code moved out by line count, as functions of ``level: Any``
    reading its privates, made the house worse); a module near it asks to be cut by responsibility."""
    too_long = {m: t.count("\n") for m, t in sources().items() if t.count("\n") > (450 if m.startswith("_cli.") else 800)}
    assert not too_long, too_long
    essays = {m: len(d.splitlines()) for m, t in sources().items()
              if (d := ast.get_docstring(ast.parse(t))) and len(d.splitlines()) > 25}
    assert not essays, essays


def test_subpackages_init_are_empty() -> None:
    """A subpackage's `__init__.py` is empty: importing one of its modules costs that module alone."""
    filled = [str(p.relative_to(PACKAGE)) for p in PACKAGE.glob("*/__init__.py") if p.read_text().strip()]
    assert not filled, filled


def test_the_process_is_one_object() -> None:
    """Issue 68: five module globals carried the process's cache (its store, its recorder, its
    cpu_target, the key's seam, the configured flag); a test faked a fresh process by snapshotting
    each. One ``global`` is left: the process object itself (``_process.current``)."""
    found = sorted(f"{module}:{node.lineno} {', '.join(node.names)}" for module, text in sources().items()
                   for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Global))
    assert [line.split(":")[0] for line in found] == ["_process"] and found[0].endswith("current"), found


# A scheme spelled as a URL's start (``s3://``), or alone as a word a URL's scheme is compared with.
# A link with a host of its own (``https://bford.info/cachedir/``, the tag's text) names no scheme.
SCHEME_FORM = re.compile(r"(?<![\w+.-])(?:s3|gs|az|azure|https?)://(?![a-z0-9-]+(?:\.[a-z0-9-]+)+/)", re.I)
SCHEME_WORDS = {"s3", "gs", "az", "azure", "http", "https"}


def scheme_names(text: str) -> list[str]:
    """The string literals of code that name a scheme: docstrings and comments say which schemes a
    module serves in prose, and are not read (only code can dispatch on one)."""
    tree = ast.parse(text)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [f"{node.lineno} {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and (SCHEME_FORM.search(node.value) or node.value.lower() in SCHEME_WORDS)]


def test_schemes_are_named_by_the_backends_and_their_table_alone() -> None:
    """Adding a level is its backend module and one row of ``_backends/schemes.py`` (issue 68): the
    settings, ``status``, the install check and maintenance read the table, and no other module
    compares a URL's scheme or says one."""
    named = {module: found for module, text in sources().items()
             if not module.startswith("_backends.") and (found := scheme_names(text))}
    assert not named, named


def test_the_scheme_finder_finds_one() -> None:
    """The check above can fail: on a scheme compared or said in code; not in a docstring, a
    comment or a link."""
    assert scheme_names('"""Reads s3:// and gs://."""\n# az://\nif scheme in ("http", "https"):\n'
                        '    say(f"a gs://bucket or {x}")\nTAG = "see https://bford.info/cachedir/"\n') \
        == ["3 'http'", "3 'https'", "4 'a gs://bucket or '"]


def backend_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Imports of a backend's module from outside ``_backends/``: only the port, the table and its
    chooser are the rest of the package's to import."""
    allowed = {"_backends.port", "_backends.schemes", "_backends.choose"}
    return {(module, found) for module, imported in graph.items() if not module.startswith("_backends.")
            for found in imported if found.startswith("_backends.") and found not in allowed}


def test_no_module_outside_the_backends_imports_one() -> None:
    """The level, its uploads, status and the commands see a backend through the port alone (issue
    68: uploads imported HTTP's 413 rule, set-up and status each backend's module)."""
    assert backend_imports(imports()) == set()
    assert backend_imports({"_shared.uploads": {"_backends.http", "_backends.port"}}) == {("_shared.uploads", "_backends.http")}
