"""No import circles among llmroute's modules, counting every import a module writes: at its top,
inside a function (a lazy import), or under ``TYPE_CHECKING``. Read with ``ast`` only (nothing of
llmroute is imported). ``from P import n`` imports the module ``P.n`` when there is one, else
``P`` (its ``__init__.py``), and ``from P import m`` imports ``P`` too (the name is read from
``P``: ``from . import m`` in a package's module goes through the package's ``__init__.py``);
``import P.m`` and ``from P.m import n`` do not count as importing ``P`` itself."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each module of ``root/llmroute`` (dotted) and the package modules it imports."""
    modules: dict[str, tuple[Path, bool]] = {}
    for path in (root / "llmroute").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if package else parts)] = (path, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, package) in modules.items():
        here = name if package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
                targets.append(base)
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or around a loop (Tarjan's
    strongly connected components of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group: list[str] = []
                    while True:
                        member = stack.pop()
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
            elif step not in index:
                index[step] = low[step] = len(index)
                stack.append(step)
                work.append((step, iter(sorted(graph[step]))))
            elif step in stack:
                low[node] = min(low[node], index[step])
    return found


def test_llmroute_has_no_import_circle() -> None:
    graph = import_graph(ROOT)
    assert len(graph) > 100  # the whole package was read
    found = circles(graph)
    assert not found, (
        "these modules import each other (every import counts, lazy and TYPE_CHECKING ones "
        "too); move what both need into a module below them, or hand it in as an argument:\n- "
        + "\n- ".join(" <-> ".join(group) for group in found)
    )


def test_a_circle_is_found_through_a_lazy_and_a_type_checking_import(tmp_path: Path) -> None:
    package = tmp_path / "llmroute"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from . import a\n")
    (package / "a.py").write_text("def f():\n    from .sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import f\n"
    )
    (package / "c.py").write_text("import llmroute.a\n")
    graph = import_graph(tmp_path)
    assert graph["llmroute.c"] == {"llmroute.a"}
    assert circles(graph) == [["llmroute.a", "llmroute.sub.b"]]


def test_from_a_package_import_a_module_goes_through_the_package(tmp_path: Path) -> None:
    package = tmp_path / "llmroute" / "sub"
    package.mkdir(parents=True)
    (package.parent / "__init__.py").write_text("")
    (package / "__init__.py").write_text("from .a import f\n")
    (package / "a.py").write_text("from .b import g\n")
    (package / "b.py").write_text("from . import c\n")
    (package / "c.py").write_text("")
    graph = import_graph(tmp_path)
    assert graph["llmroute.sub.b"] == {"llmroute.sub", "llmroute.sub.c"}
    assert circles(graph) == [["llmroute.sub", "llmroute.sub.a", "llmroute.sub.b"]]
