"""The package's structure figures, for one or more trees side by side (e.g. before and after a
restructuring): what a reviewer would count by hand, counted the same way every time.

    .venv/bin/python benchmarks/structure.py . /tmp/before            # two columns
    .venv/bin/python benchmarks/structure.py . /tmp/before --verbose  # and which ones
    .venv/bin/python benchmarks/structure.py . --json --import-runs 11

A TREE is a folder holding ``llmroute/`` (a checkout, or ``git archive <commit> llmroute |
tar -x -C DIR``). Only ``TREE/llmroute/**/*.py`` is read; every figure is of that package:

- lines: all lines of its ``.py`` files (blank and comment lines too), and the file count.
- modules over 800 lines.
- functions over 80 lines: ``def``/``async def`` from its ``def`` line to its last line (a
  nested function counts on its own, and inside its outer function's lines too).
- classes over 400 lines, measured the same way.
- repeated blocks: the pairs of places sharing six or more lines that the ``duplicates``
  command (this machine's) lists for ``TREE/llmroute`` (``--most 200``): all pairs, the
  identical ones (not "by shape alone") and the shape-only pairs not marked boilerplate. Empty
  when the command is missing.
- ``protocol ==`` tests outside ``llmroute/protocols/``: comparisons (``==``, ``!=``, in the
  code, not comments or strings) with a name or attribute ending in ``protocol`` on either side.
- private cross-package imports. Every module belongs to a *unit*: the first name under
  ``llmroute/`` (a subpackage such as ``server``, or a top-level module such as ``_client``,
  which is its own unit; ``llmroute/__init__.py`` and ``__main__.py`` are the unit ``llmroute``).
  An import (``import``/``from ... import``, relative ones resolved, anywhere in the file,
  ``TYPE_CHECKING`` blocks included) is counted when its target is in another unit and reaches
  inside it: a module or package name starting with ``_`` *below* the unit's own name
  (``llmroute.server._app``), or an imported name starting with ``_`` (not dunder) from any
  module of that unit (``from llmroute._client import _helper``). Importing a public name from
  a top-level module (``from llmroute._types import Usage``, ``from llmroute._errors import
  ...``) is not counted: those modules are the package's shared leaves, private to the package
  but not to a unit. Each (importing module, imported module) pair counts once, whatever
  names it imports.
- ``import llmroute``: the median over ``--import-runs`` fresh interpreters (after one run per
  tree to fill the bytecode cache, which lives in a temporary ``PYTHONPYCACHEPREFIX`` so that a
  read-only tree is timed the same way) of ``-X importtime``'s cumulative microseconds for
  ``llmroute`` (third-party imports it triggers included), run from an empty temporary folder
  with ``PYTHONPATH=TREE``; the trees' runs alternate. Beside it, the median sum of the self
  times of llmroute's own modules (without the third-party packages they import), and the
  median CPU time (user + system, from the child's rusage) of the whole interpreter: on a
  loaded machine wall times swing with the other processes, CPU time far less. Then, in one
  more interpreter, how many ``llmroute`` modules ``import llmroute`` loaded and their lines.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

MODULE_LINES, FUNCTION_LINES, CLASS_LINES = 800, 80, 400

LOADED = """
import json, sys
import llmroute
mods = [m for n, m in sys.modules.items() if n == "llmroute" or n.startswith("llmroute.")]
files = [getattr(m, "__file__", None) for m in mods]
lines = sum(len(open(f, encoding="utf-8").read().splitlines()) for f in files if f)
print(json.dumps({"modules": len(mods), "lines": lines, "file": llmroute.__file__}))
"""


def unit(parts: tuple[str, ...]) -> str:
    """The unit of a module path under llmroute (``("llmroute", "server", "_app")`` -> server)."""
    if len(parts) < 2 or parts[1] in ("__init__", "__main__"):
        return "llmroute"
    return parts[1]


def module_parts(rel: Path) -> tuple[str, ...]:
    """``llmroute/server/_app.py`` -> (llmroute, server, _app); a package's ``__init__`` is the
    package itself."""
    parts = rel.with_suffix("").parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def imports(tree: ast.AST, here: tuple[str, ...], is_package: bool) -> list[tuple[str, list[str]]]:
    """Every import in ``tree`` as (absolute module, names imported from it)."""
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = list(here if is_package else here[:-1])
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append((module, [alias.name for alias in node.names]))
    return out


def private_imports(root: Path, rel: Path, tree: ast.AST) -> list[str]:
    """This module's private cross-unit imports (see the module docstring), as text."""
    here = module_parts(rel)
    found: dict[str, set[str]] = {}
    for module, names in imports(tree, here, rel.name == "__init__.py"):
        parts = tuple(module.split("."))
        if parts[0] != "llmroute":
            continue
        # ``from llmroute.x import _y``: _y may be a module (a path) or a name in x.
        targets: list[tuple[tuple[str, ...], str | None]] = []
        for name in names or [None]:
            if name is not None and name != "*" and is_module(root, (*parts, name)):
                targets.append(((*parts, name), None))
            else:
                targets.append((parts, name))
        for path, name in targets:
            if unit(path) == unit(here):
                continue
            inside = any(private(p) for p in path[2:])
            if inside or (name is not None and private(name)):
                names_of = found.setdefault(f"{rel} <- {'.'.join(path)}", set())
                names_of.update([name] if name else [])
    return [f"{k} ({', '.join(sorted(v))})" if v else k for k, v in sorted(found.items())]


def is_module(root: Path, parts: tuple[str, ...]) -> bool:
    path = root.joinpath(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def protocol_tests(tree: ast.AST) -> int:
    """Comparisons ``==``/``!=`` with ``...protocol`` on either side."""

    def named(node: ast.AST) -> bool:
        name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
        return isinstance(name, str) and name.endswith("protocol")

    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for i, op in enumerate(node.ops):
                if isinstance(op, ast.Eq | ast.NotEq) and (named(sides[i]) or named(sides[i + 1])):
                    count += 1
    return count


def ast_figures(tree_dir: Path) -> dict[str, Any]:
    """Lines, long modules, functions and classes, protocol tests and private imports."""
    package = tree_dir / "llmroute"
    if not (package / "__init__.py").is_file():
        raise SystemExit(f"{tree_dir}: no llmroute/__init__.py there")
    lines = files = protocol = 0
    modules, functions, classes, privates = [], [], [], []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(tree_dir)
        src = path.read_text(encoding="utf-8")
        n = len(src.splitlines())
        lines, files = lines + n, files + 1
        if n > MODULE_LINES:
            modules.append((n, str(rel)))
        tree = ast.parse(src, filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                where = f"{rel}:{node.lineno} {node.name}"
                if isinstance(node, ast.ClassDef) and size > CLASS_LINES:
                    classes.append((size, where))
                elif not isinstance(node, ast.ClassDef) and size > FUNCTION_LINES:
                    functions.append((size, where))
        if rel.parts[:2] != ("llmroute", "protocols"):
            protocol += protocol_tests(tree)
        privates += private_imports(tree_dir, rel, tree)
    return {
        "lines": lines,
        "files": files,
        "modules_over_800": sorted(modules, reverse=True),
        "functions_over_80": sorted(functions, reverse=True),
        "classes_over_400": sorted(classes, reverse=True),
        "protocol_tests_outside_protocols": protocol,
        "private_cross_package_imports": privates,
    }


def duplicates(tree_dir: Path, seconds: int) -> dict[str, Any] | None:
    """The ``duplicates`` command's pairs within ``tree_dir/llmroute``; None without it."""
    command = shutil.which("duplicates")
    if command is None:
        return None
    args = [command, "--repo", str(tree_dir / "llmroute"), "--most", "200"]
    done = subprocess.run(
        [*args, "--seconds", str(seconds)], capture_output=True, text=True, timeout=seconds + 60
    )
    out = done.stdout.splitlines()
    head = out[0] if out else ""
    result: dict[str, Any] = {"pairs": 0, "identical": 0, "shape": 0, "boilerplate": 0}
    match = re.match(r"(\d+) pairs? of places", head)
    if match:
        pairs = int(match.group(1))
        shape = re.search(r"\((\d+) by shape alone", head)
        boiler = re.search(r"(\d+) of those marked boilerplate", head)
        n_shape = int(shape.group(1)) if shape else 0
        n_boiler = int(boiler.group(1)) if boiler else 0
        result |= {"pairs": pairs, "identical": pairs - n_shape, "shape": n_shape - n_boiler}
        result["boilerplate"] = n_boiler
    elif "no duplicates" not in head:
        result["error"] = head or done.stderr.strip()[:200]
    result["rows"] = [line for line in out[1:] if re.match(r"D\d+ ", line)]
    result["notes"] = [line for line in out if line.startswith(("left out:", "incomplete:"))]
    return result


def import_env(tree_dir: Path, cache: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LLMROUTE_"))}
    return env | {"PYTHONPATH": str(tree_dir), "PYTHONPYCACHEPREFIX": cache}


def import_once(tree_dir: Path, cache: str, cwd: str) -> tuple[int, int, float]:
    """``import llmroute``'s cumulative microseconds in one fresh interpreter, the sum of the
    self times of llmroute's own modules, and the interpreter's CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import llmroute"],
        capture_output=True,
        text=True,
        env=import_env(tree_dir, cache),
        cwd=cwd,
        timeout=120,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    if done.returncode != 0:
        raise SystemExit(f"import llmroute failed in {tree_dir}:\n{done.stderr[-2000:]}")
    cumulative = own = 0
    for line in done.stderr.splitlines():
        cells = line.removeprefix("import time:").split("|")
        if len(cells) != 3 or not cells[0].strip().isdigit():
            continue
        name = cells[2].strip()
        if name == "llmroute" or name.startswith("llmroute."):
            own += int(cells[0])
        if name == "llmroute":
            cumulative = int(cells[1])
    if not cumulative:
        raise SystemExit(f"no import time for llmroute in {tree_dir}'s -X importtime output")
    return cumulative, own, cpu


def import_figures(trees: list[Path], runs: int) -> list[dict[str, Any]]:
    """Median ``import llmroute`` time and the modules it loads, per tree (runs alternate)."""
    with tempfile.TemporaryDirectory(prefix="structure-") as tmp:
        cache, cwd = os.path.join(tmp, "pycache"), os.path.join(tmp, "cwd")
        os.mkdir(cwd)
        for tree in trees:  # fill the bytecode cache (this tree's and the packages')
            import_once(tree, cache, cwd)
        times: list[list[tuple[int, int, float]]] = [[] for _ in trees]
        for r in range(runs):
            order = range(len(trees)) if r % 2 == 0 else reversed(range(len(trees)))
            for i in order:
                times[i].append(import_once(trees[i], cache, cwd))
        out = []
        for tree, samples in zip(trees, times, strict=True):
            done = subprocess.run(
                [sys.executable, "-c", LOADED],
                capture_output=True,
                text=True,
                env=import_env(tree, cache),
                cwd=cwd,
                timeout=120,
                check=True,
            )
            loaded = json.loads(done.stdout.strip().splitlines()[-1])
            if not loaded["file"].startswith(str(tree)):
                raise SystemExit(f"{tree}: imported llmroute from {loaded['file']} instead")
            total = [cumulative for cumulative, _, _ in samples]
            out.append(
                {
                    "import_ms_median": statistics.median(total) / 1000,
                    "import_ms_min": min(total) / 1000,
                    "import_ms_max": max(total) / 1000,
                    "own_ms_median": statistics.median(own for _, own, _ in samples) / 1000,
                    "cpu_ms_median": statistics.median(cpu for _, _, cpu in samples) * 1000,
                    "modules_loaded": loaded["modules"],
                    "lines_loaded": loaded["lines"],
                }
            )
        return out


def figures(trees: list[Path], runs: int, seconds: int) -> list[dict[str, Any]]:
    results = []
    for tree in trees:
        result = {"tree": str(tree)} | ast_figures(tree)
        result["duplicates"] = duplicates(tree, seconds)
        results.append(result)
    if runs > 0:
        for result, timed in zip(results, import_figures(trees, runs), strict=True):
            result["import"] = timed
    return results


def table(results: list[dict[str, Any]], verbose: bool) -> str:
    """One row per figure, one column per tree; with ``verbose`` the lists after it."""

    def row(name: str, cells: list[str]) -> str:
        return "| " + " | ".join([name, *cells]) + " |"

    rows = [row("", [r["tree"] for r in results]), row("---", ["---"] * len(results))]
    rows.append(row("lines (files)", [f"{r['lines']} ({r['files']})" for r in results]))
    for key, label in (
        ("modules_over_800", f"modules over {MODULE_LINES} lines"),
        ("functions_over_80", f"functions over {FUNCTION_LINES} lines"),
        ("classes_over_400", f"classes over {CLASS_LINES} lines"),
        ("private_cross_package_imports", "private cross-package imports"),
    ):
        rows.append(row(label, [str(len(r[key])) for r in results]))
    rows.append(
        row(
            "`protocol ==`/`!=` outside protocols/",
            [str(r["protocol_tests_outside_protocols"]) for r in results],
        )
    )
    if all(r["duplicates"] is not None for r in results):
        cells = [
            f"{d['pairs']} ({d['identical']} identical, {d['shape']} shape, "
            f"{d['boilerplate']} boilerplate)"
            for d in (r["duplicates"] for r in results)
        ]
        rows.append(row("repeated blocks of 6+ lines (pairs)", cells))
    else:
        rows.append(
            row("repeated blocks of 6+ lines (pairs)", ["(no duplicates command)"] * len(results))
        )
    if all("import" in r for r in results):
        cells = [
            f"{i['import_ms_median']:.1f} ms ({i['import_ms_min']:.1f}..{i['import_ms_max']:.1f})"
            for i in (r["import"] for r in results)
        ]
        rows.append(row("`import llmroute` (median, range)", cells))
        cells = [f"{r['import']['own_ms_median']:.1f} ms" for r in results]
        rows.append(row("of which llmroute's own modules (median)", cells))
        cells = [f"{r['import']['cpu_ms_median']:.0f} ms" for r in results]
        rows.append(row("the interpreter's CPU time (median)", cells))
        cells = [
            f"{r['import']['modules_loaded']} ({r['import']['lines_loaded']})" for r in results
        ]
        rows.append(row("llmroute modules loaded (their lines)", cells))
    out = ["\n".join(rows)]
    out.append(f"modules over {MODULE_LINES} lines:")
    for r in results:
        out.append(
            f"  {r['tree']}: "
            + (", ".join(f"{m} ({n})" for n, m in r["modules_over_800"]) or "none")
        )
    if verbose:
        for r in results:
            out.append(f"\n{r['tree']}:")
            for key in ("functions_over_80", "classes_over_400"):
                out.append(f"  {key}:")
                out += [f"    {n:4d} {where}" for n, where in r[key]]
            out.append("  private_cross_package_imports:")
            out += [f"    {line}" for line in r["private_cross_package_imports"]]
            if r["duplicates"]:
                out.append("  duplicates:")
                out += [
                    f"    {line}" for line in r["duplicates"]["rows"] + r["duplicates"]["notes"]
                ]
    else:
        for r in results:
            notes = (r["duplicates"] or {}).get("notes", [])
            out += [f"  {r['tree']}: duplicates: {note}" for note in notes]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("trees", nargs="+", type=Path, metavar="TREE", help="a folder holding llmroute/")
    p.add_argument("--verbose", action="store_true", help="list the functions, classes, imports")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--import-runs", type=int, default=11, help="fresh interpreters per tree (0: skip; 11)"
    )
    p.add_argument("--duplicates-seconds", type=int, default=60)
    args = p.parse_args(argv)
    trees = [t.resolve() for t in args.trees]
    results = figures(trees, args.import_runs, args.duplicates_seconds)
    if args.json:
        print(json.dumps({"trees": results, "load_average": os.getloadavg()}, indent=2))
    else:
        print(table(results, args.verbose))
        print(f"load average (1 min): {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
