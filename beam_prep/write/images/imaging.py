"""Image bytes in, training-ready image bytes out: decode, orient, convert, resize, encode.

Plain functions, no Beam and no TensorFlow, so they test alone and every runner
(and the benchmarks' per-core limit) calls exactly the same code.

With ``image_format="original"`` a source JPEG that training code can read as
it is keeps its own bytes (``_reencode_reason`` decides, before the decode and
resize path, and ``_kept`` after a check of its data), and every other image
goes down that path to a JPEG; the result says which happened and why, for the
manifest's counts.
"""
from __future__ import annotations

import dataclasses
import io
import math
from typing import NamedTuple

import numpy as np
from PIL import ExifTags, Image, ImageColor, UnidentifiedImageError

from beam_prep.errors import ImageError
from beam_prep.model.dataset import ImageInfo
from beam_prep.model.features import IMAGE_FORMATS
from beam_prep.pixel_limit import our_limit_only
from beam_prep.write.images import jpeg_path, resample, sources
from beam_prep.write.images.jpeg_damage import libjpeg_warning
from beam_prep.write.images.phash import THUMBNAIL, phash
from beam_prep.write.images.resample import pillow_build as library  # noqa: F401 - its public name here

RESIZE_MODES = ("center_crop", "stretch", "pad", "shorter_side", "none")
FIXED_SIZE_MODES = ("center_crop", "stretch", "pad")
# --image_format: what records store (features.IMAGE_FORMATS), or "original": a source
# JPEG's own bytes where it can be, else a JPEG made from it; records say "jpeg" either way.
ORIGINAL = "original"
OUTPUT_FORMATS = (*IMAGE_FORMATS, ORIGINAL)
# With --image_format original: a source stored byte for byte ...
KEPT = "kept"
# ... or the reason it was re-encoded, the first that applies in this order, with what it means.
REENCODE_REASONS = {
    "not_jpeg": "not a JPEG (PNG, GIF, WebP, BMP, TIFF...)",
    "cmyk": "a CMYK JPEG",
    "channels": "a JPEG of another channel count than --channels",
    "rotated": "a JPEG with an EXIF rotation",
    "resized": "a JPEG that --resize_mode resizes",
    "corrupt": "a JPEG whose data libjpeg calls corrupt (a reader would warn on every read)",
}

# Extensions Pillow decodes that users keep image datasets in.
IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff"}
)

DEFAULT_MAX_PIXELS = 100_000_000
# Let the JPEG decoder scale down in the DCT domain (1/2, 1/4, 1/8) while the
# result stays at least DRAFT_GAP times the target size; the bicubic resize does
# the rest. A larger gap keeps more detail and decodes and resizes more pixels:
# 1.75 is the smallest that keeps the benchmark corpus and the hard set at a
# median of 44 dB and a 10th percentile of 42 dB against a full decode
# (``benchmarks/bench_resize.py``); with the resize kernel, the CPU it costs is
# small. A DCT-scaled decode rounds its size up, so
# its last column and row reach past the source: crop boxes and sizes are
# computed on the region that draft() says the source covers, never on the
# decoded grid, or the crop lands up to half a source pixel off.
DRAFT_GAP = 1.75

_SIXTEEN_BIT_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I"})
_ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
# Composited on --background by default: white, as image viewers show transparency.
DEFAULT_BACKGROUND = "#ffffff"
# An output whose every channel spans at most this many levels shows nothing: one flat colour
# (a blank scan, or a source that decoded to black). Counted and named (flat.jsonl), not refused.
FLAT_SPREAD = 2
_SWAPPING_ORIENTATIONS = frozenset({5, 6, 7, 8})
# How exif_transpose() turns each orientation upright: flip x, flip y, then swap the axes if 5-8.
_FLIPPING_X = frozenset({2, 3, 7, 8})
_FLIPPING_Y = frozenset({3, 4, 6, 7})
# exif_transpose()'s turn for each orientation, made without its rewrite of the image's EXIF: no output
# reads that, and it raises (struct.error, TypeError) on an entry of another type than its tag's.
_TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
              5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
              8: Image.Transpose.ROTATE_90}

Box = tuple[float, float, float, float]


@dataclasses.dataclass(frozen=True)
class ImageSpec:
    """What every output image looks like. height/width are None for size-keeping modes."""

    height: int | None = 224
    width: int | None = 224
    channels: int = 3
    resize_mode: str = "center_crop"
    image_format: str = "jpeg"
    jpeg_quality: int = 90
    max_pixels: int = DEFAULT_MAX_PIXELS
    no_upscale: bool = False  # shorter_side: an image smaller than the size keeps its own
    background: str = DEFAULT_BACKGROUND  # "#rrggbb" transparent pixels are composited on
    perceptual_hash: bool = True  # False: no ``phash`` (a run that looks for exact copies only)

    def __post_init__(self) -> None:
        if parse_colour(self.background) != self.background:
            raise ValueError(f"background must be a colour written #rrggbb, not {self.background!r}")
        if self.resize_mode not in RESIZE_MODES:
            raise ValueError(f"resize_mode must be one of {RESIZE_MODES}, not {self.resize_mode!r}")
        if self.image_format not in OUTPUT_FORMATS:
            raise ValueError(f"image_format must be one of {OUTPUT_FORMATS}, not {self.image_format!r}")
        if self.no_upscale and self.resize_mode in FIXED_SIZE_MODES:
            raise ValueError(f"no_upscale applies to the size-keeping resize modes (shorter_side, and none, "
                             f"which never enlarges), not {self.resize_mode}, which gives every image one size")
        if self.channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, not {self.channels}")
        if not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality must be in 1..100, not {self.jpeg_quality}")
        if self.max_pixels < 1:
            raise ValueError(f"max_pixels must be positive, not {self.max_pixels}")
        if self.resize_mode == "none":
            if (self.height, self.width) != (None, None):
                raise ValueError("resize_mode 'none' keeps each image's size: give no image size")
        elif self.height is None or self.width is None or self.height < 1 or self.width < 1:
            raise ValueError(f"resize_mode {self.resize_mode!r} needs a positive image size")
        if self.resize_mode == "shorter_side" and self.height != self.width:
            raise ValueError("resize_mode 'shorter_side' takes one size (the shorter side), not HxW")

    @property
    def fixed_size(self) -> bool:
        """Whether every output image has the same height and width."""
        return self.resize_mode in FIXED_SIZE_MODES

    @property
    def stored_format(self) -> str:
        """What the records hold: ``original`` stores JPEG, its sources' or its own."""
        return "jpeg" if self.image_format == ORIGINAL else self.image_format

    @property
    def info(self) -> ImageInfo:
        """The images this spec makes, as the manifest records them and the reader reads them."""
        return ImageInfo(height=self.height if self.fixed_size else None,
                         width=self.width if self.fixed_size else None,
                         channels=self.channels, format=self.stored_format,
                         resize_mode=self.resize_mode)

    @property
    def mode(self) -> str:
        return "RGB" if self.channels == 3 else "L"

    @property
    def background_rgb(self) -> tuple[int, int, int]:
        return ImageColor.getrgb(self.background)[:3]


class Flat(NamedTuple):
    """An output of one flat colour (``FLAT_SPREAD``): worth a look, counted and named by the run.

    Attributes:
      colour: the colour it shows, ``#rrggbb``.
      transparent: its source has transparency, composited on ``--background``: an image whose
        shapes are in the background's own colour (a black icon on black) comes out flat.
    """

    colour: str
    transparent: bool


@dataclasses.dataclass(frozen=True)
class EncodedImage:
    """An image as stored; ``original`` (image_format original only): ``KEPT``, or the key of
    ``REENCODE_REASONS`` that says why it was re-encoded; ``flat``: the one flat colour it shows, if so."""

    data: bytes
    height: int
    width: int
    channels: int
    original: str | None = None
    flat: Flat | None = None  # one flat colour: worth a look, counted and named by the run
    phash: int | None = None  # the written image's perceptual hash (``phash.phash``), before its encode


def parse_colour(text: str) -> str:
    """A colour as Pillow names it (``white``, ``#fff``, ``rgb(0, 0, 0)``) in the one spelling
    records keep, ``#rrggbb``.

    Raises:
      ValueError: not a colour, or one with transparency of its own.
    """
    try:
        rgb = ImageColor.getrgb(text)
    except (ValueError, AttributeError) as e:
        raise ValueError(f"background {text!r} is not a colour: give a name (white, black) or #rrggbb") from e
    if len(rgb) == 4 and rgb[3] != 255:
        raise ValueError(f"background {text!r} is not opaque: give a colour without transparency")
    return "#{:02x}{:02x}{:02x}".format(*rgb[:3])


def is_image_name(name: str) -> bool:
    """Chosen by extension, case-insensitively; hidden files never count."""
    base = name.rsplit("/", 1)[-1]
    if base.startswith("."):
        return False
    dot = base.rfind(".")
    return dot > 0 and base[dot:].lower() in IMAGE_EXTENSIONS


def process_image(data: bytes, spec: ImageSpec) -> EncodedImage:
    """Decodes, orients, converts, resizes and encodes one image as ``spec`` says.

    With ``image_format="original"``, a source JPEG that needs none of that is
    checked and returned as it is (``original`` says ``KEPT``), and any other
    image is made a JPEG (``original`` says why).

    A plain JPEG stored as JPEG is made by the fast path (``jpeg_path``), the same bytes in one
    native call; every other file, and a JPEG it declines, by Pillow's steps here.

    Raises:
      ImageError: with the stage that failed; never anything else for bad input.
    """
    if spec.image_format == "jpeg":
        made = jpeg_path.make(data, spec, DRAFT_GAP)
        if made is not None:
            return _from_fast_path(made, spec)
    with our_limit_only():
        return _process(data, spec)


def _from_fast_path(made: jpeg_path.Made, spec: ImageSpec) -> EncodedImage:
    """The fast path's image as ``_process`` returns it, its source counted as ``_process`` counts it."""
    upright = made.upright
    sources.record(*upright, _done(*upright, made.source_mode, _sized_for(upright, spec)))
    flat = Flat(made.flat, False) if made.flat is not None else None
    return EncodedImage(made.encoded, made.height, made.width, spec.channels, None, flat, made.phash)


def _process(data: bytes, spec: ImageSpec) -> EncodedImage:
    img = _open(data, spec.max_pixels)
    source_mode = img.mode
    jpeg = img.format == "JPEG"
    # A JPEG's EXIF is in its header, read before the (drafted) decode. Any other format is
    # decoded whole first: a PNG's getexif() reads on through the pixel data (a damaged stream
    # would then pass as "corrupt EXIF"), and the TIFF plugin turns some images upright as it loads.
    orientation = _orientation(img) if jpeg else 1
    reason = None
    if spec.image_format == ORIGINAL:
        reason = _reencode_reason(img, orientation, spec)
        if reason is None:
            kept = _kept(data, img, spec)
            if kept is not None:
                sources.record(*_upright(img.size, orientation), ())
                return kept
            reason, img = "corrupt", _open(data, spec.max_pixels)  # decoded at a draft scale: opened anew
    region: Box | None = None  # where the source lies on the decoded grid, if not all of it
    upright = _upright(img.size, orientation)  # a JPEG's, before a draft decodes it smaller
    if jpeg:  # sized by the source, not by the smaller grid a draft decodes to
        spec = _sized_for(img.size, spec)
        region = _draft(img, spec, swapped=orientation in _SWAPPING_ORIENTATIONS)
    try:
        img.load()
        if not jpeg:
            orientation = _orientation(img)
        region = region or (0, 0, *img.size)
        if orientation != 1:
            region = _oriented(region, img.size, orientation)
            img = img.transpose(_TRANSPOSE[orientation])
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise ImageError("decode", f"cannot decode image: {e}") from e
    if not jpeg:
        upright = img.size  # turned upright as it loaded
        spec = _sized_for(img.size, spec)
    try:
        img, transparent = _convert(img, spec)
    except (OSError, ValueError) as e:
        raise ImageError("convert", f"cannot convert {img.mode} to {spec.mode}: {e}") from e
    img = _resize(img, region, spec)
    picture = phash(img, just_resized=True) if spec.perceptual_hash else None  # the picture as written: small, so cheap to hash
    encoded = EncodedImage(_encode(img, spec), img.height, img.width, spec.channels, reason,
                           _flat(img, transparent), picture)
    sources.record(*upright, _done(*upright, source_mode, spec))
    return encoded


def _upright(size: tuple[int, int], orientation: int) -> tuple[int, int]:
    """A source's (width, height) once turned upright by its EXIF ``orientation``."""
    return (size[1], size[0]) if orientation in _SWAPPING_ORIENTATIONS else size


def _done(width: int, height: int, mode: str, spec: ImageSpec) -> list[str]:
    """What making an upright ``width`` x ``height`` source of ``mode`` into ``spec``'s image did to it
    (``sources.DONE``' names): enlarged, cut to the target's aspect ratio, filled out to it, its
    colours converted."""
    done = []
    scaled = _scaled_size(width, height, spec)
    if scaled is not None and (scaled[0] > width or scaled[1] > height):
        done.append("upscaled")
    if spec.resize_mode in ("center_crop", "pad") and width * spec.height != height * spec.width:
        done.append("cropped" if spec.resize_mode == "center_crop" else "padded")
    if mode != spec.mode:
        done.append("converted")
    return done


def _reencode_reason(img: Image.Image, orientation: int, spec: ImageSpec) -> str | None:
    """Why a source cannot be stored as it is (a key of ``REENCODE_REASONS``), or None.

    Kept: a JPEG that TensorFlow's ``decode_jpeg`` turns into the image the
    resize mode would give, at the channel count asked for: YCbCr or RGB for 3,
    grayscale for 1, upright (``decode_jpeg`` ignores EXIF), of the size it
    must have. Checked on the header alone; ``_kept`` then checks the data.
    """
    if img.format != "JPEG":
        return "not_jpeg"
    if img.mode == "CMYK":
        return "cmyk"
    if img.mode != spec.mode:
        return "channels"
    if orientation != 1:
        return "rotated"
    if not _keeps_size(*img.size, spec):
        return "resized"
    return None


def _keeps_size(width: int, height: int, spec: ImageSpec) -> bool:
    """Whether ``spec`` leaves an (upright) image of this size as it is."""
    if spec.resize_mode == "none":
        return True
    if spec.resize_mode == "shorter_side":
        side = min(width, height)
        return side == spec.height or (spec.no_upscale and side < spec.height)
    return (width, height) == (spec.width, spec.height)


def _kept(data: bytes, img: Image.Image, spec: ImageSpec) -> EncodedImage | None:
    """The source's own bytes, once a decode shows they are whole; None where libjpeg, which
    the readers decode with, would call them corrupt (``jpeg_damage``): to be re-encoded.

    The decode is scaled down in the DCT domain (by up to 8, to no less than the
    perceptual hash's thumbnail): it still reads every coded byte, so a
    truncated or unreadable file fails here as a full decode would, at a
    fraction of the cost.
    """
    width, height = img.size
    try:
        img.draft(img.mode, (THUMBNAIL, THUMBNAIL))
        img.load()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise ImageError("decode", f"cannot decode image: {e}") from e
    if libjpeg_warning(data) is not None:  # every read would print libjpeg's warning: re-encoded instead
        return None
    return EncodedImage(data, height, width, spec.channels, KEPT, _flat(img, transparent=False),
                        phash(img) if spec.perceptual_hash else None)


def _sized_for(size: tuple[int, int], spec: ImageSpec) -> ImageSpec:
    """``spec`` for one image: with ``no_upscale``, one smaller than the target keeps its size."""
    if spec.no_upscale and spec.resize_mode == "shorter_side" and min(size) < spec.height:
        return dataclasses.replace(spec, resize_mode="none", height=None, width=None)
    return spec


def _open(data: bytes, max_pixels: int) -> Image.Image:
    if not data:  # a failed download or copy; Pillow would call it an unknown format
        raise ImageError("decode", "empty file (0 bytes)")
    try:
        img = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as e:
        raise ImageError("too_large", str(e)) from e
    except UnidentifiedImageError as e:  # its message names an in-memory buffer: useless
        raise ImageError("decode", "not an image in a format Pillow reads") from e
    except (OSError, ValueError, SyntaxError) as e:
        raise ImageError("decode", f"not a readable image: {e}") from e
    width, height = img.size
    if width * height > max_pixels:
        raise ImageError("too_large", over_max_pixels(width, height, max_pixels))
    return img


def over_max_pixels(width: int, height: int, max_pixels: int) -> str:
    """Why an image is refused as too large: the one limit, and how to raise it."""
    return (f"{width}x{height} is {width * height} pixels, over --max_pixels {max_pixels}: if the image is "
            f"genuine, pass --max_pixels {width * height} or more")


def _orientation(img: Image.Image) -> int:
    try:
        value = img.getexif().get(ExifTags.Base.Orientation, 1)
    except Exception:  # noqa: BLE001 - corrupt EXIF is common; the pixels may still be fine.
        return 1
    return value if value in range(1, 9) else 1


def _scaled_size(width: float, height: float, spec: ImageSpec) -> tuple[float, float] | None:
    """The size the whole (oriented) image is scaled to before any crop or pad."""
    if spec.resize_mode == "none":
        return None
    if spec.resize_mode == "stretch":
        return float(spec.width), float(spec.height)
    if spec.resize_mode == "center_crop":
        scale = max(spec.width / width, spec.height / height)
    elif spec.resize_mode == "pad":
        scale = min(spec.width / width, spec.height / height)
    else:  # shorter_side
        scale = spec.height / min(width, height)
    return width * scale, height * scale


def _draft(img: Image.Image, spec: ImageSpec, swapped: bool) -> Box | None:
    """Draft mode as DRAFT_GAP says; returns where the source lies on the smaller grid, if drafted.

    A decode scaled by 1/s is ceil(width / s) pixels wide, each pixel s source
    pixels: the source is the box (0, 0, width / s, height / s) of it, which
    draft() returns.
    """
    width, height = img.size
    if swapped:
        width, height = height, width
    target = _scaled_size(width, height, spec)
    if target is None:
        return None
    request = (math.ceil(target[0] * DRAFT_GAP), math.ceil(target[1] * DRAFT_GAP))
    if swapped:
        request = request[::-1]
    if request[0] < img.size[0] and request[1] < img.size[1]:
        drafted = img.draft(spec.mode, request)
        return drafted[1] if drafted else None
    return None


def _oriented(box: Box, size: tuple[int, int], orientation: int) -> Box:
    """``box`` on an image of ``size`` once turned upright as exif_transpose() turns it."""
    left, top, right, bottom = box
    width, height = size
    if orientation in _FLIPPING_X:
        left, right = width - right, width - left
    if orientation in _FLIPPING_Y:
        top, bottom = height - bottom, height - top
    if orientation in _SWAPPING_ORIENTATIONS:
        return top, left, bottom, right
    return left, top, right, bottom


def _convert(img: Image.Image, spec: ImageSpec) -> tuple[Image.Image, bool]:
    """``img`` in ``spec.mode``: 8 bits a channel, any transparency composited on ``spec.background``;
    and whether it had transparency."""
    alpha = _alpha(img)
    if img.mode in ("P", "PA", "RGBa", "La"):
        img = img.convert("RGBA")  # palette entries, or premultiplied channels, to plain colours
    if img.mode in _SIXTEEN_BIT_MODES:
        # Pillow's convert() clips 16-bit values at 255; scale them instead.
        pixels = np.asarray(img, dtype=np.uint32) >> 8
        img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    elif img.mode == "F":
        img = Image.fromarray(np.clip(np.asarray(img), 0, 255).astype(np.uint8))
    if alpha is not None:
        canvas = Image.new("RGB", img.size, spec.background_rgb)
        canvas.paste(img.convert("RGB"), mask=alpha)
        img = canvas
    if img.mode not in ("L", "RGB"):
        img = img.convert("RGB")  # Pillow turns some modes (LAB, HSV) into RGB only
    return (img if img.mode == spec.mode else img.convert(spec.mode)), alpha is not None


def _alpha(img: Image.Image) -> Image.Image | None:
    """How opaque each pixel is (mode L), or None where every pixel is: an alpha channel, or a
    transparent colour (PNG's tRNS, GIF's transparent index) in any mode that has one."""
    if img.mode in _ALPHA_MODES or img.mode == "P" and "transparency" in img.info:
        return img.convert("RGBA").getchannel("A")
    transparent = img.info.get("transparency")
    if transparent is None or isinstance(transparent, bytes):
        return None
    pixels = np.asarray(img.convert("L") if img.mode == "1" else img)
    if pixels.ndim == 3:  # RGB: a pixel is transparent when all its channels match
        opaque = (pixels[..., :3] != np.asarray(transparent)[:3]).any(axis=-1)
    else:
        opaque = pixels != transparent
    return Image.fromarray(opaque.astype(np.uint8) * 255)


def _flat(img: Image.Image, transparent: bool) -> Flat | None:
    """``img``'s one colour if every channel spans at most ``FLAT_SPREAD`` levels, else None. A 4x4
    grid of pixels first: they differ in nearly every image, and a scan of all of them costs far more."""
    pixels = img.load()
    width, height = img.size
    grid = [pixels[x, y] for x in {0, width // 3, 2 * width // 3, width - 1}
            for y in {0, height // 3, 2 * height // 3, height - 1}]
    channels = zip(*grid) if isinstance(grid[0], tuple) else (grid,)
    if any(max(channel) - min(channel) > FLAT_SPREAD for channel in channels):
        return None
    extrema = img.getextrema()
    bands = extrema if isinstance(extrema[0], tuple) else (extrema,)
    if any(high - low > FLAT_SPREAD for low, high in bands):
        return None
    middle = [(low + high) // 2 for low, high in bands]
    rgb = middle[:3] if len(middle) >= 3 else middle[:1] * 3
    return Flat("#{:02x}{:02x}{:02x}".format(*rgb), transparent)


def is_flat(img: Image.Image) -> bool:
    """Whether ``img`` is of one flat colour (``_flat``'s rule): such a record gets no perceptual hash."""
    return _flat(img, transparent=False) is not None


def _resize(img: Image.Image, region: Box, spec: ImageSpec) -> Image.Image:
    """Resizes the ``region`` of ``img`` that holds the source image as ``spec`` says.

    The geometry is computed on ``region``: the source's own, in source pixels
    times the draft's 1/s, a power of two, so even the float rounding is the same.
    """
    left, top, right, bottom = region
    width, height = right - left, bottom - top
    scaled = _scaled_size(width, height, spec)
    if scaled is None:
        return img
    try:
        if spec.resize_mode == "center_crop":
            scale = scaled[0] / width
            # min(): the covering side's crop equals the image side up to float rounding.
            crop_w, crop_h = min(width, spec.width / scale), min(height, spec.height / scale)
            left, top = left + (width - crop_w) / 2, top + (height - crop_h) / 2
            box = (left, top, left + crop_w, top + crop_h)
            return resample.resize(img, (spec.width, spec.height), box)
        size = (max(1, round(scaled[0])), max(1, round(scaled[1])))
        unchanged = size == img.size and region == (0, 0, *img.size)
        resized = img if unchanged else resample.resize(img, size, region)
        if spec.resize_mode != "pad":
            return resized
        canvas = Image.new(spec.mode, (spec.width, spec.height))
        canvas.paste(resized, ((spec.width - size[0]) // 2, (spec.height - size[1]) // 2))
        return canvas
    except (OSError, ValueError) as e:
        raise ImageError("resize", f"cannot resize {img.width}x{img.height}: {e}") from e


def _encode(img: Image.Image, spec: ImageSpec) -> bytes:
    stored = spec.stored_format
    if stored == "raw":
        return img.tobytes()
    buf = io.BytesIO()
    try:
        if stored == "jpeg":
            img.save(buf, "JPEG", quality=spec.jpeg_quality)
        else:
            img.save(buf, "PNG")
    except (OSError, ValueError) as e:
        raise ImageError("encode", f"cannot encode {stored}: {e}") from e
    return buf.getvalue()
