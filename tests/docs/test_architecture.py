"""docs/architecture.md is the map of the code as it is.

The doc's checked parts, read here with ``ast`` only (nothing of llmroute is imported):

- **the layers** (its ``## Layers`` section): headings ``### 1. Name`` from the bottom layer up,
  each with a table whose rows name one module of ``llmroute/`` in backticks, relative to the
  package: a file (``routing/engine.py``) or a package drawn whole (``server/``). A package is
  drawn either whole or file by file; drawn file by file, its ``__init__.py`` (which gathers the
  package's names) needs no row, and importing a name from it counts as importing the modules
  that ``__init__.py`` imports (or the one module it re-exports that name from).
- **the arrows**: every fenced block whose info string is ``text imports`` holds lines of modules
  joined by arrows, then an optional note after two spaces: ``A -> B`` (or ``B <- A``) says A
  imports B; ``A ~> B`` (or ``B <~ A``) says A reaches B without importing it (through an object it
  was handed). A module in an arrow may be a file inside a package drawn whole
  (``transport/_h2.py``).
- **the upward imports**: the one fenced block whose info string is ``text upward`` lists, as
  ``A -> B  why``, each import that goes to a higher layer, which the doc names as an exception
  to "a module imports only modules of its own layer or a lower one".
- **the names**: anywhere in the doc, a ``Class.attr`` in backticks whose class is defined in
  llmroute/ names something that class (or an llmroute base of it) defines, and a private name
  (``_serve``, ``_Run``) is defined somewhere in llmroute/; other names (openai's, httpx's) are
  not checked.

The test says what the code has and the doc does not (and the reverse), all at once, each line
saying what to change in the doc.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "llmroute"
DOC = ROOT / "docs" / "architecture.md"
WHERE = "docs/architecture.md"

ARROW = re.compile(r"\s*(->|<-|~>|<~)\s*")
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
LAYER = re.compile(r"^### (\d+)\. (.+)$")
ROW = re.compile(r"^\|\s*`([\w./]+)`\s*\|")


@dataclass
class Map:
    """What the doc draws."""

    layers: dict[str, int] = field(default_factory=dict)  # module -> layer number
    arrows: list[tuple[int, str, str, str]] = field(default_factory=list)  # line, a, op, b
    upward: list[tuple[int, str, str]] = field(default_factory=list)  # line, a, b
    problems: list[str] = field(default_factory=list)


def read_map(text: str) -> Map:
    """The layers, arrows and named upward imports of the doc's ``text``."""
    drawn = Map()
    section = ""
    layer = layer_seen = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("## "):
            section = line[3:].strip()
            layer = 0
        elif section == "Layers" and (heading := LAYER.match(line)):
            if int(heading.group(1)) != layer_seen + 1:
                drawn.problems.append(
                    f"{WHERE}:{number}: number the layers 1, 2, 3... from the bottom up: "
                    f"this one is {layer_seen + 1}"
                )
            layer = layer_seen = int(heading.group(1))
        elif section == "Layers" and layer and (row := ROW.match(line)):
            module = row.group(1)
            if module in drawn.layers:
                drawn.problems.append(f"{WHERE}:{number}: `{module}` has a second row; keep one")
            drawn.layers[module] = layer
    for fence in FENCE.finditer(text):
        info, body = fence.group(1).split(), fence.group(2)
        first = text.count("\n", 0, fence.start(2)) + 1
        for offset, line in enumerate(body.splitlines()):
            chain = line.split("  ")[0].strip()
            if not chain or chain.startswith("#"):
                continue
            parts = ARROW.split(chain)
            if info == ["text", "imports"]:
                if len(parts) < 3:
                    drawn.problems.append(
                        f"{WHERE}:{first + offset}: `{chain}` has no arrow; "
                        "write `A -> B` (A imports B) or `A ~> B` (A reaches B without "
                        "importing it)"
                    )
                for i in range(0, len(parts) - 2, 2):
                    drawn.arrows.append((first + offset, parts[i], parts[i + 1], parts[i + 2]))
            elif info == ["text", "upward"]:
                if len(parts) != 3 or parts[1] != "->":
                    drawn.problems.append(
                        f"{WHERE}:{first + offset}: write an upward import as `A -> B  why`"
                    )
                else:
                    drawn.upward.append((first + offset, parts[0], parts[2]))
    return drawn


def modules() -> list[str]:
    """Every module of llmroute/, as a path relative to it."""
    return sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "__pycache__" not in path.parts
    )


def _path_of(name: str) -> str | None:
    """``llmroute.routing.engine`` -> ``routing/engine.py`` (None if not in the package)."""
    parts = name.split(".")
    if parts[0] != "llmroute":
        return None
    base = "/".join(parts[1:])
    for candidate in (f"{base}.py", f"{base}/__init__.py" if base else "__init__.py"):
        if (PACKAGE / candidate).is_file():
            return candidate
    return None


@functools.cache
def imports_of(path: str) -> dict[str, set[str]]:
    """The modules of llmroute/ that ``path`` imports (anywhere: at the top, in a function or
    under TYPE_CHECKING), each with the names it takes from it."""
    file = PACKAGE / path
    name = "llmroute." + path.removesuffix(".py").replace("/", ".")
    package = name.removesuffix(".__init__") if path.endswith("__init__.py") else name
    package = package if path.endswith("__init__.py") else package.rsplit(".", 1)[0]
    found: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (target := _path_of(alias.name)) is not None:
                    found.setdefault(target, set()).add("*")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = _path_of(f"{source}.{alias.name}")
                if submodule is not None:
                    found.setdefault(submodule, set()).add("*")
                elif (target := _path_of(source)) is not None:
                    found.setdefault(target, set()).add(alias.name)
    found.pop(path, None)
    return found


class Code:
    """The import graph of llmroute/ between the modules the doc draws."""

    def __init__(self, drawn: Map) -> None:
        self.files = modules()
        self.rows = drawn.layers
        self.problems: list[str] = []
        self.node: dict[str, str] = {}
        whole = {row.rstrip("/") for row in self.rows if row.endswith("/")}
        by_file = {row.rsplit("/", 1)[0] for row in self.rows if "/" in row and row[-1] != "/"}
        for row in sorted(self.rows):
            if row.endswith("/") and not (PACKAGE / row / "__init__.py").is_file():
                self.problems.append(f"remove the row `{row}`: llmroute/{row} is not a package")
            elif not row.endswith("/") and not (PACKAGE / row).is_file():
                self.problems.append(f"remove the row `{row}`: llmroute/{row} does not exist")
            elif row.endswith("/") and any(
                other.startswith(row) and other != row for other in self.rows
            ):
                self.problems.append(
                    f"`{row}` is drawn whole and file by file: keep its row or its files' rows"
                )
        self.doors: set[str] = set()
        for path in self.files:
            if path in self.rows:
                self.node[path] = path
                continue
            owners = [p for p in whole if path.startswith(p + "/")]
            if owners:
                self.node[path] = max(owners, key=len) + "/"
            elif path.endswith("/__init__.py") and path.rsplit("/", 1)[0] in by_file:
                self.doors.add(path)
            else:
                package = path.rsplit("/", 1)[0] + "/" if "/" in path else ""  # drawn by file
                self.problems.append(
                    f"add a row for `{path}` (one line: what it is) to its layer's table under "
                    "## Layers"
                    + (
                        f", or draw `{package}` whole"
                        if package and package.rstrip("/") not in by_file
                        else ""
                    )
                )
        self.edges: dict[str, set[str]] = {}
        for path in self.files:
            if path not in self.node:
                continue
            targets = self.edges.setdefault(self.node[path], set())
            for target, names in imports_of(path).items():
                targets |= self._resolve(target, names)
            targets.discard(self.node[path])

    def _resolve(
        self, target: str, names: set[str], seen: frozenset[str] = frozenset()
    ) -> set[str]:
        """The drawn modules an import of ``names`` from ``target`` depends on."""
        if target in self.node:
            return {self.node[target]}
        if target not in self.doors or target in seen:
            return set()
        door = imports_of(target)
        chosen: set[str] = set()
        for name in names:
            sources = [module for module, taken in door.items() if name in taken]
            for module in sources or door:
                chosen |= self._resolve(module, door[module], seen | {target})
        return chosen

    def named(self, written: str) -> str | None:
        """The drawn module an arrow's ``written`` name stands for (None if there is none)."""
        if written in self.rows:
            return written
        if written.endswith("/") and any(row.startswith(written) for row in self.rows):
            return written  # a package drawn file by file: any of its modules
        if (PACKAGE / written).is_file():
            return self.node.get(written)
        return None

    def imports(self, a: str, b: str) -> bool:
        """Whether the drawn module ``a`` imports ``b`` (a package drawn file by file: any
        of its modules)."""
        sources = [n for n in self.edges if n == a or (a.endswith("/") and n.startswith(a))]
        return any(
            t == b or (b.endswith("/") and t.startswith(b))
            for source in sources
            for t in self.edges[source]
        )


def _exists(module: str) -> bool:
    """Whether the map's ``module`` (a file, or a package ending in ``/``) is in llmroute/."""
    return (PACKAGE / module).is_file() or (PACKAGE / module / "__init__.py").is_file()


def check(text: str) -> list[str]:
    """Every way the doc's ``text`` differs from the code, as what to change in the doc."""
    drawn = read_map(text)
    code = Code(drawn)
    problems = drawn.problems + code.problems
    if not drawn.layers:
        problems.append("draw the layers: under ## Layers, `### 1. Name` headings with tables")
    if not drawn.arrows:
        problems.append("draw the paths a reader follows as ```text imports``` blocks of arrows")
    for line, a, op, b in drawn.arrows:
        source, target = (a, b) if op in ("->", "~>") else (b, a)
        named = {w: code.named(w) for w in (source, target)}
        unknown = [w for w, n in named.items() if n is None]
        if unknown:
            problems.extend(
                f"{WHERE}:{line}: `{w}` in `{a} {op} {b}` is not a module on the map; "
                "name a file or package of llmroute/ the layers draw"
                for w in unknown
            )
            continue
        if named[source] == named[target]:
            problems.append(
                f"{WHERE}:{line}: `{a} {op} {b}` is inside `{named[source]}`, drawn whole: "
                "remove the arrow, or draw the package file by file"
            )
            continue
        imports = code.imports(named[source] or "", named[target] or "")
        if op in ("->", "<-") and not imports:
            problems.append(
                f"{WHERE}:{line}: `{a} {op} {b}`: {source} does not import {target}; "
                f"redraw it (`{source} ~> {target}` if it reaches it through an object it is "
                "handed) or remove it"
            )
        if op in ("~>", "<~") and imports:
            problems.append(
                f"{WHERE}:{line}: `{a} {op} {b}`: {source} imports {target}; "
                f"draw `{source} -> {target}`"
            )
    layer = drawn.layers
    listed = set()
    for line, a, b in drawn.upward:
        listed.add((a, b))
        if a not in layer or b not in layer:
            problems.extend(
                f"{WHERE}:{line}: `{a} -> {b}`: `{w}` is not a row of the layers' tables"
                for w in (a, b)
                if w not in layer
            )
        elif not (_exists(a) and _exists(b)):
            problems.append(
                f"{WHERE}:{line}: `{a} -> {b}`: "
                + " and ".join(f"`{w}`" for w in (a, b) if not _exists(w))
                + " is not in llmroute/ any more; name the module that took its place"
            )
        elif not code.imports(a, b):
            problems.append(
                f"{WHERE}:{line}: remove `{a} -> {b}` from the upward imports: {a} does not "
                f"import {b}"
            )
        elif layer[b] <= layer[a]:
            problems.append(
                f"{WHERE}:{line}: remove `{a} -> {b}` from the upward imports: {b} (layer "
                f"{layer[b]}) is not above {a} (layer {layer[a]})"
            )
    for source, targets in sorted(code.edges.items()):
        for target in sorted(targets):
            if layer.get(target, 0) > layer.get(source, 0) and (source, target) not in listed:
                problems.append(
                    f"{source} (layer {layer[source]}) imports {target} (layer {layer[target]}): "
                    f"move one of them to another layer, or add `{source} -> {target}  why` to "
                    "the ```text upward``` block"
                )
    return problems + misnamed(text)


NAMED = re.compile(r"`((?:[A-Za-z_]\w*\.)?_?[A-Za-z_]\w*)(?:\([^`]*\))?`")


@functools.cache
def definitions() -> tuple[dict[str, set[str]], frozenset[str]]:
    """Each class of llmroute/ with the names defined in it (methods, class attributes,
    ``self.x`` set in its methods, and its llmroute bases' names), and every name defined
    anywhere in llmroute/ (functions, methods, classes, module-level assignments)."""
    classes: dict[str, set[str]] = {}
    bases: dict[str, set[str]] = {}
    names: set[str] = set()
    for path in modules():
        tree = ast.parse((PACKAGE / path).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            if isinstance(node, ast.ClassDef):
                own = classes.setdefault(node.name, set())
                bases.setdefault(node.name, set()).update(
                    b.id for b in node.bases if isinstance(b, ast.Name)
                )
                for item in ast.walk(node):
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        own.add(item.name)
                    elif isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store):
                        own.add(item.attr)
                    elif isinstance(item, ast.Name) and isinstance(item.ctx, ast.Store):
                        own.add(item.id)
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign):
                targets = [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    for name in classes:  # a class's llmroute bases' names are its own too
        todo, seen = list(bases[name]), set()
        while todo:
            base = todo.pop()
            if base in classes and base not in seen:
                seen.add(base)
                classes[name] |= classes[base]
                todo.extend(bases[base])
    return classes, frozenset(names)


def misnamed(text: str) -> list[str]:
    """The doc's names of llmroute's code that the code does not have: ``Class.attr`` of a class
    defined in llmroute/, and private names (``_serve``, ``_Run``) anywhere."""
    classes, names = definitions()
    problems = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in NAMED.finditer(line):
            written = match.group(1)
            owner, _, attr = written.rpartition(".")
            if owner and owner in classes and attr not in classes[owner]:
                problems.append(
                    f"{WHERE}:{number}: `{written}`: llmroute's class {owner} has no {attr}; "
                    "name what the code calls it, or remove it"
                )
            elif not owner and written.startswith("_") and not written.startswith("__"):
                if written not in names:
                    problems.append(
                        f"{WHERE}:{number}: `{written}` is defined nowhere in llmroute/; name what "
                        "the code calls it, or remove it"
                    )
    return problems


def test_the_architecture_doc_draws_the_code() -> None:
    problems = check(DOC.read_text())
    assert not problems, (
        f"{WHERE} does not draw the code as it is; change the doc:\n- " + "\n- ".join(problems)
    )


def test_the_check_finds_a_missing_module_a_false_arrow_and_an_upward_import() -> None:
    text = DOC.read_text()
    drawn = read_map(text)
    assert len(drawn.layers) > 30 and len(drawn.arrows) > 10  # the doc's checked parts were read
    first_row = next(line for line in text.splitlines() if ROW.match(line))
    module = ROW.match(first_row).group(1)  # type: ignore[union-attr]
    broken = text.replace(first_row + "\n", "", 1)
    broken += "\n```text imports\ntransport/ -> server/  a false arrow\n```\n"
    broken += "\n`Dispatch.no_such_stage` and `_no_such_helper()`\n"
    problems = check(broken)
    assert any("class Dispatch has no no_such_stage" in p for p in problems)
    assert any("`_no_such_helper` is defined nowhere" in p for p in problems)
    assert any(f"add a row for `{module}`" in p or f"draw `{module}`" in p for p in problems)
    assert any("transport/ does not import server/" in p for p in problems)
    upward = drawn.upward
    if upward:
        line, a, b = upward[0]
        lines = text.splitlines()
        unlisted = "\n".join(lines[: line - 1] + lines[line:])
        assert any(p.startswith(f"{a} (layer") and f"imports {b}" in p for p in check(unlisted))
