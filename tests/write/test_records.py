"""One listed file to one record or one failure report: the step both sinks share."""
from __future__ import annotations

import hashlib

from helpers import make_tree

from beam_prep.model.features import FILENAME, LABEL_TEXT, SHA256, decode_example
from beam_prep.write.images.examples import make_example
from beam_prep.write.images.imaging import ImageSpec
from beam_prep.write.plan.listing import list_tree


def test_a_file_becomes_a_record_that_names_its_source(tmp_path):
    (path,) = make_tree(tmp_path, {"cat": 1})
    (entry,) = list_tree(str(tmp_path)).entries()
    outcome = make_example(entry, ImageSpec(height=32, width=32))
    record = decode_example(outcome.example)
    assert outcome.failure is None and outcome.bytes_in == path.stat().st_size
    assert record[FILENAME] == b"cat/img_000.jpg" and record[LABEL_TEXT] == b"cat"
    assert record[SHA256] == hashlib.sha256(path.read_bytes()).hexdigest().encode()


def test_a_file_gone_before_its_read_is_reported_at_the_read_stage(tmp_path):
    make_tree(tmp_path, {"cat": 1})
    (tmp_path / "cat" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    entries = {e.relpath: e for e in list_tree(str(tmp_path)).entries()}
    outcome = make_example(entries["cat/gone.jpg"], ImageSpec())
    assert outcome.example is None
    assert outcome.failure["relpath"] == "cat/gone.jpg" and outcome.failure["stage"] == "read"
    assert "No such file" in outcome.failure["message"]
