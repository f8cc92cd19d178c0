"""Which files, which label, which split: all decided from paths, the same on every run."""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess

import pytest
from helpers import REPO, child, make_tree

from beam_prep.errors import BeamPrepWarning, OptionsError
from beam_prep.write.plan.listing import (
    SKIP_DEPTH,
    SKIP_HIDDEN,
    SKIP_NOT_IMAGE,
    UNKNOWN_LABEL,
    list_tree,
    order_key,
    read_labels_file,
    split_for,
    stable_hash,
)
from beam_prep.write.plan.walk import SKIP_SEEN_FOLDER, SKIP_SPECIAL
from beam_prep.write.shared.entry import FileEntry, printable
from beam_prep.write.shared.spill import SortedRows, SpillFolder


def test_labels_are_the_sorted_folder_names(tmp_path):
    make_tree(tmp_path, {"zebra": 1, "ant": 1, "Émeu": 1, "moth": 1})
    listing = list_tree(str(tmp_path))
    assert listing.labels == sorted(["zebra", "ant", "Émeu", "moth"])
    assert {e.label: e.label_id for e in listing.entries()} == {n: i for i, n in enumerate(listing.labels)}


def test_without_split_folders_everything_is_train(tmp_path):
    make_tree(tmp_path, {"a": 3, "b": 3})
    listing = list_tree(str(tmp_path))
    assert listing.splits == ["train"]
    assert {e.split for e in listing.entries()} == {"train"}


def test_split_folders_are_kept(tmp_path):
    make_tree(tmp_path, {"a": 2, "b": 1}, splits=["train", "val", "test"])
    listing = list_tree(str(tmp_path))
    assert listing.splits == ["train", "val", "test"]
    assert listing.labels == ["a", "b"]
    assert listing.split_counts() == {"train": 3, "val": 3, "test": 3}


def test_validation_percent_is_a_stable_share(tmp_path):
    make_tree(tmp_path, {"a": 150, "b": 150})
    first = list_tree(str(tmp_path), validation_percent=20)
    second = list_tree(str(tmp_path), validation_percent=20)
    assert [(e.relpath, e.split) for e in first.entries()] == [(e.relpath, e.split) for e in second.entries()]
    share = sum(e.split == "validation" for e in first.entries()) / len(list(first.entries()))
    assert 0.13 < share < 0.27


# Known values, computed once and written down: a file's split and its place in a
# shard must be the same on every run, machine and release, which calling the
# function twice in one process cannot show. Per path: its "split" and "order"
# hashes (0 <= h < 2**64); the comment gives split hash / 2**64 in percent: the
# file is in validation where that is below --validation_percent.
PINNED_HASHES = {
    "cat/1.jpg": (578668867960451635, 11714709403606997800),  # 3.14 %
    "cat/2.jpg": (15042012835164603749, 7276854850587380152),  # 81.54 %
    "dog/img_000.jpg": (4859387898613755088, 456170055129704753),  # 26.34 %
    "chat/\u00e9t\u00e9.jpg": (10936918370869388935, 12488556783208968349),  # 59.29 %, UTF-8 bytes
    "\u732b/\u5199\u771f.png": (1401747676898038092, 11788458561438796496),  # 7.60 %
    "raw/bad\udcff.jpg": (15493024407272098372, 10335387416682869832),  # 83.99 %, byte 0xff
}


@pytest.mark.parametrize("relpath", list(PINNED_HASHES))
def test_stable_hash_of_a_path_is_a_known_value(relpath):
    split_hash, order_hash = PINNED_HASHES[relpath]
    assert stable_hash(relpath, "split") == split_hash
    assert stable_hash(relpath, "order") == order_hash == order_key(relpath)


def test_a_files_split_is_a_known_value():
    assert [split_for(p, 10) for p in PINNED_HASHES] == [
        "validation", "train", "train", "train", "validation", "train"]
    assert [split_for(p, 50) for p in PINNED_HASHES] == [
        "validation", "train", "validation", "train", "validation", "train"]
    assert [split_for(p, 90) for p in PINNED_HASHES] == ["validation"] * 6


def test_a_files_split_depends_only_on_its_relative_path():
    assert split_for("cat/1.jpg", 50) == split_for("cat/1.jpg", 50)
    # Raising the share only moves files into validation, never out of it.
    moved = [p for p in (f"cat/{i}.jpg" for i in range(200))
             if split_for(p, 10) == "validation" and split_for(p, 30) != "validation"]
    assert moved == []


def test_split_tree_with_validation_percent_is_refused(tmp_path):
    make_tree(tmp_path, {"a": 1}, splits=["train"])
    with pytest.raises(OptionsError, match="--validation_percent"):
        list_tree(str(tmp_path), validation_percent=10)


def test_hidden_and_non_image_files_are_skipped_and_counted(tmp_path):
    make_tree(tmp_path, {"a": 2})
    (tmp_path / "a" / ".DS_Store").write_bytes(b"x")
    (tmp_path / "a" / "notes.txt").write_text("x")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "x.jpg").write_bytes(b"x")
    (tmp_path / "loose.jpg").write_bytes(b"x")
    listing = list_tree(str(tmp_path))
    assert len(list(listing.entries())) == 2
    assert listing.skipped == {".git/x.jpg": SKIP_HIDDEN, "a/.DS_Store": SKIP_HIDDEN,
                               "a/notes.txt": SKIP_NOT_IMAGE, "loose.jpg": SKIP_DEPTH}
    assert listing.skipped_by_reason() == {SKIP_HIDDEN: 2, SKIP_DEPTH: 1, SKIP_NOT_IMAGE: 1}


@pytest.mark.parametrize("junk", [".ipynb_checkpoints", "__MACOSX", "@eaDir"])
def test_junk_folders_beside_the_splits_keep_the_split_layout(tmp_path, junk):
    make_tree(tmp_path, {"cat": 2, "dog": 1}, splits=["train", "validation"])
    make_tree(tmp_path / junk, {"train": 1})  # junk/train/img_000.jpg: images at split depth
    (tmp_path / junk / "x.txt").write_text("x")
    listing = list_tree(str(tmp_path))
    assert listing.splits == ["train", "validation"]
    assert listing.labels == ["cat", "dog"]
    assert listing.split_counts() == {"train": 3, "validation": 3}
    assert listing.skipped == {f"{junk}/train/img_000.jpg": SKIP_HIDDEN, f"{junk}/x.txt": SKIP_HIDDEN}


def test_a_stray_image_beside_the_splits_is_skipped_as_misplaced(tmp_path):
    make_tree(tmp_path, {"cat": 2, "dog": 1}, splits=["train", "validation"])
    make_tree(tmp_path, {"stray": 1})  # ROOT/stray/img_000.jpg: a label folder outside the splits
    (tmp_path / "Thumbs.db").write_bytes(b"x")
    (tmp_path / "loose.jpg").write_bytes(b"x")
    listing = list_tree(str(tmp_path))
    assert listing.split_counts() == {"train": 3, "validation": 3}
    assert listing.labels == ["cat", "dog"]
    assert listing.skipped == {"Thumbs.db": SKIP_HIDDEN, "loose.jpg": SKIP_DEPTH,
                               "stray/img_000.jpg": SKIP_DEPTH}


def test_labels_file_sets_the_ids_and_flags_unlisted_folders(tmp_path):
    root = tmp_path / "tree"
    make_tree(root, {"cat": 1, "dog": 1, "owl": 1})
    labels_file = tmp_path / "labels.txt"
    labels_file.write_text("dog\ncat\nbird\n")
    listing = list_tree(str(root), labels=read_labels_file(str(labels_file)))
    assert listing.labels == ["dog", "cat", "bird"]
    ids = {e.label: e.label_id for e in listing.entries()}
    assert ids == {"dog": 0, "cat": 1, "owl": UNKNOWN_LABEL}
    assert [e.relpath for e in listing.entries() if e.label_id == UNKNOWN_LABEL] == ["owl/img_000.jpg"]


def test_labels_file_with_duplicates_is_refused(tmp_path):
    path = tmp_path / "labels.txt"
    path.write_text("a\nb\na\n")
    with pytest.raises(OptionsError, match="'a' more than once"):
        read_labels_file(str(path))


def test_empty_tree_is_refused_with_the_expected_layout(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "readme.txt").write_text("x")
    with pytest.raises(OptionsError, match="no images under .*<label>/<image>"):
        list_tree(str(tmp_path))


def test_a_nested_tree_without_recursive_is_refused_naming_recursive(tmp_path):
    """Keras reads ROOT/<label>/<folder>/<image>: every image here is one level deeper than listed."""
    make_tree(tmp_path / "cat" / "indoor", {"": 2})
    make_tree(tmp_path / "dog" / "park", {"": 1})
    (tmp_path / "dog" / "notes.txt").write_text("x")
    with pytest.raises(OptionsError) as raised:
        list_tree(str(tmp_path))
    assert str(raised.value) == (
        f"no images under {tmp_path}: expected ROOT/<label>/<image> or ROOT/<split>/<label>/<image>, and 3 images "
        "lie in subfolders of label folders (cat/indoor/img_000.jpg, ...): pass --recursive to label each by "
        "its top folder (1 other files skipped)")
    assert sorted(list_tree(str(tmp_path), recursive=True).labels) == ["cat", "dog"]


def test_images_in_subfolders_beside_listed_ones_are_warned_about(tmp_path):
    make_tree(tmp_path, {"cat": 2, "dog": 1})
    make_tree(tmp_path / "dog" / "more", {"": 1})
    with pytest.warns(BeamPrepWarning) as caught:
        listing = list_tree(str(tmp_path))
    assert [str(w.message) for w in caught] == [
        f"{tmp_path}: 1 image lies in subfolders of label folders (dog/more/img_000.jpg): pass --recursive to "
        "label each by its top folder; they are skipped"]
    assert listing.listed == 3


def test_a_flat_tree_of_images_is_not_told_to_recurse(tmp_path):
    make_tree(tmp_path, {"": 2})
    with pytest.raises(OptionsError) as raised:
        list_tree(str(tmp_path))
    assert "recursive" not in str(raised.value)


def test_sizes_come_from_the_files(tmp_path):
    make_tree(tmp_path, {"a": 2, "b": 1})
    listing = list_tree(str(tmp_path))
    assert {e.relpath: e.size for e in listing.entries()} == {
        e.relpath: (tmp_path / e.relpath).stat().st_size for e in listing.entries()}


def test_a_broken_link_is_listed_so_that_its_read_is_reported(tmp_path):
    make_tree(tmp_path, {"a": 1})
    (tmp_path / "a" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    listing = list_tree(str(tmp_path))
    assert sorted(e.relpath for e in listing.entries()) == ["a/gone.jpg", "a/img_000.jpg"]


def test_linked_folders_and_files_are_followed(tmp_path):
    make_tree(tmp_path / "root", {"real": 2})
    make_tree(tmp_path / "elsewhere", {"cats": 3, "one": 1})
    (tmp_path / "root" / "cats").symlink_to(tmp_path / "elsewhere" / "cats", target_is_directory=True)
    (tmp_path / "root" / "real" / "linked.jpg").symlink_to(tmp_path / "elsewhere" / "one" / "img_000.jpg")
    listing = list_tree(str(tmp_path / "root"))
    assert listing.labels == ["cats", "real"]
    assert sorted(e.relpath for e in listing.entries()) == [
        "cats/img_000.jpg", "cats/img_001.jpg", "cats/img_002.jpg",
        "real/img_000.jpg", "real/img_001.jpg", "real/linked.jpg"]
    linked = next(e for e in listing.entries() if e.relpath == "real/linked.jpg")
    assert linked.size == (tmp_path / "elsewhere" / "one" / "img_000.jpg").stat().st_size
    assert listing.skipped == {}


def test_a_folder_reached_twice_is_listed_once_and_reported(tmp_path):
    make_tree(tmp_path, {"cats": 2})
    (tmp_path / "cats" / "loop").symlink_to(tmp_path / "cats", target_is_directory=True)
    (tmp_path / "copycats").symlink_to(tmp_path / "cats", target_is_directory=True)
    listing = list_tree(str(tmp_path))
    assert sorted(e.relpath for e in listing.entries()) == ["cats/img_000.jpg", "cats/img_001.jpg"]
    assert listing.skipped == {"cats/loop": SKIP_SEEN_FOLDER, "copycats": SKIP_SEEN_FOLDER}


def test_a_link_to_itself_is_listed_so_that_its_read_is_reported(tmp_path):
    make_tree(tmp_path, {"a": 1})
    (tmp_path / "a" / "self.jpg").symlink_to("self.jpg")
    listing = list_tree(str(tmp_path))
    assert sorted(e.relpath for e in listing.entries()) == ["a/img_000.jpg", "a/self.jpg"]


def test_pipes_are_passed_over(tmp_path):
    make_tree(tmp_path, {"a": 1})
    os.mkfifo(tmp_path / "a" / "pipe.jpg")
    listing = list_tree(str(tmp_path))
    assert [e.relpath for e in listing.entries()] == ["a/img_000.jpg"]
    assert listing.skipped == {"a/pipe.jpg": SKIP_SPECIAL}


def test_a_name_that_is_not_utf8_is_listed_and_hashed_by_its_bytes(tmp_path):
    make_tree(tmp_path, {"a": 1})
    raw = os.fsencode(str(tmp_path / "a")) + b"/bad\xff\xfe.jpg"
    with open(raw, "wb") as f:
        f.write((tmp_path / "a" / "img_000.jpg").read_bytes())
    listing = list_tree(str(tmp_path), validation_percent=50)
    bad = next(e for e in listing.entries() if e.relpath != "a/img_000.jpg")
    assert os.fsencode(bad.relpath) == b"a/bad\xff\xfe.jpg"
    assert FileEntry.from_json(bad.to_json()) == bad
    # The hash of a valid name is unchanged by hashing bytes; an invalid one hashes too.
    assert stable_hash("a/é.jpg", "split") == int.from_bytes(
        hashlib.sha256("split:a/é.jpg".encode()).digest()[:8], "big")
    assert stable_hash(bad.relpath, "split") == int.from_bytes(
        hashlib.sha256(b"split:a/bad\xff\xfe.jpg").digest()[:8], "big")
    assert printable(bad.relpath) == "a/bad\\xff\\xfe.jpg"


@pytest.mark.parametrize("name", ["two\nlines", "car\rriage", " padded", "tab\x0bbed"])
def test_label_names_labels_txt_cannot_hold_are_refused(tmp_path, name):
    make_tree(tmp_path, {"fine": 1, name: 1})
    with pytest.raises(OptionsError, match="line break or edge spaces") as e:
        list_tree(str(tmp_path))
    assert repr(str(tmp_path / name)) in str(e.value)


def test_a_label_folder_name_that_is_not_utf8_is_refused(tmp_path):
    make_tree(tmp_path, {"fine": 1})
    folder = os.fsencode(str(tmp_path)) + b"/caf\xe9"
    os.mkdir(folder)
    with open(folder + b"/x.jpg", "wb") as f:
        f.write((tmp_path / "fine" / "img_000.jpg").read_bytes())
    with pytest.raises(OptionsError, match=r"caf\\xe9.*not UTF-8"):
        list_tree(str(tmp_path))


def _without_root_file_access() -> None:
    """In a child before exec: drop root's power to read any folder, so permissions apply."""
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_an_unreadable_folder_is_named_with_local_advice(tmp_path):
    make_tree(tmp_path, {"a": 1, "b": 1})
    (tmp_path / "b").chmod(0)
    try:
        done = subprocess.run(child("list_tree", str(tmp_path)), cwd=REPO, capture_output=True,
                              text=True, timeout=120, preexec_fn=_without_root_file_access)
    finally:
        (tmp_path / "b").chmod(0o755)
    assert done.stdout.startswith(f"StorageError cannot list {tmp_path / 'b'}: permission denied"), done
    assert "chmod" in done.stdout and "roles/" not in done.stdout


def test_a_file_entry_survives_its_json_line():
    entry = FileEntry(path="/d/é/x.jpg", relpath="é/x.jpg", split="train", label="é", label_id=3, size=10)
    assert FileEntry.from_json(entry.to_json()) == entry


def test_a_listing_spilled_in_many_small_buckets_reads_back_whole_and_in_key_order(tmp_path, monkeypatch):
    """The external sort's every path (chunks, flushes, several buckets) against the plain one."""
    make_tree(tmp_path, {"a": 40, "b": 35, "c": 25}, size=(8, 8))
    for i in range(30):
        (tmp_path / "a" / f"note_{i}.txt").write_text("x")
    with list_tree(str(tmp_path), validation_percent=30) as whole:
        expected = list(whole.entries())
        expected_skipped = whole.skipped
    monkeypatch.setattr("beam_prep.write.shared.spill._CHUNK_ROWS", 3)
    monkeypatch.setattr("beam_prep.write.shared.spill._BUFFERED_ROWS", 7)
    monkeypatch.setattr("beam_prep.write.shared.spill._BUCKET_ROWS", 9)
    monkeypatch.setattr("beam_prep.write.shared.spill._RUN_ROWS", 4)  # the skipped files: 8 sorted runs, merged
    with list_tree(str(tmp_path), validation_percent=30) as spilled:
        assert spilled._files._buckets.__len__() == 12  # 100 rows in buckets of 9
        entries = list(spilled.entries())
        assert entries == expected and len(entries) == 100
        assert [order_key(e.relpath) for e in entries] == sorted(order_key(e.relpath) for e in entries)
        assert spilled.skipped == expected_skipped and len(expected_skipped) == 30
        assert list(spilled.skipped_rows()) == sorted(expected_skipped.items())
        assert spilled.split_counts() == {s: sum(e.split == s for e in entries) for s in ("train", "validation")}
        folder = spilled._folder.path
        assert os.path.isdir(folder)
    assert not os.path.exists(folder)


def test_skipped_files_come_back_sorted_by_path_in_bounded_runs(tmp_path, monkeypatch):
    """The walk is breadth first (a root's files before its folders'), so the skipped rows arrive
    out of path order; they are sorted in runs on disk and merged."""
    make_tree(tmp_path, {"a": 1, "b": 1}, size=(8, 8))
    names = [f"z_{i}.txt" for i in range(5)] + [f"{label}/n_{i}.txt" for label in "ba" for i in range(4)]
    for name in names:
        (tmp_path / name).write_text("x")
    monkeypatch.setattr("beam_prep.write.shared.spill._RUN_ROWS", 3)
    with list_tree(str(tmp_path)) as listing:
        assert list(listing.skipped_rows()) == [(name, SKIP_NOT_IMAGE) for name in sorted(names)]
        assert len(listing._skips.rows._runs) == 5  # 13 rows in runs of 3


def test_rows_in_order_go_to_disk_a_chunk_at_a_time_and_all_come_back_sorted(monkeypatch):
    """Sorted rows that come in order (an append's sources gone, by the million) are written as they come,
    a chunk at a time; after one out of order, the rest go to sorted runs; read back, all are sorted."""
    monkeypatch.setattr("beam_prep.write.shared.spill._CHUNK_ROWS", 4)
    monkeypatch.setattr("beam_prep.write.shared.spill._RUN_ROWS", 6)
    folder = SpillFolder()
    rows = SortedRows(folder, "rows")
    given = [(f"{i:03d}", i) for i in range(21)] + [("005x", 0), ("000", 1), ("zzz", 2)] + [
        (f"{i:03d}b", i) for i in range(10, 0, -1)]
    held = 0
    for row in given:
        rows.append(row)
        held = max(held, len(rows._rows))
    assert (list(rows), list(rows), rows.count) == (sorted(given), sorted(given), len(given))
    assert held < 6  # a run's rows at most
    in_order = SortedRows(folder, "in-order")
    for row in given[:21]:
        in_order.append(row)
        assert len(in_order._rows) < 4
    assert list(in_order) == given[:21]
    folder.close()
