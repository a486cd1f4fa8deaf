"""The import graph of our packages: no circle, and no import that runs against the layers.

The graph is read from the source with ``ast``, not by importing: every ``import`` and
``from ... import`` counts, at module level and inside functions alike (a function-level import
still ties the two modules together; it only hides the tie from a reader of the file's head).
An edge goes from a module to each module of ours it names: ``from a.b import c`` is an edge to
``a.b.c`` when ``c`` is a module, else to ``a.b``. A package ``__init__`` that an import passes
through is counted too when it holds code (importing ``a.b.c`` runs ``a/b/__init__.py``): an
edge to ``a.b``, unless the importer is inside ``a.b`` itself (its package ran already).

The rules (docs/architecture.md, "Packages and their rules"):
- no circle;
- ``trainer`` imports neither ``orchestrator`` nor ``provisioning`` (it runs on the hosts);
- ``orchestrator.runtime`` (the real player) never imports ``orchestrator.simulate`` (the model);
- ``orchestrator.config`` (data and validation) never imports ``orchestrator.simulate``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "provisioning", "trainer", "analysis", "bench", "hydra_plugins")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _holds_code(path: Path) -> bool:
    """A package ``__init__`` with more than a docstring and ``from __future__`` imports."""
    body = ast.parse(path.read_text(), str(path)).body
    return any(not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
               and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")
               for n in body)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a (possibly relative) ``from`` import names."""
    if not node.level:
        return node.module or ""
    # in a package's __init__, `from . import x` is relative to the package itself
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    """Each of our modules -> the modules of ours it imports (anywhere in the file)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, path.name == "__init__.py", node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for target in targets:
                # `import a.b.c` names a.b.c; keep the longest prefix that is a module of ours
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
                # the packages the import passes through run their __init__ first
                package = target.rpartition(".")[0]
                while package:
                    if (package in modules and modules[package].name == "__init__.py"
                            and _holds_code(modules[package]) and not _in(name, package)):
                        graph[name].add(package)
                    package = package.rpartition(".")[0]
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _edges_from_to(graph: dict[str, set[str]], source: str, target: str) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in graph.items() if _in(a, source)
                  for b in targets if _in(b, target))


def test_the_graph_sees_our_packages() -> None:
    """The walk finds the modules and the edges we know exist (else every rule passes vacuously)."""
    graph = import_graph()
    assert "orchestrator.__main__" in graph and "trainer.loop" in graph
    assert "orchestrator.rundir.record" in graph["orchestrator.runtime.supervisor"]
    assert "orchestrator.transient.recovery" in graph["orchestrator.simulate.engine"]
    # a function-level import counts: the planner's command reaches the planner
    assert "orchestrator.simulate.planner" in graph["orchestrator.plan.__main__"]


def test_the_graph_sees_package_inits_that_hold_code() -> None:
    """Importing ``provisioning.gce.storage`` runs ``provisioning/gce/__init__.py`` (it holds
    code): the import is an edge to it as well; a module of the package itself has none."""
    graph = import_graph()
    assert "provisioning.gce" in graph["orchestrator.resume"]
    assert "orchestrator.plan" not in graph["orchestrator.plan.hosts"]


def test_no_import_circle() -> None:
    assert _cycles(import_graph()) == []


def test_trainer_imports_neither_orchestrator_nor_provisioning() -> None:
    graph = import_graph()
    assert _edges_from_to(graph, "trainer", "orchestrator") == []
    assert _edges_from_to(graph, "trainer", "provisioning") == []


def test_the_real_player_never_imports_the_model() -> None:
    assert _edges_from_to(import_graph(), "orchestrator.runtime", "orchestrator.simulate") == []


def test_config_never_imports_the_simulation() -> None:
    assert _edges_from_to(import_graph(), "orchestrator.config", "orchestrator.simulate") == []
