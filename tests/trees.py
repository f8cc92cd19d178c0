"""Small labelled image trees that the tests make for themselves."""
from __future__ import annotations

import io
import pathlib
from typing import Iterable, Mapping

from PIL import Image

from beam_prep.sample import picture


def encode(img: Image.Image, fmt: str = "JPEG", **params) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **params)
    return buf.getvalue()


def make_tree(
    root: pathlib.Path,
    counts: Mapping[str, int],
    *,
    splits: Iterable[str] | None = None,
    size: tuple[int, int] = (96, 64),
    fmt: str = "JPEG",
    ext: str = ".jpg",
) -> list[pathlib.Path]:
    """Writes ``root/[split/]label/img_NNN.ext`` and returns the files written.

    Every image differs (the seed is its position), so tests can tell records apart.
    """
    written = []
    seed = 0
    for split in (list(splits) if splits else [None]):
        for label, n in counts.items():
            folder = root / split / label if split else root / label
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                path = folder / f"img_{i:03d}{ext}"
                path.write_bytes(encode(picture(seed, *size), fmt))
                written.append(path)
                seed += 1
    return written
