"""The JPEG fast path against Pillow's path on damaged JPEGs, in a child under the sanitizers.

Run as ``python -m tests.children.jpeg_fuzz --extension FILE`` (the sanitizer build of
``tests/write/test_resample_sanitized.py``, under AddressSanitizer and UBSan): it loads the kernel
from that file, then makes a number of damaged JPEGs (cut short, bytes changed, segments grown or
shrunk, markers repeated) from a few clean ones of every kind, and gives each to
``imaging.process_image`` both ways: the outcome (the image, or the error's stage and message) must
be the same. It prints one summary line and exits 0, or raises at the first difference.
"""
from __future__ import annotations

import argparse
import collections
import io
import os
import random

import numpy as np
from PIL import Image

from tests.children.resample_fuzz import _load_extension


def _clean() -> list[bytes]:
    """Clean JPEGs of each kind the fast path takes: baseline, progressive, restart markers, 4:4:4,
    greyscale, EXIF turned, commented."""
    rng = np.random.default_rng(7)
    y, x = np.mgrid[0:150, 0:210]
    base = np.stack([(x + y) % 256, (x * 2) % 256, (y * 3) % 256], -1).astype(np.int16)
    base = np.clip(base + rng.integers(-20, 20, base.shape), 0, 255).astype(np.uint8)
    img = Image.fromarray(base)
    exif = Image.Exif()
    exif[0x0112] = 6
    out = []
    for options in ({}, {"progressive": True}, {"restart_marker_blocks": 2}, {"subsampling": 0},
                    {"exif": exif.tobytes()}, {"comment": b"a note"}):
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=85, **options)
        out.append(buf.getvalue())
    buf = io.BytesIO()
    img.convert("L").save(buf, "JPEG")
    out.append(buf.getvalue())
    return out


def _damage(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    kind = rng.randrange(5)
    if kind == 0:
        return bytes(out[:rng.randrange(3, len(out))])
    if kind == 1:
        for _ in range(rng.choice((1, 2, 8, 40))):
            out[rng.randrange(2, len(out))] = rng.randrange(256)
        return bytes(out)
    if kind == 2:  # a segment's length made wrong
        at = rng.randrange(2, min(len(out) - 4, 600))
        at = out.index(0xFF, at) if 0xFF in out[at:] else 2
        if at + 3 < len(out):
            out[at + 2], out[at + 3] = rng.randrange(256), rng.randrange(256)
        return bytes(out)
    if kind == 3:  # a stretch repeated or dropped
        a = rng.randrange(2, len(out))
        b = min(len(out), a + rng.randrange(1, 300))
        return bytes(out[:b] + out[a:]) if rng.random() < 0.5 else bytes(out[:a] + out[b:])
    return bytes(out[:2] + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 12))) + out[2:])


def fuzz(cases: int, seed: int) -> collections.Counter:
    from beam_prep.errors import ImageError
    from beam_prep.write.images import imaging, jpeg_path
    from beam_prep.write.images.imaging import ImageSpec

    if jpeg_path.available() is not None:
        raise SystemExit(f"the JPEG fast path does not run here: {jpeg_path.available()}")
    specs = [ImageSpec(), ImageSpec(channels=1, resize_mode="pad", height=40, width=70),
             ImageSpec(resize_mode="none", height=None, width=None)]
    rng = random.Random(seed)
    clean = _clean()
    counted: collections.Counter = collections.Counter()

    def outcome(data: bytes, spec: ImageSpec, path: str | None) -> object:
        if path is None:
            os.environ.pop(jpeg_path.VARIABLE, None)
        else:
            os.environ[jpeg_path.VARIABLE] = path
        try:
            return imaging.process_image(data, spec)
        except ImageError as e:
            return ("ImageError", e.stage, str(e))

    for case in range(cases):
        data = _damage(rng.choice(clean), rng)
        spec = rng.choice(specs)
        from beam_prep.write.images import resample

        with resample.counting() as paths:
            fast = outcome(data, spec, None)
        slow = outcome(data, spec, jpeg_path.PILLOW)
        if fast != slow:
            raise SystemExit(f"case {case}: the fast path gives {fast!r:.200}, Pillow's {slow!r:.200}")
        counted["cases"] += 1
        counted["native"] += paths.get("jpeg native", 0)
    return counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extension", required=True, help="the built _resample extension to load")
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    _load_extension(args.extension)
    counted = fuzz(args.cases, args.seed)
    print(f"jpeg fuzz: {counted['cases']} cases like Pillow's; made by the fast path {counted['native']}")


if __name__ == "__main__":
    main()
