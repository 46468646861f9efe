"""The layers stay as the README draws them, every module is on the module map
(docs/design/layout.md), and no module imports itself in a circle.

Every import counts: module level, inside functions, and type-only imports under
`TYPE_CHECKING` (a cycle of type-only imports is still a knot a reader has to untie).
A package's `__init__` is a module like any other: a submodule that names its own package
(`from analysis.report import rows`) depends on it, and a cycle through the package counts.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "trainers", "search_spaces", "analysis", "hpo")
# What each package may import besides itself (hpo -> {analysis, search_spaces, trainers}
# -> common; analysis reads trainers' results and runs its probes through trainers, and
# `analysis.plan` reads the batch profiles of search_spaces, a data package under it).
ALLOWED = {
    "common": set(),
    "trainers": {"common"},
    "search_spaces": {"common"},
    "analysis": {"common", "trainers", "search_spaces"},
    "hpo": {"common", "trainers", "search_spaces", "analysis"},
}


def project_modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def imported_names(path: Path, module: str) -> Iterator[str]:
    """Every module name an import statement in `path` can refer to."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                prefix = ".".join([*base, node.module] if node.module else base)
            else:
                prefix = node.module or ""
            yield prefix
            for alias in node.names:  # `from trainers.loop import checkpoint` names a module
                yield f"{prefix}.{alias.name}"


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    modules = project_modules(root, packages)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for target in imported_names(path, name):
            if target in modules and target != name:
                graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
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


def test_the_walk_sees_the_imports_it_must_see() -> None:
    graph = import_graph()
    # A relative, a function-level and a type-only import are all found.
    assert "trainers.loop.run" in graph["hpo.objective"] or any(
        "trainers" in t for t in graph["hpo.objective"]
    )
    assert "common.config" in graph["trainers.spec"]
    assert "trainers.result" in graph["trainers.events"]  # under TYPE_CHECKING


def test_cycle_finder_finds_a_planted_cycle() -> None:
    planted = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(planted) == [["a", "b", "c"]]


def test_a_cycle_between_a_package_and_its_own_module_is_found(tmp_path: Path) -> None:
    # The knot analysis/report had: the package's __init__ re-exports from `document`, and
    # `document` takes its sibling modules through the package.
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from pkg.document import write\n")
    (package / "document.py").write_text("from pkg import plots\n")
    (package / "plots.py").write_text("import math\n")
    (package / "sibling.py").write_text("from . import plots\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.document"] == {"pkg", "pkg.plots"}
    assert cycles(graph) == [["pkg", "pkg.document"]]


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_from_a_higher_layer(package: str) -> None:
    wrong = sorted(
        f"{source} imports {target}"
        for source, targets in import_graph().items()
        if source.split(".")[0] == package
        for target in targets
        if target.split(".")[0] not in ALLOWED[package] | {package}
    )
    assert not wrong, "\n".join(wrong)


# -- the README's layer map and the docs' module map say the same ----------------------------
MODULE_MAP = ROOT / "docs" / "design" / "layout.md"


def readme_layout() -> str:
    """The README's `## Layout` section: the layer arrows."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]


def module_map() -> str:
    """The module map's `## Modules` section (docs/design/layout.md)."""
    text = MODULE_MAP.read_text(encoding="utf-8")
    return text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_draws_the_allowed_imports() -> None:
    drawn: dict[str, set[str]] = {}
    for line in readme_layout().splitlines():
        arrow = re.fullmatch(r"(\w+)\s+->\s+(.*)", line.strip())
        if arrow and arrow[1] in PACKAGES:
            drawn[arrow[1]] = set(re.findall(r"\w+", arrow[2])) & set(PACKAGES)
    assert drawn == ALLOWED


def test_the_module_map_names_every_module_and_only_those() -> None:
    """Each package's own modules are named under it; a sub-package by its folder."""
    named: dict[str, set[str]] = {package: set() for package in PACKAGES}
    package = None
    for line in module_map().splitlines():
        top = re.match(r"(\w+)/\s", line)
        if top:
            package = top[1] if top[1] in PACKAGES else None
        elif package:
            named[package] |= set(re.findall(r"\b\w+\.py\b", line))
            named[package] |= set(re.findall(r"^\s+(\w+/)\s", line))
    wrong = []
    for package in PACKAGES:
        folder = ROOT / package
        own = {p.name for p in folder.glob("*.py")} - {"__init__.py", "__main__.py"}
        own |= {f"{p.name}/" for p in folder.iterdir() if (p / "__init__.py").is_file()}
        wrong += [f"{package}/{name}: not in {MODULE_MAP.name}" for name in sorted(own - named[package])]
        there = {p.name for p in folder.rglob("*.py")} | {f"{p.name}/" for p in folder.rglob("*")}
        wrong += [f"{package}/…/{name}: no such module" for name in sorted(named[package] - there)]
    assert not wrong, "\n".join(wrong)
