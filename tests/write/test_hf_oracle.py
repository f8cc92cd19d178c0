"""Hugging Face's own loader as the oracle: each imagefolder layout of its documentation, and our
recipes, read by ``datasets.load_dataset("imagefolder")`` and by beam-prep (both sinks), must
agree on every image: whether it is in, its split, its label (name and id) and every column's
value and type.

Where beam-prep differs on purpose, the difference is named here and on the labels-tables page:

* ``VAL_KEPT``: a ``val`` folder stays split ``val`` (Hugging Face renames it ``validation``);
* ``FLOAT32``: numbers are stored as float32 (Hugging Face keeps float64);
* ``BOOL_AS_INT64``: booleans are stored as int64 0/1 (a record has no bool type);
* ``FOLDER_LABELS``: a table without a label column beside class folders keeps the folders'
  labels (Hugging Face infers none where it finds a table: its read of the same tree without
  the tables gives the labels we keep, its read with them the columns we keep);
* ``LABEL_IDS``: a table's label names get ids as folder labels do, the names of every split
  sorted (Hugging Face keeps a table's labels as strings: cast to its ``ClassLabel`` of those
  names, they get the same ids).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import struct

import numpy as np
import pytest
from helpers import prepare_here
from PIL import Image

from beam_prep.model import features

pytestmark = pytest.mark.slow

VAL_KEPT = {"validation": "val"}  # Hugging Face's split name -> ours, for a folder named val
FLOAT32 = np.float32
BOOL_AS_INT64 = int

_colours = iter(range(1, 10_000))


def image(path: pathlib.Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    i = next(_colours)
    Image.new("RGB", (6, 5), (i * 37 % 256, i * 91 % 256, i * 13 % 256)).save(path)


def jsonl(path: pathlib.Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def per_split_jsonl(root: pathlib.Path) -> None:
    """Hugging Face's documented layout: a metadata.jsonl in each split folder, file_name relative to
    it; a label column, text, booleans, numbers; a backslash separator; an image no row names."""
    rows = {
        "train": [{"file_name": "a.png", "label": "cat", "text": "a cat, sitting", "ok": True, "score": 0.1, "n": 3},
                  {"file_name": "b.png", "label": "dog", "text": "été", "ok": False, "score": 2.5, "n": -1},
                  {"file_name": "sub\\c.png", "label": "emu", "text": "", "ok": True, "score": -1.0, "n": 0}],
        "val": [{"file_name": "d.png", "label": "dog", "text": "d", "ok": False, "score": 1e-3, "n": 7}],
        "test": [{"file_name": "./e.png", "label": "cat", "text": "e\"quoted\"", "ok": True, "score": 3.0, "n": 2}],
    }
    for split, split_rows in rows.items():
        for row in split_rows:
            image(root / split / row["file_name"].replace("\\", "/"))
        jsonl(root / split / "metadata.jsonl", split_rows)
    image(root / "train" / "unnamed.png")


def per_split_csv(root: pathlib.Path) -> None:
    """The same in CSV: an image_file_name column, True/False, quoted fields, numbers."""
    tables = {
        "train": 'image_file_name,label,caption,flag,score,n\na.png,cat,"one, two",True,0.5,1\n'
                 'b.png,dog,"say ""hi""",False,1.25,2\nsub\\c.png,cat,plain,TRUE,2,3\n',
        "test": 'image_file_name,label,caption,flag,score,n\nd.png,dog,x,false,-0.5,4\n',
    }
    for split, text in tables.items():
        for line in text.splitlines()[1:]:
            image(root / split / line.split(",")[0].replace("\\", "/"))
        (root / split / "metadata.csv").write_text(text, encoding="utf-8")


def folders_and_tables(root: pathlib.Path) -> None:
    """Class folders below each split folder and a table in each split without a label column."""
    for split, names in (("train", ["cat/a.png", "dog/b.png", "dog/c.png"]), ("test", ["cat/d.png", "emu/e.png"])):
        for i, name in enumerate(names):
            image(root / split / name)
        jsonl(root / split / "metadata.jsonl", [{"file_name": name, "text": f"{split} {i}"}
                                                for i, name in enumerate(names)])


def multi_label(root: pathlib.Path) -> None:
    """A label list a row, in each split's JSON Lines table."""
    rows = {"train": [{"file_name": "a.png", "labels": ["cat", "dog"]}, {"file_name": "b.png", "labels": ["emu"]}],
            "test": [{"file_name": "c.png", "labels": ["dog", "cat", "emu"]}]}
    for split, split_rows in rows.items():
        for row in split_rows:
            image(root / split / row["file_name"])
        jsonl(root / split / "metadata.jsonl", split_rows)


def flat_with_table(root: pathlib.Path) -> None:
    """Our ImageNet-validation recipe: one flat folder, a root table of file_name,label (--metadata).
    (Not ImageNet's own names: Hugging Face puts a file whose name holds ``val`` in its validation split.)"""
    names = {f"ILSVRC2012_{i:08d}.JPEG": ("n01", "n02", "n03")[i % 3] for i in range(1, 7)}
    for name in names:
        path = root / name
        image(path.with_suffix(".png"))
        path.with_suffix(".png").rename(path)  # a PNG named .JPEG: decoded by its bytes, as ImageNet's CMYK ones
    (root / "metadata.csv").write_text("file_name,label\n" + "".join(f"{n},{label}\n" for n, label in names.items()))


def captions(root: pathlib.Path) -> None:
    """Hugging Face's image-captioning layout: a table in each split of file_name, text and a score,
    no label column and no label folder: a dataset without labels."""
    rows = {"train": [{"file_name": "a.png", "text": "a red square", "score": 0.5},
                      {"file_name": "b.png", "text": "two, then three", "score": 1.0}],
            "test": [{"file_name": "c.png", "text": "nothing", "score": -2.0}]}
    for split, split_rows in rows.items():
        for row in split_rows:
            image(root / split / row["file_name"])
        jsonl(root / split / "metadata.jsonl", split_rows)


def flat_captions(root: pathlib.Path) -> None:
    """The same in one flat folder, its table at the root (--metadata: a root table is named)."""
    for name in ("a.png", "b.png"):
        image(root / name)
    (root / "metadata.csv").write_text('file_name,text\na.png,"a, b"\nb.png,c\n')


LAYOUTS = {"per_split_jsonl": per_split_jsonl, "per_split_csv": per_split_csv,
           "folders_and_tables": folders_and_tables, "multi_label": multi_label, "flat_with_table": flat_with_table,
           "captions": captions, "flat_captions": flat_captions}
# A table at the root is read with --metadata, Hugging Face finds it itself.
ROOT_TABLES = ("flat_with_table", "flat_captions")


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    """Each layout read by Hugging Face's loader, offline, its caches under the test's folder."""
    home = tmp_path_factory.mktemp("hf-home")
    os.environ.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HOME=str(home))
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    root = tmp_path_factory.mktemp("layouts")
    views = {}
    for name, make in LAYOUTS.items():
        make(root / name)
        views[name] = hf_view(datasets, root / name, str(home / "cache"))
    # Hugging Face infers no folder label where it finds a table, drop_metadata=True or not: its
    # labels for the same tree come from a copy without the tables.
    shutil.copytree(root / "folders_and_tables", root / "no_tables", ignore=shutil.ignore_patterns("metadata.*"))
    views["folders_and_tables/no_tables"] = hf_view(datasets, root / "no_tables", str(home / "cache"))
    return root, views


def hf_view(datasets, data_dir: pathlib.Path, cache: str, **config) -> dict:
    """relpath -> (split, label name(s), label id(s), {column: value}), and column -> its type."""
    loaded = datasets.load_dataset("imagefolder", data_dir=str(data_dir), cache_dir=cache, **config)
    names: list[str] = []
    label_feature = next(iter(loaded.values())).features.get("label")
    if isinstance(label_feature, datasets.Value):  # a table's label column: LABEL_IDS, a ClassLabel of every split's names
        label_feature = datasets.ClassLabel(names=sorted({n for part in loaded.values() for n in part["label"]}))
        loaded = loaded.cast_column("label", label_feature)
    if isinstance(label_feature, datasets.ClassLabel):
        names = label_feature.names
    rows, types = {}, {}
    for split, ds in loaded.items():
        ds = ds.cast_column("image", datasets.Image(decode=False))
        for key, feature in ds.features.items():
            types[key] = getattr(feature, "dtype", type(feature).__name__)
        for row in ds:
            relpath = os.path.relpath(row.pop("image")["path"], data_dir).replace(os.sep, "/")
            label = row.pop("label", None)
            labels = row.pop("labels", None)
            if labels is not None:
                all_names = sorted({n for part in loaded.values() for ls in part["labels"] for n in ls})
                label_view = (tuple(labels), tuple(all_names.index(n) for n in labels))
            elif label is not None:
                label_view = (names[label], label)
            else:
                label_view = (None, None)
            rows[relpath] = (split, *label_view, row)
    return {"rows": rows, "types": types}


@pytest.fixture(scope="module", params=["streaming", "shuffle"])
def ours(request, hf, tmp_path_factory):
    """Each layout read by beam-prep with one sink: one run a layout, in this process (what a run
    writes is what is compared; the command's own processes are tested elsewhere)."""
    root, _ = hf
    out = tmp_path_factory.mktemp(f"ours-{request.param}")
    views = {}
    for name in LAYOUTS:
        flags = ("--metadata", str(root / name / "metadata.csv")) if name in ROOT_TABLES else ()
        prepare_here("--input", str(root / name), "--output", str(out / name), "--image_size", "4",
                     "--image_format", "png", "--compression", "none", "--sink", request.param, *flags)
        views[name] = our_view(out / name)
    return views


def tfrecords(path: pathlib.Path):
    """The payloads of an uncompressed TFRecord file, by its framing (length, crc, data, crc)."""
    data = path.read_bytes()
    at = 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        yield data[at + 12:at + 12 + length]
        at += 12 + length + 4


def our_view(out: pathlib.Path) -> dict:
    manifest = json.loads((out / "manifest.json").read_text())
    extra = manifest.get("extra_features", {})
    rows = {}
    for split, info in manifest["splits"].items():
        for shard in info["shards"]:
            for payload in tfrecords(out / shard):
                record = features.decode_all(payload)
                relpath = record[features.FILENAME][0].decode()
                if not manifest["labels"]:  # a dataset without labels: its records hold none
                    assert features.LABEL not in record and features.LABEL_TEXT not in record
                    label = (None, None)
                else:
                    texts = tuple(t.decode() for t in record[features.LABEL_TEXT])
                    ids = tuple(record[features.LABEL])
                    label = (texts, ids) if manifest.get("multi_label") else (texts[0], ids[0])
                columns = {key: (v[0].decode() if kind == "bytes" else v[0])
                           for key, kind in extra.items() for v in [record[key]]}
                assert relpath not in rows, f"{relpath} written twice"
                rows[relpath] = (split, *label, columns)
    return {"rows": rows, "types": extra, "manifest": manifest, "path": out}


# Hugging Face's column types -> ours (BOOL_AS_INT64, FLOAT32).
TYPES = {"string": "bytes", "large_string": "bytes", "int64": "int64", "bool": "int64", "float64": "float"}


def assert_same(hf_rows: dict, ours_rows: dict, *, split_names: dict | None = None) -> None:
    """Every image in both or neither, in the same split, with the same label and column values."""
    assert sorted(ours_rows) == sorted(hf_rows)
    for relpath, (split, label, label_id, columns) in hf_rows.items():
        want = (VAL_KEPT.get(split, split) if (split_names or {}).get(split) else split, label, label_id)
        assert ours_rows[relpath][:3] == want, relpath
        got = ours_rows[relpath][3]
        assert sorted(got) == sorted(columns), relpath
        for key, value in columns.items():
            if isinstance(value, bool):
                assert got[key] == BOOL_AS_INT64(value) and type(got[key]) is int, (relpath, key)
            elif isinstance(value, float):
                assert FLOAT32(got[key]) == FLOAT32(value), (relpath, key)
            else:
                assert got[key] == value, (relpath, key)


def assert_types(hf_types: dict, ours_types: dict) -> None:
    columns = {key: value for key, value in hf_types.items() if key not in ("image", "label", "labels")}
    assert ours_types == {key: TYPES[value] for key, value in columns.items()}


@pytest.mark.parametrize("layout", ["per_split_jsonl", "per_split_csv", "multi_label", "flat_with_table", "captions",
                                    "flat_captions"])
def test_each_image_split_label_and_column_as_hugging_face_reads_them(hf, ours, layout):
    _, hf_views = hf
    assert_same(hf_views[layout]["rows"], ours[layout]["rows"], split_names=VAL_KEPT)
    assert_types(hf_views[layout]["types"], ours[layout]["types"])


def test_val_is_kept_as_its_own_split_name(hf, ours):
    """VAL_KEPT: the one split name Hugging Face changes."""
    _, hf_views = hf
    assert {row[0] for row in hf_views["per_split_jsonl"]["rows"].values()} == {"train", "validation", "test"}
    assert list(ours["per_split_jsonl"]["manifest"]["splits"]) == ["train", "val", "test"]


def test_an_image_no_row_names_is_out_of_both_and_skipped_by_name(hf, ours):
    _, hf_views = hf
    assert "train/unnamed.png" not in hf_views["per_split_jsonl"]["rows"]
    manifest = ours["per_split_jsonl"]["manifest"]
    assert manifest["skipped_by_reason"] == {"image no --metadata row names": 1, "not an image file": 3}


def test_folder_labels_beside_tables_are_hugging_faces_labels_of_the_folders(hf, ours):
    """FOLDER_LABELS: our labels are Hugging Face's read of the folders alone, our columns its read with the tables.
    (The folders alone, split/label/image without tables, are Hugging Face's layout of inferred labels.)"""
    _, hf_views = hf
    default, dropped = hf_views["folders_and_tables"], hf_views["folders_and_tables/no_tables"]
    assert {row[1] for row in default["rows"].values()} == {None}  # Hugging Face: no label beside a table
    combined = {relpath: (split, *dropped["rows"][relpath][1:3], columns)
                for relpath, (split, _, _, columns) in default["rows"].items()}
    assert_same(combined, ours["folders_and_tables"]["rows"])
    assert_types(default["types"], ours["folders_and_tables"]["types"])


def test_a_dataset_without_labels_reads_back_as_images_and_columns(hf, ours):
    """make_dataset yields what there is (images, and the columns asked for); inspect and verify read it."""
    import tensorflow as tf

    from beam_prep.reader import load_info, make_dataset
    from beam_prep.tools import inspection, verification
    from beam_prep.tools.summary import summarize

    if ours["captions"]["manifest"]["sink"] != "streaming":
        pytest.skip("the reader reads what either sink wrote alike: checked once")
    _, hf_views = hf
    out = str(ours["captions"]["path"])
    info = load_info(out)
    assert (info.labels, info.num_classes, dict(info.extra_features)) == ((), 0, {"text": "bytes", "score": "float"})
    assert "image/class/label" not in ours["captions"]["manifest"]["features"]
    got = {}
    for split in ("train", "test"):
        for images, extra in make_dataset(out, split, batch_size=1, training=False,
                                          extra_keys=("image/filename", "text", "score")):
            assert images.shape == (1, 4, 4, 3) and images.dtype == tf.uint8
            got[extra["image/filename"][0].numpy().decode()] = (split, extra["text"][0].numpy().decode(),
                                                               float(extra["score"][0].numpy()))
    assert got == {relpath: (split, columns["text"], columns["score"])
                   for relpath, (split, _, _, columns) in hf_views["captions"]["rows"].items()}
    (only,) = list(make_dataset(out, "test", batch_size=1, training=False))  # no extra_keys: the images alone
    assert isinstance(only, tf.Tensor) and only.shape == (1, 4, 4, 3)
    text = inspection.render_text(summarize(out))
    assert "no labels, 3 examples" in text and "classes: none (a dataset without labels)" in text
    report = verification.verify(out)
    assert report.ok and report.problems == ()


def test_a_dataset_without_labels_reads_through_data_source_as_dicts_of_images_and_columns(tmp_path):
    """Grain's and PyTorch's reader on a captioning layout: every image once, no label keys; pairs and
    targets, which need labels, refused with what to do."""
    pytest.importorskip("array_record")
    from beam_prep import data_source
    from beam_prep.errors import DatasetError

    captions(tmp_path / "tree")
    out = tmp_path / "out"
    prepare_here("--input", str(tmp_path / "tree"), "--output", str(out), "--image_size", "4",
                 "--file_format", "array_record")
    source = data_source(out, "train")
    items = [source[i] for i in range(len(source))]
    assert len(items) == len(source) > 0
    assert all("label" not in item and "label_text" not in item and item["image"].shape == (4, 4, 3)
               for item in items)
    assert len({item["filename"] for item in items}) == len(items)
    assert source.classes == [] and source.class_to_idx == {}
    with pytest.raises(DatasetError, match="without labels: it has no targets"):
        source.targets  # noqa: B018 - the property is what is tested
    with pytest.raises(DatasetError, match="without labels: read its items as dicts"):
        data_source(out, "train", pairs=True)


@pytest.mark.parametrize("sink", ["streaming", "shuffle"])
@pytest.mark.parametrize("file_format", ["tfrecord", "array_record", "webdataset"])
def test_a_dataset_without_labels_counts_its_samples_and_reads_back_in_each_format_and_sink(
        tmp_path, file_format, sink):
    """The captioning layout in every format through either sink: every shard's count is its samples
    (the shuffle sink counts them after writing: a WebDataset sample has no cls here), each format's
    reader gives every image without a label, verify finds nothing wrong and bench counts images."""
    from beam_prep.tools import verification
    from beam_prep.tools.throughput import measure_reader

    if file_format == "array_record":
        pytest.importorskip("array_record")
    if file_format == "webdataset":
        pytest.importorskip("webdataset")
    captions(tmp_path / "tree")
    out = tmp_path / "out"
    prepare_here("--input", str(tmp_path / "tree"), "--output", str(out), "--image_size", "4",
                 "--file_format", file_format, "--sink", sink)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["labels"] == [] and manifest["sink"] == sink
    expected = {"train": {"train/a.png", "train/b.png"}, "test": {"test/c.png"}}
    for split, names in expected.items():
        info = manifest["splits"][split]
        assert info["num_examples"] == sum(info["shard_num_examples"]) == len(names), (split, info)
        assert read_without_labels(out, split, file_format) == names
    report = verification.verify(str(out))
    assert report.ok and report.problems == (), report.problems
    batches: list[int] = []  # bench counts images, not labels
    measure_reader(str(out), "train", batch_size=3, training=False, seconds=0, warmup_seconds=0,
                   progress=batches.append)
    assert batches == [2 if file_format == "webdataset" else 3]  # WebDataset's batches end with each pass


def read_without_labels(out: pathlib.Path, split: str, file_format: str) -> set[str]:
    """The file names of a split as its format's reader gives them, each item checked to hold an
    image and no label."""
    import beam_prep

    if file_format == "tfrecord":
        batches = list(beam_prep.make_dataset(str(out), split, batch_size=1, training=False,
                                              extra_keys=("image/filename",)))
        assert all(images.shape == (1, 4, 4, 3) and set(extra) == {"image/filename"} for images, extra in batches)
        return {extra["image/filename"][0].numpy().decode() for _, extra in batches}
    if file_format == "array_record":
        items = list(beam_prep.data_source(out, split))
        assert all(set(item) == {"image", "filename", "sha256"} and item["image"].shape == (4, 4, 3)
                   for item in items)
        return {item["filename"] for item in items}
    images = list(beam_prep.webdataset_pipeline(out, split))
    assert images and all(image.shape == (4, 4, 3) for image in images)  # images alone, no label
    with_meta = list(beam_prep.webdataset_pipeline(out, split, with_meta=True))
    assert len(with_meta) == len(images)
    assert all(image.shape == (4, 4, 3) and "label" not in meta and "label_text" not in meta
               for image, meta in with_meta)
    return {meta["filename"] for _, meta in with_meta}
