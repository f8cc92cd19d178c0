"""Resize benchmark: our kernel's decode + resize beside the other ways to do it, at equal quality.

Every candidate turns the same JPEG bytes into the same 224x224 centre crop
(upright, RGB) and is scored two ways:

* time per image (decode + resize, no encode: the encode is the same JPEG
  encoder for all), one process, images in memory, best of ``--rounds``;
* PSNR against the reference: a full decode (no DCT scaling), turned upright,
  the exact centre crop in source pixels, Lanczos. A candidate must reach
  44 dB on the corpus and, on the hard set, no less than the kernel (pillow)
  itself: there bicubic's own difference from Lanczos on sharp photographs
  keeps every candidate under 44 dB (README, *Image quality*).

Candidates:

  pillow           ``imaging.process_image`` itself (``--image_format raw``):
                   DCT-scaled decode (draft, to ``imaging.DRAFT_GAP`` times the
                   target), bicubic resize of the exact crop box, by Pillow's own
                   loops (``BEAM_PREP_RESIZE_KERNEL=pillow``);
  ours             the same, resized by our kernel (``write/images/resample.py``): the
                   same bytes as ``pillow``, so the same PSNR;
  ..., draft 1x/2x the same, the draft decoding to just above the target, or to
                   twice it: less or more detail kept, fewer or more pixels
                   decoded and resized;
  pyvips           libvips (``pyvips`` + ``pyvips-binary`` wheels): shrink-on-load,
                   the crop rounded to whole pixels (libvips' reduce takes no
                   sub-pixel offset), cubic reduce;
  opencv-area      OpenCV (``opencv-python-headless``): ``IMREAD_REDUCED_*`` decode,
                   the crop rounded to whole pixels, ``INTER_AREA``;
  opencv-exact     OpenCV with the exact crop box: the scaled bicubic kernel as a
                   separable prefilter, then ``warpAffine`` (cubic) at the exact
                   sub-pixel geometry;
  simplejpeg       libjpeg-turbo's M/8 scaled decode (``simplejpeg``), so the
                   remaining resize ratio stays under 8/7, then Pillow's bicubic
                   resize of the exact box.

Two sets: the benchmark corpus (``benchmarks/corpus.py``), and a hard set of
large, small, grayscale and EXIF-rotated photographs.

``--also-python PYTHON`` times ``pillow`` in another environment's interpreter
as well (e.g. one with pillow-simd installed in place of Pillow), in the same
rounds, on the same bytes, and reports its ratio to the stock kernel;
``--accelerated DIR`` does the same with this interpreter and the PIL package in
``DIR`` first on its path (the pillow-simd ``bash .ci/build-pillow-simd DIR`` built).

    python -m benchmarks.bench_resize [--images 300] [--rounds 3] [--accelerated .ci/pillow-simd] [--json out.json]

Candidates whose library is not installed are listed as such; install them
with ``pip install pyvips pyvips-binary opencv-python-headless simplejpeg``.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import pathlib
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image, ImageOps

from beam_prep.write.images import imaging, resample
from beam_prep.write.images.imaging import ImageSpec, process_image
from benchmarks import CACHE_DIR, IMAGE_SIZE, REPO_ROOT, corpus, machine
from benchmarks.report import tables
from benchmarks.results import Recording

SIDE = IMAGE_SIZE
QUALITY_BOUND_DB = 44.0
QUALITY_SLACK_DB = 0.05  # on the hard set: the kernel's own mean, less rounding
# Decode and resize alone: without the perceptual hash a run also takes of each image (its cost is
# bench_writer's run (i) beside (c)), as the other candidates do neither.
_RAW = ImageSpec(height=SIDE, width=SIDE, image_format="raw", perceptual_hash=False)

Candidate = Callable[[bytes], np.ndarray]


def crop_box(width: float, height: float) -> tuple[float, float, float, float]:
    """The centre crop of the output's aspect ratio, in the (upright) source's own pixels."""
    scale = max(SIDE / width, SIDE / height)
    crop_w, crop_h = min(width, SIDE / scale), min(height, SIDE / scale)
    return ((width - crop_w) / 2, (height - crop_h) / 2, (width + crop_w) / 2, (height + crop_h) / 2)


def reference(data: bytes) -> np.ndarray:
    img = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    return np.asarray(img.resize((SIDE, SIDE), Image.Resampling.LANCZOS, box=crop_box(*img.size)))


def psnr(got: np.ndarray, ref: np.ndarray) -> float:
    mse = float(np.mean((got.astype(np.float64) - ref) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def pillow(data: bytes) -> np.ndarray:
    return np.frombuffer(process_image(data, _RAW).data, np.uint8).reshape(SIDE, SIDE, 3)


def _upright_size(data: bytes) -> tuple[int, int]:
    img = Image.open(io.BytesIO(data))
    width, height = img.size
    if imaging._orientation(img) in imaging._SWAPPING_ORIENTATIONS:
        return height, width
    return width, height


def _shrink(width: int, height: int) -> int:
    """The largest DCT scale-down (1, 2, 4, 8) that keeps the crop at least the output size."""
    target = max(SIDE / width, SIDE / height)
    factor = 1
    while factor < 8 and width / (2 * factor) >= width * target and height / (2 * factor) >= height * target:
        factor *= 2
    return factor


def _pyvips() -> Candidate:
    os.environ.setdefault("VIPS_CONCURRENCY", "1")  # one thread, as every other candidate
    import pyvips

    pyvips.cache_set_max(0)

    def run(data: bytes) -> np.ndarray:
        width, height = _upright_size(data)
        factor = _shrink(width, height)
        img = pyvips.Image.jpegload_buffer(data, shrink=factor, autorotate=True)
        if img.bands == 1:
            img = img.colourspace("srgb")
        left, top, right, bottom = (v / factor for v in crop_box(width, height))
        x, y = round(left), round(top)
        w, h = min(img.width - x, round(right - left)), min(img.height - y, round(bottom - top))
        img = img.crop(x, y, w, h)
        if w >= SIDE and h >= SIDE:
            img = img.reduce(w / SIDE, h / SIDE, kernel="cubic")
        else:
            img = img.resize(SIDE / w, vscale=SIDE / h, kernel="cubic")
        out = np.ndarray(buffer=img.write_to_memory(), dtype=np.uint8, shape=(img.height, img.width, img.bands))
        return _fit(out[:, :, :3])

    return run


def _cv2_decode(data: bytes) -> tuple[np.ndarray, tuple[float, float, float, float]]:
    """OpenCV's DCT-scaled decode (RGB) and the centre crop's box on its grid, in its pixels."""
    import cv2

    width, height = _upright_size(data)
    factor = _shrink(width, height)
    flag = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
            8: cv2.IMREAD_REDUCED_COLOR_8}[factor]
    arr = cv2.imdecode(np.frombuffer(data, np.uint8), flag)[:, :, ::-1]  # BGR -> RGB
    return arr, tuple(v / factor for v in crop_box(width, height))


def _opencv_area() -> Candidate:
    import cv2

    cv2.setNumThreads(1)

    def run(data: bytes) -> np.ndarray:
        arr, (left, top, right, bottom) = _cv2_decode(data)
        x, y = round(left), round(top)
        arr = arr[y:y + round(bottom - top), x:x + round(right - left)]
        return cv2.resize(np.ascontiguousarray(arr), (SIDE, SIDE), interpolation=cv2.INTER_AREA)

    return run


def _bicubic_taps(scale: float) -> np.ndarray:
    """Pillow's bicubic (a = -0.5) stretched by ``scale``: the antialiasing prefilter."""
    reach = math.ceil(2 * scale)
    x = np.abs(np.arange(-reach, reach + 1) / scale)
    taps = np.where(x < 1, (1.5 * x - 2.5) * x * x + 1,
                    np.where(x < 2, ((-0.5 * x + 2.5) * x - 4) * x + 2, 0.0))
    return (taps / taps.sum()).astype(np.float32)


def _opencv_exact() -> Candidate:
    import cv2

    cv2.setNumThreads(1)

    def run(data: bytes) -> np.ndarray:
        arr, (left, top, right, bottom) = _cv2_decode(data)
        # Only the crop and a margin for the filters.
        x0, y0 = max(0, int(left) - 8), max(0, int(top) - 8)
        arr = np.ascontiguousarray(arr[y0:int(bottom) + 9, x0:int(right) + 9])
        sx, sy = (right - left) / SIDE, (bottom - top) / SIDE
        if sx > 1 or sy > 1:
            arr = cv2.sepFilter2D(arr, -1, _bicubic_taps(max(sx, 1)), _bicubic_taps(max(sy, 1)),
                                  borderType=cv2.BORDER_REPLICATE)
        # Output pixel centre x + 0.5 samples the source at left + (x + 0.5) * sx.
        inverse = np.array([[sx, 0, left - x0 + 0.5 * sx - 0.5], [0, sy, top - y0 + 0.5 * sy - 0.5]])
        return cv2.warpAffine(arr, inverse, (SIDE, SIDE), flags=cv2.INTER_CUBIC | cv2.WARP_INVERSE_MAP,
                              borderMode=cv2.BORDER_REPLICATE)

    return run


def _simplejpeg() -> Candidate:
    import simplejpeg

    def run(data: bytes) -> np.ndarray:
        img = Image.open(io.BytesIO(data))
        orientation = imaging._orientation(img)
        if img.format != "JPEG" or img.mode != "RGB" or orientation != 1:
            return pillow(data)  # only the plain case is worth a second decoder
        width, height = img.size
        scale = max(SIDE / width, SIDE / height)
        arr = simplejpeg.decode_jpeg(data, "RGB", min_height=math.ceil(height * scale),
                                     min_width=math.ceil(width * scale))
        # libjpeg-turbo scales by M/8: find M from the size it decoded to.
        m = next(m for m in range(1, 9) if math.ceil(width * m / 8) == arr.shape[1])
        box = tuple(v * m / 8 for v in crop_box(width, height))
        return np.asarray(Image.fromarray(arr).resize((SIDE, SIDE), Image.Resampling.BICUBIC, box=box))

    return run


def _fit(arr: np.ndarray) -> np.ndarray:
    """Pads or trims a whole-pixel candidate's rounding to exactly SIDE x SIDE."""
    out = np.zeros((SIDE, SIDE, 3), np.uint8)
    h, w = min(SIDE, arr.shape[0]), min(SIDE, arr.shape[1])
    out[:h, :w] = arr[:h, :w]
    return out


def _ours(kernel: str, draft_gap: float) -> Callable[[], Candidate]:
    """``process_image`` itself, resizing with ``kernel`` (``resample.KERNEL``: ours; ``PILLOW``:
    Pillow's loops) after a draft decode to ``draft_gap`` times the target."""
    def make() -> Candidate:
        if kernel == resample.KERNEL and resample.available() != resample.KERNEL:
            raise ImportError("the resize kernel is not built here")

        def run(data: bytes) -> np.ndarray:
            if os.environ.get(resample.KERNEL_VARIABLE) != kernel:
                os.environ[resample.KERNEL_VARIABLE] = kernel
            imaging.DRAFT_GAP = draft_gap
            return pillow(data)

        return run

    return make


CANDIDATES: dict[str, Callable[[], Candidate]] = {
    "pillow": _ours(resample.PILLOW, imaging.DRAFT_GAP),
    "ours": _ours(resample.KERNEL, imaging.DRAFT_GAP),
    "pillow, draft 1x": _ours(resample.PILLOW, 1.0),
    "ours, draft 1x": _ours(resample.KERNEL, 1.0),
    "ours, draft 2x": _ours(resample.KERNEL, 2.0),
    "pyvips": _pyvips,
    "opencv-area": _opencv_area,
    "opencv-exact": _opencv_exact,
    "simplejpeg": _simplejpeg,
}


def hard_set() -> list[bytes]:
    """Large, small, grayscale and EXIF-rotated photographs, at odd sizes."""
    photos = corpus.load_photos()
    out = []
    for i, (width, height, grey, orientation) in enumerate([
        (4001, 3003, False, 1), (3263, 2449, False, 6), (2999, 4001, True, 1), (1501, 999, False, 8),
        (641, 479, True, 3), (301, 227, False, 1), (225, 331, False, 6), (512, 511, True, 1),
        (1023, 769, False, 5), (767, 1025, False, 1), (2047, 1537, True, 6), (999, 701, False, 1),
    ]):
        src = photos[i % len(photos)]
        img = src.resize((width, height), Image.Resampling.LANCZOS)
        img = img.convert("L") if grey else img
        exif = Image.Exif()
        stored = img
        if orientation != 1:
            exif[0x0112] = orientation
            # Store the pixels so that the tag turns them back upright.
            inverse = {3: Image.Transpose.ROTATE_180, 6: Image.Transpose.ROTATE_90,
                       8: Image.Transpose.ROTATE_270, 5: Image.Transpose.TRANSPOSE}[orientation]
            stored = img.transpose(inverse)
        buf = io.BytesIO()
        stored.save(buf, "JPEG", quality=92, exif=exif)
        out.append(buf.getvalue())
    return out


def time_candidate(run: Candidate, blobs: Sequence[bytes]) -> float:
    """Seconds per image, one pass."""
    start = time.perf_counter()
    for data in blobs:
        run(data)
    return (time.perf_counter() - start) / len(blobs)


def _child(blob_file: str, rounds: int) -> None:
    """``--also-python``'s side: times ``pillow`` here and prints JSON (its PSNR list too)."""
    sets = pickle.loads(pathlib.Path(blob_file).read_bytes())
    from importlib import metadata

    dist = next((d for d in ("pillow-simd", "pillow") if _has_dist(metadata, d)), "pillow")
    result = {"library": f"{dist} {Image.__version__}", "sets": {}}
    for name, blobs in sets.items():
        refs = [reference(b) for b in blobs]
        outs = [pillow(b) for b in blobs]
        result["sets"][name] = {"psnr": [psnr(o, r) for o, r in zip(outs, refs)],
                                "seconds": [time_candidate(pillow, blobs) for _ in range(rounds)]}
    print(json.dumps(result))


def _has_dist(metadata, name: str) -> bool:
    try:
        metadata.distribution(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def _mean(scores: Sequence[float]) -> float:
    return float(np.mean([min(s, 99.0) for s in scores]))  # an identical image counts as 99 dB


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--images", type=int, default=300, help="corpus images timed (default 300)")
    parser.add_argument("--rounds", type=int, default=3, help="timed passes per candidate; best kept (default 3)")
    parser.add_argument("--also-python", help="another interpreter whose PIL (e.g. pillow-simd) runs `pillow` too")
    parser.add_argument("--accelerated", type=pathlib.Path, metavar="DIR",
                        help="also time `pillow` with the PIL package in DIR (e.g. .ci/pillow-simd) first on the path")
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here as JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.rounds)
        return
    if args.accelerated is not None and not (args.accelerated / "PIL").is_dir():
        parser.error(f"--accelerated {args.accelerated} holds no PIL package")
    recording = Recording("resize", argv)

    photos = corpus.load_photos()
    sets = {"corpus": [corpus.render(i, photos)[0] for i in range(args.images)], "hard": hard_set()}
    available: dict[str, Candidate] = {}
    missing = []
    for name, make in CANDIDATES.items():
        try:
            available[name] = make()
        except ImportError:
            missing.append(name)
    other = None
    if args.also_python or args.accelerated:
        env = None
        if args.accelerated:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                filter(None, [str(args.accelerated.resolve()), os.environ.get("PYTHONPATH")]))}
        CACHE_DIR.mkdir(exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=CACHE_DIR, suffix=".pickle") as f:
            f.write(pickle.dumps(sets))
            f.flush()
            proc = subprocess.run([args.also_python or sys.executable, "-m", "benchmarks.bench_resize",
                                   "--child", f.name, "--rounds", str(args.rounds)],
                                  cwd=REPO_ROOT, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            sys.exit(f"--also-python failed:\n{proc.stderr[-2000:]}")
        other = json.loads(proc.stdout.strip().splitlines()[-1])

    table_rows = []
    for set_name, blobs in sets.items():
        refs = [reference(b) for b in blobs]
        rows = {}
        for name, run in available.items():
            scores = [psnr(run(b), r) for b, r in zip(blobs, refs)]
            rows[name] = (scores, min(time_candidate(run, blobs) for _ in range(args.rounds)))
        if other:
            data = other["sets"][set_name]
            rows[other["library"]] = (data["psnr"], min(data["seconds"]))
        base_scores, base = rows["pillow"]
        base_mean = _mean(base_scores)
        for name, (scores, seconds) in rows.items():
            mean = _mean(scores)
            bound = QUALITY_BOUND_DB if set_name == "corpus" else base_mean - QUALITY_SLACK_DB
            ok = "yes" if mean >= bound else "no"
            median, tenth = np.percentile([min(v, 99.0) for v in scores], [50, 10])
            table_rows.append({"candidate": name, "set": set_name, "images": len(blobs), "seconds": seconds,
                               "vs_pillow": base / seconds, "psnr_median": float(median),
                               "psnr_10th": float(tenth), "psnr_min": float(min(scores)),
                               "psnr_mean_vs_pillow": mean - base_mean, "quality_kept": ok == "yes"})
    print(tables.resize({"rows": table_rows}))
    if missing:
        print(f"\nnot installed: {', '.join(missing)}")
    print(f"\nMachine: {machine.describe(machine.machine_info())}")
    recording.write(args.json, {"images": args.images, "rounds": args.rounds, "rows": table_rows,
                                "not_installed": missing})


if __name__ == "__main__":
    main()
