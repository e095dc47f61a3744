"""The package's modules import each other without a cycle.

Every import counts, read from the source with `ast`: those under ``if TYPE_CHECKING:`` (an
annotation is still an arrow) and those inside functions. A package's own ``__init__`` is left out
as a target of its submodules (Python runs it before them, whether they import it or not).
"""
import ast
from pathlib import Path

import loopfuse
import loopfuse.passes


def _modules() -> dict[str, Path]:
    """module name -> source file, for every module of the loopfuse packages and their subpackages (from
    where they import)."""
    found = {}
    for package in (loopfuse, loopfuse.passes):
        folder = Path(package.__file__).parent
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[0] == "passes" and package is loopfuse:    # an installed loopfuse holds passes/ inside
                continue
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            found[".".join((package.__name__, *parts))] = path
    return found


def _imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules among `known` that module `name` (defined in `path`) imports anywhere in its source."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]   # `from . import x`: x may be a module
        else:
            continue
        for target in targets:
            while target and target not in known:   # `import a.b.c` names the module a.b.c, or a name in it
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):   # not its own package
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imported(name, path, set(modules)) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a path back to its first module) per strongly connected component of `graph` that
    has one (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(_cycle_through(v, component, graph))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _cycle_through(start: str, component: set[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest path from `start` back to itself inside `component` (breadth first)."""
    paths = {w: [start, w] for w in graph[start] if w in component}
    while start not in paths:
        paths = {w: path + [w] for v, path in paths.items() for w in graph[v] if w in component and w not in paths}
    return paths[start]


def test_cycles_finds_a_cycle_and_only_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert cycles({"a": {"a"}}) == [["a", "a"]]


def test_the_graph_sees_type_checking_and_function_level_imports():
    graph = import_graph()
    assert "loopfuse.drivers.step" in graph["loopfuse"]             # under TYPE_CHECKING in __init__
    assert "loopfuse.passes.pack_state" in graph["loopfuse.state.packed"]
    assert "loopfuse.errors" in graph["loopfuse.compile.trace"]
    assert "loopfuse.passes" not in graph["loopfuse.passes.wrap_loop"]


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


MAX_DEPTH = 9     # modules in the longest chain of imports (13 in the flat package before issue 40)


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest path of imports in `graph` (acyclic), as its modules from importer to imported."""
    longest: dict[str, list[str]] = {}

    def visit(v: str) -> list[str]:
        if v not in longest:
            longest[v] = [v] + max((visit(w) for w in sorted(graph[v])), key=len, default=[])
        return longest[v]

    return max((visit(v) for v in sorted(graph)), key=len, default=[])


def test_longest_chain_finds_the_longest_path():
    assert longest_chain({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": {"c"}}) == ["a", "b", "c"]


def test_the_import_stack_is_shallow():
    """loopfuse's own modules (the pass library, which imports only MLIR, aside) import each other at most
    `MAX_DEPTH` deep: a module never imports upward through the layers to reach a fact it should own or be given."""
    graph = {v: {w for w in ws if not w.startswith("loopfuse.passes")}
             for v, ws in import_graph().items() if not v.startswith("loopfuse.passes")}
    chain = longest_chain(graph)
    assert len(chain) <= MAX_DEPTH, f"import chain of {len(chain)} modules: " + " -> ".join(chain)


LAYERS = ("", "state", "run", "compile", "memory", "diagnostics", "drivers")   # README "Layout": the folders in order


def test_each_folder_imports_only_the_folders_before_it():
    def layer(module: str) -> int:
        parts = module.split(".")
        return LAYERS.index(parts[1] if len(parts) > 2 else "")

    graph = {v: {w for w in ws if not w.startswith("loopfuse.passes")} for v, ws in import_graph().items()
             if v != "loopfuse" and not v.startswith("loopfuse.passes")}
    upward = sorted(f"{v} -> {w}" for v, ws in graph.items() for w in ws if layer(w) > layer(v))
    assert {m.split(".")[1] for m in graph if m.count(".") > 1} == set(LAYERS[1:])
    assert not upward, f"imports from a later folder (README Layout): {upward}"
