"""The house rules of src/ (issues 27 and 40), checked on the import graph scripts/architecture.py draws: no import
cycle (imports inside functions included) and no loop between folders, the project's own imports inside functions
only where they are deliberate, models import neither data/ nor methods/, certified/maths/ is mathematics only, the
package root holds only the entry points and re-exports; and no function over 50 lines."""

import importlib.util

import pytest

from conftest import REPO

SRC = REPO / "src" / "ttp_lightning"
DEFERRED = {  # the only project imports inside functions, each for a reason
    "ttp_lightning -> ttp_lightning.release",  # `ttp_lightning.load_released`: importing the package loads no torch
    "ttp_lightning.__main__ -> ttp_lightning.run.pipeline",  # bad input gets its one line before torch and Lightning load
    "ttp_lightning.__main__ -> ttp_lightning.assess.protection",
    "ttp_lightning.reporting.run_logger -> ttp_lightning.reporting.plots",  # matplotlib is optional (the plots extra)
    "ttp_lightning.methods -> ttp_lightning.methods.base",  # the methods' schemas are registered without torch
    "ttp_lightning.methods -> ttp_lightning.methods.output",
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


MATHEMATICS = ("ttp_lightning.certified.maths", "ttp_lightning.dp", "ttp_lightning.bounds")
MATHS_MAY_IMPORT = (*MATHEMATICS, "ttp_lightning.core.errors", "ttp_lightning.core.objectives",
                    "ttp_lightning.core.batching", "ttp_lightning.core.nn_modes", "ttp_lightning.core.metrics",
                    "ttp_lightning.core.stopping")  # a flag the long loops read: a SIGTERM stops them (issue 59)


@pytest.mark.parametrize("package", MATHEMATICS)
def test_the_mathematics_is_mathematics_only(picture, package):
    """The certified step's maths, the DP maths and the bounds import nothing but each other and core's maths:
    no Lightning module, no method, no config."""
    for name, targets in _arrows_from(picture, package).items():
        wrong = [t for t in targets if not t.startswith(MATHS_MAY_IMPORT)]
        assert not wrong, f"{name} imports {wrong}"
        assert name not in picture["config_readers"], f"{name} reads a DictConfig"


ALG1 = {"ttp_lightning.alg1", "ttp_lightning.alg1.method", "ttp_lightning.alg1.module", "ttp_lightning.alg1.callbacks",
        "ttp_lightning.alg1.schema", "ttp_lightning.alg1.adversary"}


def test_alg1_lives_in_one_package(picture):
    """Issue 60: Alg 1 (plain and robust) is one folder, its method, LightningModule, callbacks, settings and
    training attacks; nothing else in src/ is named for it."""
    modules = set(picture["arrow_list"])
    assert {name for name in modules if name.startswith("ttp_lightning.alg1")} == ALG1
    stray = [name for name in modules if not name.startswith("ttp_lightning.alg1")
             and any(word in name.rsplit(".", 1)[-1] for word in ("pareto", "alg1"))]
    assert stray == []


def test_no_function_is_longer_than_fifty_lines():
    """Issue 40: small functions (a def's first line to its last, docstring included)."""
    import ast

    long = [f"{path.relative_to(SRC)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in SRC.rglob("*.py") for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 50]
    assert long == []


ROOT_MODULES = {"ttp_lightning", "ttp_lightning.__main__", "ttp_lightning.version", "ttp_lightning.theory",
                "ttp_lightning.tables", "ttp_lightning.plots", "ttp_lightning.push"}  # verify/ is a folder (issue 60)


def test_the_root_holds_only_entry_points_and_re_exports(picture):
    """Issue 40: `python -m ttp_lightning[.verify|.theory|.tables|.plots]`, the version and the package itself;
    everything else in a folder named for its job."""
    assert set(picture["root_modules"]) == ROOT_MODULES
    assert len(picture["root_modules"]) <= 10


def test_no_loop_between_folders(picture):
    assert picture["folder_loops"] == []


def test_core_imports_no_other_folder(picture):
    """core/ is the floor every wing stands on: it imports nothing of the project outside itself."""
    for name, targets in _arrows_from(picture, "ttp_lightning.core").items():
        wrong = [t for t in targets if not t.startswith("ttp_lightning.core")]
        assert not wrong, f"{name} imports {wrong}"


def test_the_picture_finds_a_folder_loop_and_a_root_module(tmp_path):
    """The checks above can fail: a package whose two folders import each other, and a stray root module."""
    spec = importlib.util.spec_from_file_location("architecture", REPO / "scripts" / "architecture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    package = tmp_path / "ttp_lightning"
    for folder, other in (("a", "b"), ("b", "a")):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
        (package / folder / "x.py").write_text(f"from ttp_lightning.{other} import y\nimport omegaconf\n")
        (package / folder / "y.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "stray.py").write_text("def f():\n" + "    pass\n" * 60)
    found = module.scan(package)
    assert found["folder_loops"] == [["ttp_lightning.a", "ttp_lightning.b"]]
    assert found["root_modules"] == ["ttp_lightning", "ttp_lightning.stray"]
    assert found["framework_importers"] == ["ttp_lightning.a.x", "ttp_lightning.b.x"]
    assert found["long_functions"] == ["ttp_lightning.stray.f (61 lines)"]


FRAMEWORK_IMPORTERS = {"ttp_lightning.__main__", "ttp_lightning.config.build", "ttp_lightning.config.choices",
                       "ttp_lightning.config.schema", "ttp_lightning.reporting.run_identity",
                       "ttp_lightning.run.validation"}


def test_hydra_and_omegaconf_stay_at_the_edges(picture):
    """Issue 40: the entry point, the schemas, the pre-flight checks, the composed config's checking, the run's
    identity and config/build.py (everything Hydra builds) import Hydra or OmegaConf; nothing else does."""
    assert set(picture["framework_importers"]) == FRAMEWORK_IMPORTERS
    assert len(picture["framework_importers"]) <= 6


def test_the_layout_page_shows_the_rooms_as_they_are():
    """docs/layout.md's "Who imports whom" is what scripts/architecture.py --rooms prints for src/ today."""
    spec = importlib.util.spec_from_file_location("architecture", REPO / "scripts" / "architecture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = (REPO / "docs" / "layout.md").read_text(encoding="utf-8")
    block = page.split("## Who imports whom", 1)[1].split("```\n", 2)[1]
    assert block.splitlines() == module.room_lines(module.scan(SRC))
