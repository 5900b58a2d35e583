"""The house rules of src/ (issue 27), checked on the import graph scripts/architecture.py draws: no import
cycle (imports inside functions included), the project's own imports inside functions only where they are
deliberate, models import neither data/ nor methods/, certify/ is mathematics only; and no function over 50 lines."""

import importlib.util

import pytest

from conftest import REPO

SRC = REPO / "src" / "ttp_lightning"
DEFERRED = {  # the only project imports inside functions, each for a reason
    "ttp_lightning -> ttp_lightning.release",  # `ttp_lightning.load_released`: importing the package loads no torch
    "ttp_lightning.__main__ -> ttp_lightning.pipeline",  # bad input gets its one line before torch and Lightning load
    "ttp_lightning.__main__ -> ttp_lightning.protection",
    "ttp_lightning.pipeline -> ttp_lightning.reporting.plots",  # matplotlib is optional (the plots extra)
}


@pytest.fixture(scope="module")
def picture():
    spec = importlib.util.spec_from_file_location("architecture", REPO / "scripts" / "architecture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.scan(SRC)


def test_no_import_cycle(picture):
    assert picture["cycles"] == []


def test_project_imports_inside_functions_are_the_deliberate_ones(picture):
    assert set(picture["function_level_project_imports"]) <= DEFERRED


def _arrows_from(picture, package: str) -> dict[str, list[str]]:
    return {name: targets for name, targets in picture["arrow_list"].items()
            if name == package or name.startswith(package + ".")}


def test_models_import_neither_data_nor_methods(picture):
    for name, targets in _arrows_from(picture, "ttp_lightning.models").items():
        wrong = [t for t in targets if t.startswith(("ttp_lightning.data.", "ttp_lightning.methods"))
                 or t == "ttp_lightning.data"]
        assert not wrong, f"{name} imports {wrong}"


def test_certify_is_mathematics_only(picture):
    allowed = ("ttp_lightning.certify", "ttp_lightning.errors", "ttp_lightning.objectives", "ttp_lightning.batching")
    for name, targets in _arrows_from(picture, "ttp_lightning.certify").items():
        wrong = [t for t in targets if not t.startswith(allowed)]
        assert not wrong, f"{name} imports {wrong}"
        assert name not in picture["config_readers"], f"{name} reads a DictConfig"


def test_no_function_is_longer_than_fifty_lines():
    """Issue 40: small functions (a def's first line to its last, docstring included)."""
    import ast

    long = [f"{path.relative_to(SRC)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in SRC.rglob("*.py") for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 50]
    assert long == []
