"""PyTorch's readers of beam-prep datasets: ``data_source`` (array_record) and the WebDataset recipe,
through a real torch ``DataLoader`` with worker processes, against the tree they were made from.

Four prepare runs in this process, shared by the module: each reader at 100 and at 2,000 images (8x8, so the
large run is quick), one of the two with ``--label_offset 1``, so that each reader meets both
sizes and both offsets. The 100-image WebDataset run has one shard for two workers: a worker
with nothing to read must yield nothing, not fail.
"""
from __future__ import annotations

import json
import pathlib
import subprocess

import numpy as np
import pytest
from helpers import REPO, child, make_tree, prepare_here

import beam_prep
from beam_prep.errors import DatasetError

pytestmark = pytest.mark.slow

SIZES = {100: {"ant": 30, "bee": 25, "cat": 20, "dog": 15, "eel": 10},
         2000: {"ant": 500, "bee": 450, "cat": 400, "dog": 350, "eel": 300}}
# (file format, images) -> (--label_offset, extra flags)
RUNS = {("array_record", 100): (0, ()), ("array_record", 2000): (1, ()),
        ("webdataset", 100): (1, ("--num_shards", "1")), ("webdataset", 2000): (0, ())}


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> dict[int, pathlib.Path]:
    out = {}
    for n, counts in SIZES.items():
        out[n] = tmp_path_factory.mktemp(f"tree{n}")
        make_tree(out[n], counts, size=(8, 8))
    return out


@pytest.fixture(scope="module")
def datasets(trees, tmp_path_factory) -> dict[tuple[str, int], pathlib.Path]:
    out = {}
    for (file_format, n), (offset, extra) in RUNS.items():
        folder = tmp_path_factory.mktemp(f"{file_format}{n}") / "ds"
        prepare_here("--input", str(trees[n]), "--output", str(folder), "--file_format", file_format,
                     "--image_size", "8", "--validation_percent", "10", "--label_offset", str(offset), *extra)
        out[file_format, n] = folder
    return out


def labels_txt(folder: pathlib.Path) -> list[str]:
    return (folder / "labels.txt").read_text().splitlines()


def num_examples(folder: pathlib.Path, split: str) -> int:
    return json.loads((folder / "manifest.json").read_text())["splits"][split]["num_examples"]


@pytest.mark.parametrize("file_format, n", list(RUNS), ids=[f"{f}-{n}" for f, n in RUNS])
def test_a_dataloader_with_two_workers_reads_every_image_once_an_epoch_with_labels_txt_labels(
        datasets, trees, file_format, n):
    folder = datasets[file_format, n]
    reader = "data_source" if file_format == "array_record" else "webdataset"
    names = labels_txt(folder)
    tree_files = sorted(p.relative_to(trees[n]).as_posix() for p in trees[n].rglob("*.jpg"))
    done = subprocess.run(child("torch_loaders", reader, str(folder)), cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["writable"]
    seen: list[str] = []
    for split, epochs in result["epochs"].items():
        first = epochs[0]
        assert len(first) == num_examples(folder, split)
        assert len({name for name, _ in first}) == len(first)  # each image once an epoch
        for name, label in first:
            assert names[label] == name.split("/")[0]  # the label indexes labels.txt, offset or not
        if split == "train":
            assert sorted(epochs[1]) == sorted(first)
            if reader == "data_source":
                assert epochs[1] != first  # a new order every epoch
        seen += [name for name, _ in first]
    assert sorted(seen) == tree_files  # every image of the tree, in one split or the other


def test_data_source_has_imagefolders_surface_without_decoding_an_image(datasets, monkeypatch):
    folder = datasets["array_record", 2000]  # --label_offset 1
    names = labels_txt(folder)
    source = beam_prep.data_source(folder, "train")
    records = [source[i] for i in range(0, len(source), 97)]
    assert source.classes == names and source.class_to_idx == {name: i for i, name in enumerate(names)}

    def no_decoding(*args, **kwargs):
        raise AssertionError("targets decoded an image")

    monkeypatch.setattr("beam_prep.reader.data_source.stored_image", no_decoding)
    fresh = beam_prep.data_source(folder, "train")
    targets, samples = fresh.targets, fresh.samples
    monkeypatch.undo()
    assert len(targets) == len(source) == len(samples)
    for i, record in zip(range(0, len(source), 97), records):
        assert targets[i] == record["label"] == names.index(record["label_text"])
        assert samples[i] == (record["filename"], record["label"])
    assert sorted(set(targets)) == list(range(len(names)))


def test_data_source_gives_pairs_pil_images_and_transforms_as_imagefolder_does(datasets):
    from PIL import Image

    folder = datasets["array_record", 100]
    plain = beam_prep.data_source(folder, "train")
    pairs = beam_prep.data_source(folder, "train", pairs=True, pil_images=True,
                                  transform=lambda img: (img.mode, np.asarray(img)),
                                  target_transform=lambda label: plain.classes[label])
    (mode, pixels), name = pairs[3]
    assert mode == "RGB" and name == plain[3]["label_text"]
    np.testing.assert_array_equal(pixels, plain[3]["image"])
    assert isinstance(beam_prep.data_source(folder, "train", pil_images=True)[0]["image"], Image.Image)
    image = plain[0]["image"]
    image += 1  # in-place augmentation: the array is the caller's own
    assert not np.array_equal(image, plain[0]["image"])


def test_webdataset_recipe_gives_data_source_labels_and_pixels_and_resamples_for_many_nodes(datasets):
    folder = datasets["webdataset", 100]  # --label_offset 1, one shard
    names = labels_txt(folder)
    validation = list(beam_prep.webdataset_pipeline(folder, "validation", with_meta=True))
    assert [meta["filename"] for _, _, meta in validation] == [
        meta["filename"] for _, _, meta in beam_prep.webdataset_pipeline(folder, "validation", with_meta=True)]
    for image, label, meta in validation:
        assert names[label] == meta["label_text"] and meta["label"] == label + 1  # stored ids keep the offset
        assert image.shape == (8, 8, 3) and image.flags.writeable
    endless = beam_prep.webdataset_pipeline(folder, "train", resampled=True).with_epoch(250)
    assert len(list(endless)) == 250


def test_readers_refuse_a_dataset_of_another_format_naming_it(datasets):
    with pytest.raises(DatasetError, match=r"holds array_record shards .*read it with beam_prep.data_source"):
        beam_prep.webdataset_pipeline(datasets["array_record", 100], "train")
    with pytest.raises(DatasetError, match=r"holds webdataset shards .*read it with beam_prep.webdataset_pipeline"):
        beam_prep.shard_urls(datasets["webdataset", 100], "train", "array_record")
    urls = beam_prep.shard_urls(datasets["webdataset", 2000], "validation")
    assert urls and all(pathlib.Path(u).is_file() and u.endswith(".tar") for u in urls)


def test_webdataset_orders_are_drawn_from_the_seed_and_epoch_whatever_the_workers(trees, tmp_path):
    """Epochs go 0, 1, 2 with persistent workers, workers started anew each epoch, or none, with
    set_epoch or without; each a new order holding every sample once, the same for the same seed
    and epoch; an epoch set while persistent workers run reaches them (a resumed training)."""
    folder = tmp_path / "ds"
    prepare_here("--input", str(trees[100]), "--output", str(folder), "--file_format", "webdataset",
                 "--image_size", "8", "--validation_percent", "0", "--num_shards", "4")
    done = subprocess.run(child("torch_loaders", "orders", str(folder)), cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    orders = json.loads(done.stdout.splitlines()[-1])
    every = sorted(p.relative_to(trees[100]).as_posix() for p in trees[100].rglob("*.jpg"))
    for setting, epochs in orders.items():
        assert all(sorted(epoch) == every for epoch in epochs), setting  # each sample once an epoch
    for workers in (0, 2):
        settings = [epochs for setting, epochs in orders.items() if setting.startswith(f"workers={workers} ")]
        assert len(settings) == (2 if workers == 0 else 4)
        assert all(epochs == settings[0] for epochs in settings), f"workers={workers}: the orders differ by setting"
        assert len({tuple(epoch) for epoch in settings[0]}) == 3, f"workers={workers}: an epoch repeats an order"
    assert orders["persistent, then set_epoch(5)"][0] == orders["workers=2 persistent=True set_epoch=False"][0]
    assert orders["persistent, then set_epoch(5)"][1] == orders["started anew at set_epoch(5)"][0]
    assert orders["seed=8"][0] != orders["workers=2 persistent=False set_epoch=False"][0]
