"""``ReaderConfig``: the reader's rarely changed knobs, in one frozen object (as ``tfds.ReadConfig``).

``make_dataset`` keeps as arguments what a training script sets for itself; these
knobs suit nearly every run as they are, and their either/or pairs are checked
once, when the object is made. See docs/design/reader.md.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from beam_prep.errors import OptionsError

if TYPE_CHECKING:  # pragma: no cover
    import tensorflow as tf

__all__ = ["DCT_METHODS", "DEFAULT_DCT_METHOD", "ReaderConfig"]

# libjpeg's accurate integer IDCT: the very pixels Pillow (and so the writer, and
# most serving code) decodes, where TensorFlow's default (INTEGER_FAST) is off by a
# few levels; its cost is in docs/performance/reader.md.
DEFAULT_DCT_METHOD = "INTEGER_ACCURATE"
DCT_METHODS = ("INTEGER_ACCURATE", "INTEGER_FAST")


@dataclasses.dataclass(frozen=True)
class ReaderConfig:
    """How to read, beyond what :func:`~beam_prep.reader.make_dataset` takes itself.

    Not :class:`beam_prep.write.images.readahead.ReadAheadConfig`, the writer's read-ahead.

    Args:
      shuffle_buffer: serialized records shuffled (files too); 0 turns it off.
        None: :func:`~beam_prep.reader.pipeline.default_shuffle_buffer` when training
        (about a fixed number of bytes of records), else 0.
      seed: seeds the file and record shuffles (each epoch still gets a new order);
        None: a new order every run.
      deterministic: keep a fixed order (slower where files are read in parallel);
        None: not ``training``.
      input_context: from ``strategy.distribute_datasets_from_function``: each input
        pipeline reads its own share of the files.
      num_input_pipelines: the number of input pipelines, without an InputContext
        (e.g. one per host); given with ``input_pipeline_id`` or not at all.
      input_pipeline_id: this pipeline's index in ``[0, num_input_pipelines)``.
      global_batch_size: with ``input_context``, the global batch, in place of
        ``make_dataset``'s ``batch_size``: each replica gets its share.
      dct_method: JPEG decoding: ``INTEGER_ACCURATE`` (Pillow's pixels, what the
        writer and most serving code decode) or ``INTEGER_FAST`` (TensorFlow's default, faster).
      options: ``tf.data.Options`` merged over the reader's own.

    Raises:
      OptionsError: when made, for values that do not fit together.
    """

    shuffle_buffer: int | None = None
    seed: int | None = None
    deterministic: bool | None = None
    input_context: tf.distribute.InputContext | None = None
    num_input_pipelines: int | None = None
    input_pipeline_id: int | None = None
    global_batch_size: int | None = None
    dct_method: str = DEFAULT_DCT_METHOD
    options: tf.data.Options | None = None

    def __post_init__(self) -> None:
        if self.shuffle_buffer is not None and self.shuffle_buffer < 0:
            raise OptionsError(f"shuffle_buffer must be 0 (off) or more, not {self.shuffle_buffer}")
        if self.dct_method not in DCT_METHODS:
            raise OptionsError(f"dct_method must be one of {DCT_METHODS}, not {self.dct_method!r}")
        if self.global_batch_size is not None and self.input_context is None:
            raise OptionsError("global_batch_size= goes with input_context=; otherwise use batch_size=")
        self.pipelines()  # checks the distribution arguments

    def pipelines(self) -> tuple[int, int]:
        """(number of input pipelines, this one's id)."""
        n, i = self.num_input_pipelines, self.input_pipeline_id
        if self.input_context is not None:
            if n is not None or i is not None:
                raise OptionsError("give input_context= or num_input_pipelines=/input_pipeline_id=, not both")
            return self.input_context.num_input_pipelines, self.input_context.input_pipeline_id
        if (n is None) != (i is None):
            raise OptionsError("num_input_pipelines= and input_pipeline_id= go together")
        if n is None:
            return 1, 0
        if n < 1 or not 0 <= i < n:
            raise OptionsError(f"input_pipeline_id must be in [0, {n}), not {i}")
        return n, i

    def batch_size(self, batch_size: int | None) -> int | None:
        """This pipeline's batch: ``make_dataset``'s, or this replica's share of ``global_batch_size``."""
        if self.global_batch_size is not None:
            batch_size = self.input_context.get_per_replica_batch_size(self.global_batch_size)
        if batch_size is not None and batch_size < 1:
            raise OptionsError(f"batch_size must be positive (or None for single images), not {batch_size}")
        return batch_size
