"""Real photographs for the near-duplicate benchmark, and the copies a scraped tree holds of them.

Two public sets, fetched from PyPI at run time and cached (``real_images.cache_root``):
the photographs among Pillow's test images (``tests/real_images.py``), and
scikit-image's bundled data (its wheel's ``skimage/data``: photographs, and 200
faces of Labeled Faces in the Wild, 25x25). Too few for a false-pair rate per
million pairs, so the larger photographs are also cut into non-overlapping
256x256 tiles: other pictures, of the same scenes, a harder test than unrelated
photos (neighbouring tiles share light, colour and texture).
"""
from __future__ import annotations

import io
import pathlib
import subprocess
import sys
import zipfile

import numpy as np
from PIL import Image, ImageOps

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from real_images import cache_root, pillow_corpus

# The photographs among Pillow's test images, one file each (Tests/images holds many copies of some).
PILLOW_PHOTOS = ("flower.jpg", "flower2.jpg", "exif_gps_typeerror.jpg", "iptc.jpg", "icc_profile_big.jpg",
                 "junk_jpeg_header.jpg", "sugarshack_bad_mpo_header.jpg", "ultrahdr.jpg", "xmp_test.jpg",
                 "truncated_exif_dpi.jpg", "exif-72dpi-int.jpg", "invalid-exif-without-x-resolution.jpg",
                 "old-style-jpeg-compression.png", "hopper.jpg", "uncompressed_rgb.png")
SKIMAGE_PHOTOS = ("astronaut.png", "camera.png", "chelsea.png", "coffee.png", "rocket.jpg",
                  "hubble_deep_field.jpg", "motorcycle_left.png", "grass.png", "gravel.png", "brick.png",
                  "coins.png", "moon.png", "retina.jpg", "page.png", "immunohistochemistry.png", "cell.png",
                  "microaneurysms.png", "text.png", "clock_motion.png")
SKIMAGE_VERSION = "0.26.0"
TILE = 256


def skimage_data() -> pathlib.Path:
    """scikit-image's data folder, from its wheel (no install: only the files are read)."""
    final = cache_root() / f"skimage-data-{SKIMAGE_VERSION}"
    if not final.is_dir():
        wheels = cache_root() / "wheels"
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                        "--disable-pip-version-check", f"scikit-image=={SKIMAGE_VERSION}", "-d", str(wheels)],
                       check=True, capture_output=True)
        wheel = next(wheels.glob(f"scikit_image-{SKIMAGE_VERSION}-*.whl"))
        staged = final.with_name(final.name + ".part")
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.startswith("skimage/data/") and not name.endswith("/"):
                    (staged / pathlib.PurePosixPath(name).name).parent.mkdir(parents=True, exist_ok=True)
                    (staged / pathlib.PurePosixPath(name).name).write_bytes(z.read(name))
        staged.rename(final)
    return final


def _load(path: pathlib.Path) -> Image.Image | None:
    try:
        with Image.open(path) as img:
            img.load()
            return ImageOps.exif_transpose(img).convert("RGB")
    except (OSError, ValueError, SyntaxError):
        return None


def photographs() -> dict[str, Image.Image]:
    """Every source picture by name: the photographs, their tiles, and the faces."""
    pillow = pillow_corpus()
    by_name = {pathlib.PurePosixPath(n).name: n for n in pillow.names}
    found: dict[str, Image.Image] = {}
    for name in PILLOW_PHOTOS:
        if name in by_name and (img := _load(pillow.path(by_name[name]))) is not None:
            found[f"pillow/{name}"] = img
    data = skimage_data()
    for name in SKIMAGE_PHOTOS:
        if (data / name).is_file() and (img := _load(data / name)) is not None:
            found[f"skimage/{name}"] = img
    pictures = dict(found)
    for name, img in found.items():
        for top in range(0, img.height - TILE + 1, TILE):
            for left in range(0, img.width - TILE + 1, TILE):
                if img.width >= 2 * TILE or img.height >= 2 * TILE:
                    pictures[f"{name}#tile{top},{left}"] = img.crop((left, top, left + TILE, top + TILE))
    faces = np.load(data / "lfw_subset.npy")
    for i, face in enumerate(faces):
        pictures[f"skimage/lfw_subset#{i}"] = Image.fromarray((face * 255).round().astype(np.uint8), "L")
    return pictures


def _reencoded(img: Image.Image) -> Image.Image:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=50)
    return Image.open(io.BytesIO(buf.getvalue()))


def _cropped(img: Image.Image) -> Image.Image:
    """10% of each side cut off, 5% at each edge."""
    dx, dy = round(img.width * 0.05), round(img.height * 0.05)
    return img.crop((dx, dy, img.width - dx, img.height - dy))


def _colour_shifted(img: Image.Image) -> Image.Image:
    pixels = np.asarray(img.convert("RGB"), dtype=np.int16) + np.array([24, 0, -24], dtype=np.int16)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")


# The copies a scraped tree holds, by name.
TRANSFORMS = {
    "re-encode at JPEG quality 50": _reencoded,
    "downscale by half": lambda img: img.resize((max(1, img.width // 2), max(1, img.height // 2)),
                                                Image.Resampling.BICUBIC),
    "10% crop": _cropped,
    "rotation by 3 degrees": lambda img: img.rotate(3, Image.Resampling.BICUBIC),
    "colour shift (R +24, B -24)": _colour_shifted,
}
