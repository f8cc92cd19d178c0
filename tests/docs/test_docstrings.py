"""The public API's docstrings (docs/reference/api.md is made from them) document exactly
each callable's parameters: one ``Args:`` entry per parameter, none for a parameter that
is gone. A named tuple's fields are its ``Attributes:``, as mkdocstrings reads them."""
from __future__ import annotations

import importlib
import inspect
import re

import pytest
from helpers import REPO

import beam_prep
from beam_prep import errors

# Everything ``beam_prep`` exports, and every error a user catches (those that take arguments).
PUBLIC = [name for name in beam_prep.__all__ if name != "__version__"]
ERRORS = ["ImageError", "RunInterrupted"]
# A Google-style section title alone on its line ("Args:", "Returns:", ...).
_SECTION = re.compile(r"^(?P<indent> *)(?P<title>[A-Z][A-Za-z ]*):\s*$")
_ENTRY = re.compile(r"^(?P<name>\*{0,2}\w+)(?: \([^)]*\))?:(?:\s|$)")


def section_names(doc: str, title: str) -> list[str]:
    """The names a docstring's section documents: ``Args:`` gives each entry's name, stars dropped."""
    lines = inspect.cleandoc(doc).splitlines()
    names: list[str] = []
    inside, entry_indent = False, None
    for line in lines:
        match = _SECTION.match(line)
        if match:
            inside, entry_indent = match["title"] == title, None
            continue
        if not inside or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            inside = False
            continue
        if entry_indent is None:
            entry_indent = indent
        if indent == entry_indent:
            entry = _ENTRY.match(line.strip())
            assert entry, f"not an entry of {title}: {line.strip()!r}"
            names.append(entry["name"].lstrip("*"))
    return names


def documented(obj: object) -> tuple[list[str], list[str]]:
    """(the names its docstring documents as arguments, its parameters)."""
    if inspect.isclass(obj):
        if issubclass(obj, tuple) and hasattr(obj, "_fields"):  # a NamedTuple: its fields
            return section_names(obj.__doc__ or "", "Attributes"), list(obj._fields)
        doc = obj.__doc__ or ""
        init = obj.__dict__.get("__init__")
        if init is not None and init.__doc__:
            doc += "\n" + inspect.cleandoc(init.__doc__)
        params = list(inspect.signature(obj).parameters)
        return section_names(doc, "Args"), params
    return section_names(obj.__doc__ or "", "Args"), list(inspect.signature(obj).parameters)


@pytest.mark.parametrize("name", PUBLIC + ERRORS)
def test_args_name_every_parameter_and_no_other(name):
    obj = getattr(beam_prep, name) if name in PUBLIC else getattr(errors, name)
    names, params = documented(obj)
    assert len(names) == len(set(names)), f"{name}: an argument documented twice: {names}"
    missing = [p for p in params if p not in names]
    extra = [n for n in names if n not in params]
    assert not missing and not extra, f"{name}: undocumented {missing}, documented but not parameters {extra}"


@pytest.mark.parametrize("name", PUBLIC)
def test_functions_say_what_they_return(name):
    obj = getattr(beam_prep, name)
    if inspect.isfunction(obj):
        assert "\nReturns:\n" in "\n" + inspect.cleandoc(obj.__doc__ or "") + "\n", f"{name} has no Returns:"


def test_the_api_page_documents_each_public_name_from_its_home():
    """docs/reference/api.md points mkdocstrings at each name's home module (``beam_prep._HOMES``):
    ``beam_prep`` loads them lazily, so ``::: beam_prep.prepare`` would find nothing to read."""
    page = (REPO / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    entries = re.findall(r"^::: ([\w.]+)$", page, re.MULTILINE)
    for name, home in beam_prep._HOMES.items():
        module = importlib.import_module(home)
        real_home = getattr(module, name).__module__
        assert f"{real_home}.{name}" in entries, f"api.md has no ::: {real_home}.{name}"
    assert "beam_prep.errors" in entries


def test_the_parser_sees_a_missing_and_an_extra_argument():
    def f(a, b, *, c=1, **options):
        """Does.

        Args:
          a: one.
          b (int): two,
            on two lines.
          d: gone.

        Returns:
          x: not an argument.
        """

    names = section_names(f.__doc__, "Args")
    assert names == ["a", "b", "d"]
    params = list(inspect.signature(f).parameters)
    assert [p for p in params if p not in names] == ["c", "options"]
