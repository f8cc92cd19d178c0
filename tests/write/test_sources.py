"""The manifest's ``sources``: each image's upright size and aspect ratio in fixed bins, and what making it a
record did (upscaled, cropped, padded, converted), counted as the workers count it (``resample.counting``)."""
from __future__ import annotations

import io

from PIL import Image

from beam_prep.write.images import resample, sources
from beam_prep.write.images.imaging import ImageSpec, process_image


def encode(img: Image.Image, fmt: str, **params) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, fmt, **params)
    return buffer.getvalue()


def rotated_jpeg(width: int, height: int) -> bytes:
    """A JPEG stored ``width`` x ``height`` whose EXIF turns it a quarter (orientation 6)."""
    img = Image.new("RGB", (width, height), (200, 30, 30))
    exif = img.getexif()
    exif[0x0112] = 6
    return encode(img, "JPEG", exif=exif)


SOURCES = [
    encode(Image.new("RGB", (100, 50), "red"), "JPEG"),  # upscaled and cropped to 64x64
    encode(Image.new("RGB", (200, 200), "blue"), "JPEG"),  # shrunk, nothing else
    encode(Image.new("L", (40, 40), 128), "PNG"),  # upscaled, converted
    encode(Image.new("RGBA", (300, 100), (0, 0, 0, 0)), "PNG"),  # converted, cropped
    rotated_jpeg(120, 60),  # upright 60x120: upscaled, cropped, aspect 0.5
]


def counted(spec: ImageSpec) -> dict:
    with resample.counting() as counter:
        for data in SOURCES:
            process_image(data, spec)
    return sources.summary(counter.items())["sources"]


def test_sizes_aspects_and_what_was_done_are_counted_upright():
    got = counted(ImageSpec(height=64, width=64, resize_mode="center_crop"))
    assert got["images"] == 5
    assert got["width"] == {"0": 2, "64": 1, "128": 1, "256": 1, "512": 0, "1024": 0, "2048": 0, "4096": 0}
    assert got["height"] == {"0": 2, "64": 2, "128": 1, "256": 0, "512": 0, "1024": 0, "2048": 0, "4096": 0}
    assert got["aspect"] == {"0": 0, "0.5": 1, "0.75": 0, "0.9": 2, "1.12": 0, "1.34": 0, "2": 2}
    assert (got["upscaled"], got["cropped"], got["padded"], got["converted"]) == (3, 3, 0, 2)


def test_pad_counts_padded_and_the_size_keeping_modes_neither():
    padded = counted(ImageSpec(height=64, width=64, resize_mode="pad"))
    assert (padded["upscaled"], padded["cropped"], padded["padded"]) == (1, 0, 3)  # only 40x40 fits inside 64x64
    kept = counted(ImageSpec(height=None, width=None, resize_mode="none"))
    assert (kept["upscaled"], kept["cropped"], kept["padded"], kept["converted"]) == (0, 0, 0, 2)


def test_the_resize_kernels_summary_ignores_the_sources_keys():
    with resample.counting() as counter:
        process_image(SOURCES[0], ImageSpec(height=64, width=64))
    assert any(key.startswith(sources.PREFIX) for key in counter)
    assert resample.summary(counter.items())["resize_kernel"] in ("kernel", "pillow")
    assert sources.summary([]) == {}
