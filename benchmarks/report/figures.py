"""Headline figures: each key's value from the committed results, and the markers in prose that show them.

A page writes a measured number as ``<!-- figure: writer.vs_seed -->2.35×<!-- /figure -->``;
:func:`rewrite` puts the results' value between the markers.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from benchmarks.report import tables

MARKER = re.compile(r"<!-- figure: (?P<key>[^ ]*) -->(?P<value>.*?)<!-- /figure -->")


class FigureError(ValueError):
    """A marker names an unknown key, or the results lack what a key needs."""


def _writer_runs(results: Mapping[str, Mapping]) -> tuple[Mapping, Mapping, Mapping]:
    writer = _results(results, "writer")
    largest = max(writer["runs"], key=lambda r: r["images"])
    return largest["ours"], largest["seed"], writer["peers"]


def _results(results: Mapping[str, Mapping], name: str) -> Mapping:
    if name not in results:
        raise FigureError(f"no {name} results (docs/performance/results/{name}.json)")
    return results[name]["results"]


def _peer_cpu_ratio(results: Mapping[str, Mapping], peer: str) -> str:
    ours, _, peers = _writer_runs(results)
    if peer not in peers or not tables.cpu_ms_per_image(peers[peer]):
        raise FigureError(f"the writer results have no successful {peer} row")
    return tables.times(tables.cpu_ms_per_image(peers[peer]) / tables.cpu_ms_per_image(ours))


def _writer_images_per_s(results: Mapping[str, Mapping]) -> str:
    return f"{tables.images_per_s(_writer_runs(results)[0]):,.0f}"


def _writer_cpu_ms(results: Mapping[str, Mapping]) -> str:
    return f"{tables.cpu_ms_per_image(_writer_runs(results)[0]):.2f}"


def _writer_vs_seed(results: Mapping[str, Mapping]) -> str:
    ours, seed, _ = _writer_runs(results)
    return tables.times(tables.images_per_s(ours) / tables.images_per_s(seed))


def _reader_images_per_s(results: Mapping[str, Mapping]) -> str:
    return f"{tables.reader_rate(_results(results, 'reader'), 'a')[0]:,.0f}"


def _launcher_seconds_2m(results: Mapping[str, Mapping]) -> str:
    medians = tables.launcher_medians(_results(results, "launcher"))
    found = [m for (run, files), m in medians.items() if run.startswith("(b)") and files == 2_000_000]
    if not found:
        raise FigureError("the launcher results have no (b) run on 2,000,000 files")
    return f"{found[0]['seconds']:.1f}"


def _resize_vs_pillow(results: Mapping[str, Mapping]) -> str:
    rows = [r for r in _results(results, "resize")["rows"] if r["candidate"] == "ours" and r["set"] == "corpus"]
    if not rows:
        raise FigureError("the resize results have no `ours` row on the corpus")
    return tables.times(rows[0]["vs_pillow"])


# Each key, what it means (shown on the overview page) and how its value is made.
FIGURES: dict[str, tuple[str, str, Callable[[Mapping[str, Mapping]], str]]] = {
    "writer.images_per_s": ("writer", "beam-prep's images/s, row (c)", _writer_images_per_s),
    "writer.cpu_ms_per_image": ("writer", "CPU ms per image of row (c), its whole process tree", _writer_cpu_ms),
    "writer.vs_seed": ("writer", "wall-clock speed of (c) over the seed notebook's writer (a)", _writer_vs_seed),
    "writer.vs_handwritten_cpu": ("writer", "images per CPU-second of (c) over the hand-written script (g)",
                                  lambda results: _peer_cpu_ratio(results, "handwritten")),
    "writer.vs_img2dataset_cpu": ("writer", "images per CPU-second of (c) over img2dataset (h)",
                                  lambda results: _peer_cpu_ratio(results, "img2dataset")),
    "writer.vs_mds_cpu": ("writer", "images per CPU-second of (c) over MosaicML Streaming's MDS writer (j)",
                          lambda results: _peer_cpu_ratio(results, "mds")),
    "writer.vs_litdata_cpu": ("writer", "images per CPU-second of (c) over LitData's `optimize` (k)",
                              lambda results: _peer_cpu_ratio(results, "litdata")),
    "writer.vs_ray_cpu": ("writer", "images per CPU-second of (c) over Ray Data to TFRecords (l)",
                          lambda results: _peer_cpu_ratio(results, "ray")),
    "reader.images_per_s": ("reader", "images/s of the reader with training defaults, row (a)",
                            _reader_images_per_s),
    "launcher.seconds_2m": ("launcher", "seconds `beam-prep prepare --dry_run` lists and plans 2,000,000 files in, "
                            "row (b)", _launcher_seconds_2m),
    "resize.vs_pillow": ("resize", "speed of decode + resize with our kernel over Pillow's loops, corpus set",
                         _resize_vs_pillow),
}


def values(results: Mapping[str, Mapping]) -> dict[str, str]:
    """Every key's value, or an explanation in its place where the results lack it.

    Args:
        results: the records by name (``writer``, ``reader``...), as ``render.load_results`` reads them.

    Returns:
        The value of each key of :data:`FIGURES`; a key whose results are missing maps to a
        :class:`FigureError`'s message prefixed with ``!``.
    """
    found = {}
    for key, (_, _, make) in FIGURES.items():
        try:
            found[key] = make(results)
        except FigureError as e:
            found[key] = f"!{e}"
    return found


def rewrite(text: str, figure_values: Mapping[str, str], where: str) -> str:
    """``text`` with every marker's value replaced by its key's.

    Args:
        text: a markdown page.
        figure_values: from :func:`values`.
        where: the page's name, for errors.

    Returns:
        The page with its markers' values rewritten.

    Raises:
        FigureError: a marker names an unknown key, or one whose results are missing.
    """
    def replace(match: re.Match) -> str:
        key = match["key"]
        line = text.count("\n", 0, match.start()) + 1
        if key not in figure_values:
            raise FigureError(f"{where}:{line}: unknown figure key {key!r} (known: {', '.join(FIGURES)})")
        value = figure_values[key]
        if value.startswith("!"):
            raise FigureError(f"{where}:{line}: figure {key}: {value[1:]}")
        return f"<!-- figure: {key} -->{value}<!-- /figure -->"

    return MARKER.sub(replace, text)
