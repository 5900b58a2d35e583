"""The README a newcomer reads first and the documentation site it points into (`make docs`)."""

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def nav_files(nav) -> list[str]:
    """Every page named in mkdocs.yml's nav, depth first."""
    found = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            found += nav_files(value) if isinstance(value, list) else [value]
    return found


def mkdocs_config() -> dict:
    # mkdocs.yml uses no python tags, so the safe loader reads it
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))


def text_of(page: Path) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8"))))


def test_the_readme_is_short_and_names_what_a_newcomer_needs():
    assert len(README.splitlines()) <= 200
    for needed in ("https://arxiv.org/abs/2509.11625", "make run", "make test", "forget set", "CD",
                   "theta", "release gate", "+workflow=protect", "ttp_lightning.verify robust", "make docs"):
        assert needed in README, needed


def test_every_readme_link_into_docs_is_a_page_of_the_site():
    links = re.findall(r"\]\((docs/[^)#]+)", README)
    assert len(links) >= 8
    pages = set(nav_files(mkdocs_config()["nav"]))
    for link in links:
        assert (ROOT / link).is_file(), link
        assert link.removeprefix("docs/") in pages, link


def test_every_docs_page_is_in_the_nav():
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert pages == set(nav_files(mkdocs_config()["nav"]))


def test_code_and_config_cite_docs_pages_not_readme_sections():
    cited = re.compile(r"\(README, |README.s \"")
    offenders = [str(p.relative_to(ROOT)) for folder in ("src", "scripts", "tests")
                 for p in (ROOT / folder).rglob("*") if p.suffix in {".py", ".yaml"}
                 and p != Path(__file__) and cited.search(p.read_text(encoding="utf-8"))]
    assert offenders == []
    for page in re.findall(r"docs/[a-z-]+\.md", "\n".join(
            p.read_text(encoding="utf-8") for p in (ROOT / "src").rglob("*") if p.suffix in {".py", ".yaml"})):
        assert (ROOT / page).is_file(), page


@pytest.mark.skipif(not (Path(sys.executable).parent / "mkdocs").exists(), reason="the docs extra is not installed")
def test_the_site_builds_strictly_with_the_readme_as_home_and_api_pages_from_docstrings(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run(["make", "--no-print-directory", "-o", ".venv/.installed", "docs", f"DOCS_OUT={site}"],
                          cwd=ROOT, capture_output=True, text=True, check=False, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING -" not in proc.stdout + proc.stderr, proc.stderr  # a broken link or anchor fails --strict
    home = text_of(site / "index.html")
    assert "Words used everywhere" in home and "Three roles" in home
    assert 'href="protect/"' in (site / "index.html").read_text(encoding="utf-8")  # docs/ links made relative
    api = text_of(site / "api" / "release" / "index.html")
    assert "load_released ( folder , device = 'cpu' )" in api and "It is no signature" in api
    extension = text_of(site / "api" / "extension" / "index.html")
    for name in ("methods.base.Method", "methods.output.MethodOutput", "attacks.base.Attack", "data.sources.Source",
                 "data.arrays.ImageArrays"):
        assert f"ttp_lightning.{name}" in extension.replace(" . ", "."), name
    assert "Sweeps on a SLURM cluster" in text_of(site / "cluster-and-gpu" / "index.html")
    pages = [page for page in site.rglob("index.html") if page.parent.name not in ("glossary", "404", "search")]
    assert len(pages) >= 18  # issue 60: every page ends with a link to the glossary, one meaning per word
    unlinked = [str(page.relative_to(site)) for page in pages if 'glossary/">Glossary</a>' not in page.read_text()]
    assert not unlinked, unlinked
    glossary = text_of(site / "glossary" / "index.html")
    assert "proven CD" in glossary and "certificate" in glossary


def test_results_json_reference_is_generated_from_the_run_record():
    """Issue 40: docs/results-json.md's top-level table is the run record's (scripts/results_table.py), so the
    docs cannot drift from the dataclass."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("results_table", ROOT / "scripts" / "results_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (ROOT / "docs" / "results-json.md").read_text()
    assert module.BEGIN in text and module.with_table(text) == text, "run python scripts/results_table.py --write"
    assert "| `release_gate` | dict | always |" in text


def heading_anchors(page: Path) -> set[str]:
    """The anchors mkdocs' toc extension gives a page's headings (its default slugify)."""
    import unicodedata
    anchors = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            text = unicodedata.normalize("NFKD", line.lstrip("#").strip()).encode("ascii", "ignore").decode()
            anchors.add(re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower()))
    return anchors


def test_every_docs_anchor_a_config_or_source_comment_names_exists():
    """Issue 81: conf/ says what a key is and names the docs anchor where its measured reason lives."""
    cited = re.findall(r"docs/([a-z-]+\.md)#([\w-]+)", "\n".join(
        p.read_text(encoding="utf-8") for p in (ROOT / "src").rglob("*") if p.suffix in {".py", ".yaml"}))
    assert len(cited) >= 5, cited
    missing = [f"{page}#{anchor}" for page, anchor in cited if anchor not in heading_anchors(ROOT / "docs" / page)]
    assert missing == [], missing


def test_heading_anchors_are_mkdocs_slugs():
    page = ROOT / "docs" / "protect.md"
    assert "why-the-workflows-settings" in heading_anchors(page)
    assert "key-by-key" in heading_anchors(ROOT / "docs" / "robust-defaults.md")
    assert "no-such-heading" not in heading_anchors(page)


def test_no_config_comment_block_retells_a_lab_notebook():
    """Issue 81: a key's comment is one line; a file's header states the setting and its departures briefly."""
    for path in (ROOT / "src" / "ttp_lightning" / "conf").rglob("*.yaml"):
        run = 0
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            run = run + 1 if line.lstrip().startswith("#") else 0
            assert run <= 20, f"{path.relative_to(ROOT)}:{number}: a comment block over 20 lines"
