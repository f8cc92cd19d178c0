"""Reads an array_record dataset's train split through Grain with worker processes, as a JAX training run does.

    python -m tests.children.grain_workers DATASET

``data_source`` goes to two worker processes (pickled: the spawn start method
runs this module again in each, hence a child) behind a global shuffle, a map
and a batch; halfway, the iterator's state is saved, and a second iterator set
to it must yield the same rest. Prints one JSON line: every record's file name
and label in the order read, and the rest as read again.
"""
import json
import sys

import grain
import jax  # noqa: F401  imported as a JAX training script does: it changes Grain's start-up (below)
import numpy as np
from absl import flags

import beam_prep

# Grain 0.2.18 reads its absl flag --grain_enable_multiprocess_worker_profiling when mp_prefetch
# starts, and once jax is imported (Grain then loads its JAX profiler) that read raises
# UnparsedFlagAccessError unless the flags were parsed, as only absl.app.run does. Fixed in
# Grain after 0.2.18; until then, mark them parsed: every flag keeps its default.
if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def keep(record: dict) -> dict:
    return {"filename": np.asarray(record["filename"]), "label": np.int32(record["label"]),
            "pixels": np.int64(record["image"].sum())}


if __name__ == "__main__":
    source = beam_prep.data_source(sys.argv[1], "train")
    dataset = grain.MapDataset.source(source).seed(7).shuffle().map(keep).batch(3)
    batches = dataset.to_iter_dataset(grain.ReadOptions(num_threads=4, prefetch_buffer_size=8)).mp_prefetch(
        grain.MultiprocessingOptions(num_workers=2))
    read, again = [], []
    iterator = iter(batches)
    state = None
    for i, batch in enumerate(iterator):
        read += [[str(n), int(label), int(p)] for n, label, p in
                 zip(batch["filename"], batch["label"], batch["pixels"])]
        if i == 1:
            state = iterator.get_state()
    iterator.close()
    resumed = iter(batches)
    resumed.set_state(state)
    for batch in resumed:
        again += [str(n) for n in batch["filename"]]
    resumed.close()
    print(json.dumps({"read": read, "again": again}))
