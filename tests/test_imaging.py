"""The per-image kernel: bytes in, training-ready bytes out."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from PIL.JpegImagePlugin import JpegImageFile

from beam_prep.errors import ImageError
from beam_prep.imaging import ImageSpec, is_image_name, process_image
from beam_prep.sample import picture
from helpers import encode


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)))


def quadrants(width: int = 80, height: int = 60) -> Image.Image:
    """Red top-left, green top-right, blue bottom-left, white bottom-right: orientation is visible."""
    a = np.zeros((height, width, 3), np.uint8)
    a[: height // 2, : width // 2] = (255, 0, 0)
    a[: height // 2, width // 2:] = (0, 255, 0)
    a[height // 2:, : width // 2] = (0, 0, 255)
    a[height // 2:, width // 2:] = (255, 255, 255)
    return Image.fromarray(a)


@pytest.mark.parametrize("mode,expected", [
    ("center_crop", (32, 48)), ("stretch", (32, 48)), ("pad", (32, 48)),
])
def test_fixed_size_modes_give_the_requested_size(mode, expected):
    out = process_image(encode(picture(1, 200, 90)), ImageSpec(height=32, width=48, resize_mode=mode))
    assert (out.height, out.width) == expected
    assert pixels(out.data).shape == (*expected, 3)


def test_shorter_side_keeps_aspect_ratio():
    out = process_image(encode(picture(1, 200, 100)), ImageSpec(height=50, width=50, resize_mode="shorter_side"))
    assert (out.height, out.width) == (50, 100)


def test_none_keeps_the_original_size():
    out = process_image(encode(picture(1, 123, 45), "PNG"),
                        ImageSpec(height=None, width=None, resize_mode="none", image_format="png"))
    assert (out.height, out.width) == (45, 123)


def test_center_crop_keeps_the_centre_without_distortion():
    # 120x40, white in the middle third (plus the filter's margin), black at the sides:
    # a crop of the centre is all white, a squeeze of the whole would not be.
    a = np.zeros((40, 120, 3), np.uint8)
    a[:, 34:86] = 255
    out = process_image(encode(Image.fromarray(a), "PNG"),
                        ImageSpec(height=20, width=20, image_format="png"))
    assert pixels(out.data).min() == 255


def test_pad_letterboxes_with_black_bars():
    white = Image.new("RGB", (100, 50), (255, 255, 255))
    out = pixels(process_image(encode(white, "PNG"),
                               ImageSpec(height=40, width=40, resize_mode="pad", image_format="png")).data)
    assert out[:10].max() == 0 and out[-10:].max() == 0
    assert out[15:25].min() == 255


def test_png_and_raw_store_exact_pixels_when_no_resize_is_needed():
    img = picture(7, 32, 32)
    expected = np.asarray(img)
    png = process_image(encode(img, "PNG"), ImageSpec(height=32, width=32, image_format="png"))
    raw = process_image(encode(img, "PNG"), ImageSpec(height=32, width=32, image_format="raw"))
    np.testing.assert_array_equal(pixels(png.data), expected)
    np.testing.assert_array_equal(np.frombuffer(raw.data, np.uint8).reshape(32, 32, 3), expected)


def test_jpeg_output_is_close_to_the_source_pixels():
    img = picture(3, 64, 64)
    out = process_image(encode(img, "PNG"), ImageSpec(height=64, width=64, jpeg_quality=95))
    diff = np.abs(pixels(out.data).astype(int) - np.asarray(img).astype(int))
    assert diff.mean() < 3


def test_jpeg_quality_is_applied():
    data = encode(picture(3, 256, 256), "PNG")
    low = process_image(data, ImageSpec(height=256, width=256, jpeg_quality=30))
    high = process_image(data, ImageSpec(height=256, width=256, jpeg_quality=95))
    assert len(low.data) < len(high.data) / 2


@pytest.mark.parametrize("orientation,transpose", [
    (3, Image.Transpose.ROTATE_180),
    (6, Image.Transpose.ROTATE_90),
    (8, Image.Transpose.ROTATE_270),
])
def test_exif_orientation_is_applied(orientation, transpose):
    upright = quadrants()
    # Store the picture as a camera would, and tag how to turn it upright.
    stored = upright.transpose(transpose)
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(stored, "JPEG", exif=exif.tobytes(), quality=95)
    out = process_image(data, ImageSpec(height=60, width=80, resize_mode="stretch", image_format="png"))
    got = pixels(out.data).astype(int)
    assert np.abs(got - np.asarray(upright).astype(int)).mean() < 8


@pytest.mark.parametrize("source", ["L", "CMYK", "P", "RGBA", "LA", "I;16", "1"])
def test_every_mode_becomes_rgb(source):
    img = picture(5, 40, 30).convert(source) if source != "I;16" else Image.fromarray(
        np.arange(1200, dtype=np.uint16).reshape(30, 40) * 50)
    fmt = "TIFF" if source in ("CMYK", "I;16") else "PNG"
    out = process_image(encode(img, fmt), ImageSpec(height=30, width=40, image_format="raw"))
    assert out.channels == 3 and len(out.data) == 30 * 40 * 3


def test_sixteen_bit_images_are_scaled_not_clipped():
    a = np.full((8, 8), 32768, np.uint16)  # half of full scale
    out = process_image(encode(Image.fromarray(a), "PNG"),
                        ImageSpec(height=8, width=8, channels=1, image_format="raw"))
    assert set(out.data) == {128}


def test_transparent_pixels_become_white():
    rgba = Image.new("RGBA", (16, 16), (255, 0, 0, 0))
    out = process_image(encode(rgba, "PNG"), ImageSpec(height=16, width=16, image_format="raw"))
    assert set(out.data) == {255}


def test_one_channel_output():
    out = process_image(encode(picture(2, 50, 50)), ImageSpec(height=20, width=20, channels=1))
    assert out.channels == 1
    assert pixels(out.data).shape == (20, 20)


def test_images_over_max_pixels_are_refused():
    with pytest.raises(ImageError) as e:
        process_image(encode(picture(1, 200, 100)), ImageSpec(max_pixels=10_000))
    assert e.value.stage == "too_large"
    assert "200x100" in str(e.value) and "--max_pixels" in str(e.value)


@pytest.mark.parametrize("data", [b"", b"not an image at all", encode(picture(1))[:200]])
def test_broken_bytes_raise_a_decode_error(data):
    with pytest.raises(ImageError) as e:
        process_image(data, ImageSpec())
    assert e.value.stage == "decode"


def test_draft_mode_on_large_jpegs_stays_close_to_a_full_decode(monkeypatch):
    decoded_sizes = []
    draft = JpegImageFile.draft

    def recording_draft(self, mode, size):
        result = draft(self, mode, size)
        decoded_sizes.append(self.size)
        return result

    monkeypatch.setattr(JpegImageFile, "draft", recording_draft)
    big = picture(9, 2000, 1500)
    data = encode(big, "JPEG", quality=95)
    out = pixels(process_image(data, ImageSpec(height=224, width=224, image_format="png")).data)
    # Reference: full decode, same crop, same filter, no draft.
    full = Image.open(io.BytesIO(data)).convert("RGB")
    side = 1500
    reference = full.resize((224, 224), Image.Resampling.BICUBIC, box=(250, 0, 250 + side, side))
    assert np.abs(out.astype(int) - np.asarray(reference).astype(int)).mean() < 2
    # The JPEG was decoded scaled down: without draft mode, the check above
    # would compare a full decode with itself and pass.
    assert any(w < 2000 and h < 1500 for w, h in decoded_sizes), decoded_sizes


@pytest.mark.parametrize("name,expected", [
    ("a/b.JPG", True), ("a/b.jpeg", True), ("a/b.png", True), ("a/b.tif", True), ("a/b.TIFF", True),
    ("a/b.webp", True), ("a/b.gif", True), ("a/b.bmp", True),
    ("a/.b.jpg", False), ("a/b.txt", False), ("a/jpg", False), ("a/b.jpg.json", False),
])
def test_image_files_are_chosen_by_extension(name, expected):
    assert is_image_name(name) is expected
