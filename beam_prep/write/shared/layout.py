"""Names of the files in an output directory, and how a run's files get there.

The one place that knows a shard's file name, so both sinks, the manifest and
``--overwrite`` agree on what belongs to a dataset. A run writes everything into
its own folder, ``OUTPUT/.beam-prep/<run id>/``, and publishes it from there
(``finish.publication``; docs/design/claim.md, "Publishing").
"""
from __future__ import annotations

import fnmatch
import logging
import os
import re
import shutil
import stat
from collections.abc import Callable

from beam_prep.errors import OptionsError
from beam_prep.io.dali_index import index_name
from beam_prep.io.storage import is_local, join, storage_error
from beam_prep.model.dataset import COMPRESSIONS, FILE_FORMATS, MANIFEST
from beam_prep.model.dataset_card import CARD
from beam_prep.model.tfds_metadata import FILES as TFDS_FILES

_LOG = logging.getLogger(__name__)

LABELS = "labels.txt"
ERRORS = "errors.jsonl"
# The files the listing passed over, with why: in the run's folder from the launcher, then the dataset's.
SKIPPED = "skipped.jsonl"
DUPLICATES = "duplicates.jsonl"
# Every record of one flat colour (images.flat), with its colour.
FLAT = "flat.jsonl"
# An append's files not written: changed since their record was made, or gone (grow.append.Additions).
CHANGED = "changed.jsonl"
# In a run's folder: each written record's source hash (duplicates.hash_line), a file per
# shard (streaming sink) or Beam's WriteToText shards of this prefix (shuffle sink).
HASHES = "sha256"
# A shard's name is its split, this template filled in, and its format's suffix
# (model.dataset.shard_suffix): "train-00003-of-00016.tfrecord.gz", "train-00003-of-00016.tar". The template is in Beam's notation (S: the shard's
# index from 0, N: the shard count, zero-padded to as many digits as letters) because the
# shuffle sink hands it to Beam's file sink (sinks.file_sink) as it is; shard_name and the pattern
# that recognises a dataset's shards are derived from it, so no two can disagree.
SHARD_TEMPLATE = "-SSSSS-of-NNNNN"
# ``beam-prep report``'s page (tools.report), by default in the output folder. It shows one dataset: where
# beam-prep wrote it (``is_report``), every run that changes the dataset takes it away with the old files.
REPORT = "report.html"
# How the page says beam-prep wrote it, in its first ``REPORT_HEAD`` bytes: a file of that name the user
# wrote is not the dataset's, and stays.
REPORT_MARK = b'<meta name="generator" content="beam-prep report">'
REPORT_HEAD = 512
WORK_DIR = ".beam-prep"
LISTING = "listing.jsonl"
UNKNOWN_LABELS = "unknown-labels.jsonl"
CHANGES = "changes.jsonl"  # the changed.jsonl lines an append found while listing: in its run's folder, not its plan
def _fill_template(index: Callable[[int], str], count: Callable[[int], str]) -> str:
    """SHARD_TEMPLATE with each run of S replaced by ``index(its length)``, each run of N by ``count(...)``."""
    return re.sub("S+|N+", lambda m: (index if m[0][0] == "S" else count)(len(m[0])), SHARD_TEMPLATE)


_SHARD_FORMAT = _fill_template(lambda n: f"{{index:0{n}d}}", lambda n: f"{{count:0{n}d}}")
_SHARD_GLOB = _fill_template(lambda n: "?" * n, lambda n: "?" * n)
_SHARD_PATTERNS = tuple(f"*{_SHARD_GLOB}{suffix}" for suffix in dict.fromkeys(
    [c.suffix for c in COMPRESSIONS.values()] + [f.suffix for f in FILE_FORMATS.values()]))
# The hash lines a dataset keeps, a file a version (finish.kept_hashes.kept_name).
KEPT_HASHES = "hashes-v*.tsv.gz"
# Each version's sources' sizes and stamps, which tell an append the files it need not read (plan.listing.stamps).
KEPT_STAMPS = "stamps-v*.tsv.gz"
# A shard's DALI index (io.dali_index) is the dataset's too: an --overwrite run replaces it with its shard.
_OWNED_PATTERNS = (MANIFEST, LABELS, ERRORS, SKIPPED, DUPLICATES, FLAT, CHANGED, KEPT_HASHES, KEPT_STAMPS, *TFDS_FILES,
                   *_SHARD_PATTERNS, *(index_name(p) for p in _SHARD_PATTERNS))


def is_shard_name(name: str) -> bool:
    """Whether a file name is a shard's, of any split, format and compression: how ``verify`` tells a
    shard the manifest does not list (left by another run, or copied in) from other files."""
    return any(fnmatch.fnmatchcase(name, p) for p in _SHARD_PATTERNS)


def _filesystems():
    """Beam's FileSystems, imported on first use: ``verify`` names shards with this module
    and reads with TensorFlow, and need not pay for Beam's import."""
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


def run_folder(output: str, run_id: str) -> str:
    """Where a run keeps its listings and shards until it publishes them."""
    return join(output, WORK_DIR, run_id)


def shard_listing_name(split: str, index: int) -> str:
    return f"{split}-{index:05d}.jsonl"


def hashes_name(shard: str) -> str:
    """The streaming sink's hash file of a shard, beside it in the run's folder."""
    return f"{shard}.{HASHES}.txt"


def shard_prefix(split: str, version: int = 1) -> str:
    """What a split's shards of a dataset version are named with before ``SHARD_TEMPLATE``: the split,
    and for a later version's (an append's) ``-v<version>`` (``train-v2``)."""
    return f"{split}-v{version}" if version > 1 else split


def shard_name(split: str, index: int, count: int, suffix: str, version: int = 1) -> str:
    """The file name of shard ``index`` (from 0) of ``count``: what Beam's sink names it with
    ``SHARD_TEMPLATE``, the file path prefix ``<folder>/<shard_prefix>`` and ``suffix``
    (``PrepareConfig.shard_suffix``). A later version's (an append's) has ``-v<version>`` after the
    split (``train-v2-00000-of-00003.tfrecord.gz``): a name no earlier shard has, that training
    code's ``train-*`` still finds."""
    return f"{shard_prefix(split, version)}{_SHARD_FORMAT.format(index=index, count=count)}{suffix}"


def is_dataset_name(name: str) -> bool:
    """Whether a file name is one a dataset holds (its manifest, metadata, shards and indexes)."""
    return any(fnmatch.fnmatchcase(name, p) for p in _OWNED_PATTERNS)


def is_published_name(name: str) -> bool:
    """Whether a publication may move a file of this name: a dataset's (``is_dataset_name``), its card
    (``dataset_card.CARD``) or its report (``REPORT``), each the dataset's only where beam-prep wrote it
    (``dataset_card.is_ours``, ``is_report``): a folder holding a file of that name of its own is no
    dataset, and a run leaves that file as it is."""
    return name in (CARD, REPORT) or is_dataset_name(name)


def is_report(head: bytes) -> bool:
    """Whether ``head`` (a file's first ``REPORT_HEAD`` bytes, or more) is the start of a page ``beam-prep
    report`` wrote."""
    return REPORT_MARK in head[:REPORT_HEAD]


def existing_dataset_files(output: str) -> list[str]:
    """Files in ``output`` that make up a dataset (complete or not), by their names."""
    try:
        metadata = _filesystems().match([join(output, "*")])[0].metadata_list
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("list --output", output, e) from e
    owned = []
    for m in metadata:
        name = m.path[len(output.rstrip("/")) + 1:]
        if is_dataset_name(name):
            owned.append(m.path)
    return sorted(owned)


def unfinished_runs(output: str, claim_name: str) -> list[str]:
    """Run folders left in ``output`` by runs that ended without publishing (killed, or failed uncleanly).

    Call it only while holding the output's claim: then none of them is running.

    Raises:
      OptionsError: ``.beam-prep`` or a run's folder in it is a link (``check_run_folder``).
      StorageError: the folder cannot be listed.
    """
    work = join(output, WORK_DIR)
    try:
        if is_local(output):
            _check_not_a_link(output, work)
            names = sorted(os.listdir(work)) if os.path.isdir(work) else []
        else:
            paths = [m.path for m in _filesystems().match([join(work, "**")])[0].metadata_list]
            names = sorted({p[len(work) + 1:].split("/", 1)[0] for p in paths})
    except OSError as e:
        raise storage_error("list", work, e) from e
    except OptionsError:
        raise
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("list", work, e) from e
    names = [name for name in names if name != claim_name]
    for name in names:
        check_run_folder(output, name)
    return names


def check_run_folder(output: str, run_id: str) -> None:
    """Refuses a run's folder (or ``.beam-prep``) that is a link, on local disk: beam-prep never makes
    one, and following it would finish, or remove, another folder's files.

    Raises:
      OptionsError: naming the link and what to do.
    """
    if is_local(output):
        _check_not_a_link(output, join(output, WORK_DIR))
        _check_not_a_link(output, run_folder(output, run_id))


def _check_not_a_link(output: str, path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise storage_error("read", path, e) from e
    if stat.S_ISLNK(mode):
        raise OptionsError(f"--output {output} holds {path}, a link, which beam-prep never makes there: remove the "
                           "link (not what it points to) and run again")


def check_output(output: str, overwrite: bool, leftovers: list[str], append: bool = False) -> None:
    """Refuses to mix runs: a dataset, or an unfinished run's files, may only be replaced with ``overwrite``.
    An ``append`` adds to the dataset; the unfinished runs' files it finds (not its own to resume, whose
    publications are finished first) hold none of the dataset's and go (``remove_unfinished_runs``).

    Raises:
      OptionsError: what the folder holds, and what to pass.
    """
    if overwrite or append:
        return
    existing = existing_dataset_files(output)
    names = [p.rsplit("/", 1)[-1] for p in existing]
    held = []
    if MANIFEST in names:
        held.append(f"a dataset ({len(existing)} files)")
    elif existing:
        held.append(f"part of a dataset without its {MANIFEST} ({len(existing)} files, e.g. {names[0]})")
    if leftovers:
        held.append(f"the files of unfinished run {', '.join(leftovers)} (stopped before it completed)")
    if held:
        raise OptionsError(f"--output {output} already holds {' and '.join(held)}; "
                           "pass --overwrite to replace it")


def delete(paths: list[str], what: str) -> None:
    if not paths:
        return
    try:
        _filesystems().delete(paths)
    except Exception as e:
        raise storage_error("remove", what, e) from e


def remove_unfinished_runs(output: str, run_ids: list[str]) -> None:
    """Removes the files of runs that never finished (``unfinished_runs``), once ``--overwrite`` allows it."""
    for run_id in run_ids:
        _LOG.info("removing the files of unfinished run %s", run_id)
        remove_run_folder(output, run_id)


def remove_run_folder(output: str, run_id: str) -> None:
    """Removes a run's folder and everything in it (its listings, and shards not published)."""
    folder = run_folder(output, run_id)
    try:
        if is_local(output):
            if os.path.islink(folder):
                os.remove(folder)  # the link, never what it points to
            elif os.path.isdir(folder):
                shutil.rmtree(folder)
        else:
            paths = [m.path for m in _filesystems().match([join(folder, "**")])[0].metadata_list]
            if paths:
                _filesystems().delete(paths)
    except Exception as e:
        raise storage_error("remove", folder, e) from e
