"""The report's HTML: one self-contained page from ``gather``'s ``ReportData``.

Everything is in the file: pictures as ``data:`` URIs, the style inline, charts as inline SVG, no
script; a Content-Security-Policy forbids the page any other source, so it makes no request when
opened. Every string from the dataset (labels, file names, messages, options) is escaped and isolated
(``<bdi>``, ``<code>``, captions) so a right-to-left name shows as written and reorders nothing after it. A number taken from the manifest
carries its key (``data-manifest="splits.train.num_examples"``), for a reader or a test to check.
"""
from __future__ import annotations

import datetime
import html
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from beam_prep.tools.inspection import describe_image, format_bytes
from beam_prep.tools.report.gather import ReportData, per_class, sources
from beam_prep.tools.report.leaks import DuplicateFile
from beam_prep.tools.report.thumbs import Thumbnail
from beam_prep.write.shared.layout import REPORT_MARK

__all__ = ["IMBALANCE_CALLOUT", "render"]

# A split whose largest class holds this many times its smallest's records is called out.
IMBALANCE_CALLOUT = 3.0
CHART_CLASSES = 200  # classes drawn in the balance chart; the table lists every one
TABLE_CLASSES = 5000  # classes listed in the table (the chart's and the table's counts stay exact)

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:0 16px 48px;color:#222;background:#fff}
h1{font-size:22px;margin:18px 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:14px 0 4px}table{border-collapse:collapse;margin:6px 0}
td,th{border:1px solid #ddd;padding:2px 8px;text-align:left;vertical-align:top}td.n,th.n{text-align:right}
.note{background:#fff4d6;border:1px solid #e0b84c;padding:6px 10px;margin:8px 0}
.none{color:#666;font-style:italic}.muted{color:#666}.warn{color:#a03000;font-weight:600}
.row{display:flex;flex-wrap:wrap;gap:6px}figure{margin:0;width:136px}
figure img{display:block;width:auto;height:auto;min-width:64px;max-width:128px;max-height:128px;object-fit:contain;
image-rendering:pixelated;background:#eee}
figcaption{font-size:11px;overflow-wrap:anywhere}.pic{width:128px;height:64px;background:#eee;font-size:11px;
padding:4px;box-sizing:border-box}code{font-size:12px}
h1,h3,p,li,td,figcaption,code{overflow-wrap:anywhere}td.n{white-space:nowrap}
bdi,code,figcaption{unicode-bidi:isolate}
"""
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"


def render(data: ReportData) -> str:
    """The page, as text (UTF-8 when written)."""
    s = data.summary
    title = f"beam-prep report: {s.root}"
    body = [f"<h1>beam-prep report: {_label(s.root)}</h1>",
            f"<p class=muted>made {_e(_now())} by beam-prep {_e(_version())}; every count is exact, "
            "what is shown of files and pictures is capped (the sections say by how much)</p>"]
    body += [f'<p class=note data-note="{_e(section)}"><b>{_e(section)}</b>: {_e(why)}</p>'
             for section, why in data.notes]
    body += _overview(data) + _balance(data) + _gallery(data) + _duplicates(data) + _failures(data) \
        + _sources(data)
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>" + REPORT_MARK.decode("ascii")
            + f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name=viewport content="width=device-width,initial-scale=1">'
            f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


# --- sections -------------------------------------------------------------------------------


def _overview(data: ReportData) -> list[str]:
    s, m = data.summary, data.manifest
    info = s.info
    rows = [
        ("classes", _m(info.num_classes, "labels.length") if info.labels else "none (a dataset without labels)"),
        ("examples", _n(sum(x.num_examples for x in s.splits))),
        ("image", _e(describe_image(info.image) + f", resize_mode {info.image.resize_mode or 'unknown'}")),
        ("format", _e(f"{info.file_format} shards, compression {info.compression}")),
        ("made", _e(f"{s.created or 'unknown'} by beam-prep {s.beam_prep_version or 'unknown'}")
         + (f", {_e(m['imaging_library'])}" if m.get("imaging_library") else "")),
        ("from", _code(_shown_path((m.get("options") or {}).get("input")))),
    ]
    out = ["<h2 id=overview>Overview</h2>", _kv(rows)]
    out.append(_table(["split", "examples", "shards", "bytes"], [
        [_label(x.name), _m(x.num_examples, f"splits.{x.name}.num_examples"),
         _m(x.shards.count, f"splits.{x.name}.shards.length"), _e(format_bytes(x.shards.total_bytes))]
        for x in s.splits], right=(1, 2, 3), empty="no splits"))
    c = m.get("counts") or {}
    files = [f"{_m(c[k], f'counts.{k}')} {k}" for k in ("listed", "written", "failed", "skipped", "dropped")
             if k in c]
    out.append(f"<p>files: {', '.join(files) or '<span class=none>not recorded</span>'}</p>")
    if len(info.history) > 1:
        out.append(f"<h3>versions ({len(info.history)})</h3>")
        out.append(_table(["version", "created", "input", "records added"], [
            [_n(v.version), _e(v.created or "unknown"), _code(_shown_path(v.input)),
             _e(", ".join(f"{split} {n:,}" for split, (_, n, _) in v.added.items()) or "nothing")]
            for v in info.history], right=(0,)))
    options = m.get("options") or {}
    which = "the run that made version 1 (an append keeps them)" if len(info.history) > 1 else "the run"
    out.append(f"<details><summary>options of {which}</summary>" + _table(
        ["option", "value"], [[_code(k), _code(json.dumps(v, ensure_ascii=False))] for k, v in options.items()],
        empty="not recorded") + "</details>")
    return out


def _balance(data: ReportData) -> list[str]:
    s = data.summary
    out = ["<h2 id=balance>Class balance</h2>"]
    if not s.info.labels:
        return out + ['<p class=none>none: a dataset without labels</p>']
    if not s.classes:
        return out + ["<p class=none>the manifest has no per-class counts</p>"]
    for x in s.splits:
        i = x.imbalance
        if i is None:
            continue
        if i.largest[1] == 0:  # no class has a record: there is no balance to speak of
            out.append(f"<p class=none data-imbalance=\"{_e(x.name)}\">{_label(x.name)}: no records</p>")
            continue
        ratio = "inf (a class has no records)" if i.ratio is None else f"{i.ratio:.2f}"
        loud = i.ratio is None or i.ratio >= IMBALANCE_CALLOUT
        out.append(f"<p{' class=warn' if loud else ''} data-imbalance=\"{_e(x.name)}\">{_label(x.name)}: "
                   f"largest / smallest class {_e(ratio)} ({_label(i.largest[0])} {_n(i.largest[1])} / "
                   f"{_label(i.smallest[0])} {_n(i.smallest[1])})"
                   + (f": over {IMBALANCE_CALLOUT:g}, consider --stratify, --max_per_class or class weights"
                      if loud else "") + "</p>")
    if s.info.multi_label:
        out.append("<p class=muted>multi-label: a record counts under each of its labels, so a split's shares "
                   "add up to more than 100%</p>")
    splits = [x.name for x in s.splits]
    totals = {name: x.num_examples for name, x in zip(splits, s.splits)}
    out.append(_chart(s.classes[:CHART_CLASSES], splits))
    if len(s.classes) > CHART_CLASSES:
        out.append(f"<p class=muted>the chart shows the {CHART_CLASSES} largest of {len(s.classes):,} classes; "
                   "the table lists them all</p>")
    rows = []
    for c in s.classes[:TABLE_CLASSES]:
        cells = [_n(c.id), _label(c.name)]
        for split in splits:
            share = c.counts[split] / totals[split] if totals[split] else 0
            cells.append(_m(c.counts[split], f"splits.{split}.class_counts.{c.name}") + f" ({share:.1%})")
        rows.append([*cells, _n(c.total)])
    out.append(_table(["id", "class", *splits, "total"], rows, right=range(2, len(splits) + 3),
                      attrs="data-table=classes"))
    if len(s.classes) > TABLE_CLASSES:
        out.append(f"<p class=muted>{len(s.classes) - TABLE_CLASSES:,} smaller classes left out of the table</p>")
    return out


def _chart(classes: Sequence[Any], splits: Sequence[str]) -> str:
    """Horizontal bars, a group per class, a bar per split, scaled to the largest count."""
    palette = ["#3b6fb6", "#e08a2c", "#4a9d5b", "#b04a8a", "#7a6cc0", "#999"]
    bar, gap, left, width = 10, 6, 220, 640
    top = max((c.counts[x] for c in classes for x in splits), default=0) or 1
    height = len(classes) * (bar * len(splits) + gap) + 24
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 80}" height="{height}" '
             f'role=img aria-label="records per class and split">']
    for k, split in enumerate(splits):
        parts.append(f'<rect x="{left + k * 110}" y="2" width="10" height="10" fill="{palette[k % 6]}"/>'
                     f'<text x="{left + k * 110 + 14}" y="11" font-size="11">{_e(split)}</text>')
    y = 20
    for c in classes:
        name = c.name if len(c.name) <= 32 else c.name[:31] + "…"
        parts.append(f'<text x="{left - 6}" y="{y + bar * len(splits) / 2 + 4}" font-size="11" '
                     f'text-anchor="end">{_e(name)}</text>')
        for k, split in enumerate(splits):
            n = c.counts[split]
            w = width * n / top
            parts.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar - 1}" fill="{palette[k % 6]}">'
                         f'<title>{_e(c.name)} in {_e(split)}: {n:,}</title></rect>'
                         f'<text x="{left + w + 4:.1f}" y="{y + bar - 2}" font-size="9">{n:,}</text>')
            y += bar
        y += gap
    return "".join(parts) + "</svg>"


def _gallery(data: ReportData) -> list[str]:
    g = data.gallery
    info = data.summary.info
    out = ["<h2 id=gallery>Gallery</h2>"]
    if g.split is None:
        return out + ["<p class=none>none: the dataset has no split</p>"]
    out.append(f"<p>{_label(g.split)}: up to {per_class(info, data.limits)} a class, the first in shard order, "
               f"decoded from the shards as training decodes them ({_e(describe_image(info.image))}); "
               f"thumbnails at most {data.limits.cell} px a side, {_n(g.scanned)} records read</p>")
    for index, (row, images, wanted) in enumerate(zip(g.rows, g.images, g.wanted)):
        head = (f"{_label(row)} <span class=muted>({index + info.label_offset})</span>" if info.labels
                else _e(row))
        total, records = _class_count(data, g.split, row)
        out.append(f'<h3 data-gallery-row="{index}">{head} <span class=muted>{len(images)} shown of '
                   f'{total}</span></h3>')
        if not images:
            out.append("<p class=none>" + ("none: no records in this split" if records == 0
                                           else "none shown: past the limit of classes shown" if not wanted
                                           else "none shown (the notes above say why)") + "</p>")
            continue
        out.append('<div class=row>' + "".join(
            f'<figure data-gallery="{index}" data-filename="{_e(im.filename)}">'
            f'{_img(im.thumbnail, im.filename)}<figcaption>{_e(im.filename)}</figcaption></figure>'
            for im in images) + "</div>")
    return out


def _class_count(data: ReportData, split: str, row: str) -> tuple[str, int | None]:
    """A gallery row's record count in ``split``, as shown (marked with its manifest key) and as a number
    (None: unknown)."""
    s = data.summary.info.splits[split]
    if not data.summary.info.labels:
        return _m(s.num_examples, f"splits.{split}.num_examples"), s.num_examples
    if s.class_counts is None:
        return "unknown", None
    n = int(s.class_counts.get(row, 0))
    return _m(n, f"splits.{split}.class_counts.{row}"), n


def _duplicates(data: ReportData) -> list[str]:
    leaks, d = data.leaks, data.summary.duplicates
    out = ["<h2 id=duplicates>Duplicates and leaks across splits</h2>"]
    if d is not None:
        near = d.get("near")
        line = (f"exact copies: {_m(d.get('extra_copies', 0), 'duplicates.extra_copies')} files beyond the first of "
                f"{_m(d.get('images', 0), 'duplicates.images')} contents, "
                f"{_m(d.get('across_splits', 0), 'duplicates.across_splits')} across splits")
        if near:
            line += (f"; near copies (within {_e(near['distance'])} bits): "
                     f"{_m(near['groups'], 'duplicates.near.groups')} groups, "
                     f"{_m(near['across_splits'], 'duplicates.near.across_splits')} across splits")
        out.append(f"<p>{line}</p>")
    if not leaks.exists:
        return out + ["<p class=none>no duplicates.jsonl in the folder (a dataset from before it)</p>"]
    if not leaks.group_count:
        return out + ["<p class=none data-leaks=none>none: no two records share their bytes or a near hash</p>"]
    out.append(f"<h3>leak pairs across splits: <span data-pairs>{leaks.pair_count:,}</span> (pairs of files of one "
               f"group in two splits), from {leaks.groups_across:,} of the groups</h3>")
    if not leaks.pairs:
        out.append("<p class=none data-leaks=none>none: every group lies in one split</p>")
    else:
        if leaks.pair_count > len(leaks.pairs):
            out.append(f"<p class=muted>the {len(leaks.pairs):,} closest shown</p>")
        out.append(_table(["distance", "one", "the other"], [
            [_n(p.distance), _file(data, p.a), _file(data, p.b)] for p in leaks.pairs],
            right=(0,), attrs="data-table=pairs"))
    out.append(f"<h3>groups: {leaks.exact_groups:,} of exact copies, {leaks.near_groups:,} of near copies</h3>")
    if leaks.group_count > len(leaks.groups):
        out.append(f"<p class=muted>{len(leaks.groups):,} shown, those across splits first</p>")
    out.append(_table(["group", "largest distance", "splits", "files"], [
        [_e(f"{g.kind} {g.key[:12] if g.kind == 'exact' else g.key}"), _n(g.distance),
         _e(", ".join(g.splits)), '<div class=row>' + "".join(_file(data, f) for f in g.files[:6]) + "</div>"
         + (f"<span class=muted>and {len(g.files) - 6:,} more</span>" if len(g.files) > 6 else "")]
        for g in leaks.groups], right=(1,), attrs="data-table=groups"))
    return out


def _failures(data: ReportData) -> list[str]:
    s = data.summary
    out = ["<h2 id=failures>Failures and skipped files</h2>"]
    if data.failures is None:
        out.append("<p class=none>no errors.jsonl: failures by stage only</p>")
        out += [f"<p>{_e(stage)}: {_m(n, f'failed_by_stage.{stage}')}</p>" for stage, n in s.failed_by_stage.items()]
    elif not data.failures:
        out.append("<p class=none data-failures=none>failures: none</p>")
    for f in data.failures or ():
        out.append(f'<h3 data-failure="{_e(f.stage)}/{_e(f.reason)}">{_e(f.stage)}, {_e(f.reason)}: '
                   f"{_n(f.count)}</h3>")
        pictures = data.limits.max_failure_pictures
        out.append("<ul>" + "".join(
            f"<li>{_pic(data.pictures.get(path), path) if k < pictures else ''}<code>{_e(path)}</code>: "
            f"{_label(message)}</li>" for k, (path, message, _) in enumerate(f.files)) + "</ul>")
        if f.count > len(f.files):
            out.append(f"<p class=muted>and {f.count - len(f.files):,} more in errors.jsonl</p>")
    dropped = (s.duplicates or {}).get("dropped_by_reason", {})
    reasons = [*(("skipped", r, n, f"skipped_by_reason.{r}") for r, n in s.skipped_by_reason.items()),
               *(("dropped", r, n, f"duplicates.dropped_by_reason.{r}") for r, n in dropped.items())]
    if not reasons:
        out.append("<p class=none data-skipped=none>skipped files: none</p>")
    for kind, reason, n, key in reasons:
        names = (data.skipped or {}).get(reason, ())
        out.append(f"<h3>{kind}, {_e(reason)}: {_m(n, key)}</h3>")
        if names:
            out.append("<p>" + ", ".join(f"<code>{_e(name)}</code>" for name in names)
                       + (f" <span class=muted>and {n - len(names):,} more in skipped.jsonl</span>"
                          if n > len(names) else "") + "</p>")
    return out


def _sources(data: ReportData) -> list[str]:
    out = ["<h2 id=sources>Source images</h2>"]
    src = sources(data.manifest)
    if src is None and not (data.manifest.get("counts") or {}).get("written", 1):
        return out + ["<p class=none data-sources=none>none: no image was made into a record</p>"]
    if src is None:
        return out + ["<p class=none>not recorded: the run that made this dataset did not record its sources' "
                      "sizes (a beam-prep before it did)</p>"]
    done = [f"{_m(src[k], f'sources.{k}')} {k}" for k in ("upscaled", "cropped", "padded", "converted") if k in src]
    out.append(f"<p>{_m(src.get('images', 0), 'sources.images')} images measured as they were made into records"
               + (f": {', '.join(done)}" if done else "") + "</p>")
    for key, what in (("width", "width (px)"), ("height", "height (px)"), ("aspect", "aspect ratio (width / height)")):
        h = src.get(key)
        if isinstance(h, Mapping) and h:
            out.append(f"<h3>{_e(what)}</h3>" + _histogram(h, f"sources.{key}"))
    return out


def _histogram(bins: Mapping[str, int], key: str) -> str:
    """Vertical bars, one a bin (its lower bound, up to the next; the last open), each with its count."""
    bar, height = 64, 120
    edges = list(bins)
    top = max(bins.values()) or 1
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{len(edges) * bar + 20}" height="{height + 40}" '
             f'role=img aria-label="{_e(key)}">']
    for i, edge in enumerate(edges):
        n = bins[edge]
        h = height * n / top
        x = 10 + i * bar
        span = f"{edge} to {edges[i + 1]}" if i + 1 < len(edges) else f"{edge} and over"
        parts.append(f'<rect x="{x}" y="{height - h + 14:.1f}" width="{bar - 6}" height="{h:.1f}" fill="#3b6fb6">'
                     f"<title>{_e(span)}: {n:,}</title></rect>"
                     f'<text x="{x}" y="{height + 28}" font-size="10">{_e(edge if i + 1 < len(edges) else edge + "+")}'
                     f'</text><text x="{x}" y="{height - h + 11:.1f}" font-size="10" data-manifest="{_e(key)}.{_e(edge)}">'
                     f"{n:,}</text>")
    return "".join(parts) + "</svg>"


# --- pieces --------------------------------------------------------------------------------


def _file(data: ReportData, f: DuplicateFile) -> str:
    return (f'<figure data-file="{_e(f.path)}" data-split="{_e(f.split)}">{_pic(data.pictures.get(f.path), f.path)}'
            f"<figcaption>{_label(f.split)}: <code>{_e(f.path)}</code></figcaption></figure>")


def _pic(picture: Thumbnail | str | None, alt: str = "") -> str:
    if isinstance(picture, Thumbnail):
        return _img(picture, alt)
    return f"<div class=pic>{_e(picture or 'not shown')}</div>"


def _img(thumb: Thumbnail, alt: str) -> str:
    return (f'<img src="{thumb.data_uri()}" width="{thumb.width}" height="{thumb.height}" alt="{_e(alt)}" '
            f'title="{_e(alt)}">')


def _kv(rows: Iterable[tuple[str, str]]) -> str:
    return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Iterable[int] = (), empty: str = "none",
           attrs: str = "") -> str:
    """A table of already escaped cells; ``empty`` said where there are no rows."""
    if not rows:
        return f"<p class=none>{_e(empty)}</p>"
    right = set(right)
    head = "".join(f"<th{' class=n' if i in right else ''}>{_e(h)}</th>" for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td{' class=n' if i in right else ''}>{cell}</td>" for i, cell in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table {attrs}><tr>{head}</tr>{body}</table>"


def _m(value: Any, key: str) -> str:
    """A number from the manifest, marked with its key."""
    return f'<span data-manifest="{_e(key)}">{_e(f"{value:,}" if isinstance(value, int) else value)}</span>'


def _n(value: int) -> str:
    return _e(f"{value:,}")


def _label(name: str) -> str:
    return f"<bdi>{_e(name)}</bdi>"


def _code(text: Any) -> str:
    return f"<code>{_e(text)}</code>"


def _shown_path(path: Any) -> str:
    """An input folder as the page names it: relative to the current directory where it lies below it
    (as the output folder is named as given), so a page made beside its data names no machine path."""
    if not isinstance(path, str) or not path:
        return "unknown"
    if os.path.isabs(path):
        try:
            relative = os.path.relpath(path)
        except (OSError, ValueError):  # no current directory (removed), or another drive's
            return path
        if relative != os.curdir and relative.split(os.sep)[0] != os.pardir:
            return relative
    return path


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _version() -> str:
    import beam_prep

    return beam_prep.__version__

