"""Which files, which label, which split: all decided from paths, the same on every run."""
from __future__ import annotations

import pytest

from beam_prep.errors import OptionsError
from beam_prep.listing import UNKNOWN_LABEL, FileEntry, list_tree, read_labels_file, split_for
from trees import make_tree


def test_labels_are_the_sorted_folder_names(tmp_path):
    make_tree(tmp_path, {"zebra": 1, "ant": 1, "Émeu": 1, "moth": 1})
    listing = list_tree(str(tmp_path))
    assert listing.labels == sorted(["zebra", "ant", "Émeu", "moth"])
    assert {e.label: e.label_id for e in listing.entries} == {n: i for i, n in enumerate(listing.labels)}


def test_without_split_folders_everything_is_train(tmp_path):
    make_tree(tmp_path, {"a": 3, "b": 3})
    listing = list_tree(str(tmp_path))
    assert listing.splits == ["train"]
    assert {e.split for e in listing.entries} == {"train"}


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
    assert [(e.relpath, e.split) for e in first.entries] == [(e.relpath, e.split) for e in second.entries]
    share = sum(e.split == "validation" for e in first.entries) / len(first.entries)
    assert 0.13 < share < 0.27


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
    assert len(listing.entries) == 2
    assert sorted(listing.skipped) == [".git/x.jpg", "a/.DS_Store", "a/notes.txt", "loose.jpg"]


def test_labels_file_sets_the_ids_and_flags_unlisted_folders(tmp_path):
    root = tmp_path / "tree"
    make_tree(root, {"cat": 1, "dog": 1, "owl": 1})
    labels_file = tmp_path / "labels.txt"
    labels_file.write_text("dog\ncat\nbird\n")
    listing = list_tree(str(root), labels=read_labels_file(str(labels_file)))
    assert listing.labels == ["dog", "cat", "bird"]
    ids = {e.label: e.label_id for e in listing.entries}
    assert ids == {"dog": 0, "cat": 1, "owl": UNKNOWN_LABEL}
    assert [e.relpath for e in listing.unknown_label_entries] == ["owl/img_000.jpg"]


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


def test_sizes_come_from_the_files(tmp_path):
    make_tree(tmp_path, {"a": 2, "b": 1})
    listing = list_tree(str(tmp_path))
    assert {e.relpath: e.size for e in listing.entries} == {
        e.relpath: (tmp_path / e.relpath).stat().st_size for e in listing.entries}


def test_a_broken_link_is_listed_so_that_its_read_is_reported(tmp_path):
    make_tree(tmp_path, {"a": 1})
    (tmp_path / "a" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    listing = list_tree(str(tmp_path))
    assert sorted(e.relpath for e in listing.entries) == ["a/gone.jpg", "a/img_000.jpg"]


def test_linked_folders_are_not_followed(tmp_path):
    make_tree(tmp_path / "root", {"a": 1})
    make_tree(tmp_path / "elsewhere", {"b": 2})
    (tmp_path / "root" / "b").symlink_to(tmp_path / "elsewhere" / "b", target_is_directory=True)
    listing = list_tree(str(tmp_path / "root"))
    assert [e.relpath for e in listing.entries] == ["a/img_000.jpg"]


def test_a_file_entry_survives_its_json_line():
    entry = FileEntry(path="/d/é/x.jpg", relpath="é/x.jpg", split="train", label="é", label_id=3, size=10)
    assert FileEntry.from_json(entry.to_json()) == entry
