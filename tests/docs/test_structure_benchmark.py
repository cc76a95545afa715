"""benchmarks/structure.py on two tiny made-up trees: each figure counts what it says, and a
tree's ``import llmroute`` is its own (timed in a fresh interpreter with that tree first)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_structure() -> ModuleType:
    spec = importlib.util.spec_from_file_location("structure", BENCHMARKS / "structure.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_tree(root: Path, *, messy: bool) -> Path:
    """A package ``llmroute`` with units ``server`` and ``cli``, a top-level ``_types``, and in
    the ``messy`` one: a long module, function and class, a protocol test outside protocols/
    and private imports across units."""
    files = {
        "__init__.py": "from llmroute._types import Usage\n",
        "_types.py": "class Usage:\n    pass\n",
        "server/__init__.py": "",
        "server/_app.py": "def _hidden():\n    return 1\n\ndef shown():\n    return 2\n",
        "protocols/__init__.py": "",
        "protocols/openai.py": "def kind(protocol):\n    return protocol == 'openai'\n",
        "cli/__init__.py": "",
        "cli/_serve.py": "from .. import _types\nfrom llmroute._types import Usage\n",
    }
    if messy:
        body = "".join(f"    x{i} = {i}\n" for i in range(85))
        files["cli/_serve.py"] += (
            "from llmroute.server._app import shown\n"  # a private module of another unit
            "from ..server import _app\n"  # the same, relative
            "from llmroute._types import _private\n"  # a private name of a top-level unit
            "from llmroute.cli import _serve\n"  # its own unit: not counted
            f"def long():\n{body}    return 0\n"
            "def check(config):\n    return config.protocol != 'anthropic'\n"
        )
        files["_types.py"] += "_private = 1\n"
        files["big.py"] = "".join(f"v{i} = {i}\n" for i in range(801))
        files["klass.py"] = "class Big:\n" + "".join(f"    a{i} = {i}\n" for i in range(400))
    for name, text in files.items():
        path = root / "llmroute" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_each_figure_counts_what_it_names(tmp_path: Path) -> None:
    structure = load_structure()
    clean = make_tree(tmp_path / "clean", messy=False)
    messy = make_tree(tmp_path / "messy", messy=True)
    a, b = structure.figures([clean, messy], runs=1, seconds=10)
    assert (len(a["modules_over_800"]), len(b["modules_over_800"])) == (0, 1)
    assert [where for _, where in b["functions_over_80"]] == ["llmroute/cli/_serve.py:7 long"]
    assert [where for _, where in b["classes_over_400"]] == ["llmroute/klass.py:1 Big"]
    assert len(a["functions_over_80"]) == len(a["classes_over_400"]) == 0
    # protocols/openai.py's own test does not count; cli/_serve.py's does
    assert (a["protocol_tests_outside_protocols"], b["protocol_tests_outside_protocols"]) == (0, 1)
    assert a["private_cross_package_imports"] == []
    assert b["private_cross_package_imports"] == [
        "llmroute/cli/_serve.py <- llmroute._types (_private)",
        "llmroute/cli/_serve.py <- llmroute.server._app (shown)",
    ]
    assert b["lines"] > a["lines"] and b["files"] == a["files"] + 2
    for result, tree in ((a, clean), (b, messy)):
        assert result["import"]["modules_loaded"] == 2  # llmroute and llmroute._types
        assert result["import"]["import_ms_median"] > 0
        assert result["tree"] == str(tree)
    for result in (a, b):  # the duplicates command, where this machine has it
        assert result["duplicates"] is None or "error" not in result["duplicates"]
    table = structure.table([a, b], verbose=True)
    assert "llmroute/big.py (801)" in table and str(messy) in table


def test_a_folder_without_the_package_is_a_sentence(tmp_path: Path) -> None:
    structure = load_structure()
    try:
        structure.main([str(tmp_path), "--import-runs", "0"])
    except SystemExit as exc:
        assert "no llmroute/__init__.py" in str(exc.code)
    else:
        raise AssertionError("no error for a folder without llmroute/")
