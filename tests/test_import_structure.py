"""No import cycle inside any package of runinfra_opt.

Inside a package, its modules (each sub-package counted as one) import each other in one direction: a cycle
means one concept cut in two, or a shared piece kept in one of its users. The graph is grimp's (the one
import-linter checks its contracts on), which also sees imports inside function bodies, so a cycle hidden
behind a deferred import fails here too. Imports under `if TYPE_CHECKING:` are left out: they never run, and
they are how two types that name each other (a `Variant` and the `SpecMethod` that names its variants) keep
their own modules.
"""

from __future__ import annotations

import graphlib
import textwrap
from pathlib import Path

import grimp
import pytest

ROOT = "runinfra_opt"
PACKAGES = sorted(
    ".".join(init.parent.relative_to(Path(__file__).parents[1]).parts)
    for init in (Path(__file__).parents[1] / ROOT).rglob("__init__.py")
)


def import_graph(package: str) -> grimp.ImportGraph:
    return grimp.build_graph(package, cache_dir=None, exclude_type_checking_imports=True)


def package_cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """Cycles among the children of `package`, each as a chain of child names that ends where it starts.
    Every cycle of the package's graph goes through at least one edge of some chain listed (each found cycle
    has one of its edges removed before the next search)."""
    children = sorted(graph.find_children(package))

    def child_of(module: str) -> str | None:
        return next((c for c in children if module == c or module.startswith(c + ".")), None)

    edges: dict[str, set[str]] = {child: set() for child in children}
    for module in graph.find_descendants(package):
        importer = child_of(module)
        for imported in graph.find_modules_directly_imported_by(module):
            target = child_of(imported)
            if importer is not None and target is not None and target != importer:
                edges[importer].add(target)
    cycles = []
    while True:
        try:
            graphlib.TopologicalSorter(edges).prepare()
            return cycles
        except graphlib.CycleError as error:
            # graphlib gives the cycle as [a, b, ..., a] where each node depends on (imports) the one before it.
            cycle = list(reversed(error.args[1]))
            cycles.append(cycle)
            edges[cycle[0]].discard(cycle[1])


def within(graph: grimp.ImportGraph, module: str) -> set[str]:
    """`module` and, for a package, every module under it."""
    return {module} | graph.find_descendants(module)


def describe(graph: grimp.ImportGraph, cycle: list[str]) -> str:
    """`a -> b -> a`, then where each step imports: `a.py:12  from pkg.b import x`."""
    short = [name.rpartition(".")[2] for name in cycle]
    lines = [" -> ".join(short)]
    for importer, imported in zip(cycle, cycle[1:], strict=False):
        targets = within(graph, imported)
        details = sorted(
            (module, detail["line_number"], detail["line_contents"])
            for module in within(graph, importer)
            for target in graph.find_modules_directly_imported_by(module) & targets
            for detail in graph.get_import_details(importer=module, imported=target)
        )
        module, line, contents = details[0]
        lines.append(f"    {module}:{line}  {contents}")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return import_graph(ROOT)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_inside_a_package(graph: grimp.ImportGraph, package: str) -> None:
    cycles = package_cycles(graph, package)
    if cycles:
        pytest.fail(f"import cycles inside {package}:\n" + "\n".join(describe(graph, c) for c in cycles), pytrace=False)


def test_a_cycle_behind_a_function_local_import_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself: a cycle whose second import sits in a function body is reported, with its lines;
    one whose second import is for type checking only is not."""
    package = tmp_path / "cyclepkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from cyclepkg.b import helper\n")
    (package / "b.py").write_text(textwrap.dedent("""
        def helper():
            from cyclepkg.a import helper as other
            return other
    """))
    (package / "c.py").write_text("from cyclepkg.d import x\n")
    (package / "d.py").write_text(textwrap.dedent("""
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from cyclepkg.c import x
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = import_graph("cyclepkg")
    cycles = package_cycles(graph, "cyclepkg")
    assert [sorted(c[:-1]) for c in cycles] == [["cyclepkg.a", "cyclepkg.b"]]
    text = describe(graph, cycles[0])
    assert "cyclepkg.b:3  from cyclepkg.a import helper as other" in text
