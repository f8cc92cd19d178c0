"""``beam-prep verify`` and ``beam-prep bench`` on a real prepared dataset, whole and damaged.

One small dataset is prepared once for the module; each test damages its own
copy (a shard cut short, deleted or added, a manifest count edited, records
rewritten with the writer's own code) and checks that the problem, and only
that problem, is named.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
from collections.abc import Callable

import pytest
from helpers import REPO, encode, make_tree, prepare_here
from PIL import Image

from beam_prep.errors import DatasetError
from beam_prep.io.tfrecord import shard_writer, write_record
from beam_prep.model import features
from beam_prep.model.dataset import DatasetInfo, ImageInfo
from beam_prep.reader.checks import batch_checker
from beam_prep.tools.verification import verify
from beam_prep.tools.verify_report import KINDS
from pipelines import bench_reader, cli, verify_output

TRAIN0 = "train-00000-of-00002.tfrecord.gz"
TRAIN1 = "train-00001-of-00002.tfrecord.gz"
VALIDATION1 = "validation-00001-of-00002.tfrecord.gz"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("verify")
    make_tree(root / "in", {"a": 6, "b": 5, "c": 4}, size=(24, 20))
    (root / "in" / "a" / "broken.jpg").write_bytes(b"not a jpeg")  # one failure, in errors.jsonl
    prepare_here("--input", str(root / "in"), "--output", str(root / "out"),
                 "--image_size", "16", "--validation_percent", "30", "--num_shards", "2")
    return root / "out"


@pytest.fixture
def out(prepared, tmp_path) -> pathlib.Path:
    """A copy of the prepared dataset, this test's to damage."""
    return pathlib.Path(shutil.copytree(prepared, tmp_path / "out"))


def run_verify(out: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipelines.cli", "verify", str(out), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def edit_manifest(out: pathlib.Path, edit: Callable[[dict], None]) -> None:
    manifest = json.loads((out / "manifest.json").read_text())
    edit(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))


def read_records(path: pathlib.Path) -> list[dict]:
    import tensorflow as tf

    return [features.decode_example(r.numpy()) for r in tf.data.TFRecordDataset(str(path), "GZIP")]


def write_records(path: pathlib.Path, records: list[dict]) -> None:
    """Writes records (``decode_example``'s dicts) as a shard, with the writer's own encoder and framing, and
    records its sha256 in the manifest as the writer would: the records are the problem, not the bytes."""
    with shard_writer(str(path), "gzip") as f:
        for r in records:
            write_record(f, features.encode_example(features.ImageRecord(
                encoded=r[features.ENCODED], image_format=r[features.FORMAT].decode(),
                height=r[features.HEIGHT], width=r[features.WIDTH], channels=r[features.CHANNELS],
                label=r[features.LABEL], label_text=r[features.LABEL_TEXT].decode(),
                filename=r[features.FILENAME].decode(), sha256=r[features.SHA256].decode())))
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()

    def edit(manifest: dict) -> None:
        for split in manifest["splits"].values():
            if path.name in split["shards"]:
                split["shard_sha256"][split["shards"].index(path.name)] = sha256
    edit_manifest(path.parent, edit)


def restamp_gzip(shard: pathlib.Path) -> None:
    """The shard with another time in its GZIP header (bytes 4 to 8): the same size, the same records,
    other bytes, as a shard replaced by another run's copy of the same records would be."""
    data = bytearray(shard.read_bytes())
    assert data[:3] == b"\x1f\x8b\x08"  # a GZIP member: its MTIME follows the flags
    data[4:8] = (int.from_bytes(data[4:8], "little") ^ 0x5A5A5A5A).to_bytes(4, "little")
    shard.write_bytes(bytes(data))


def kinds(report) -> list[str]:
    return [p.kind for p in report.problems]


# A whole dataset.

def test_a_good_dataset_verifies_with_exit_code_0(prepared):
    result = run_verify(prepared)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(rf"^verified {re.escape(str(prepared))}: 15 records in 4 shards, ", result.stdout)
    assert "verify:" not in result.stderr  # no progress bar when stderr is not a terminal
    # TensorFlow's native log lines (CPU features, no CUDA, tf.data notes) go to a file, removed on success.
    assert result.stderr == ""
    assert not list(pathlib.Path(os.environ["TMPDIR"]).glob("beam-prep-tensorflow-*"))


def test_every_record_is_read_and_reported_as_progress(prepared):
    seen = []
    report = verify(str(prepared), progress=seen.append)
    assert report.ok and report.problems == ()
    assert (report.records, report.expected_records, report.shards) == (15, 15, 4)
    assert sum(seen) == 15


def test_no_dataset_is_exit_code_2_naming_the_folder_and_no_log(tmp_path):
    result = run_verify(tmp_path / "nothing")
    assert result.returncode == 2
    # A usage error's message says it all: TensorFlow's own log is not named, and not left behind.
    assert result.stderr == f"error: dataset folder {tmp_path / 'nothing'} does not exist\n"
    assert not list(pathlib.Path(os.environ["TMPDIR"]).glob("beam-prep-tensorflow-*"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match=re.escape(f"no manifest.json at {tmp_path / 'empty'}/")):
        verify(str(tmp_path / "empty"))


def test_the_commands_are_registered():
    assert cli.COMMANDS["verify"][0] == "pipelines.verify_output"
    assert cli.COMMANDS["bench"][0] == "pipelines.bench_reader"


# Damaged shards, by file.

def test_a_truncated_shard_is_named_and_the_others_still_checked(out, capsys):
    shard = out / TRAIN0
    shard.write_bytes(shard.read_bytes()[:-200])
    rc = verify_output.main([str(out)])
    stdout = capsys.readouterr().out
    assert rc == 1
    assert f"damaged_shard: {shard}: damaged or unreadable: " in stdout
    assert "of the 5 the manifest lists were read before DataLossError: " in stdout
    report = verify(str(out))
    assert kinds(report) == ["damaged_shard"]  # no split or class counts thrown off by it
    assert report.shards == 4 and report.records >= 10  # the other three read whole


def test_a_deleted_shard_is_named(out, capsys):
    (out / VALIDATION1).unlink()
    assert verify_output.main([str(out)]) == 1
    stdout = capsys.readouterr().out
    assert (f"missing_shard: {out / VALIDATION1}: listed in split 'validation' (with 3 records) "
            "but not in the folder") in stdout
    assert kinds(verify(str(out))) == ["missing_shard"]


def test_an_extra_shard_is_named(out, capsys):
    extra = out / "train-00002-of-00003.tfrecord.gz"
    shutil.copy(out / TRAIN1, extra)
    (out / "notes.txt").write_text("not a shard")
    assert verify_output.main([str(out)]) == 1
    stdout = capsys.readouterr().out
    assert f"extra_shard: {extra}: a shard file the manifest does not list" in stdout
    assert kinds(verify(str(out))) == ["extra_shard"]


def test_a_shard_with_a_record_more_than_listed_is_named(out):
    records = read_records(out / TRAIN1)
    write_records(out / TRAIN1, records + records[:1])
    report = verify(str(out))
    assert [str(p) for p in report.problems if p.kind == "shard_count"] == [
        f"{out / TRAIN1}: holds 5 records; the manifest lists 4 for it (split 'train')"]


def test_a_shard_whose_bytes_are_not_the_manifests_sha256_is_named(out, capsys):
    """Same size, every record as it was: only its sha256 (``shard_sha256``) tells it from the one written."""
    shard = out / TRAIN1
    size, listed = shard.stat().st_size, json.loads((out / "manifest.json").read_text())["splits"]["train"]
    restamp_gzip(shard)
    assert shard.stat().st_size == size
    found = hashlib.sha256(shard.read_bytes()).hexdigest()
    expected = listed["shard_sha256"][listed["shards"].index(TRAIN1)]
    assert verify_output.main([str(out)]) == 1
    line = (f"shard_sha256: {shard}: has sha256 {found}, but the manifest's shard_sha256 for it is {expected} "
            "(split 'train'): its bytes are not those written (replaced or edited since?); copy the dataset "
            "again, or prepare it again")
    assert "  " + line in capsys.readouterr().out.splitlines()[1:]
    report = verify(str(out))
    assert kinds(report) == ["shard_sha256"] and report.records == 15  # every record read, and checks


def test_a_manifest_without_shard_sha256_checks_no_bytes(out):
    """A manifest from before ``shard_sha256`` (or a writer that could not report one): nothing to compare."""
    restamp_gzip(out / TRAIN1)
    edit_manifest(out, lambda m: [split.pop("shard_sha256") for split in m["splits"].values()])
    assert verify(str(out)).ok


def test_a_manifest_that_cannot_be_used_is_a_problem_not_a_missing_dataset(out, capsys):
    (out / "manifest.json").write_text('{"format_version": 1, "labels": ["a"]}')
    assert verify_output.main([str(out)]) == 1
    assert f"manifest: {out / 'manifest.json'}: {out / 'manifest.json'} is incomplete or malformed" \
        in capsys.readouterr().out


def test_labels_txt_that_is_not_the_manifests_labels_is_named(out):
    (out / "labels.txt").write_text("a\nc\nb\n")
    report = verify(str(out))
    assert [str(p) for p in report.problems] == [
        f"{out / 'labels.txt'}: holds 3 labels, the manifest 3; they first differ at line 2"]


# Counts edited by hand.

@pytest.mark.parametrize("edit,kind,expected,also", [
    (lambda m: m["splits"]["train"].update(num_examples=10), "split_count",
     "split 'train': holds 9 records; the manifest's num_examples is 10",
     ["counts.written is 15 but the splits hold 16 examples"]),
    (lambda m: m["splits"]["validation"]["class_counts"].update(a=5), "class_count",
     "split 'validation', class 'a': holds 4 records; the manifest's class_counts says 5", []),
    (lambda m: m["splits"]["train"]["shard_num_examples"].__setitem__(1, 3), "shard_count",
     "train-00001-of-00002.tfrecord.gz: holds 4 records; the manifest lists 3 for it (split 'train')", []),
    (lambda m: m["counts"].update(listed=17), "run_counts",
     "counts.listed is 17, not written + failed (15 + 1): files were lost", []),
])
def test_a_manifest_count_edited_by_hand_is_named(out, capsys, edit, kind, expected, also):
    edit_manifest(out, edit)
    assert verify_output.main([str(out)]) == 1
    stdout = capsys.readouterr().out
    assert f"  {kind}: " in stdout and expected in stdout
    report = verify(str(out))
    assert kinds(report) == sorted({kind, *(["run_counts"] if also else [])}, key=KINDS.index)
    assert all(any(text in str(p) for p in report.problems) for text in also)


def test_errors_jsonl_must_report_every_failure_the_manifest_counts(out):
    assert verify(str(out)).ok  # one failure, reported
    (out / "errors.jsonl").write_text("")
    report = verify(str(out))
    assert [str(p) for p in report.problems] == [
        f"{out / 'errors.jsonl'}: reports 0 failed files; the manifest counts 1"]
    (out / "errors.jsonl").unlink()
    assert [str(p) for p in verify(str(out)).problems] == [
        f"{out / 'errors.jsonl'}: missing: the manifest counts 1 failed files"]


def test_labels_txt_in_tf_slims_form_verifies(out):
    """--labels_txt slim writes "stored id:name" lines: as good a labels.txt as the default's."""
    edit_manifest(out, lambda m: m.update(label_offset=1))
    (out / "labels.txt").write_text("1:a\n2:b\n3:c\n")
    problems = [p for p in verify(str(out)).problems if p.kind == "labels_file"]
    assert problems == []
    (out / "labels.txt").write_text("0:a\n1:b\n2:c\n")  # ids not as stored
    assert [p.kind for p in verify(str(out)).problems if p.kind == "labels_file"] == ["labels_file"]


# Records that disagree with the manifest.

def move_class_count(out: pathlib.Path, split: str, source: str, target: str | None) -> None:
    """The manifest's class counts after one record of class ``source`` became ``target`` (None: no class)."""
    def edit(m):
        counts = m["splits"][split]["class_counts"]
        counts[source] -= 1
        if target is not None:
            counts[target] += 1
    edit_manifest(out, edit)


def test_a_record_whose_label_id_disagrees_with_its_text_is_named(out, capsys):
    records = read_records(out / TRAIN0)
    first = records[0]
    text = first[features.LABEL_TEXT].decode()
    other = (first[features.LABEL] + 1) % 3
    first[features.LABEL] = other
    write_records(out / TRAIN0, records)
    move_class_count(out, "train", text, "abc"[other])  # so that only the label problem remains
    assert verify_output.main([str(out)]) == 1
    stdout = capsys.readouterr().out
    name = first[features.FILENAME].decode()
    assert (f"label_text: {out / TRAIN0}, record 0 ({name}): label id {other} is {'abc'[other]!r} "
            f"in the labels, but the record's text is {text!r}") in stdout
    assert kinds(verify(str(out))) == ["label_text"]


def test_a_label_id_out_of_range_is_named(out):
    records = read_records(out / TRAIN1)
    records[-1][features.LABEL] = 7
    write_records(out / TRAIN1, records)
    move_class_count(out, "train", records[-1][features.LABEL_TEXT].decode(), None)
    report = verify(str(out))
    assert kinds(report) == ["label_range"]
    assert str(report.problems[0]).startswith(f"{out / TRAIN1}, record 3 (")
    assert "label id 7 is outside the labels: ids run from 0 to 2" in str(report.problems[0])


def test_ids_are_checked_after_the_label_offset(out):
    for shard in sorted(out.glob("*.tfrecord.gz")):
        records = read_records(shard)
        for r in records:
            r[features.LABEL] += 1  # as a writer with --label_offset 1 stores them
        write_records(shard, records)
    assert "label_text" in kinds(verify(str(out)))
    edit_manifest(out, lambda m: m.update(label_offset=1))
    assert verify(str(out)).ok


def test_an_image_of_another_size_is_named(out):
    records = read_records(out / TRAIN0)
    records[1][features.ENCODED] = encode(Image.new("RGB", (20, 16), "red"))  # 16 high, 20 wide
    records[1][features.WIDTH] = 20
    write_records(out / TRAIN0, records)
    report = verify(str(out))
    assert kinds(report) == ["image_shape"]
    assert str(report.problems[0]).endswith(
        "decodes to 16x20x3; the manifest says 16x16x3 and the record 16x20x3")


def test_a_record_that_does_not_decode_is_named_and_the_rest_of_its_shard_checked(out):
    records = read_records(out / TRAIN0)
    records[0][features.ENCODED] = b"not a jpeg"
    text = records[4][features.LABEL_TEXT].decode()
    other = (records[4][features.LABEL] + 1) % 3
    records[4][features.LABEL] = other
    write_records(out / TRAIN0, records)
    move_class_count(out, "train", text, "abc"[other])
    report = verify(str(out))
    assert kinds(report) == ["bad_record", "label_text"]
    assert str(report.problems[0]).startswith(f"{out / TRAIN0}, record 0: does not parse or decode: ")
    assert str(report.problems[1]).startswith(f"{out / TRAIN0}, record 4 (")
    assert report.records == 15


def test_problems_are_capped_per_kind_and_the_rest_counted(out, capsys):
    for shard in (TRAIN0, TRAIN1, VALIDATION1):
        (out / shard).unlink()
    report = verify(str(out), max_per_kind=1)
    assert kinds(report) == ["missing_shard"] and report.more == {"missing_shard": 2}
    assert verify_output.main([str(out), "--max_per_kind", "2"]) == 1
    stdout = capsys.readouterr().out
    assert stdout.startswith(f"3 problems in {out} (")
    assert stdout.rstrip().endswith("... and 1 more missing_shard problem")


# The batch check alone, on records made here: formats and sizes the dataset above does not have.

def example(encoded: bytes, height: int, width: int, channels: int = 3, image_format: str = "png",
            label: int = 0, text: str = "a") -> bytes:
    return features.encode_example(features.ImageRecord(
        encoded=encoded, image_format=image_format, height=height, width=width, channels=channels,
        label=label, label_text=text, filename=f"{text}/x.{image_format}", sha256="0" * 64))


def test_images_of_varying_size_pass_when_the_record_gives_their_size():
    import tensorflow as tf

    check = batch_checker(DatasetInfo("", ("a", "b"), {}, ImageInfo(None, None, 3, "png")))
    png = encode(Image.new("RGB", (20, 16)), "PNG")  # 16 high, 20 wide
    out = check(tf.constant([example(png, 16, 20), example(png, 20, 16), example(png, 16, 20, 1)]))
    assert out["shape_ok"].numpy().tolist() == [True, False, False]
    assert out["decoded"].numpy().tolist() == [[16, 20, 3]] * 3


def test_raw_pixels_are_checked_against_the_fixed_size():
    import tensorflow as tf

    check = batch_checker(DatasetInfo("", ("a",), {}, ImageInfo(2, 3, 1, "raw")))
    out = check(tf.constant([example(bytes(6), 2, 3, 1, "raw"), example(bytes(6), 3, 2, 1, "raw")]))
    assert out["shape_ok"].numpy().tolist() == [True, False]
    with pytest.raises(tf.errors.InvalidArgumentError):  # 5 bytes are no 2x3x1 image
        check(tf.constant([example(bytes(5), 2, 3, 1, "raw")]))


# In Google Cloud Storage.

def test_a_dataset_in_gcs_is_verified_through_tensorflows_gcs_filesystem(gcs_server, gcs_bucket, out):
    (out / VALIDATION1).unlink()
    shutil.copy(out / TRAIN1, out / "train-00002-of-00003.tfrecord.gz")
    restamp_gzip(out / TRAIN0)
    gcs_bucket.upload_tree(out, "out")
    result = gcs_server.run([sys.executable, "-m", "pipelines.cli", "verify", gcs_bucket.url("out")],
                            cwd=REPO, check=False)
    assert result.returncode == 1, result.stderr
    assert f"missing_shard: {gcs_bucket.url('out/' + VALIDATION1)}: listed in split" in result.stdout
    assert f"extra_shard: {gcs_bucket.url('out/train-00002-of-00003.tfrecord.gz')}: " in result.stdout
    assert f"shard_sha256: {gcs_bucket.url('out/' + TRAIN0)}: has sha256 " in result.stdout
    assert result.stdout.startswith(f"3 problems in {gcs_bucket.url('out')} (12 records in 3 shards")


# Reader throughput.

def test_bench_prints_the_readers_images_per_second(prepared):
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "bench", str(prepared),
                             "--seconds", "0.5", "--warmup_seconds", "0.2", "--batch_size", "4"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    match = re.fullmatch(rf"([\d,]+) images/s reading split 'train' of {re.escape(str(prepared))} "
                         r"\(([\d,]+) images in [\d.]+ s, batch 4, training order; "
                         r"[\d,]+ images per CPU-second\)\n", result.stdout)
    assert match, result.stdout
    assert int(match[1].replace(",", "")) > 0 and int(match[2].replace(",", "")) >= 4


def test_bench_on_an_unknown_split_is_exit_code_2(prepared, capsys):
    assert bench_reader.main([str(prepared), "--split", "test", "--seconds", "0.1"]) == 2
    assert f"error: {prepared} has no split 'test'; its splits: train, validation" in capsys.readouterr().err
