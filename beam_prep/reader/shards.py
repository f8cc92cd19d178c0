"""One shard file's serialized records, read so that a damaged file fails naming itself."""
from __future__ import annotations

from typing import TYPE_CHECKING

from beam_prep.io.storage import is_local

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

__all__ = ["LOCAL_READ_BUFFER_BYTES", "READ_BUFFER_BYTES", "read_buffer_bytes", "read_shard"]

# Read-ahead per open file: big sequential reads matter on GCS (each read is a
# request); times the files read at once (pipeline.MAX_CYCLE_LENGTH), it bounds the memory.
READ_BUFFER_BYTES = 4 << 20
# On local disk the kernel reads ahead already, and a big buffer is allocated and filled
# again for every file opened: with the default command's shards of about 1 MB, 16 files of
# 4 MiB cost about a tenth of the reading's CPU (docs/design/reader.md).
LOCAL_READ_BUFFER_BYTES = 256 << 10


def read_buffer_bytes(path: str) -> int:
    """The read-ahead for a shard at ``path``: more from an object store than from local disk."""
    return LOCAL_READ_BUFFER_BYTES if is_local(path) else READ_BUFFER_BYTES


def read_shard(shard: tf.Tensor, compression_type: str, num_records: tf.Tensor | None = None,
               buffer_size: int = READ_BUFFER_BYTES) -> tf.data.Dataset:
    """One shard file's serialized records; given its record count, a damaged file fails naming itself.

    TensorFlow's own error for a damaged TFRecord file does not name the file,
    and a plain file cut short raises nothing at all. tf.data cannot catch an
    error and raise another, so with the manifest's count ``n`` the file is read
    as ``records.ignore_errors().concatenate(<an element that fails naming the
    file>).take(n)``: a sound shard stops at ``n`` before the failing element; a
    short one reaches it, and ``tf.errors.InvalidArgumentError`` names the file,
    in Python loops, ``model.fit`` and ``tf.distribute`` alike. TensorFlow's own
    error is logged as a warning; the records before the damage are yielded.

    Without ``num_records`` the file is read as it is. ``buffer_size`` is the read-ahead
    (``read_buffer_bytes``). See docs/design/reader.md for why this shape, what it costs
    and its limits.
    """
    import tensorflow as tf

    records = tf.data.TFRecordDataset(shard, compression_type=compression_type,
                                      buffer_size=buffer_size)
    if num_records is None:
        return records

    def fail(path):
        # No quotes in the text: Assert prints strings C-escaped.
        message = tf.strings.join([
            "shard file ", path, " is damaged or could not be read: it ends before the ",
            tf.strings.as_string(num_records), " records the manifest lists for it (cut short, "
            "or a corrupted GZIP stream or record; an error TensorFlow raised reading it is in "
            "its log, as a warning). Restore or rewrite this file."])
        with tf.control_dependencies([tf.debugging.Assert(False, [message])]):
            return tf.identity(path)

    damaged = tf.data.Dataset.from_tensors(shard).map(fail)
    return records.ignore_errors(log_warning=True).concatenate(damaged).take(num_records)


