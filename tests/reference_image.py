"""An independent reference for what a record should hold, and how to compare a record with it.

Written from what a user expects, not from beam_prep's code: a strict full decode
(a truncated or damaged file is rejected, never padded), the first frame, EXIF
orientation applied, 16-bit samples scaled to 8 bits, every kind of transparency
shown on white, the exact centre box resized with Lanczos in one step. beam_prep
resizes with bicubic, may decode a JPEG at 1/2..1/8 scale first and stores JPEG
q90: the comparison allows for those (a PSNR bound), not for a wrong image.
"""
from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
from PIL import Image, ImageFile, ImageOps

# Scaled by >> 8; "I" too: 32-bit in name, 16-bit samples in the PNG and TIFF files that give it.
_SIXTEEN_BIT = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I"})
_ALPHA = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
# The decode errors Pillow raises for a file it cannot read, as a strict decoder sees them.
DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)


class Rejected(Exception):
    """The strict decoder refuses the file; ``stage`` is where beam-prep must report it."""

    def __init__(self, stage: str, reason: str) -> None:
        super().__init__(f"{stage}: {reason}")
        self.stage = stage
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Target:
    """The output asked for: center_crop to ``height`` x ``width``, or shorter_side to ``height``."""

    height: int = 224
    width: int = 224
    channels: int = 3
    resize_mode: str = "center_crop"
    max_pixels: int = 100_000_000


def strict_decode(path, max_pixels: int = Target.max_pixels) -> Image.Image:
    """The first frame, fully decoded with truncated files refused, upright.

    Raises:
      Rejected: stage ``too_large`` over ``max_pixels`` (or Pillow's own bomb limit), else ``decode``.
    """
    previous, ImageFile.LOAD_TRUNCATED_IMAGES = ImageFile.LOAD_TRUNCATED_IMAGES, False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Pillow's notes on odd files: a refusal is an exception
            with Image.open(path) as img:
                if img.width * img.height > max_pixels:
                    raise Rejected("too_large", f"{img.width}x{img.height} over {max_pixels} pixels")
                img.load()
                return ImageOps.exif_transpose(img)
    except Image.DecompressionBombError as e:
        raise Rejected("too_large", str(e)) from e
    except DECODE_ERRORS as e:
        raise Rejected("decode", f"{type(e).__name__}: {e}") from e
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = previous


def on_white(img: Image.Image) -> Image.Image:
    """8-bit RGB or L, 16-bit scaled by >> 8, anything transparent composited on white."""
    transparency = img.info.get("transparency")
    if img.mode in _SIXTEEN_BIT or img.mode == "F":
        values = np.asarray(img)
        eight = np.clip(values.astype(np.int64) >> 8 if img.mode != "F" else values, 0, 255).astype(np.uint8)
        if isinstance(transparency, int) and img.mode != "F":
            alpha = np.where(values == transparency, 0, 255).astype(np.uint8)
            return _composite(Image.merge("LA", (Image.fromarray(eight), Image.fromarray(alpha))))
        return Image.fromarray(eight)
    if img.mode in _ALPHA or img.mode == "P" or transparency is not None:
        return _composite(img)  # P without transparency converts opaque
    return img if img.mode in ("RGB", "L") else img.convert("RGB")


def _composite(img: Image.Image) -> Image.Image:
    rgba = img.convert("RGBA")
    white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(white, rgba).convert("RGB")


def resized(img: Image.Image, target: Target) -> Image.Image:
    """center_crop: the exact centre box, in float coordinates; shorter_side: the whole image."""
    width, height = img.size
    if target.resize_mode == "center_crop":
        scale = max(target.width / width, target.height / height)
        # min(): the side that fits exactly equals the image's, but for float rounding.
        crop_w, crop_h = min(width, target.width / scale), min(height, target.height / scale)
        left, top = (width - crop_w) / 2, (height - crop_h) / 2
        box = (left, top, left + crop_w, top + crop_h)
        return img.resize((target.width, target.height), Image.Resampling.LANCZOS, box=box)
    if target.resize_mode == "shorter_side":
        scale = target.height / min(width, height)
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        return img.resize(size, Image.Resampling.LANCZOS)
    raise ValueError(f"no reference for resize_mode {target.resize_mode!r}")


def reference(path, target: Target = Target()) -> np.ndarray:
    """The pixels a record of ``path`` should hold: HxWx3, or HxW for one channel, uint8.

    Raises:
      Rejected: where the strict decoder refuses the file.
    """
    img = on_white(strict_decode(path, target.max_pixels))
    img = img.convert("RGB" if target.channels == 3 else "L")
    return np.asarray(resized(img, target))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 arrays of one shape, in dB (inf when equal)."""
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse)


def turned(pixels: np.ndarray) -> dict[str, np.ndarray]:
    """The seven other ways an image can lie (what a missed or wrong EXIF rotation gives)."""
    views = {"flip_x": pixels[:, ::-1], "flip_y": pixels[::-1], "rotate_180": pixels[::-1, ::-1]}
    if pixels.shape[0] == pixels.shape[1]:
        swapped = pixels.swapaxes(0, 1)
        views |= {"transpose": swapped, "rotate_90": swapped[::-1], "rotate_270": swapped[:, ::-1],
                  "transverse": swapped[::-1, ::-1]}
    return views


# A record matches its reference when all these hold (measured on Pillow 12.3.0's test images, README
# "Tested on real images"): the lowest PSNR of a correct record was 21.9 dB, text upscaled 1.27x where
# bicubic and Lanczos part most and q90 blurs the edges; a wrong image scores 5-15 dB.
MIN_PSNR = 20.0
# The largest difference of a channel's mean, in 8-bit levels: a tint, a channel swap, a dark
# 16-bit image pass a loose PSNR bound on smooth images, not this (correct records: at most 4.8).
MAX_MEAN_SHIFT = 8.0
# Where the reference has structure (a standard deviation of STRUCTURE_STD levels or more), the
# record's pixels must follow it: black, flat or shuffled output of a dark image with thin light
# strokes passes the PSNR bound, not this (correct records: 0.93 and up).
STRUCTURE_STD = 8.0
MIN_CORRELATION = 0.9
# Nearer a turned reference than the upright one by more than this is a missed or wrong rotation.
TURN_TOLERANCE_DB = 0.1


def mismatch(got: np.ndarray, want: np.ndarray) -> str | None:
    """Why ``got`` is not the image ``want`` is, with the figures; None when it is.

    Black or garbage output fails the PSNR bound, or the correlation where the reference is
    dark with thin light strokes; a sideways or mirrored one is nearer a turned reference
    than the upright one (an image nearly symmetric under a turn looks right turned, and
    is then nearly as near either way, within TURN_TOLERANCE_DB).
    """
    if got.shape != want.shape:
        return f"shape {got.shape}, the reference's {want.shape}"
    upright = psnr(got, want)
    if upright < MIN_PSNR:
        return f"PSNR {upright:.1f} dB, under {MIN_PSNR:.0f} dB (mean {got.mean():.1f}, reference {want.mean():.1f})"
    channels = got.shape[2] if got.ndim == 3 else 1
    shift = np.abs(got.reshape(-1, channels).mean(0) - want.reshape(-1, channels).mean(0)).max()
    if shift > MAX_MEAN_SHIFT:
        return f"a channel's mean is {shift:.1f} levels off (PSNR {upright:.1f} dB)"
    if want.std() >= STRUCTURE_STD:
        follows = correlation(got, want)
        if follows < MIN_CORRELATION:
            return f"correlation with the reference {follows:.2f}, under {MIN_CORRELATION} (PSNR {upright:.1f} dB)"
    for turn, view in turned(want).items():
        if psnr(got, view) > upright + TURN_TOLERANCE_DB:
            return f"nearer the reference turned {turn} ({psnr(got, view):.1f} dB) than upright ({upright:.1f} dB)"
    return None


def correlation(got: np.ndarray, want: np.ndarray) -> float:
    """Pearson's correlation of the two images' samples; 0 where ``got`` is flat."""
    a, b = got.astype(np.float64).ravel(), want.astype(np.float64).ravel()
    return 0.0 if a.std() == 0 or b.std() == 0 else float(np.corrcoef(a, b)[0, 1])
