"""Real images for tests: the test images of Pillow's own source distribution.

Our other test images are generated, so they only hold what we thought of. Pillow's
``Tests/images`` holds hundreds of files collected from bug reports: odd modes,
16-bit and palette transparency, EXIF rotations, CMYK, Group-4 faxes, broken streams.
They are fetched at test time (``pip download`` of the sdist of the installed
Pillow), not kept in the repository, and cached outside it, written atomically:
a killed run leaves either the whole corpus or none of it.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable

import PIL

from beam_prep.write.images.imaging import IMAGE_EXTENSIONS

# The variable that moves the cache (default ~/.cache/beam-prep-tests); one folder a Pillow version.
CACHE_VARIABLE = "BEAM_PREP_TEST_CACHE"
# What the tree of a corpus calls each extension's images: its label folder.
FORMAT_OF_EXTENSION = {".jpg": "jpeg", ".jpeg": "jpeg", ".png": "png", ".gif": "gif", ".bmp": "bmp",
                       ".webp": "webp", ".tif": "tiff", ".tiff": "tiff"}
assert set(FORMAT_OF_EXTENSION) == set(IMAGE_EXTENSIONS), "a new extension needs its label here"
_IMAGES = "Tests/images/"
_DOWNLOAD_TIMEOUT_S = 300


class CorpusUnavailable(RuntimeError):
    """The corpus is neither cached nor downloadable (no registry): tests must fail, not skip."""


@dataclasses.dataclass(frozen=True)
class Corpus:
    """The cached files, by their path under ``Tests/images`` (``bmp/g/pal8.bmp``), sorted."""

    root: pathlib.Path
    version: str
    names: tuple[str, ...]

    def path(self, name: str) -> pathlib.Path:
        return self.root / name

    def of_format(self, fmt: str) -> list[str]:
        """The names whose extension says ``fmt`` (a value of FORMAT_OF_EXTENSION), sorted."""
        return [n for n in self.names if format_of(n) == fmt]


def format_of(name: str) -> str:
    return FORMAT_OF_EXTENSION[pathlib.PurePosixPath(name).suffix.lower()]


def tree_name(name: str) -> str:
    """Where a corpus file goes in a labelled tree: ``<format>/<its path, flattened>``.

    Flattening keeps the names unique (they are unique under Tests/images) and one level deep.
    """
    return f"{format_of(name)}/{name.replace('/', '__')}"


def make_tree(corpus: Corpus, root: pathlib.Path, names: Iterable[str] | None = None) -> dict[str, str]:
    """Hard-links (or copies) corpus files into ``root/<format>/``; returns tree name -> corpus name."""
    placed = {}
    for name in corpus.names if names is None else names:
        target = root / tree_name(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(corpus.path(name), target)
        except OSError:  # another file system
            shutil.copyfile(corpus.path(name), target)
        placed[tree_name(name)] = name
    return placed


def cache_root() -> pathlib.Path:
    return pathlib.Path(os.environ.get(CACHE_VARIABLE) or pathlib.Path.home() / ".cache" / "beam-prep-tests")


def pillow_corpus(version: str = PIL.__version__) -> Corpus:
    """The corpus of this Pillow version: from the cache, else downloaded and cached first.

    Raises:
      CorpusUnavailable: the download failed; the message says why and how to provide it.
    """
    final = cache_root() / f"pillow-{version}"
    if not final.is_dir():
        final.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".pillow-{version}-", dir=final.parent) as work:
            sdist = _download(version, pathlib.Path(work) / "sdist")
            staged = pathlib.Path(work) / "images"
            _extract_images(sdist, staged)
            try:
                staged.rename(final)
            except OSError:  # another run finished first: its corpus is as good as ours
                if not final.is_dir():
                    raise
    names = sorted(p.relative_to(final).as_posix() for p in final.rglob("*") if p.is_file())
    return Corpus(final, version, tuple(names))


def _download(version: str, folder: pathlib.Path) -> pathlib.Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", f"pillow=={version}", "-d", str(folder)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=_DOWNLOAD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise CorpusUnavailable(f"{' '.join(command)} took over {_DOWNLOAD_TIMEOUT_S} s") from e
    found = sorted(folder.glob("*.tar.gz"))
    if result.returncode != 0 or not found:
        raise CorpusUnavailable(
            f"cannot download Pillow {version}'s source distribution for its test images "
            f"(exit {result.returncode}): {result.stderr.strip()[-1500:]}\n"
            f"These tests need the package registry once, or the corpus in "
            f"{cache_root() / f'pillow-{version}'} (set {CACHE_VARIABLE} to move it).")
    return found[0]


def _extract_images(sdist: pathlib.Path, target: pathlib.Path) -> None:
    """Copies the regular files under ``*/Tests/images/`` with an image extension into ``target``."""
    target.mkdir()
    with tarfile.open(sdist) as tar:
        for member in tar:
            _, _, inside = member.name.partition("/")
            if not (member.isfile() and inside.startswith(_IMAGES)):
                continue
            name = inside[len(_IMAGES):]
            parts = pathlib.PurePosixPath(name).parts
            if ".." in parts or any(p.startswith(".") for p in parts):
                continue
            if pathlib.PurePosixPath(name).suffix.lower() in IMAGE_EXTENSIONS:
                path = target / name
                path.parent.mkdir(parents=True, exist_ok=True)
                with tar.extractfile(member) as src, open(path, "wb") as dst:
                    shutil.copyfileobj(src, dst)
