"""JPEG data that decodes, but that libjpeg calls corrupt: found once, when a source would be kept.

A kept original (``--image_format original``) is read by TensorFlow's or DALI's
libjpeg on every epoch, which prints "Corrupt JPEG data: N extraneous bytes before
marker 0xd9" each time, naming no file. Pillow's decoder silences libjpeg's
warnings and exposes none, so the damage is found here without them:

- bytes between marker segments where a marker belongs (libjpeg skips them,
  warning "extraneous bytes before marker"), and a stream without its end
  marker ("Premature end of JPEG file"): read from the markers alone, as
  libjpeg's ``next_marker`` reads them;
- padding at the end of the last scan, before the end marker (the commonest:
  one byte value repeated), from the 8 bytes that libjpeg always warns of
  (``UNUSED_TAIL``): where the last 8 bytes repeat one value, the image is
  decoded at full size (and whole MCUs: blocks beyond its edges too) with the
  first of them set to different values; where the pixels do not change, the
  bytes are not data. Two full decodes, so only for a tail that looks like
  padding: the check costs nothing on other files.

An image found so is re-encoded rather than kept (``imaging``). Unused bytes
that are not one value repeated (the tail of an older file), fewer than 8, after
earlier scans of a progressive JPEG, or before a restart marker, are not looked
for.
"""
from __future__ import annotations

import io

from PIL import Image

__all__ = ["UNUSED_TAIL", "libjpeg_warning"]

_SOI, _EOI, _SOS = 0xD8, 0xD9, 0xDA
_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM and RSTn carry no length
_SEQUENTIAL = frozenset({0xC0, 0xC1})  # baseline and extended sequential frames
# Bytes unused at the end of the last scan from which libjpeg warns whatever it read ahead: it reads up to
# 7 bytes past the data it needs (checked with TensorFlow's decode_jpeg on baseline and progressive JPEGs
# with 1 to 13 zero or random bytes before the end marker: up to 7 pass in silence, 8 or more never).
UNUSED_TAIL = 8
# The values the witness byte is set to, in pairs: a byte the decode uses gives two images for a pair, but
# may give one by chance (a refinement bit whose step rounds away), hardly ever for both pairs.
_PAIRS = ((0x00, 0xFF), (0x55, 0xAA))


def libjpeg_warning(data: bytes) -> str | None:
    """What libjpeg would say of ``data`` as it decodes it, or None where it would say nothing.

    ``data`` must be a JPEG that Pillow decodes (checked before: a stream it cannot
    decode is a decode error, not a warning).
    """
    last_scan: tuple[int, int] | None = None  # the last scan's entropy-coded data: [start, end)
    frame: int | None = None  # where a sequential frame's header (SOF0, SOF1) starts: its length
    interleaved = False  # the last scan codes whole MCUs: several components, or the only one
    at = 2  # past SOI
    while True:
        found = _next_marker(data, at)
        if found is None:
            return "Premature end of JPEG file"
        marker, at, skipped = found
        if skipped:
            return f"Corrupt JPEG data: {skipped} extraneous bytes before marker 0x{marker:02x}"
        if marker == _EOI:
            break
        if marker in _STANDALONE or marker == _SOI:
            continue
        if at + 3 > len(data):
            return "Premature end of JPEG file"
        if marker in _SEQUENTIAL:
            frame = at
        if marker == _SOS:
            interleaved = frame is not None and (data[at + 2] > 1 or data[frame + 7] == 1)
        at += int.from_bytes(data[at:at + 2], "big")
        if marker == _SOS:
            start = at
            at = _scan_end(data, start)
            last_scan = (start, at)
    if last_scan is not None and _unused_tail(_whole_mcus(data, frame) if interleaved else data, *last_scan):
        return f"Corrupt JPEG data: extraneous bytes before marker 0x{_EOI:02x}"
    return None


def _next_marker(data: bytes, at: int) -> tuple[int, int, int] | None:
    """The next marker from ``at`` as libjpeg's ``next_marker`` finds it: (its code, the position
    after it, the bytes skipped before it: any but 0xFF fill, an 0xFF 0x00 pair counting two); None
    at the end of the data."""
    skipped = 0
    while True:
        ff = data.find(b"\xff", at)
        if ff < 0:
            return None
        skipped += ff - at
        at = ff
        while at < len(data) and data[at] == 0xFF:
            at += 1
        if at >= len(data):
            return None
        if data[at] != 0:
            return data[at], at + 1, skipped
        skipped += 2
        at += 1


def _scan_end(data: bytes, at: int) -> int:
    """Where a scan's entropy-coded data ends: the first 0xFF of the first marker other than a
    stuffed zero or a restart marker (0xFF fill before it included)."""
    while True:
        at = data.find(b"\xff", at)
        if at < 0:
            return len(data)
        code = at + 1
        while code < len(data) and data[code] == 0xFF:
            code += 1
        if code >= len(data):
            return len(data)
        if data[code] != 0 and not 0xD0 <= data[code] <= 0xD7:
            return at
        at = code + 1


def _whole_mcus(data: bytes, frame: int) -> bytes:
    """``data`` with its frame's height and width rounded up to whole MCUs, its data unchanged.

    An interleaved scan codes whole MCUs, and those at the right and bottom edges may
    hold blocks wholly outside the image, which a decode never shows: decoded at the
    rounded size, every block the scan codes is seen. (The header is the same length.)
    """
    height, width = int.from_bytes(data[frame + 3:frame + 5], "big"), int.from_bytes(data[frame + 5:frame + 7], "big")
    components = data[frame + 7]
    sampling = [data[frame + 9 + 3 * i] for i in range(components)]
    if components == 1:
        across = down = 8
    else:
        across, down = 8 * max(s >> 4 for s in sampling), 8 * max(s & 15 for s in sampling)
    height, width = -(-height // down) * down, -(-width // across) * across
    if height > 0xFFFF or width > 0xFFFF or height == 0:  # no room in the header, or a height given later (DNL)
        return data
    return data[:frame + 3] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[frame + 7:]


def _unused_tail(data: bytes, start: int, end: int) -> bool:
    """Whether the scan data ``[start, end)`` ends in ``UNUSED_TAIL`` bytes or more of padding (one value
    repeated) that its decode never uses.

    The image is decoded at full size (a scaled decode reads every byte but shows only
    some of the coefficients) with the byte that many before the end set to each value
    of ``_PAIRS``: a byte the decode uses gives two images for a pair; one it never
    reads, the same image each time. (The last few bytes of a scan are no good witness:
    libjpeg reads a few ahead, and a refinement scan's last bits may change nothing.)
    """
    last = end - 1
    while last > start and data[last] == 0xFF:  # fill before the marker
        last -= 1
    at = last - (UNUSED_TAIL - 1)
    if at <= start or len(set(data[at:last + 1])) != 1:  # only padding is looked for: one value repeated
        return False
    width = 1
    if data[at] == 0 and data[at - 1] == 0xFF:
        at -= 1  # a stuffed 0xFF: the pair is one byte of data
    if data[at] == 0xFF:
        width = 2
    try:
        return all(_pixels(_with(data, at, width, a)) == _pixels(_with(data, at, width, b)) for a, b in _PAIRS)
    except (OSError, ValueError, SyntaxError):  # a change broke the stream: the byte is data
        return False


def _with(data: bytes, at: int, width: int, value: int) -> bytes:
    """``data`` with the byte (or stuffed pair, ``width`` 2) at ``at`` set to ``value``, stuffed."""
    return data[:at] + (b"\xff\x00" if value == 0xFF else bytes([value])) + data[at + width:]


def _pixels(data: bytes) -> bytes:
    with Image.open(io.BytesIO(data)) as img:
        img.load()
        return img.tobytes()
