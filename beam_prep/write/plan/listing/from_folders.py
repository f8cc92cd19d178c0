"""A tree whose folders say each image's label (and split): ``ROOT/<label>/<image>`` or
``ROOT/<split>/<label>/<image>``, deeper with ``--recursive``.

Two passes: the walk keeps each image's (relpath, size, stamp) on disk, since the layout (split
folders or not) is known only once every file is seen; the second pass labels each.
"""
from __future__ import annotations

from collections.abc import Sequence

from beam_prep.errors import OptionsError
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
from beam_prep.write.plan.spill import RowFile, SortedRows, SpillFolder
from beam_prep.write.plan.walk import walk_tree
from beam_prep.write.shared.hashing import order_key

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
    for relpath, size, stamp in images:
        parts = relpath.split("/")
        if (len(parts) < depth if recursive else len(parts) != depth) or (
                split_layout and parts[0] not in SPLIT_NAMES):
            skips.add(relpath, SKIP_DEPTH)
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
        raise OptionsError(
            f"no images under {root}: expected {layout} with image files "
            f"({sum(skips.by_reason.values())} other files skipped)")

    names = list(labels) if labels is not None else sorted(label_folders)
    chosen = choice.finish(skips.add)
    return make_listing(root, names, chosen.split_counts, chosen.unknown, chosen.total_bytes, skips, folder,
                    chosen.files, label_offset)


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
