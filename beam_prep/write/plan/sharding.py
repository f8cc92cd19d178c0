"""How many shards a split gets: about --target_shard_mb each, work for every local worker,
and, where a run can be resumed, shards small enough that a stop loses little."""
from __future__ import annotations

import math

from beam_prep.model.features import BYTES_PER_SAMPLE
from beam_prep.write.images.imaging import ORIGINAL, ImageSpec

__all__ = ["MIN_RESUMABLE_SHARD_IMAGES", "SHARDS_PER_WORKER", "choose_num_shards", "estimated_record_bytes",
           "max_shard_images"]

# A resumable run keeps only whole shards, and each local worker writes one shard at a
# time: with this many shards a worker, what a stop loses (the shards in flight) is at
# most about 1/SHARDS_PER_WORKER of the run, wherever it stops and whichever shards the
# workers took first.
SHARDS_PER_WORKER = 16
# ...but no shard is made smaller than this for that alone: a run so small is written
# again in seconds, and shards of a few images only add files.
MIN_RESUMABLE_SHARD_IMAGES = 32


def estimated_record_bytes(spec: ImageSpec, mean_input_bytes: float) -> float:
    """A record's expected size, from the output spec (or the inputs' mean size when not resized)."""
    if spec.height is None:
        return mean_input_bytes  # resize_mode none: about the size of the input.
    width = spec.width * 4 / 3 if spec.resize_mode == "shorter_side" else spec.width
    made = spec.height * width * spec.channels * BYTES_PER_SAMPLE[spec.stored_format]
    # Originals keep their sources' bytes where they can: never larger than those on the whole.
    return min(made, mean_input_bytes) if spec.image_format == ORIGINAL else made


def max_shard_images(run_images: int, workers: int) -> int:
    """The most images a shard of a resumable run holds: a ``SHARDS_PER_WORKER``-th of a
    worker's share of the whole run (every split), or ``MIN_RESUMABLE_SHARD_IMAGES``.

    Taken over the run rather than each split, so that a small split (validation) gets
    shards of the same size as the others rather than as many.
    """
    return max(MIN_RESUMABLE_SHARD_IMAGES, math.ceil(run_images / (SHARDS_PER_WORKER * max(1, workers))))


def choose_num_shards(num_examples: int, record_bytes: float, target_mb: int, multiple_of: int,
                      max_images: int | None = None) -> int:
    """Shards near ``target_mb`` each, or more where a shard would hold over ``max_images``,
    rounded up to a multiple of the local worker count, and never more than the examples
    (at least one).

    The local sink writes a shard per worker at a time, so fewer shards than
    workers would leave cores idle; but a shard with no record helps nobody.
    ``max_images`` (``max_shard_images``) is for resumable runs only: elsewhere
    nothing is kept of a stopped run, and shards near the target suit readers best.
    """
    by_size = math.ceil(num_examples * record_bytes / (target_mb * 1e6))
    by_images = math.ceil(num_examples / max_images) if max_images else 1
    count = max(1, by_size, by_images, multiple_of)
    return max(1, min(math.ceil(count / multiple_of) * multiple_of, num_examples))
