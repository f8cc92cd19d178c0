"""How many shards a split gets: about --target_shard_mb each, and work for every local worker."""
from __future__ import annotations

import math

from beam_prep.model.features import BYTES_PER_SAMPLE
from beam_prep.write.imaging import ORIGINAL, ImageSpec

__all__ = ["choose_num_shards", "estimated_record_bytes"]


def estimated_record_bytes(spec: ImageSpec, mean_input_bytes: float) -> float:
    """A record's expected size, from the output spec (or the inputs' mean size when not resized)."""
    if spec.height is None:
        return mean_input_bytes  # resize_mode none: about the size of the input.
    width = spec.width * 4 / 3 if spec.resize_mode == "shorter_side" else spec.width
    made = spec.height * width * spec.channels * BYTES_PER_SAMPLE[spec.stored_format]
    # Originals keep their sources' bytes where they can: never larger than those on the whole.
    return min(made, mean_input_bytes) if spec.image_format == ORIGINAL else made


def choose_num_shards(num_examples: int, record_bytes: float, target_mb: int, multiple_of: int) -> int:
    """Shards near ``target_mb`` each, rounded up to a multiple of the local worker count,
    and never more than the examples (at least one).

    The local sink writes a shard per worker at a time, so fewer shards than
    workers would leave cores idle; but a shard with no record helps nobody.
    """
    by_size = math.ceil(num_examples * record_bytes / (target_mb * 1e6))
    count = max(1, by_size, multiple_of)
    return max(1, min(math.ceil(count / multiple_of) * multiple_of, num_examples))
