"""A stored image's bytes as the non-TensorFlow readers give it: a writable uint8 array or a PIL image.

``data_source`` and the WebDataset recipe decode here, with Pillow, as the writer
encoded: one decode for every reader without TensorFlow, so the pixels are the
writer's own in each.
"""
from __future__ import annotations

import io
from typing import Any

import numpy as np

__all__ = ["stored_image"]


def stored_image(encoded: bytes, image_format: str, height: int, width: int, channels: int,
                 pil: bool = False) -> Any:
    """The image: uint8 height x width x channels (writable), or a PIL image (RGB, or L) with ``pil``.

    Writable, as PyTorch and in-place augmentation expect: the decoded pixels are
    this call's own, so the copy costs a memcpy of the image, not a decode.
    """
    from PIL import Image

    from beam_prep.pixel_limit import our_limit_only

    mode = "L" if channels == 1 else "RGB"
    if image_format == "raw":
        pixels = np.frombuffer(encoded, dtype=np.uint8).reshape(height, width, channels)
        return Image.fromarray(pixels[..., 0] if channels == 1 else pixels, mode) if pil else pixels.copy()
    # A record's image passed the run's --max_pixels: Pillow's own limit must not refuse it here.
    with our_limit_only():
        img = Image.open(io.BytesIO(encoded))
        img = img.convert(mode) if img.mode != mode else img
        if pil:
            img.load()
            return img
        with img:
            return np.array(img).reshape(height, width, channels)
