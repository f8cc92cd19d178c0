"""Damaged copies of real images: whatever a strict decoder refuses is reported, never written.

From Pillow's test images (``real_images``), up to 20 readable files of each of
JPEG, PNG, GIF, WebP and TIFF, spread evenly over the sorted names, each with 64
bytes in its middle overwritten by pseudo-random bytes (seeded by its name), one
of each format cut to two thirds of its length, and Pillow's own
broken_data_stream.png. A damaged file can still decode (the bytes may land in
metadata, or in data the decoder takes as valid): then it must be written like
any other image; one the strict decoder (a full decode, truncated files refused)
refuses must be a line of errors.jsonl at stage decode. A writer that keeps such a
file trains on grey blocks and half images, and says nothing.
"""
from __future__ import annotations

import pathlib
import random

import pytest
from differential import Run, Verdicts, assert_counts_add_up, judge, prepare
from real_images import Corpus, tree_name
from reference_image import Rejected, Target, strict_decode

FORMATS = ("jpeg", "png", "gif", "webp", "tiff")
PER_FORMAT = 20
DAMAGED_BYTES = 64
KEPT_SHARE = 2 / 3  # of a truncated copy's bytes
BROKEN = "broken_data_stream.png"  # Pillow's own: a PNG whose image data is not zlib


def readable(corpus: Corpus, fmt: str, count: int) -> list[str]:
    """Up to ``count`` files of ``fmt`` the strict decoder reads, spread evenly over the names."""
    names = []
    for name in corpus.of_format(fmt):
        try:
            strict_decode(corpus.path(name))
        except Rejected:
            continue
        names.append(name)
    step = max(1.0, len(names) / count)
    return [names[int(i * step)] for i in range(min(count, len(names)))]


def damaged(data: bytes, seed: str) -> bytes:
    """``data`` with DAMAGED_BYTES in its middle replaced by bytes from a generator seeded by ``seed``."""
    start = max(0, len(data) // 2 - DAMAGED_BYTES // 2)
    noise = random.Random(seed).randbytes(DAMAGED_BYTES)
    return data[:start] + noise[:len(data) - start] + data[start + DAMAGED_BYTES:]


def damaged_tree(corpus: Corpus, root: pathlib.Path) -> list[str]:
    """Writes the damaged copies under ``root/<format>/``; returns their paths relative to ``root``."""
    copies = {tree_name(BROKEN): corpus.path(BROKEN).read_bytes()}
    for fmt in FORMATS:
        chosen = readable(corpus, fmt, PER_FORMAT)
        for name in chosen:
            copies[_renamed(name, "damaged")] = damaged(corpus.path(name).read_bytes(), name)
        data = corpus.path(chosen[0]).read_bytes()
        copies[_renamed(chosen[0], "truncated")] = data[:int(len(data) * KEPT_SHARE)]
    for relpath, data in copies.items():
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_bytes(data)
    return sorted(copies)


def _renamed(name: str, how: str) -> str:
    folder, _, base = tree_name(name).partition("/")
    return f"{folder}/{how}__{base}"


@pytest.fixture(scope="module")
def tree(pillow_images, tmp_path_factory) -> tuple[pathlib.Path, list[str]]:
    root = tmp_path_factory.mktemp("damaged") / "tree"
    return root, damaged_tree(pillow_images, root)


@pytest.fixture(scope="module")
def outcome(tree, tmp_path_factory) -> tuple[Run, Verdicts]:
    root, names = tree
    run = prepare(root, tmp_path_factory.mktemp("damaged_out"))
    return run, judge(run, root, names, Target())


def test_every_format_is_damaged(tree):
    names = tree[1]
    for fmt in FORMATS:  # Pillow 12.3 has 14 readable WebP files, 20 or more of each other format
        assert 10 <= sum(n.startswith(f"{fmt}/damaged__") for n in names) <= PER_FORMAT
        assert sum(n.startswith(f"{fmt}/truncated__") for n in names) == 1


def test_counts_add_up(outcome, tree):
    run, _ = outcome
    assert_counts_add_up(run, tree[1])


def test_pillows_broken_png_is_reported_at_decode(outcome):
    run, verdicts = outcome
    name = tree_name(BROKEN)
    assert verdicts.rejected[name].stage == "decode"
    written = name in run.records
    assert not written, "written as if whole"
    assert run.errors[name]["stage"] == "decode", run.errors[name]


def test_what_the_strict_decoder_refuses_is_reported_at_decode_not_written(outcome):
    _, verdicts = outcome
    assert {e.stage for e in verdicts.rejected.values()} == {"decode"}
    assert not verdicts.report(refused=True), verdicts.report(refused=True)


def test_what_still_decodes_is_written_and_matches_the_reference(outcome):
    _, verdicts = outcome
    assert not verdicts.report(refused=False), verdicts.report(refused=False)


def test_figures(outcome, tree, capsys):
    """The figures for the README (``pytest -s`` shows them)."""
    run, verdicts = outcome
    refused = set(verdicts.rejected)
    with capsys.disabled():
        print(f"\n{len(tree[1])} damaged copies; of the {len(refused)} the strict decoder refuses, "
              f"{len(refused & set(run.errors))} reported, {len(refused & set(run.records))} written. "
              f"{verdicts.figures(run)}")
    assert refused
