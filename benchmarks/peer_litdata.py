"""LitData's ``optimize``, as its docs show it for an image folder: a peer for ``bench_writer``, row (k).

``litdata.optimize(fn=..., inputs=[...], output_dir=..., num_workers=os.cpu_count(),
chunk_bytes="64MB")``, the function returning one sample a dict: the centre crop
encoded here at JPEG q90 as ``bytes`` (a PIL image would be stored as raw pixels,
or as the source file when it is a JPEG file, neither of them our records), the
label and the file name. ``compression="zstd"``: LitData's only compression
(level 4 by default), the nearest it has to our GZIP; LitData 0.2.76 then
leaves rows of already-compressed bytes such as JPEG uncompressed, and the
index it writes says so (``compression_applied`` in the JSON line). ``optimize`` starts its
workers with ``spawn``, its default outside an interactive shell. Runs in the peers' virtualenv
(``benchmarks/peers-requirements.txt``).

    python -m benchmarks.peer_litdata write --input ROOT --output OUT [--image_size 224] [--jpeg_quality 90]
    python -m benchmarks.peer_litdata read --output OUT --dump DIR [--samples 200]

``write`` prints one JSON line: samples written, seconds in the recipe, the compression.
``read`` writes the first samples' image bytes to ``DIR/<file name>`` with
``litdata.StreamingDataset``, for the benchmark's PSNR.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import time

from benchmarks.peer_image import centre_crop_jpeg, command_line, dump, labelled_files

COMPRESSION = "zstd"
CHUNK_BYTES = "64MB"


def convert(item: tuple[str, int], size: int, quality: int) -> dict[str, object]:
    """One input (a path and its label) to one sample."""
    path, label = item
    with open(path, "rb") as f:
        image = centre_crop_jpeg(f.read(), size, quality)
    return {"image": image, "label": label, "filename": os.path.basename(path)}


def write(args: argparse.Namespace) -> None:
    import litdata

    start = time.perf_counter()
    inputs = labelled_files(args.input)
    litdata.optimize(fn=functools.partial(convert, size=args.image_size, quality=args.jpeg_quality),
                     inputs=inputs, output_dir=args.output, num_workers=os.cpu_count(),
                     chunk_bytes=CHUNK_BYTES, compression=COMPRESSION, verbose=False)
    seconds = time.perf_counter() - start
    # What was written, as its index says (litdata.optimize returns nothing), and the compression it
    # applied: LitData skips zstd on rows of already-compressed bytes such as JPEG.
    with open(os.path.join(args.output, "index.json")) as f:
        index = json.load(f)
    written = sum(chunk["chunk_size"] for chunk in index["chunks"])
    applied = index["config"].get("compression") or index["config"].get("ipc_compression")
    print(json.dumps({"written": written, "write_seconds": seconds, "compression": COMPRESSION,
                      "compression_applied": applied}))


def read(args: argparse.Namespace) -> None:
    import litdata

    dataset = litdata.StreamingDataset(input_dir=args.output)
    samples = [dataset[i] for i in range(min(args.samples, len(dataset)))]
    dump([(sample["image"], sample["filename"]) for sample in samples], args.dump)
    print(json.dumps({"samples": len(samples), "dataset_samples": len(dataset)}))


if __name__ == "__main__":
    command_line(__doc__, write, read)
