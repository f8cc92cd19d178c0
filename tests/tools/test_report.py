"""``beam-prep report OUT``: the page's sections against the dataset, its bounds, and bad input (a folder
that is no dataset, a shard that fails its checksum, names with markup). The browser's view of the page
is tests/tools/test_report_browser.py's."""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys

import pytest
from helpers import REPO, make_tree, prepare_here

from beam_prep.tools.report import Limits, make_report
from pipelines import cli, report_output

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    """A clean dataset: no duplicates, no failures, nothing skipped, no validation split."""
    root = tmp_path_factory.mktemp("report")
    make_tree(root / "tree", {f"c{i:02d}": 2 for i in range(12)}, size=(24, 20))
    out = root / "out"
    prepare_here("--input", str(root / "tree"), "--output", str(out), "--image_size", "16", "--num_shards", "2")
    return out


def page(path) -> str:
    return path.read_text(encoding="utf-8")


def test_sections_with_nothing_to_show_say_none(output, tmp_path):
    report = make_report(str(output), str(tmp_path / "r.html"))
    text = page(tmp_path / "r.html")
    assert report.size == len(text.encode())
    for marker in ("data-leaks=none", "data-failures=none", "data-skipped=none"):
        assert marker in text
    assert "validation" not in json.loads((output / "manifest.json").read_text())["splits"]
    assert report.data.notes == ()


def test_the_gallery_and_the_pictures_stay_within_their_caps_and_say_so(output, tmp_path):
    """12 classes, a gallery of 5 at most: one image each for the first 5 classes, the rest named as
    left out, counts still exact; a byte limit too small for all pictures leaves some out, said."""
    report = make_report(str(output), str(tmp_path / "r.html"), Limits(max_gallery=5))
    assert [len(images) for images in report.data.gallery.images] == [1] * 5 + [0] * 7
    assert ("gallery", "the first 5 of 12 classes shown (at most 5 images)") in report.data.notes
    text = page(tmp_path / "r.html")
    assert text.count('data-manifest="splits.train.class_counts.') == 12 * 2  # the table and the gallery rows
    one = report.data.gallery.images[0][0].thumbnail.embedded_size
    small = make_report(str(output), str(tmp_path / "s.html"), Limits(max_bytes=one * 3))
    assert sum(len(images) for images in small.data.gallery.images) == 3
    assert any(section == "pictures" for section, _ in small.data.notes)
    assert small.size < report.size


def test_a_shard_that_fails_its_checksum_leaves_the_gallery_incomplete_and_said(output, tmp_path, capsys):
    copy = shutil.copytree(output, tmp_path / "out")
    manifest = json.loads((copy / "manifest.json").read_text())
    shard = copy / manifest["splits"]["train"]["shards"][0]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    code = report_output.main([str(copy)])
    captured = capsys.readouterr()
    assert code == 1
    assert f"warning: gallery: incomplete: shard {shard} fails its checksum" in captured.err
    text = page(copy / "report.html")
    assert "fails its checksum" in text and 'data-note="gallery"' in text
    assert "<figure data-gallery" not in text  # the damaged shard was the first read: nothing shown from it


def test_a_folder_that_is_not_a_dataset_is_one_line_and_exit_2(tmp_path, capsys):
    assert report_output.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and str(tmp_path) in err
    (tmp_path / "manifest.json").write_text("{not json")
    assert report_output.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "manifest.json" in err


def test_names_from_the_side_files_are_escaped(output, tmp_path):
    copy = shutil.copytree(output, tmp_path / "out")
    hostile = '/in/<script>alert("x")</script>\u202e.jpg'
    (copy / "errors.jsonl").write_text(json.dumps({"path": hostile, "relpath": "x", "stage": "decode",
                                                   "error_type": "<img src=x onerror=alert(1)>",
                                                   "message": "a & b"}) + "\n")
    make_report(str(copy))
    text = page(copy / "report.html")
    assert "<script" not in text and "<img src=x" not in text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;\u202e.jpg" in text
    assert "not under the run&#x27;s input: not opened" in text  # nothing outside the input is read


def test_the_page_asks_for_nothing_outside_it(output, tmp_path):
    make_report(str(output), str(tmp_path / "r.html"))
    text = page(tmp_path / "r.html")
    assert "default-src 'none'; img-src data:" in text
    assert re.findall(r"""\b(?:src|href|url)\s*[=(]\s*(?!["']?(?:data:|#))""", text) == []


def test_beam_prep_lists_report():
    assert "report" in cli.COMMANDS and "report" in cli.usage()


# ``beam-prep report`` (its ``main``) run once per line of arguments read from stdin, in one process: one
# import of TensorFlow for every run. Answers each line with a line: [exit code, stdout, stderr].
_REPORT_SESSION = """
import contextlib, io, json, sys
from pipelines import report_output
for line in sys.stdin:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = report_output.main(json.loads(line))
    print("\x1e" + json.dumps([code, out.getvalue(), err.getvalue()]), flush=True)
"""


def test_report_reads_a_gs_output_and_writes_beside_it(gcs_server, output, tmp_path):
    bucket = gcs_server.new_bucket()
    bucket.upload_tree(output, "records")
    url = bucket.url("records")
    session = subprocess.Popen([sys.executable, "-c", _REPORT_SESSION], cwd=REPO, env=gcs_server.subprocess_env(),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def report(*args: str) -> tuple[int, str, str]:
        session.stdin.write(json.dumps([*args]) + "\n")
        session.stdin.flush()
        while not (line := session.stdout.readline()).startswith("\x1e"):
            assert line, "the report session ended"
        return tuple(json.loads(line[1:]))

    try:
        code, stdout, stderr = report(url)
        assert code == 0 and f"report: {url}/report.html" in stdout, stderr
        assert bucket.read_bytes("records/report.html").startswith(b"<!DOCTYPE html>")
        assert report(url)[0] == 0  # its own page: written again
        bucket.write_bytes("records/report.html", b"<p>notes of our own</p>")
        code, _, stderr = report(url)
        assert code == 2 and f"error: {url}/report.html is not a report beam-prep wrote" in stderr
        assert bucket.read_bytes("records/report.html") == b"<p>notes of our own</p>"
        local = tmp_path / "local.html"
        assert report(url, "--to", str(local))[0] == 0
    finally:
        session.stdin.close()
        session.wait(timeout=120)
    text = page(local)
    assert text.count("<figure data-gallery") == 12 * 2  # 2 images each, read from the bucket's shards


def test_one_class_and_an_unlabelled_webdataset(tmp_path):
    make_tree(tmp_path / "one", {"only": 3}, size=(24, 20))
    prepare_here("--input", str(tmp_path / "one"), "--output", str(tmp_path / "one-out"), "--image_size", "16")
    one = make_report(str(tmp_path / "one-out"))
    assert [len(images) for images in one.data.gallery.images] == [3] and one.data.notes == ()
    assert "largest / smallest class 1.00" in page(tmp_path / "one-out" / "report.html")

    from beam_prep.tools.sample import picture
    (tmp_path / "bare" / "train").mkdir(parents=True)
    rows = []
    for i in range(4):
        picture(i, 24, 20).save(tmp_path / "bare" / "train" / f"p{i}.png")
        rows.append(json.dumps({"file_name": f"p{i}.png", "text": f"caption <{i}>"}))
    (tmp_path / "bare" / "train" / "metadata.jsonl").write_text("\n".join(rows) + "\n")
    prepare_here("--input", str(tmp_path / "bare"), "--output", str(tmp_path / "bare-out"), "--image_size", "16",
                 "--file_format", "webdataset")
    bare = make_report(str(tmp_path / "bare-out"))
    assert bare.data.gallery.rows == ("all records",) and len(bare.data.gallery.images[0]) == 4
    text = page(tmp_path / "bare-out" / "report.html")
    assert "none: a dataset without labels" in text and bare.data.notes == ()


def test_a_thousand_classes_are_all_counted_and_the_gallery_capped(tmp_path):
    make_tree(tmp_path / "tree", {f"k{i:04d}": 1 for i in range(1000)}, size=(8, 8))
    prepare_here("--input", str(tmp_path / "tree"), "--output", str(tmp_path / "out"), "--image_size", "8",
                 "--validation_percent", "0", "--near_duplicate_distance", "-1")
    report = make_report(str(tmp_path / "out"))
    assert sum(len(images) for images in report.data.gallery.images) == Limits().max_gallery
    assert ("gallery", "the first 600 of 1,000 classes shown (at most 600 images)") in report.data.notes
    text = page(tmp_path / "out" / "report.html")
    assert text.count('data-manifest="splits.train.class_counts.') == 1000 + 1000  # the table and the gallery rows
    assert "the chart shows the 200 largest of 1,000 classes" in text


def test_a_large_errors_file_and_a_scan_limit_keep_counts_exact_and_say_what_is_left_out(output, tmp_path):
    """The million-record case by its caps: 50,000 failures in two reasons counted exactly, 20 named
    each; a gallery that may read 5 records says how many images it could not find."""
    copy = shutil.copytree(output, tmp_path / "out")
    reasons = ["OSError", "ValueError"]
    (copy / "errors.jsonl").write_text("".join(
        json.dumps({"path": f"{i}.jpg", "stage": "decode", "error_type": reasons[i % 3 == 0], "message": "bad"}) + "\n"
        for i in range(50_000)))
    report = make_report(str(copy), limits=Limits(max_scan=5))
    assert [(f.reason, f.count, len(f.files)) for f in report.data.failures] == [
        ("OSError", 33_333, 20), ("ValueError", 16_667, 20)]
    assert sum(len(images) for images in report.data.gallery.images) == 5
    assert ("gallery", "19 images fewer than the classes' counts allow: only the first 5 records were read "
                       "(the limit)") in report.data.notes
    text = page(copy / "report.html")
    assert "and 33,313 more in errors.jsonl" in text and "and 16,647 more in errors.jsonl" in text


@pytest.mark.parametrize("key, value", [
    ("labels", list(range(12))), ("splits.train.class_counts.c00", "2"), ("counts.failed", -1), ("options", ["x"]),
    ("sources", {"images": 1, "width": {"0": "y"}}), ("duplicates.near", [1]), ("skipped_by_reason", {"x": "y"}),
])
def test_a_manifest_with_values_the_writer_never_writes_is_one_line_exit_2_and_no_page(output, tmp_path, capsys,
                                                                                        key, value):
    copy = shutil.copytree(output, tmp_path / "out")
    manifest = json.loads((copy / "manifest.json").read_text())
    *parents, last = key.split(".")
    at = manifest
    for part in parents:
        at = at[part]
    at[last] = value
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert report_output.main([str(copy)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {copy / 'manifest.json'}: {key.split('.')[0]}")
    assert not (copy / "report.html").exists() and not list(copy.glob(".report-*"))


def test_a_failed_files_picture_is_shown_only_while_it_is_the_file_that_failed(tmp_path):
    """errors.jsonl gives the sha256 of the bytes that failed; the page shows the file only while it has
    them: a manifest naming ``/`` as its input and an errors.jsonl naming any readable image show nothing
    of it, whatever its line says."""
    from beam_prep.tools.report.thumbs import Thumbnail
    from beam_prep.tools.sample import picture

    make_tree(tmp_path / "tree", {"a": 2}, size=(24, 20))
    big = tmp_path / "tree" / "a" / "big.png"
    picture(7, 40, 40).save(big)
    out = tmp_path / "out"
    prepare_here("--input", str(tmp_path / "tree"), "--output", str(out), "--image_size", "16",
                 "--max_pixels", "1000")
    row = json.loads((out / "errors.jsonl").read_text())
    assert row["stage"] == "too_large" and row["sha256"] == hashlib.sha256(big.read_bytes()).hexdigest()
    report = make_report(str(out))
    assert isinstance(report.data.pictures[str(big)], Thumbnail)  # Pillow still shows it: the run's file
    big.write_bytes(big.read_bytes() + b"\0")
    assert make_report(str(out)).data.pictures[str(big)] == "not the run's file (changed since)"

    secret = tmp_path / "elsewhere" / "secret.png"
    secret.parent.mkdir()
    picture(3, 30, 30).save(secret)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["options"]["input"] = "/"
    (out / "manifest.json").write_text(json.dumps(manifest))
    lines = [{"path": str(secret), "relpath": "x", "stage": "decode", "error_type": "OSError", "message": "m"},
             {"path": str(secret) + "2", "relpath": "y", "stage": "decode", "error_type": "OSError", "message": "m",
              "sha256": "0" * 64}]
    shutil.copy(secret, str(secret) + "2")
    (out / "errors.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    report = make_report(str(out))
    assert report.data.pictures[str(secret)] == "not shown: the run recorded no sha256 of it (its bytes were not read)"
    assert report.data.pictures[str(secret) + "2"] == "not the run's file (changed since)"
    assert "data:image" not in page(out / "report.html").split('id=failures', 1)[1]


def test_a_run_that_changes_the_dataset_takes_its_report_away(tmp_path):
    """The page shows one dataset: --overwrite and --append take away the report beam-prep wrote (it would
    show the old one), and leave a report.html the user wrote."""
    make_tree(tmp_path / "tree", {"a": 2, "b": 2}, size=(24, 20))
    out = tmp_path / "out"
    args = ("--input", str(tmp_path / "tree"), "--output", str(out), "--image_size", "16")
    prepare_here(*args)
    make_report(str(out))
    prepare_here(*args, "--overwrite")
    assert not (out / "report.html").exists()
    make_report(str(out))
    make_tree(tmp_path / "tree", {"c": 2}, size=(30, 22))
    prepare_here(*args, "--append")
    assert not (out / "report.html").exists()
    assert json.loads((out / "manifest.json").read_text())["versions"][1]["version"] == 2
    make_report(str(out))
    text = page(out / "report.html")  # the options shown are the first run's: say so
    assert "<h3>versions (2)</h3>" in text and "options of the run that made version 1 (an append keeps them)" in text
    (out / "report.html").write_text("<p>my own notes</p>")
    prepare_here(*args, "--overwrite")
    assert (out / "report.html").read_text() == "<p>my own notes</p>"


def test_report_writes_over_no_file_it_did_not_write_no_link_and_no_folder(output, tmp_path, capsys):
    copy = shutil.copytree(output, tmp_path / "out")
    target = copy / "report.html"
    target.write_text("<p>my own notes</p>")
    assert report_output.main([str(copy)]) == 2
    assert capsys.readouterr().err == (f"error: {target} is not a report beam-prep wrote: left as it is; move it "
                                       "away, or write the report elsewhere with --to PAGE.html\n")
    assert target.read_text() == "<p>my own notes</p>"
    target.unlink()
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("mine")
    target.symlink_to(elsewhere)
    assert report_output.main([str(copy)]) == 2
    assert target.is_symlink() and elsewhere.read_text() == "mine"
    chosen = tmp_path / "chosen.html"
    chosen.symlink_to(elsewhere)
    assert report_output.main([str(copy), "--to", str(chosen)]) == 0  # the link replaced, never followed
    assert not chosen.is_symlink() and chosen.read_text().startswith("<!DOCTYPE html>")
    assert elsewhere.read_text() == "mine"
    target.unlink()
    target.mkdir()
    assert report_output.main([str(copy)]) == 2
    assert report_output.main([str(copy), "--to", str(target)]) == 2
    assert "it is a folder; name a file" in capsys.readouterr().err
    target.rmdir()
    assert report_output.main([str(copy)]) == 0  # its own page, it writes again
    assert report_output.main([str(copy)]) == 0
    assert not list(copy.glob(".report-*"))


def test_a_dataset_of_no_records_says_none_where_there_is_nothing(tmp_path):
    """Every file failed: no balance to call out, no gallery row "past the limit", no sources "not recorded"."""
    (tmp_path / "tree" / "a").mkdir(parents=True)
    for name in ("x.jpg", "y.jpg"):
        (tmp_path / "tree" / "a" / name).write_bytes(b"not a jpeg")
    prepare_here("--input", str(tmp_path / "tree"), "--output", str(tmp_path / "out"), "--image_size", "16")
    report = make_report(str(tmp_path / "out"))
    text = page(tmp_path / "out" / "report.html")
    assert report.data.notes == () and "inf" not in text and "past the limit" not in text
    assert "train</bdi>: no records</p>" in text and "none: no records in this split" in text
    assert "none: no image was made into a record" in text and "not recorded" not in text


def test_a_multi_label_record_is_in_the_gallery_of_each_of_its_labels(tmp_path):
    files = make_tree(tmp_path / "tree", {"cat": 3, "dog": 3}, size=(24, 20))
    table = tmp_path / "labels.csv"
    table.write_text("file_name,labels\n" + "".join(
        f"{p.relative_to(tmp_path / 'tree').as_posix()},{'cat;dog' if i % 2 else p.parent.name}\n"
        for i, p in enumerate(files)))
    prepare_here("--input", str(tmp_path / "tree"), "--output", str(tmp_path / "out"), "--image_size", "16",
                 "--metadata", str(table))
    counts = json.loads((tmp_path / "out" / "manifest.json").read_text())["splits"]["train"]["class_counts"]
    report = make_report(str(tmp_path / "out"))
    assert [len(images) for images in report.data.gallery.images] == [counts["cat"], counts["dog"]] == [5, 4]
    both = {im.filename for im in report.data.gallery.images[0]} & {im.filename for im in report.data.gallery.images[1]}
    assert both == {"cat/img_001.jpg", "dog/img_000.jpg", "dog/img_002.jpg"}
    assert report.data.notes == ()
    assert "a record counts under each of its labels" in page(tmp_path / "out" / "report.html")


@pytest.mark.parametrize("record, why", [(b"\xff\xfe not a proto", "DecodeError"), (b"", "IndexError")])
def test_a_shard_the_manifest_vouches_for_but_not_of_beam_preps_records_leaves_the_gallery_incomplete(
        output, tmp_path, capsys, record, why):
    """A manifest's sha256 vouches for the bytes, not for who wrote them: a record that is no Example, or
    one without the features beam-prep writes, is a note naming the shard, never a traceback."""
    import tensorflow as tf

    copy = shutil.copytree(output, tmp_path / "out")
    manifest = json.loads((copy / "manifest.json").read_text())
    train = manifest["splits"]["train"]
    shard = copy / train["shards"][0]
    with tf.io.TFRecordWriter(str(shard), options="GZIP") as writer:
        writer.write(record)
    train["shard_sha256"][0] = hashlib.sha256(shard.read_bytes()).hexdigest()
    train["shard_num_examples"][0] = 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    assert report_output.main([str(copy)]) == 1
    err = capsys.readouterr().err
    assert f"warning: gallery: incomplete: a record of {shard} is not one beam-prep writes ({why}" in err
    assert "Traceback" not in err and 'data-note="gallery"' in page(copy / "report.html")


def test_a_source_on_gs_too_large_to_show_is_said_so_and_a_small_one_shown(gcs_bucket, monkeypatch):
    """A failure at stage too_large is often of a huge file: its size is asked first (its bytes are not
    fetched, which the test server does not let a test see), a small one's shown."""
    import io

    from beam_prep.tools.report import thumbs
    from beam_prep.tools.sample import picture

    buffer = io.BytesIO()
    picture(1, 24, 20).save(buffer, "PNG")
    small = buffer.getvalue()
    monkeypatch.setattr(thumbs, "MAX_SOURCE_BYTES", len(small) + 10)
    big = small + bytes(100)
    gcs_bucket.write_bytes("in/big.png", big)
    gcs_bucket.write_bytes("in/small.png", small)
    sha = hashlib.sha256
    assert thumbs.from_source(gcs_bucket.url("in/big.png"), sha(big).hexdigest(), 128) == "too large to show"
    assert thumbs.from_source(gcs_bucket.url("in/gone.png"), sha(big).hexdigest(), 128) == "cannot read"
    shown = thumbs.from_source(gcs_bucket.url("in/small.png"), sha(small).hexdigest(), 128)
    assert isinstance(shown, thumbs.Thumbnail) and (shown.width, shown.height) == (24, 20)
