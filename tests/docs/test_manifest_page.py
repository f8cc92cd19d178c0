"""docs/reference/manifest.md documents exactly what a run writes: every key of manifest.json,
every field of each jsonl side file, and every file of the output folder, in both directions
(a key written and not documented fails, and so does a key documented that no run writes).

Two real runs on the sample tree (``python -m pipelines.make_sample``, then the command)
cover the optional parts between them: one keeps original JPEGs uncompressed (originals,
TFDS's files) and drops the copies across splits, the other reads a --metadata table (multi-label, extra features, skipped
files); both have a failed file, a skipped one and a duplicate.
"""
from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO, prepare_here
from PIL import Image

from beam_prep.write.plan.listing import split_for

PAGE = REPO / "docs" / "reference" / "manifest.md"
# Objects whose keys are names of the data, not the format's: the page writes them as placeholders.
NAMED_BY_DATA = {
    "splits": "<split>",
    "splits.<split>.class_counts": "<label>",
    "features": "<key>",
    "extra_features": "<key>",
    "failed_by_stage": "<stage>",
    "jpeg_path.reasons": "<reason>",
    "skipped_by_reason": "<reason>",
    "originals.reencoded_by_reason": "<reason>",
    "duplicates.dropped_by_reason": "<reason>",
    "duplicates.dropped_by_split": "<split>",
    "duplicates.dropped_by_class": "<split>",
    "duplicates.dropped_by_class.<split>": "<label>",
    "duplicates.split_pairs": "<pair>",
    "duplicates.near.split_pairs": "<pair>",
    "sources.width": "<bin>",
    "sources.height": "<bin>",
    "sources.aspect": "<bin>",
    "versions[].splits": "<split>",
    "versions[].splits.<split>.class_counts": "<label>",
}
_SHARD = re.compile(r"^[\w.-]+-\d{5}-of-\d{5}\.(tfrecord(\.gz)?|array_record|tar)$")
_DALI_INDEX = re.compile(r"^dali-[\w.-]+-\d{5}-of-\d{5}\.tfrecord\.idx$")  # listed as dali-<shard>.idx
_KEPT_HASHES = re.compile(r"^hashes-v\d+\.tsv\.gz$")  # listed as hashes-v<N>.tsv.gz
_KEPT_STAMPS = re.compile(r"^stamps-v\d+\.tsv\.gz$")  # listed as stamps-v<N>.tsv.gz


def key_paths(value: Any, path: str = "") -> Iterator[str]:
    """Every key of a JSON value as a dotted path (``counts.listed``), lists as ``[]`` and the
    data's own names as their placeholders (``splits.<split>.num_examples``)."""
    if isinstance(value, dict):
        for key, item in value.items():
            name = NAMED_BY_DATA.get(path, key)
            child = f"{path}.{name}" if path else name
            yield child
            yield from key_paths(item, child)
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, (dict, list)):
                yield from key_paths(item, f"{path}[]")


def page_sections() -> dict[str, list[str]]:
    """Each ``## `` section of the page by its title (backticks dropped), and the names in the
    first column of its table."""
    sections: dict[str, list[str]] = {}
    title = None
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            title = line[3:].strip().strip("`")
            sections[title] = []
        elif title is not None:
            cell = re.match(r"^\| `([^`]+)` \|", line)
            if cell:
                sections[title].append(cell.group(1))
    return sections


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> list[Path]:
    work = tmp_path_factory.mktemp("manifest_page")
    tree = work / "sample_data"
    subprocess.run([sys.executable, "-m", "pipelines.make_sample", str(tree), "--per_label", "10"], cwd=REPO,
                   check=True, capture_output=True, timeout=120)
    first = sorted((tree / "circles").glob("*.jpg"))[1]
    shutil.copyfile(first, tree / "squares" / "copy.jpg")  # a duplicate, across labels
    with Image.open(first) as image:  # a near duplicate: re-encoded at JPEG quality 50
        image.save(tree / "squares" / "near.jpg", quality=50)
    # A near copy in validation of a training image, which --cross_split_duplicates drop leaves out
    # (the first run: 30% in validation), named with its distance; the copies above of ``first``
    # (validation) are in train, so ``first`` is left out as a copy.
    other = next(f"squares/other_near_{i}.jpg" for i in range(100) if split_for(f"squares/other_near_{i}.jpg", 30)
                 == "validation")
    with Image.open(sorted((tree / "circles").glob("*.jpg"))[2]) as image:
        image.save(tree / other, quality=50)
    Image.new("RGB", (40, 30), "black").save(tree / "stripes" / "zz_blank.png")  # one flat colour: flat.jsonl
    table = work / "table.csv"
    with open(table, "w", newline="", encoding="utf-8") as f:
        rows = csv.writer(f)
        rows.writerow(["file_name", "labels", "rating"])
        # circles' first files: broken.jpg (a failure) and the duplicated one among them.
        listed = sorted(p for p in tree.rglob("*") if p.suffix in (".jpg", ".png")
                        and p.name not in ("copy.jpg", "near.jpg", other.split("/")[1]))
        for i, image in enumerate(listed[:12]):
            label = image.parent.name
            rows.writerow([image.relative_to(tree).as_posix(), f"{label};stripes" if i % 3 == 0 else label, i])
        rows.writerow(["squares/copy.jpg", "squares", 99])
    runs = {
        "original": ["--image_format", "original", "--resize_mode", "none", "--compression", "none",
                     "--validation_percent", "30", "--cross_split_duplicates", "drop"],
        "metadata": ["--metadata", str(table), "--image_size", "32"],
    }
    done = []
    for name, flags in runs.items():
        out = work / name
        prepare_here("--input", str(tree), "--output", str(out), "--num_shards", "1", *flags)
        done.append(out)
    # An append to the first: its tree grown by a class, a file changed, one removed and a copy.
    appended = Path(shutil.copytree(done[0], work / "appended"))
    circles = sorted((tree / "circles").glob("circles_*.jpg"))
    shutil.copyfile(circles[3], tree / "circles" / "again.jpg")
    circles[4].write_bytes(circles[5].read_bytes()[:-2] + b"\xff\xd9")
    circles[6].unlink()
    (tree / "zebra").mkdir()
    shutil.copyfile(max((tree / "stripes").glob("*.jpg")), tree / "zebra" / "striped.jpg")
    with Image.open(circles[7]) as image:
        image.rotate(90).save(tree / "zebra" / "new.jpg")
        image.save(tree / "circles" / "again_near.jpg", quality=60)  # near a record: a group with version 1
    prepare_here("--input", str(tree), "--output", str(appended), "--append")
    return [*done, appended]


def jsonl_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_runs_write_what_the_page_has_to_cover(outputs):
    """The runs are what the other tests rely on: a page check on empty files proves nothing."""
    original, metadata, appended = (json.loads((out / "manifest.json").read_text()) for out in outputs)
    assert appended["versions"][1]["appended"]["changed"] == appended["versions"][1]["appended"]["gone"] == 1
    assert "originals" in original and "multi_label" in metadata and "extra_features" in metadata
    assert original["counts"]["dropped"] == 2 and original["duplicates"]["dropped_by_reason"] == {
        "copy of an image in train": 1, "near copy of an image in train": 1}
    for out in outputs:
        for name in ("errors.jsonl", "skipped.jsonl", "duplicates.jsonl"):
            assert jsonl_rows(out / name), f"{out.name}/{name} is empty"
    assert jsonl_rows(outputs[0] / "flat.jsonl")  # the blank image (the metadata run's table names it not)
    assert (outputs[0] / "dataset_info.json").exists()


def test_every_manifest_key_is_documented_and_every_documented_key_is_written(outputs):
    documented = set(page_sections()["manifest.json"])
    written: set[str] = set()
    for out in outputs:
        written |= set(key_paths(json.loads((out / "manifest.json").read_text(encoding="utf-8"))))
    assert not written - documented, f"manifest keys missing from manifest.md: {sorted(written - documented)}"
    assert not documented - written, f"manifest.md documents keys no run wrote: {sorted(documented - written)}"


@pytest.mark.parametrize("name", ["errors.jsonl", "skipped.jsonl", "duplicates.jsonl", "flat.jsonl", "changed.jsonl"])
def test_every_field_of_each_side_file_is_documented_and_written(outputs, name):
    documented = set(page_sections()[name])
    written = {key for out in outputs if (out / name).exists() for row in jsonl_rows(out / name) for key in row}
    assert written == documented, (f"{name}: written, not documented {sorted(written - documented)}; "
                                   f"documented, not written {sorted(documented - written)}")


def test_every_file_of_the_output_folder_is_listed(outputs):
    documented = set(page_sections()["The output folder"])
    written = {"dali-<shard>.idx" if _DALI_INDEX.match(p.name) else "hashes-v<N>.tsv.gz"
               if _KEPT_HASHES.match(p.name) else "stamps-v<N>.tsv.gz" if _KEPT_STAMPS.match(p.name) else p.name
               for out in outputs for p in out.iterdir() if not _SHARD.match(p.name)}
    assert written == documented, (f"files written, not listed {sorted(written - documented)}; "
                                   f"listed, not written {sorted(documented - written)}")


def test_key_paths_names_the_data_by_placeholders():
    manifest = {"splits": {"train": {"class_counts": {"cat": 1}}}, "duplicates": {"examples": [{"files": [{"path": 1}]}]}}
    assert list(key_paths(manifest)) == [
        "splits", "splits.<split>", "splits.<split>.class_counts", "splits.<split>.class_counts.<label>",
        "duplicates", "duplicates.examples", "duplicates.examples[].files", "duplicates.examples[].files[].path"]
