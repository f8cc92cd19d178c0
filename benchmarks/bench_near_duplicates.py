"""Near-duplicate quality: how many copies the perceptual hash finds, and how many unrelated pairs it
takes for copies, at each Hamming distance threshold.

Every picture of ``near_corpus`` (real photographs, their 256x256 tiles, 200
faces) is copied five ways (``near_corpus.TRANSFORMS``) and all are hashed with
``phash.phash``, as the workers hash each decoded image. For each threshold:
recall per transformation (a copy within the threshold of its source), and
false pairs per million: pairs of images of different sources (any version)
within the threshold. Not a timing: any machine gives the same figures.

    python -m benchmarks.bench_near_duplicates [--json docs/performance/results/near-duplicates.json]
"""
from __future__ import annotations

import argparse
import logging
import pathlib
from collections.abc import Sequence

import numpy as np

from benchmarks.report import tables
from benchmarks.results import Recording

log = logging.getLogger(__name__)
THRESHOLDS = list(range(17))


def popcount(x: np.ndarray) -> np.ndarray:
    """Bits set in each uint64."""
    return np.unpackbits(x.view(np.uint8).reshape(*x.shape, 8), axis=-1).sum(axis=-1)


def measure() -> dict[str, object]:
    from beam_prep.write.images.imaging import _is_flat
    from beam_prep.write.images.phash import phash
    from benchmarks.near_corpus import TRANSFORMS, photographs

    pictures = photographs()
    # A picture of one flat colour (as the run tells them, ``flat``) is left out of the search, as the
    # run leaves it out: all dark frames look alike, and the run already names them.
    flat_pictures = sorted(n for n, img in pictures.items() if _is_flat(img))
    names = sorted(set(pictures) - set(flat_pictures))
    hashes = np.empty((len(names), 1 + len(TRANSFORMS)), dtype=np.uint64)
    for i, name in enumerate(names):
        img = pictures[name]
        hashes[i, 0] = phash(img)
        for j, transform in enumerate(TRANSFORMS.values(), 1):
            hashes[i, j] = phash(transform(img))
    copies = {t: popcount(hashes[:, j] ^ hashes[:, 0]) for j, t in enumerate(TRANSFORMS, 1)}
    # Every pair of images of different sources, all versions: its distance, counted by value.
    flat, source = hashes.ravel(), np.repeat(np.arange(len(names)), hashes.shape[1])
    histogram = np.zeros(65, dtype=np.int64)
    pairs = 0
    for a in range(len(flat)):
        other = source[a + 1:] != source[a]
        histogram += np.bincount(popcount(flat[a + 1:][other] ^ flat[a]), minlength=65)
        pairs += int(other.sum())
    cumulative = np.cumsum(histogram)
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
        "copy_distances": {t: np.bincount(d, minlength=65).tolist() for t, d in copies.items()},
        "unrelated_pairs": pairs,
        "false_pairs": [int(cumulative[k]) for k in THRESHOLDS],
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
