"""Reads a gs:// dataset's train split with ``make_dataset``, and a path with no dataset.

    python -m tests.children.read_gs_train DATASET MISSING

Prints one JSON line: the filenames read (sorted), the dataset's cardinality,
and the error that ``make_dataset(MISSING)`` raised. A child, so that it reads
through the GCS server's environment.
"""
import json
import sys

from beam_prep.errors import DatasetError
from beam_prep.model import features
from beam_prep.reader import make_dataset

if __name__ == "__main__":
    root, missing = sys.argv[1:3]
    names = []
    ds = make_dataset(root, "train", batch_size=4, extra_keys=(features.FILENAME,))
    for _, _, extra in ds:
        names += [n.decode() for n in extra[features.FILENAME].numpy()]
    try:
        make_dataset(missing)
        error = None
    except DatasetError as e:
        error = str(e)
    print(json.dumps({"names": sorted(names), "cardinality": int(ds.cardinality()), "error": error}))
