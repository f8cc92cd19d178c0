"""A deterministic, ImageNet-like corpus of labelled JPEGs, cached between runs.

Writer throughput depends on what the images are: decode time grows with pixel
count and JPEG entropy, so flat colours or noise would make any number
meaningless. The corpus is therefore made of real photographs (the sample
photos that ship inside scikit-image, so no download is needed), varied by
crop, rescale, flip, colour shift and a little sensor-like grain, and saved at
ImageNet-like sizes and JPEG qualities in ``root/<label>/<image>.jpg``.

Image ``i`` depends only on ``i`` and ``CORPUS_VERSION``, so corpora of
different sizes share their images and every run of a given size benchmarks the
same bytes. Change ``CORPUS_VERSION`` whenever the recipe changes: the cache is
keyed by it and stale corpora are rebuilt (and removed).
"""
from __future__ import annotations

import dataclasses
import io
import json
import logging
import math
import multiprocessing
import os
import pathlib
import shutil
import time

import numpy as np
from PIL import Image, ImageChops, ImageOps

log = logging.getLogger(__name__)

CORPUS_VERSION = 1
SEED = 20240501

# Colour photographs in scikit-image's wheel (skimage/data/*.png|jpg): they load
# offline. The other skimage.data images are grey, synthetic, microscopy, or
# fetched over the network.
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "motorcycle_left", "motorcycle_right")

MAX_CLASSES = 100
MIN_IMAGES_PER_CLASS = 20
# Longer side in pixels: most ImageNet photos are 300-640 px, about a tenth ~1000 px.
USUAL_LONG_SIDE = (300, 640)
LARGE_LONG_SIDE = (900, 1100)
LARGE_FRACTION = 0.10
# width / height, landscape-heavy like ImageNet.
ASPECTS = (4 / 3, 3 / 2, 1.0, 16 / 9, 3 / 4, 2 / 3)
ASPECT_WEIGHTS = (0.40, 0.20, 0.12, 0.08, 0.12, 0.08)
JPEG_QUALITY = (75, 95)
INFO_NAME = "corpus.json"
IMAGES_DIR = "images"


@dataclasses.dataclass(frozen=True)
class Corpus:
    """A built corpus: ``root`` is the image tree a pipeline reads."""

    root: pathlib.Path
    images: int
    classes: int
    build_seconds: float
    build_processes: int
    total_bytes: int
    mean_width: float
    mean_height: float
    cached: bool

    def files(self) -> list[pathlib.Path]:
        """All image paths, sorted, so samples taken from them are reproducible."""
        return sorted(self.root.glob("*/*.jpg"))

    def summary(self) -> dict[str, object]:
        """The corpus as JSON; its root relative to the cache's parent (``.cache/corpus-...``), so a
        committed record names no path of the machine it ran on."""
        info = dataclasses.asdict(self)
        info["root"] = str(self.root.relative_to(self.root.parents[2])) if len(self.root.parents) > 2 else str(
            self.root)
        return info


def num_classes(images: int) -> int:
    """100 classes as in the benchmark brief, fewer for small corpora so each has ~20 images."""
    return max(1, min(MAX_CLASSES, images // MIN_IMAGES_PER_CLASS))


def ensure_corpus(images: int, cache_dir: pathlib.Path, processes: int | None = None) -> Corpus:
    """Returns the cached corpus of ``images`` images, building it first if missing or stale."""
    if images < 1:
        raise ValueError(f"a corpus needs at least one image, not {images}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale(cache_dir)
    final = cache_dir / f"corpus-v{CORPUS_VERSION}-{images}"
    cached = _load(final, images)
    if cached is not None:
        log.info("corpus of %d images found in cache at %s", images, final)
        return cached
    return _build(final, images, processes or os.cpu_count() or 1)


def _remove_stale(cache_dir: pathlib.Path) -> None:
    """Deletes corpora of other versions: at 40k images each is a few GB."""
    current = f"corpus-v{CORPUS_VERSION}-"
    for path in cache_dir.glob("corpus-v*"):
        if path.is_dir() and not path.name.startswith(current):
            log.info("removing stale corpus %s", path)
            shutil.rmtree(path)


def _load(final: pathlib.Path, images: int) -> Corpus | None:
    try:
        info = json.loads((final / INFO_NAME).read_text())
    except (OSError, ValueError):
        return None
    if info.get("version") != CORPUS_VERSION or info.get("images") != images:
        return None
    return Corpus(
        root=final / IMAGES_DIR,
        images=images,
        classes=info["classes"],
        build_seconds=info["build_seconds"],
        build_processes=info["build_processes"],
        total_bytes=info["total_bytes"],
        mean_width=info["mean_width"],
        mean_height=info["mean_height"],
        cached=True,
    )


def _build(final: pathlib.Path, images: int, processes: int) -> Corpus:
    """Writes into a ``.partial`` folder and renames it last, so an interrupted build is redone."""
    partial = final.with_name(final.name + ".partial")
    for path in (partial, final):
        if path.exists():
            shutil.rmtree(path)
    classes = num_classes(images)
    for label in range(classes):
        (partial / IMAGES_DIR / _label_name(label)).mkdir(parents=True)
    log.info("building a corpus of %d images in %d classes with %d processes", images, classes, processes)
    # Loaded here first: a worker whose initializer raises is restarted by the pool forever, so a
    # missing scikit-image would hang the build instead of failing it.
    load_photos()
    start = time.perf_counter()
    sizes = []
    tasks = ((i, classes, str(partial / IMAGES_DIR)) for i in range(images))
    chunk = max(1, min(64, images // (processes * 8)))
    with multiprocessing.Pool(processes, initializer=_init_worker) as pool:
        for done, result in enumerate(pool.imap_unordered(_write_image, tasks, chunksize=chunk), 1):
            sizes.append(result)
            if done % max(1, images // 10) == 0:
                log.info("corpus: %d/%d images", done, images)
    seconds = time.perf_counter() - start
    n_bytes, widths, heights = (np.array(column, dtype=np.float64) for column in zip(*sizes, strict=True))
    info = {
        "version": CORPUS_VERSION,
        "images": images,
        "classes": classes,
        "build_seconds": round(seconds, 2),
        "build_processes": processes,
        "total_bytes": int(n_bytes.sum()),
        "mean_width": round(float(widths.mean()), 1),
        "mean_height": round(float(heights.mean()), 1),
    }
    (partial / INFO_NAME).write_text(json.dumps(info, indent=2))
    partial.rename(final)
    log.info("corpus of %d images built in %.1f s", images, seconds)
    loaded = _load(final, images)
    assert loaded is not None  # just written
    return dataclasses.replace(loaded, cached=False)


def _label_name(label: int) -> str:
    return f"class_{label:03d}"


# Per worker process: the decoded source photographs, loaded once.
_SOURCES: list[Image.Image] = []


def _init_worker() -> None:
    _SOURCES.extend(load_photos())


def load_photos() -> list[Image.Image]:
    """The source photographs as RGB Pillow images, in ``PHOTOS`` order."""
    import skimage.data  # Only the corpus builder needs scikit-image.

    left, right, _ = skimage.data.stereo_motorcycle()
    arrays = {
        "astronaut": skimage.data.astronaut(),
        "coffee": skimage.data.coffee(),
        "chelsea": skimage.data.chelsea(),
        "rocket": skimage.data.rocket(),
        "motorcycle_left": left,
        "motorcycle_right": right,
    }
    return [Image.fromarray(arrays[name]).convert("RGB") for name in PHOTOS]


def _write_image(task: tuple[int, int, str]) -> tuple[int, int, int]:
    index, classes, root = task
    data, width, height = render(index, _SOURCES)
    path = os.path.join(root, _label_name(index % classes), f"img_{index:06d}.jpg")
    with open(path, "wb") as f:
        f.write(data)
    return len(data), width, height


def render(index: int, sources: list[Image.Image]) -> tuple[bytes, int, int]:
    """Image ``index`` of the corpus as JPEG bytes, with its width and height."""
    rng = np.random.default_rng([SEED, CORPUS_VERSION, index])
    src = sources[int(rng.integers(len(sources)))]
    low, high = LARGE_LONG_SIDE if rng.random() < LARGE_FRACTION else USUAL_LONG_SIDE
    long_side = int(rng.integers(low, high + 1))
    aspect = float(rng.choice(ASPECTS, p=ASPECT_WEIGHTS))
    if aspect >= 1:
        width, height = long_side, round(long_side / aspect)
    else:
        width, height = round(long_side * aspect), long_side

    # A crop of the output's aspect ratio covering 35-100% of the largest such crop.
    src_w, src_h = src.size
    max_w = min(src_w, src_h * aspect)
    scale = math.sqrt(rng.uniform(0.35, 1.0))
    crop_w, crop_h = max_w * scale, max_w / aspect * scale
    x0, y0 = rng.uniform(0, src_w - crop_w), rng.uniform(0, src_h - crop_h)
    img = src.resize((width, height), Image.Resampling.LANCZOS, box=(x0, y0, x0 + crop_w, y0 + crop_h))
    if rng.random() < 0.5:
        img = ImageOps.mirror(img)

    img = img.convert("RGB", _colour_shift(rng))
    # Grain: camera photos carry sensor noise that rescaled samples lose; it
    # keeps JPEG sizes (and so decode cost) nearer real photographs'.
    grain = rng.standard_normal((height, width), dtype=np.float32) * np.float32(rng.uniform(2.0, 4.0))
    grain_img = Image.fromarray(np.clip(grain + 128.5, 0, 255).astype(np.uint8), "L").convert("RGB")
    img = ImageChops.add(img, grain_img, offset=-128)

    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=int(rng.integers(JPEG_QUALITY[0], JPEG_QUALITY[1] + 1)))
    return buf.getvalue(), width, height


def _colour_shift(rng: np.random.Generator) -> tuple[float, ...]:
    """A random white balance, saturation, contrast and brightness as one 3x4 matrix.

    One affine matrix lets Pillow apply all four in C, in a single pass.
    """
    gains = np.diag(rng.uniform(0.85, 1.15, 3))
    saturation = rng.uniform(0.7, 1.3)
    towards_grey = saturation * np.eye(3) + (1 - saturation) / 3 * np.ones((3, 3))
    contrast = rng.uniform(0.8, 1.2)
    offset = 128 * (1 - contrast) + rng.uniform(-20, 20)
    linear = contrast * towards_grey @ gains
    return tuple(np.column_stack([linear, np.full(3, offset)]).ravel().tolist())
