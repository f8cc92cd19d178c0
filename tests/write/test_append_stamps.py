"""An append tells a file unchanged by its size and stamp (``plan.listing.stamps``), reading only the others.

Each version keeps its sources' sizes and stamps (a local file's mtime, a gs:// object's generation);
an append of the first run's input grown reads (hashes) only the files whose path is new or whose
size or stamp differ from their record's. To show a file was not read, its bytes are replaced by
others of the same size, its mtime put back (``disguise``): counted unchanged unread, changed once
read (``--append_check content``, or a stamp that moved). A tree's files are dated an hour back
(``age``), as a user's are.
"""
from __future__ import annotations

import concurrent.futures
import gc
import gzip
import hashlib
import json
import os
import pathlib
import shutil
import time
import urllib.parse
import warnings

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from helpers import make_tree, prepare_here

from beam_prep.cli.options import config_from_options
from beam_prep.errors import DatasetError, OptionsError, StorageError
from beam_prep.write.grow import append
from beam_prep.write.plan.listing import stamps
from beam_prep.write.plan.walk import walk_tree

ARGS = ("--image_size", "16", "--validation_percent", "30", "--num_shards", "1")


def age(tree: pathlib.Path, seconds: float = 3600) -> None:
    """Every file under ``tree`` dated ``seconds`` back."""
    then = time.time() - seconds
    for path in tree.rglob("*"):
        if path.is_file():
            os.utime(path, (then, then))


def disguise(path: pathlib.Path) -> None:
    """Other bytes of the same size in ``path``, its mtime put back: only a read tells."""
    before = path.stat()
    path.write_bytes(bytes(255 - b for b in path.read_bytes()))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def appended(manifest: dict) -> dict:
    return manifest["versions"][-1]["appended"]


@pytest.fixture
def dataset(tmp_path) -> dict[str, pathlib.Path]:
    """A dataset of 12 files dated an hour back, then 3 new ones in its tree (dated back too)."""
    tree, out = tmp_path / "tree", tmp_path / "out"
    make_tree(tree, {"circles": 6, "squares": 6}, size=(24, 20))
    age(tree)
    prepare_here("--input", str(tree), "--output", str(out), *ARGS)
    make_tree(tmp_path / "new", {"circles": 2, "stars": 1}, size=(20, 24))
    age(tmp_path / "new", 1800)
    for image in (tmp_path / "new").rglob("*.jpg"):
        (tree / image.parent.name).mkdir(exist_ok=True)
        shutil.copy2(image, tree / image.parent.name / f"new_{image.name}")  # its date too
    return {"tree": tree, "out": out, "root": tmp_path}


@pytest.mark.slow  # runs a pipeline
def test_an_append_of_the_grown_input_reads_no_unchanged_file(dataset):
    tree, out = dataset["tree"], dataset["out"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stamp_files"] == [{"version": 1, "file": "stamps-v1.tsv.gz", "lines": 12,
                                        "sha256": manifest["stamp_files"][0]["sha256"]}]
    lines = gzip.decompress((out / "stamps-v1.tsv.gz").read_bytes()).decode().splitlines()
    first = tree / "circles" / "img_000.jpg"
    assert lines[0] == f'{first.stat().st_size}\t{first.stat().st_mtime_ns}\t"circles/img_000.jpg"'
    old = sorted(p for p in tree.rglob("img_*.jpg"))
    for path in old:
        disguise(path)
    touched = tree / "squares" / "img_001.jpg"  # a new mtime, the same bytes: read, and unchanged
    touched.write_bytes(bytes(255 - b for b in touched.read_bytes()))
    edited = tree / "squares" / "img_002.jpg"  # other bytes, of the same size, and a new mtime: read, changed
    os.utime(edited)
    content = shutil.copytree(out, dataset["root"] / "by-content")
    manifest = prepare_here("--input", str(tree), "--output", str(out), "--append")
    assert appended(manifest) == {"new_labels": ["stars"], "unchanged": 11, "failed_before": 0, "skipped_before": 0,
                                  "copies": 0, "changed": 1, "gone": 0}
    changed = [json.loads(line) for line in (out / "changed.jsonl").read_text().splitlines()]
    assert [(row["change"], row["path"]) for row in changed] == [("changed", str(edited))]
    assert sum(s["num_examples"] for s in manifest["versions"][-1]["splits"].values()) == 3
    # The new version keeps its new files' stamps, the first its own.
    assert [(e["version"], e["file"], e["lines"]) for e in manifest["stamp_files"]] == [
        (1, "stamps-v1.tsv.gz", 12), (2, "stamps-v2.tsv.gz", 3)]
    # Read by content, every disguised file is changed.
    manifest = prepare_here("--input", str(tree), "--output", str(content), "--append", "--append_check", "content")
    assert (appended(manifest)["unchanged"], appended(manifest)["changed"]) == (1, 11)


@pytest.mark.slow  # runs a pipeline
def test_an_append_of_a_dataset_that_keeps_no_stamps_reads_every_file(dataset):
    """A dataset made before stamps were kept (as today's main, or a file of the tree modified as the run
    listed it): every file at a path it holds is read, and the append keeps the stamps of its own."""
    tree, out = dataset["tree"], dataset["out"]
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["stamp_files"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "stamps-v1.tsv.gz").unlink()
    for path in (tree / "circles").glob("img_*.jpg"):
        disguise(path)
    manifest = prepare_here("--input", str(tree), "--output", str(out), "--append")
    assert (appended(manifest)["unchanged"], appended(manifest)["changed"]) == (6, 6)
    assert [(e["version"], e["lines"]) for e in manifest["stamp_files"]] == [(2, 3)]


@pytest.mark.slow  # runs a pipeline
def test_a_stamp_file_not_the_manifests_is_not_used(dataset, caplog):
    tree, out = dataset["tree"], dataset["out"]
    kept = out / "stamps-v1.tsv.gz"
    kept.write_bytes(gzip.compress(gzip.decompress(kept.read_bytes()), mtime=0))  # other bytes, the same lines
    disguise(tree / "circles" / "img_000.jpg")
    manifest = prepare_here("--input", str(tree), "--output", str(out), "--append")
    assert (appended(manifest)["unchanged"], appended(manifest)["changed"]) == (11, 1)
    assert "stamps-v1.tsv.gz left out (its sha256 is" in caplog.text


@pytest.mark.slow  # runs a pipeline
@pytest.mark.parametrize("field, damaged", [(0, b"12a"), (1, "é".encode())], ids=["a size", "a stamp"])
def test_a_stamp_line_damaged_in_a_file_the_manifest_lists_refuses_the_append(dataset, field, damaged):
    """Bytes the manifest's sha256 vouches for, a line in them not a stamp line: refused, naming the file, and
    nothing written (the damage is the dataset's, which verify reports)."""
    tree, out = dataset["tree"], dataset["out"]
    kept = out / "stamps-v1.tsv.gz"
    lines = gzip.decompress(kept.read_bytes()).split(b"\n")
    fields = lines[3].split(b"\t")
    fields[field] = damaged
    lines[3] = b"\t".join(fields)
    kept.write_bytes(gzip.compress(b"\n".join(lines), mtime=0))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["stamp_files"][0]["sha256"] = hashlib.sha256(kept.read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest))
    before = sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir())
    with pytest.raises(DatasetError, match=r"stamps-v1\.tsv\.gz holds a line that is not a stamp line"):
        prepare_here("--input", str(tree), "--output", str(out), "--append")
    assert sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir()) == before


def test_the_walk_stamps_each_file_with_its_mtime(tmp_path):
    old, fresh = tmp_path / "old.jpg", tmp_path / "fresh.jpg"
    old.write_bytes(b"x" * 5)
    fresh.write_bytes(b"y" * 7)
    age(tmp_path, 60)
    os.utime(fresh)
    (tmp_path / "pipe").mkdir()
    os.mkfifo(tmp_path / "pipe" / "fifo")
    walked = {pathlib.Path(path).name: (size, stamp, reason) for path, size, stamp, reason in walk_tree(str(tmp_path))}
    assert walked == {"old.jpg": (5, str(old.stat().st_mtime_ns), None), "fresh.jpg": (7, str(fresh.stat().st_mtime_ns), None),
                      "fifo": (0, None, "not a regular file")}


@pytest.mark.slow  # runs a pipeline
def test_a_gs_object_written_again_is_read_and_the_others_are_not(gcs_server, gcs_bucket, tmp_path):
    """On gs:// an object's generation is its stamp: every write gives a new one. The append opens no
    object of the tree but the new one and those written again (the same bytes: unchanged; others: changed),
    names a URL must quote among them."""
    make_tree(tmp_path / "tree", {"ant": 3, "bee": 2}, size=(24, 20))
    (tmp_path / "tree/ant/img_001.jpg").rename(tmp_path / "tree/ant/re;$(x) ?%41#.jpg")
    gcs_bucket.upload_tree(tmp_path / "tree", "tree")
    out = gcs_bucket.url("out")
    prepare_here("--input", gcs_bucket.url("tree"), "--output", out, "--image_size", "16", "--num_shards", "1")
    assert [e["lines"] for e in json.loads(gcs_bucket.read_bytes("out/manifest.json"))["stamp_files"]] == [5]
    rewritten = "tree/ant/re;$(x) ?%41#.jpg"
    gcs_bucket.write_bytes(rewritten, gcs_bucket.read_bytes(rewritten))  # the same bytes, a new generation
    edited = "tree/bee/img_000.jpg"
    gcs_bucket.write_bytes(edited, bytes(255 - b for b in gcs_bucket.read_bytes(edited)))
    make_tree(tmp_path / "more", {"bee": 1}, size=(20, 24))
    gcs_bucket.write_bytes("tree/bee/new é;%2F?.jpg", (tmp_path / "more" / "bee" / "img_000.jpg").read_bytes())
    seen = len(gcs_server.gateway.seen())
    manifest = prepare_here("--input", gcs_bucket.url("tree"), "--output", out, "--append")
    assert (appended(manifest)["unchanged"], appended(manifest)["changed"]) == (4, 1)
    # Each object opened (its metadata asked for, or its bytes), by name.
    opened = {urllib.parse.unquote(r.path.split("/o/", 1)[1].split("?")[0]) for r in gcs_server.gateway.seen()[seen:]
              if r.method == "GET" and "/o/" in r.path}
    read = {name for name in opened if name.startswith("tree/") and name.endswith(".jpg")}
    assert read == {rewritten, edited, "tree/bee/new é;%2F?.jpg"}


@pytest.mark.parametrize("flags,message", [
    (["--append_check", "content"], r"^--append_check content says how --append tells a file unchanged: pass --append"),
    (["--append", "--append_check", "mtime"], r"^--append_check must be one of stat, content, not 'mtime'$")])
def test_append_check_takes_stat_or_content_and_only_with_append(tmp_path, flags, message):
    (tmp_path / "tree").mkdir()
    argv = ["--input", str(tmp_path / "tree"), "--output", str(tmp_path / "out"), *flags]
    with pytest.raises(OptionsError, match=message):
        config_from_options(PipelineOptions(argv))
    assert config_from_options(PipelineOptions([*argv[:4], "--append"])).append_check == "stat"


def test_the_run_file_lists_each_file_with_a_stamp_sorted_by_path(tmp_path):
    from beam_prep.write.shared.entry import FileEntry

    writer = stamps.Writer()
    for name, stamp in (("b/2.jpg", "9"), ("a/\u00e9.jpg", "g17"), ("a/none.jpg", None)):
        writer.add(FileEntry(f"/r/{name}", name, "train", name[0], 0, 3, stamp=stamp))
    writer.close(str(tmp_path))
    assert gzip.decompress((tmp_path / stamps.RUN_FILE).read_bytes()).decode().splitlines() == [
        '3\tg17\t"a/\\u00e9.jpg"', '3\t9\t"b/2.jpg"']


@pytest.mark.parametrize("name", ["a/b.jpg", 'quote"d', "back\\slash", "caf\u00e9", "\udcff.jpg", "tab\there",
                                  "new\nline", "", "~!#[]{}$(x);", "\u6f22\u5b57/\U0001f600.png"])
def test_a_kept_path_reads_back_as_json_reads_it(name):
    """The kept files' quoted paths are read by a shortcut for plain ASCII: every name reads as json.loads reads it."""
    from beam_prep.write.shared.entry import _quoted, unquoted

    quoted = _quoted(name).encode()
    assert unquoted(quoted) == json.loads(quoted) == name


@pytest.mark.parametrize("line", [b'"open', b'close"', b'"a"b"', b'"ctl\x01"', b'"\xff"', b""])
def test_a_damaged_kept_path_is_refused_as_json_refuses_it(line):
    from beam_prep.write.shared.entry import unquoted

    with pytest.raises(ValueError):
        json.loads(line)
    with pytest.raises(ValueError):
        unquoted(line)


@pytest.mark.parametrize("inline", [(64, 16 << 20), (0, 0)], ids=["read inline", "read on threads"])
def test_the_files_an_append_reads_give_their_sha256_or_name_the_one_it_cannot_read(tmp_path, monkeypatch, inline):
    monkeypatch.setattr(append, "_INLINE", inline)
    files = []
    for i in range(5):
        path = tmp_path / f"f{i}.jpg"
        path.write_bytes(bytes([i]) * (i * 70_000))
        files.append((str(path), path.stat().st_size))
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        assert append._reading(pool, files)() == {
            path: hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest() for path, _ in files}
        gone = str(tmp_path / "gone.jpg")
        with pytest.raises(StorageError, match=f"cannot read {gone}"):
            append._reading(pool, [*files, (gone, 10)])()


def test_the_changes_an_append_found_are_read_back_and_their_file_closed(tmp_path):
    from beam_prep.write.shared import layout

    lines = ['{"change": "changed", "file": "a/\u00e9.jpg"}', '{"change": "gone", "file": "b.jpg"}']
    (tmp_path / layout.CHANGES).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    gc.collect()  # what earlier tests left, warned of before
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(append.found_lines(str(tmp_path))) == lines
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning) and layout.CHANGES in str(w.message)] == []
    assert list(append.found_lines(str(tmp_path / "none"))) == []
