"""Near duplicates in a run: found on both sinks alike, named in the summary as cross-split leakage,
listed and counted, and --cross_split_duplicates fail exits 1 once the dataset is written."""
from __future__ import annotations

import contextlib
import io
import json

import pytest
from helpers import prepare_here, run_prepare
from PIL import Image

import beam_prep
from beam_prep.errors import CrossSplitLeakage
from beam_prep.tools import leakage_sheet
from beam_prep.tools.sample import picture
from beam_prep.write.plan.listing import split_for
from pipelines import inspect_output

pytestmark = pytest.mark.slow
PERCENT = 40


def _name_in(split: str, folder: str, stem: str) -> str:
    return next(f"{folder}/{stem}_{i}.jpg" for i in range(1000)
                if split_for(f"{folder}/{stem}_{i}.jpg", PERCENT) == split)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """Eight pictures; one has a half-size copy at JPEG quality 50 in the other split."""
    root = tmp_path_factory.mktemp("near") / "tree"
    for i in range(8):
        (root / "a").mkdir(parents=True, exist_ok=True)
        picture(i, 160, 120).save(root / "a" / f"img_{i}.jpg", quality=90)
    source = _name_in("train", "a", "source")
    copy = _name_in("validation", "a", "copy")
    picture(42, 160, 120).save(root / source, quality=90)
    picture(42, 160, 120).resize((80, 60), Image.Resampling.BICUBIC).save(root / copy, quality=50)
    return root, {str(root / source): "train", str(root / copy): "validation"}


def _near(out) -> list[tuple[int, str, str]]:
    lines = [json.loads(line) for line in (out / "duplicates.jsonl").read_text().splitlines()]
    return [(r["group"], r["split"], r["path"]) for r in lines if r["kind"] == "near"]


def test_both_sinks_find_the_same_near_groups_and_fail_says_so_after_writing(tree, tmp_path):
    root, expected = tree
    groups = {}
    for sink in ("streaming", "shuffle"):
        out = tmp_path / sink
        result = run_prepare("--input", str(root), "--output", str(out), "--image_size", "32", "--sink", sink,
                             "--validation_percent", str(PERCENT), "--cross_split_duplicates", "fail")
        assert result.returncode == 1, result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith(
            "error: --cross_split_duplicates fail: 1 group of copies across splits (the dataset is written")
        assert "cross-split leakage: 1 group of copies or near copies in two splits (groups per pair of splits: " \
               "train/validation 1)" in result.stdout
        manifest = json.loads((out / "manifest.json").read_text())  # written before the exit
        near = manifest["duplicates"]["near"]
        assert (near["groups"], near["files"], near["across_splits"], near["files_across"]) == (1, 2, 1, 2)
        assert near["split_pairs"] == {"train/validation": 1}
        groups[sink] = _near(out)
    assert groups["streaming"] == groups["shuffle"]
    assert {path: split for _, split, path in groups["streaming"]} == expected
    # inspect lists the group and draws it: the validation file first, beside its training copy.
    sheet_path = tmp_path / "leaks.png"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert inspect_output.main([str(tmp_path / "streaming"), "--leakage", str(sheet_path)]) == 0
    assert "near duplicates: 1 group of 2 files within 6 bits (0 within a split, 1 across splits" in printed.getvalue()
    assert f"leakage sheet: {sheet_path} (1 group across splits or labels)" in printed.getvalue()
    sheet = leakage_sheet.make_leakage_sheet(str(tmp_path / "streaming"))
    (caption, files), = sheet.rows
    assert caption.startswith("near group 1") and [split for split, _ in files] == ["validation", "train"]
    assert Image.open(sheet_path).size == sheet.image.size


def test_minus_one_turns_the_near_search_off(tree, tmp_path):
    root, _ = tree
    out = tmp_path / "off"
    prepare_here("--input", str(root), "--output", str(out), "--image_size", "32",
                 "--validation_percent", str(PERCENT), "--near_duplicate_distance", "-1")
    assert _near(out) == [] and json.loads((out / "manifest.json").read_text())["duplicates"]["near"] is None


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--near_duplicate_distance", "33", "--near_duplicate_distance must be in [0, 32] bits, or -1"),
    ("--cross_split_duplicates", "remove", "--cross_split_duplicates must be one of report, fail, drop, not 'remove'"),
])
def test_bad_values_exit_2_with_what_to_fix(tree, tmp_path, flag, value, message):
    root, _ = tree
    result = run_prepare("--input", str(root), "--output", str(tmp_path / "out"), flag, value)
    assert result.returncode == 2 and message in result.stderr
    assert not (tmp_path / "out").exists()


def test_from_python_fail_raises_once_the_dataset_is_written(tree, tmp_path):
    root, _ = tree
    out = tmp_path / "python"
    with pytest.raises(CrossSplitLeakage, match=r"^cross_split_duplicates fail: 1 group of copies across splits"
                                                r" \(the dataset is written") as raised:
        beam_prep.prepare(str(root), str(out), image_size=32, validation_percent=PERCENT,
                          cross_split_duplicates="fail", direct_running_mode="in_memory")
    assert raised.value.result.manifest["duplicates"]["near"]["across_splits"] == 1
    assert (out / "manifest.json").is_file()
