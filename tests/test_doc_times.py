"""scripts/doc_times.py: the README's commands are found as written and their documented times rewritten in
place (the timing itself runs on a fresh clone, by hand: it takes the install and the test suite)."""

import importlib.util

from conftest import REPO


def _script():
    spec = importlib.util.spec_from_file_location("doc_times", REPO / "scripts" / "doc_times.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_timed_readme_command_is_found_with_its_comment():
    doc_times = _script()
    found = doc_times.commands((REPO / "README.md").read_text())
    texts = [command.text for command in found]
    assert texts[:2] == ["make run", "make test"]
    protect = next(c for c in found if "+workflow=protect" in c.text)
    assert "\\" not in protect.text and protect.text.endswith("hydra.run.dir=example/protected")
    assert doc_times.TIME.search(protect.comment)  # every command that takes a while says how long
    assert any(c.text.startswith(".venv/bin/python -m ttp_lightning.verify robust") for c in found)
    reproduce = [c for c in found if c.long]
    assert reproduce and all(not c.text.startswith("make") for c in reproduce)


def test_times_are_rewritten_in_the_comment_and_nowhere_else():
    doc_times = _script()
    markdown = ("On a fresh machine (the first call builds `.venv` with torch 2.14.1, about 3 minutes):\n\n```\n"
                "make run     # the default job (~3 minutes with the install, 40 s after)\n"
                "make test    # the suite (~10 minutes on 2 cores: 725 tests)\n"
                ".venv/bin/python -m ttp_lightning +workflow=protect \\\n"
                "    data.root=x   # about 2.5 minutes on 2 cores\n```\n"
                "make run takes 40 s after the install.\n")
    measured = {"make run": ["about 2.4 minutes", "29 s"], "make test": ["about 9.1 minutes"],
                ".venv/bin/python -m ttp_lightning +workflow=protect data.root=x": ["98 s"]}
    out = doc_times.rewrite(markdown, measured, "about 1.9 minutes", {"make test": "731 tests"})
    assert "torch 2.14.1, about 1.9 minutes)" in out
    assert "(about 2.4 minutes with the install, 29 s after)" in out
    assert "(about 9.1 minutes on 2 cores: 731 tests)" in out
    assert doc_times.tests_passed("...\n731 passed, 5 warnings in 540.1s\n") == "731 tests"
    assert "    data.root=x   # 98 s on 2 cores\n" in out
    assert out.endswith("make run takes 40 s after the install.\n")  # prose outside the fences is left alone
    assert doc_times.spoken(29.4) == "29 s" and doc_times.spoken(150) == "about 2.5 minutes"
    assert doc_times.spoken(1500) == "about 25 minutes"
