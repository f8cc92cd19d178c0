"""A contact sheet: a row per class of images decoded from the shards, for a person to look at.

What you see is what training gets: the images come from the records (not the
source files), decoded by the reader's own :func:`~beam_prep.reader.decode.decode`
with its JPEG settings, so a wrong label, a bad crop or a colour mix-up shows
here exactly as the model would see it.

:func:`collect` reads a split's shards in order and keeps the first
``per_class`` records of each class, stopping as soon as every class has what
the manifest says it can have (the writer mixes classes in every shard, so a
sheet rarely reads more than a few shards). Only kept records are decoded;
the rest are read and parsed, no more. :func:`draw` lays them out with Pillow:
one row per label in label order, captioned ``name (id)`` with the id stored
in the records.
"""
from __future__ import annotations

import dataclasses
import difflib
import io
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from PIL import Image, ImageDraw, ImageFont

from beam_prep.errors import DatasetError, OptionsError, StorageError
from beam_prep.io.storage import join
from beam_prep.model import features
from beam_prep.model.dataset import TFRECORD, DatasetInfo
from beam_prep.tools.inspection import describe_image

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = ["ContactSheet", "Row", "collect", "default_cell", "draw", "make_contact_sheet", "save"]

_LOG = logging.getLogger(__name__)

PAD = 4  # pixels between cells, and around the sheet
FONT_SIZE = 14
MAX_CELL = 256  # default cell side for large images; --cell overrides
EMPTY_CELL = 32  # cell side of a sheet with no images at all
BACKGROUND = (32, 32, 32)
TEXT = (235, 235, 235)
MUTED = (150, 150, 150)
MAX_CAPTION = 48  # characters of a label name before it is cut


@dataclasses.dataclass(frozen=True)
class Row:
    """One class's row: its caption and where each of its images was drawn.

    ``top`` and ``bottom`` bound the row's band of the sheet; ``left`` is where
    its images start, right of the captions. ``boxes`` are (left, top, right,
    bottom) of each image as pasted, in the order the records were read.
    """

    index: int  # position in the dataset's labels
    label_id: int  # the id stored in the records (index + label offset)
    caption: str
    top: int
    bottom: int
    left: int
    boxes: tuple[tuple[int, int, int, int], ...]


@dataclasses.dataclass(frozen=True)
class ContactSheet:
    image: Image.Image
    split: str
    per_class: int
    cell: int
    rows: tuple[Row, ...]


def make_contact_sheet(info: DatasetInfo, split: str = "train", per_class: int = 8,
                       cell: int | None = None, classes: Sequence[str] | None = None) -> ContactSheet:
    """Reads up to ``per_class`` records of each class of ``split`` and draws them.

    ``cell`` is the side of each image's box; by default the largest image
    shown, up to MAX_CELL, so images appear pixel for pixel. ``classes`` (label
    names) draws those rows alone, in label order: a sheet of a 1000-class
    dataset's every row is taller than a screen.

    Raises:
      OptionsError: ``per_class`` or ``cell`` below 1, or a name in ``classes`` that is no label.
      DatasetError: an unknown split, a shard missing or damaged, or a record whose
        label id is not one of the dataset's.
    """
    if per_class < 1:
        raise OptionsError(f"per class must be at least 1, not {per_class}")
    if cell is not None and cell < 1:
        raise OptionsError(f"cell must be at least 1 pixel, not {cell}")
    rows = row_indices(info, classes)
    samples = collect(info, split, per_class, rows)
    return draw(info, split, samples, per_class, cell or default_cell(samples), rows)


def row_indices(info: DatasetInfo, classes: Sequence[str] | None) -> tuple[int, ...]:
    """The label indices the sheet draws, in label order: all, or those ``classes`` names."""
    if classes is None:
        return tuple(range(info.num_classes))
    unknown = [name for name in classes if name not in info.labels]
    if unknown:
        guesses = [difflib.get_close_matches(name, info.labels, n=1) for name in unknown]
        named = ", ".join(repr(name) + (f" (did you mean {guess[0]!r}?)" if guess else "")
                          for name, guess in zip(unknown, guesses))
        raise OptionsError(f"no label named {named}; the labels are in {join(info.root, 'labels.txt')}")
    wanted = set(classes)
    return tuple(i for i, name in enumerate(info.labels) if name in wanted)


def default_cell(samples: Sequence[Sequence[np.ndarray]]) -> int:
    """The largest side among the images (one to one) up to MAX_CELL; EMPTY_CELL when there are none."""
    sides = [max(pixels.shape[:2]) for images in samples for pixels in images]
    return min(max(sides), MAX_CELL) if sides else EMPTY_CELL


def collect(info: DatasetInfo, split: str, per_class: int,
            rows: Sequence[int] | None = None) -> list[list[np.ndarray]]:
    """The first ``per_class`` decoded images of each label of ``split``, by label index (uint8 HWC);
    of the labels at ``rows`` (indices) alone when given, the others' lists left empty.

    Raises:
      DatasetError: ``split`` is not one of the dataset's (as the reader says it), a
        shard is missing or damaged (named), or a record's label id is out of range.
    """
    import tensorflow as tf

    if split not in info.splits:
        raise DatasetError(f"{info.root} has no split {split!r}; its splits: {', '.join(info.splits) or 'none'}")
    s = info.splits[split]
    drawn = set(range(info.num_classes) if rows is None else rows)
    wanted = [0 if i not in drawn else
              min(per_class, int(s.class_counts.get(name, 0))) if s.class_counts is not None
              else per_class for i, name in enumerate(info.labels)]
    kept: list[list[np.ndarray]] = [[] for _ in info.labels]
    missing = sum(wanted)
    counts = s.shard_num_examples or (None,) * len(s.files)
    for path, n in zip(s.files, counts):
        if missing == 0:
            break
        try:
            for serialized in _serialized(info, path, n):
                record = features.decode_example(serialized)
                index = _label_index(info, record, path)
                if len(kept[index]) < wanted[index]:
                    kept[index].append(_decode(info, record))
                    missing -= 1
                    if missing == 0:
                        break
        except tf.errors.NotFoundError as e:
            raise DatasetError(f"shard {path} of split {split!r} does not exist: the dataset is "
                               "incomplete") from e
        except tf.errors.OpError as e:
            raise DatasetError(f"cannot read shard {path}: {e.message}") from e
        except DatasetError as e:  # another format's shard (format_records)
            raise DatasetError(f"cannot read shard {path}: {e}") from e
    if missing and s.class_counts is not None:
        _LOG.warning("split %s: %d images fewer than the manifest's class counts promise",
                     split, missing)
    return kept


def _serialized(info: DatasetInfo, path: str, n: int | None) -> Iterator[bytes]:
    """A shard's serialized Examples, in order: a TFRecord shard's read by tf.data (``n``: its
    count, so that a shard cut short fails), another format's turned into them (``format_records``)."""
    if info.file_format != TFRECORD:
        from beam_prep.tools.format_records import Bad, examples

        return (r for r in examples(info.file_format, path) if not isinstance(r, Bad))
    import tensorflow as tf

    from beam_prep.reader.shards import read_shard
    from beam_prep.reader.sources import tf_compression

    records = read_shard(tf.constant(path), tf_compression(info.compression),
                         None if n is None else tf.constant(n, tf.int64))
    return records.as_numpy_iterator()


def _label_index(info: DatasetInfo, record: dict, path: str) -> int:
    index = int(record[features.LABEL]) - info.label_offset
    if not 0 <= index < info.num_classes:
        raise DatasetError(f"a record in {path} has label id {record[features.LABEL]}, outside the "
                           f"{info.num_classes} labels (ids from {info.label_offset})")
    return index


def _decode(info: DatasetInfo, record: dict) -> np.ndarray:
    """One record's image, decoded as the reader decodes it (its function, its JPEG settings)."""
    import tensorflow as tf

    from beam_prep.reader.decode import decode

    hw = (tf.constant(record[features.HEIGHT]), tf.constant(record[features.WIDTH]))
    return decode(tf.constant(record[features.ENCODED]), info.image, hw).numpy()


def draw(info: DatasetInfo, split: str, samples: Sequence[Sequence[np.ndarray]], per_class: int,
         cell: int, rows: Sequence[int] | None = None) -> ContactSheet:
    """Lays ``samples`` (per label index) out, a row per label in label order (the labels at
    ``rows``, indices, alone when given).

    The sheet is as wide as its fullest row. Each image is centred in a ``cell`` x ``cell`` box, shrunk to fit (keeping
    its aspect ratio) when larger and never enlarged, so sizes can be compared.
    """
    font = _font()
    indices = list(range(info.num_classes) if rows is None else rows)
    captions = [_caption(info.labels[i], i + info.label_offset) for i in indices]
    title = (f"{split}: up to {per_class} per class, decoded from the shards "
             f"({describe_image(info.image)})")
    text_h = _text_size(font, "Ag(0)")[1]
    label_w = max(_text_size(font, c)[0] for c in [*captions, "no examples"]) + 2 * PAD
    row_h = max(cell, text_h) + PAD
    columns = max([1, *(min(len(samples[i]), per_class) for i in indices if i < len(samples))])
    width = max(label_w + columns * (cell + PAD) + PAD, _text_size(font, title)[0] + 2 * PAD)
    top = PAD + text_h + 2 * PAD
    sheet = Image.new("RGB", (width, top + len(captions) * row_h + PAD), BACKGROUND)
    pen = ImageDraw.Draw(sheet)
    pen.text((PAD, PAD), title, fill=TEXT, font=font)
    drawn = []
    for position, (index, caption) in enumerate(zip(indices, captions)):
        y = top + position * row_h
        pen.text((PAD, y + (cell - text_h) // 2), caption, fill=TEXT, font=font)
        images = samples[index] if index < len(samples) else ()
        if not images:
            pen.text((label_w, y + (cell - text_h) // 2), f"no examples in {split}", fill=MUTED, font=font)
        boxes = []
        for column, pixels in enumerate(images[:per_class]):
            picture = _fit(_to_pil(pixels), cell)
            left = label_w + column * (cell + PAD) + (cell - picture.width) // 2
            upper = y + (cell - picture.height) // 2
            sheet.paste(picture, (left, upper))
            boxes.append((left, upper, left + picture.width, upper + picture.height))
        drawn.append(Row(index, index + info.label_offset, caption, y, y + row_h - PAD, label_w,
                         tuple(boxes)))
    return ContactSheet(sheet, split, per_class, cell, tuple(drawn))


def save(sheet: ContactSheet, path: str) -> None:
    """Writes the sheet as PNG to a local path or ``gs://``.

    Raises:
      StorageError: naming ``path``, if it cannot be written.
    """
    import tensorflow as tf

    buffer = io.BytesIO()
    sheet.image.save(buffer, "PNG")
    try:
        with tf.io.gfile.GFile(path, "wb") as f:
            f.write(buffer.getvalue())
    except tf.errors.OpError as e:
        raise StorageError(f"cannot write {path}: {e.message}") from e


def _caption(name: str, label_id: int) -> str:
    short = name if len(name) <= MAX_CAPTION else name[:MAX_CAPTION - 1] + "…"
    return f"{short} ({label_id})"


def _to_pil(pixels: np.ndarray) -> Image.Image:
    if pixels.shape[-1] == 1:
        return Image.fromarray(pixels[..., 0], "L").convert("RGB")
    return Image.fromarray(pixels, "RGB")


def _fit(picture: Image.Image, cell: int) -> Image.Image:
    scale = min(cell / picture.width, cell / picture.height)
    if scale >= 1:
        return picture
    size = (max(1, round(picture.width * scale)), max(1, round(picture.height * scale)))
    return picture.resize(size, Image.Resampling.LANCZOS)


def _font() -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        return ImageFont.load_default(size=FONT_SIZE)
    except (TypeError, ImportError, OSError):  # a Pillow without FreeType: the fixed bitmap font
        return ImageFont.load_default()


def _text_size(font, text: str) -> tuple[int, int]:
    left, _top, right, bottom = font.getbbox(text)
    return right - left, bottom
