"""requirements.lock (issue 81): every package `make install` installs, at one version pyproject.toml admits."""

import importlib.util

import pytest
import tomllib
from packaging.requirements import Requirement

from conftest import REPO

spec = importlib.util.spec_from_file_location("lock", REPO / "scripts" / "lock.py")
lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock)

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
INSTALLED_EXTRAS = ("dev", "plots", "slurm", "docs", "crosscheck")  # the Makefile's, torchattacks included


def requirements():
    listed = list(PROJECT["dependencies"])
    for extra in INSTALLED_EXTRAS:
        listed += PROJECT["optional-dependencies"][extra]
    return [Requirement(text) for text in listed]


def test_every_requirement_is_locked_at_a_version_its_range_admits():
    pins = lock.read_lock()
    for requirement in requirements():
        name = lock.normalise(requirement.name)
        assert name in pins, f"{requirement} is not in requirements.lock (make lock)"
        assert requirement.specifier.contains(pins[name], prereleases=True), (requirement, pins[name])


def test_the_lock_pins_torch_as_the_makefile_installs_it():
    pins = lock.read_lock()
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    for pinned in lock.TORCH:
        name, version = pinned.split("==")
        assert pins[name] == version and pinned in makefile
    assert "--constraint $(LOCK)" in makefile and "lock.py check" in makefile


def test_the_lock_is_sorted_name_equals_version_and_free_of_the_project():
    lines = [line for line in (REPO / "requirements.lock").read_text().splitlines() if not line.startswith("#")]
    names = [line.split("==")[0] for line in lines]
    assert names == sorted(names) and all(line.count("==") == 1 for line in lines)
    assert "ttp-lightning" not in lock.read_lock()


def test_a_venv_that_differs_from_the_lock_is_named_line_by_line():
    locked = {"torch": "2.14.1", "numpy": "2.0.0", "rich": "14.0.0"}
    installed = {"torch": "2.14.1", "numpy": "2.1.0", "extra": "1.0"}
    assert lock.differences(installed, locked) == [
        "numpy: installed 2.1.0, locked 2.0.0", "extra: installed 1.0, not in the lock",
        "rich: locked 14.0.0, not installed"]
    assert lock.differences(locked, dict(locked)) == []


def test_lock_text_parses_names_as_pip_does_and_refuses_a_range():
    pins = lock.pins_of("# header\nFoo_Bar==1.0\n-e /work/main\nzope.interface==7.0  # why\n", "text")
    assert pins == {"foo-bar": "1.0", "zope-interface": "7.0"}
    with pytest.raises(ValueError, match="'numpy>=2' is not name==version"):
        lock.pins_of("numpy>=2\n", "text")
