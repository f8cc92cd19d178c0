"""``beam-prep inspect OUT``: the table and JSON against the manifest and the files, the contact sheet
against the records, on local disk and gs://."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys

import numpy as np
import pytest
from helpers import REPO, make_tree, prepare_here, read_split
from PIL import Image

from beam_prep.errors import DatasetError
from beam_prep.reader import load_info
from beam_prep.tools import contact_sheet, inspection
from beam_prep.tools.summary import summarize
from pipelines import cli, inspect_output, verify_output

LABELS = {"ant": 3, "bee": 7, "cat": 4}


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    """One small JPEG dataset with two splits, a class missing from validation, a failure and a skip."""
    root = tmp_path_factory.mktemp("inspect")
    make_tree(root / "tree", LABELS, size=(24, 20))
    (root / "tree" / "bee" / "broken.jpg").write_bytes(b"not a jpeg")
    (root / "tree" / "cat" / "notes.txt").write_text("not an image")
    out = root / "out"
    prepare_here("--input", str(root / "tree"), "--output", str(out), "--image_size", "20",
                 "--validation_percent", "30", "--num_shards", "2")
    return out


@pytest.fixture(scope="module")
def manifest(output):
    return json.loads((output / "manifest.json").read_text())


def inspect(capsys, *args: str) -> tuple[int, str, str]:
    code = inspect_output.main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def shard_sizes(output, split_manifest) -> list[int]:
    return [os.path.getsize(output / name) for name in split_manifest["shards"]]


# The table.

def table_rows(text: str, header_start: str) -> list[list[str]]:
    """The rows of the table whose header line starts with ``header_start``, split on runs of spaces."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(header_start))
    rows = []
    for line in lines[start + 1:]:
        if not line.startswith("  ") or not line.strip():
            break
        rows.append(line.split())
    return rows


def test_table_shows_splits_and_shards_as_the_manifest_and_files_say(capsys, output, manifest):
    code, out, _ = inspect(capsys, output)
    assert code == 0
    rows = {row[0]: row for row in table_rows(out, "split")}
    assert set(rows) == set(manifest["splits"]) == {"train", "validation"}
    for name, split in manifest["splits"].items():
        row = rows[name]
        counts = split["shard_num_examples"]
        assert row[1] == str(split["num_examples"])
        assert row[2] == str(len(split["shards"]))
        assert " ".join(row[3:5]) == inspection.format_bytes(sum(shard_sizes(output, split)))
        assert row[-4:-1] == [inspection.format_number(v) for v in
                              (min(counts), statistics.median(counts), max(counts))]
    assert "image: 20x20, 3 channels, jpeg, resize_mode center_crop, compression GZIP" in out


def test_table_lists_every_class_largest_first_with_the_imbalance_ratio(capsys, output, manifest):
    _, out, _ = inspect(capsys, output)
    labels = manifest["labels"]
    splits = manifest["splits"]
    totals = {label: sum(s["class_counts"][label] for s in splits.values()) for label in labels}
    assert totals == LABELS  # broken.jpg, also in bee, failed
    rows = table_rows(out, "id ")
    assert [row[1] for row in rows] == sorted(labels, key=lambda label: (-totals[label], labels.index(label)))
    for row in rows:
        label = row[1]
        assert row[0] == str(labels.index(label))
        assert row[2:] == [str(splits["train"]["class_counts"][label]),
                           str(splits["validation"]["class_counts"][label]), str(totals[label])]
    ratio = max(totals.values()) / min(totals.values())
    assert f"imbalance (largest class / smallest): {ratio:.2f} (bee 7 / ant 3)" in out


def test_table_groups_failures_by_stage_and_reason(capsys, output, manifest):
    _, out, _ = inspect(capsys, output)
    c = manifest["counts"]
    assert f"files: {c['listed']} listed, {c['written']} written, {c['failed']} failed, {c['skipped']} skipped" in out
    assert "skipped, not an image file: 1" in out
    (row,) = table_rows(out, "stage")
    assert row[:3] == ["decode", "UnidentifiedImageError", "1"]
    assert row[3].endswith("bee/broken.jpg:")


def test_table_names_skipped_files_by_reason_and_where_the_rest_are(capsys, output, manifest):
    _, out, _ = inspect(capsys, output)
    lines = out.splitlines()
    assert "  skipped, not an image file: 1, e.g. cat/notes.txt" in lines
    assert f"  every skipped file, with its reason: {output / 'skipped.jsonl'}" in lines
    assert manifest["counts"]["skipped"] == 1


def test_skipped_examples_are_the_first_few_of_each_reason(capsys, tmp_path, output):
    """Counts from the manifest, examples from skipped.jsonl (first by path, read no further than
    they need); a dataset from before skipped.jsonl shows the counts alone."""
    copy = shutil.copytree(output, tmp_path / "out")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["counts"]["skipped"] = 6
    manifest["skipped_by_reason"] = {"hidden or system file": 1, "not an image file": 5}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    rows = [("a/.DS_Store", "hidden or system file")] + [(f"cat/n{i}.txt", "not an image file") for i in range(5)]
    (copy / "skipped.jsonl").write_text("".join(
        json.dumps({"path": f"/in/{relpath}", "relpath": relpath, "reason": reason}) + "\n"
        for relpath, reason in rows) + "not read: the examples are found by then\n")
    _, out, _ = inspect(capsys, copy)
    assert "  skipped, hidden or system file: 1, e.g. a/.DS_Store\n" \
           "  skipped, not an image file: 5, e.g. cat/n0.txt, cat/n1.txt, cat/n2.txt and 2 more\n" \
           f"  every skipped file, with its reason: {copy / 'skipped.jsonl'}\n" in out
    summary = json.loads(inspect(capsys, copy, "--json")[1])
    assert summary["skipped_examples"] == {"hidden or system file": ["a/.DS_Store"],
                                           "not an image file": ["cat/n0.txt", "cat/n1.txt", "cat/n2.txt"]}
    assert summary["skipped_file"] == str(copy / "skipped.jsonl")
    (copy / "skipped.jsonl").unlink()
    _, out, err = inspect(capsys, copy)
    assert "  skipped, not an image file: 5\n\n" in out and "every skipped file" not in out and err == ""
    assert inspection.to_json(summarize(str(copy)))["skipped_file"] is None


def test_long_class_tables_can_be_shortened(capsys, output):
    _, out, _ = inspect(capsys, output, "--max-classes", "1")
    rows = table_rows(out, "id ")
    assert [row[1] for row in rows] == ["bee", "(1", "ant"]


# JSON.

def test_json_holds_the_manifests_numbers_and_the_shard_files_sizes(capsys, output, manifest):
    code, out, _ = inspect(capsys, output, "--json")
    assert code == 0
    summary = json.loads(out)
    for name, split in manifest["splits"].items():
        got = summary["splits"][name]
        sizes = shard_sizes(output, split)
        counts = split["shard_num_examples"]
        assert got["num_examples"] == split["num_examples"]
        assert got["shards"] == {
            "count": len(split["shards"]), "total_bytes": sum(sizes), "missing": [],
            "bytes": {"min": min(sizes), "median": statistics.median(sizes), "max": max(sizes)},
            "records": {"min": min(counts), "median": statistics.median(counts), "max": max(counts)}}
        class_counts = split["class_counts"]
        ratio = (max(class_counts.values()) / min(class_counts.values())
                 if min(class_counts.values()) else None)
        assert got["imbalance"]["ratio"] == ratio
    assert summary["splits"]["validation"]["imbalance"]["ratio"] is None  # ant and cat have none there
    assert [c["name"] for c in summary["classes"]] == ["bee", "cat", "ant"]
    assert summary["imbalance"] == {"ratio": 7 / 3, "largest": {"name": "bee", "count": 7},
                                    "smallest": {"name": "ant", "count": 3}}
    assert summary["counts"] == manifest["counts"]
    assert summary["failed_by_stage"] == manifest["failed_by_stage"] == {"decode": 1}
    (failure,) = summary["failures"]
    assert (failure["stage"], failure["reason"], failure["count"]) == ("decode", "UnidentifiedImageError", 1)
    assert failure["example_path"] == str(output.parent / "tree" / "bee" / "broken.jpg")
    assert summary["image"] == {**manifest["image"], "compression": "GZIP", "label_offset": 0}


def test_class_ids_are_the_stored_ids(tmp_path, output):
    """With a label offset, the id shown is what the records hold: index + offset."""
    copy = shutil.copytree(output, tmp_path / "out")
    manifest = json.loads((copy / "manifest.json").read_text())
    (copy / "manifest.json").write_text(json.dumps({**manifest, "label_offset": 1}))
    summary = summarize(str(copy))
    assert {c.name: c.id for c in summary.classes} == {"ant": 1, "bee": 2, "cat": 3}


# What goes wrong.

def test_a_missing_output_folder_is_named_with_exit_code_2(capsys, tmp_path):
    code, out, err = inspect(capsys, tmp_path / "nowhere")
    assert code == 2 and out == ""
    assert f"error: output folder {tmp_path / 'nowhere'} does not exist" in err


@pytest.mark.slow  # inspect imports TensorFlow before it looks for the manifest
def test_a_folder_without_a_manifest_is_named_with_exit_code_2(capsys, tmp_path):
    code, _, err = inspect(capsys, tmp_path)
    assert code == 2
    assert f"no manifest.json at {tmp_path}/manifest.json" in err


def test_a_missing_shard_is_shown_and_fails_the_command(capsys, tmp_path, output, manifest):
    copy = shutil.copytree(output, tmp_path / "out")
    gone = manifest["splits"]["train"]["shards"][1]
    (copy / gone).unlink()
    code, out, err = inspect(capsys, copy)
    assert code == 1
    assert f"MISSING in train: {gone} (1 of 2 shards)" in out
    assert "1 shards the manifest lists are missing" in err


def test_an_unknown_split_for_the_sheet_is_refused_before_any_output(capsys, tmp_path, output):
    code, out, err = inspect(capsys, output, "--grid", tmp_path / "s.png", "--split", "test")
    assert code == 2 and out == ""
    assert "has no split 'test'; its splits: train, validation" in err
    assert not (tmp_path / "s.png").exists()


def test_a_damaged_shard_fails_the_sheet_naming_it(capsys, tmp_path, output, manifest):
    copy = shutil.copytree(output, tmp_path / "out")
    for name in manifest["splits"]["train"]["shards"]:
        data = (copy / name).read_bytes()
        (copy / name).write_bytes(data[: len(data) // 2])
    code, _, err = inspect(capsys, copy, "--grid", tmp_path / "s.png", "--per-class", "8")
    assert code == 1
    assert f"{copy}/{manifest['splits']['train']['shards'][0]}" in err
    assert not (tmp_path / "s.png").exists()


def test_a_dataset_without_per_shard_counts_or_errors_file_says_what_it_lacks(capsys, tmp_path, output):
    """The shuffle sink does not count records per shard; an errors.jsonl may have been deleted."""
    copy = shutil.copytree(output, tmp_path / "out")
    manifest = json.loads((copy / "manifest.json").read_text())
    for split in manifest["splits"].values():
        del split["shard_num_examples"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    (copy / "errors.jsonl").unlink()
    code, out, _ = inspect(capsys, copy, "--grid", tmp_path / "s.png", "--per-class", "1")
    assert code == 0
    rows = {row[0]: row for row in table_rows(out, "split")}
    assert rows["train"][-2:] == ["unknown", "1.33"]
    assert "failures by stage (no errors.jsonl to give reasons):\n  decode: 1" in out
    summary = inspection.to_json(summarize(str(copy)))
    assert summary["splits"]["train"]["shards"]["records"] is None and summary["failures"] == []
    assert summary["errors_file"] is None
    assert Image.open(tmp_path / "s.png").format == "PNG"


def test_the_sheet_stops_reading_once_every_class_has_its_images(tmp_path, output, manifest):
    """A damaged second shard is never reached when the first holds an image of every class."""
    first, second = manifest["splits"]["train"]["shards"]
    in_first = {int(r["image/class/label"]) for r in read_split(output, "train") if r["shard"] == first}
    assert in_first == {0, 1, 2}  # the dataset is made so; the test relies on it
    copy = shutil.copytree(output, tmp_path / "out")
    (copy / second).write_bytes(b"\x1f\x8b not a shard")
    info = load_info(str(copy))
    sheet = contact_sheet.make_contact_sheet(info, "train", per_class=1)
    assert [len(row.boxes) for row in sheet.rows] == [1, 1, 1]
    with pytest.raises(DatasetError, match=f"{copy}/{second}"):
        contact_sheet.make_contact_sheet(info, "train", per_class=3)


def test_bad_numbers_are_refused_by_the_parser(capsys, output):
    with pytest.raises(SystemExit) as raised:
        inspect_output.main([str(output), "--per-class", "0"])
    assert raised.value.code == 2
    assert "must be at least 1, not 0" in capsys.readouterr().err


# The contact sheet.

def decoded_records(output, split: str) -> dict[int, list[np.ndarray]]:
    """Every record's pixels by label id, decoded by TensorFlow itself (as the reader does: exact DCT)."""
    import tensorflow as tf

    out: dict[int, list[np.ndarray]] = {}
    for r in read_split(output, split):
        pixels = tf.io.decode_jpeg(r["image/encoded"], channels=3, dct_method="INTEGER_ACCURATE").numpy()
        out.setdefault(int(r["image/class/label"]), []).append(pixels)
    return out


def assert_rows_show_their_own_class(png: Image.Image, sheet: contact_sheet.ContactSheet,
                                     records: dict[int, list[np.ndarray]], background) -> None:
    pixels = np.asarray(png.convert("RGB"))
    for row in sheet.rows:
        for left, top, right, bottom in row.boxes:
            cell = pixels[top:bottom, left:right]
            assert cell.std() > 0 and (cell != background).any(), (row.caption, "blank cell")
            assert any(cell.shape == r.shape and (cell == r).all() for r in records[row.label_id]), \
                f"a cell in row {row.caption} is not a record of that class"


def test_grid_draws_a_row_per_class_in_label_order_from_the_records(capsys, tmp_path, output, manifest):
    path = tmp_path / "sheet.png"
    code, out, _ = inspect(capsys, output, "--grid", path, "--per-class", "3")
    assert code == 0 and f"contact sheet: {path} (9 images of 3 classes from train" in out
    png = Image.open(path)
    info = load_info(str(output))
    sheet = contact_sheet.make_contact_sheet(info, "train", per_class=3)
    assert png.size == sheet.image.size and png.format == "PNG"
    labels = manifest["labels"]
    assert [row.caption for row in sheet.rows] == [f"{name} ({i})" for i, name in enumerate(labels)]
    train_counts = manifest["splits"]["train"]["class_counts"]
    assert [len(row.boxes) for row in sheet.rows] == [min(3, train_counts[name]) for name in labels]
    tops = [row.boxes[0][1] for row in sheet.rows]
    assert tops == sorted(tops) and len(set(tops)) == len(tops)  # label order, top to bottom
    assert all(box[2] - box[0] == 20 and box[3] - box[1] == 20 for row in sheet.rows for box in row.boxes)
    assert_rows_show_their_own_class(png, sheet, decoded_records(output, "train"), contact_sheet.BACKGROUND)


def test_grid_draws_only_the_classes_asked_for_in_label_order(capsys, tmp_path, output, manifest):
    labels = manifest["labels"]
    path = tmp_path / "some.png"
    code, out, _ = inspect(capsys, output, "--grid", path, "--per-class", "2", "--classes",
                           f"{labels[2]},{labels[0]}")
    assert code == 0 and f"contact sheet: {path} (4 images of 2 classes from train" in out
    sheet = contact_sheet.make_contact_sheet(load_info(str(output)), "train", per_class=2,
                                             classes=[labels[2], labels[0]])
    assert [row.caption for row in sheet.rows] == [f"{labels[0]} (0)", f"{labels[2]} (2)"]
    assert Image.open(path).size == sheet.image.size
    assert_rows_show_their_own_class(Image.open(path), sheet, decoded_records(output, "train"),
                                     contact_sheet.BACKGROUND)
    code, _, err = inspect(capsys, output, "--grid", tmp_path / "none.png", "--classes", "gnu")
    assert code == 2 and "error: --classes: no label named 'gnu'" in err
    assert not (tmp_path / "none.png").exists()


def test_grid_grows_a_cell_per_image_per_class(output):
    info = load_info(str(output))
    # Cells wide enough that the grid, not the title line, sets the width.
    two = contact_sheet.make_contact_sheet(info, "train", per_class=2, cell=200)
    four = contact_sheet.make_contact_sheet(info, "train", per_class=4, cell=200)
    assert four.image.width - two.image.width == 2 * (200 + contact_sheet.PAD)
    assert four.image.height == two.image.height
    # As wide as the fullest row: bee's 3 validation records make 3 columns, not 8.
    # ant and cat have no validation records: their rows are captioned and empty.
    three = contact_sheet.make_contact_sheet(info, "validation", per_class=3, cell=200)
    eight = contact_sheet.make_contact_sheet(info, "validation", per_class=8, cell=200)
    assert [len(row.boxes) for row in eight.rows] == [0, 3, 0]
    assert eight.image.size == three.image.size


def test_grid_shrinks_images_larger_than_the_cell(output):
    sheet = contact_sheet.make_contact_sheet(load_info(str(output)), "train", per_class=2, cell=10)
    assert {(r - left, b - t) for row in sheet.rows for left, t, r, b in row.boxes} == {(10, 10)}


@pytest.mark.parametrize("args,message", [
    (["--grid", "S.png", "--split", "val"], "error: {out} has no split 'val'; its splits: train, validation"),
    (["--grid", "S.png", "--classes", "ant,bea"],
     "error: --classes: no label named 'bea' (did you mean 'bee'?); the labels are in {out}/labels.txt"),
    (["--per_clas", "3"], "error: unknown option --per_clas; did you mean --per-class? "
                          "(beam-prep inspect --help lists its options)"),
])
def test_a_usage_error_is_one_line_naming_no_log(tmp_path, output, args, message):
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "inspect", str(output), *args],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == message.format(out=output) + "\n"  # TensorFlow's own log is not named
    assert not list(pathlib.Path(os.environ["TMPDIR"]).glob("beam-prep-tensorflow-*"))
    assert not (tmp_path / "S.png").exists()


def test_a_folder_that_is_no_dataset_is_one_line_naming_no_log(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "inspect", str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"error: no manifest.json at {tmp_path}/manifest.json: not a beam-prep dataset, "
                             "or its pipeline has not finished (the manifest is written last, after every shard)\n")
    assert not list(pathlib.Path(os.environ["TMPDIR"]).glob("beam-prep-tensorflow-*"))


# The command and gs://.

def test_beam_prep_lists_inspect():
    assert "inspect" in cli.COMMANDS and "inspect" in cli.usage()


def test_inspect_reads_a_gs_output_as_it_reads_a_local_one(gcs_server, capsys, tmp_path, output):
    bucket = gcs_server.new_bucket()
    bucket.upload_tree(output, "records")
    url = bucket.url("records")
    sheet = tmp_path / "gs-sheet.png"
    result = gcs_server.run([sys.executable, "-m", "pipelines.cli", "inspect", url, "--json",
                             "--grid", str(sheet), "--per-class", "2"], cwd=REPO)
    remote = json.loads(result.stdout)
    _, out, _ = inspect(capsys, output, "--json")
    local = json.loads(out)
    assert remote["path"] == url and remote["errors_file"] == f"{url}/errors.jsonl"
    assert remote["skipped_file"] == f"{url}/skipped.jsonl" and remote["skipped_examples"]
    for key in ("path", "errors_file", "skipped_file"):
        del remote[key], local[key]
    assert remote == local
    expected = contact_sheet.make_contact_sheet(load_info(str(output)), "train", per_class=2)
    assert (np.asarray(Image.open(sheet).convert("RGB")) == np.asarray(expected.image)).all()
    assert "contact sheet:" in result.stderr  # stdout stays pure JSON

    missing = gcs_server.run([sys.executable, "-m", "pipelines.cli", "inspect", bucket.url("nothing")],
                             cwd=REPO, check=False)
    assert missing.returncode == 2 and missing.stdout == ""
    assert f"error: no manifest.json at {bucket.url('nothing')}/manifest.json" in missing.stderr

    bare = shutil.copytree(output, tmp_path / "bare")  # a dataset whose reports were deleted
    (bare / "errors.jsonl").unlink()
    (bare / "skipped.jsonl").unlink()
    bucket.upload_tree(bare, "bare")
    result = gcs_server.run([sys.executable, "-m", "pipelines.cli", "inspect", bucket.url("bare"), "--json"],
                            cwd=REPO)
    summary = json.loads(result.stdout)
    assert summary["errors_file"] is None and summary["skipped_file"] is None and summary["failures"] == []
    assert summary["splits"] == local["splits"]


def test_inspecting_a_local_output_imports_no_tensorflow(output):
    """Its files are read with ``open``: a summary of milliseconds, not TensorFlow's seconds of import."""
    code = ("import sys; from pipelines import inspect_output; "
            "code = inspect_output.main(sys.argv[1:]); assert 'tensorflow' not in sys.modules, 'imported'; "
            "sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", code, str(output), "--json"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["splits"]["train"]["num_examples"] > 0


def test_tensorflow_is_imported_without_kerass_optimizers_and_keras_still_imports_after():
    """``tensorflow_import``: TensorFlow's eager import of Keras's optimizers is left out, and asked
    for later (``tf.keras``), Keras imports in the same process; so are JAX and pandas (installed here:
    Grain's extra, Hugging Face's), imported by TensorFlow Lite and Keras in case a caller wants them."""
    code = ("import sys; from pipelines.tensorflow_import import import_tensorflow; import_tensorflow(); "
            "left = [m for m in ('keras.src.optimizers', 'jax', 'pandas') if m in sys.modules]; "
            "assert 'tensorflow' in sys.modules and not left, left; "
            "import tensorflow as tf; assert tf.data.Dataset.range(3).reduce(tf.constant(0, tf.int64), lambda a, b: a + b) == 3; "
            "tf.keras.optimizers.SGD(); assert 'keras.src.optimizers' in sys.modules; "
            "import jax.numpy, pandas; assert int(jax.numpy.arange(3).sum()) == 3 and len(pandas.DataFrame({'a': [1]})) == 1")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_keras_is_left_out_only_where_tensorflows_own_import_of_it_may_fail():
    """Another TensorFlow whose ``__init__`` no longer catches the eager import's ImportError
    imports as it always does: refusing the module there would fail the command."""
    import importlib.util

    from pipelines.tensorflow_import import guards_eager_keras

    source = pathlib.Path(importlib.util.find_spec("tensorflow").origin).read_text(encoding="utf-8")
    assert guards_eager_keras(source)  # the installed one: the test above runs the import without it
    assert not guards_eager_keras(source.replace("except (ImportError, AttributeError):", "except AttributeError:"))
    assert not guards_eager_keras(source.replace("except (ImportError, AttributeError):", "finally:"))
    assert not guards_eager_keras(source.replace('importlib.import_module("keras.src.optimizers")', "pass"))


@pytest.mark.parametrize("module", ["jax", "pandas"])
def test_jax_and_pandas_are_left_out_only_where_their_importers_catch_the_failure(module):
    """As Keras's optimizers: the installed file that imports the module catches its ImportError (the
    test above imports TensorFlow without it), and a file that would not is imported as it is."""
    import importlib.util

    from pipelines.tensorflow_import import LEFT_OUT, guards

    package, path, _ = LEFT_OUT[module]
    source = (pathlib.Path(importlib.util.find_spec(package).origin).parent / path).read_text(encoding="utf-8")
    assert guards(module, source)
    assert not guards(module, source.replace("except ImportError:", "except AttributeError:"))
    assert not guards(module, source.replace("except ImportError:", "finally:"))


@pytest.mark.parametrize("command", ["verify", "inspect --grid", "bench", "inspect"])
def test_the_commands_that_read_records_import_tensorflow_that_way(output, tmp_path, monkeypatch, command):
    """``verify``, ``bench`` and ``inspect --grid`` import TensorFlow through ``tensorflow_import``
    before their first record; ``inspect`` of a local folder imports none."""
    from pipelines import bench_reader

    name = command.split()[0]
    module = {"verify": verify_output, "inspect": inspect_output, "bench": bench_reader}[name]
    calls = []
    monkeypatch.setattr(module, "import_tensorflow", lambda: calls.append(name))
    flags = {"inspect --grid": ["--grid", str(tmp_path / "sheet.png")],
             "bench": ["--seconds", "0.2", "--warmup_seconds", "0"]}.get(command, [])
    code = module.main([str(output), *flags])
    assert code in (0, 1)  # verify: 1 for the fixture's failed image
    assert calls == ([] if command == "inspect" else [name])


def test_a_line_break_in_the_datasets_jsonl_files_forges_no_line(capsys, tmp_path, output):
    """errors.jsonl and skipped.jsonl are data too: a path holding a line break, a carriage return or a
    tab (a crafted ``"path": "...\\nfake line: all good"``) is shown escaped, on its own line."""
    copy = shutil.copytree(output, tmp_path / "out")
    forged = "/in/x\nfake line: all good\r\tz"
    (copy / "errors.jsonl").write_text(json.dumps({"path": forged, "stage": "decode\n", "error_type": "X",
                                                   "message": "bad\u2028forged"}) + "\n")
    (copy / "skipped.jsonl").write_text(json.dumps({"path": forged, "relpath": "cat/n\nfake skip",
                                                    "reason": "not an image file"}) + "\n")
    _, out, _ = inspect(capsys, copy)
    assert not [line for line in out.splitlines() if line.startswith(("fake", "\t", "forged"))], out
    assert not any(c in out for c in "\r\t\u2028"), out
    assert "  decode\\x0a  X           1  /in/x\\x0afake line: all good\\x0d\\x09z: bad\\u2028forged\n" in out
    assert "e.g. cat/n\\x0afake skip\n" in out


@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_names_from_the_manifest_reach_the_terminal_without_their_control_characters(output, tmp_path, command,
                                                                                   capsys):
    """A label is the manifest's word (data, from a bucket someone else may control): one holding escape
    sequences (retitle the window, clear the screen, a carriage return over a line) is shown escaped."""
    copy = tmp_path / "out"
    shutil.copytree(output, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    hostile = "\x1b]0;owned\x07\x1b[2J\rant"
    manifest["labels"][0] = hostile
    for split in manifest["splits"].values():
        split["class_counts"] = {(hostile if k == "ant" else k): n for k, n in split["class_counts"].items()}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    main = inspect_output.main if command == "inspect" else verify_output.main
    main([str(copy)])
    out = capsys.readouterr().out
    assert not any(c in out for c in "\x1b\x07\r"), out
    if command == "inspect":
        assert "\\x1b]0;owned\\x07\\x1b[2J\\x0dant" in out
