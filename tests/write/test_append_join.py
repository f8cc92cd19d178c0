"""An append compares its listing with the dataset's records by a merge, not an index (``Existing.compare``): the
kept hash and stamp files are read in path order, a chunk at a time. Whatever the chunks and whichever folder
the input is (a version's own, one below it, one above, another, none), each path gets the record an index of
every version's lines gives it (a later version's over an earlier's, with that version's stamp), and the
records no listed path names are gone.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import pathlib
import re

import pytest
from helpers import make_tree, prepare_here

from beam_prep.errors import DatasetError
from beam_prep.write.grow import existing as existing_module
from beam_prep.write.grow.append import read_existing
from beam_prep.write.grow.existing import Record
from beam_prep.write.shared import hash_lines, kept_hashes, spill
from beam_prep.write.shared.spill import SpillFolder

pytestmark = pytest.mark.slow  # runs pipelines

ARGS = ("--image_size", "16", "--validation_percent", "30", "--num_shards", "1")


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> dict[str, pathlib.Path]:
    """A dataset of three versions: its tree, the tree grown (new files and a new class), a batch elsewhere."""
    root = tmp_path_factory.mktemp("join")
    tree, batch, out = root / "tree", root / "batch", root / "out"
    make_tree(tree, {"circles": 5, "squares": 4}, size=(24, 20))
    prepare_here("--input", str(tree), "--output", str(out), *ARGS)
    for image in make_tree(root / "more", {"circles": 3, "stars": 2}, size=(20, 24)):
        (tree / image.parent.name).mkdir(exist_ok=True)
        image.rename(tree / image.parent.name / f"more_{image.name}")
    prepare_here("--input", str(tree), "--output", str(out), "--append")
    make_tree(batch, {"squares": 2, "zebras": 3}, size=(28, 20))
    prepare_here("--input", str(batch), "--output", str(out), "--append")
    return {"root": root, "tree": tree, "batch": batch, "out": out}


def indexed(out: pathlib.Path, prefix: str) -> dict[str, Record]:
    """Each path below ``prefix``'s latest record as an index of every version's kept lines holds it (the
    versions in turn, a later one's line replacing an earlier's; its own stamp file's size and stamp)."""
    latest: dict[str, Record] = {}
    for version in json.loads((out / "manifest.json").read_text())["versions"]:
        root, n = version["input"], version["version"]
        kept = {f"{root}/{json.loads(quoted)}": (int(size), stamp.decode()) for size, stamp, quoted in (
            line.split(b"\t", 2) for line in gzip.decompress((out / f"stamps-v{n}.tsv.gz").read_bytes()).splitlines())}
        for line in gzip.decompress((out / f"hashes-v{n}.tsv.gz").read_bytes()).splitlines():
            parsed = hash_lines.parse("kept", line)
            path = f"{root}/{json.loads(parsed.path)}"
            if path.startswith(prefix):
                latest[path] = Record(parsed.sha256.decode(), parsed.split.decode(), *kept.get(path, (None, None)))
    return latest


def chunk_small(monkeypatch) -> None:
    """A few lines a block read, a chunk merged, a run sorted: every path of the merge taken."""
    monkeypatch.setattr(kept_hashes, "_READ", 300)
    monkeypatch.setattr(existing_module, "_CHUNK", 2)
    monkeypatch.setattr(existing_module, "_ONE_CHUNK", 3)
    monkeypatch.setattr(existing_module, "_JOINED", 4)
    monkeypatch.setattr(spill, "_RUN_ROWS", 3)


def input_under(versions: dict[str, pathlib.Path], under: str | None) -> tuple[str | None, str]:
    """The input an append names (``under`` the versions' root; None: none) and its paths' prefix."""
    given = None if under is None else str(versions["root"] / under) if under else str(versions["root"])
    return given, "" if given is None else given + "/"


@pytest.mark.parametrize("chunked", [False, True], ids=["one chunk", "a chunk of a few lines"])
@pytest.mark.parametrize("under", ["tree", "tree/circles", "batch", "", None])
def test_compare_gives_each_path_the_record_an_index_of_every_version_gives_it(versions, monkeypatch, chunked,
                                                                                 under):
    if chunked:
        chunk_small(monkeypatch)
    given, prefix = input_under(versions, under)
    expected = indexed(versions["out"], prefix)
    assert len(expected) == {"tree": 14, "tree/circles": 8, "batch": 5, "": 19, None: 19}[under]
    paths = sorted(expected)
    listed = [*paths[1::3], *paths[2::3], f"{prefix}circles/none.jpg", f"{prefix}aa/none.jpg", f"{prefix}zz.jpg"]
    existing = read_existing(str(versions["out"]), SpillFolder(), given)
    gone: list[tuple[str, Record]] = []
    rows = [(i, path[len(prefix):], "train", "circles", 1, None, None, None) for i, path in enumerate(listed)]
    joined = {}
    for counted, block in existing.compare(rows, lambda *lost: gone.append(lost), by_stamp=False):
        assert counted == 0
        for place, row, record in block:
            assert row == rows[place]
            joined[listed[place]] = record
    assert joined == {path: expected.get(path) for path in listed}
    assert sorted(gone) == sorted((path, expected[path]) for path in paths[::3])
    assert existing.records == len(expected)
    copied = expected[paths[-1]]  # a file at a new path with a record's bytes: that record named, read or not
    assert existing.first_with({copied.sha256, "0" * 64}) == {copied.sha256: (copied.split, paths[-1])}


@pytest.mark.parametrize("by_stamp", [True, False], ids=["by stamp", "every row"])
@pytest.mark.parametrize("chunked", [False, True], ids=["one chunk", "a chunk of a few lines"])
@pytest.mark.parametrize("under", ["tree", "batch", "", None])
def test_compare_counts_the_rows_whose_size_and_stamp_are_their_records_and_gives_the_others(
        versions, monkeypatch, chunked, under, by_stamp):
    if chunked:
        chunk_small(monkeypatch)
    given, prefix = input_under(versions, under)
    expected = indexed(versions["out"], prefix)
    paths = sorted(expected)
    assert any(record.stamp is not None for record in expected.values())
    # Each path listed as a row: its record's size and stamp (the same source); another stamp; another size; no
    # stamp; and new paths (one with a stamp a record has), in an order no key sorts.
    rows, same = [], 0
    for i, path in enumerate(paths[1:]):
        record = expected[path]
        size, stamp = (record.size or 7, record.stamp or "1") if i % 4 != 3 else (record.size, None)
        size, stamp = {1: (size, f"{stamp}0"), 2: (size + 1, stamp)}.get(i % 4, (size, stamp))
        same += by_stamp and record.stamp is not None and i % 4 == 0
        rows.append((i, path[len(prefix):], "train", "circles", size, None, None, stamp))
    stamped = next(record for record in expected.values() if record.stamp is not None)
    rows[2:2] = [(90, "aa/é\"q\n.jpg", "train", "circles", 1, None, None, None),
                 (91, "circles/new.jpg", "train", "circles", stamped.size, None, None, stamped.stamp)]
    existing = read_existing(str(versions["out"]), SpillFolder(), given)
    gone: list[tuple[str, Record]] = []
    counted, others = 0, []
    for n, block in existing.compare(rows, lambda *lost: gone.append(lost), by_stamp=by_stamp):
        counted += n
        others.extend(block)
    assert counted == same
    others.sort(key=lambda other: other[0])  # in the rows' order where one chunk; else in the merge's, by key
    assert [(place, row) for place, row, _ in others] == [
        (place, row) for place, row in enumerate(rows) if not (
            by_stamp and prefix + row[1] in expected and expected[prefix + row[1]].stamp is not None
            and (expected[prefix + row[1]].size, expected[prefix + row[1]].stamp) == (row[4], row[7]))]
    assert all(record == expected.get(prefix + row[1]) for _, row, record in others)
    assert gone == [(paths[0], expected[paths[0]])]


def test_keys_are_the_key_of_each_path():
    for paths in [["a.jpg", "b/c.jpg"], ["a.jpg", "é/\"q\".jpg", "x\ny\\"], ["\udcff.jpg", "a"], []]:
        assert existing_module._keys(paths) == [existing_module._key(path) for path in paths]


@pytest.mark.parametrize("damage, message", [
    ("out of order", "{kept} is not a kept hash file beam-prep writes (its lines are not in path order)"),
    ("another split", "{kept} is not the kept hash file the manifest lists"),
])
def test_a_kept_file_the_comparison_reads_is_refused_out_of_order_or_not_the_manifests(versions, tmp_path, damage, message):
    """The merge needs the kept lines in path order, as beam-prep writes them: a file that lists them otherwise
    (its sha256 the manifest's too) is refused, naming it, rather than read as lines missing; one whose bytes
    are not the manifest's is refused as ``first_with`` refuses it, its lines in order."""
    out = tmp_path / "out"
    out.mkdir()
    for path in versions["out"].iterdir():
        (out / path.name).write_bytes(path.read_bytes())
    kept = out / "hashes-v1.tsv.gz"
    lines = gzip.decompress(kept.read_bytes()).splitlines()
    if damage == "out of order":
        lines.reverse()
    else:
        sha256, split, *rest = lines[0].split(b"\t")
        lines[0] = b"\t".join([sha256, b"test" if split != b"test" else b"train", *rest])
    kept.write_bytes(gzip.compress(b"\n".join(lines) + b"\n", mtime=0))
    if damage == "out of order":
        manifest = json.loads((out / "manifest.json").read_text())
        manifest["hash_files"][0]["sha256"] = hashlib.sha256(kept.read_bytes()).hexdigest()
        (out / "manifest.json").write_text(json.dumps(manifest))
    existing = read_existing(str(out), SpillFolder(), str(versions["tree"]))
    with pytest.raises(DatasetError, match=re.escape(message.format(kept=kept))):
        list(existing.compare([], lambda *lost: None))
