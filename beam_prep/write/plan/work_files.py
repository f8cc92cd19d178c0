"""The listings a run's workers read, written in one pass over the launcher's listing.

The streaming sink gets one listing per shard, the shuffle sink one of every
file; files under a label missing from --labels_file get their own listing, to
be reported, never dropped; the skipped files theirs (``skipped``), which the
manifest step publishes, as it does the listed files' stamps (``listing.stamps``).
The lines are buffered and appended a buffer at a time, so the launcher holds a
bounded number of them however large the tree.
"""
from __future__ import annotations

import collections
import os
import shutil
import tempfile

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_prep.io.storage import is_local, join, storage_error
from beam_prep.write.plan import skipped
from beam_prep.write.plan.listing import Listing, stamps
from beam_prep.write.plan.run_plan import RunPlan
from beam_prep.write.shared import layout
from beam_prep.write.shared.entry import UNKNOWN_LABEL

__all__ = ["write_work_files"]

_BUFFERED_LINES = 1 << 16


class _TextFiles:
    """Text files filled a buffer at a time: appended in place on local disk; elsewhere (gs://
    cannot append) staged in a temporary folder and each uploaded whole at the end."""

    def __init__(self, folder: str, names: list[str]) -> None:
        self._folder = folder
        self._stage = folder if is_local(folder) else tempfile.mkdtemp(prefix="beam-prep-work-")
        self._names = names
        self._buffers: dict[str, list[str]] = collections.defaultdict(list)
        self._buffered = 0
        try:
            os.makedirs(self._stage, exist_ok=True)
            for name in names:  # every file exists, an empty listing too
                open(os.path.join(self._stage, name), "w").close()
        except OSError as e:
            raise storage_error("write", folder, e) from e

    def add(self, name: str, line: str) -> None:
        self._buffers[name].append(line)
        self._buffered += 1
        if self._buffered >= _BUFFERED_LINES:
            self._flush()

    def _flush(self) -> None:
        for name, lines in self._buffers.items():
            path = os.path.join(self._stage, name)
            try:
                with open(path, "a", encoding="utf-8") as f:
                    f.write("".join(f"{line}\n" for line in lines))
            except OSError as e:
                raise storage_error("write", join(self._folder, name), e) from e
        self._buffers.clear()
        self._buffered = 0

    def close(self) -> None:
        self._flush()
        if self._stage == self._folder:
            return
        try:
            for name in self._names:
                target = join(self._folder, name)
                try:
                    with open(os.path.join(self._stage, name), "rb") as src, \
                            FileSystems.create(target, mime_type="text/plain") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
                except Exception as e:  # each filesystem raises its own types.
                    raise storage_error("write", target, e) from e
        finally:
            shutil.rmtree(self._stage, ignore_errors=True)


def write_work_files(listing: Listing, run_plan: RunPlan, work: str) -> None:
    """The listings the sinks read, in the run's folder ``work``.

    The streaming sink's files are dealt to shards in order-key order (rank r
    of a split to shard r mod its count), so shard sizes differ by one record
    at most and no worker finishes its shards long before another.
    """
    streaming = run_plan.sink == "streaming"
    names = [layout.UNKNOWN_LABELS, layout.SKIPPED]
    if streaming:
        names += [layout.shard_listing_name(split, i) for split, count in run_plan.num_shards.items()
                  for i in range(count)]
    else:
        names.append(layout.LISTING)
    files = _TextFiles(work, names)
    kept_stamps = stamps.Writer()
    ranks: collections.Counter[str] = collections.Counter()
    for entry in listing.entries():
        if entry.label_id == UNKNOWN_LABEL:
            files.add(layout.UNKNOWN_LABELS, entry.to_json())
            continue
        kept_stamps.add(entry)
        if streaming:
            rank = ranks[entry.split]
            ranks[entry.split] = rank + 1
            name = layout.shard_listing_name(entry.split, rank % run_plan.num_shards[entry.split])
        else:
            name = layout.LISTING
        files.add(name, entry.to_json())
    for line in skipped.lines(listing):
        files.add(layout.SKIPPED, line)
    files.close()
    kept_stamps.close(work)
    for name, path in sorted(listing.carried.items()):
        _copy_in(path, join(work, name))


def _copy_in(path: str, target: str) -> None:
    """A local file copied, bytes as they are, to ``target`` (local or gs://)."""
    try:
        with open(path, "rb") as src, FileSystems.create(target, mime_type="application/octet-stream",
                                                         compression_type=CompressionTypes.UNCOMPRESSED) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("write", target, e) from e
