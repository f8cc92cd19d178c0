"""The sinks' steps (``shard_sinks``): a listing's line to its entry, a file to its record,
a shard number to its shard written. Each file's own step is ``tally.count_image``.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import uuid
from collections.abc import Iterable

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.windowed_value import WindowedValue

from beam_prep.io import tfrecord
from beam_prep.io.storage import join, read_lines, write_lines
from beam_prep.model.dataset import TFRECORD, shard_suffix
from beam_prep.write.images import resample
from beam_prep.write.images.examples import FileReader
from beam_prep.write.images.flat import FlatImages
from beam_prep.write.images.imaging import ImageSpec
from beam_prep.write.images.readahead import Fetched, ReadAhead, ReadAheadConfig, thread_pool
from beam_prep.write.journal import progress, resume
from beam_prep.write.shared import layout
from beam_prep.write.shared.entry import FileEntry
from beam_prep.write.shared.shard_formats import shard_format
from beam_prep.write.sinks.tally import NAMESPACE, Counters, count_image

__all__ = ["COUNTS", "FAILED", "FLAT", "ORIGINALS", "RESIZED", "ImageToExampleFn", "ParseEntryFn", "SinkConfig", "WriteShardFn"]

FAILED = "failed"
COUNTS = "counts"
ORIGINALS = "originals"
FLAT = "flat"
RESIZED = "resized"


@dataclasses.dataclass(frozen=True)
class SinkConfig:
    """What a sink and its DoFns need to write shards; see ``shard_sinks._ShardSink`` for each field."""

    spec: ImageSpec
    reads: ReadAheadConfig
    work: str
    compression: str
    num_shards: dict[str, int]
    progress_folder: str | None = None
    file_format: str = TFRECORD

    @property
    def shard_suffix(self) -> str:
        return shard_suffix(self.file_format, self.compression)


class ParseEntryFn(beam.DoFn):
    """A listing's line (``FileEntry.to_json``) to its ``FileEntry``, counted as ``listed``."""

    def __init__(self) -> None:
        self._listed = Metrics.counter(NAMESPACE, "listed")

    def process(self, line: str) -> Iterable[FileEntry]:
        self._listed.inc()
        yield FileEntry.from_json(line)


class _Reading:
    """A worker's file reader and read-ahead threads, made in ``setup``: neither can be pickled."""

    def __init__(self, config: ReadAheadConfig) -> None:
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


class ImageToExampleFn(beam.DoFn):
    """One file to its ``tally.ExampleRow`` (``tally.count_image``); a bad file goes to the
    ``failed`` output, and a record of one flat colour's relative path to ``flat`` as well;
    what resized its image to ``resized`` (``resample.counting``'s key, 1).

    An element is a ``FileEntry``, whose file is read here, or ``(FileEntry,
    bytes)``, an image already in hand, whose entry only names it.

    Reads run ahead across the elements of a bundle (``ReadAhead``): a runner
    that gives each worker one thread (Dataflow's Python batch workers) still
    keeps ``reads.concurrency`` reads in flight. An element's outputs leave
    when its read is done, later than its own ``process`` call, so they carry
    their own timestamp and window.
    """

    def __init__(self, spec: ImageSpec, reads: ReadAheadConfig, progress_folder: str | None = None,
                 file_format: str = TFRECORD) -> None:
        self._spec = spec
        self._format = shard_format(file_format)
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
        with resample.counting() as resized:
            row, failure = count_image(entry, fetched.error or fetched.data, self._spec, self._format,
                                       self._counters, self._reporter)
        for key, n in resized.items():
            yield TaggedOutput(RESIZED, WindowedValue((key, n), timestamp, (window,)))
        if row is None:
            yield TaggedOutput(FAILED, WindowedValue(failure, timestamp, (window,)))
            return
        if row.flat:
            yield TaggedOutput(FLAT, WindowedValue(entry.relpath, timestamp, (window,)))
        yield WindowedValue(row, timestamp, (window,))


class WriteShardFn(beam.DoFn):
    """Writes one whole shard from its listing (already in order-key order), unless a
    resumed run finished it already (``resume.finished_shard``).

    The next files' reads run ahead of the work (``ReadAhead``), and records
    are written in listing order all the same. The shard is written under a
    name of its own and renamed when complete, then marked finished
    (``resume.write_shard_record``), so a shard file under its final name is
    always whole, and a retried bundle or a worker left over from a killed
    launcher only rewrites the same bytes. Its records' hashes go to its hash
    file (``layout.hashes_name``), written before it is marked finished. Outputs
    ``(split, shard_name, num_examples, size, sha256)``, ``((split, label), n)`` on ``counts``,
    ``(reason, n)`` on ``originals``, a ``FlatImages`` on ``flat``, ``(what resized, n)`` on
    ``resized`` and failure reports on ``failed``, the same for a shard written now or kept.
    """

    def __init__(self, config: SinkConfig, split: str) -> None:
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
        name = layout.shard_name(split, index, config.num_shards[split], config.shard_suffix)
        record = resume.finished_shard(config.work, name)
        if record is None:
            # Named by the shard: a retried shard starts its counts again rather than adding to them.
            reporter = progress.reporter(config.progress_folder, f"{split}-{index:05d}")
            record = self._write(index, name, reporter)
            reporter.flush()
        else:  # its images are in the launcher's count already (progress.Carried), and no work of this run
            self._kept.inc()
            self._listed.inc(record.images)
        for failure in record.failures:
            yield TaggedOutput(FAILED, failure)
        for label, n in record.class_counts.items():
            yield TaggedOutput(COUNTS, ((split, label), n))
        for reason, n in record.originals.items():
            yield TaggedOutput(ORIGINALS, (reason, n))
        yield TaggedOutput(FLAT, FlatImages.from_json(record.flat))
        for key, n in record.resized.items():
            yield TaggedOutput(RESIZED, (key, n))
        yield split, name, record.records, record.size, record.sha256

    def _write(self, index: int, name: str, reporter: progress.Reporter) -> resume.ShardRecord:
        config, split = self._config, self._split
        lines = read_lines(join(config.work, layout.shard_listing_name(split, index)))
        entries = (FileEntry.from_json(line) for line in lines)  # parsed as the window takes them
        per_label: collections.Counter[str] = collections.Counter()  # a multi-label record under each label
        written = 0
        originals: collections.Counter[str] = collections.Counter()
        failures = []
        flat = []
        hashes = []
        checksum = tfrecord.Checksum()
        partial = join(config.work, f"{name}.{uuid.uuid4().hex}.partial")
        file_format = shard_format(config.file_format)
        with file_format.records(partial, config.compression, checksum, shown_as=join(config.work, name)) as write, \
                self._reading.window() as window, resample.counting() as resized:
            for fetched in window.stream(entries, lambda e: e.path, lambda e: e.size):
                entry = fetched.item
                self._listed.inc()
                row, failure = count_image(entry, fetched.error or fetched.data, config.spec, file_format,
                                           self._counters, reporter)
                if row is None:
                    failures.append(failure)
                    continue
                write(row.example)
                written += 1
                per_label.update(row.labels)
                if row.original is not None:
                    originals[row.original] += 1
                if row.flat:
                    flat.append(entry.relpath)
                hashes.append(row.hash_line)
        # The shard's companions (its DALI index) under their final names with it.
        FileSystems.rename(file_format.shard_files(partial, config.compression),
                           file_format.shard_files(join(config.work, name), config.compression))
        write_lines(join(config.work, layout.hashes_name(name)), hashes)
        record = resume.ShardRecord(name=name, records=written, size=checksum.size,
                                    sha256=checksum.hexdigest(), class_counts=dict(per_label), failures=failures,
                                    originals=dict(sorted(originals.items())),
                                    flat=FlatImages.of(flat).to_json(), resized=dict(sorted(resized.items())))
        resume.write_shard_record(config.work, record)
        return record
