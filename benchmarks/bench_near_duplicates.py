"""Near-duplicate quality: how many copies the perceptual hash finds, and how many unrelated pairs it
takes for copies, at each Hamming distance threshold.

Every picture of ``near_corpus`` (real photographs, their 256x256 tiles, 200
faces) is copied five ways (``near_corpus.TRANSFORMS``), each version saved as a
lossless PNG and made a record as the default command makes one
(``process_image`` with the default ``ImageSpec``: 224x224, center crop), whose
perceptual hash is the one compared. For each threshold:
recall per transformation (a copy within the threshold of its source), and
false pairs per million: pairs of images of different sources (any version)
within the threshold. Not a timing: any machine gives the same figures.

    python -m benchmarks.bench_near_duplicates [--json docs/performance/results/near-duplicates.json]
"""
from __future__ import annotations

import argparse
import io
import logging
import pathlib
from collections.abc import Sequence

import numpy as np
from PIL import Image

from beam_prep.write.images.imaging import EncodedImage, ImageSpec, process_image
from benchmarks.report import tables
from benchmarks.results import Recording

log = logging.getLogger(__name__)
THRESHOLDS = list(range(17))
# What two different pictures are, from least to most alike: the false pairs of each kind apart.
PAIR_KINDS = ("pictures of different scenes", "a face and a picture", "tiles of one scene", "two faces")


def popcount(x: np.ndarray) -> np.ndarray:
    """Bits set in each uint64."""
    return np.unpackbits(x.view(np.uint8).reshape(*x.shape, 8), axis=-1).sum(axis=-1)


def _record(img: Image.Image) -> EncodedImage:
    """``img`` as the default command makes it a record (its ``phash``, ``flat``)."""
    buf = io.BytesIO()
    img.save(buf, "PNG", compress_level=1)
    return process_image(buf.getvalue(), ImageSpec())


def measure() -> dict[str, object]:
    from benchmarks.near_corpus import TRANSFORMS, photographs

    pictures = photographs()
    records = {name: [_record(img)] + [_record(transform(img)) for transform in TRANSFORMS.values()]
               for name, img in pictures.items()}
    # A picture of one flat colour (as the run tells them, ``flat``) is left out of the search, as the
    # run leaves it out: all dark frames look alike, and the run already names them.
    flat_pictures = sorted(n for n, versions in records.items() if versions[0].flat)
    names = sorted(set(pictures) - set(flat_pictures))
    hashes = np.array([[version.phash for version in records[name]] for name in names], dtype=np.uint64)
    copies = {t: popcount(hashes[:, j] ^ hashes[:, 0]) for j, t in enumerate(TRANSFORMS, 1)}
    faces = np.array(["lfw_subset" in n for n in names])
    scenes = np.array([n.split("#")[0] for n in names])  # a photograph and its tiles: one scene
    # Every pair of images of different sources, all versions: its distance, counted by value and
    # by what the two pictures are (PAIR_KINDS).
    flat, source = hashes.ravel(), np.repeat(np.arange(len(names)), hashes.shape[1])
    histogram = np.zeros((len(PAIR_KINDS), 65), dtype=np.int64)
    for a in range(len(flat)):
        other = source[a + 1:] != source[a]
        mine, theirs = source[a], source[a + 1:][other]
        kind = np.where(faces[mine] & faces[theirs], 3, np.where(faces[mine] | faces[theirs], 1,
                                                                 np.where(scenes[theirs] == scenes[mine], 2, 0)))
        np.add.at(histogram, (kind, popcount(flat[a + 1:][other] ^ flat[a])), 1)
    cumulative = np.cumsum(histogram, axis=1)
    return {
        "pictures": len(names),
        "flat_left_out": len(flat_pictures),
        "sources": {kind: sum(1 for n in names if n.split("#")[0].split("/")[0] == kind and
                              ("#" in n) == tiled)
                    for kind, tiled in (("pillow", False), ("skimage", False))} | {
                        "tiles": sum("#tile" in n for n in names),
                        "faces": sum("lfw_subset" in n for n in names)},
        "transforms": list(TRANSFORMS),
        "thresholds": THRESHOLDS,
        "recall": {t: [float((d <= k).mean()) for k in THRESHOLDS] for t, d in copies.items()},
        "recall_photographs": {t: [float((d[~faces] <= k).mean()) for k in THRESHOLDS] for t, d in copies.items()},
        "recall_faces": {t: [float((d[faces] <= k).mean()) for k in THRESHOLDS] for t, d in copies.items()},
        "copy_distances": {t: np.bincount(d, minlength=65).tolist() for t, d in copies.items()},
        "unrelated_pairs": int(histogram.sum()),
        "false_pairs": [int(cumulative[:, k].sum()) for k in THRESHOLDS],
        "pair_kinds": list(PAIR_KINDS),
        "pairs_by_kind": [int(n) for n in histogram.sum(axis=1)],
        "false_pairs_by_kind": [[int(cumulative[i, k]) for k in THRESHOLDS] for i in range(len(PAIR_KINDS))],
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    recording = Recording("near-duplicates", argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    results = measure()
    print(tables.near_duplicates(results))
    recording.write(args.json, results)


if __name__ == "__main__":
    main()
