"""Hugging Face's imagefolder tables, listed without a pipeline: a table in each split folder
found without a flag, ``file_name`` relative to its own table, labels from the folders below
the split folder, booleans and ``\\`` separators as Hugging Face reads them; and every layout
that would mix splits silently refused before any work, naming what to do.

The runs against Hugging Face's own loader are in test_hf_oracle.py.
"""
from __future__ import annotations

import io
import json
import pathlib
import tarfile

import pytest
from helpers import assert_edited_table_refused
from PIL import Image

from beam_prep.model import features
from beam_prep.model.features import NO_LABEL
from beam_prep.write.plan.listing import SKIP_NO_ROW, SKIP_NOT_IMAGE, list_tree
from beam_prep.write.shared.shard_formats import shard_format
from pipelines import prepare_images


def images(root: pathlib.Path, *names: str) -> None:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (4, 4), (9, 9, 9)).save(path)


def jsonl(path: pathlib.Path, *rows: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def listed(root: pathlib.Path, **kwargs) -> dict[str, tuple]:
    """relpath -> (split, label, label_id, extra) of every listed image."""
    with list_tree(str(root), **kwargs) as listing:
        return {e.relpath: (e.split, e.label, e.label_id, e.extra) for e in listing.entries()}


def test_a_table_in_each_split_folder_is_found_without_a_flag(tmp_path):
    images(tmp_path, "train/a.png", "train/b.png", "test/c.png", "val/d.png", "train/stray.png")
    for split, names in (("train", ["a.png", "b.png"]), ("test", ["c.png"]), ("val", ["d.png"])):
        jsonl(tmp_path / split / "metadata.jsonl",
              *({"file_name": name, "label": name[0], "score": 1} for name in names))
    with list_tree(str(tmp_path)) as listing:
        entries = {e.relpath: (e.split, e.label, e.extra) for e in listing.entries()}
        assert listing.splits == ["train", "val", "test"]
        assert listing.skipped == {"train/stray.png": SKIP_NO_ROW, "test/metadata.jsonl": SKIP_NOT_IMAGE,
                                   "train/metadata.jsonl": SKIP_NOT_IMAGE, "val/metadata.jsonl": SKIP_NOT_IMAGE}
    assert entries == {"train/a.png": ("train", "a", {"score": 1}), "train/b.png": ("train", "b", {"score": 1}),
                       "test/c.png": ("test", "c", {"score": 1}), "val/d.png": ("val", "d", {"score": 1})}


def test_without_a_label_column_labels_are_the_folders_below_the_split_folder(tmp_path):
    images(tmp_path, "train/cat/a.png", "train/dog/b.png", "test/cat/c.png")
    (tmp_path / "train").joinpath("metadata.csv").write_text("file_name,caption\ncat/a.png,one\ndog/b.png,two\n")
    (tmp_path / "test").joinpath("metadata.csv").write_text("file_name,caption\ncat/c.png,three\n")
    assert listed(tmp_path) == {"train/cat/a.png": ("train", "cat", 0, {"caption": "one"}),
                                "train/dog/b.png": ("train", "dog", 1, {"caption": "two"}),
                                "test/cat/c.png": ("test", "cat", 0, {"caption": "three"})}


def test_a_table_without_labels_over_images_in_no_label_folder_is_a_dataset_without_labels(tmp_path):
    """Hugging Face's image-captioning layout: images and their columns, no label at all."""
    images(tmp_path, "train/a.png", "train/b.png", "test/c.png")
    jsonl(tmp_path / "train" / "metadata.jsonl", {"file_name": "a.png", "text": "one"},
          {"file_name": "b.png", "text": "two"})
    jsonl(tmp_path / "test" / "metadata.jsonl", {"file_name": "c.png", "text": "three"})
    with list_tree(str(tmp_path)) as listing:
        assert (listing.unlabelled, listing.labels, listing.split_counts(), listing.unknown_labels) == (
            True, [], {"train": 2, "test": 1}, 0)
        entries = {e.relpath: (e.split, e.label_id, e.extra) for e in listing.entries()}
    assert entries == {"train/a.png": ("train", NO_LABEL, {"text": "one"}),
                       "train/b.png": ("train", NO_LABEL, {"text": "two"}),
                       "test/c.png": ("test", NO_LABEL, {"text": "three"})}
    unlabelled = features.ImageRecord(b"x", "png", 1, 1, 3, NO_LABEL, "", "train/a.png", "0" * 64,
                                      extra={"text": "one"})
    record = features.decode_all(features.encode_example(unlabelled))
    assert features.LABEL not in record and features.LABEL_TEXT not in record and record["text"] == [b"one"]
    assert features.LABEL not in features.decode_example(features.encode_example(unlabelled))
    with tarfile.open(fileobj=io.BytesIO(shard_format("webdataset").payload(unlabelled, 1))) as tar:
        members = {m.name.rsplit(".", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers()}
    assert sorted(members) == ["json", "png"]  # no .cls
    assert "label" not in json.loads(members["json"])


def test_some_images_in_label_folders_make_the_others_label_errors(tmp_path):
    """Labelled once any image is in a label folder: those in none are reported, not written unlabelled."""
    images(tmp_path, "cat/a.png", "b.png")
    (tmp_path / "t.csv").write_text("file_name,text\ncat/a.png,x\nb.png,y\n")
    with list_tree(str(tmp_path), metadata=str(tmp_path / "t.csv")) as listing:
        assert (listing.unlabelled, listing.labels, listing.unknown_labels) == (False, ["cat"], 1)


def test_a_root_table_with_a_split_column_takes_labels_below_the_split_folder(tmp_path):
    images(tmp_path / "in", "train/cat/a.png", "test/dog/b.png")
    table = tmp_path / "t.csv"
    table.write_text("file_name,split\ntrain/cat/a.png,train\ntest/dog/b.png,test\n")
    assert listed(tmp_path / "in", metadata=str(table)) == {"train/cat/a.png": ("train", "cat", 0, {}),
                                                            "test/dog/b.png": ("test", "dog", 1, {})}


def test_booleans_are_int64_zero_and_one_in_every_format_and_backslashes_are_separators(tmp_path):
    images(tmp_path, "train/sub/a.png", "train/sub/b.png", "test/sub/c.png", "test/sub/d.png")
    (tmp_path / "train" / "metadata.csv").write_text("file_name,label,ok\nsub\\a.png,x,True\nsub\\b.png,x,false\n")
    (tmp_path / "test" / "metadata.csv").write_text("file_name,label,ok\nsub/c.png,x,TRUE\n.\\sub\\d.png,x,False\n")
    got = {name: extra["ok"] for name, (_, _, _, extra) in listed(tmp_path).items()}
    assert got == {"train/sub/a.png": 1, "train/sub/b.png": 0, "test/sub/c.png": 1, "test/sub/d.png": 0}
    assert all(type(v) is int for v in got.values())
    jsonl(tmp_path / "j" / "t.jsonl", {"file_name": "sub\\a.png", "label": "x", "ok": True},
          {"file_name": "sub/b.png", "label": "x", "ok": False})
    images(tmp_path / "j", "sub/a.png", "sub/b.png")
    with list_tree(str(tmp_path / "j"), metadata=str(tmp_path / "j" / "t.jsonl")) as listing:
        assert {e.relpath: e.extra["ok"] for e in listing.entries()} == {"sub/a.png": 1, "sub/b.png": 0}
        assert listing.extra_features == {"ok": "int64"}


def test_a_lone_star_file_name_column_is_the_image(tmp_path):
    images(tmp_path, "train/a.png")
    jsonl(tmp_path / "train" / "metadata.jsonl", {"image_file_name": "a.png", "label": "x"})
    assert listed(tmp_path) == {"train/a.png": ("train", "x", 0, {})}


def test_an_integer_column_in_one_split_and_a_number_column_in_another_is_a_number_column(tmp_path):
    images(tmp_path, "train/a.png", "test/b.png")
    jsonl(tmp_path / "train" / "metadata.jsonl", {"file_name": "a.png", "label": "x", "score": 1})
    jsonl(tmp_path / "test" / "metadata.jsonl", {"file_name": "b.png", "label": "x", "score": 0.5})
    got = listed(tmp_path)
    assert got["train/a.png"][3] == {"score": 1.0} and type(got["train/a.png"][3]["score"]) is float
    assert got["test/b.png"][3] == {"score": 0.5}


# --- refusals: exit 2, nothing created, one line saying what to do ---------------------------


def refused(capsys, root: pathlib.Path, *flags: str) -> str:
    out = root.parent / "out"
    assert prepare_images.main(["--input", str(root), "--output", str(out), *flags]) == 2
    assert not out.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err[len("error: "):].rstrip("\n").replace(str(root.parent), "TMP")


def test_a_root_table_beside_split_folders_without_a_split_column_is_refused(capsys, tmp_path):
    images(tmp_path / "in", "train/a.png", "test/b.png")
    jsonl(tmp_path / "in" / "metadata.jsonl", {"file_name": "train/a.png", "text": "x"},
          {"file_name": "test/b.png", "text": "y"})
    assert refused(capsys, tmp_path / "in", "--metadata", str(tmp_path / "in" / "metadata.jsonl")) == (
        "--metadata TMP/in/metadata.jsonl line 2 names 'test/b.png', in split folder test, but has no split "
        "column: add a split column, or put a metadata.jsonl or metadata.csv in each split folder")


def test_a_split_folder_without_a_table_beside_one_with_is_refused(capsys, tmp_path):
    images(tmp_path / "in", "train/a.png", "test/b.png")
    jsonl(tmp_path / "in" / "train" / "metadata.jsonl", {"file_name": "a.png", "label": "x"})
    assert refused(capsys, tmp_path / "in") == (
        "TMP/in/test holds images (test/b.png, ...) but no metadata.jsonl or metadata.csv, where train has one: "
        "put a table in each split folder")


@pytest.mark.parametrize("setup,flags,message", [
    ({"train/metadata.jsonl": '{"file_name": "a.png", "label": "x"}\n',
      "train/metadata.csv": "file_name,label\na.png,x\n"}, (),
     "TMP/in/train holds metadata.jsonl and metadata.csv: keep one table a split folder"),
    ({"train/metadata.parquet": "PAR1"}, (),
     "TMP/in/train/metadata.parquet: beam-prep reads CSV, TSV and JSON Lines tables: save it as metadata.jsonl "
     "or metadata.csv"),
    ({"train/metadata.jsonl": '{"file_name": "a.png", "label": "x"}\n'}, ("--validation_percent", "10"),
     "TMP/in already has split folders (train), each with its table; drop --validation_percent"),
    ({"train/metadata.jsonl": '{"file_name": "a.png", "label": "x"}\n', "../t.csv": "file_name,label\n"},
     ("--metadata", "TMP/t.csv"),
     "--metadata TMP/t.csv given, but TMP/in/train/metadata.jsonl also found: drop --metadata to read the "
     "table in each split folder, or remove those"),
    ({"train/metadata.jsonl": '{"file_name": "a.png", "label": "x", "split": "test"}\n'}, (),
     '--metadata TMP/in/train/metadata.jsonl line 1: split "test" in the table of split folder train: move the '
     "row to test's table, or drop the column"),
    ({"train/metadata.jsonl": '{"file_name": "../a.png", "label": "x"}\n'}, (),
     "--metadata TMP/in/train/metadata.jsonl line 1: file_name '../a.png' leaves its split folder train: give a "
     "path under its split folder train"),
    ({"train/metadata.jsonl": '{"file_name": "a.png", "label": "x"}\n',
      "test/metadata.jsonl": '{"file_name": "b.png", "labels": ["x"]}\n'}, (),
     "--metadata TMP/in/train/metadata.jsonl has columns file_name, label where TMP/in/test/metadata.jsonl has "
     "file_name, labels: give each split's table the same columns"),
    ({"train/metadata.jsonl": '{"file_name": "a.png", "label": "x", "n": 1}\n',
      "test/metadata.jsonl": '{"file_name": "b.png", "label": "x", "n": "one"}\n'}, (),
     "--metadata TMP/in/train/metadata.jsonl makes column 'n' an integer column where TMP/in/test/metadata.jsonl "
     "makes it a string column: give a column values of one type"),
    ({"train/metadata.jsonl": '{"file_name": "a.png", "other_file_name": "b.png", "label": "x"}\n'}, (),
     "--metadata TMP/in/train/metadata.jsonl line 1: image columns file_name, other_file_name: a record holds one "
     "image; keep one file_name column (and store other paths under a name not ending in _file_name)"),
    ({"train/metadata.csv": "file_name,label\na.png,\n"}, (),
     "--metadata TMP/in/train/metadata.csv gives no label on any row: fill its label column, or drop it for a "
     "dataset without labels"),
], ids=["two-tables", "parquet", "validation-percent", "metadata-and-split-tables", "split-column-elsewhere",
        "leaves-its-folder", "other-columns", "other-types", "two-images", "empty-labels"])
def test_tables_that_cannot_be_read_as_one_are_refused(capsys, tmp_path, setup, flags, message):
    images(tmp_path / "in", "train/a.png", "test/b.png")
    for name, text in setup.items():
        path = tmp_path / "in" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    flags = tuple(flag.replace("TMP", str(tmp_path)) for flag in flags)
    if "test/metadata.jsonl" not in setup and flags[:1] != ("--metadata",):
        (tmp_path / "in" / "test" / "b.png").unlink()  # a split folder with no table would be refused first
    assert refused(capsys, tmp_path / "in", *flags) == message


@pytest.mark.parametrize("name,text,message", [
    ("t.tsv", "file_name\tlabel\ta/img.png\tx\ty\n",
     "--metadata TABLE line 1 has 3 fields, but the header has 2: a tab inside a field splits it (TSV has no "
     "quoting): replace it, or save the table as CSV"),
    ("t.csv", "file_name,label,score\na.png,x,0.5\nb.png,x,\n",
     "--metadata TABLE line 3: column 'score' holds \"\", but line 2 made it a number column (\"0.5\"): fill the "
     "cell (NaN for a missing number, which makes the column a number column)"),
    ("t.jsonl", '{"file_name": "a.png", "label": "x", "score": null}\n',
     "--metadata TABLE line 1: column 'score' holds null: give every row a value (NaN for a missing number)"),
], ids=["tsv-tab", "empty-number", "null"])
def test_messages_say_what_works(capsys, tmp_path, name, text, message):
    if name.endswith(".tsv"):
        text = text.replace("file_name\tlabel\t", "file_name\tlabel\n")
    images(tmp_path / "in", "a.png", "b.png")
    (tmp_path / name).write_text(text)
    got = refused(capsys, tmp_path / "in", "--metadata", str(tmp_path / name))
    assert got == message.replace("TABLE", f"TMP/{name}").replace("line 1 has", "line 2 has")


@pytest.mark.parametrize("fix", ["NaN", "nan"])
def test_the_advice_for_an_empty_number_cell_works(tmp_path, fix):
    images(tmp_path, "a.png", "b.png")
    (tmp_path / "t.csv").write_text(f"file_name,label,score\na.png,x,1\nb.png,x,{fix}\n")
    with list_tree(str(tmp_path), metadata=str(tmp_path / "t.csv")) as listing:
        scores = {e.relpath: e.extra["score"] for e in listing.entries()}
        assert listing.extra_features == {"score": "float"}
    assert scores["a.png"] == 1.0 and scores["b.png"] != scores["b.png"]  # NaN
    (tmp_path / "t.jsonl").write_text('{"file_name": "a.png", "label": "x", "score": 1.5}\n'
                                      '{"file_name": "b.png", "label": "x", "score": NaN}\n')
    with list_tree(str(tmp_path), metadata=str(tmp_path / "t.jsonl")) as listing:
        assert listing.extra_features == {"score": "float"}


def test_a_resume_with_a_split_folders_table_edited_since_is_refused(capsys, tmp_path):
    """The tables found in the split folders are the run's as --metadata's is: their sha256 recorded."""
    images(tmp_path / "in", "train/a.png")
    table = tmp_path / "in" / "train" / "metadata.jsonl"
    jsonl(table, {"file_name": "a.png", "label": "x"})
    out = tmp_path / "out"
    assert_edited_table_refused(capsys, ["--input", str(tmp_path / "in"), "--output", str(out)], out, table,
                                lambda: jsonl(table, {"file_name": "a.png", "label": "y"}))
