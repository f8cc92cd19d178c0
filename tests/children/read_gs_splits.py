"""What training code does: ``make_dataset`` on a gs:// dataset, through TensorFlow's GCS filesystem.

    python -m tests.children.read_gs_splits OUT.json DATASET

Writes, per split, the labels read, the image shapes and the cardinality.
"""
import json
import sys

from beam_prep.reader import make_dataset

if __name__ == "__main__":
    out, path = sys.argv[1:3]
    seen = {}
    for split in ("train", "validation"):
        ds = make_dataset(path, split=split, batch_size=4, training=False)
        labels = [int(label) for _, batch in ds for label in batch.numpy()]
        shapes = {tuple(images.shape[1:]) for images, _ in ds}
        seen[split] = {"labels": labels, "shapes": [list(s) for s in shapes],
                       "cardinality": int(ds.cardinality())}
    with open(out, "w") as f:
        json.dump(seen, f)
