"""The files a newcomer and a citation manager read: licence, citation, changelog."""

from pathlib import Path

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]


def version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_the_licence_is_mit():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License") and "WITHOUT WARRANTY OF ANY KIND" in text


def test_the_citation_file_names_this_version_and_cites_the_paper():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software" and cff["authors"]
    assert str(cff["version"]) == version() and cff["license"] == "MIT"
    paper = cff["preferred-citation"]
    assert paper["title"].startswith("Inducing Uncertainty on Open-Weight Models")
    assert [a["family-names"] for a in paper["authors"]] == ["Ashiq", "Triantafillou", "Tseng", "Chrysos"]
    assert paper["url"] == "https://arxiv.org/abs/2509.11625"


def test_the_changelog_has_a_section_for_this_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text and f"## [{version()}] - " in text
