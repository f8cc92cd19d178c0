"""A small labelled image tree for trying beam-prep out, made on the spot (no download).

It holds the cases a real tree has: several formats and modes, EXIF rotation,
transparency, a non-image file (skipped) and a broken image (reported).
"""
from __future__ import annotations

import io
import logging
import pathlib

import numpy as np
from PIL import Image, ImageDraw

_LOG = logging.getLogger(__name__)
LABELS = ("circles", "squares", "stripes")


def picture(seed: int, width: int = 96, height: int = 64) -> Image.Image:
    """A deterministic RGB picture with smooth structure (not flat, not noise)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = []
    for _ in range(3):
        fx, fy = rng.uniform(0.02, 0.15, 2)
        phase = rng.uniform(0, 6.28)
        channels.append(127.5 + 127.5 * np.sin(fx * x + fy * y + phase))
    return Image.fromarray(np.stack(channels, -1).astype(np.uint8), "RGB")


def _labelled_picture(label: str, seed: int, width: int, height: int) -> Image.Image:
    img = picture(seed, width, height)
    draw = ImageDraw.Draw(img)
    rng = np.random.default_rng(seed + 10_000)
    for _ in range(6):
        x0, y0 = int(rng.integers(0, width - 8)), int(rng.integers(0, height - 8))
        r = int(rng.integers(6, max(7, min(width, height) // 4)))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        if label == "circles":
            draw.ellipse([x0, y0, x0 + r, y0 + r], fill=colour)
        elif label == "squares":
            draw.rectangle([x0, y0, x0 + r, y0 + r], fill=colour)
        else:
            draw.line([0, y0, width, y0 + r], fill=colour, width=max(2, r // 4))
    return img


def _save(img: Image.Image, path: pathlib.Path, **params) -> None:
    buf = io.BytesIO()
    img.save(buf, Image.registered_extensions()[path.suffix.lower()], **params)
    path.write_bytes(buf.getvalue())


def make_sample_tree(root: pathlib.Path, per_label: int = 40) -> int:
    """Writes ``root/<label>/<image>`` and returns how many image files it wrote."""
    count = 0
    for li, label in enumerate(LABELS):
        folder = root / label
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_label):
            seed = li * 1000 + i
            width, height = (320 + 17 * (i % 9), 240 + 13 * (i % 7))
            img = _labelled_picture(label, seed, width, height)
            kind = i % 8
            if kind == 5:
                _save(img.convert("RGBA"), folder / f"{label}_{i:03d}.png")
            elif kind == 6:
                _save(img.convert("L"), folder / f"{label}_{i:03d}.webp")
            elif kind == 7:
                exif = Image.Exif()
                exif[0x0112] = 6  # stored rotated; viewers turn it upright
                _save(img.transpose(Image.Transpose.ROTATE_90), folder / f"{label}_{i:03d}.jpg",
                      exif=exif.tobytes(), quality=92)
            else:
                _save(img, folder / f"{label}_{i:03d}.jpg", quality=85 + i % 10)
            count += 1
    (root / LABELS[0] / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated, not an image")
    (root / LABELS[0] / "notes.txt").write_text("not an image: skipped and counted\n")
    _LOG.info("wrote %d images (one of them broken) under %s", count + 1, root)
    return count + 1
