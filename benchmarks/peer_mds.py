"""MosaicML Streaming's MDS writer, parallel the way its docs show: a peer for ``bench_writer``, row (j).

The docs' *Parallel dataset conversion* recipe (option 2): the inputs split into
groups, a ``multiprocessing.Pool`` of one process per core, each worker an
``MDSWriter`` over its own subfolder, then ``streaming.base.util.merge_index`` to
make one dataset of the subfolders. Each sample: the centre crop encoded here at
JPEG q90 as a ``bytes`` column (MDS's own ``jpeg`` encoding saves at Pillow's
default quality, 75, with no way to ask for another), the label as ``int``, the
file name as ``str``.

Compression ``zstd``, as the docs' examples write: cheap on JPEG payloads, which
no compressor shrinks by much (beam-prep's GZIP shards store them; a zlib
level would charge this row for bytes nobody saves). Runs in the peers' virtualenv
(``benchmarks/peers-requirements.txt``).

    python -m benchmarks.peer_mds write --input ROOT --output OUT [--image_size 224] [--jpeg_quality 90]
    python -m benchmarks.peer_mds read --output OUT --dump DIR [--samples 200]

``write`` prints one JSON line: samples written, seconds in the recipe, the compression.
``read`` writes the first samples' image bytes to ``DIR/<file name>`` with
``StreamingDataset``, for the benchmark's PSNR.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from multiprocessing import Pool

from benchmarks.peer_image import centre_crop_jpeg, command_line, dump, labelled_files

COLUMNS = {"image": "bytes", "label": "int", "filename": "str"}
COMPRESSION = "zstd"


def convert_to_mds(args: tuple[str, list[tuple[str, int]], int, int]) -> int:
    """One group of inputs into one MDS subfolder."""
    from streaming import MDSWriter

    sub_out_root, tasks, size, quality = args
    with MDSWriter(out=sub_out_root, columns=COLUMNS, compression=COMPRESSION) as out:
        for path, label in tasks:
            with open(path, "rb") as f:
                image = centre_crop_jpeg(f.read(), size, quality)
            out.write({"image": image, "label": label, "filename": os.path.basename(path)})
    return len(tasks)


def write(args: argparse.Namespace) -> None:
    from streaming.base.util import merge_index

    start = time.perf_counter()
    tasks = labelled_files(args.input)
    num_process = os.cpu_count() or 1
    # One contiguous group a process, each written to its own subfolder, as in the docs.
    groups = [tasks[g * len(tasks) // num_process:(g + 1) * len(tasks) // num_process] for g in range(num_process)]
    arg_tuples = [(os.path.join(args.output, str(g)), group, args.image_size, args.jpeg_quality)
                  for g, group in enumerate(groups)]
    with Pool(processes=num_process) as pool:
        written = sum(pool.imap(convert_to_mds, arg_tuples))
    merge_index(args.output, keep_local=True)
    print(json.dumps({"written": written, "write_seconds": time.perf_counter() - start,
                      "compression": COMPRESSION}))


def read(args: argparse.Namespace) -> None:
    from streaming import StreamingDataset

    dataset = StreamingDataset(local=args.output, shuffle=False, batch_size=1)
    samples = [dataset[i] for i in range(min(args.samples, len(dataset)))]
    dump([(sample["image"], sample["filename"]) for sample in samples], args.dump)
    print(json.dumps({"samples": len(samples), "dataset_samples": len(dataset)}))


if __name__ == "__main__":
    command_line(__doc__, write, read)
