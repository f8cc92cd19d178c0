"""Beam wiring: listings -> examples -> shards, with a dead-letter output for bad images.

Two sinks share the per-file step (``tally.count_image``), one constructor
(``_ShardSink``) and their outputs (``SinkResult``); both read the listings the
launcher wrote in the run's folder and write their shards there, for the
manifest step to publish. Their DoFns are in ``steps``.

* ``WriteShardsStreaming`` (local runners): one DoFn call streams a shard's files
  into its file; only shard numbers move, so memory stays flat and the layout is
  reproducible.
* ``WriteShardsShuffle`` (distributed runners): Reshuffle, an image DoFn per
  file, Beam's file sink (``file_sink``); the runner's shuffle groups the records. Its part
  after the listing, ``WriteEntriesShuffle``, also serves ``write_image_dataset.WriteImageDataset``.

In both, a worker's reads run ahead of its work (``readahead.ReadAhead``), and a
local run counts each image for the progress display (``progress.reporter``).
See docs/design/sinks.md for which sink runs where, and why.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.textio import ReadFromText, WriteToText
from apache_beam.pvalue import PCollection

from beam_prep.io.storage import join
from beam_prep.model.dataset import TFRECORD
from beam_prep.write.images.flat import FlatImagesFn
from beam_prep.write.images.imaging import ImageSpec
from beam_prep.write.images.readahead import ReadAheadConfig
from beam_prep.write.shared import layout
from beam_prep.write.shared.shard_formats import ShardFormat, shard_format
from beam_prep.write.sinks.file_sink import write_shards, written_shard
from beam_prep.write.sinks.steps import (
    COUNTS,
    FAILED,
    FLAT,
    ORIGINALS,
    RESIZED,
    ImageToExampleFn,
    ParseEntryFn,
    SinkConfig,
    WriteShardFn,
)

__all__ = ["SinkResult", "WriteEntriesShuffle", "WriteShardsShuffle", "WriteShardsStreaming"]


class SinkResult(NamedTuple):
    """What a sink outputs, each a PCollection over all splits, for the manifest step.

    Attributes:
      shards: ``(split, shard file name, number of records, size in bytes, sha256)`` per
        shard written; the size and sha256 taken as its bytes were written.
        Both sinks count: the streaming sink as it writes a shard; the shuffle
        sink, whose file sink does not say how many records each shard got,
        reads each finished shard back (``CountRecords``, one shard a worker).
        ``publish.ShardReports`` still takes None for a count not known (and the
        manifest then leaves its per-shard counts out), but no sink gives it.
      class_counts: ``((split, label), number of records)``, one per pair.
      failures: a failure report (``examples.failure_report``) per file that
        became no record.
      originals: ``(KEPT or a re-encode reason, number of records)``, one per
        reason (``--image_format original``; empty otherwise).
      hashes: the path of each hash file written (``duplicates.hash_line``: one
        line per record), for the duplicates report.
      flat: ``flat.FlatImages``, the records of one flat colour, one or more
        parts that together count each such record once.
      resized: ``(what resized, number of images)`` (``resample.counting``'s keys), for the
        manifest's ``resize_kernel`` and the launcher's one warning where Pillow's loops stood in.
    """

    shards: PCollection
    class_counts: PCollection
    failures: PCollection
    originals: PCollection
    hashes: PCollection
    flat: PCollection
    resized: PCollection


class _ShardSink(beam.PTransform):
    """What the sinks share: applied to the pipeline itself (``p | sink``; ``WriteEntriesShuffle``
    to a PCollection of entries), a sink writes every split's shards into ``work`` and
    returns a ``SinkResult``."""

    def __init__(self, spec: ImageSpec, reads: ReadAheadConfig, work: str, compression: str,
                 num_shards: Mapping[str, int], progress_folder: str | None = None,
                 file_format: str = TFRECORD, version: int = 1) -> None:
        """Initializes a sink.

        Args:
          spec: what each image becomes (size, format, channels).
          reads: how far a worker's reads run ahead of its work.
          work: the run's folder (``layout.run_folder``), holding the listings the
            launcher wrote (``work_files.write_work_files``); the shards are written
            there too, under their final names (``layout.shard_name``).
          compression: a key of ``layout.COMPRESSIONS`` (``gzip`` or ``none``).
          num_shards: split -> its number of shards; every split listed gets its shards.
          progress_folder: a local folder where the workers report the images they
            have finished (``progress.Reporter``), for the launcher to show; None
            where the launcher cannot see the workers' files (remote runners).
          file_format: a key of ``formats.FILE_FORMATS``: the shards' format.
          version: the dataset version the shards make, which names them (``layout.shard_name``).
        """
        super().__init__()
        self._config = SinkConfig(spec, reads, work, compression, dict(num_shards), progress_folder, file_format,
                                  version)


class WriteShardsStreaming(_ShardSink):
    """Shard numbers -> shard files written by the workers themselves; see the module docstring.

    One stage per split: a local runner deals a stage's shards out to its
    workers evenly, so with a shard count that is a multiple of the worker count
    every core has the same work. The launcher must have written one listing per
    shard (``layout.shard_listing_name``). Arguments as ``_ShardSink``'s.
    """

    def expand(self, pbegin: beam.pvalue.PBegin) -> SinkResult:
        shards, counts, failed, originals, flat, resized = [], [], [], [], [], []
        for split, count in self._config.num_shards.items():
            results = (
                pbegin
                | f"Shards[{split}]" >> beam.Create(list(range(count)), reshuffle=False)
                | f"Reshuffle[{split}]" >> beam.Reshuffle()
                | f"WriteShards[{split}]" >> beam.ParDo(WriteShardFn(self._config, split)).with_outputs(
                    FAILED, COUNTS, ORIGINALS, FLAT, RESIZED, main="shards"))
            shards.append(results.shards)
            counts.append(results[COUNTS])
            failed.append(results[FAILED])
            originals.append(results[ORIGINALS])
            flat.append(results[FLAT])
            resized.append(results[RESIZED])
        all_shards = tuple(shards) | "AllShards" >> beam.Flatten()
        return SinkResult(
            shards=all_shards,
            class_counts=tuple(counts) | "AllCounts" >> beam.Flatten() | "SumCounts" >> beam.CombinePerKey(sum),
            failures=tuple(failed) | "AllFailed" >> beam.Flatten(),
            originals=(tuple(originals) | "AllOriginals" >> beam.Flatten()
                       | "SumOriginals" >> beam.CombinePerKey(sum)),
            hashes=all_shards | "HashFiles" >> beam.Map(
                lambda row, work=self._config.work: join(work, layout.hashes_name(row[1]))),
            flat=tuple(flat) | "AllFlat" >> beam.Flatten(),
            resized=tuple(resized) | "AllResized" >> beam.Flatten() | "SumResized" >> beam.CombinePerKey(sum))


class WriteEntriesShuffle(_ShardSink):
    """Entries -> Reshuffle -> image DoFn -> Beam's file sink per split: the shuffle sink's work.

    Applied to a PCollection of ``FileEntry`` (read by the workers) or
    ``(FileEntry, bytes)`` (images in hand), as ``WriteShardsShuffle`` applies it
    to the launcher's listing and ``WriteImageDataset`` to a user's elements.
    Every entry's split must be a key of ``num_shards``; a count of 0 lets the
    runner choose that split's shard count. Arguments as ``_ShardSink``'s
    (``work`` needs no listing).
    """

    def expand(self, entries: PCollection) -> SinkResult:
        config = self._config
        splits = sorted(config.num_shards)
        results = (
            entries
            | "Reshuffle" >> beam.Reshuffle()
            | "ImageToExample" >> beam.ParDo(
                ImageToExampleFn(config.spec, config.reads, config.progress_folder, config.file_format)).with_outputs(
                    FAILED, FLAT, RESIZED, main="records"))
        records = results.records
        counts = (records
                  | "KeyByLabel" >> beam.FlatMap(lambda r: [((r.split, label), 1) for label in r.labels])
                  | "SumCounts" >> beam.CombinePerKey(sum))
        originals = (records
                     | "KeyByOriginal" >> beam.FlatMap(lambda r: [(r.original, 1)] if r.original is not None else [])
                     | "SumOriginals" >> beam.CombinePerKey(sum))
        by_split = records | "PartitionBySplit" >> beam.Partition(
            lambda r, _: splits.index(r.split), len(splits))
        file_format = shard_format(config.file_format)
        shard_lists = []
        for split, part in zip(splits, by_split):
            written = (
                part
                | f"Examples[{split}]" >> beam.Map(lambda r: r.example)
                | f"WriteFiles[{split}]" >> write_shards(
                    join(config.work, layout.shard_prefix(split, config.version)), config.file_format, config.compression, config.num_shards[split],
                    layout.SHARD_TEMPLATE))
            # Beam's file sink does not say how many records each shard got: count them,
            # one shard a worker (the Reshuffle spreads the names out), for the manifest.
            shard_lists.append(
                written
                | f"SpreadShards[{split}]" >> beam.Reshuffle()
                | f"CountRecords[{split}]" >> beam.Map(_count_records, split, file_format, config.compression))
        hashes = (records
                  | "HashLines" >> beam.Map(lambda r: r.hash_line)
                  | "WriteHashes" >> WriteToText(join(config.work, layout.HASHES), file_name_suffix=".txt"))
        return SinkResult(shards=tuple(shard_lists) | "AllShards" >> beam.Flatten(),
                          class_counts=counts,
                          failures=results[FAILED],
                          originals=originals,
                          hashes=hashes,
                          flat=results[FLAT] | "GatherFlat" >> beam.CombineGlobally(FlatImagesFn()),
                          resized=results[RESIZED] | "SumResized" >> beam.CombinePerKey(sum))


def _count_records(text: str, split: str, file_format: ShardFormat,
                   compression: str) -> tuple[str, str, int, int, str]:
    """A shard Beam's file sink wrote (``file_sink.written_shard``) as a ``SinkResult.shards`` row."""
    shard = written_shard(text)
    return split, shard.path.rsplit("/", 1)[-1], file_format.count(shard.path, compression), shard.size, shard.sha256


class WriteShardsShuffle(_ShardSink):
    """Listing -> ``WriteEntriesShuffle``; see the module docstring.

    The launcher must have written one listing of every file (``layout.LISTING``).
    Arguments as ``_ShardSink``'s.
    """

    def expand(self, pbegin: beam.pvalue.PBegin) -> SinkResult:
        c = self._config
        return (pbegin
                | "ReadListing" >> ReadFromText(join(c.work, layout.LISTING), validate=False)
                | "ParseEntries" >> beam.ParDo(ParseEntryFn())
                | "Write" >> WriteEntriesShuffle(c.spec, c.reads, c.work, c.compression, c.num_shards,
                                                 c.progress_folder, c.file_format, c.version))
