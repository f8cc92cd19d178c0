"""The dataset card: ``README.md`` beside the manifest, in Hugging Face's dataset-card format.

Its YAML front matter is what Hugging Face's ``datasets`` reads (``dataset_info``: the features,
the label's ``ClassLabel`` names, each split's record count; ``configs``: each split's shards), so
``load_dataset(OUT)`` on a WebDataset output names the classes; its Markdown says what the dataset
is, how it was made and how each reader reads it. Written from the manifest alone, with plain text
and PyYAML (which Beam requires), as ``tfds_metadata`` is. docs/guides/output-format.md, "The card".
"""
from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

import yaml

from beam_prep.model.dataset import MANIFEST, DatasetInfo

__all__ = ["CARD", "MARK", "card", "hugging_face_reads", "is_ours"]

CARD = "README.md"
# The first line of a card beam-prep wrote: a run replaces such a README.md, never another one.
MARK = "# beam-prep dataset card: every run into this folder writes it again (remove this line to keep your edits)"
# The image member's extension in a WebDataset sample, by image/format (shard_formats writes them).
_IMAGE_MEMBER = {"jpeg": "jpg", "png": "png", "raw": "raw"}
# The members of a sample's .json, and their types (shard_formats._WebDataset.payload).
_JSON_FIELDS = (("channels", "int64"), ("filename", "string"), ("format", "string"), ("height", "int64"),
                ("label", "int64"), ("label_text", "string"), ("sha256", "string"), ("size", "int64"),
                ("width", "int64"))
_SIZES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
          (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M"))


def hugging_face_reads(info: DatasetInfo) -> str | None:
    """Why Hugging Face's ``load_dataset(OUT)`` cannot read this dataset, or None where it can (with its
    class names: ``ClassLabel``)."""
    if info.file_format != "webdataset":
        return (f"Hugging Face `datasets` has no reader for {info.file_format} shards: `load_dataset` on this "
                "folder finds no data files")
    if info.multi_label:
        return "Hugging Face's WebDataset reader takes `.cls` for one id, and these records hold a list of labels"
    return None


def is_ours(text: str) -> bool:
    """Whether ``text`` (a README.md's start) is a card beam-prep wrote, which a run may replace."""
    lines = text.lstrip("\ufeff").splitlines()
    return len(lines) > 1 and lines[0] == "---" and lines[1] == MARK


def card(info: DatasetInfo, manifest: Mapping[str, Any]) -> str:
    """The dataset card of the dataset ``manifest`` describes (``info``: the same, read).

    The card holds no time and no path: a rerun of the same command writes the same bytes, as it
    does its reports, wherever the folder is.

    Args:
      info: the dataset.
      manifest: its manifest, as published (options, counts, version).

    Returns:
      The card's text: YAML front matter, then Markdown.
    """
    total = sum(split.num_examples for split in info.splits.values())
    meta: dict[str, Any] = {}
    if info.labels:
        meta["task_categories"] = ["image-classification"]
    meta["size_categories"] = [next((tag for limit, tag in _SIZES if total < limit), "n>100M")]
    if hugging_face_reads(info) is None:
        meta["dataset_info"] = {"features": _features(info), "splits": [
            {"name": split, "num_bytes": sum(s.shard_bytes or ()), "num_examples": s.num_examples}
            for split, s in info.splits.items()]}
        meta["configs"] = [{"config_name": "default", "data_files": [
            {"split": split, "path": list(s.shards)} for split, s in info.splits.items()]}]
    front = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=1_000_000)
    return "".join(["---\n", MARK, "\n", front, "---\n\n", _body(info, manifest, total)])


def _features(info: DatasetInfo) -> list[dict[str, Any]]:
    """Hugging Face's WebDataset columns: a sample's members by extension (shard_formats writes them)."""
    image = _IMAGE_MEMBER[info.image.format]
    out: list[dict[str, Any]] = [{"name": image, "dtype": "image" if image != "raw" else "binary"}]
    if info.labels:
        if info.label_offset == 0:
            names = {str(i): label for i, label in enumerate(info.labels)}
            out.append({"name": "cls", "dtype": {"class_label": {"names": names}}})
        else:  # a ClassLabel's ids are its names' indexes: an offset id is a plain int
            out.append({"name": "cls", "dtype": "int64"})
    fields = [(key, kind) for key, kind in _JSON_FIELDS if info.labels or key not in ("label", "label_text")]
    out.append({"name": "json", "struct": [{"name": key, "dtype": kind} for key, kind in fields]})
    out.append({"name": "__key__", "dtype": "string"})
    return out


def _cell(text: str) -> str:
    """``text`` shown as written in a Markdown table cell: HTML escaped, ``|`` and backslashes too."""
    return html.escape(text).replace("\\", "&#92;").replace("|", "&#124;").replace("`", "&#96;")


def _body(info: DatasetInfo, manifest: Mapping[str, Any], total: int) -> str:
    image = info.image
    size = f"{image.height}x{image.width}" if image.fixed_size else "their own size"
    options = manifest.get("options") or {}
    counts = manifest.get("counts") or {}
    made = (f"beam-prep {manifest.get('beam_prep_version', '?')} wrote it (when: `created` in {MANIFEST})"
            + (f", version {info.version} (each run's input and counts: `versions` in {MANIFEST})"
               if info.version > 1 else ""))
    lines = ["# An image dataset made by beam-prep", "",
             f"{total} images{f' in {len(info.labels)} classes' if info.labels else ', without labels'}, "
             f"as {info.file_format} shards of {image.format} images ({size}, {image.channels} channels, "
             f"resize mode {image.resize_mode or 'none'}). {made}. `{MANIFEST}` describes it field by field; "
             "`labels.txt` holds the class names, `errors.jsonl`, `skipped.jsonl` and `duplicates.jsonl` what "
             "was left out and why.", "",
             "## How it was made", "",
             f"- files listed: {counts.get('listed', '?')}, written: {counts.get('written', '?')}, "
             f"failed: {counts.get('failed', '?')}, skipped: {counts.get('skipped', '?')}",
             f"- `--file_format {info.file_format}`, `--compression {str(options.get('compression', info.compression)).lower()}`, "
             f"`--image_format {options.get('image_format', image.format)}`, `--label_offset {info.label_offset}`",
             "", "## Splits and classes", ""]
    splits = list(info.splits)
    lines += ["| class | id | " + " | ".join(map(_cell, splits)) + " |",
              "|---|---|" + "---|" * len(splits)]
    for i, label in enumerate(info.labels):
        row = [str((info.splits[s].class_counts or {}).get(label, "?")) for s in splits]
        lines.append(f"| {_cell(label)} | {i + info.label_offset} | " + " | ".join(row) + " |")
    lines += ["| **all** | | " + " | ".join(str(info.splits[s].num_examples) for s in splits) + " |", ""]
    lines += _reading(info, splits[0] if splits else "train")
    return "\n".join(lines) + "\n"


def _reading(info: DatasetInfo, split: str) -> list[str]:
    """How each reader reads it: the one of its format, and Hugging Face's (or why not)."""
    reader = {"tfrecord": ("make_dataset", f'"{split}", batch_size=32'),
              "array_record": ("data_source", f'"{split}"'),
              "webdataset": ("webdataset_pipeline", f'"{split}"')}[info.file_format]
    lines = ["## Reading it", "", f"With beam-prep's reader for {info.file_format} (path: this folder):", "",
             "```python", "import beam_prep", "",
             f'data = beam_prep.{reader[0]}("PATH", {reader[1]})', "```", ""]
    why = hugging_face_reads(info)
    if why is None:
        lines += ["With Hugging Face `datasets`, whose `cls` column is a `ClassLabel` of the names above:"
                  if info.labels and info.label_offset == 0 else "With Hugging Face `datasets`:", "",
                  "```python", "from datasets import load_dataset", "", 'data = load_dataset("PATH")', "```"]
    else:
        lines += [f"{why}; beam-prep's docs (docs/guides/reading-back.md, \"Hugging Face datasets\") make a "
                  "`datasets.Dataset` of its records, with the class names."]
    return lines
