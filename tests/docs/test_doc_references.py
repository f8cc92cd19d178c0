"""Every page a message or a docstring of beam_prep/ and pipelines/ names is a page of the site:
it exists under docs/ and mkdocs.yml's nav lists it. Messages name pages through
``beam_prep.doc_pages.doc_page``; none names the README, whose sections come and go."""
from __future__ import annotations

import re

import yaml
from helpers import REPO

from beam_prep.doc_pages import doc_page

SOURCES = sorted(p for folder in ("beam_prep", "pipelines") for p in (REPO / folder).rglob("*.py"))
_PAGE = re.compile(r"\bdocs/[\w./-]+?\.md\b")
_CALL = re.compile(r"\bdoc_page\(\s*f?[\"']([^\"']+)[\"']")


def site_pages() -> set[str]:
    """The nav's pages, as paths from the repository root (``docs/guides/troubleshooting.md``)."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, str):
            found.add(f"{config.get('docs_dir', 'docs')}/{node}")
        elif isinstance(node, list):
            for item in node:
                walk(item)
        elif isinstance(node, dict):
            for item in node.values():
                walk(item)

    walk(config["nav"])
    return found


def references(text: str) -> set[str]:
    """The pages a text names: ``docs/...md`` written out, and ``doc_page("...")`` calls."""
    return set(_PAGE.findall(text)) | {doc_page(page) for page in _CALL.findall(text)}


def test_the_scanner_finds_both_forms():
    text = 'x = f"see {doc_page(\'guides/a.md\')}"  # and docs/design/b.md.'
    assert references(text) == {"docs/guides/a.md", "docs/design/b.md"}


def test_every_page_the_code_names_is_on_the_site():
    pages = site_pages()
    assert all((REPO / page).is_file() for page in pages), "mkdocs.yml's nav lists a page that is missing"
    wrong = {f"{source.relative_to(REPO)}: {page}" for source in SOURCES
             for page in references(source.read_text(encoding="utf-8")) if page not in pages}
    assert not wrong, f"pages named that the site does not have: {sorted(wrong)}"


def test_messages_that_point_at_documentation_name_a_site_page():
    """What a user reads (every command's --help, beam-prep's usage) points somewhere that exists,
    and at least one of them points (the --compression help, the usage's getting-started line)."""
    from pipelines import cli, reference_docs

    texts = [cli.usage(), reference_docs.cli_page()]
    named = set().union(*(set(_PAGE.findall(text)) for text in texts))
    assert {"docs/guides/training-code.md", "docs/guides/getting-started.md"} <= named
    assert named <= site_pages(), sorted(named - site_pages())


# The one module that names a README.md: the dataset card a run writes into its output folder, no page.
CARD_MODULE = REPO / "beam_prep" / "model" / "dataset_card.py"


def test_no_code_sends_a_reader_to_the_readme():
    lines = [f"{source.relative_to(REPO)}:{i}: {line.strip()}" for source in SOURCES if source != CARD_MODULE
             for i, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1) if "README" in line]
    assert not lines, f"name a page of the site instead (beam_prep.doc_pages.doc_page): {lines}"
