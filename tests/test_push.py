"""`python -m ttp_lightning.push` (issue 63): a release onto a model hub, tested against the repository's local
layout (`--to`), never a network: only the release's own files, after the checks, a not-protected release refused."""

import json
import shutil
import subprocess
import sys

import pytest
from huggingface_hub import ModelCard
from omegaconf import open_dict

from conftest import REPO
from ttp_lightning.core.errors import EXIT_NOT_PROTECTED
from ttp_lightning.release.push import main as push


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    from hydra import compose, initialize_config_dir

    from conftest import CONF_DIR, tiny_for
    from ttp_lightning.config.choices import normalize_overrides
    from ttp_lightning.run.pipeline import run

    work = tmp_path_factory.mktemp("push")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="main", overrides=normalize_overrides(
            [*tiny_for([]), "method.epochs=30", "attacks.enabled=false", "license=mit", f"paths.output_dir={work}",
             f"paths.cache_dir={work / 'cache'}"]), return_hydra_config=True)
    with open_dict(cfg):
        del cfg["hydra"]
    results = run(cfg, str(work)).to_json()
    assert results["release_gate"]["passed"], results["release_gate"]
    return work / "release"


def _copy(release, to):
    shutil.copytree(release, to)
    return to


def test_push_writes_the_hub_repository_of_the_release_files_only(release, tmp_path, capsys):
    folder = _copy(release, tmp_path / "release")
    (folder / "notes.py").write_text("import os\n")  # anything else in the folder stays behind
    assert push([str(folder), "someone/digits-protected", "--to", str(tmp_path / "hub")]) == 0
    repo = tmp_path / "hub" / "someone" / "digits-protected"
    assert sorted(p.name for p in repo.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    for name in ("README.md", "config.json", "model.safetensors"):
        assert (repo / name).read_bytes() == (folder / name).read_bytes()
    card = ModelCard.load(repo / "README.md")
    assert card.data.license == "mit" and "protected" in card.data.tags
    assert "someone/digits-protected" in capsys.readouterr().out


def test_push_refuses_a_not_protected_a_tampered_or_a_foreign_release(release, tmp_path, capsys):
    folder = _copy(release, tmp_path / "release")
    hub = str(tmp_path / "hub")
    assert push([str(folder), "bad//id", "--to", hub]) == 2
    assert push([str(folder), "../escape", "--to", hub]) == 2
    config = json.loads((folder / "config.json").read_text())
    config["protection"]["protected"] = False
    (folder / "config.json").write_text(json.dumps(config))
    assert push([str(folder), "someone/x", "--to", hub]) == EXIT_NOT_PROTECTED
    assert "NOT a protected release" in capsys.readouterr().err
    assert not (tmp_path / "hub").exists()
    assert push([str(folder), "someone/x", "--to", hub, "--allow-unprotected"]) == 0
    (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes()[:-4] + b"\0\0\0\0")
    assert push([str(folder), "someone/y", "--to", hub, "--allow-unprotected"]) == 2
    assert "SHA-256 differs" in capsys.readouterr().err
    config["protection"]["protected"] = float("nan")
    (folder / "config.json").write_text(json.dumps(config))
    assert push([str(folder), "someone/z", "--to", hub, "--allow-unprotected"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("error: ")


def test_push_through_a_process_is_one_line_and_an_exit_code(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ttp_lightning.push", str(tmp_path / "none"), "a/b", "--to",
                           str(tmp_path / "hub")], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[0].startswith("error: ")
    assert len(proc.stderr.strip().splitlines()) == 1
