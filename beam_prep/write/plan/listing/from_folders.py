"""A tree whose folders say each image's label (and split): ``ROOT/<label>/<image>`` or
``ROOT/<split>/<label>/<image>``, deeper with ``--recursive``.

Two passes: the walk keeps each image's (relpath, size, stamp) on disk, since the layout (split
folders or not) is known only once every file is seen; the second pass labels each.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence

from beam_prep.errors import BeamPrepWarning, OptionsError
from beam_prep.io.storage import join
from beam_prep.write.images.imaging import is_image_name
from beam_prep.write.plan.listing.listed import Listing, Skips, make_listing
from beam_prep.write.plan.listing.names import (
    SKIP_DEPTH,
    SKIP_HIDDEN,
    SKIP_NOT_IMAGE,
    SPLIT_NAMES,
    check_label_name,
    is_junk,
)
from beam_prep.write.plan.selection import Selection
from beam_prep.write.plan.walk import walk_tree
from beam_prep.write.shared.entry import printable
from beam_prep.write.shared.hashing import order_key
from beam_prep.write.shared.spill import RowFile, SortedRows, SpillFolder

__all__ = ["list_folders"]


def list_folders(root: str, folder: SpillFolder, validation_percent: float, labels: Sequence[str] | None,
                 label_offset: int, recursive: bool, stratify: bool = False,
                 max_per_class: int | None = None) -> Listing:
    """``list_tree`` in two passes over disk, since the split layout is known only once every file is seen."""
    skips = Skips(SortedRows(folder, "skipped"))
    images, split_layout = _first_pass(root, folder, validation_percent, skips, recursive)

    depth = 3 if split_layout else 2
    choice = Selection(folder, images.count, validation_percent, stratify, max_per_class)
    known = set(labels) if labels is not None else None
    label_folders: dict[str, str] = {}
    nested = _Nested()  # images in subfolders of label folders, which --recursive would take
    for relpath, size, stamp in images:
        parts = relpath.split("/")
        if (len(parts) < depth if recursive else len(parts) != depth) or (
                split_layout and parts[0] not in SPLIT_NAMES):
            skips.add(relpath, SKIP_DEPTH)
            if not recursive and len(parts) > depth and (not split_layout or parts[0] in SPLIT_NAMES):
                nested.add(relpath)
            continue
        split = parts[0] if split_layout else choice.split(relpath)
        label = parts[depth - 2]  # the top label folder, however deep the image (--recursive)
        if label not in label_folders:
            label_folders[label] = "/".join(parts[:depth - 1])
            check_label_name(label, join(root, label_folders[label]))
        choice.add((order_key(relpath), relpath, split, label, size, None, None, stamp),
                   known is None or label in known)

    if not choice.added:
        layout = "ROOT/<label>/<image> or ROOT/<split>/<label>/<image>"
        others = sum(skips.by_reason.values()) - nested.count
        if nested.count:
            raise OptionsError(
                f"no images under {root}: expected {layout}, and {nested.described()}"
                + (f" ({others} other files skipped)" if others else ""))
        raise OptionsError(f"no images under {root}: expected {layout} with image files ({others} other files skipped)")
    if nested.count:
        warnings.warn(BeamPrepWarning(f"{root}: {nested.described()}; they are skipped"), stacklevel=2)

    names = list(labels) if labels is not None else sorted(label_folders)
    chosen = choice.finish(skips.add)
    return make_listing(root, names, chosen.split_counts, chosen.unknown, chosen.total_bytes, skips, folder,
                    chosen.files, label_offset)


class _Nested:
    """The images a run without --recursive skips in subfolders of label folders: counted, the first named."""

    def __init__(self) -> None:
        self.count = 0
        self.first: str | None = None

    def add(self, relpath: str) -> None:
        self.count += 1
        self.first = min(self.first or relpath, relpath)

    def described(self) -> str:
        """``3 images lie in subfolders of label folders (a/x/1.jpg...): pass --recursive ...``."""
        many = self.count > 1
        return (f"{self.count} image{'s' if many else ''} lie{'' if many else 's'} in subfolders of label folders "
                f"({printable(self.first)}{', ...' if many else ''}): pass --recursive to label each by its "
                "top folder")


def _first_pass(root: str, folder: SpillFolder, validation_percent: float,
                skips: Skips, recursive: bool = False) -> tuple[RowFile, bool]:
    """Every file under ``root``, skipped by name or kept as (relpath, size, stamp); and whether the tree is split."""
    images = RowFile(folder.file("images"))  # (relpath, size, stamp) of each file that passed the name checks
    split_layout = False
    top_folders: set[str] = set()
    prefix = len(root) + 1
    for path, size, stamp, reason in walk_tree(root):
        if not path.startswith(root + "/"):
            continue
        relpath = path[prefix:]
        parts = relpath.split("/")
        if reason is not None:
            skips.add(relpath, reason)
        elif any(is_junk(part) for part in parts):
            skips.add(relpath, SKIP_HIDDEN)
        else:
            top_folders.add(parts[0])
            if not is_image_name(relpath):
                skips.add(relpath, SKIP_NOT_IMAGE)
                continue
            images.append((relpath, size, stamp))
            # A split-named top folder holding images at <split>/<label>/<image> makes a
            # split tree: decided by where the images are, so a stray folder or file beside
            # train/ and validation/ cannot switch the layout (it is skipped instead).
            split_layout = split_layout or (
                (len(parts) >= 3 if recursive else len(parts) == 3) and parts[0] in SPLIT_NAMES)

    if split_layout and validation_percent:
        raise OptionsError(
            f"{root} already has split folders ({', '.join(sorted(top_folders & set(SPLIT_NAMES)))}); "
            "drop --validation_percent")
    return images, split_layout
