"""``--max_pixels`` as the one limit on an image's size: Pillow's own is off while we decode.

Pillow refuses images over ``Image.MAX_IMAGE_PIXELS`` (about 179 MP, twice that for its
error) with a warning or an error of its own, before our check can say ``--max_pixels``:
a genuine panorama could never be prepared, and the message named a limit nobody set.
Around each of our decodes Pillow's limit is off (``None``); ``imaging`` checks each
image's size against ``--max_pixels`` as soon as its header is read, which covers what
Pillow would check. The caller's value is back once no decode of ours is running in the
process: a count under a lock, so threads decoding at once each keep it off until the
last is done, and a library caller finds ``Image.MAX_IMAGE_PIXELS`` as it left it.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from PIL import Image

__all__ = ["our_limit_only"]

_LOCK = threading.Lock()
_running = 0
_callers: int | None = None  # Image.MAX_IMAGE_PIXELS as it was when the first running decode began


@contextlib.contextmanager
def our_limit_only() -> Iterator[None]:
    """For the ``with`` block: Pillow's decompression-bomb limit off in this process (no
    ``DecompressionBombWarning`` or ``DecompressionBombError``); the caller's restored after
    the last such block running in any thread ends. The block checks ``--max_pixels`` itself."""
    global _running, _callers
    with _LOCK:
        if _running == 0:
            _callers = Image.MAX_IMAGE_PIXELS
            Image.MAX_IMAGE_PIXELS = None
        _running += 1
    try:
        yield
    finally:
        with _LOCK:
            _running -= 1
            if _running == 0:
                Image.MAX_IMAGE_PIXELS = _callers
