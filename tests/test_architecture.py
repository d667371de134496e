"""Architecture rules, read from the source with ``ast`` (nothing is imported).

- No import circle between the units of ``mtrl_runtime`` (a subpackage
  ``mtrl_runtime.X`` or a top-level module ``mtrl_runtime.x``), nor between
  the sibling modules of one subpackage. Every import counts: module-level,
  function-local and ``TYPE_CHECKING`` ones, since a function-local import
  only postpones a circle, it does not remove it.
- No module imports a ``_private`` module or name of another unit.
- ``mtrl_adapters`` never imports ``mtrl_runtime`` or torch; the contract
  module ``mtrl_runtime/types.py`` imports nothing of the project.

The first tests run the checkers on a small package written to ``tmp_path``
with known faults, so a checker that finds nothing cannot pass unnoticed.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

REPO = Path(__file__).resolve().parents[1]
# Import name -> source folder (integrations/ installs as mtrl_integrations).
PROJECT = {"mtrl_runtime": REPO / "mtrl_runtime", "mtrl_adapters": REPO / "mtrl_adapters",
           "mtrl_integrations": REPO / "integrations"}


# -- reading imports ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    """One imported name. ``module`` is the module the statement loads (the submodule when
    ``from pkg import sub`` names one); ``target`` is what it binds: ``module``, or ``module.name``."""

    source: str
    module: str
    target: str
    path: Path
    line: int

    def where(self) -> str:
        path = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        return f"{path}:{self.line}"


def load_modules(packages: Mapping[str, Path]) -> dict[str, Path]:
    """Every module's dotted name -> its file; a package is named by its ``__init__.py``."""
    modules = {}
    for package, folder in packages.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def is_package(name: str, modules: Mapping[str, Path]) -> bool:
    return name in modules and modules[name].name == "__init__.py"


def find_imports(modules: Mapping[str, Path]) -> list[Import]:
    """Every import statement of every module, anywhere in the file, relative ones resolved."""
    found = []
    for source, path in modules.items():
        package = source if is_package(source, modules) else source.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                found += [Import(source, alias.name, alias.name, path, node.lineno) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for alias in node.names:
                    target = base if alias.name == "*" else f"{base}.{alias.name}"
                    found.append(Import(source, target if target in modules else base, target, path, node.lineno))
    return found


def inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


# -- cycles -------------------------------------------------------------------------------------


def strongly_connected(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    graph: dict[str, set[str]] = defaultdict(set)
    for u, v in edges:
        graph[u].add(v)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(components)


def grouped_edges(imports: Iterable[Import], node_of) -> dict[tuple[str, str], list[Import]]:
    """Imports grouped by the edge ``(node_of(source), node_of(module))`` they make; ``None`` nodes and self loops dropped."""
    edges: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for imp in imports:
        u, v = node_of(imp.source), node_of(imp.module)
        if u is not None and v is not None and u != v:
            edges[(u, v)].append(imp)
    return edges


def unit_of(root: str):
    """Maps a module inside ``root`` to its unit: the subpackage ``root.X``, or the top-level module ``root.x``."""
    def unit(name: str) -> str | None:
        return ".".join(name.split(".")[:2]) if inside(name, root) else None
    return unit


def child_of(package: str):
    """Maps a module strictly inside ``package`` to its direct child (a module or a nested package)."""
    depth = package.count(".") + 1

    def child(name: str) -> str | None:
        return ".".join(name.split(".")[: depth + 1]) if name.startswith(package + ".") else None
    return child


def describe_cycles(edges: Mapping[tuple[str, str], list[Import]]) -> list[str]:
    """One paragraph per circle: a path around it, then every import edge inside it with file:line."""
    reports = []
    for component in strongly_connected(edges):
        members = set(component)
        inner = {e: imps for e, imps in sorted(edges.items()) if e[0] in members and e[1] in members}
        lines = ["circle: " + " -> ".join(_a_cycle(component[0], inner))]
        for (u, v), imps in inner.items():
            lines.append(f"  {u} -> {v}: " + ", ".join(sorted({i.where() for i in imps})))
        reports.append("\n".join(lines))
    return reports


def _a_cycle(start: str, edges: Iterable[tuple[str, str]]) -> list[str]:
    """A shortest path from ``start`` back to itself along ``edges`` (breadth first)."""
    after: dict[str, list[str]] = defaultdict(list)
    for u, v in edges:
        after[u].append(v)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        u = queue.popleft()
        for v in after[u]:
            if v == start:
                path = [u]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if v not in came_from:
                came_from[v] = u
                queue.append(v)
    return [start]


def unit_cycles(root: str, imports: list[Import]) -> list[str]:
    return describe_cycles(grouped_edges(imports, unit_of(root)))


def sibling_cycles(root: str, modules: Mapping[str, Path], imports: list[Import]) -> list[str]:
    """Circles among the sibling modules of each subpackage below ``root``. Edges to or from the
    subpackage itself (its ``__init__.py`` re-exports) are not counted."""
    reports = []
    for package in sorted(m for m in modules if m != root and inside(m, root) and is_package(m, modules)):
        reports += [f"in {package}: {r}" for r in describe_cycles(grouped_edges(imports, child_of(package)))]
    return reports


# -- private names ------------------------------------------------------------------------------


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _home(name: str, modules: Mapping[str, Path]) -> str:
    """The top-level subpackage a module or package belongs to (``pkg.X``), or the top-level package ``pkg``."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 and is_package(".".join(parts[:2]), modules) else parts[0]


def private_imports(modules: Mapping[str, Path], imports: list[Import], project: Iterable[str]) -> list[Import]:
    """Imports of a ``_private`` module or name that lives in another top-level subpackage than the importer.

    A private name belongs to the package holding it; it may be imported anywhere inside the same
    top-level subpackage (``mtrl_runtime.store`` and its nested packages), or, when it lies directly in
    a top-level package (``mtrl_runtime._x``), by that package's own top-level modules.
    """
    roots = set(project)
    offenders = []
    for imp in imports:
        parts = imp.target.split(".")
        if parts[0] not in roots:
            continue
        first = next((i for i, part in enumerate(parts) if _is_private(part)), None)
        if first is None:
            continue
        holder = ".".join(parts[:first])  # the module or package the private part lives in
        owner = holder if is_package(holder, modules) or holder not in modules else holder.rpartition(".")[0]
        if _home(owner, modules) != _home(imp.source, modules):
            offenders.append(imp)
    return offenders


# -- the checkers find known faults -------------------------------------------------------------


def _write(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


SYNTHETIC = {
    "pkg/__init__.py": "",
    # a <-> b through a function-local relative import and an absolute one
    "pkg/a/__init__.py": "from .core import thing\n",
    "pkg/a/core.py": "thing = 1\n\n\ndef later():\n    from ..b import helper\n    return helper\n",
    "pkg/b/__init__.py": "from .helper import helper\nfrom .z import zed\n",
    "pkg/b/helper.py": "from pkg.a import core\n\nhelper = core\n",
    # siblings x <-> y: a circle; z -> b/__init__ -> z goes through the re-exports: not one
    "pkg/b/x.py": "from . import y\n",
    "pkg/b/y.py": "from .x import name\n",
    "pkg/b/z.py": "from . import helper\n\nzed = helper\n",
    "pkg/b/_impl.py": "_secret = 1\nshared = 2\n",
    # privates of one's own top-level subpackage, nested packages included: fine
    "pkg/b/w.py": "from ._impl import _secret, shared\n",
    "pkg/b/inner/__init__.py": "",
    "pkg/b/inner/q.py": "from .._impl import _secret\n",
    # c -> a, no circle; a private name of pkg.a and a private module of pkg.b
    "pkg/c.py": "from . import a\nfrom .a.core import _hidden\nfrom .b._impl import shared\n",
}


def _synthetic(tmp_path: Path) -> tuple[dict[str, Path], list[Import]]:
    _write(tmp_path, SYNTHETIC)
    modules = load_modules({"pkg": tmp_path / "pkg"})
    return modules, find_imports(modules)


def test_the_cycle_finder_reports_a_known_circle_between_units(tmp_path):
    modules, imports = _synthetic(tmp_path)
    edges = grouped_edges(imports, unit_of("pkg"))
    assert strongly_connected(edges) == [["pkg.a", "pkg.b"]]
    [report] = unit_cycles("pkg", imports)
    assert "circle: pkg.a -> pkg.b -> pkg.a" in report
    assert "core.py:5" in report and "helper.py:1" in report  # the function-local import counts
    assert ("pkg.c", "pkg.a") in edges  # `from . import a` names the subpackage


def test_the_cycle_finder_reports_sibling_circles_but_not_reexports(tmp_path):
    modules, imports = _synthetic(tmp_path)
    [report] = sibling_cycles("pkg", modules, imports)
    assert report.startswith("in pkg.b: circle: pkg.b.x -> pkg.b.y -> pkg.b.x")
    assert "pkg.b.z" not in report and "pkg.b.helper" not in report


def test_the_private_import_check_reports_another_units_private_names(tmp_path):
    modules, imports = _synthetic(tmp_path)
    offenders = private_imports(modules, imports, ["pkg"])
    assert [(i.source, i.target) for i in offenders] == [("pkg.c", "pkg.a.core._hidden"), ("pkg.c", "pkg.b._impl.shared")]


def test_the_strongly_connected_components_of_a_small_graph():
    edges = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e"), ("e", "d"), ("f", "a")]
    assert strongly_connected(edges) == [["a", "b", "c"], ["d", "e"]]
    assert strongly_connected([("a", "b"), ("b", "c")]) == []


# -- the rules, on the project ------------------------------------------------------------------


@functools.cache
def _project() -> tuple[dict[str, Path], list[Import]]:
    modules = load_modules(PROJECT)
    return modules, find_imports(modules)


def test_the_project_is_read():
    _, imports = _project()
    units = {unit_of("mtrl_runtime")(i.source) for i in imports}
    assert {"mtrl_runtime.training", "mtrl_runtime.evaluation", "mtrl_runtime.cli", "mtrl_runtime.types"} <= units
    assert any(i.source == "mtrl_adapters" for i in imports)


def test_no_import_circle_between_the_units_of_mtrl_runtime():
    _, imports = _project()
    cycles = unit_cycles("mtrl_runtime", imports)
    assert not cycles, "import circles between units of mtrl_runtime:\n" + "\n".join(cycles)


def test_no_import_circle_between_the_modules_of_a_subpackage():
    modules, imports = _project()
    cycles = sibling_cycles("mtrl_runtime", modules, imports)
    assert not cycles, "import circles between sibling modules:\n" + "\n".join(cycles)


def test_no_module_imports_another_units_private_names():
    modules, imports = _project()
    offenders = private_imports(modules, imports, PROJECT)
    assert not offenders, "imports of another package's private names:\n" + "\n".join(
        f"  {i.where()}: {i.source} imports {i.target}" for i in offenders)


def test_the_adapters_never_import_the_runtime_or_torch():
    _, imports = _project()
    bad = [i for i in imports if inside(i.source, "mtrl_adapters") and i.module.split(".")[0] in ("mtrl_runtime", "torch")]
    assert not bad, "\n".join(f"  {i.where()}: imports {i.module}" for i in bad)


def test_the_contract_module_imports_nothing_of_the_project():
    _, imports = _project()
    bad = [i for i in imports if i.source == "mtrl_runtime.types" and i.module.split(".")[0] in (*PROJECT, "mtrl_examples")]
    assert not bad, "\n".join(f"  {i.where()}: imports {i.module}" for i in bad)
