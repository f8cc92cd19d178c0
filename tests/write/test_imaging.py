"""The per-image kernel: bytes in, training-ready bytes out."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import math
import os
import warnings

import numpy as np
import pytest
from helpers import encode
from PIL import ExifTags, Image, ImageColor, ImageDraw, ImageFilter, ImageOps
from PIL.JpegImagePlugin import JpegImageFile

from beam_prep.errors import ImageError
from beam_prep.tools.sample import picture
from beam_prep.write.images import imaging, resample
from beam_prep.write.images.imaging import KEPT, ImageSpec, is_image_name, process_image


@pytest.fixture(scope="module", autouse=True)
def _the_kernel_resizes():
    """The resize kernel built, as in a run's workers: the resizes here are its own (with
    pillow-simd in Pillow's place, its own resize, as in a run: tests/write/test_accelerated.py)."""
    kernel = resample.available()
    assert kernel == resample.KERNEL or not resample.pillow_build().startswith("pillow "), kernel


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


def photo(seed: int, width: int, height: int) -> Image.Image:
    """Photo-like RGB, for fidelity checks: flat colours or noise make a PSNR meaningless.

    A random field with natural images' 1/f spectrum, sharp-edged shapes, a
    little lens blur and sensor grain.
    """
    rng = np.random.default_rng(seed)
    fy, fx = np.fft.fftfreq(height)[:, None], np.fft.rfftfreq(width)[None, :]
    amplitude = np.maximum(np.hypot(fx, fy), 1 / max(width, height)) ** -1.2
    noise = rng.standard_normal((2, *amplitude.shape, 3))
    field = np.fft.irfft2(amplitude[..., None] * (noise[0] + 1j * noise[1]), s=(height, width), axes=(0, 1))
    field = 128 + 48 * (field - field.mean()) / field.std()
    img = Image.fromarray(np.clip(field, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(15):
        circle = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(0.03, 0.2) * min(width, height)
        draw.regular_polygon(circle, int(rng.integers(3, 9)), rotation=rng.uniform(0, 360),
                             fill=tuple(int(c) for c in rng.integers(0, 256, 3)))
    grain = rng.normal(0, 1, (height, width, 1))
    return Image.fromarray(np.clip(np.asarray(img.filter(ImageFilter.GaussianBlur(1.5))) + grain, 0, 255)
                           .astype(np.uint8))


def psnr(got: np.ndarray, reference: np.ndarray) -> float:
    mse = np.mean((got.astype(float) - reference.astype(float)) ** 2)
    return 10 * math.log10(255**2 / mse)


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


def half_transparent(mode: str) -> Image.Image:
    """16x16 in ``mode``: the left half dark grey and opaque, the right half black and transparent,
    by an alpha channel or by a transparent colour (PNG's tRNS) as the mode allows."""
    grey = np.full((16, 16), 64, np.uint8)
    grey[:, 8:] = 0
    alpha = np.full((16, 16), 255, np.uint8)
    alpha[:, 8:] = 0
    if mode in ("RGBA", "LA"):
        return Image.merge(mode, [Image.fromarray(grey)] * (len(mode) - 1) + [Image.fromarray(alpha)])
    if mode == "P, alpha per entry":  # a palette whose entries carry their own alpha (PNG's tRNS)
        img = Image.fromarray(grey).convert("P")
        entries = len(img.getpalette()) // 3
        img.info["transparency"] = bytes(0 if i == img.getpixel((15, 0)) else 255 for i in range(entries))
        return img
    if mode == "I;16":
        img = Image.fromarray(grey.astype(np.uint16) * 257)
        img.info["transparency"] = 0
        return img
    img = Image.fromarray(grey).convert(mode)
    img.info["transparency"] = {"L": 0, "RGB": (0, 0, 0), "P": img.getpixel((15, 0))}[mode]
    return img


@pytest.mark.parametrize("mode", ["L", "I;16", "RGB", "P", "P, alpha per entry", "LA", "RGBA"])
@pytest.mark.parametrize("background", [imaging.DEFAULT_BACKGROUND, "#204060"])
def test_transparency_is_composited_on_the_background_in_every_mode(mode, background):
    source = half_transparent(mode)
    data = encode(source, "PNG", transparency=source.info["transparency"]) if "transparency" in source.info \
        else encode(source, "PNG")
    assert Image.open(io.BytesIO(data)).mode == mode.split(",")[0]  # the PNG really is of that mode
    out = pixels(process_image(data, ImageSpec(height=16, width=16, resize_mode="stretch", image_format="png",
                                               background=background)).data)
    assert (out[:, :8] == 64).all()  # opaque: its own grey, untouched
    assert (out[:, 8:] == ImageColor.getrgb(background)).all()  # transparent: the background


def test_background_is_one_spelling_of_a_colour():
    assert imaging.parse_colour("white") == imaging.parse_colour("#FFF") == "#ffffff"
    assert imaging.parse_colour("rgb(32, 64, 96)") == "#204060"
    for bad in ("nocolour", "#12345", "#ff000080"):
        with pytest.raises(ValueError):
            imaging.parse_colour(bad)
    with pytest.raises(ValueError):
        ImageSpec(background="white")  # a spec keeps the one spelling, so reruns compare equal


def damaged(data: bytes, at: float = 0.5, length: int = 64) -> bytes:
    """``data`` with ``length`` bytes overwritten at the fraction ``at`` of its length."""
    start = int(len(data) * at)
    noise = np.random.default_rng(start).integers(0, 256, length, dtype=np.uint8).tobytes()
    return data[:start] + noise + data[start + length:]


def strict_decode_fails(data: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
    except Exception:  # noqa: BLE001 - any refusal counts
        return True
    return False


@pytest.mark.parametrize("fmt", ["PNG", "TIFF", "GIF", "WEBP"])
def test_a_damaged_image_is_a_decode_error_never_a_record(fmt):
    source = photo(3, 200, 150)
    if fmt == "GIF":
        source = source.quantize(64)
    data = encode(source, fmt, **({"compression": "tiff_adobe_deflate"} if fmt == "TIFF" else {}))
    bad = next(d for d in (damaged(data, at) for at in np.linspace(0.3, 0.8, 11)) if strict_decode_fails(d))
    with pytest.raises(ImageError) as e:
        process_image(bad, ImageSpec())
    assert e.value.stage == "decode"


def exif_after_pixels(png: bytes) -> bytes:
    """``png`` with its eXIf chunk moved after the image data, where the PNG format allows it too."""
    chunks, pos = [], 8
    while pos < len(png):
        length = int.from_bytes(png[pos:pos + 4], "big")
        chunks.append(png[pos:pos + 12 + length])
        pos += 12 + length
    exif = [c for c in chunks if c[4:8] == b"eXIf"]
    rest = [c for c in chunks if c[4:8] != b"eXIf"]
    return png[:8] + b"".join(rest[:-1] + exif + rest[-1:])  # ... eXIf, IEND


def test_reading_a_png_orientation_does_not_swallow_a_damaged_stream():
    # A PNG's EXIF may follow its pixels: looking for it reads through them, and must not hide their damage.
    exif = Image.Exif()
    exif[ExifTags.Base.Orientation] = 6
    data = exif_after_pixels(encode(photo(4, 120, 80), "PNG", exif=exif.tobytes()))
    upright = process_image(data, ImageSpec(height=None, width=None, resize_mode="none", image_format="png"))
    assert (upright.height, upright.width) == (120, 80)  # a whole one is still turned upright
    bad = damaged(data, 0.5)
    assert strict_decode_fails(bad)
    with pytest.raises(ImageError) as e:
        process_image(bad, ImageSpec())
    assert e.value.stage == "decode"


def test_a_png_turned_beside_a_mistyped_exif_entry_is_written():
    # EXIF turning the image beside an entry of another type than its tag's (a ResolutionUnit written
    # as text): exif_transpose's rewrite of the EXIF raised struct.error out of process_image.
    exif = (b"II*\x00\x08\x00\x00\x00\x02\x00" + b"\x12\x01\x03\x00\x01\x00\x00\x00\x06\x00\x00\x00"
            + b"\x28\x01\x02\x00\x04\x00\x00\x00cm\x00\x00" + b"\x00" * 4)
    data = encode(photo(4, 120, 80), "PNG", exif=exif)
    upright = process_image(data, ImageSpec(height=None, width=None, resize_mode="none", image_format="png"))
    assert (upright.height, upright.width) == (120, 80)


# How a stored image is turned for each orientation so that its upright form is the picture.
STORED_AS = {5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_90, 7: Image.Transpose.TRANSVERSE,
             8: Image.Transpose.ROTATE_270}


@pytest.mark.parametrize("orientation", sorted(STORED_AS))
@pytest.mark.parametrize("compression", ["group4", "tiff_lzw"])
@pytest.mark.parametrize("resize_mode", ["center_crop", "shorter_side"])
def test_oriented_tiffs_come_out_upright_at_the_asked_size(orientation, compression, resize_mode):
    upright = quadrants(80, 40)
    if compression == "group4":
        upright = upright.convert("L").point(lambda v: 255 if v > 100 else 0).convert("1")
    stored = upright.transpose(STORED_AS[orientation])
    data = encode(stored, "TIFF", compression=compression, tiffinfo={ExifTags.Base.Orientation: orientation})
    spec = ImageSpec(height=20, width=20, resize_mode=resize_mode, image_format="png")
    out = process_image(data, spec)
    expected = process_image(encode(upright, "PNG"), spec)
    assert (out.height, out.width) == (expected.height, expected.width)
    assert (out.height, out.width) == ((20, 20) if resize_mode == "center_crop" else (20, 40))
    assert np.abs(pixels(out.data).astype(int) - pixels(expected.data).astype(int)).mean() < 2


def test_flat_outputs_are_flagged():
    black = process_image(encode(Image.new("RGB", (50, 40))), ImageSpec(height=16, width=16))
    assert black.flat == ("#000000", False)
    clear = process_image(encode(Image.new("RGBA", (50, 40), (9, 9, 9, 0)), "PNG"), ImageSpec(height=16, width=16))
    assert clear.flat == ("#ffffff", True)  # its transparency, on the default background
    assert not process_image(encode(photo(5, 50, 40)), ImageSpec(height=16, width=16)).flat
    original = ImageSpec(height=None, width=None, resize_mode="none", image_format="original")
    assert process_image(encode(Image.new("RGB", (64, 64), "red")), original).flat  # kept, and still looked at


def test_one_channel_output():
    out = process_image(encode(picture(2, 50, 50)), ImageSpec(height=20, width=20, channels=1))
    assert out.channels == 1
    assert pixels(out.data).shape == (20, 20)


def test_images_over_max_pixels_are_refused():
    with pytest.raises(ImageError) as e:
        process_image(encode(picture(1, 200, 100)), ImageSpec(max_pixels=10_000))
    assert e.value.stage == "too_large"
    assert "200x100" in str(e.value) and "--max_pixels" in str(e.value)


def test_the_refusal_says_how_to_raise_max_pixels():
    with pytest.raises(ImageError) as e:
        process_image(encode(picture(1, 200, 100)), ImageSpec(max_pixels=10_000))
    assert str(e.value) == ("200x100 is 20000 pixels, over --max_pixels 10000: if the image is "
                            "genuine, pass --max_pixels 20000 or more")


def test_max_pixels_is_the_only_limit_and_the_callers_pillow_limit_is_kept(monkeypatch):
    """Pillow's own limit (here a caller's 1,000 pixels, Pillow's error at twice that) never fires in our
    decode, warns nothing, and is the caller's again after it."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000)
    data = encode(picture(1, 200, 100))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = process_image(data, ImageSpec(height=10, width=20, max_pixels=20_000))
    assert (out.height, out.width) == (10, 20)
    assert Image.MAX_IMAGE_PIXELS == 1_000
    with pytest.raises(ImageError, match="over --max_pixels 19999:"):
        process_image(data, ImageSpec(max_pixels=19_999))
    assert Image.MAX_IMAGE_PIXELS == 1_000


def test_pillows_limit_stays_off_until_the_last_of_several_threads_is_done(monkeypatch):
    """Decodes in several threads at once: none meets Pillow's limit, and the caller's is back after."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000)
    data = encode(picture(3, 120, 90))
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: process_image(data, ImageSpec(height=9, width=12)), range(64)))
    assert {(r.height, r.width) for r in results} == {(9, 12)}
    assert Image.MAX_IMAGE_PIXELS == 1_000


@pytest.mark.parametrize("data,message", [
    (b"", "empty file (0 bytes)"),  # a failed download or copy, said as such
    (b"not an image at all", "not an image in a format Pillow reads"),
    (encode(picture(1))[:200], "not a readable image: "),
])
def test_broken_bytes_raise_a_decode_error_that_says_why(data, message):
    with pytest.raises(ImageError) as e:
        process_image(data, ImageSpec())
    assert e.value.stage == "decode"
    assert str(e.value).startswith(message), str(e.value)


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


def _stored(upright: Image.Image, orientation: int) -> bytes:
    """JPEG q95 bytes of ``upright`` stored as a camera would with EXIF ``orientation``."""
    if orientation == 1:
        return encode(upright, "JPEG", quality=95)
    exif = Image.Exif()
    exif[0x0112] = orientation
    turn = {6: Image.Transpose.ROTATE_90, 8: Image.Transpose.ROTATE_270}[orientation]
    return encode(upright.transpose(turn), "JPEG", quality=95, exif=exif.tobytes())


@pytest.mark.parametrize("width,height,side,grey,orientation,scale", [
    (701, 525, 144, False, 1, 2),
    (1601, 1067, 224, False, 1, 2),
    (1203, 801, 224, False, 1, 2),
    (3201, 2401, 224, False, 1, 4),
    (525, 701, 144, False, 1, 2),  # portrait
    (1067, 1601, 224, True, 1, 2),
    (801, 1203, 224, False, 6, 2),  # stored 1203x801, turned upright on decode
    (801, 1203, 224, False, 8, 2),
])
def test_center_crop_after_a_scaled_jpeg_decode_matches_a_full_decode(
        monkeypatch, width, height, side, grey, orientation, scale):
    # Odd sizes: a decode scaled by 1/s is ceil(size / s) pixels, its last pixel
    # reaching past the source, so a crop centred on that grid lands off centre.
    draft = JpegImageFile.draft
    scales = []

    def recording_draft(self, mode, size):
        full = self.size
        result = draft(self, mode, size)
        scales.append(full[0] / result[1][2])
        return result

    monkeypatch.setattr(JpegImageFile, "draft", recording_draft)
    channels = 1 if grey else 3
    upright = photo(width * height, width, height).convert("L" if grey else "RGB")
    data = _stored(upright, orientation)
    spec = ImageSpec(height=side, width=side, channels=channels, image_format="raw")
    out = process_image(data, spec)
    got = np.frombuffer(out.data, np.uint8).reshape(side, side, channels).squeeze()
    # Reference: full decode (no draft), turned upright, the same centre crop in
    # source pixels, Lanczos.
    full = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert(spec.mode)
    assert full.size == (width, height)
    crop_w, crop_h = (min(width, height),) * 2
    box = ((width - crop_w) / 2, (height - crop_h) / 2, (width + crop_w) / 2, (height + crop_h) / 2)
    reference = np.asarray(full.resize((side, side), Image.Resampling.LANCZOS, box=box))
    assert scales == [scale]  # the decode was scaled: else this compares a full decode with itself
    assert psnr(got, reference) >= 44


@pytest.mark.parametrize("mode,size", [("stretch", (224, 224)), ("shorter_side", (224, 336))])
def test_whole_image_resizes_after_a_scaled_jpeg_decode_match_a_full_decode(mode, size):
    data = _stored(photo(7, 801, 1203), 8)  # stored 1203x801, decoded at 1/2 to 602x401
    out = process_image(data, ImageSpec(height=224, width=224, resize_mode=mode, image_format="raw"))
    full = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    reference = np.asarray(full.resize(size, Image.Resampling.LANCZOS))
    assert psnr(np.frombuffer(out.data, np.uint8).reshape(size[1], size[0], 3), reference) >= 44


def test_center_crop_of_a_jpeg_a_multiple_of_the_draft_scale_is_that_of_the_scaled_grid():
    # 1600x1200 decodes at 1/2 to exactly 800x600: no partial pixel, the grids agree.
    data = encode(photo(5, 1600, 1200), "JPEG", quality=95)
    out = process_image(data, ImageSpec(height=224, width=224, image_format="raw"))
    half = Image.open(io.BytesIO(data))
    half.draft("RGB", (800, 600))
    assert half.size == (800, 600)
    expected = half.convert("RGB").resize((224, 224), Image.Resampling.BICUBIC, box=(100, 0, 700, 600))
    np.testing.assert_array_equal(np.frombuffer(out.data, np.uint8).reshape(224, 224, 3), np.asarray(expected))


@pytest.mark.parametrize("name,expected", [
    ("a/b.JPG", True), ("a/b.jpeg", True), ("a/b.png", True), ("a/b.tif", True), ("a/b.TIFF", True),
    ("a/b.webp", True), ("a/b.gif", True), ("a/b.bmp", True),
    ("a/.b.jpg", False), ("a/b.txt", False), ("a/jpg", False), ("a/b.jpg.json", False),
])
def test_image_files_are_chosen_by_extension(name, expected):
    assert is_image_name(name) is expected


def test_the_pillow_build_in_use_is_the_one_expected():
    # tests/write/test_accelerated.py runs this file again with pillow-simd first on the path:
    # the fidelity tests above must then have run on it, not on the stock Pillow.
    expected = os.environ.get("BEAM_PREP_EXPECT_IMAGING", "pillow")
    assert imaging.library().split()[0] == expected


# --- --image_format original, --no_upscale ---------------------------------------

ORIGINAL = ImageSpec(height=None, width=None, resize_mode="none", image_format="original")


def _rotated(upright: Image.Image, orientation: int = 6) -> bytes:
    """A JPEG stored as a camera stores a turned photo, with the EXIF tag that turns it upright."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(upright.transpose(Image.Transpose.ROTATE_90), "JPEG", quality=95, exif=exif.tobytes())


@pytest.mark.parametrize("params", [{"quality": 83}, {"quality": 95, "progressive": True},
                                    {"quality": 75, "subsampling": 0}])
def test_original_stores_a_plain_rgb_jpeg_byte_for_byte(params):
    data = encode(photo(1, 120, 80), "JPEG", **params)
    out = process_image(data, ORIGINAL)
    assert out.data == data
    assert (out.original, out.height, out.width, out.channels) == (KEPT, 80, 120, 3)


def test_original_keeps_grayscale_jpegs_for_one_channel_and_converts_colour_ones():
    grey_source, colour_source = photo(2, 64, 48).convert("L"), photo(3, 64, 48)
    grey, colour = encode(grey_source, "JPEG", quality=90), encode(colour_source, "JPEG", quality=90)
    one = dataclasses.replace(ORIGINAL, channels=1)
    assert process_image(grey, one).data == grey
    made = process_image(colour, one)
    assert made.original == "channels" and made.channels == 1
    assert np.abs(pixels(made.data).astype(int) - np.asarray(colour_source.convert("L")).astype(int)).mean() < 3
    # And the other way: three channels asked for, a grey JPEG becomes an RGB one.
    made = process_image(grey, ORIGINAL)
    assert made.original == "channels" and pixels(made.data).shape == (48, 64, 3)


@pytest.mark.parametrize("reason,fmt,mode", [
    ("not_jpeg", "PNG", "RGB"), ("not_jpeg", "GIF", "P"), ("not_jpeg", "WEBP", "RGB"),
    ("not_jpeg", "PNG", "I;16"), ("cmyk", "JPEG", "CMYK"), ("rotated", "JPEG", "RGB")])
def test_original_makes_an_upright_rgb_jpeg_of_everything_else(reason, fmt, mode):
    upright = picture(4, 72, 56)
    if reason == "rotated":
        data = _rotated(upright)
    elif mode == "I;16":  # 16-bit grey: the 8-bit picture times 257
        upright = upright.convert("L")
        data = encode(Image.fromarray(np.asarray(upright).astype(np.uint16) * 257), fmt)
    elif mode == "P":  # flat colours, as a palette holds them exactly
        upright = quadrants(72, 56)
        data = encode(upright.convert("P", palette=Image.Palette.ADAPTIVE), fmt)
    else:
        data = encode(upright.convert(mode), fmt, **({"lossless": True} if fmt == "WEBP" else {}))
        upright = upright.convert(mode)
    out = process_image(data, dataclasses.replace(ORIGINAL, jpeg_quality=95))
    assert out.original == reason and Image.open(io.BytesIO(out.data)).format == "JPEG"
    assert (out.height, out.width) == (56, 72)
    reference = np.asarray(upright.convert("RGB"))
    assert np.abs(pixels(out.data).astype(int) - reference.astype(int)).mean() < 3


def test_original_with_a_fixed_size_mode_keeps_only_sources_of_that_exact_size():
    spec = ImageSpec(height=48, width=64, image_format="original")
    exact = encode(photo(5, 64, 48), "JPEG", quality=90)
    assert process_image(exact, spec).data == exact
    other = process_image(encode(photo(5, 80, 48), "JPEG", quality=90), spec)
    assert other.original == "resized" and (other.height, other.width) == (48, 64)


@pytest.mark.parametrize("cut", [2, 300, 5000])
def test_original_never_keeps_a_truncated_jpeg(cut):
    data = encode(photo(6, 320, 240), "JPEG", quality=90)
    with pytest.raises(ImageError) as e:
        process_image(data[:-cut], ORIGINAL)
    assert e.value.stage == "decode" and "truncated" in str(e.value)


def test_no_upscale_keeps_images_smaller_than_the_target_at_their_size():
    spec = ImageSpec(height=100, width=100, resize_mode="shorter_side", no_upscale=True)
    small, large = encode(photo(7, 80, 60), "JPEG", quality=90), encode(photo(7, 300, 200), "JPEG", quality=90)
    out = process_image(small, spec)
    assert (out.height, out.width) == (60, 80) and out.data != small  # re-encoded at q90, not enlarged
    assert np.abs(pixels(out.data).astype(int) - pixels(small).astype(int)).mean() < 3
    assert (process_image(large, spec).height, process_image(large, spec).width) == (100, 150)
    # Without it, the small image is enlarged to the target.
    enlarged = process_image(small, dataclasses.replace(spec, no_upscale=False))
    assert (enlarged.height, enlarged.width) == (100, 133)
    # With originals, the small JPEG keeps its bytes and the large one is shrunk.
    originals = dataclasses.replace(spec, image_format="original")
    assert process_image(small, originals).data == small
    shrunk = process_image(large, originals)
    assert shrunk.original == "resized" and (shrunk.height, shrunk.width) == (100, 150)


@pytest.mark.parametrize("mode", ["center_crop", "stretch", "pad"])
def test_no_upscale_is_refused_with_fixed_size_modes(mode):
    with pytest.raises(ValueError, match=r"applies to the size-keeping resize modes \(shorter_side, and none"):
        ImageSpec(height=64, width=64, resize_mode=mode, no_upscale=True)


# JPEG data libjpeg calls corrupt, though Pillow decodes it (jpeg_damage, imported in each test: the
# rest of this module runs without it).

def libjpeg_warning(data: bytes) -> str | None:
    from beam_prep.write.images.jpeg_damage import libjpeg_warning as found

    return found(data)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("options", [{"quality": 85}, {"quality": 100, "subsampling": 0},
                                     {"quality": 70, "progressive": True}, {"quality": 95, "optimize": True}])
def test_a_whole_jpeg_is_not_taken_for_corrupt(seed, options):
    """The end of a clean scan is data, whatever its bits: none is taken for padding."""
    img = picture(seed, 40 + 7 * seed, 30 + 5 * seed)
    assert libjpeg_warning(encode(img if seed % 3 else img.convert("L"), "JPEG", **options)) is None


def test_bytes_between_segments_are_named_as_libjpeg_names_them():
    jpeg = encode(picture(1, 60, 45), "JPEG", quality=90)
    end = 4 + int.from_bytes(jpeg[4:6], "big")  # after the first segment, APP0
    gap = jpeg[:end] + b"\x00\x11\x22" + jpeg[end:]
    assert libjpeg_warning(gap) == "Corrupt JPEG data: 3 extraneous bytes before marker 0xdb"


@pytest.mark.parametrize("tail", [bytes(8), bytes(20), b"\x5a" * 9, b"\x12\x34" + b"\x01" * 12])
@pytest.mark.parametrize("progressive", [False, True])
def test_bytes_no_decode_uses_before_the_end_are_found_and_such_an_original_is_reencoded(tail, progressive):
    """Padding, from UNUSED_TAIL (8) bytes, the number libjpeg warns of whatever it read ahead; fewer pass."""
    from beam_prep.write.images.jpeg_damage import UNUSED_TAIL

    jpeg = encode(picture(2, 64, 48), "JPEG", quality=90, progressive=progressive)
    assert libjpeg_warning(jpeg[:-2] + bytes(UNUSED_TAIL - 1) + jpeg[-2:]) is None
    padded = jpeg[:-2] + tail + jpeg[-2:]
    assert libjpeg_warning(padded) == "Corrupt JPEG data: extraneous bytes before marker 0xd9"
    spec = ImageSpec(height=None, width=None, resize_mode="none", image_format="original")
    assert process_image(jpeg, spec).original == KEPT
    out = process_image(padded, spec)
    assert out.original == "corrupt" and out.data != padded
    assert libjpeg_warning(out.data) is None
    assert np.abs(pixels(out.data).astype(int) - pixels(jpeg).astype(int)).mean() < 3
