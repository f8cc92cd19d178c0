"""Beam wiring: listings -> examples -> shards, with a dead-letter output for bad images.

Two sinks share the per-file step (``records.make_example``), one constructor
(``_ShardSink``) and their outputs (``SinkResult``); both read the listings the
launcher wrote in the run's folder and write their shards there, for the
manifest step to publish:

* ``WriteShardsStreaming`` (local runners): one DoFn call streams a shard's files
  into its file; only shard numbers move, so memory stays flat and the layout is
  reproducible.
* ``WriteShardsShuffle`` (distributed runners): Reshuffle, an image DoFn per
  file, ``WriteToTFRecord``; the runner's shuffle groups the records. Its part
  after the listing, ``WriteEntriesShuffle``, also serves ``write.WriteImageDataset``.

In both, a worker's reads run ahead of its work (``readahead.ReadAhead``), and a
local run counts each image for the progress display (``progress.reporter``).
See README *Which sink runs where, and why*.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import uuid
from typing import Any, Iterable, Mapping, NamedTuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.textio import ReadFromText, WriteToText
from apache_beam.io.tfrecordio import WriteToTFRecord
from apache_beam.metrics import Metrics
from apache_beam.pvalue import PCollection, TaggedOutput
from apache_beam.utils.windowed_value import WindowedValue

from beam_prep import duplicates, layout, progress, resume, tfrecord
from beam_prep.imaging import ImageSpec
from beam_prep.listing import FileEntry
from beam_prep.readahead import Fetched, ReadAhead, ReadConfig, thread_pool
from beam_prep.records import FileReader, Outcome, make_example
from beam_prep.storage import join, read_lines, write_lines
from beam_prep.tfrecord import count_records, write_record

__all__ = ["NAMESPACE", "Counters", "ParseEntryFn", "SinkResult", "WriteEntriesShuffle", "WriteShardsShuffle",
           "WriteShardsStreaming"]

NAMESPACE = "beam_prep"  # of every counter the pipeline reports
_FAILED = "failed"
_COUNTS = "counts"
_ORIGINALS = "originals"


class SinkResult(NamedTuple):
    """What a sink outputs, each a PCollection over all splits, for the manifest step.

    Attributes:
      shards: ``(split, shard file name, number of records or None)`` per shard
        written; the shuffle sink cannot count a shard's records, so gives None.
      class_counts: ``((split, label), number of records)``, one per pair.
      failures: a failure report (``records.failure_report``) per file that
        became no record.
      originals: ``(KEPT or a re-encode reason, number of records)``, one per
        reason (``--image_format original``; empty otherwise).
      hashes: the path of each hash file written (``duplicates.hash_line``: one
        line per record), for the duplicates report.
    """

    shards: PCollection
    class_counts: PCollection
    failures: PCollection
    originals: PCollection
    hashes: PCollection


@dataclasses.dataclass(frozen=True)
class _SinkConfig:
    """What a sink and its DoFns need to write shards; see ``_ShardSink`` for each field."""

    spec: ImageSpec
    reads: ReadConfig
    work: str
    compression: str
    num_shards: dict[str, int]
    progress_folder: str | None = None


class Counters:
    """The counters a user watches in the runner's UI (``failed_<stage>`` made as stages appear)."""

    def __init__(self) -> None:
        self.written = Metrics.counter(NAMESPACE, "written")
        self.bytes_in = Metrics.counter(NAMESPACE, "bytes_in")
        self.bytes_out = Metrics.counter(NAMESPACE, "bytes_out")
        self._failed: dict[str, Any] = {}

    def count(self, outcome: Outcome) -> bool:
        """Counts one file's outcome; True if it became a record."""
        self.bytes_in.inc(outcome.bytes_in)
        if outcome.failure is not None:
            stage = outcome.failure["stage"]
            if stage not in self._failed:
                self._failed[stage] = Metrics.counter(NAMESPACE, f"failed_{stage}")
            self._failed[stage].inc()
            return False
        self.written.inc()
        self.bytes_out.inc(len(outcome.example))
        return True


class ParseEntryFn(beam.DoFn):
    """A listing's line (``FileEntry.to_json``) to its ``FileEntry``, counted as ``listed``."""

    def __init__(self) -> None:
        self._listed = Metrics.counter(NAMESPACE, "listed")

    def process(self, line: str) -> Iterable[FileEntry]:
        self._listed.inc()
        yield FileEntry.from_json(line)


class _Reading:
    """A worker's file reader and read-ahead threads, made in ``setup``: neither can be pickled."""

    def __init__(self, config: ReadConfig) -> None:
        self.config = config
        self._reader: FileReader | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def setup(self) -> None:
        self._reader = FileReader(connections=max(1, self.config.concurrency))
        self._pool = thread_pool(self.config)

    def window(self) -> ReadAhead:
        return ReadAhead(self._reader, self.config, self._pool)

    def teardown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


class _ImageToExampleFn(beam.DoFn):
    """One file to ``(split, label, example, original, hash line)``; a bad file goes to the ``failed`` output.

    An element is a ``FileEntry``, whose file is read here, or ``(FileEntry,
    bytes)``, an image already in hand, whose entry only names it.

    Reads run ahead across the elements of a bundle (``ReadAhead``): a runner
    that gives each worker one thread (Dataflow's Python batch workers) still
    keeps ``reads.concurrency`` reads in flight. An element's outputs leave
    when its read is done, later than its own ``process`` call, so they carry
    their own timestamp and window.
    """

    def __init__(self, spec: ImageSpec, reads: ReadConfig, progress_folder: str | None = None) -> None:
        self._spec = spec
        self._reading = _Reading(reads)
        self._counters = Counters()
        self._window: ReadAhead | None = None
        self._progress_folder = progress_folder
        self._reporter = None

    def setup(self) -> None:
        self._reading.setup()
        # Elements, not shards, are this DoFn's work: one report per instance, its counts cumulative.
        self._reporter = progress.reporter(self._progress_folder, f"instance-{uuid.uuid4().hex}")

    def start_bundle(self) -> None:
        self._window = self._reading.window()

    def process(self, element: FileEntry | tuple[FileEntry, bytes],
                timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam):
        if isinstance(element, FileEntry):
            for fetched in self._window.push((element, timestamp, window), element.path, element.size):
                yield from self._convert(fetched)
            return
        entry, data = element  # bytes in hand (``WriteImageDataset``): nothing to read
        yield from self._convert(Fetched((entry, timestamp, window), data, None))

    def finish_bundle(self):
        for fetched in self._window.drain():
            yield from self._convert(fetched)
        self._reporter.flush()

    def teardown(self) -> None:
        self._reading.teardown()

    def _convert(self, fetched: Fetched):
        entry, timestamp, window = fetched.item
        outcome = make_example(entry, self._spec, fetched.error or fetched.data)
        ok = self._counters.count(outcome)
        self._reporter.add(ok)
        if not ok:
            yield TaggedOutput(_FAILED, WindowedValue(outcome.failure, timestamp, (window,)))
            return
        yield WindowedValue((entry.split, entry.label, outcome.example, outcome.original,
                             duplicates.hash_line(outcome.sha256, entry.split, entry.path)), timestamp, (window,))


class _WriteShardFn(beam.DoFn):
    """Writes one whole shard from its listing (already in order-key order), unless a
    resumed run finished it already (``resume.finished_shard``).

    The next files' reads run ahead of the work (``ReadAhead``), and records
    are written in listing order all the same. The shard is written under a
    name of its own and renamed when complete, then marked finished
    (``resume.write_shard_record``), so a shard file under its final name is
    always whole, and a retried bundle or a worker left over from a killed
    launcher only rewrites the same bytes. Its records' hashes go to its hash
    file (``layout.hashes_name``), written before it is marked finished. Outputs
    ``(split, shard_name, num_examples)``, ``((split, label), n)`` on ``counts``,
    ``(reason, n)`` on ``originals`` and failure reports on ``failed``, the same
    for a shard written now or kept.
    """

    def __init__(self, config: _SinkConfig, split: str) -> None:
        self._config = config
        self._split = split
        self._reading = _Reading(config.reads)
        self._counters = Counters()
        self._listed = Metrics.counter(NAMESPACE, "listed")
        self._kept = Metrics.counter(NAMESPACE, "shards_kept")

    def setup(self) -> None:
        self._reading.setup()

    def teardown(self) -> None:
        self._reading.teardown()

    def process(self, index: int):
        config, split = self._config, self._split
        name = layout.shard_name(split, index, config.num_shards[split], config.compression)
        # Named by the shard: a retried shard starts its counts again rather than adding to them.
        reporter = progress.reporter(config.progress_folder, f"{split}-{index:05d}")
        record = resume.finished_shard(config.work, name)
        if record is None:
            record = self._write(index, name, reporter)
        else:
            self._kept.inc()
            self._listed.inc(record.records + len(record.failures))
            reporter.add_many(record.records + len(record.failures), len(record.failures))
        reporter.flush()
        for failure in record.failures:
            yield TaggedOutput(_FAILED, failure)
        for label, n in record.class_counts.items():
            yield TaggedOutput(_COUNTS, ((split, label), n))
        for reason, n in record.originals.items():
            yield TaggedOutput(_ORIGINALS, (reason, n))
        yield split, name, record.records

    def _write(self, index: int, name: str, reporter: progress.Reporter) -> resume.ShardRecord:
        config, split = self._config, self._split
        lines = read_lines(join(config.work, layout.shard_listing_name(split, index)))
        entries = (FileEntry.from_json(line) for line in lines)  # parsed as the window takes them
        per_label: collections.Counter[str] = collections.Counter()
        originals: collections.Counter[str] = collections.Counter()
        failures = []
        hashes = []
        checksum = tfrecord.Checksum()
        partial = join(config.work, f"{name}.{uuid.uuid4().hex}.partial")
        with tfrecord.shard_writer(partial, config.compression, checksum, shown_as=join(config.work, name)) as f, \
                self._reading.window() as window:
            for fetched in window.stream(entries, lambda e: e.path, lambda e: e.size):
                entry = fetched.item
                self._listed.inc()
                outcome = make_example(entry, config.spec, fetched.error or fetched.data)
                ok = self._counters.count(outcome)
                reporter.add(ok)
                if ok:
                    write_record(f, outcome.example)
                    per_label[entry.label] += 1
                    if outcome.original is not None:
                        originals[outcome.original] += 1
                    hashes.append(duplicates.hash_line(outcome.sha256, split, entry.path))
                else:
                    failures.append(outcome.failure)
        FileSystems.rename([partial], [join(config.work, name)])
        write_lines(join(config.work, layout.hashes_name(name)), hashes)
        record = resume.ShardRecord(name=name, records=sum(per_label.values()), size=checksum.size,
                                    sha256=checksum.hexdigest(), class_counts=dict(per_label), failures=failures,
                                    originals=dict(sorted(originals.items())))
        resume.write_shard_record(config.work, record)
        return record


class _ShardSink(beam.PTransform):
    """What the sinks share: applied to the pipeline itself (``p | sink``; ``WriteEntriesShuffle``
    to a PCollection of entries), a sink writes every split's shards into ``work`` and
    returns a ``SinkResult``."""

    def __init__(self, spec: ImageSpec, reads: ReadConfig, work: str, compression: str,
                 num_shards: Mapping[str, int], progress_folder: str | None = None) -> None:
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
        """
        super().__init__()
        self._config = _SinkConfig(spec, reads, work, compression, dict(num_shards), progress_folder)


class WriteShardsStreaming(_ShardSink):
    """Shard numbers -> shard files written by the workers themselves; see the module docstring.

    One stage per split: a local runner deals a stage's shards out to its
    workers evenly, so with a shard count that is a multiple of the worker count
    every core has the same work. The launcher must have written one listing per
    shard (``layout.shard_listing_name``). Arguments as ``_ShardSink``'s.
    """

    def expand(self, pbegin: beam.pvalue.PBegin) -> SinkResult:
        shards, counts, failed, originals = [], [], [], []
        for split, count in self._config.num_shards.items():
            results = (
                pbegin
                | f"Shards[{split}]" >> beam.Create(list(range(count)), reshuffle=False)
                | f"Reshuffle[{split}]" >> beam.Reshuffle()
                | f"WriteShards[{split}]" >> beam.ParDo(_WriteShardFn(self._config, split)).with_outputs(
                    _FAILED, _COUNTS, _ORIGINALS, main="shards"))
            shards.append(results.shards)
            counts.append(results[_COUNTS])
            failed.append(results[_FAILED])
            originals.append(results[_ORIGINALS])
        all_shards = tuple(shards) | "AllShards" >> beam.Flatten()
        return SinkResult(
            shards=all_shards,
            class_counts=tuple(counts) | "AllCounts" >> beam.Flatten() | "SumCounts" >> beam.CombinePerKey(sum),
            failures=tuple(failed) | "AllFailed" >> beam.Flatten(),
            originals=(tuple(originals) | "AllOriginals" >> beam.Flatten()
                       | "SumOriginals" >> beam.CombinePerKey(sum)),
            hashes=all_shards | "HashFiles" >> beam.Map(
                lambda row, work=self._config.work: join(work, layout.hashes_name(row[1]))))


class WriteEntriesShuffle(_ShardSink):
    """Entries -> Reshuffle -> image DoFn -> ``WriteToTFRecord`` per split: the shuffle sink's work.

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
                _ImageToExampleFn(config.spec, config.reads, config.progress_folder)).with_outputs(
                    _FAILED, main="records"))
        records = results.records
        counts = (records
                  | "KeyByLabel" >> beam.Map(lambda r: ((r[0], r[1]), 1))
                  | "SumCounts" >> beam.CombinePerKey(sum))
        originals = (records
                     | "KeyByOriginal" >> beam.FlatMap(lambda r: [(r[3], 1)] if r[3] is not None else [])
                     | "SumOriginals" >> beam.CombinePerKey(sum))
        by_split = records | "PartitionBySplit" >> beam.Partition(
            lambda r, _: splits.index(r[0]), len(splits))
        suffix, compression_type, _ = layout.COMPRESSIONS[config.compression]
        shard_lists = []
        for split, part in zip(splits, by_split):
            written = (
                part
                | f"Examples[{split}]" >> beam.Map(lambda r: r[2])
                | f"WriteToTFRecord[{split}]" >> WriteToTFRecord(
                    join(config.work, split),
                    file_name_suffix=suffix,
                    num_shards=config.num_shards[split],
                    shard_name_template=layout.SHARD_TEMPLATE,
                    compression_type=compression_type))
            # WriteToTFRecord does not say how many records each shard got: count them,
            # one shard a worker (the Reshuffle spreads the names out), for the manifest.
            shard_lists.append(
                written
                | f"SpreadShards[{split}]" >> beam.Reshuffle()
                | f"CountRecords[{split}]" >> beam.Map(
                    lambda path, s=split, c=config.compression: (s, path.rsplit("/", 1)[-1],
                                                                 count_records(path, c))))
        hashes = (records
                  | "HashLines" >> beam.Map(lambda r: r[4])
                  | "WriteHashes" >> WriteToText(join(config.work, layout.HASHES), file_name_suffix=".txt"))
        return SinkResult(shards=tuple(shard_lists) | "AllShards" >> beam.Flatten(),
                          class_counts=counts,
                          failures=results[_FAILED],
                          originals=originals,
                          hashes=hashes)


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
                                                 c.progress_folder))
