"""Label ids a dataset gave out: an --overwrite that would move them says so before any work."""
from __future__ import annotations

import shutil
import warnings

import apache_beam as beam
import pytest
from helpers import make_tree, prepare_here

import beam_prep
from beam_prep.errors import BeamPrepWarning
from beam_prep.write.grow.label_ids import Move, moves

SMALL = ("--image_size", "16", "--num_shards", "1")


def test_moves_are_the_classes_in_both_lists_whose_stored_ids_differ():
    assert moves(["circles", "squares"], 0, ["aardvark", "circles", "squares"], 0) == [
        Move("circles", 0, 1), Move("squares", 1, 2)]
    assert moves(["circles", "squares"], 0, ["circles", "squares", "aardvark"], 0) == []
    assert moves(["circles", "squares"], 0, ["circles", "squares"], 1) == [Move("circles", 0, 1),
                                                                            Move("squares", 1, 2)]
    assert moves(["a", "b", "c"], 0, ["a", "c"], 0) == [Move("c", 2, 1)]  # a removed class moves the ones after it
    assert moves(["a", "b"], 1, ["b"], 2) == []  # b: 2 before and after


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """A dataset of circles and squares, and the same tree with a class ``aardvark`` added."""
    root = tmp_path_factory.mktemp("ids")
    make_tree(root / "first", {"circles": 2, "squares": 2}, size=(24, 20))
    prepare_here("--input", str(root / "first"), "--output", str(root / "out"), *SMALL)
    shutil.copytree(root / "first", root / "grown")
    make_tree(root / "new", {"aardvark": 2}, size=(20, 24))
    shutil.copytree(root / "new" / "aardvark", root / "grown" / "aardvark")
    return root


def _moved_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if w.category is BeamPrepWarning and "other ids" in str(w.message)]


@pytest.mark.slow  # runs a pipeline in this process (the fixture)
def test_an_overwrite_that_moves_ids_says_which_and_how_to_keep_them_before_any_work(grown):
    out = grown / "out"
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with pytest.warns(BeamPrepWarning) as caught:
        beam_prep.prepare(str(grown / "grown"), str(out), overwrite=True, dry_run=True)
    assert _moved_warnings(caught) == [
        f"overwrite=True gives 2 classes of the dataset in {out} other ids ('circles' 0 -> 1, 'squares' 1 -> 2), "
        "so a model trained on it would read the wrong labels: to keep their ids, add the new images with "
        "append=True instead, or pass labels_file listing its classes in their order "
        f"({out}/labels.txt's names) and new ones after them"]
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # said before any work


@pytest.mark.slow  # runs a pipeline in this process (the fixture)
def test_an_overwrite_that_keeps_the_ids_says_nothing(grown, tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text((grown / "out" / "labels.txt").read_text() + "aardvark\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        beam_prep.prepare(str(grown / "grown"), str(grown / "out"), overwrite=True, dry_run=True,
                          labels_file=str(labels))
        beam_prep.prepare(str(grown / "first"), str(grown / "out"), overwrite=True, dry_run=True)
        beam_prep.prepare(str(grown / "grown"), str(tmp_path / "empty"), overwrite=True, dry_run=True)
    assert _moved_warnings(caught) == []


@pytest.mark.slow  # runs a pipeline in this process (the fixture)
def test_write_image_dataset_warns_when_applied_with_overwrite(grown, tmp_path):
    shutil.copytree(grown / "out", tmp_path / "out")
    moved = r"gives 1 class of the dataset in .* other ids \('squares' 1 -> 0\)"
    with pytest.warns(BeamPrepWarning, match=moved), beam.Pipeline() as p:  # the warning: when it is applied
        _ = p | beam.Create([]) | beam_prep.WriteImageDataset(
            str(tmp_path / "out"), labels=["squares", "zebra"], overwrite=True, image_size=16, num_shards=1)
