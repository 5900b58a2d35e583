"""mkdocs hook (mkdocs.yml `hooks:`): the site's home page is the README with its links into docs/ made site-relative.

One text for both, so the landing page a newcomer sees on the site and the README on a code host cannot drift.
"""

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Replace index.md's placeholder with the README; `](docs/x.md)` becomes `](x.md)`."""
    if page.file.src_uri != "index.md":
        return markdown
    return README.read_text(encoding="utf-8").replace("](docs/", "](")
