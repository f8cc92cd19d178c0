"""One image to one counted record: the per-image step both sinks share."""
from __future__ import annotations

import hashlib
import io

from helpers import make_tree
from PIL import Image

from beam_prep.model.features import ENCODED, FILENAME, decode_example
from beam_prep.write.finish.duplicates import hash_line
from beam_prep.write.images.imaging import ImageSpec
from beam_prep.write.images.phash import phash
from beam_prep.write.plan.listing import list_tree
from beam_prep.write.shared.shard_formats import shard_format
from beam_prep.write.sinks.tally import Counters, count_image


class _Reporter:
    def __init__(self) -> None:
        self.added: list[bool] = []

    def add(self, ok: bool) -> None:
        self.added.append(ok)


def test_a_good_image_becomes_a_row_with_its_split_labels_and_hash_line(tmp_path):
    (path,) = make_tree(tmp_path, {"cat": 1})
    (entry,) = list_tree(str(tmp_path)).entries()
    reporter = _Reporter()
    row, failure = count_image(entry, None, ImageSpec(height=16, width=16, image_format="png"),
                               shard_format("tfrecord"), Counters(), reporter)
    assert failure is None and reporter.added == [True]
    assert (row.split, row.labels, row.original, row.flat) == ("train", ("cat",), None, None)
    assert decode_example(row.example)[FILENAME] == b"cat/img_000.jpg"
    with Image.open(io.BytesIO(decode_example(row.example)[ENCODED])) as stored_image:  # the hash of what is stored
        picture = phash(stored_image)
    stored = row.hash_line.split("\t")[2]
    assert row.hash_line == hash_line(hashlib.sha256(path.read_bytes()).hexdigest(), "train", entry.path,
                                      int(stored, 16), "cat")  # its label: a copy under another one contradicts it
    assert int(stored, 16) == picture


def test_a_bad_image_becomes_its_failure_report_and_is_counted_as_not_done(tmp_path):
    make_tree(tmp_path, {"cat": 1})
    (entry,) = list_tree(str(tmp_path)).entries()
    reporter = _Reporter()
    row, failure = count_image(entry, b"not an image", ImageSpec(), shard_format("tfrecord"), Counters(), reporter)
    assert row is None and reporter.added == [False]
    assert failure["relpath"] == "cat/img_000.jpg" and failure["stage"] == "decode"
