"""The filenames of one seeded, fixed-order training epoch, as a JSON list on stdout.

    python -m tests.children.seeded_order DATASET SEED

Another process than the test's, so that the test can tell a seeded order
that repeats across runs from one that only repeats within a process.
"""
import json
import sys

from beam_prep.model import features
from beam_prep.reader import ReaderConfig, make_dataset

if __name__ == "__main__":
    path, seed = sys.argv[1], int(sys.argv[2])
    ds = make_dataset(path, batch_size=3, training=True, extra_keys=(features.FILENAME,),
                      config=ReaderConfig(deterministic=True, seed=seed))
    names = [n.decode() for _, _, extra in ds for n in extra[features.FILENAME].numpy()]
    print(json.dumps(names))
