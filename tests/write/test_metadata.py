"""--metadata and --recursive end to end: datasets as they come (a flat folder and a labels
table, Hugging Face's metadata.jsonl, images nested under label folders), read back with
plain tf.data; and every bad table refused before any work, naming its file and line."""
from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import pytest
from helpers import assert_edited_table_refused, encode, make_tree, prepare_here, read_split
from lazy import tf
from PIL import Image

from beam_prep.reader import load_info, make_dataset
from beam_prep.tools import inspection, verification
from beam_prep.tools.summary import summarize
from beam_prep.write.images.examples import unknown_label_report
from beam_prep.write.plan.listing import list_tree
from pipelines import prepare_images

SIZE = 8
# ImageNet's validation set: one flat folder, the labels in a table beside it.
SYNSETS = ("n01440764", "n01443537", "n01484850")
VAL_LABELS = {f"ILSVRC2012_val_{i:08d}.JPEG": SYNSETS[(i * 7) % 3] for i in range(1, 13)}


def colour(i: int) -> tuple[int, int, int]:
    """A flat colour per image, so a record's pixels say which file it came from."""
    return (i * 20 % 256, 255 - i * 15 % 256, i * 40 % 256)


def write_images(root: pathlib.Path, names) -> dict[str, tuple[int, int, int]]:
    colours = {}
    for i, name in enumerate(names):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        colours[name] = colour(i)
        path.write_bytes(encode(Image.new("RGB", (12, 10), colours[name]), "PNG"))
    return colours


def prepare(*args: str) -> None:
    prepare_here(*args, "--image_size", str(SIZE), "--image_format", "png", "--overwrite")


@pytest.fixture(scope="module")
def imagenet_val(tmp_path_factory):
    """A flat folder of 12 images and 1 the table does not name, a CSV of 12 rows and one for a
    missing file, and the training folders' labels file (one label without validation images)."""
    root = tmp_path_factory.mktemp("val")
    colours = write_images(root / "val", [*VAL_LABELS, "ILSVRC2012_val_00000099.JPEG"])
    table = root / "LOC_val_solution.csv"
    rows = [f"{name},{label}" for name, label in VAL_LABELS.items()] + ["ILSVRC2012_val_00000050.JPEG,n01440764"]
    table.write_text("file_name,label\n" + "\n".join(rows) + "\n")
    labels_file = root / "synsets.txt"
    labels_file.write_text("\n".join(("n01430000",) + SYNSETS) + "\n")
    out = root / "out"
    prepare("--input", str(root / "val"), "--output", str(out), "--metadata", str(table),
            "--labels_file", str(labels_file), "--label_offset", "1", "--sink", "streaming")
    return out, colours


def test_a_flat_folder_takes_its_labels_from_the_table(imagenet_val):
    out, colours = imagenet_val
    records = read_split(out, "train")  # plain tf.data, not our reader
    names = ["n01430000", *SYNSETS]
    assert sorted(r["image/filename"].decode() for r in records) == sorted(VAL_LABELS)
    for r in records:
        name = r["image/filename"].decode()
        assert r["image/class/text"].decode() == VAL_LABELS[name]
        assert r["image/class/label"] == names.index(VAL_LABELS[name]) + 1  # --labels_file order, --label_offset
        pixels = tf.io.decode_png(r["image/encoded"]).numpy()
        assert (pixels == np.array(colours[name], np.uint8)).all(), name


def test_a_flat_folder_accounts_for_every_file_and_row(imagenet_val):
    out, _ = imagenet_val
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"] == {"listed": 13, "written": 12, "failed": 1, "skipped": 1}
    assert manifest["skipped_by_reason"] == {"image no --metadata row names": 1}
    assert manifest["splits"]["train"]["class_counts"] == {"n01430000": 0, "n01440764": 4, "n01443537": 4,
                                                           "n01484850": 4}
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert [s["relpath"] for s in skipped] == ["ILSVRC2012_val_00000099.JPEG"]
    (error,) = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert (error["relpath"], error["stage"], error["label"]) == ("ILSVRC2012_val_00000050.JPEG", "read",
                                                                  "n01440764")
    assert "multi_label" not in manifest and "extra_features" not in manifest
    assert manifest["options"]["metadata"].endswith("LOC_val_solution.csv")


CAPTIONED = {  # file_name -> (labels, caption, score): Hugging Face's imagefolder with metadata.jsonl
    "train/0001.png": (["cat", "dog"], "two animals", 0.5),
    "train/0002.png": (["dog"], "a dog, sitting", 1),
    "train/0003.png": (["bird", "cat"], "été", 2.25),
    "train/0004.png": (["bird"], "", -1.5),
    "test/0005.png": (["cat"], "a cat", 3),
    "test/0006.png": (["dog", "bird", "cat"], "all", 0.125),
}


@pytest.fixture(scope="module", params=["streaming", "shuffle"])
def captioned(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    colours = write_images(root / "data", CAPTIONED)
    lines = [json.dumps({"file_name": name, "labels": labels, "caption": caption, "score": score,
                         "split": name.split("/")[0]}, ensure_ascii=False)
             for name, (labels, caption, score) in CAPTIONED.items()]
    (root / "data" / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    out = root / "out"
    prepare("--input", str(root / "data"), "--output", str(out), "--metadata",
            str(root / "data" / "metadata.jsonl"), "--sink", request.param)
    return out, colours


def parse_all(out: pathlib.Path, split: str) -> list[dict]:
    """Every record of a split with its label lists and extra features, parsed by plain tf.data."""
    manifest = json.loads((out / "manifest.json").read_text())
    spec = {"image/filename": tf.io.FixedLenFeature([], tf.string),
            "image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.VarLenFeature(tf.int64),
            "image/class/text": tf.io.VarLenFeature(tf.string),
            "caption": tf.io.FixedLenFeature([], tf.string),
            "score": tf.io.FixedLenFeature([], tf.float32)}
    rows = []
    for shard in manifest["splits"][split]["shards"]:
        for serialized in tf.data.TFRecordDataset(str(out / shard), compression_type="GZIP"):
            parsed = tf.io.parse_single_example(serialized, spec)
            rows.append({key: (value.values.numpy().tolist() if isinstance(value, tf.SparseTensor)
                               else value.numpy()) for key, value in parsed.items()})
    return rows


def test_label_lists_and_fields_reach_every_record(captioned):
    out, colours = captioned
    labels = ["bird", "cat", "dog"]
    seen = []
    for split in ("train", "test"):
        for r in parse_all(out, split):
            name = r["image/filename"].decode()
            want_labels, caption, score = CAPTIONED[name]
            assert name.startswith(split)
            assert r["image/class/label"] == [labels.index(n) for n in want_labels]
            assert [t.decode() for t in r["image/class/text"]] == want_labels
            assert r["caption"].decode() == caption
            assert r["score"] == pytest.approx(score)
            assert (tf.io.decode_png(r["image/encoded"]).numpy() == np.array(colours[name], np.uint8)).all()
            seen.append(name)
    assert sorted(seen) == sorted(CAPTIONED)


def test_a_multi_label_manifest_lists_its_fields_and_counts(captioned):
    out, _ = captioned
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["multi_label"] is True
    assert manifest["extra_features"] == {"caption": "bytes", "score": "float"}
    assert manifest["features"]["caption"] == "bytes" and manifest["features"]["score"] == "float"
    assert manifest["counts"] == {"listed": 6, "written": 6, "failed": 0, "skipped": 1}  # metadata.jsonl itself
    assert manifest["splits"]["train"]["num_examples"] == 4
    assert manifest["splits"]["train"]["class_counts"] == {"bird": 2, "cat": 2, "dog": 2}
    assert manifest["splits"]["test"]["class_counts"] == {"bird": 1, "cat": 2, "dog": 1}
    info = load_info(str(out))
    assert (info.multi_label, dict(info.extra_features), info.labels) == (
        True, {"caption": "bytes", "score": "float"}, ("bird", "cat", "dog"))


def test_the_reader_gives_multi_hot_labels_and_the_fields(captioned):
    out, _ = captioned
    ds = make_dataset(str(out), "train", batch_size=3, training=False,
                      extra_keys=("image/filename", "caption", "score"))
    rows = []
    for images, labels, extra in ds:
        assert images.shape[1:] == (SIZE, SIZE, 3) and labels.dtype == tf.float32
        assert labels.shape[1:] == (3,)
        rows += zip(labels.numpy().tolist(), extra["image/filename"].numpy(), extra["caption"].numpy(),
                    extra["score"].numpy())
    assert len(rows) == 4
    for hot, name, caption, score in rows:
        want_labels, want_caption, want_score = CAPTIONED[name.decode()]
        assert hot == [float(n in want_labels) for n in ("bird", "cat", "dog")]
        assert caption.decode() == want_caption and score == pytest.approx(want_score)


def test_recursive_takes_the_top_folders_label(tmp_path):
    names = ["cat/a.png", "cat/2019/b.png", "cat/2019/x/c.png", "dog/d.png", "dog/old/e.png", "f.png"]
    write_images(tmp_path / "in", names)
    prepare("--input", str(tmp_path / "in"), "--output", str(tmp_path / "flat"))
    prepare("--input", str(tmp_path / "in"), "--output", str(tmp_path / "deep"), "--recursive")
    flat = json.loads((tmp_path / "flat" / "manifest.json").read_text())
    assert flat["counts"]["written"] == 2 and flat["skipped_by_reason"] == {"image outside the label folders": 4}
    deep = json.loads((tmp_path / "deep" / "manifest.json").read_text())
    assert deep["skipped_by_reason"] == {"image outside the label folders": 1}  # f.png: in no label folder
    records = {r["image/filename"].decode(): r["image/class/text"].decode()
               for r in read_split(tmp_path / "deep", "train")}
    assert records == {name: name.split("/")[0] for name in names[:-1]}


# --- refusals: before any work, exit 2, one line naming the table and the line ---------------


@pytest.fixture
def tree(tmp_path):
    make_tree(tmp_path / "in", {"a": 2}, size=(12, 10))
    return tmp_path / "in"


def refused(capsys, tree: pathlib.Path, name: str, text: str, *flags: str) -> str:
    table = tree.parent / name
    table.write_text(text)
    out = tree.parent / "out"
    assert prepare_images.main(["--input", str(tree), "--output", str(out), "--metadata", str(table),
                                *flags]) == 2
    assert not out.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err[len("error: "):].rstrip("\n").replace(str(table), "TABLE")


@pytest.mark.parametrize("name,text,message", [
    ("t.csv", "file_name,label\na/img_000.jpg,a,extra\n",
     "--metadata TABLE line 2 has 3 fields, but the header has 2: quote fields that hold the separator"),
    ("t.tsv", "file_name\tlabel\na/img_000.jpg\n",
     "--metadata TABLE line 2 has 1 fields, but the header has 2: give each row every column, an empty one as "
     "nothing between two tabs"),
    ("t.jsonl", '{"file_name": "a/img_000.jpg", "label": "a"}\n{"file_name": "a/img_001.jpg", "label": \n',
     "--metadata TABLE line 2 is not valid JSON (Expecting value, column 41): write one JSON object a line"),
    ("t.jsonl", '{"file_name": "a/img_000.jpg", "label": "a"}\n{"file_name": "a/img_001.jpg"}\n',
     "--metadata TABLE line 2 lacks label: give every row the same keys"),
    ("t.csv", "name,label\na/img_000.jpg,a\n",
     "--metadata TABLE line 1: no file_name column (columns: name, label): add one with each image's path "
     "under --input"),
    ("t.csv", "file_name,label,score\na/img_000.jpg,a,0.5\na/img_001.jpg,a,high\n",
     "--metadata TABLE line 3: column 'score' holds \"high\", but line 2 made it a number column (\"0.5\"): "
     "give a column values of one type"),
    ("t.jsonl", '{"file_name": "a/img_000.jpg", "n": 1}\n{"file_name": "a/img_001.jpg", "n": "2"}\n',
     "--metadata TABLE line 2: column 'n' holds \"2\", but line 1 made it an integer column (1): "
     "give a column values of one type"),
    ("t.csv", "file_name,label\na/img_000.jpg,a\na/img_001.jpg,a\n./a/img_000.jpg,b\n",
     "--metadata TABLE lines 2 and 4 both name 'a/img_000.jpg': keep one row per image"),
    ("t.csv", "file_name,label\n../secret.jpg,a\n",
     "--metadata TABLE line 2: file_name '../secret.jpg' leaves --input: give a path under --input"),
    ("t.csv", "file_name,label\na/../../x.jpg,a\n",
     "--metadata TABLE line 2: file_name 'a/../../x.jpg' leaves --input: give a path under --input"),
    ("t.csv", "file_name,label\n/etc/x.jpg,a\n",
     "--metadata TABLE line 2: file_name '/etc/x.jpg' is an absolute path: give the path under --input"),
    # a URL in a local run's table: refused as it would leave --input, so a local run never reads gs://
    ("t.csv", "file_name,label\na/img_000.jpg,a\ngs://bucket/x.jpg,a\n",
     "--metadata TABLE line 3: file_name 'gs://bucket/x.jpg' is an absolute path: give the path under --input"),
    ("t.csv", "file_name,label,labels\na/img_000.jpg,a,a\n",
     "--metadata TABLE line 1: both label and labels columns: keep label for one name a row, or labels for "
     "several"),
    ("t.csv", "file_name,label,split\na/img_000.jpg,a,holdout\n",
     "--metadata TABLE line 2: split \"holdout\" is not one of train, validation, val, test"),
    ("t.txt", "file_name,label\n", "--metadata TABLE must end in .csv, .tsv, .jsonl (CSV, TSV or JSON Lines)"),
])
def test_a_bad_table_is_refused_naming_its_line(capsys, tree, name, text, message):
    assert refused(capsys, tree, name, text) == message


def test_a_split_column_refuses_validation_percent(capsys, tree):
    assert refused(capsys, tree, "t.csv", "file_name,label,split\na/img_000.jpg,a,train\n",
                   "--validation_percent", "10") == (
        "--metadata TABLE has a split column, which puts each image in its split: drop --validation_percent")


def test_metadata_refuses_recursive(capsys, tree):
    assert refused(capsys, tree, "t.csv", "file_name,label\n", "--recursive") == (
        "--metadata names each image wherever it is: drop --recursive")


def test_a_missing_table_is_refused(capsys, tree):
    out = tree.parent / "out"
    assert prepare_images.main(["--input", str(tree), "--output", str(out), "--metadata",
                                str(tree.parent / "nope.csv")]) == 2
    assert capsys.readouterr().err == f"error: --metadata {tree.parent / 'nope.csv'} is not a file\n"
    assert not out.exists()


def test_an_empty_or_unlisted_label_is_an_error_of_its_file(tmp_path):
    """Not a refusal: the run goes on, and each such file is in errors.jsonl (stage label)."""
    write_images(tmp_path / "in", ["a.png", "b.png", "c.png"])
    (tmp_path / "t.csv").write_text("file_name,label\na.png,cat\nb.png,\nc.png,emu\n")
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    prepare("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--metadata",
            str(tmp_path / "t.csv"), "--labels_file", str(tmp_path / "labels.txt"))
    errors = {e["relpath"]: (e["stage"], e["message"]) for e in
              map(json.loads, (tmp_path / "out" / "errors.jsonl").read_text().splitlines())}
    assert errors == {
        "b.png": ("label", "it has no label: its --metadata row gives none (or it is not in a folder)"),
        "c.png": ("label", "label 'emu' is not in --labels_file")}
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counts"] == {"listed": 3, "written": 1, "failed": 2, "skipped": 0}


def test_a_resume_with_another_table_is_refused_naming_metadata(capsys, tmp_path):
    """An unfinished run's record keeps its table's sha256: the same path, edited since, is another run."""
    make_tree(tmp_path / "in", {"a": 2}, size=(12, 10))
    table = tmp_path / "t.csv"
    table.write_text("file_name,label\na/img_000.jpg,x\na/img_001.jpg,y\n")
    out = tmp_path / "out"
    argv = ["--input", str(tmp_path / "in"), "--output", str(out), "--metadata", str(table)]
    assert_edited_table_refused(capsys, argv, out, table,
                                lambda: table.write_text("file_name,label\na/img_000.jpg,y\na/img_001.jpg,x\n"))


def test_verify_and_inspect_read_a_multi_label_dataset(captioned):
    out, _ = captioned
    report = verification.verify(str(out))
    assert report.ok and report.problems == ()
    text = inspection.render_text(summarize(str(out)))
    assert "labels: multi-label, a list of ids a record, 1.7 labels a record on average" in text
    assert "extra features: caption (bytes), score (float)" in text
    as_json = inspection.to_json(summarize(str(out)))
    assert (as_json["multi_label"], as_json["label_cardinality"], as_json["extra_features"]) == (
        True, 10 / 6, {"caption": "bytes", "score": "float"})


def test_a_row_naming_a_pipe_leaves_it_skipped(tmp_path):
    """Reading a pipe could block forever: the walk passes over it, and a row naming it does not list it."""
    write_images(tmp_path / "in", ["a.png"])
    os.mkfifo(tmp_path / "in" / "pipe.png")
    (tmp_path / "t.csv").write_text("file_name,label\na.png,cat\npipe.png,cat\n")
    with list_tree(str(tmp_path / "in"), metadata=str(tmp_path / "t.csv")) as listing:
        assert [e.relpath for e in listing.entries()] == ["a.png"]
        assert listing.skipped == {"pipe.png": "not a regular file"}
        assert listing.listed == 1


def test_a_spreadsheets_byte_order_mark_is_not_part_of_the_first_column(tmp_path):
    write_images(tmp_path / "in", ["a.png"])
    (tmp_path / "t.csv").write_bytes("file_name,label\na.png,cat\n".encode("utf-8-sig"))
    with list_tree(str(tmp_path / "in"), metadata=str(tmp_path / "t.csv")) as listing:
        assert [(e.relpath, e.label) for e in listing.entries()] == [("a.png", "cat")]


def test_a_label_list_with_a_name_missing_from_labels_file_is_reported_whole(tmp_path):
    """A record holds all its labels or is not written: one unknown name reports the file, naming it."""
    write_images(tmp_path / "in", ["a.png", "b.png", "c.png"])
    (tmp_path / "t.jsonl").write_text('{"file_name": "a.png", "labels": ["cat", "dog"]}\n'
                                      '{"file_name": "b.png", "labels": ["cat", "emu", "yak"]}\n'
                                      '{"file_name": "c.png", "labels": []}\n')
    with list_tree(str(tmp_path / "in"), metadata=str(tmp_path / "t.jsonl"), labels=["cat", "dog"],
                   label_offset=1) as listing:
        entries = {e.relpath: e for e in listing.entries()}
        assert (listing.split_counts(), listing.unknown_labels) == ({"train": 1}, 2)
    assert entries["a.png"].label_ids == (1, 2)
    assert unknown_label_report(entries["b.png"])["message"] == "labels 'emu', 'yak' are not in --labels_file"
    assert unknown_label_report(entries["c.png"])["message"] == "its --metadata row gives no label"


@pytest.mark.parametrize("augment", [None, lambda image: tf.image.flip_left_right(image)])
def test_the_reader_gives_each_records_label_names_as_a_ragged_list(captioned, augment):
    """Batched at once, or per image after a user's augmentation: the names of a record's labels, each a list."""
    out, _ = captioned
    ds = make_dataset(str(out), "test", batch_size=2, training=False, augment=augment,
                      extra_keys=("image/filename", "image/class/text"))
    ((_, labels, extra),) = list(ds)
    names = [[n.decode() for n in row] for row in extra["image/class/text"].to_list()]
    files = [f.decode() for f in extra["image/filename"].numpy()]
    assert names == [CAPTIONED[f][0] for f in files]
    assert labels.numpy().tolist() == [[float(n in CAPTIONED[f][0]) for n in ("bird", "cat", "dog")] for f in files]
