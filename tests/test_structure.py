"""tapeworks' module structure, checked statically (`ast`; nothing is imported or run).

Four rules of docs/ARCHITECTURE.md and design/trainer-split.md (sections 5 and 6):
(a) no import cycle among tapeworks' modules, function-level imports included;
(b) no module reads another tapeworks module's private (`_underscore`) names, tests included;
(c) no module in `tapeworks/` over 600 lines;
(d) the engine's import layers: a module imports only from lower layers, and an engine
    room (a subpackage of tapeworks/engine/) never from a later room;
(e) the tree as documented: docs/layout.md names every module of tapeworks/, and tests/
    mirrors the engine's rooms.

Each failure lists every violation as `file:line: what. Fix: ...`.
"""

import ast
import collections
import dataclasses
import functools
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = "tapeworks"
MAX_LINES = 600

# The import layers. A module may import only from a lower layer, or from its
# own layer where that layer is one of the engine's rooms (SAME_LAYER_IMPORTS;
# rule (a) keeps a room free of cycles). A listed package (`tapeworks.data`,
# `tapeworks.engine.step`) stands for all its modules. The engine's rooms
# (docs/ARCHITECTURE.md, "The engine's rooms") come in order: what one step
# computes, what watches it, the data, the plan of how to call it, the
# resumable run; an earlier room never imports a later one. The front
# (`tapeworks/engine/*.py`) is placed module by module above the rooms: an
# existing front module that is not listed fails until it is placed, and so
# does a new room.
LAYERS = {
    # Layer 0: outside the engine, and knowing nothing of it. The root package
    # imports only xla_cache; its other names load on first use, and
    # `from tapeworks import Trainer` counts as an import of their module.
    "tapeworks": 0,
    "tapeworks.errors": 0,
    "tapeworks.fileio": 0,
    "tapeworks.xla_cache": 0,
    "tapeworks.data": 0,
    # The rooms, in order.
    "tapeworks.engine.step": 1,
    "tapeworks.engine.checks": 2,
    "tapeworks.engine.inputs": 3,
    "tapeworks.engine.plan": 4,
    "tapeworks.engine.resume": 5,
    # Layer 6: what the front uses beside the rooms: tf.distribute's strategies
    # and the workers' agreement, and pruning (whose masks are a step hook).
    "tapeworks.distribute": 6,
    "tapeworks.prune": 6,
    # The front. Layer 7: one checked configuration, the training state, the
    # progress line and the callbacks' logs.
    "tapeworks.engine.config": 7,
    "tapeworks.engine.training_state": 7,
    "tapeworks.engine.progress": 7,
    "tapeworks.engine.callback_bridge": 7,
    # Layer 8: compiled functions, and the plan of how to call them.
    "tapeworks.engine.compiled_steps": 8,
    "tapeworks.engine.call_plan": 8,
    # Layer 9: loops over calls, one epoch of fit, the test and predict loops.
    "tapeworks.engine.call_loop": 9,
    "tapeworks.engine.epoch": 9,
    "tapeworks.engine.evaluation": 9,
    # Layer 10: what explain measures.
    "tapeworks.engine.explanation": 10,
    # Layer 11: the public facade.
    "tapeworks.engine.trainer": 11,
    # Layer 12: above the Trainer. The engine package re-exports the Trainer
    # (lazily, PEP 562); the explain command line builds one.
    "tapeworks.engine": 12,
    "tapeworks.explain": 12,
    # The command line dispatches to explain's command line: one layer above it.
    "tapeworks.cli": 13,
}
ROOMS = ("tapeworks.engine.step", "tapeworks.engine.checks", "tapeworks.engine.inputs",
         "tapeworks.engine.plan", "tapeworks.engine.resume")
# Layers whose modules may import each other: layer 0's, each room's, and
# layer 6's (a package's modules import each other; distribute and prune do not).
SAME_LAYER_IMPORTS = {0, 6} | {LAYERS[room] for room in ROOMS}

# (relative path, private name) -> why the reach is unavoidable. Empty by design:
# give what is needed a public, documented name instead.
ALLOWED_PRIVATE = {}

FOREIGN = "<not tapeworks>"   # a local name bound to a module outside tapeworks


@dataclasses.dataclass(frozen=True)
class Source:
    path: pathlib.Path
    module: str          # "tapeworks.engine.trainer", "tests.engine.test_x"
    is_package: bool     # an __init__.py
    tree: ast.Module
    line_count: int

    @property
    def where(self):
        return self.path.relative_to(ROOT).as_posix()


@dataclasses.dataclass(frozen=True)
class Edge:
    source: Source
    line: int
    target: str


def _read(path, text=None):
    """The parsed file; `text` stands in for its content (the detectors' own tests)."""
    text = path.read_text(encoding="utf-8") if text is None else text
    parts = path.relative_to(ROOT).with_suffix("").parts
    is_package = parts[-1] == "__init__"
    module = ".".join(parts[:-1] if is_package else parts)
    return Source(path, module, is_package, ast.parse(text, filename=str(path)),
                  len(text.splitlines()))


@functools.lru_cache(maxsize=None)
def sources(folder):
    return tuple(_read(p) for p in sorted((ROOT / folder).rglob("*.py")))


@functools.lru_cache(maxsize=None)
def modules():
    """{module name: Source} of every tapeworks module and package."""
    return {s.module: s for s in sources(PACKAGE)}


def nearest_module(name):
    """The tapeworks module or package that `import name` loads last, or None."""
    while name:
        if name in modules():
            return name
        name = name.rpartition(".")[0]
    return None


def absolute_base(node, source):
    """The module an `ImportFrom` names, with relative imports resolved."""
    if not node.level:
        return node.module or ""
    package = source.module if source.is_package else source.module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def is_private(name):
    return name.startswith("_") and not name.startswith("__")


def _type_checking_only(tree):
    """The ids of nodes under `if TYPE_CHECKING:`: never run, so no import at run time.

    A lazily exporting package (`tapeworks`, `tapeworks.deploy`) imports its
    names there for type checkers and the API reference; what it loads at run
    time is still counted through its `_EXPORTS`.
    """
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
                "TYPE_CHECKING", "typing.TYPE_CHECKING"):
            skipped |= {id(child) for stmt in node.body for child in ast.walk(stmt)}
    return skipped


def imported(source):
    """(line, what the statement names, tapeworks module it loads) of every import.

    Module-level and function-level imports alike, and `importlib.import_module`
    with a literal name; not those under `if TYPE_CHECKING:`.
    """
    skipped = _type_checking_only(source.tree)
    for node in ast.walk(source.tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, nearest_module(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = absolute_base(node, source)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules():
                    yield node.lineno, full, full
                else:
                    # `from tapeworks import Trainer` loads what the package's lazy
                    # (PEP 562) `_EXPORTS` names: tapeworks.engine.trainer.
                    lazy = lazy_exports(base).get(alias.name)
                    yield node.lineno, full, lazy if lazy in modules() else nearest_module(base)
        elif isinstance(node, ast.Call) and _call_name(node) in (
                "importlib.import_module", "import_module") and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            yield node.lineno, node.args[0].value, nearest_module(node.args[0].value)


@functools.lru_cache(maxsize=None)
def lazy_exports(package):
    """{name: module} of a package's `_EXPORTS = {...}` literal (PEP 562 lazy names)."""
    source = modules().get(package)
    if source is None or not source.is_package:
        return {}
    for node in source.tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets):
            try:
                return dict(ast.literal_eval(node.value))
            except ValueError:
                return {}
    return {}


def _call_name(call):
    parts, node = [], call.func
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


@functools.lru_cache(maxsize=None)
def import_graph():
    """{module: {imported module: [Edge, ...]}} over tapeworks' modules."""
    graph = collections.defaultdict(lambda: collections.defaultdict(list))
    for source in sources(PACKAGE):
        for line, _, target in imported(source):
            if target and target != source.module:
                graph[source.module][target].append(Edge(source, line, target))
    return graph


def strongly_connected(graph):
    """Tarjan's components with more than one module, each a sorted list."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def shortest_path(graph, start, goal, allowed):
    """Breadth-first path start -> ... -> goal inside `allowed`, as a list of modules."""
    previous = {start: None}
    queue = collections.deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            path = []
            while node is not None:
                path.append(node)
                node = previous[node]
            return path[::-1]
        for nxt in sorted(graph.get(node, ())):
            if nxt in allowed and nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    return None


def _edge_lines(graph, a, b):
    return ",".join(str(e.line) for e in graph[a][b])


def test_no_import_cycle():
    graph = import_graph()
    problems = []
    for component in strongly_connected(graph):
        members = set(component)
        cycles = set()
        # One shortest cycle through each import inside the component: cutting
        # every listed cycle removes the component.
        for a in component:
            for b in graph[a]:
                if b in members:
                    back = shortest_path(graph, b, a, members)
                    cycle = [a] + back
                    turn = cycle.index(min(cycle[:-1]))
                    cycles.add(tuple(cycle[turn:-1] + cycle[:turn + 1]))
        for cycle in sorted(cycles, key=lambda c: (len(c), c)):
            steps = " -> ".join(
                f"{b} ({modules()[a].where}:{_edge_lines(graph, a, b)})"
                for a, b in zip(cycle, cycle[1:]))
            problems.append(f"import cycle: {cycle[0]} -> {steps}")
    assert not problems, (
        f"{len(problems)} import cycle(s) among tapeworks' modules (function-level imports "
        "count: they hide a cycle, they do not remove it). Expected none. Fix: move what "
        "both sides need into a lower module, or pass it in from the caller; "
        "design/trainer-split.md section 5 gives the layers.\n" + "\n".join(problems))


# ---------------------------------------------------------------------------
# (b) Private names


@functools.lru_cache(maxsize=None)
def class_private_names(source):
    """Private names a module's classes define: `def _x`, `_x = ...` in the body,
    `self._x = ...` / `cls._x = ...` anywhere in a method."""
    names = set()
    for cls in (n for n in ast.walk(source.tree) if isinstance(n, ast.ClassDef)):
        for item in cls.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    is_private(item.name):
                names.add(item.name)
            targets = item.targets if isinstance(item, ast.Assign) else \
                [item.target] if isinstance(item, ast.AnnAssign) else []
            names.update(t.id for t in targets if isinstance(t, ast.Name) and is_private(t.id))
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls") and \
                    is_private(node.attr):
                names.add(node.attr)
    return frozenset(names)


@functools.lru_cache(maxsize=None)
def tapeworks_private_attributes():
    """{private attribute name: modules whose classes define it}."""
    owners = collections.defaultdict(set)
    for source in sources(PACKAGE):
        for name in class_private_names(source):
            owners[name].add(source.module)
    return owners


def module_bindings(source):
    """{local name: tapeworks module it is bound to, or FOREIGN} from the file's imports."""
    bound = {}
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    target = alias.name if alias.name in modules() else None
                    bound[alias.asname] = target or (
                        FOREIGN if not alias.name.startswith(PACKAGE) else None)
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = top if top == PACKAGE else FOREIGN
        elif isinstance(node, ast.ImportFrom):
            base = absolute_base(node, source)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                local = alias.asname or alias.name
                if full in modules():
                    bound[local] = full
                elif not (base == PACKAGE or base.startswith(PACKAGE + ".")) and \
                        not base.startswith("tests"):
                    bound[local] = FOREIGN
    return {k: v for k, v in bound.items() if v is not None}


def _chain(node):
    """(root name, [attr, ...]) of a pure dotted expression `a.b.c`, else (None, None)."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return node.id, attrs[::-1]
    return None, None


def _is_own_object(node):
    """`self`, `cls`, `super()`, `type(self)`: the class's own members."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
        node.func.id == "super" or (node.func.id == "type" and len(node.args) == 1
                                    and _is_own_object(node.args[0])))


def private_reaches(source, owners=None):
    """[(line, private name, what, fix)] for one file.

    `owners`: {private attribute: modules whose classes define it}; by default
    tapeworks' own (`tapeworks_private_attributes`).
    """
    found = []
    bound = module_bindings(source)
    own_private = class_private_names(source)
    owners = tapeworks_private_attributes() if owners is None else owners

    def reached_class_private(line, name, how):
        if name in owners and name not in own_private:
            found.append((line, name, f"{how} private attribute `{name}` of a tapeworks class "
                                      f"(defined in {', '.join(sorted(owners[name]))})",
                          "use or add a public, documented attribute or method of that class"))

    for node in ast.walk(source.tree):
        if isinstance(node, ast.ImportFrom):
            base = absolute_base(node, source)
            if base == PACKAGE or base.startswith(PACKAGE + "."):
                for alias in node.names:
                    if is_private(alias.name) and base != source.module:
                        found.append((node.lineno, alias.name,
                                      f"imports the private name `{alias.name}` from {base}",
                                      f"give it a public, documented name in {base}"))
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            root, attrs = _chain(node.value)
            target = bound.get(root) if root else None
            if target == FOREIGN or _is_own_object(node.value):
                continue
            if target is not None:
                # `module._x` or `tapeworks.engine.trainer._x`: walk down the submodules.
                for attr in attrs:
                    if f"{target}.{attr}" not in modules():
                        target = None
                        break
                    target = f"{target}.{attr}"
                if target is not None:
                    if target != source.module:
                        found.append((node.lineno, node.attr,
                                      f"reads the private name `{node.attr}` of module {target}",
                                      f"give it a public, documented name in {target}"))
                    continue
            reached_class_private(node.lineno, node.attr, "reads")
        elif isinstance(node, ast.Call) and node.args:
            name = _call_name(node) or ""
            last = name.rpartition(".")[2]
            if last in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2 \
                    and isinstance(node.args[1], ast.Constant) and \
                    isinstance(node.args[1].value, str) and is_private(node.args[1].value) \
                    and not _is_own_object(node.args[0]):
                reached_class_private(node.lineno, node.args[1].value, f"{name}() on the")
            for arg in node.args[:1]:
                # monkeypatch.setattr("tapeworks.engine.x._y", ...)
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and \
                        re.fullmatch(rf"{PACKAGE}(\.\w+)+", arg.value):
                    private = [p for p in arg.value.split(".") if is_private(p)]
                    if private:
                        found.append((node.lineno, private[0],
                                      f"names the private `{arg.value}` in {name}()",
                                      "give it a public, documented name"))
    return found


def test_no_private_names_of_other_modules():
    problems = []
    for folder in (PACKAGE, "tests"):
        for source in sources(folder):
            for line, name, what, fix in sorted(set(private_reaches(source))):
                if (source.where, name) not in ALLOWED_PRIVATE:
                    problems.append(f"{source.where}:{line}: {what}. Fix: {fix}.")
    assert not problems, (
        f"{len(problems)} read(s) of another tapeworks module's private (`_underscore`) "
        "names in tapeworks/ and tests/. Expected none: a private name may change without "
        "notice, so what another module or a test needs gets a public, documented name.\n"
        + "\n".join(problems))


# ---------------------------------------------------------------------------
# (c) Module size


def test_no_module_over_600_lines():
    problems = [f"{s.where}: {s.line_count} lines. Fix: split it by reason to change "
                "(STYLE.md), each part under 600 lines."
                for s in sources(PACKAGE) if s.line_count > MAX_LINES]
    assert not problems, (f"{len(problems)} module(s) in tapeworks/ over {MAX_LINES} lines. "
                          "Expected at most 600.\n" + "\n".join(problems))


# ---------------------------------------------------------------------------
# (d) Layers


def layer_of(module):
    """The module's layer, or None where LAYERS does not place it."""
    if module in LAYERS:
        return LAYERS[module]
    if module.startswith("tapeworks.engine.") and module.count(".") == 2:
        return None   # front modules and rooms are placed one by one
    while "." in module:
        module = module.rpartition(".")[0]
        # The root and the engine package stand for themselves only.
        if module in LAYERS and module not in (PACKAGE, "tapeworks.engine"):
            return LAYERS[module]
    return None


def layer_problems(graph=None, existing=None):
    """Every violation of LAYERS in `graph` ({module: {target: [Edge]}}, default tapeworks')
    and every unplaced front module or room among `existing` (default: tapeworks' modules)."""
    graph = import_graph() if graph is None else graph
    existing = modules() if existing is None else existing
    problems = []
    for module, source in sorted(existing.items()):
        if module.startswith("tapeworks.engine.") and layer_of(module) is None:
            problems.append(f"{source.where}: {module} has no layer. Fix: place it in "
                            "LAYERS in tests/test_structure.py: a module of the front "
                            "(tapeworks/engine/*.py) at the layer of the highest module it "
                            "imports, plus one; a new room (a subpackage of the engine) "
                            "in its place in the rooms' order.")
    for module, targets in sorted(graph.items()):
        layer = layer_of(module)
        if layer is None:
            continue
        for target, edges in sorted(targets.items()):
            target_layer = layer_of(target)
            lines = ",".join(str(e.line) for e in edges)
            where = f"{edges[0].source.where}:{lines}"
            if target_layer is None:
                if module.startswith("tapeworks.engine"):
                    problems.append(
                        f"{where}: {module} (layer {layer}) imports {target}, which has no "
                        "layer. Fix: place it in LAYERS in tests/test_structure.py, or do "
                        "not import it from the engine.")
            elif target_layer > layer or (target_layer == layer
                                          and layer not in SAME_LAYER_IMPORTS):
                problems.append(
                    f"{where}: {module} (layer {layer}) imports {target} (layer "
                    f"{target_layer}). Expected imports from lower layers only (an "
                    "engine room from itself and earlier rooms). Fix: move what it needs "
                    f"down below layer {layer}, or have the caller pass it in.")
    return problems


def test_engine_import_layers():
    problems = layer_problems()
    assert not problems, (
        f"{len(problems)} violation(s) of the import layers (design/trainer-split.md "
        "section 5; the table is LAYERS in tests/test_structure.py).\n" + "\n".join(problems))


# ---------------------------------------------------------------------------
# The detectors themselves: each finds what it is for, and nothing else, on a
# small made-up file (so that a green run above is not a blind one).


def _made_up(text, where="tests/made_up.py"):
    return _read(ROOT / where, text)


def test_a_cycle_is_found_with_its_path_and_a_function_level_import_counts():
    source = _made_up("def later():\n    from tapeworks.engine import trainer\n",
                      "tapeworks/made_up.py")
    assert [(line, target) for line, _, target in imported(source)] == [
        (2, "tapeworks.engine.trainer")]
    graph = {"a": {"b": []}, "b": {"c": []}, "c": {"a": [], "d": []}, "d": {}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert shortest_path(graph, "b", "a", {"a", "b", "c"}) == ["b", "c", "a"]
    assert strongly_connected({"a": {"b": []}, "b": {}}) == []


def test_private_reaches_are_found_and_other_libraries_privates_are_not():
    source = _made_up("""\
import tensorflow as tf
from tapeworks import errors
from tapeworks.errors import _hidden
from tapeworks.errors import ConfigError as _ConfigError


def reach(trainer, model, dataset, monkeypatch):
    trainer._planner.report()
    errors._detail
    getattr(trainer, "_planner")
    monkeypatch.setattr("tapeworks.errors._detail", None)
    model._flatten_layers
    dataset._as_serialized_graph()
    tf._api
    trainer._not_tapeworks


class Own:
    def __init__(self):
        self._mine = 1

    def same(self, other):
        return self._mine + other._mine
""")
    found = {(line, name) for line, name, _, _ in private_reaches(
        source, owners={"_planner": {"tapeworks.engine.trainer"}, "_mine": {"x"}})}
    assert found == {(3, "_hidden"), (8, "_planner"), (9, "_detail"), (10, "_planner"),
                     (11, "_detail")}


def test_an_upward_import_and_an_unplaced_engine_module_break_the_layers():
    step = _made_up("", "tapeworks/engine/step/step.py")
    graph = {"tapeworks.engine.step.step": {"tapeworks.engine.trainer": [Edge(step, 7, "")],
                                       "tapeworks.errors": [Edge(step, 3, "")]},
             "tapeworks.data.made_up": {"tapeworks.engine.step.task": [Edge(step, 2, "")]}}
    unplaced = {"tapeworks.engine.made_up": _made_up("", "tapeworks/engine/made_up.py")}
    problems = layer_problems(graph, unplaced)
    assert len(problems) == 3, problems
    assert problems[0].startswith("tapeworks/engine/made_up.py: tapeworks.engine.made_up has "
                                  "no layer")
    assert problems[1].startswith("tapeworks/engine/step/step.py:2: tapeworks.data.made_up "
                                  "(layer 0) imports tapeworks.engine.step.task (layer 1)")
    assert problems[2].startswith("tapeworks/engine/step/step.py:7: tapeworks.engine.step.step "
                                  "(layer 1) imports tapeworks.engine.trainer (layer 11)")
    assert layer_of("tapeworks.data.pipeline") == 0 and layer_of("tapeworks.bench.x") is None
    assert layer_of("tapeworks.engine.checks.made_up") == 2


def test_a_room_importing_a_later_room_breaks_the_layers():
    step = _made_up("", "tapeworks/engine/step/task.py")
    graph = {"tapeworks.engine.step.task": {
        "tapeworks.engine.inputs.adapters": [Edge(step, 4, "")],
        "tapeworks.engine.step.guards": [Edge(step, 5, "")]}}
    problems = layer_problems(graph, {})
    assert len(problems) == 1 and problems[0].startswith(
        "tapeworks/engine/step/task.py:4: tapeworks.engine.step.task (layer 1) imports "
        "tapeworks.engine.inputs.adapters (layer 3)"), problems


# ---------------------------------------------------------------------------
# (e) The tree as documented


# Folders that are catalogues, one item a module (a held-out bug script each): the
# page names the folder; `tapeworks bench bugs` lists its items.
CATALOGUES = ("bench/classic_bugs/",)


def modules_missing_from_layout(text, sources_=None):
    """Relative paths (`engine/step/task.py`) of tapeworks' modules the page does not name.

    A module counts as named when its path relative to tapeworks/ appears, or its
    file name appears in the row or line of its folder (`engine/step/` ... `task.py`).
    """
    sources_ = sources(PACKAGE) if sources_ is None else sources_
    lines = text.splitlines()
    missing = []
    for source in sources_:
        if source.is_package:
            continue
        relative = source.path.relative_to(ROOT / PACKAGE).as_posix()
        folder, _, name = relative.rpartition("/")
        if relative in text or (relative.startswith(CATALOGUES) and
                                relative.split("/")[-2] + "/" in text):
            continue
        if not folder:
            # A top-level module: its name at the start of a line of the tree.
            if any(line.strip().startswith(name) for line in lines):
                continue
        else:
            # Its folder's entry (a table row or a tree line and its continuation lines).
            head = folder.split("/")[-1] + "/"
            block, inside = [], False
            for line in lines:
                starts = line.strip().startswith((f"{head}", f"| `{PACKAGE}/{folder}/`",
                                                  f"| `{folder}/`"))
                if starts:
                    inside = True
                elif inside and (line.startswith("| ") or (line.strip() and
                                 not line.startswith(" " * 12))):
                    inside = False
                if inside:
                    block.append(line)
            if name in "\n".join(block) or f"`{name}`" in "\n".join(block):
                continue
        missing.append(relative)
    return missing


def test_every_module_is_named_in_the_layout_page():
    text = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    missing = modules_missing_from_layout(text)
    assert not missing, (
        f"{len(missing)} module(s) of tapeworks/ not named in docs/layout.md. Expected every "
        "module there, in its folder's row or line. Fix: add each, with what it does:\n"
        + "\n".join(missing))


def test_the_layout_check_finds_a_missing_module():
    made_up = [_made_up("", "tapeworks/engine/step/task.py"),
               _made_up("", "tapeworks/engine/checks/made_up.py"),
               _made_up("", "tapeworks/cli.py"), _made_up("", "tapeworks/lint/rules.py")]
    text = ("| `engine/step/` | the step | `task.py` (Task) |\n"
            "| `engine/checks/` | watches | `nonfinite.py` |\n"
            "  lint/       rules.py, checker.py\n  cli.py      the command\n")
    assert modules_missing_from_layout(text, made_up) == ["engine/checks/made_up.py"]


def test_tests_mirror_the_engine_rooms():
    rooms = sorted(p.name for p in (ROOT / PACKAGE / "engine").iterdir()
                   if (p / "__init__.py").exists())
    missing = [room for room in rooms
               if not (ROOT / "tests" / "engine" / room / "__init__.py").exists()]
    assert not missing, (
        f"tapeworks/engine/ has rooms with no tests/engine/<room>/ package: {missing}. Expected "
        "the tests to mirror the package. Fix: create tests/engine/<room>/__init__.py and move "
        "the room's tests there.")
