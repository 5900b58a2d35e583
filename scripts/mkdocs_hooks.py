"""mkdocs hook (mkdocs.yml `hooks:`): the site's home page is the README with its links into docs/ made site-relative,
and every page ends with a link to the glossary.

One text for both, so the landing page a newcomer sees on the site and the README on a code host cannot drift.
"""

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


GLOSSARY = "glossary.md"


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Replace index.md's placeholder with the README (`](docs/x.md)` becomes `](x.md)`); end every page but the
    glossary with a link to it."""
    if page.file.src_uri == "index.md":
        markdown = README.read_text(encoding="utf-8").replace("](docs/", "](")
    if page.file.src_uri == GLOSSARY:
        return markdown
    up = "../" * page.file.src_uri.count("/")
    return markdown.rstrip() + f"\n\n---\n\nThe words on this page: [Glossary]({up}{GLOSSARY}).\n"
