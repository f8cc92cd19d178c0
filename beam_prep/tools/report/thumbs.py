"""Small pictures for the report, as the bytes of a PNG or JPEG to embed: a decoded record's pixels, or
a source file's (read only where it is the run's file), within a byte budget the whole report shares.

A thumbnail is the image shrunk to fit a ``cell`` x ``cell`` box (Lanczos, keeping its aspect ratio),
never enlarged: an image that fits is stored pixel for pixel as PNG, lossless; a shrunk one as JPEG
(quality ``JPEG_QUALITY``), a tenth of a PNG's bytes for a photograph.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import io
import os
import stat
from typing import TYPE_CHECKING

from PIL import Image

from beam_prep.io.storage import is_local, open_to_read
from beam_prep.tools.contact_sheet import _fit, _to_pil

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = ["Budget", "Thumbnail", "from_pixels", "from_source"]

JPEG_QUALITY = 85
MAX_SOURCE_BYTES = 64 << 20  # a source file larger than this is not read for a thumbnail


@dataclasses.dataclass(frozen=True)
class Thumbnail:
    """An encoded picture: ``mime`` (image/png or image/jpeg), its bytes and its size in pixels."""

    mime: str
    data: bytes
    width: int
    height: int

    def data_uri(self) -> str:
        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"

    @property
    def embedded_size(self) -> int:
        """Bytes it takes in the page, as base64."""
        return 4 * ((len(self.data) + 2) // 3)


class Budget:
    """The bytes of pictures the report may still embed; ``take`` answers whether one more fits."""

    def __init__(self, max_bytes: int) -> None:
        self.left = max_bytes
        self.refused = 0

    def take(self, thumb: Thumbnail) -> bool:
        if thumb.embedded_size > self.left:
            self.refused += 1
            return False
        self.left -= thumb.embedded_size
        return True


def from_pixels(pixels: np.ndarray, cell: int) -> Thumbnail:
    """A decoded image (uint8, height x width x 1 or 3) as a thumbnail (the module's rule)."""
    return _encode(_to_pil(pixels), cell)


def from_source(path: str, sha256: str, cell: int) -> Thumbnail | str:
    """A source file's thumbnail, or why there is none (a few words).

    ``path`` must already be checked to lie under the run's input. A local file is read only if it
    is a regular file (a pipe or a device could block), and shown only if its bytes still have
    ``sha256`` (the run's hash of them).
    """
    try:
        if is_local(path):
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode):
                return "not a regular file"
            if st.st_size > MAX_SOURCE_BYTES:
                return "too large to show"
            with open(path, "rb") as f:
                data = f.read(MAX_SOURCE_BYTES + 1)
        else:  # its size first: a failure at stage too_large is often of a huge file
            from apache_beam.io.filesystems import FileSystems

            found = FileSystems.match([path])[0].metadata_list
            if not found:
                return "cannot read"
            if found[0].size_in_bytes > MAX_SOURCE_BYTES:
                return "too large to show"
            with open_to_read(path) as f:
                data = f.read(MAX_SOURCE_BYTES + 1)
    except Exception:  # noqa: BLE001 - each filesystem raises its own types: the file cannot be read
        return "cannot read"
    if len(data) > MAX_SOURCE_BYTES:
        return "too large to show"
    if hashlib.sha256(data).hexdigest() != sha256:
        return "not the run's file (changed since)"
    try:
        with Image.open(io.BytesIO(data)) as source:
            source.draft("RGB", (cell, cell))  # a JPEG decoded at a fraction of its size
            return _encode(source.convert("RGB"), cell)
    except (OSError, ValueError, Image.DecompressionBombError, SyntaxError):
        return "Pillow cannot show it"


def _encode(picture: Image.Image, cell: int) -> Thumbnail:
    fitted = _fit(picture, cell)
    buffer = io.BytesIO()
    if fitted is picture:
        fitted.save(buffer, "PNG", optimize=False)
        mime = "image/png"
    else:
        fitted.save(buffer, "JPEG", quality=JPEG_QUALITY)
        mime = "image/jpeg"
    return Thumbnail(mime, buffer.getvalue(), fitted.width, fitted.height)
