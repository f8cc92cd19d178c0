"""A contact sheet of the worst duplicate groups: a row per group, its files side by side with their
splits and labels, for a person to judge whether the validation image is a copy of a training one,
and which label an image filed under two is.

The groups come from duplicates.jsonl (exact and near groups lying in two splits
or more, or whose files are under different labels), those under different labels first
(a contradiction, wherever it lies), then the closest: a group whose files differ in fewest
bits of the perceptual hash (exact copies: 0) is the surest leak. The images are the source
files the hashes were made from (a file that cannot be read shows as a note), as
a user would open them to decide what to remove.

Those paths are data, read from the dataset's duplicates.jsonl: the sheet opens
only files under the run's input folder (the manifest's ``options.input``), and
refuses a file naming any other path (absolute elsewhere, or escaping with ``..``)
before it opens any image (``names.path_under``). That folder is the manifest's word too, so an image
is drawn only when its file is a regular file whose bytes have the sha256 its line records (the run's
hash of it): a manifest naming ``/`` as its input shows no file the run did not hash, and a file changed
since the run is said to be, not drawn.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import stat
from collections.abc import Iterable
from typing import Any

from PIL import Image, ImageDraw

from beam_prep.errors import DatasetError
from beam_prep.io.storage import is_local, join, read_lines, storage_error
from beam_prep.model.names import path_under
from beam_prep.pixel_limit import our_limit_only
from beam_prep.tools.contact_sheet import BACKGROUND, MUTED, PAD, TEXT, _fit, _font, _text_size
from beam_prep.write.shared.layout import DUPLICATES

__all__ = ["LeakageSheet", "cross_split_groups", "make_leakage_sheet", "save"]

MAX_FILES = 6  # shown per group


@dataclasses.dataclass(frozen=True)
class LeakageSheet:
    """The sheet, and per row its group's caption and the (split, path) of each file shown."""

    image: Image.Image
    rows: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]


def cross_split_groups(lines: Iterable[str], input_root: str | None = None,
                       where: str = DUPLICATES) -> list[tuple[str, int, list[dict[str, Any]]]]:
    """duplicates.jsonl's groups in two splits or more or under two labels, those under two labels first,
    then the closest: ``(caption, distance, files)``.

    Args:
      lines: duplicates.jsonl's lines.
      input_root: where given, the path of each file of those groups must lie under it (the
        run's input); it is then made whole (a relative one joined to the root).
      where: the file, as messages name it.

    Raises:
      DatasetError: a line that is not JSON.
      UnsafeName: with ``input_root``, a file of those groups whose path lies outside it.
    """
    groups: dict[tuple[str, Any], list[tuple[int, dict[str, Any]]]] = collections.defaultdict(list)
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except ValueError as e:
            raise DatasetError(f"{where} holds a line that is not JSON: {line[:200]!r}") from e
        kind = row.get("kind", "exact")
        groups[kind, row["group"] if kind == "near" else row["sha256"]].append((number, row))
    found = []
    for (kind, key), numbered in groups.items():
        files = [row for _, row in numbered]
        differ = bool(files[0].get("labels_differ"))
        if len({f["split"] for f in files}) < 2 and not differ:
            continue
        if input_root is not None:
            for number, row in numbered:
                row["path"] = path_under(input_root, row.get("path"), where, f"line {number}'s path")
        distance = files[0].get("group_distance", 0)
        caption = f"near group {key}, ≤ {distance} bits" if kind == "near" else f"exact copies {key[:12]}"
        found.append((f"{caption}, labels differ" if differ else caption, distance, files))
    found.sort(key=lambda g: (not g[2][0].get("labels_differ"), g[1], g[0]))
    return found


def make_leakage_sheet(output: str, groups: int = 8, cell: int = 160) -> LeakageSheet | None:
    """The sheet of the dataset at ``output``'s ``groups`` closest cross-split groups; None if none.

    Raises:
      DatasetError, StorageError: the manifest or duplicates.jsonl cannot be read.
      UnsafeName: duplicates.jsonl names a file outside the run's input folder (before any is opened).
    """
    from beam_prep.reader.sources import read_manifest

    manifest = read_manifest(output)[1]
    input_root = str((manifest.get("options") or {}).get("input") or "")
    where = join(output, DUPLICATES)
    found = cross_split_groups(read_lines(where), input_root, where)[:groups]
    if not found:
        return None
    font = _font()
    text_h = _text_size(font, "Ag(0)")[1]
    caption_w = max(_text_size(font, caption)[0] for caption, _, _ in found) + 2 * PAD
    row_h = cell + text_h + 2 * PAD
    columns = max(min(len(files), MAX_FILES) for _, _, files in found)
    sheet = Image.new("RGB", (caption_w + columns * (cell + PAD) + PAD, len(found) * row_h + PAD), BACKGROUND)
    pen = ImageDraw.Draw(sheet)
    rows = []
    for position, (caption, _, files) in enumerate(found):
        y = PAD + position * row_h
        pen.text((PAD, y + (cell - text_h) // 2), caption, fill=TEXT, font=font)
        shown = sorted(files, key=lambda f: (f["split"] != "validation", f["path"]))[:MAX_FILES]
        for column, f in enumerate(shown):
            left = caption_w + column * (cell + PAD)
            try:  # the path checked to lie under the input (cross_split_groups)
                if not _the_runs_file(f["path"], f.get("sha256")):
                    pen.text((left, y + (cell - text_h) // 2), "not the run's file", fill=MUTED, font=font)
                else:
                    with our_limit_only(), Image.open(f["path"]) as source:  # the run took it: under --max_pixels
                        picture = _fit(source.convert("RGB"), cell)
                    sheet.paste(picture, (left + (cell - picture.width) // 2, y + (cell - picture.height) // 2))
            except (OSError, ValueError):
                pen.text((left, y + (cell - text_h) // 2), "cannot read", fill=MUTED, font=font)
            pen.text((left, y + cell + PAD // 2), _under(f), fill=TEXT, font=font)
        rows.append((caption, tuple((f["split"], f["path"]) for f in shown)))
    return LeakageSheet(sheet, tuple(rows))


def _under(file: dict[str, Any]) -> str:
    """The words under an image: its split, and its label where its line has one."""
    label = file.get("label")
    if label is None:
        return file["split"]
    return f"{file['split']} · {', '.join(label) if isinstance(label, list) else label}"


def _the_runs_file(path: str, sha256: Any) -> bool:
    """Whether ``path`` is a regular file (not a device or a pipe, which could block) whose bytes have
    ``sha256``, the run's hash of the file its line names: hashed as it is read, never held whole.

    Raises:
      OSError: it cannot be read.
    """
    if not is_local(path):
        return True  # Image.open reads local files only: a gs:// one shows as "cannot read", as before
    if not isinstance(sha256, str) or not stat.S_ISREG(os.stat(path).st_mode):
        return False
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest() == sha256


def save(sheet: LeakageSheet, path: str) -> None:
    """Writes the sheet as PNG to a local path or ``gs://``.

    Raises:
      StorageError: naming ``path``, if it cannot be written.
    """
    from apache_beam.io.filesystems import FileSystems

    try:
        if is_local(path):
            sheet.image.save(path, "PNG")
            return
        with FileSystems.create(path, mime_type="image/png") as f:
            sheet.image.save(f, "PNG")
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("write", path, e) from e
