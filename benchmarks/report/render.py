"""The performance pages from their templates and the committed results, and every page's figure markers.

A template (``benchmarks/pages/<page>.md``) is the page's hand-written text;
a line ``<!-- results: NAME -->`` in it becomes the tables of
``docs/performance/results/NAME.json`` followed by the command, machine and
versions they were measured with, and a line ``<!-- figures -->`` the table of
every headline figure. Then the figure markers of every page (README.md,
docs/**/*.md, the rendered pages) get their values.
"""
from __future__ import annotations

import datetime
import json
import pathlib
import re
from collections.abc import Mapping

from benchmarks.report import figures, tables

TEMPLATES = pathlib.Path("benchmarks") / "pages"
PAGES = pathlib.Path("docs") / "performance"
RESULTS = PAGES / "results"
RESULTS_LINE = re.compile(r"^<!-- results: (?P<name>[\w-]+) -->$", re.MULTILINE)
FIGURES_LINE = "<!-- figures -->"
HEADER = ("<!-- Made by `python -m benchmarks.report` from benchmarks/pages/{name} and "
          "docs/performance/results/: edit those, not this page. -->\n")


class ReportError(ValueError):
    """A template names results that have no table, or a results file is not a benchmark's record."""


def load_results(folder: pathlib.Path) -> dict[str, dict]:
    """Every ``*.json`` record in ``folder``, by its file name without ``.json``.

    Args:
        folder: the results folder.

    Returns:
        The records (``benchmarks/results.py``'s shape) by name.

    Raises:
        ReportError: a file is not such a record.
    """
    found = {}
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or not {"command", "machine", "versions", "results"} <= record.keys():
            raise ReportError(f"{path.name} is not a benchmark record (benchmarks/results.py writes them)")
        found[path.stem] = record
    return found


def measured_with(record: Mapping) -> str:
    """The command, date, machine, load and versions of one record, as markdown."""
    m = record["machine"]
    date = datetime.datetime.fromisoformat(record["date"]).astimezone(datetime.UTC)
    versions = ", ".join(f"{name} {version}" for name, version in record["versions"].items() if version)

    def load(values: list[float] | None) -> str:
        return "unknown" if not values else ", ".join(f"{v:.2f}" for v in values)

    return "\n".join([
        f"Measured with `{record['command']}` on {date:%Y-%m-%d %H:%M} UTC:",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM ({m['platform']});",
        f"- load average (1, 5, 15 min): {load(m.get('load_average_before'))} before, "
        f"{load(m.get('load_average_after'))} after;",
        f"- versions: {versions}.",
    ])


def results_section(name: str, results: Mapping[str, Mapping]) -> str:
    """The tables of the record ``name`` and what it was measured with; a note where it is missing."""
    if name not in tables.TABLES:
        raise ReportError(f"no tables for results named {name!r} (known: {', '.join(tables.TABLES)})")
    if name not in results:
        return (f"*Not measured in the committed results: run the command above with "
                f"`--json docs/performance/results/{name}.json`, then `python -m benchmarks.report`.*")
    record = results[name]
    return f"{tables.TABLES[name](record['results'])}\n\n{measured_with(record)}"


def figures_table(figure_values: Mapping[str, str]) -> str:
    """Every headline figure key, its value and what it means, linked to its page."""
    lines = ["| key | value | what it is |", "|---|---:|---|"]
    for key, (page, meaning, _) in figures.FIGURES.items():
        value = figure_values[key]
        shown = "not measured" if value.startswith("!") else value
        lines.append(f"| `{key}` | {shown} | {meaning} ([{page}]({page}.md)) |")
    return "\n".join(lines)


def render_page(template: str, name: str, results: Mapping[str, Mapping], figure_values: Mapping[str, str]) -> str:
    """One performance page from its template.

    Args:
        template: the template's text.
        name: the page's file name (``writer.md``).
        results: the records by name.
        figure_values: from :func:`figures.values`.

    Returns:
        The page's markdown, its figure markers not yet rewritten.
    """
    text = RESULTS_LINE.sub(lambda m: results_section(m["name"], results), template)
    text = text.replace(FIGURES_LINE, figures_table(figure_values))
    return HEADER.format(name=name) + text


def expected_files(root: pathlib.Path, results_dir: pathlib.Path | None = None) -> dict[pathlib.Path, str]:
    """What each page must read: the rendered performance pages, and README.md and docs/**/*.md with
    their figure markers rewritten.

    Args:
        root: the repository.
        results_dir: the results to render from (``docs/performance/results`` by default).

    Returns:
        Each page's path and text.

    Raises:
        ReportError: see :func:`load_results` and :func:`results_section`.
        figures.FigureError: a marker names an unknown key or one without results.
    """
    results = load_results(results_dir or root / RESULTS)
    figure_values = figures.values(results)
    expected: dict[pathlib.Path, str] = {}
    for template in sorted((root / TEMPLATES).glob("*.md")):
        out = root / PAGES / template.name
        expected[out] = render_page(template.read_text(), template.name, results, figure_values)
    others = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    for path in others:
        if path not in expected and path.exists():
            expected[path] = path.read_text()
    return {path: figures.rewrite(text, figure_values, str(path.relative_to(root)))
            for path, text in expected.items()}


def differing(root: pathlib.Path, expected: Mapping[pathlib.Path, str]) -> list[pathlib.Path]:
    """The pages whose committed text is not ``expected``'s."""
    return [path for path, text in expected.items() if not path.exists() or path.read_text() != text]
