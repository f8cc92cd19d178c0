"""The hash lines a dataset keeps (``hashes-v<N>.tsv.gz``), and an append's new images checked against every
record already there: exact and near copies, leakage across splits reported against the whole dataset,
``--cross_split_duplicates`` acting on the new images only.

Each test makes its own small dataset in this process (``prepare_here``); a near copy is a validation
record's source resized and encoded again, put in a train folder of the new batch (its path chosen so the
split rule puts it in train).
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import pathlib
import re
import shutil
import subprocess

import pytest
from helpers import REPO, child, encode, make_tree, prepare_here, read_split
from PIL import Image

import beam_prep
from beam_prep.errors import DatasetError, StorageError
from beam_prep.tools.verification import verify
from beam_prep.write.shared.hashing import split_for

pytestmark = pytest.mark.slow  # every test runs a pipeline

ARGS = ("--image_size", "32", "--validation_percent", "30", "--num_shards", "1")
PREVIOUS = REPO / "tests" / "data" / "previous-main"


def sha256s(folder: pathlib.Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()}


def kept_lines(out: pathlib.Path, version: int, fields: int = 4) -> list[list[str]]:
    """The kept file's lines, each as its first ``fields`` fields (sha256, split, phash, path, label)."""
    return [line.split("\t")[:fields] for line in gzip.decompress((out / f"hashes-v{version}.tsv.gz").read_bytes())
            .decode().splitlines()]


def train_name(label: str, stem: str, percent: float) -> str:
    """A file name under ``label`` that the split rule puts in train."""
    return next(f"{label}/{stem}_{i}.jpg" for i in range(100) if split_for(f"{label}/{stem}_{i}.jpg", percent) == "train"
                and split_for(f"{label}/{stem}_{i}.png", percent) == "train")


def near_copy(source: pathlib.Path, target: pathlib.Path) -> None:
    """``source`` resized by a tenth and encoded again at another quality: other bytes, the same picture."""
    with Image.open(source) as img:
        smaller = img.convert("RGB").resize((img.width * 9 // 10, img.height * 9 // 10), Image.Resampling.LANCZOS)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(encode(smaller, quality=80))


def grown_with_a_leak(tmp_path: pathlib.Path, images: tuple[int, int] = (96, 64)) -> dict:
    """A dataset (version 1), and a batch holding one new image and a near copy of a validation record's
    source in a train folder."""
    tree, out, batch = tmp_path / "tree", tmp_path / "out", tmp_path / "batch"
    make_tree(tree, {"circles": 5, "squares": 5}, size=images)
    prepare_here("--input", str(tree), "--output", str(out), *ARGS)
    validation = read_split(out, "validation")[0]["image/filename"].decode()
    leak = train_name("circles", "leak", 30)
    near_copy(tree / validation, batch / leak)
    new = train_name("squares", "new", 30)
    (batch / "squares").mkdir(parents=True, exist_ok=True)
    (batch / new).write_bytes(encode(Image.effect_noise((96, 64), 90).convert("RGB")))
    return {"tree": tree, "out": out, "batch": batch, "old": str(tree / validation), "leak": str(batch / leak),
            "new": str(batch / new)}


def test_every_run_keeps_its_hash_lines_listed_in_the_manifest(tmp_path):
    tree, out = tmp_path / "tree", tmp_path / "out"
    make_tree(tree, {"circles": 4, "squares": 3})
    manifest = prepare_here("--input", str(tree), "--output", str(out), *ARGS)
    (entry,) = manifest["hash_files"]
    data = (out / "hashes-v1.tsv.gz").read_bytes()
    assert entry == {"version": 1, "file": "hashes-v1.tsv.gz", "records": 7, "sha256": hashlib.sha256(data).hexdigest()}
    lines = kept_lines(out, 1)
    records = {(r["image/key/sha256"].decode(), split, r["image/filename"].decode())
               for split in manifest["splits"] for r in read_split(out, split)}
    assert {(sha256, split, json.loads(path)) for sha256, split, _, path in lines} == records  # relative paths
    assert [json.loads(path) for *_, path in lines] == sorted(json.loads(path) for *_, path in lines)
    assert all(len(phash) == 16 for _, _, phash, _ in lines)
    assert {json.loads(path): json.loads(label) for *_, path, label in kept_lines(out, 1, 5)} == {
        json.loads(path): json.loads(path).split("/")[0] for *_, path in lines}  # each record's label
    assert verify(str(out)).ok
    # verify checks it: a line less is named.
    (out / "hashes-v1.tsv.gz").write_bytes(gzip.compress("".join(f"{chr(9).join(fields)}\n" for fields in lines[1:])
                                                         .encode(), mtime=0))
    problems = verify(str(out)).problems
    assert [(p.kind, pathlib.Path(p.where).name) for p in problems] == [("hash_files", "hashes-v1.tsv.gz")]
    assert "has sha256" in problems[0].message


def test_a_near_copy_of_a_validation_image_in_a_train_folder_is_reported_as_a_leak_against_the_old_record(tmp_path):
    grown = grown_with_a_leak(tmp_path)
    out = grown["out"]
    manifest = prepare_here("--input", str(grown["batch"]), "--output", str(out), "--append")
    near = [json.loads(line) for line in (out / "duplicates.jsonl").read_text().splitlines()
            if json.loads(line)["kind"] == "near"]
    assert {(row["path"], row["split"], row["version"]) for row in near} == {
        (grown["old"], "validation", 1), (grown["leak"], "train", 2)}
    assert manifest["duplicates"]["near"]["across_splits"] == 1 and manifest["duplicates"]["near"]["with_earlier"] == 1
    assert manifest["duplicates"]["near"]["split_pairs"] == {"train/validation": 1}
    assert sum(s["num_examples"] for s in manifest["versions"][-1]["splits"].values()) == 2  # reported, written
    assert [e["file"] for e in manifest["hash_files"]] == ["hashes-v1.tsv.gz", "hashes-v2.tsv.gz"]
    assert {json.loads(path) for *_, path in kept_lines(out, 2)} == {
        str(pathlib.Path(p).relative_to(grown["batch"])) for p in (grown["leak"], grown["new"])}
    assert verify(str(out)).ok


def test_drop_leaves_the_new_near_copy_out_and_the_old_records_as_they_were(tmp_path):
    grown = grown_with_a_leak(tmp_path)
    out = grown["out"]
    before, validation = sha256s(out), len(read_split(out, "validation"))
    manifest = prepare_here("--input", str(grown["batch"]), "--output", str(out), "--append",
                            "--cross_split_duplicates", "drop")
    after = sha256s(out)
    assert {name: after[name] for name in before if name.endswith(".tfrecord.gz") or name == "hashes-v1.tsv.gz"} == \
        {name: digest for name, digest in before.items() if name.endswith(".tfrecord.gz") or name == "hashes-v1.tsv.gz"}
    written = {r["image/filename"].decode() for split in manifest["splits"] for r in read_split(out, split)}
    assert "squares/" + pathlib.Path(grown["new"]).name in written
    assert "circles/" + pathlib.Path(grown["leak"]).name not in written
    assert manifest["splits"]["validation"]["num_examples"] == validation  # the old record kept
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    (dropped,) = [row for row in skipped if row.get("duplicate_of")]
    assert dropped["duplicate_of"] == grown["old"] and dropped["reason"] == "near copy of an image in validation"
    assert [json.loads(path) for *_, path in kept_lines(out, 2)] == ["squares/" + pathlib.Path(grown["new"]).name]
    assert verify(str(out)).ok


def test_fail_refuses_the_append_and_publishes_nothing_then_drop_as_it_says_appends(tmp_path):
    """The refused append's unfinished run (its shards written) is not resumed by the append its message
    asks for, with --cross_split_duplicates drop: that one starts afresh (an append takes no --overwrite)."""
    grown = grown_with_a_leak(tmp_path)
    out = grown["out"]
    before = sha256s(out)
    with pytest.raises(DatasetError, match=r"cross_split_duplicates fail: 1 group of copies or near copies across "
                                           r"splits hold a new image .*nothing published; leave those images out, "
                                           r"or pass (--)?cross_split_duplicates drop"):
        prepare_here("--input", str(grown["batch"]), "--output", str(out), "--append", "--cross_split_duplicates", "fail")
    assert sha256s(out) == before
    manifest = prepare_here("--input", str(grown["batch"]), "--output", str(out), "--append",
                            "--cross_split_duplicates", "drop")
    assert [v["version"] for v in manifest["versions"]] == [1, 2]
    assert [json.loads(path) for *_, path in kept_lines(out, 2)] == ["squares/" + pathlib.Path(grown["new"]).name]
    assert not (out / ".beam-prep").exists() or not any((out / ".beam-prep").glob("*/run.json"))


def test_a_dataset_made_before_it_kept_hashes_is_hashed_once_then_never_read_again(tmp_path):
    """tests/data/previous-main (no kept hash lines): the first append reads its shards once and publishes
    hashes-v1 with hashes-v2; the shards then moved away, a second append reads no shard and still finds a
    near copy of an old validation image."""
    out = pathlib.Path(shutil.copytree(PREVIOUS, tmp_path / "dataset"))
    make_tree(tmp_path / "first", {"moons": 2}, size=(20, 24))
    manifest = prepare_here("--input", str(tmp_path / "first"), "--output", str(out), "--append")
    assert [(e["version"], e["records"]) for e in manifest["hash_files"]] == [(1, 12), (2, 2)]
    old = json.loads((PREVIOUS / "manifest.json").read_text())
    records = {(r["image/key/sha256"].decode(), split, r["image/filename"].decode())
               for split in old["splits"] for r in read_split(PREVIOUS, split)}
    assert {(sha256, split, json.loads(path)) for sha256, split, _, path in kept_lines(out, 1)} == records
    shards = [name for name in sha256s(out) if name.endswith(".tfrecord.gz")]
    aside = tmp_path / "aside"
    aside.mkdir()
    for name in shards:
        os.replace(out / name, aside / name)
    record = read_split(PREVIOUS, "validation")[0]
    validation = record["image/filename"].decode()
    batch = tmp_path / "second"
    leak = train_name(validation.split("/")[0], "leak", 30)[:-4] + ".png"  # its stored image, encoded again
    (batch / leak).parent.mkdir(parents=True)
    with Image.open(io.BytesIO(record["image/encoded"])) as stored:
        (batch / leak).write_bytes(encode(stored, "PNG"))
    grown = prepare_here("--input", str(batch), "--output", str(out), "--append")
    for name in shards:
        os.replace(aside / name, out / name)
    near = [json.loads(line) for line in (out / "duplicates.jsonl").read_text().splitlines()
            if '"version"' in line and json.loads(line)["kind"] == "near"]
    assert {(row["path"], row["version"]) for row in near} == {(f"/previous-main/tree/{validation}", 1),
                                                             (str(batch / leak), 3)}
    assert [e["version"] for e in grown["hash_files"]] == [1, 2, 3]
    assert verify(str(out)).ok


def test_an_append_to_an_old_dataset_killed_at_each_step_of_publishing_keeps_its_hash_files_and_manifest_agreed(
        tmp_path):
    """kill -9 after each step of the publication of an append that publishes two kept files (the one it
    hashed from the old dataset's shards, and its own): at every kill, each kept file the manifest in the
    folder lists is there with the bytes it names, and the same command then finishes it."""
    out = pathlib.Path(shutil.copytree(PREVIOUS, tmp_path / "dataset"))
    make_tree(tmp_path / "batch", {"moons": 2}, size=(20, 24))
    result = subprocess.run(child("publish_kills", str(out), str(tmp_path / "saved"), "--keep", "--",
                                  "--input", str(tmp_path / "batch"), "--append", "--direct_running_mode", "in_memory"),
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-6000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    kills = [row for row in rows if row.get("killed")]
    assert len(kills) >= 8
    for row in kills:
        assert row["code"] == 0, row["stderr"][-3000:]
        for state in (tmp_path / "saved" / f"kill-{row['step']}", ):
            manifest = json.loads((state / "manifest.json").read_text())
            for entry in manifest.get("hash_files", []):
                data = (state / entry["file"]).read_bytes()
                assert hashlib.sha256(data).hexdigest() == entry["sha256"], (row["step"], entry)
                assert len(gzip.decompress(data).splitlines()) == entry["records"], (row["step"], entry)
        final = row["final"]
        assert {name for name in final if name.startswith("hashes-")} == {"hashes-v1.tsv.gz", "hashes-v2.tsv.gz"}
    assert len({json.dumps(row["final"], sort_keys=True) for row in rows if "final" in row}) == 1


def test_names_with_tabs_quotes_and_newlines_are_found_again_by_the_next_append(tmp_path):
    """The kept lines quote each path (JSON): a file whose name holds a tab, a quote, a backslash or a
    newline is the same record to the next append, which finds nothing to add from them alone (its
    shards moved away)."""
    tree, out = tmp_path / "tree", tmp_path / "out"
    make_tree(tree, {"ants": 2})
    for i, name in enumerate(['tab\there.jpg', 'quote"d.jpg', "back\\slash.jpg", "new\nline.jpg", "é ü.jpg"]):
        (tree / "ants" / name).write_bytes(encode(Image.effect_noise((40, 30), 30 + 10 * i).convert("RGB")))
    prepare_here("--input", str(tree), "--output", str(out), *ARGS)
    (tmp_path / "aside").mkdir()
    for shard in out.glob("*.tfrecord.gz"):
        shard.rename(tmp_path / "aside" / shard.name)
    before = sha256s(out)
    with pytest.warns(Warning, match=r"nothing to add .*7 files already in it"):
        beam_prep.prepare(str(tree), str(out), append=True, direct_running_mode="in_memory")
    assert sha256s(out) == before


def test_an_append_indexes_by_path_the_records_below_its_input_alone_and_finds_copies_of_any(tmp_path):
    """A batch in another folder names no record's path: none is indexed (for a dataset of millions, an index
    for nothing), and a file copying a record is still found, the record named."""
    from beam_prep.write.grow.append import read_existing
    from beam_prep.write.shared.spill import SpillFolder

    tree, out = tmp_path / "tree", tmp_path / "out"
    make_tree(tree, {"circles": 4, "squares": 3})
    manifest = prepare_here("--input", str(tree), "--output", str(out), *ARGS)
    source = tree / "circles" / "img_002.jpg"
    split = next(s for s in manifest["splits"] for r in read_split(out, s) if r["image/filename"] == b"circles/img_002.jpg")
    sha256 = hashlib.sha256(source.read_bytes()).hexdigest()
    elsewhere, below, every = (read_existing(str(out), SpillFolder(), under)
                               for under in (str(tmp_path / "batch"), str(tree / "circles"), None))
    assert (elsewhere.records, below.records, every.records) == (0, 4, 7)
    for existing in (elsewhere, below, every):
        assert existing.first_with({sha256, "0" * 64}) == {sha256: (split, str(source))}
    rows = [(0, source.name, "train", "circles", 1, None, None, None), (1, "none.jpg", "train", "circles", 1, None, None, None)]
    assert [record and record.sha256 for _, block in below.compare(rows, lambda *lost: None, by_stamp=False)
            for _, _, record in block] == [sha256, None]


def _damage(kept: pathlib.Path, damage: str) -> None:
    """``kept`` (a kept hash file) gone, cut short, its first line no hash line, or naming another split."""
    if damage == "gone":
        kept.unlink()
    elif damage == "cut short":
        kept.write_bytes(kept.read_bytes()[:-8])
    else:
        lines = gzip.decompress(kept.read_bytes()).split(b"\n")
        sha256, split, *rest = lines[0].split(b"\t")
        assert split != b"test"
        first = b"not a hash line" if damage == "no hash line" else b"\t".join([sha256, b"test", *rest])
        kept.write_bytes(gzip.compress(b"\n".join([first, *lines[1:]]), mtime=0))  # still gzip


@pytest.mark.parametrize("damage, error, message", [
    ("gone", StorageError, "cannot read {kept}"),
    ("cut short", StorageError, "cannot read {kept}"),
    ("no hash line", DatasetError, "{kept} is not the kept hash file the manifest lists"),
    ("another split", DatasetError, "{kept} is not the kept hash file the manifest lists"),
])
def test_an_append_refuses_a_kept_file_of_another_folder_that_is_not_the_manifests(tmp_path, damage, error, message):
    """A kept hash file of a version made from another folder (none of its records indexed by path), gone,
    cut short or altered: the append fails naming it, as when it read every record, whether it finds
    nothing new (no copy to look for) or a copy of a record an older version's file names first; not
    "nothing to add"; its bytes are checked against the manifest's."""
    tree, batch, out = tmp_path / "tree", tmp_path / "batch", tmp_path / "out"
    make_tree(tree, {"circles": 3, "squares": 3})
    make_tree(batch, {"stars": 2}, size=(50, 40))
    prepare_here("--input", str(tree), "--output", str(out), *ARGS)
    prepare_here("--input", str(batch), "--output", str(out), "--append")
    kept = out / "hashes-v2.tsv.gz"
    _damage(kept, damage)
    before, match = sha256s(out), re.escape(message.format(kept=kept))
    with pytest.raises(error, match=match):
        beam_prep.prepare(str(tree), str(out), append=True, direct_running_mode="in_memory")  # nothing new
    shutil.copyfile(tree / "squares" / "img_000.jpg", tree / "circles" / "copy.jpg")
    with pytest.raises(error, match=match):
        beam_prep.prepare(str(tree), str(out), append=True, direct_running_mode="in_memory")  # a copy of version 1's
    assert sha256s(out) == before
