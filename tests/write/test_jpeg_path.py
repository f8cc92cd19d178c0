"""The JPEG fast path against the Pillow path: the same record image, error or counts for every file.

The oracle is Pillow's own path (``BEAM_PREP_JPEG_PATH=pillow``: ``Image.open``, ``draft``, ``load``,
``exif_transpose``, ``convert``, the resize, ``phash``, ``Image.save``), run on the same bytes with the
same spec. Every file must come out equal both ways: the ``EncodedImage`` (JPEG bytes, size, hash,
flat colour) or the ``ImageError`` (stage and message), and what the run counts (resize, sources).
The files: Pillow's real JPEGs, photographs saved every way a JPEG is made (subsampling,
progressive, restart markers, EXIF and XMP turns, comments, ICC, odd sizes, greyscale, CMYK), EXIF
written to trip Pillow's reading, and damaged copies (cut short, bytes changed).
"""
from __future__ import annotations

import io
import random
import struct

import numpy as np
import pytest
from PIL import Image, ImageCms

from beam_prep.errors import ImageError
from beam_prep.write.images import imaging, jpeg_path, resample
from beam_prep.write.images.imaging import ImageSpec

pytestmark = pytest.mark.skipif(jpeg_path.available() is not None,
                                reason=f"the JPEG fast path cannot run here: {jpeg_path.available()}")

SPECS = {
    "default": ImageSpec(),
    "grey": ImageSpec(channels=1),
    "stretch": ImageSpec(resize_mode="stretch", height=100, width=300),
    "pad": ImageSpec(resize_mode="pad", height=128, width=64),
    "shorter_side": ImageSpec(resize_mode="shorter_side", height=160, width=160),
    "no_upscale": ImageSpec(resize_mode="shorter_side", height=600, width=600, no_upscale=True),
    "none": ImageSpec(resize_mode="none", height=None, width=None),
    "q75_no_hash": ImageSpec(jpeg_quality=75, height=300, width=200, perceptual_hash=False),
    "grey_pad": ImageSpec(channels=1, resize_mode="pad", height=50, width=90),
}


def _outcome(data: bytes, spec: ImageSpec, monkeypatch, path: str | None) -> tuple[object, dict, dict]:
    """What ``process_image`` gives on ``path`` (None: the fast path where it takes the file), what it
    counted (the JPEG path's counts apart)."""
    if path is None:
        monkeypatch.delenv(jpeg_path.VARIABLE, raising=False)
    else:
        monkeypatch.setenv(jpeg_path.VARIABLE, path)
    with resample.counting() as counted:
        try:
            result: object = imaging.process_image(data, spec)
        except ImageError as e:
            result = ("ImageError", e.stage, str(e))
    paths = {k: v for k, v in counted.items() if k.startswith("jpeg ")}
    return result, {k: v for k, v in counted.items() if not k.startswith("jpeg ")}, paths


def assert_same(data: bytes, spec: ImageSpec, monkeypatch, name: str) -> dict:
    """Both paths give ``data`` the same outcome and counts; the fast path's own counts."""
    fast, fast_counts, paths = _outcome(data, spec, monkeypatch, None)
    slow, slow_counts, _ = _outcome(data, spec, monkeypatch, jpeg_path.PILLOW)
    if fast != slow:
        detail = (fast.width, fast.height, fast.phash, fast.flat, len(fast.data)) if hasattr(fast, "data") else fast
        pillow = (slow.width, slow.height, slow.phash, slow.flat, len(slow.data)) if hasattr(slow, "data") else slow
        pytest.fail(f"{name}, {spec}: the fast path gives {detail}, Pillow's {pillow}")
    assert fast_counts == slow_counts, name
    return paths


def _photo(kind: str) -> Image.Image:
    """A photograph: a 320x240 crop of scikit-image's astronaut, greyscale for ``L``."""
    from skimage import data as photos

    img = Image.fromarray(photos.astronaut()).crop((60, 40, 380, 280))
    return img.convert("L") if kind == "L" else img


def _saved(img: Image.Image, **options) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", **options)
    return buf.getvalue()


def _exif(orientation: int, **tags: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    for tag, value in tags.items():
        exif[int(tag[1:], 16)] = value
    return exif.tobytes()


def _made_files() -> dict[str, bytes]:
    """Photographs saved every way the fast path must take (or decline) as Pillow does."""
    rgb, grey = _photo("RGB"), _photo("L")
    files = {
        "baseline_420": _saved(rgb, quality=90),
        "baseline_444": _saved(rgb, subsampling=0),
        "baseline_422": _saved(rgb, subsampling=1),
        "progressive": _saved(rgb, progressive=True),
        "restart_markers": _saved(rgb, restart_marker_blocks=3),
        "optimized": _saved(rgb, optimize=True, quality=97),
        "grey": _saved(grey),
        "grey_progressive": _saved(grey, progressive=True),
        "comment": _saved(rgb, comment=b"made by a camera \xff\x00 with bytes"),
        "icc": _saved(rgb, icc_profile=ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()),
        "cmyk": _saved(rgb.convert("CMYK")),
        "xmp_turn": _saved(rgb, xmp=b'<x:xmpmeta><rdf:Description tiff:Orientation="6"/></x:xmpmeta>'),
        "xmp_element_turn": _saved(rgb, xmp=b"<tiff:Orientation>3</tiff:Orientation>"),
        "xmp_beside_exif": _saved(rgb, exif=_exif(1), xmp=b'tiff:Orientation="8"'),
        "exif_orientation_0": _saved(rgb, exif=_exif(0)),
        "exif_orientation_9": _saved(rgb, exif=_exif(9)),
        "exif_dpi": _saved(rgb, exif=_exif(6, x128=2, x11a=300)),
    }
    for orientation in range(1, 9):
        files[f"exif_{orientation}"] = _saved(rgb, exif=_exif(orientation))
        files[f"exif_{orientation}_grey"] = _saved(grey, exif=_exif(orientation))
    for width, height in ((1, 1), (2, 3), (7, 5), (17, 1000), (1000, 17), (224, 224), (225, 224), (448, 336),
                          (449, 337), (64, 6401)):
        img = Image.fromarray(np.resize(np.asarray(rgb), (height, width, 3)))
        files[f"size_{width}x{height}"] = _saved(img)
    flat = Image.new("RGB", (300, 200), (40, 41, 42))
    files["flat"] = _saved(flat)
    files["flat_grey"] = _saved(flat.convert("L"))
    return files


def _exif_block(entries: list[tuple[int, int, int, bytes]], little: bool = True, ifd: int = 8,
                extra: bytes = b"") -> bytes:
    """A TIFF header and one IFD of ``(tag, type, count, value field)`` entries, then ``extra``."""
    order = "<" if little else ">"
    head = (b"II*\x00" if little else b"MM\x00*") + struct.pack(order + "L", ifd)
    body = struct.pack(order + "H", len(entries)) + b"".join(
        struct.pack(order + "HHL", tag, kind, count) + value.ljust(4, b"\x00") for tag, kind, count, value in entries)
    return head + b"\x00" * (ifd - 8) + body + struct.pack(order + "L", 0) + extra


def _with_app1(jpeg: bytes, payload: bytes, times: int = 1) -> bytes:
    segment = b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload
    return jpeg[:2] + segment * times + jpeg[2:]


def _tricky_files() -> dict[str, bytes]:
    """EXIF and markers written to trip Pillow's reading: the fast path must answer as Pillow does."""
    base = _saved(_photo("RGB").resize((120, 90)))
    short6 = struct.pack("<H", 6)
    files = {
        "exif_long_orientation": _with_app1(base, b"Exif\x00\x00" + _exif_block([(0x112, 4, 1, struct.pack("<L", 6))])),
        "exif_two_orientations": _with_app1(base, b"Exif\x00\x00" + _exif_block([(0x112, 3, 1, short6),
                                                                                 (0x112, 3, 1, struct.pack("<H", 3))])),
        "exif_big_endian": _with_app1(base, b"Exif\x00\x00" + _exif_block([(0x112, 3, 1, struct.pack(">H", 8))],
                                                                          little=False)),
        "exif_unknown_type_first": _with_app1(base, b"Exif\x00\x00" + _exif_block([(0x100, 99, 1, b""),
                                                                                   (0x112, 3, 1, short6)])),
        "exif_value_past_end_first": _with_app1(base, b"Exif\x00\x00" + _exif_block(
            [(0x10F, 2, 40, struct.pack("<L", 5000)), (0x112, 3, 1, short6)])),
        "exif_cut_short": _with_app1(base, (b"Exif\x00\x00" + _exif_block([(0x112, 3, 1, short6)] * 3))[:-20]),
        "exif_ifd_past_end": _with_app1(base, b"Exif\x00\x00" + _exif_block([(0x112, 3, 1, short6)], ifd=9000)[:30]),
        "exif_not_tiff": _with_app1(base, b"Exif\x00\x00NOTATIFFHEADER"),
        "exif_empty": _with_app1(base, b"Exif\x00\x00"),
        "exif_twice": _with_app1(base, b"Exif\x00\x00" + _exif_block([(0x112, 3, 1, short6)]), times=2),
        "exif_ascii_resolution": _with_app1(base, b"Exif\x00\x00" + _exif_block(
            [(0x128, 3, 1, struct.pack("<H", 2)), (0x11A, 2, 1, b"")])),
        "jfif_short": base[:2] + b"\xff\xe0\x00\x06JFIF" + base[2:],
        "adobe_short": base[:2] + b"\xff\xee\x00\x07Adobe" + base[2:],
        "photoshop_cut": base[:2] + b"\xff\xed\x00\x15Photoshop 3.0\x008BIM\x04\x04" + base[2:],
        "fill_bytes": base[:2] + b"\xff\xff" + base[2:],
        "junk_between": base[:2] + b"\x00\x01" + base[2:],
        "trailing_bytes": base + b"after the end" * 10,
    }
    return files


def _damaged(jpeg: bytes, seed: int) -> dict[str, bytes]:
    """Copies of ``jpeg`` cut short and with bytes changed, at places a seeded random picks."""
    rng = random.Random(seed)
    out = {}
    for i in range(6):
        cut = rng.randrange(2, len(jpeg))
        out[f"cut_{cut}"] = jpeg[:cut]
    for i in range(10):
        data = bytearray(jpeg)
        for _ in range(rng.choice((1, 3, 20))):
            data[rng.randrange(2, len(data))] = rng.randrange(256)
        out[f"changed_{i}"] = bytes(data)
    return out


@pytest.fixture(scope="module")
def made_files() -> dict[str, bytes]:
    return _made_files()


@pytest.mark.parametrize("spec_name", sorted(SPECS))
def test_made_files_same_both_ways(made_files, spec_name, monkeypatch):
    spec = SPECS[spec_name]
    declined = {}
    for name, data in made_files.items():
        paths = assert_same(data, spec, monkeypatch, name)
        declined.update(dict.fromkeys([name] * len(set(paths) - {"jpeg native"}), next(iter(set(paths) - {"jpeg native"}), None)))
    # The plain files all take the fast path; CMYK is declined, and a resize Pillow makes in two
    # calls (an image over 100 times taller than wide: size_64x6401, or one made so by the spec).
    assert declined.pop("cmyk") == "jpeg pillow: channels"
    assert set(declined) <= {"size_64x6401", "size_17x1000", "size_1000x17"}
    assert set(declined.values()) <= {"jpeg pillow: geometry"}


@pytest.mark.parametrize("spec_name", ["default", "grey", "none"])
def test_tricky_files_same_both_ways(spec_name, monkeypatch):
    for name, data in _tricky_files().items():
        assert_same(data, SPECS[spec_name], monkeypatch, name)


@pytest.mark.parametrize("source", ["baseline_420", "progressive", "restart_markers", "grey", "exif_6"])
def test_damaged_copies_same_both_ways(made_files, source, monkeypatch):
    """A damaged JPEG is reported as the Pillow path reports it (same stage, same message), or written
    with the same bytes where libjpeg decodes it without a word: the fast path declines on any warning."""
    for name, data in _damaged(made_files[source], seed=len(source)).items():
        for spec in (SPECS["default"], SPECS["none"]):
            paths = assert_same(data, spec, monkeypatch, f"{source} {name}")
            assert "jpeg native" not in paths or _decodes_cleanly(data), f"{source} {name}"


def _decodes_cleanly(data: bytes) -> bool:
    """Whether Pillow decodes ``data`` whole (libjpeg may still have warned: the oracle is the bytes)."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
    except (OSError, SyntaxError, ValueError):
        return False
    return True


@pytest.mark.slow
def test_real_jpegs_same_both_ways(pillow_images, monkeypatch):
    """Pillow's own JPEGs (cameras, Photoshop, CMYK, MPO, broken ones), every spec."""
    names = pillow_images.of_format("jpeg")
    assert len(names) >= 40
    native = 0
    for name in names:
        data = pillow_images.path(name).read_bytes()
        for spec in SPECS.values():
            native += assert_same(data, spec, monkeypatch, name).get("jpeg native", 0)
    assert native >= len(names) * len(SPECS) // 2  # most real JPEGs take the fast path


def test_counts_in_the_manifest_summary(made_files, monkeypatch):
    monkeypatch.delenv(jpeg_path.VARIABLE, raising=False)
    with resample.counting() as counted:
        for name in ("baseline_420", "grey", "cmyk"):
            imaging.process_image(made_files[name], SPECS["default"])
        imaging.process_image(_saved(_photo("RGB")).replace(b"JFIF", b"JFIF", 1)[:2] + b"\xff\xff"
                              + made_files["baseline_420"][2:], SPECS["default"])
        png = io.BytesIO()
        _photo("RGB").save(png, "PNG")
        imaging.process_image(png.getvalue(), SPECS["default"])  # not a JPEG: not counted
    assert jpeg_path.summary(counted.items()) == {
        "jpeg_path": {"native": 2, "pillow": 2, "reasons": {"channels": 1, "markers": 1}}}
    assert jpeg_path.summary([]) == {}
    assert set(jpeg_path.summary(counted.items())["jpeg_path"]["reasons"]) <= set(jpeg_path.REASONS)


def test_pillow_chosen_counts_every_jpeg(made_files, monkeypatch):
    monkeypatch.setenv(jpeg_path.VARIABLE, jpeg_path.PILLOW)
    with resample.counting() as counted:
        imaging.process_image(made_files["baseline_420"], SPECS["default"])
    assert jpeg_path.summary(counted.items())["jpeg_path"] == {
        "native": 0, "pillow": 1, "reasons": {"unavailable": 1}}


def test_a_wrong_choice_is_refused(monkeypatch):
    from beam_prep.errors import OptionsError

    monkeypatch.setenv(jpeg_path.VARIABLE, "native")
    with pytest.raises(OptionsError, match="BEAM_PREP_JPEG_PATH must be pillow"):
        jpeg_path.check_choice()


@pytest.mark.slow
def test_no_memory_kept_call_after_call(made_files, monkeypatch):
    """The fast path frees what it takes, for files it makes and files it declines (damaged ones):
    the process's memory after many rounds is what it was after the first (a leak of one encoded
    image a call would be tens of MB here)."""
    import psutil

    monkeypatch.delenv(jpeg_path.VARIABLE, raising=False)
    files = [*made_files.values(), *(d for n in ("baseline_420", "progressive", "grey")
                                     for d in _damaged(made_files[n], seed=3).values())]

    def one_round() -> None:
        with resample.counting():
            for data in files * 4:
                for spec in (SPECS["default"], SPECS["none"]):
                    try:
                        imaging.process_image(data, spec)
                    except ImageError:
                        pass

    one_round()
    before = psutil.Process().memory_info().rss
    for _ in range(4):
        one_round()
    assert psutil.Process().memory_info().rss - before < 8 * 2**20


@pytest.mark.parametrize("size", [(128, 64), (64, 32)])
def test_pad_writes_no_comment(size, monkeypatch):
    """Pad puts every image on a new canvas, which carries no comment, even an image that fills it
    unresized (``size`` 128x64) or cropped (64x32): the source's comment is never written."""
    data = _saved(_photo("RGB").resize((128, 64)), comment=b"a comment")
    spec = ImageSpec(resize_mode="pad", width=size[0], height=size[1])
    assert assert_same(data, spec, monkeypatch, f"pad {size}") == {"jpeg native": 1}
    assert b"a comment" not in imaging.process_image(data, spec).data


@pytest.fixture
def small_blocks():
    """Pillow's images in blocks of 64 KiB: a 320x240 image lies in several, as a large one does in
    the 16 MiB default."""
    before = Image.core.get_block_size()
    Image.core.set_block_size(1 << 16)
    yield
    Image.core.set_block_size(before)


@pytest.mark.parametrize("spec_name", ["default", "grey", "stretch", "pad", "none"])
def test_a_source_in_several_blocks(made_files, small_blocks, spec_name, monkeypatch):
    """A source Pillow keeps in several blocks is resized by Pillow's loops in the Pillow path (counted
    so; its image keeps the source's comment): the fast path counts and writes the same."""
    for name in ("comment", "exif_6", "grey"):
        assert assert_same(made_files[name], SPECS[spec_name], monkeypatch, name) == {"jpeg native": 1}


def test_a_turn_beside_mistyped_exif(monkeypatch):
    """EXIF that turns the image beside an entry of another type than its tag's (a ResolutionUnit
    written as text): Pillow's exif_transpose raised rewriting it (struct.error, out of process_image);
    both paths turn the image and write it."""
    base = _saved(_photo("RGB").resize((120, 90)))
    data = _with_app1(base, b"Exif\x00\x00" + _exif_block([(0x112, 3, 1, struct.pack("<H", 6)),
                                                           (0x128, 2, 4, b"cm\x00\x00")]))
    for spec in (SPECS["default"], SPECS["none"]):
        assert assert_same(data, spec, monkeypatch, "mistyped") == {"jpeg native": 1}
    monkeypatch.setenv(jpeg_path.VARIABLE, jpeg_path.PILLOW)
    made = imaging.process_image(data, SPECS["none"])
    assert (made.width, made.height) == (90, 120)


def test_an_output_too_large_for_a_jpeg_is_declined_before_the_work(monkeypatch):
    """An output over JPEG's 65,500 pixels a side: Pillow's save fails (its error, as before); the fast
    path declines it for its geometry before decoding, never calling the file damaged."""
    data = _saved(_photo("RGB").resize((200, 2)))
    spec = ImageSpec(resize_mode="stretch", width=65501, height=2)
    assert assert_same(data, spec, monkeypatch, "too wide") == {"jpeg pillow: geometry": 1}


def test_a_max_pixels_past_64_bits(made_files, monkeypatch):
    """``--max_pixels`` takes any integer: one past 64 bits limits nothing, as in Pillow's path (the
    fast path raised OverflowError for every JPEG)."""
    spec = ImageSpec(max_pixels=10**20)
    assert assert_same(made_files["baseline_420"], spec, monkeypatch, "max_pixels") == {"jpeg native": 1}
