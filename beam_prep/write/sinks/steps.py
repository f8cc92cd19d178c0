"""The sinks' steps (``shard_sinks``): a listing's line to its entry, a file to its record,
a shard number to its shard written. Each file's own step is ``tally.count_image``.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
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
from beam_prep.write.images import flat, resample
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
    version: int = 1

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
        if self._reader is not None:
            self._reader.close()


class ImageToExampleFn(beam.DoFn):
    """One file to its ``tally.ExampleRow`` (``tally.count_image``); a bad file goes to the
    ``failed`` output, and a record of one flat colour's flat.jsonl row (``flat.file_row``) to ``flat`` as well;
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
            yield TaggedOutput(FLAT, WindowedValue(flat.file_row(entry, row.flat), timestamp, (window,)))
        yield WindowedValue(row, timestamp, (window,))


class _Shard:
    """A shard the streaming sink is writing: its files come back read, in listing order, from
    the worker's read-ahead, perhaps in a later ``process`` call than the one that listed them.

    Its file is opened when its first file comes back, not when it is listed, so that however
    many shards' reads the window holds, one shard file is open at a time.
    """

    def __init__(self, config: SinkConfig, name: str, reporter: progress.Reporter,
                 timestamp: object, window: object) -> None:
        self.name = name
        self.reporter = reporter
        self.timestamp = timestamp
        self.window = window
        self.pushed = 0  # files given to the read-ahead
        self.taken = 0  # files back from it, and written or failed
        self.listed = False  # every file of its listing pushed
        self._config = config
        self._format = shard_format(config.file_format)
        self._file: contextlib.ExitStack | None = None
        self._write = None
        self._partial = join(config.work, f"{name}.{uuid.uuid4().hex}.partial")
        self._checksum = tfrecord.Checksum()
        self._per_label: collections.Counter[str] = collections.Counter()  # a multi-label record under each label
        self._originals: collections.Counter[str] = collections.Counter()
        self._resized: collections.Counter[str] = collections.Counter()
        self._written = 0
        self._failures: list[dict] = []
        self._flat: list[dict] = []
        self._hashes: list[str] = []

    @property
    def complete(self) -> bool:
        return self.listed and self.taken == self.pushed

    def add(self, entry: FileEntry, fetched: Fetched, counters: Counters) -> None:
        """One file's read, in its turn: its record written, or its failure kept."""
        self.taken += 1
        with resample.counting() as resized:
            row, failure = count_image(entry, fetched.error or fetched.data, self._config.spec, self._format,
                                       counters, self.reporter)
        self._resized.update(resized)
        if row is None:
            self._failures.append(failure)
            return
        self._open()(row.example)
        self._written += 1
        self._per_label.update(row.labels)
        if row.original is not None:
            self._originals[row.original] += 1
        if row.flat:
            self._flat.append(flat.file_row(entry, row.flat))
        self._hashes.append(row.hash_line)

    def finish(self) -> resume.ShardRecord:
        """Completes the shard: its file renamed to its final name, its hash file, then its record."""
        config = self._config
        self._open()  # a shard of failed files only is still written, empty
        file, self._file = self._file, None
        file.close()
        # The shard's companions (its DALI index) under their final names with it.
        FileSystems.rename(self._format.shard_files(self._partial, config.compression),
                           self._format.shard_files(join(config.work, self.name), config.compression))
        write_lines(join(config.work, layout.hashes_name(self.name)), self._hashes)
        record = resume.ShardRecord(
            name=self.name, records=self._written, size=self._checksum.size, sha256=self._checksum.hexdigest(),
            class_counts=dict(self._per_label), failures=self._failures,
            originals=dict(sorted(self._originals.items())), flat=FlatImages.of(self._flat).to_json(),
            resized=dict(sorted(self._resized.items())))
        resume.write_shard_record(config.work, record)
        self.reporter.flush()
        return record

    def abandon(self) -> None:
        """Closes the file of a shard that will not be finished: it stays under its temporary
        name, never marked finished, and the next run writes the shard again."""
        if self._file is not None:
            file, self._file = self._file, None
            with contextlib.suppress(Exception):
                file.close()

    def _open(self):
        if self._file is None:
            config = self._config
            self._file = contextlib.ExitStack()
            self._write = self._file.enter_context(self._format.records(
                self._partial, config.compression, self._checksum, shown_as=join(config.work, self.name)))
        return self._write


class WriteShardFn(beam.DoFn):
    """Writes one whole shard from its listing (already in order-key order), unless a
    resumed run finished it already (``resume.finished_shard``).

    The next files' reads run ahead of the work (``ReadAhead``), and records
    are written in listing order all the same. The window is the bundle's, not
    the shard's: a worker's next shard's first reads start while its current
    shard's last are still in flight, so the reads never drain at a shard's end.
    A shard whose last files are still being read when its ``process`` call
    ends is completed by the next call, or by ``finish_bundle``, and its outputs
    leave then, with their own timestamp and window. The shard is written under a
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
        self._window: ReadAhead | None = None
        self._open: collections.deque[_Shard] = collections.deque()  # listed, not yet finished, in order

    def setup(self) -> None:
        self._reading.setup()

    def teardown(self) -> None:
        self._abandon()
        self._reading.teardown()

    def start_bundle(self) -> None:
        self._abandon()  # what a failed bundle left
        self._window = self._reading.window()

    def process(self, index: int, timestamp=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam):
        config, split = self._config, self._split
        name = layout.shard_name(split, index, config.num_shards[split], config.shard_suffix, config.version)
        record = resume.finished_shard(config.work, name)
        if record is not None:  # its images are in the launcher's count already (progress.Carried), and no work of this run
            self._kept.inc()
            self._listed.inc(record.images)
            yield from _shard_outputs(split, record, timestamp, window)
            return
        try:
            # Named by the shard: a retried shard starts its counts again rather than adding to them.
            shard = _Shard(config, name, progress.reporter(config.progress_folder, f"{split}-{index:05d}"),
                           timestamp, window)
            self._open.append(shard)
            for line in read_lines(join(config.work, layout.shard_listing_name(split, index))):
                entry = FileEntry.from_json(line)  # parsed as the window takes them
                shard.pushed += 1
                for fetched in self._window.push((shard, entry), entry.path, entry.size):
                    yield from self._take(fetched)
            shard.listed = True
            yield from self._finish_complete()
        except BaseException:
            self._abandon()
            raise

    def finish_bundle(self):
        try:
            for fetched in self._window.drain():
                yield from self._take(fetched)
            yield from self._finish_complete()
        except BaseException:
            self._abandon()
            raise
        assert not self._open, "every shard listed in a bundle is finished at its end"
        self._window = None

    def _take(self, fetched: Fetched):
        shard, entry = fetched.item
        self._listed.inc()
        shard.add(entry, fetched, self._counters)
        yield from self._finish_complete()

    def _finish_complete(self):
        """Finishes the shards whose files are all back: the window gives them back in order."""
        while self._open and self._open[0].complete:
            shard = self._open.popleft()
            yield from _shard_outputs(self._split, shard.finish(), shard.timestamp, shard.window)

    def _abandon(self) -> None:
        """Drops the reads in flight and the shards not finished (a failed or cut-short bundle)."""
        if self._window is not None:
            self._window.cancel()
            self._window = None
        while self._open:
            self._open.popleft().abandon()


def _shard_outputs(split: str, record: resume.ShardRecord, timestamp: object, window: object):
    """A shard's outputs (``WriteShardFn``'s), in the timestamp and window of its element."""
    def windowed(value):
        return WindowedValue(value, timestamp, (window,))

    for failure in record.failures:
        yield TaggedOutput(FAILED, windowed(failure))
    for label, n in record.class_counts.items():
        yield TaggedOutput(COUNTS, windowed(((split, label), n)))
    for reason, n in record.originals.items():
        yield TaggedOutput(ORIGINALS, windowed((reason, n)))
    yield TaggedOutput(FLAT, windowed(FlatImages.from_json(record.flat)))
    for key, n in record.resized.items():
        yield TaggedOutput(RESIZED, windowed((key, n)))
    yield windowed((split, record.name, record.records, record.size, record.sha256))
