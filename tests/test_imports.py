"""No import cycle between the modules of quantkit, read from the sources (nothing is imported).

An edge A -> B is an import in A's source, anywhere (module level or inside a function), that names module B:

* ``import a.b`` and ``from a.b import x`` name ``a.b``; ``from a import b`` names the submodule ``a.b`` where it exists,
  else the package ``a``; relative imports resolve against A's package;
* ``importlib.import_module("a.b")``, and ``import_module(f"{__name__}.{m}")`` with ``m`` looping over a literal tuple
  (a package importing its backends), name their modules too;
* a package's ``__init__`` is the package's module, so its imports of its submodules are edges from the package;
* imports under ``if TYPE_CHECKING:`` never run and are not edges; neither are the parent packages Python runs before
  a submodule (every submodule of a package whose ``__init__`` imports it would otherwise close a cycle).
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "quantkit"

Edge = tuple[str, int]  # (importing file relative to ROOT, line)


def module_names(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> source file, for every module under quantkit/ (a package is its __init__.py)."""
    out = {}
    for f in sorted((root / PACKAGE).rglob("*.py")):
        parts = f.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST):
    """Every node of the tree except the bodies of ``if TYPE_CHECKING:``, with the enclosing for-loops of each."""
    stack: list[tuple[ast.AST, tuple[ast.For, ...]]] = [(tree, ())]
    while stack:
        node, loops = stack.pop()
        yield node, loops
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            kids = node.orelse
        else:
            kids = list(ast.iter_child_nodes(node))
        inner = (*loops, node) if isinstance(node, ast.For) else loops
        stack += [(k, inner) for k in kids]


def _literal_strings(node: ast.expr) -> list[str] | None:
    if isinstance(node, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return [e.value for e in node.elts]  # type: ignore[union-attr]
    return None


def _import_module_targets(call: ast.Call, name: str, loops: tuple[ast.For, ...]) -> list[str]:
    """The module names an ``import_module(...)`` call can load, where they are written in the source."""
    f = call.func
    if not call.args or not ((isinstance(f, ast.Name) and f.id == "import_module") or (isinstance(f, ast.Attribute) and f.attr == "import_module")):
        return []
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return [arg.value]
    if not isinstance(arg, ast.JoinedStr):
        return []
    out = [""]
    for part in arg.values:  # f"{__name__}.{m}": __name__ is this module, m a loop variable over literal strings
        if isinstance(part, ast.Constant):
            out = [o + str(part.value) for o in out]
        elif isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name) and part.value.id == "__name__":
            out = [o + name for o in out]
        elif isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name):
            var = part.value.id
            values = next((_literal_strings(lp.iter) for lp in reversed(loops) if isinstance(lp.target, ast.Name) and lp.target.id == var), None)
            if values is None:
                return []
            out = [o + v for o in out for v in values]
        else:
            return []
    return out


def imports(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The quantkit modules ``name`` imports -> the first line importing each."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        while target and target not in modules:  # `import a.b.c` of a name that is not a module: its module
            target = target.rpartition(".")[0]
        if target and target != name:
            found.setdefault(target, line)

    for node, loops in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            for a in node.names:
                sub = f"{src}.{a.name}"
                add(sub if sub in modules else src, node.lineno)
        elif isinstance(node, ast.Call):
            for t in _import_module_targets(node, name, loops):
                add(t, node.lineno)
    return found


def import_graph(root: Path = ROOT) -> dict[str, dict[str, Edge]]:
    """module -> {imported module: (file, line) of the import}."""
    modules = module_names(root)
    graph = {}
    for name, path in modules.items():
        rel = str(path.relative_to(root))
        graph[name] = {t: (rel, line) for t, line in imports(name, path, modules).items()}
    return graph


def strongly_connected(graph: dict[str, dict[str, Edge]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def shortest_cycle(graph: dict[str, dict[str, Edge]], comp: list[str]) -> list[str]:
    """A shortest cycle through the component's first module: [m0, m1, ..., m0]."""
    inside, first = set(comp), comp[0]
    prev: dict[str, str] = {}
    queue = deque([first])
    while queue:
        v = queue.popleft()
        for w in graph[v]:
            if w not in inside:
                continue
            if w == first:
                path = [v]
                while path[-1] != first:
                    path.append(prev[path[-1]])
                return [*reversed(path), first]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    raise AssertionError(f"no cycle through {first} in its component")


def describe(graph: dict[str, dict[str, Edge]], cycle: list[str]) -> str:
    lines = [f"  {a} -> {b}   ({graph[a][b][0]}:{graph[a][b][1]})" for a, b in zip(cycle, cycle[1:])]
    return f"cycle of {len(cycle) - 1} modules:\n" + "\n".join(lines)


def test_graph_reads_the_package():
    """The graph holds every module and resolves the kinds of import it promises to (so an empty graph cannot pass)."""
    graph = import_graph()
    assert len(graph) == len(module_names()) > 50
    kernels = graph["quantkit.kernels"]
    assert "quantkit.kernels.dispatch" in kernels  # `from . import dispatch`: the submodule, not the package
    assert "quantkit.kernels.quant.group_quant" in kernels  # a backend the package imports
    assert "quantkit.kernels.dispatch" in graph["quantkit.kernels.quant.group_quant"]  # `from .. import dispatch`
    assert "quantkit.kernels" not in graph["quantkit.kernels.quant.group_quant"]


def test_a_cycle_is_found_and_located(tmp_path):
    """A cycle through an import inside a function and a relative `from . import x` is reported with its lines;
    `import_module` over a literal tuple is followed, TYPE_CHECKING imports are not."""
    pkg = tmp_path / PACKAGE / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / PACKAGE / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from importlib import import_module\n\nfor m in ('a',):\n    import_module(f'{__name__}.{m}')\n")
    (pkg / "a.py").write_text("import os\n\n\ndef f():\n    from .b import g\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nfrom . import a\nif TYPE_CHECKING:\n    from .. import sub\n")
    graph = import_graph(tmp_path)
    assert graph["quantkit.sub"] == {"quantkit.sub.a": ("quantkit/sub/__init__.py", 4)}
    comps = strongly_connected(graph)
    assert comps == [["quantkit.sub.a", "quantkit.sub.b"]]
    text = describe(graph, shortest_cycle(graph, comps[0]))
    assert "quantkit/sub/a.py:5" in text and "quantkit/sub/b.py:2" in text


def test_no_import_cycle():
    graph = import_graph()
    cycles = [describe(graph, shortest_cycle(graph, comp)) for comp in strongly_connected(graph)]
    assert not cycles, "import cycles between quantkit modules:\n" + "\n".join(cycles)
