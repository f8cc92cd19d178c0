"""How a message points at the documentation: one form, one place to change it.

Messages (errors, warnings, ``--help``) that send a reader to read more name a page of
the documentation site (mkdocs.yml's ``nav``, built from ``docs/``) by its path in
the repository, ``docs/guides/troubleshooting.md``: it is there in a checkout and on
the project's page, and the site publishes it at the same path. Pass the path under
``docs/``; tests/docs/test_doc_references.py checks that every page a message or a
docstring names exists and is on the site.
"""
from __future__ import annotations

__all__ = ["DOCS", "doc_page"]

DOCS = "docs"


def doc_page(page: str, section: str | None = None) -> str:
    """``docs/<page>``, with `` (<section>)`` after it when given: how a message names a page.

    Args:
      page: the page's path under ``docs/``, e.g. ``guides/troubleshooting.md``.
      section: the heading to look under, as the page writes it.

    Returns:
      The reference as a message shows it.
    """
    return f"{DOCS}/{page}" + (f" ({section})" if section else "")
