"""A run killed, or failing, at any step of publishing its dataset: the same command finishes it, byte for byte.

Each kill-loop test kills a run at every step of its publication in turn (``publication.KILL_VARIABLE``:
the run SIGKILLs itself right after step N), locally and on gs:// (the GCS test server), and runs
the same command again after each kill (``tests/children/publish_kills.py``, which forks the
runs from one process: a run costs its own work only, and each resumes a run killed as its
publication began, so that it only publishes). Every file under the output, the run's folder
included, must then be what an uninterrupted run leaves (byte for byte; the manifest's ``created``
time aside), and the old dataset an ``--overwrite`` run replaces is never lost: whole and unchanged
until the publication is recorded, finished into the new one after; a step that fails instead
(``fail:N``) leaves the old dataset whole, or the new one. Then what a rerun does with other
options, a record that is not one beam-prep writes, files put back or removed by hand, links, an
empty run folder, ``WriteImageDataset`` and its retried ``Finalize``, and a move that fails for real.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess

import pytest
from helpers import REPO, child, make_tree, prepare_here, run_prepare

from beam_prep.model import features
from beam_prep.write.finish import publication
from beam_prep.write.shared import layout
from pipelines import prepare_images
from pipelines.prepare_images import command

pytestmark = pytest.mark.slow  # every test runs the command, or kills it

ARGS = ("--image_size", "16", "--validation_percent", "40", "--direct_running_mode", "in_memory")
SUMMARY = "beam-prep: 11 of 12 images written in"
KILL = publication.KILL_VARIABLE
REPORT_PAGE = b"<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>" + layout.REPORT_MARK + b"</head></html>\n"


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> pathlib.Path:
    """11 images in 2 labels, one broken (errors.jsonl) and a file skipped (skipped.jsonl)."""
    root = tmp_path_factory.mktemp("publish") / "tree"
    make_tree(root, {"cat": 6, "dog": 5})
    (root / "dog" / "broken.jpg").write_bytes(b"not a jpeg")
    (root / "dog" / "notes.txt").write_text("not an image")
    return root


def kill_at_each_step(output: str, saved: str, *args: str, flags: tuple[str, ...] = (), gcs_server=None) -> list[dict]:
    """The rows ``publish_kills`` prints for the command ``--output output ARGS``."""
    argv = child("publish_kills", output, saved, *flags, "--", *args)
    if gcs_server is not None:
        result = gcs_server.run(argv, cwd=REPO, timeout_s=600)
    else:
        result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-6000:]
    return [json.loads(line) for line in result.stdout.splitlines()]


def recorded(files: dict[str, str]) -> bool:
    """Whether a run's publication was recorded (its ``publish.json`` is among ``files``)."""
    return any(name.endswith(f"/{publication.RECORD}") for name in files)


def top(files: dict[str, str]) -> dict[str, str]:
    """The files directly in the output folder: the dataset's, whole or not."""
    return {name: digest for name, digest in files.items() if "/" not in name}


def top_bytes(folder: pathlib.Path) -> dict[str, bytes]:
    """The files directly in a local folder, with their bytes."""
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def without_manifest(files: dict[str, str]) -> dict[str, str]:
    return {name: digest for name, digest in files.items() if name != "manifest.json"}


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def check_each_kill_finished(rows: list[dict], files: int, summary: str = SUMMARY,
                             overwrite_first: bool = False) -> list[dict]:
    """Every kill, by step: the run again exits 0 with its ``summary`` and leaves what the uninterrupted
    run left (every file, the run's folder gone), saying that it finished a recorded publication;
    a kill before the record left the output folder's files as they were. Returns the kills' rows."""
    initial, reference, base = rows[0]["initial"], rows[1]["reference"], rows[2]["base"]
    assert len(reference) == files and not any(name.startswith(layout.WORK_DIR) for name in reference)
    assert any(name.endswith("/run.json") for name in base) and not recorded(base)
    *kills, last = [row for row in rows if "step" in row]
    assert [row["step"] for row in [*kills, last]] == list(range(1, len(kills) + 2))
    assert all(row["killed"] for row in kills) and not last["killed"]
    # Its manifest records its options, --overwrite among them: a reference run given it differs there.
    assert without_manifest(last["final"]) == without_manifest(reference)
    assert last["final"]["manifest.json"] == reference["manifest.json"] or overwrite_first
    reference = last["final"]
    assert len(kills) >= 8, kills  # the staged files, the record, the moves, the removals
    for row in kills:
        step = f"killed after step {row['step']}"
        assert row["code"] == 0, (step, row["stderr"][-3000:])
        assert summary in row["stdout"], (step, row["stdout"])
        assert row["final"] == reference, step
        assert ("finishing run" in row["stderr"]) == recorded(row["after_kill"]), (step, row["stderr"][-3000:])
        if not recorded(row["after_kill"]):
            assert top(row["after_kill"]) == top(initial), step
    assert 0 < sum(recorded(row["after_kill"]) for row in kills) < len(kills)
    return kills


def check_each_failure_undone(rows: list[dict]) -> None:
    """Every step that failed from the record on (``--fail``): the run exits 1 with one line, leaving the
    old dataset whole (put back) or, once the new manifest is in, the new one; the same command then
    finishes the publication; so does it after a kill while the run put the old dataset back."""
    initial, final = top(rows[0]["initial"]), [row for row in rows if "step" in row][-1]["final"]
    fails = [row for row in rows if "fail" in row]
    assert len(fails) >= 5, fails
    for row in fails:
        step = f"failed at step {row['fail']}"
        assert row["code"] == 1 and len(error_lines(row["stderr"])) == 1, (step, row["stderr"][-3000:])
        assert top(row["after_fail"]) in (initial, top(final)), step
        assert row["again"] == 0 and row["final"] == final, (step, row["again_stderr"][-3000:])
    undone = [row for row in fails if "holds its old dataset again" in row["stderr"]]
    assert len(undone) >= 3 and all(top(row["after_fail"]) == initial for row in undone)
    (killed,) = [row for row in rows if "fail_kill" in row]
    assert killed["killed"] and top(killed["after_kill"]) != top(final), killed["fail_kill"]
    assert killed["code"] == 0 and killed["final"] == final, killed["stderr"][-3000:]


def test_a_run_killed_at_each_step_of_publishing_is_finished_by_the_same_command(tree, tmp_path):
    """Uncompressed TFRecords: shards, DALI indexes, TFDS's metadata and the rest, two splits."""
    rows = kill_at_each_step(str(tmp_path / "out"), str(tmp_path / "saved"), "--input", str(tree), *ARGS,
                             "--compression", "none")
    kills = check_each_kill_finished(rows, 16)
    # No step leaves a manifest beside a part of the dataset: a reader sees the whole dataset or none.
    reference = rows[1]["reference"]
    for row in kills:
        if "manifest.json" in row["after_kill"]:
            assert {name: row["after_kill"][name] for name in reference} == reference, row["step"]


def test_an_overwrite_killed_or_failing_at_each_step_never_loses_the_old_dataset(tree, tmp_path):
    """An --overwrite run replacing a dataset of other images in files of the same names (the shards,
    labels.txt, TFDS's metadata...) and of others (a test split's shard, removed), killed at each step
    and run again without --overwrite, as the guide says: until its publication is recorded the old
    dataset is there whole, byte for byte; after, the run again finishes the new one; and at every
    kill TFDS reads exactly the old dataset, exactly the new one, or refuses (it read the old metadata
    with new shards). A step that fails instead puts the old dataset back (``check_each_failure_undone``)."""
    out, saved = tmp_path / "out", tmp_path / "saved"
    # Of the same shape (TFDS refuses shards of another shape than its metadata says), other pixels.
    prepare_here("--input", str(tree), "--output", str(out), *ARGS, "--compression", "none", "--jpeg_quality", "40")
    shutil.copyfile(out / "validation-00000-of-00001.tfrecord", out / "test-00000-of-00001.tfrecord")
    (out / layout.REPORT).write_bytes(REPORT_PAGE)  # the old dataset's report goes with it
    rows = kill_at_each_step(str(out), str(saved), "--input", str(tree), *ARGS, "--compression", "none",
                             "--started_with_overwrite", flags=("--fail", "--keep"))
    kills = check_each_kill_finished(rows, 16, overwrite_first=True)
    old, new = top(rows[0]["initial"]), [row for row in rows if "step" in row][-1]["final"]
    assert {"test-00000-of-00001.tfrecord", layout.REPORT} <= set(old) - set(new)
    assert {"train-00000-of-00001.tfrecord", "labels.txt", "dataset_info.json", "manifest.json"} <= set(old) & set(new)
    assert old["train-00000-of-00001.tfrecord"] != new["train-00000-of-00001.tfrecord"]
    # Past the record, the folder holds neither dataset until the run again finishes the new one.
    assert any(top(row["after_kill"]) not in (old, new) for row in kills if recorded(row["after_kill"]))
    before, after = tfds_reads(saved / "initial"), tfds_reads(out)
    assert before is not None and after is not None and before != after
    states = {}  # each folder a kill left, once (many kills leave the same files in it)
    for row in kills:
        states.setdefault(tuple(sorted(top(row["after_kill"]).items())), row["step"])
    reads = {step: tfds_reads(saved / f"kill-{step}") for step in states.values()}
    assert {step: read for step, read in reads.items() if read not in (None, before, after)} == {}
    assert before in reads.values() and after in reads.values() and None in reads.values()
    check_each_failure_undone(rows)


def tfds_reads(folder: pathlib.Path) -> dict[str, list[tuple[str, str]]] | None:
    """What TensorFlow Datasets reads from ``folder`` (each split's records: file name and the decoded
    pixels' sha256), or None where it refuses to read it."""
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder_from_directory(str(folder))
        return {split: sorted((ex[features.FILENAME].decode(), hashlib.sha256(ex[features.ENCODED].tobytes()).hexdigest())
                              for ex in tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)))
                for split in builder.info.splits}
    except Exception:  # noqa: BLE001 - any refusal: no metadata, a shard missing or cut short
        return None


def test_a_drop_run_killed_at_each_step_is_finished_without_converting_again(tmp_path):
    """--cross_split_duplicates drop (finding 6's example): the shards it rewrote without the copies
    are published from their staged names, the shards written by the workers left as they were,
    so a run killed anywhere resumes by publishing, never by converting an image again."""
    root = tmp_path / "tree"
    make_tree(root, {"cat": 3, "dog": 3}, splits=("train", "validation"))
    shutil.copyfile(root / "train" / "cat" / "img_000.jpg", root / "validation" / "dog" / "copy.jpg")
    rows = kill_at_each_step(str(tmp_path / "out"), str(tmp_path / "saved"), "--input", str(root), *ARGS[:2],
                             "--direct_running_mode", "in_memory", "--cross_split_duplicates", "drop")
    kills = check_each_kill_finished(rows, 11, "beam-prep: 12 of 13 images written in")
    for row in kills:  # a run again before the record resumes with every shard kept
        resumed = re.search(r"resuming run \S+: (\d+) of (\d+) shards already written", row["stderr"])
        assert (resumed is None) == recorded(row["after_kill"]), row["step"]
        assert resumed is None or resumed[1] == resumed[2], (row["step"], resumed[0])


def test_an_append_killed_at_each_step_keeps_the_old_version_whole_and_is_finished(tree, tmp_path):
    """An --append (a new class, uncompressed TFRecords with DALI indexes): before, while and after its shards
    are published, the old version's shards are there byte for byte beside its manifest, or the new
    version is there whole; the same command then ends where an uninterrupted append ends. A step that
    fails puts back each file it replaced (``check_each_failure_undone``)."""
    out, batch = tmp_path / "out", tmp_path / "batch"
    prepare_here("--input", str(tree), "--output", str(out), *ARGS, "--compression", "none")
    (out / layout.REPORT).write_bytes(REPORT_PAGE)  # it shows the old version: the append takes it away
    make_tree(batch, {"cat": 2, "eel": 2}, size=(20, 24))
    rows = kill_at_each_step(str(out), str(tmp_path / "saved"), "--input", str(batch), "--append",
                             "--direct_running_mode", "in_memory", flags=("--fail",))
    kills = check_each_kill_finished(rows, 23, "beam-prep: 15 of 16 images written in")
    initial, final = top(rows[0]["initial"]), top([row for row in rows if "step" in row][-1]["final"])
    assert layout.REPORT in initial and layout.REPORT not in final
    old = {name: digest for name, digest in initial.items() if "-000" in name}  # shards, indexes
    assert len(old) == 4
    for row in kills:  # the old version whole, or the new one: its manifest never beside a part of it
        now = top(row["after_kill"])
        assert {name: now.get(name) for name in old} == old, row["step"]
        assert now["manifest.json"] in (initial["manifest.json"], final["manifest.json"]), row["step"]
        assert now["manifest.json"] == initial["manifest.json"] or now == final, row["step"]
    new = set(final) - set(initial)
    assert {name for name in new if "-v2-" in name} == {name for name in new
                                                         if name not in ("changed.jsonl", "hashes-v2.tsv.gz", "stamps-v2.tsv.gz")}
    check_each_failure_undone(rows)


def test_an_overwrite_into_gs_killed_or_failing_at_each_step_is_finished(tree, gcs_server, gcs_bucket):
    """On gs:// a move is a copy and a delete (the same rename, 100 files at a time; an entry file
    alone), each a step here; the old dataset is moved aside and back the same way."""
    gcs_server.run(command("--input", str(tree), "--output", gcs_bucket.url("out"), "--image_size", "8", *ARGS[2:]),
                   cwd=REPO)
    rows = kill_at_each_step(gcs_bucket.url("out"), gcs_bucket.url("saved"), "--input", str(tree), *ARGS[:2],
                             "--direct_running_mode", "in_memory", "--started_with_overwrite", flags=("--fail",),
                             gcs_server=gcs_server)
    check_each_kill_finished(rows, 10, overwrite_first=True)
    check_each_failure_undone(rows)
    final = [row for row in rows if "step" in row][-1]["final"]
    assert gcs_bucket.list_names("out/") == sorted(f"out/{name}" for name in final)


def test_a_gs_move_cut_between_its_copy_and_its_delete_is_finished(tree, gcs_server, gcs_bucket):
    """Killed as it published, then each file copied to its target but left in the run's folder, as a
    rename killed between its copy and its delete leaves them: the same command publishes the
    staged bytes, and nothing else is left under the output."""
    argv = command("--input", str(tree), "--output", gcs_bucket.url("out"), *ARGS)
    killed = gcs_server.run(argv, cwd=REPO, extra_env={publication.KILL_VARIABLE: str(STAGED_FILES + 1)},
                            check=False)
    assert killed.returncode == -9, killed.stderr[-3000:]
    (record,) = [name for name in gcs_bucket.list_names("out/") if name.endswith(f"/{publication.RECORD}")]
    folder = record.rsplit("/", 1)[0]
    moves = json.loads(gcs_bucket.read_bytes(record))["moves"]
    assert [name for name in gcs_bucket.list_names("out/") if "/.beam-prep/" not in f"/{name}"] == []
    published = {}
    for move in moves:
        source, target = move["from"], move["to"]
        published[target] = gcs_bucket.read_bytes(f"{folder}/{source}")
        gcs_bucket.write_bytes(f"out/{target}", published[target])
    again = gcs_server.run(argv, cwd=REPO)
    assert "finishing run" in again.stderr and SUMMARY in again.stdout
    assert gcs_bucket.list_names("out/") == sorted(f"out/{target}" for target in published)
    assert all(gcs_bucket.read_bytes(f"out/{target}") == data for target, data in published.items())


# A gzip run's staged files: errors.jsonl, skipped.jsonl, duplicates.jsonl, flat.jsonl, labels.txt, the kept hash
# file (hashes-v1.tsv.gz), the kept stamp file (stamps-v1.tsv.gz), README.md, manifest.json.
STAGED_FILES = 9


def linked_copy(source: pathlib.Path, target: pathlib.Path) -> None:
    """``source`` copied as hard links: the same files (a publication knows its own by their inodes)."""
    shutil.copytree(source, target, symlinks=True, copy_function=os.link)


@pytest.fixture(scope="module")
def killed_mid_publish(tree, tmp_path_factory):
    """``killed_mid_publish()``: the output folder of the command with ARGS killed once it had moved its first
    shard into the folder, put back where the run wrote it (its run record names the path); made once."""
    base = tmp_path_factory.mktemp("mid-publish")
    out = base / "out"
    killed = run_prepare("--input", str(tree), "--output", str(out), *ARGS,
                         env={**os.environ, KILL: str(STAGED_FILES + 2)})
    assert killed.returncode == -9, killed.stderr
    assert [p.name for p in out.iterdir() if p.is_file()] == ["train-00000-of-00001.tfrecord.gz"]
    linked_copy(out, base / "as-killed")

    def put_back() -> pathlib.Path:
        shutil.rmtree(out)
        linked_copy(base / "as-killed", out)
        return out

    return put_back


def test_other_options_after_a_kill_mid_publish_finish_it_first(tree, killed_mid_publish, capfd):
    """A run with other options finishes the publication it finds first, then is refused as with any
    dataset there (--overwrite to replace it); with --overwrite it then replaces it."""
    out = killed_mid_publish()
    argv = ["--input", str(tree), "--output", str(out), "--image_size", "24", *ARGS[2:]]
    assert prepare_images.main(argv) == 2
    err = capfd.readouterr().err
    assert "finishing run" in err
    assert f"--output {out} already holds a dataset" in err and "--overwrite" in err
    assert json.loads((out / "manifest.json").read_text())["image"]["height"] == 16  # the killed run's
    assert not (out / layout.WORK_DIR).exists()
    assert prepare_images.main([*argv, "--overwrite"]) == 0
    assert json.loads((out / "manifest.json").read_text())["image"]["height"] == 24


def test_the_same_command_with_overwrite_finishes_then_starts_over(tree, killed_mid_publish, capfd):
    out = killed_mid_publish()
    assert prepare_images.main(["--input", str(tree), "--output", str(out), *ARGS, "--overwrite"]) == 0
    captured = capfd.readouterr()
    assert "finishing run" in captured.err and SUMMARY in captured.out
    assert not re.search(r"\b0 images/s", captured.out)  # it converted the images again, as --overwrite asks
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md", "duplicates.jsonl", "errors.jsonl", "flat.jsonl", "hashes-v1.tsv.gz", "labels.txt", "manifest.json", "skipped.jsonl",
        "stamps-v1.tsv.gz", "train-00000-of-00001.tfrecord.gz", "validation-00000-of-00001.tfrecord.gz"]


ESCAPE_FROM = {"from": "../../escaped.txt", "to": "labels.txt", "file": "x"}
ESCAPE_TO = {"from": "staged/labels.txt", "to": "../escaped.txt", "file": "x"}


@pytest.mark.parametrize("edit, said", [
    (lambda body: body["moves"].insert(0, ESCAPE_FROM), "moves[0].from is '../../escaped.txt', outside the run's folder"),
    (lambda body: body["moves"].insert(0, ESCAPE_TO), "moves[0].to"),
    (lambda body: body["old"].append({"name": "notes-of-mine.txt", "file": "x"}), "is 'notes-of-mine.txt', not a dataset's file"),
    (lambda body: body["moves"].insert(0, dict(body["moves"][-1], **{"from": "staged/extra.json"})),
     "names 'manifest.json' a second time"),
    (lambda body: body["old"].extend([{"name": "labels.txt", "file": "x"}] * 2), "names 'labels.txt' a second time"),
    (lambda body: body.update(run_id="another-run"), "run_id is 'another-run': another run's"),
    (lambda body: body.update(output="/elsewhere"), "output is '/elsewhere': it publishes into another folder"),
    (lambda body: body.update(moves="all of them"), "moves is a string, not a list"),
    (lambda body: body.update(moves=[["staged/manifest.json", "manifest.json"]]), "moves[0] is a list, not an object"),
    (lambda body: body.pop("moves"), "moves is missing"),
    (lambda body: body["old"].append({"name": "labels.txt"}), "old[0].file is missing"),
    (lambda body: body["old"].append({"name": "labels.txt", "file": "not a file"}),
     "old[0].file is 'not a file', not a file's identity"),
    (lambda body: body.update(append="yes"), "append is a string, not true or false"),
    (lambda body: body.update(append=True, old=[{"name": "test-00000-of-00001.tfrecord.gz", "file": "x"}]),
     "old names 'test-00000-of-00001.tfrecord.gz', which no move replaces (an append removes nothing but the "
     "old version's report.html)"),
])
def test_a_publication_record_beam_prep_does_not_write_is_refused(tree, killed_mid_publish, capfd, edit, said):
    """The record is data in the output folder: a move from or to outside the folders, a file no
    dataset holds, a name twice, another run's or another folder's record, a field of the wrong kind
    or missing is refused in one line naming the record, the field and why, and --overwrite, with
    nothing moved or removed; --overwrite starts over."""
    out = killed_mid_publish()
    (record,) = (out / layout.WORK_DIR).glob(f"*/{publication.RECORD}")
    body = json.loads(record.read_text())
    edit(body)
    record.with_suffix(".edited").write_text(json.dumps(body))
    record.with_suffix(".edited").replace(record)  # not in place: the fixture's copy shares its inode
    (out / "notes-of-mine.txt").write_text("mine")
    (out / layout.WORK_DIR / "claim.json").unlink()  # the killed run's, released by any run after
    before = sorted(p.relative_to(out.parent) for p in out.parent.rglob("*"))
    argv = ["--input", str(tree), "--output", str(out), *ARGS]
    assert prepare_images.main(argv) == 2
    (line,) = error_lines(capfd.readouterr().err)
    assert f"whose record {record} cannot be used" in line and "pass --overwrite to start over" in line
    assert said in line
    assert sorted(p.relative_to(out.parent) for p in out.parent.rglob("*")) == before
    assert prepare_images.main([*argv, "--overwrite"]) == 0
    assert (out / "notes-of-mine.txt").read_text() == "mine" and not (out.parent / "escaped.txt").exists()
    assert (out / "manifest.json").exists() and not (out / layout.WORK_DIR).exists()


def test_a_file_removed_by_hand_mid_publish_is_named(tree, killed_mid_publish, capfd):
    out = killed_mid_publish()
    (out / "train-00000-of-00001.tfrecord.gz").unlink()  # moved, then removed
    assert prepare_images.main(["--input", str(tree), "--output", str(out), *ARGS]) == 1
    err = capfd.readouterr().err
    assert "cannot finish publishing run" in err and "e.g. train-00000-of-00001.tfrecord.gz" in err
    assert "pass --overwrite to start over" in err


def _killed_files(out: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """The shard the killed run moved into ``out``, and the one still in its folder."""
    (work,) = (out / layout.WORK_DIR).glob(f"*/{publication.RECORD}")
    return out / "train-00000-of-00001.tfrecord.gz", work.parent / "validation-00000-of-00001.tfrecord.gz"


def _new_inode(path: pathlib.Path) -> None:
    """``path`` replaced by a copy of its bytes: another inode (what a copy back from a backup, or
    another filesystem's mount, gives)."""
    shutil.copyfile(path, path.with_name(path.name + ".copy"))
    os.replace(path.with_name(path.name + ".copy"), path)


def test_a_kill_mid_publish_is_finished_after_its_files_are_touched(tree, killed_mid_publish, capfd):
    """A sync tool or ``touch`` changes the files' times (and a remount their device): a publication
    knows its files by inode and size, so the same command still finishes it."""
    out = killed_mid_publish()
    files = _killed_files(out)
    times = [path.stat().st_mtime_ns for path in files]
    try:
        for path in files:
            os.utime(path, ns=(1_000_000_000, 1_000_000_000))
        assert prepare_images.main(["--input", str(tree), "--output", str(out), *ARGS]) == 0
        assert "finishing run" in capfd.readouterr().err
        assert (out / "manifest.json").exists() and not (out / layout.WORK_DIR).exists()
    finally:  # the fixture's files share these inodes
        for path, mtime in zip(files, times):
            os.utime(path if path.exists() else out / path.name, ns=(mtime, mtime))


def test_a_kill_mid_publish_is_finished_after_its_files_are_copied_with_the_same_bytes(
        tree, killed_mid_publish, capfd):
    """Files copied to new inodes with their bytes (the moved shard, the one still to move, a staged file) are
    the run's: compared by sha256 where the inode differs; a file of other bytes, of the same size, is not."""
    out = killed_mid_publish()
    moved, waiting = _killed_files(out)
    staged_labels = waiting.parent / publication.STAGED / "labels.txt"
    before = {path.name: path.read_bytes() for path in (moved, waiting, staged_labels)}
    for path in (moved, waiting, staged_labels):
        _new_inode(path)
    assert prepare_images.main(["--input", str(tree), "--output", str(out), *ARGS]) == 0
    assert "finishing run" in capfd.readouterr().err
    assert {name: (out / name).read_bytes() for name in before} == before
    assert not (out / layout.WORK_DIR).exists()

    out = killed_mid_publish()
    moved, _ = _killed_files(out)
    other = bytearray(moved.read_bytes())
    other[-1] ^= 0xFF
    moved.unlink()  # not written in place: the fixture's copy shares its inode
    moved.write_bytes(bytes(other))
    assert prepare_images.main(["--input", str(tree), "--output", str(out), *ARGS]) == 1
    (line,) = error_lines(capfd.readouterr().err)
    assert f"{moved} is neither the old dataset's file nor the one the run moved there" in line
    assert moved.read_bytes() == bytes(other)


def killed_replacing(tree: pathlib.Path, out: pathlib.Path) -> tuple[dict[str, bytes], list[str], pathlib.Path]:
    """An old dataset in ``out``, and an --overwrite run killed once it moved the old files aside and its
    first shard in; returns the old files, the command, and where its old files are (``replaced/``)."""
    old = old_dataset(tree, out)
    argv = ["--input", str(tree), "--output", str(out), *ARGS]
    killed = run_prepare(*argv, "--overwrite", env={**os.environ, KILL: str(STAGED_FILES + 1 + len(old) + 1)})
    assert killed.returncode == -9, killed.stderr
    (record,) = (out / layout.WORK_DIR).glob(f"*/{publication.RECORD}")
    (out / layout.WORK_DIR / "claim.json").unlink()  # the killed run's, released by any run after
    replaced = record.parent / publication.REPLACED
    assert top_bytes(replaced) == old
    return old, argv, replaced


def test_overwrite_after_an_unfinishable_publication_keeps_the_old_dataset(tree, tmp_path, capfd):
    """A publication that cannot be finished (its moved shard removed by hand) is refused naming where
    the old dataset's files are; --overwrite, as it advises, puts them back into the output first: a
    run killed before it moves anything then leaves the old dataset there, whole."""
    out = tmp_path / "out"
    old, argv, replaced = killed_replacing(tree, out)
    (out / "train-00000-of-00001.tfrecord.gz").unlink()
    assert prepare_images.main(argv) == 1
    (line,) = error_lines(capfd.readouterr().err)
    assert f"(the old dataset's {len(old)} files moved aside are in {replaced}/)" in line
    assert "pass --overwrite to start over" in line
    killed = run_prepare(*argv, "--overwrite", env={**os.environ, KILL: "1"})  # once its first file is staged
    assert killed.returncode == -9, killed.stderr
    assert f"put {len(old)} files of the old dataset back" in killed.stderr
    assert top_bytes(out) == old


def test_a_failure_undone_says_which_old_files_it_could_not_put_back(tree, tmp_path, capfd):
    """An old file removed from ``replaced/`` by hand, then the finishing run's first move fails: the
    old files left are put back, and the error names the one missing instead of saying all are back."""
    out = tmp_path / "out"
    old, argv, replaced = killed_replacing(tree, out)
    (replaced / "validation-00000-of-00001.tfrecord.gz").unlink()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KILL, "fail:1")
        assert prepare_images.main(argv) == 1
    (line,) = error_lines(capfd.readouterr().err)
    assert "holds its old dataset again" not in line
    assert (f"1 of {out}'s old dataset's files could not be put back, being in neither {out} nor {replaced}/ "
            "(e.g. validation-00000-of-00001.tfrecord.gz)") in line
    assert top_bytes(out) == {name: data for name, data in old.items()
                              if name != "validation-00000-of-00001.tfrecord.gz"}


def old_dataset(tree: pathlib.Path, out: pathlib.Path) -> dict[str, bytes]:
    """A dataset of other images (8 pixels, a validation split) in ``out``; returns its files."""
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", "8", *ARGS[2:])
    return top_bytes(out)


def test_a_backup_put_back_after_a_kill_is_not_taken_for_the_runs_files(tree, tmp_path, capfd):
    """Killed once the old dataset was moved aside and a new file moved in, then the old dataset
    copied back from a backup by hand: the run's file written over is not the run's any more, so the
    same command is refused, naming it and where the old files are, with nothing moved or removed (it
    made a mix of both that readers took)."""
    out = tmp_path / "out"
    old = old_dataset(tree, out)
    shutil.copytree(out, tmp_path / "backup")
    argv = ["--input", str(tree), "--output", str(out), *ARGS]
    # The staged files, the record, the old files moved aside (on main: the old manifest removed, then moves).
    killed = run_prepare(*argv, "--overwrite", env={**os.environ, KILL: str(STAGED_FILES + 1 + len(old) + 1)})
    assert killed.returncode == -9, killed.stderr
    assert any(top_bytes(out).get(name) not in (None, data) for name, data in old.items())  # a new file is in
    for name, data in old.items():
        (out / name).write_bytes(data)  # the user's restore
    (out / layout.WORK_DIR / "claim.json").unlink()  # the killed run's, released by any run after
    before = sorted((p.relative_to(out), p.stat().st_ino) for p in out.rglob("*"))
    assert prepare_images.main(argv) == 1
    (line,) = error_lines(capfd.readouterr().err)
    # The name the run moved its shard to now holds the old shard's bytes: the run's shard is lost.
    assert "cannot finish publishing run" in line and "(e.g. train-00000-of-00001.tfrecord.gz, removed or " \
        "overwritten by hand?)" in line
    assert f"moved aside are in {out / layout.WORK_DIR}" in line
    assert sorted((p.relative_to(out), p.stat().st_ino) for p in out.rglob("*")) == before
    assert top_bytes(out) == old


@pytest.mark.parametrize("how", ["link", "copy"])
def test_another_outputs_run_folder_is_refused(tree, tmp_path, killed_mid_publish, capfd, how):
    """A run folder in OUTPUT/.beam-prep that is a link to another output's, or a copy of it (its record
    names the other folder), is refused in one line: neither folder changes."""
    other = killed_mid_publish()
    (record,) = (other / layout.WORK_DIR).glob(f"*/{publication.RECORD}")
    out = tmp_path / "out"
    argv = ["--input", str(tree), "--output", str(out), *ARGS]
    assert prepare_images.main(argv) == 0
    placed = out / layout.WORK_DIR / record.parent.name
    placed.parent.mkdir(exist_ok=True)
    if how == "link":
        placed.symlink_to(record.parent, target_is_directory=True)
    else:
        linked_copy(record.parent, placed)
    before = {folder: sorted((p.relative_to(folder), p.stat().st_ino) for p in folder.rglob("*"))
              for folder in (out, other)}
    capfd.readouterr()
    assert prepare_images.main(argv) == 2
    (line,) = error_lines(capfd.readouterr().err)
    assert (f"holds {placed}, a link" if how == "link" else "it publishes into another folder") in line
    assert {folder: sorted((p.relative_to(folder), p.stat().st_ino) for p in folder.rglob("*"))
            for folder in (out, other)} == before


def test_overwrite_never_takes_old_files_through_a_linked_run_folder(tree, tmp_path, killed_mid_publish, capfd):
    """--overwrite puts an unfinishable publication's ``replaced/`` files back, but never through a link:
    a run folder linked to another folder holding a ``replaced/`` is refused, that folder's files left."""
    other = killed_mid_publish()
    (record,) = (other / layout.WORK_DIR).glob(f"*/{publication.RECORD}")
    (record.parent / publication.REPLACED).mkdir()
    (record.parent / publication.REPLACED / "manifest.json").write_text("{}")
    out = tmp_path / "out"
    (out / layout.WORK_DIR).mkdir(parents=True)
    (out / layout.WORK_DIR / record.parent.name).symlink_to(record.parent, target_is_directory=True)
    assert prepare_images.main(["--input", str(tree), "--output", str(out), *ARGS, "--overwrite"]) == 2
    (line,) = error_lines(capfd.readouterr().err)
    assert f"holds {out / layout.WORK_DIR / record.parent.name}, a link" in line
    assert (record.parent / publication.REPLACED / "manifest.json").read_text() == "{}"
    assert not (out / "manifest.json").exists()


@pytest.mark.parametrize("left", [(), ("staged",)])
def test_an_empty_run_folder_is_a_finished_run(tree, tmp_path, capfd, left):
    """A kill between a finished publication's record removed and its folder left leaves an empty run
    folder: the next run removes it and goes on as after a finished run (here, refused as the folder
    holds a dataset), never asking to resume it."""
    out = tmp_path / "out"
    argv = ["--input", str(tree), "--output", str(out), *ARGS]
    assert prepare_images.main(argv) == 0
    empty = out / layout.WORK_DIR / "20261124T214719Z-4d1dc966"
    empty.mkdir(parents=True)
    for name in left:
        (empty / name).mkdir()
    capfd.readouterr()
    assert prepare_images.main(argv) == 2
    (line,) = error_lines(capfd.readouterr().err)
    assert "already holds a dataset" in line and "unfinished run" not in line
    assert not empty.exists()


def test_an_edited_labels_file_is_not_the_same_command(tree, tmp_path, capfd):
    """A run with --labels_file killed once its publication was recorded, then the file edited: the same
    command line is another command (its records' labels differ), so the run finishes the publication
    and is then refused as with any dataset there, never reported as done."""
    labels, out = tmp_path / "labels.txt", tmp_path / "out"
    labels.write_text("cat\ndog\n")
    argv = ["--input", str(tree), "--output", str(out), *ARGS, "--labels_file", str(labels)]
    killed = run_prepare(*argv, env={**os.environ, KILL: str(STAGED_FILES + 2)})
    assert killed.returncode == -9, killed.stderr
    labels.write_text("dog\ncat\n")
    assert prepare_images.main(argv) == 2
    err = capfd.readouterr().err
    assert "finishing run" in err and f"--output {out} already holds a dataset" in err
    assert json.loads((out / "manifest.json").read_text())["labels"] == ["cat", "dog"]
    assert not (out / layout.WORK_DIR).exists() or not any((out / layout.WORK_DIR).iterdir())


def test_write_image_dataset_killed_mid_publish_is_finished_by_the_same_pipeline(tree, tmp_path):
    """WriteImageDataset killed once it moved a shard in: the same pipeline again finishes the
    publication when applied and succeeds, converting nothing (its images are gone); a retried
    Finalize step of the killed run finishes it too, and once more after it is finished."""
    from beam_prep.write.plan.run_plan import RunPlan
    from beam_prep.write.run.write_image_dataset import WriteImageDataset, _finalize

    images, out = tmp_path / "images", tmp_path / "out"
    shutil.copytree(tree, images)
    argv = child("write_gs", str(images), str(out), "cat,dog", *sorted(str(p) for p in images.glob("*/*.jpg")))
    killed = subprocess.run(argv, cwd=REPO, env={**os.environ, KILL: str(STAGED_FILES + 2)}, capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr[-3000:]
    (record,) = (out / layout.WORK_DIR).glob(f"*/{publication.RECORD}")
    staged = (record.parent / publication.STAGED / "manifest.json").read_bytes()
    linked_copy(out, tmp_path / "as-killed")
    shutil.rmtree(images)  # converting again would fail every image
    again = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "finishing run" in again.stderr and (out / "manifest.json").read_bytes() == staged
    assert not record.parent.exists()

    shutil.rmtree(out)
    linked_copy(tmp_path / "as-killed", out)
    (out / layout.WORK_DIR / "claim.json").unlink(missing_ok=True)  # the killed run's, released by any run after
    config = WriteImageDataset(str(out), ["cat", "dog"], image_size=16, root=str(images), num_shards=2)._config
    built = json.loads(staged)
    plan = RunPlan(labels=["cat", "dog"], num_shards={"train": 2}, listed=0, skipped=0, sink="shuffle",
                   run_id=record.parent.name)
    shards = [(split, name, None, None, None) for split, info in built["splits"].items() for name in info["shards"]]
    for _ in range(2):  # the retried step, then the step again once it finished
        assert _finalize(built["counts"]["listed"], config, plan, shards=shards, class_counts=[], failures=[],
                         hash_files=[]) == built
        assert (out / "manifest.json").read_bytes() == staged and not record.parent.exists()


def test_a_folder_in_the_way_is_refused_before_anything_changes(tree, tmp_path, capfd):
    """A folder where a file of the new dataset goes (TFDS's dataset_info.json) is refused in one line
    before the old dataset is touched (it lost its manifest and a shard); once it is gone, the same
    command resumes, keeping every shard, and publishes."""
    out = tmp_path / "out"
    old = old_dataset(tree, out)
    (out / "dataset_info.json").mkdir()
    (out / "dataset_info.json" / "mine").write_text("in the way")
    argv = ["--input", str(tree), "--output", str(out), *ARGS, "--compression", "none"]
    assert prepare_images.main([*argv, "--overwrite"]) == 1
    (line,) = error_lines(capfd.readouterr().err)
    assert f"{out / 'dataset_info.json'} is a folder or a link" in line
    assert top_bytes(out) == old
    shutil.rmtree(out / "dataset_info.json")
    assert prepare_images.main(argv) == 0
    captured = capfd.readouterr()
    assert re.search(r"resuming run \S+: 2 of 2 shards already written", captured.err) and SUMMARY in captured.out
    assert json.loads((out / "manifest.json").read_text())["counts"]["written"] == 11
    assert "validation-00000-of-00001.tfrecord.gz" not in top_bytes(out)


def test_a_move_that_fails_puts_the_old_dataset_back(tree, tmp_path, capfd):
    """A real failure mid-publish (the old train shard is a mount point: moving it fails with EBUSY)
    puts the old dataset back whole, the run's publication kept; once the mount is gone the same
    command finishes it."""
    if os.geteuid() != 0:
        pytest.skip("bind-mounting a file over a dataset's needs root")
    out = tmp_path / "out"
    old = old_dataset(tree, out)
    pinned = out / "train-00000-of-00001.tfrecord.gz"
    mounted = subprocess.run(["mount", "--bind", str(pinned), str(pinned)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"mount --bind failed here: {mounted.stderr.strip()}")
    argv = ["--input", str(tree), "--output", str(out), *ARGS]
    try:
        assert prepare_images.main([*argv, "--overwrite"]) == 1
    finally:
        subprocess.run(["umount", str(pinned)], check=True)
    (line,) = error_lines(capfd.readouterr().err)
    assert f"cannot move to {out / layout.WORK_DIR}" in line and "holds its old dataset again" in line
    assert top_bytes(out) == old
    assert prepare_images.main(argv) == 0
    captured = capfd.readouterr()
    assert "finishing run" in captured.err and SUMMARY in captured.out
    assert json.loads((out / "manifest.json").read_text())["image"]["height"] == 16
