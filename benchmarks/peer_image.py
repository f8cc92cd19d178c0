"""What every peer writer does to one image, as a user would write it in the tool's per-sample function.

The hand-written writer's work (``handwritten_writer.convert`` calls it): Pillow's DCT-scaled draft, a centre
crop resized with the bicubic box resize, JPEG encoding; and the same listing (labels
from the sorted folder names). Kept in one place so that the peers differ only in how
they spread the work over the cores, frame the records and compress them. Imports
only Pillow: it runs in the peers' virtualenv and in Ray's workers.
"""
from __future__ import annotations

import argparse
import io
import os
from collections.abc import Callable


def labelled_files(root: str) -> list[tuple[str, int]]:
    """Every image under ``root/<label>/``, sorted, with its label's index among the sorted folders."""
    labels = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    return [(os.path.join(root, label, name), i)
            for i, label in enumerate(labels) for name in sorted(os.listdir(os.path.join(root, label)))]


def centre_crop_jpeg(data: bytes, size: int, quality: int) -> bytes:
    """The largest centred square of the JPEG ``data``, resized to ``size``², as JPEG at ``quality``."""
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    img.draft("RGB", (size, size))
    img = img.convert("RGB")
    crop = min(img.size)
    left, top = (img.width - crop) / 2, (img.height - crop) / 2
    img = img.resize((size, size), Image.Resampling.BICUBIC, box=(left, top, left + crop, top + crop))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def dump(samples: list[tuple[bytes, str]], folder: str) -> None:
    """Writes each record's image bytes to ``folder/<source file name>``: what ``peers`` scores for PSNR."""
    os.makedirs(folder, exist_ok=True)
    for data, name in samples:
        with open(os.path.join(folder, os.path.basename(name)), "wb") as f:
            f.write(data)


def command_line(doc: str, write: Callable[[argparse.Namespace], None],
                 read: Callable[[argparse.Namespace], None]) -> None:
    """A recipe module's ``write`` and ``read`` subcommands, as its docstring (``doc``) shows them."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    writer = commands.add_parser("write")
    writer.add_argument("--input", required=True)
    writer.add_argument("--output", required=True)
    writer.add_argument("--image_size", type=int, default=224)
    writer.add_argument("--jpeg_quality", type=int, default=90)
    reader = commands.add_parser("read")
    reader.add_argument("--output", required=True)
    reader.add_argument("--dump", required=True)
    reader.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    (write if args.command == "write" else read)(args)
