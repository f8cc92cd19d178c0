"""The perceptual hash against its reference, ``imagehash.phash``, on the real-image set, and
the properties the near-duplicate search relies on."""
from __future__ import annotations

import dataclasses
import io

import imagehash
import numpy as np
import pytest
import scipy.fftpack
from PIL import Image
from real_images import pillow_corpus

from beam_prep.tools.sample import picture
from beam_prep.write.images import phash as phash_module
from beam_prep.write.images import resample, resample_loader
from beam_prep.write.images.imaging import ImageSpec, process_image
from beam_prep.write.images.phash import distance, phash


def _reference(image: Image.Image) -> tuple[int, np.ndarray, float]:
    """imagehash's hash of the box-shrunk greyscale image as an int, and its coefficients and median
    (to tell a tie from a bug)."""
    thumbnail = image.convert("L").resize((32, 32), Image.Resampling.BOX)
    pixels = np.asarray(thumbnail)
    low = scipy.fftpack.dct(scipy.fftpack.dct(pixels, axis=0), axis=1)[:8, :8]
    return int(str(imagehash.phash(thumbnail)), 16), low.ravel(), float(np.median(low))


@pytest.mark.slow
def test_phash_is_imagehash_phash_on_the_real_images():
    """Bit for bit, but where imagehash's own coefficient lies within float noise of its median
    (a symmetric image's zero coefficients): there either side is right."""
    corpus = pillow_corpus()
    compared = exact = 0
    for name in corpus.names:
        try:
            with Image.open(corpus.path(name)) as image:
                image.load()
                ours = phash(image)
                reference, low, median = _reference(image)
        except Exception:  # noqa: BLE001, S112 - the corpus holds broken files on purpose; they make no record
            continue
        compared += 1
        differing = [i for i in range(64) if (ours ^ reference) >> (63 - i) & 1]
        assert all(abs(low[i] - median) < 1e-6 * max(1.0, abs(median)) for i in differing), name
        exact += not differing
    assert compared > 500 and exact > 0.8 * compared


def test_near_copies_are_near_and_other_pictures_far():
    """A re-encode and a half-size copy keep their hash within a few bits; another picture is
    about half the bits away."""
    image = picture(3, 256, 192)
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=50)
    reencoded = Image.open(io.BytesIO(buf.getvalue()))
    half = image.resize((128, 96), Image.Resampling.BILINEAR)
    base = phash(image)
    assert distance(base, phash(reencoded)) <= 4
    assert distance(base, phash(half)) <= 4
    assert distance(base, phash(picture(4, 256, 192))) >= 16


def test_the_hash_is_64_bits_first_coefficient_highest():
    """A flat image: only the DC coefficient is above the (zero) median, and it is the top bit."""
    assert phash(Image.new("RGB", (40, 30), "gray")) == 1 << 63


@pytest.mark.parametrize("mode", ["center_crop", "pad", "shorter_side"])
def test_a_record_carries_the_hash_of_the_image_it_stores(mode):
    """The worker hashes the image as written (oriented, cropped, resized), not the source: a
    lossless record decodes to the very pixels hashed."""
    buf = io.BytesIO()
    picture(6, 300, 170).save(buf, "JPEG", quality=95)
    outcome = process_image(buf.getvalue(), ImageSpec(height=64, width=64, resize_mode=mode, image_format="png"))
    stored = Image.open(io.BytesIO(outcome.data))
    assert outcome.phash == phash(stored) == _reference(stored)[0]
    source = Image.open(io.BytesIO(buf.getvalue()))
    if mode == "shorter_side":  # the whole picture, smaller: the source's hash, or a crossing from it
        assert distance(outcome.phash, phash(source)) <= 2
    else:  # a part of the source, or a border around it: another thumbnail
        assert outcome.phash != phash(source)


def test_a_run_for_exact_copies_only_hashes_nothing():
    """--near_duplicate_distance -1 turns the hash off in the workers (its cost measured against it)."""
    buf = io.BytesIO()
    picture(5, 64, 48).save(buf, "JPEG")
    assert process_image(buf.getvalue(), ImageSpec(height=16, width=16)).phash is not None
    assert process_image(buf.getvalue(), ImageSpec(height=16, width=16, perceptual_hash=False)).phash is None


def test_the_distance_of_arrays_is_the_distance_of_each_pair_with_numpy_2_or_without(monkeypatch):
    """One Hamming distance for ints and uint64 arrays (broadcast), the same through numpy 1.26's
    byte table as through numpy 2's bitwise_count."""
    rng = np.random.default_rng(7)
    a = rng.integers(0, 2**64 - 1, size=50, dtype=np.uint64, endpoint=True)
    b = rng.integers(0, 2**64 - 1, size=40, dtype=np.uint64, endpoint=True)
    expected = [[distance(int(x), int(y)) for y in b] for x in a]
    assert distance(a[:, None], b[None, :]).tolist() == expected
    assert distance(a, int(b[0])).tolist() == [row[0] for row in expected]
    assert distance(2**64 - 1, 0) == 64 and distance(np.array([2**64 - 1], dtype=np.uint64), 0).tolist() == [64]
    monkeypatch.delattr(np, "bitwise_count")
    assert distance(a[:, None], b[None, :]).tolist() == expected


def _pillows_thumbnail(image: Image.Image) -> np.ndarray:
    return np.asarray((image if image.mode == "L" else image.convert("L")).resize((32, 32), Image.Resampling.BOX))


def _numpy_hash(image: Image.Image, monkeypatch) -> int:
    """The hash by Pillow's steps and numpy (what runs where the kernel does not)."""
    with monkeypatch.context() as m:
        m.setenv(resample_loader.KERNEL_VARIABLE, resample.PILLOW)
        return phash(image)


@pytest.fixture(scope="module")
def hash_images(pillow_images):
    """Photographs (Pillow's test images) and random pixels, RGB and L, at sizes that reach the
    kernel's every branch: 32 on either side (a pass skipped), 1 pixel, widths short of and past
    a vector of 8, heights short of a block of 8 rows, and large."""
    rng = np.random.default_rng(11)
    photos = []
    for name in pillow_images.names:
        if len(photos) == 6:
            break
        if not name.lower().endswith((".jpg", ".jpeg", ".png")) or any(
                bad in name for bad in ("truncated", "broken", "corrupt", "invalid")):
            continue
        try:
            with Image.open(pillow_images.path(name)) as img:
                photos.append(img.convert("RGB"))
        except OSError:  # a test file damaged on purpose
            continue
    sizes = [(32, 32), (32, 300), (300, 32), (1, 1), (1, 90), (90, 1), (7, 5), (33, 31), (224, 224),
             (225, 223), (500, 13), (13, 500), (1024, 768)]
    out = []
    for i, (width, height) in enumerate(sizes):
        noise = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        photo = photos[i % len(photos)].resize((width, height), Image.Resampling.BICUBIC)
        out += [noise, noise.convert("L"), photo, photo.convert("L")]
    return out


@pytest.mark.parametrize("isa", ["scalar", "sse4", "avx2", "avx512"])
def test_the_kernels_thumbnail_is_pillows_and_its_hash_numpys_on_every_path(hash_images, isa, monkeypatch):
    """The kernel's whole hash in one call: its grey 32x32 thumbnail is Pillow's
    ``convert("L").resize((32, 32), BOX)`` byte for byte, and its hash the one Pillow's steps and
    numpy give, on each vector path forced in turn (the scalar loops on every path but AVX2)."""
    loaded = resample_loader.load()
    assert loaded.kernel is not None, loaded.fallback
    if isa not in loaded.kernel.isas():
        pytest.skip(f"this CPU or build does not run the {isa} loops")
    try:
        resample_loader.use_isa(loaded.kernel, isa)
        for image in hash_images:
            kernel, pixels, pixelsize, keep_alive = resample.kernel_pixels(image)
            thumbnail = np.zeros((32, 32), np.uint8)
            hashed = kernel.phash(pixels, image.width, image.height, pixelsize, phash_module._DCT, thumbnail)
            assert np.array_equal(thumbnail, _pillows_thumbnail(image)), (image.mode, image.size)
            assert hashed == phash(image) == _numpy_hash(image, monkeypatch), (image.mode, image.size)
            del keep_alive
    finally:
        resample_loader.use_isa(loaded.kernel, None)


@pytest.mark.parametrize("mode", ["center_crop", "shorter_side", "stretch", "pad"])
def test_a_just_resized_image_is_hashed_from_the_kernels_rows_as_from_its_pixels(mode, monkeypatch):
    """``process_image`` hashes the kernel's own rows of the image it has just made: the hash of
    the record is the hash of the image it stores, by every path."""
    buf = io.BytesIO()
    picture(9, 301, 173).save(buf, "JPEG", quality=95)
    side = 47 if mode == "shorter_side" else 61  # shorter_side takes one size
    spec = ImageSpec(height=47, width=side, resize_mode=mode, image_format="png")
    outcome = process_image(buf.getvalue(), spec)
    stored = Image.open(io.BytesIO(outcome.data))
    assert outcome.phash == phash(stored) == _numpy_hash(stored, monkeypatch)


def test_the_kernels_rows_are_used_only_for_the_image_just_made():
    """An image resized before the last one is hashed from its own pixels, not the last rows."""
    first = resample.resize(picture(1, 120, 90), (40, 30), None)
    second = resample.resize(picture(2, 120, 90), (40, 30), None)
    assert resample.kernel_pixels(first, just_made=True)[1] is not resample.kernel_pixels(second, just_made=True)[1]
    assert phash(first, just_resized=True) == phash(first.copy())
    assert phash(second, just_resized=True) == phash(second.copy())


def test_a_resize_that_fails_in_the_kernel_leaves_no_earlier_image_reading_its_scratch_rows(monkeypatch):
    """A later resize runs in the kernel and then fails (Pillow's loops resize it instead): the image
    made before it is no longer taken for the last one made, so it is hashed from its own pixels."""
    first = resample.resize(picture(1, 120, 90), (40, 30), None)
    expected = phash(first.copy())
    loaded = resample_loader.load()

    class FailsAfterWriting:
        def __getattr__(self, name):
            return getattr(loaded.kernel, name)

        def resample_image(self, *args):
            loaded.kernel.resample_image(*args)
            raise MemoryError("after writing")

    monkeypatch.setattr(resample_loader, "load", lambda: dataclasses.replace(loaded, kernel=FailsAfterWriting()))
    second = resample.resize(picture(2, 120, 90), (40, 30), None)  # Pillow's loops, after the kernel wrote
    monkeypatch.undo()
    assert second.size == (40, 30)
    assert resample.kernel_pixels(first, just_made=True)[3] is not None  # exported again, not the last rows
    assert phash(first, just_resized=True) == expected
