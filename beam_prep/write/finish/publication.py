"""A run's publication, recorded before ``--output`` is touched, so that a kill anywhere in it is finished.

``publish.complete`` stages every file the dataset gains in the run's folder (its shards where
the sinks or the drop wrote them, the other files under ``staged/``), then writes ``publish.json``
there, whole or not at all, naming each move and each old file to remove; only then does
``carry_out`` change ``--output``, each step checking first whether it was done. A later run into
the folder finishes an unfinished publication before anything else (``finish_unfinished``), byte
for byte. The order, and why the old dataset is never lost: docs/design/claim.md, "Publishing".
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
from collections.abc import Iterable, Mapping
from typing import Any

from apache_beam.io.filesystems import FileSystems

from beam_prep.errors import BeamPrepError, DatasetError, OptionsError
from beam_prep.io.storage import is_local, join, read_bytes, storage_error
from beam_prep.model.dataset import MANIFEST
from beam_prep.model.names import check_file_name
from beam_prep.write.journal import resume
from beam_prep.write.shared import layout

__all__ = ["KILL_VARIABLE", "RECORD", "STAGED", "Publication", "Steps", "carry_out", "finish_unfinished",
           "is_recorded", "planned", "read_record", "staging_folder", "write_record"]

_LOG = logging.getLogger(__name__)
RECORD = "publish.json"
STAGED = "staged"  # the run folder's subfolder of the files the dataset gains besides its shards
_FORMAT = 1
# Test-only: the run SIGKILLs itself right after step N of a publication (0: as it begins, before
# anything is staged), so the tests stop it at each step in turn (tests/write/test_publish_kills.py).
KILL_VARIABLE = "BEAM_PREP_TEST_KILL_AFTER_PUBLISH_STEP"


class Steps:
    """Counts a publication's steps (each write, move or removal), for ``KILL_VARIABLE``."""

    def __init__(self) -> None:
        self._done = 0
        self._check()

    def done(self) -> None:
        """A step is done: the process is killed here if the test hook names it."""
        self._done += 1
        self._check()

    def _check(self) -> None:
        if os.environ.get(KILL_VARIABLE) == str(self._done):
            os.kill(os.getpid(), signal.SIGKILL)


@dataclasses.dataclass(frozen=True)
class Publication:
    """``publish.json``: what a run does to ``--output``, in order.

    Attributes:
      run_id: the run, whose folder holds the sources.
      options: its command's options (``resume.command_options``): a rerun with the same ones is
        the same command, and reports the dataset as its own.
      moves: ``(source, target)``: a path relative to the run's folder, a name in ``--output``;
        the manifest last.
      removes: the old dataset's files no move replaces, names in ``--output``; its manifest is
        not among them (it goes first, by the rule ``carry_out`` follows).
      append: an append's (``--append``): the dataset stays, no file of it is removed, and its
        manifest is replaced by the new one in one move, last (readers see the old version whole
        until then).
    """

    run_id: str
    options: dict[str, Any]
    moves: tuple[tuple[str, str], ...]
    removes: tuple[str, ...]
    append: bool = False


def staging_folder(work: str) -> str:
    """Where ``publish.complete`` writes the files the dataset gains besides its shards (made, on local disk)."""
    folder = join(work, STAGED)
    if is_local(folder):
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise storage_error("create", folder, e) from e
    return folder


def planned(output: str, run_id: str, options: Mapping[str, Any], shards: Mapping[str, str],
            staged: Iterable[str], append: bool = False) -> Publication:
    """The publication of a run whose files are all in its folder, as ``--output`` holds it now.

    Args:
      output: the output folder.
      run_id: the run.
      options: its command's options (``resume.command_options``).
      shards: each shard and index file's name -> its path relative to the run's folder.
      staged: the names of the other files, in ``staging_folder``, the manifest among them.
      append: the run adds to the dataset (``Publication.append``): nothing of it is removed.
    """
    staged = sorted(set(staged) - {MANIFEST})
    moves = [*((source, name) for name, source in shards.items()), *((f"{STAGED}/{name}", name) for name in staged),
             (f"{STAGED}/{MANIFEST}", MANIFEST)]
    targets = {target for _, target in moves}
    old = [] if append else [path.rsplit("/", 1)[-1] for path in layout.existing_dataset_files(output)]
    return Publication(run_id, dict(options), tuple(moves), tuple(sorted(set(old) - targets)), append)


def write_record(output: str, publication: Publication) -> None:
    """Writes ``publish.json`` in the run's folder, whole or not at all: the publication is committed."""
    body = {"publish_format": _FORMAT, **dataclasses.asdict(publication)}
    resume.write_record(join(layout.run_folder(output, publication.run_id), RECORD), body)


def is_recorded(output: str, run_id: str) -> bool:
    """Whether run ``run_id`` recorded a publication: its folder is then the next run's to finish, never to remove.

    Raises:
      StorageError: the folder cannot be read.
    """
    path = join(layout.run_folder(output, run_id), RECORD)
    try:
        return FileSystems.exists(path)
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("read", path, e) from e


def read_record(output: str, run_id: str) -> Publication | None:
    """The publication run ``run_id`` recorded, or None where it recorded none.

    Raises:
      OptionsError: the record cannot be read or is not one beam-prep writes (a move out of the
        folders, another run's), naming it and ``--overwrite``.
    """
    if not is_recorded(output, run_id):
        return None
    path = join(layout.run_folder(output, run_id), RECORD)
    try:
        body = json.loads(read_bytes(path).decode("utf-8"))
        return _checked(body, run_id)
    except Exception as e:  # unreadable or damaged: each filesystem raises its own types.
        raise OptionsError(f"--output {output} holds run {run_id}, stopped while publishing, whose record "
                           f"{path} cannot be used ({e}); pass --overwrite to start over") from e


def _checked(body: Mapping[str, Any], run_id: str) -> Publication:
    """The record's publication, once its names are checked: it is data in the output folder, and a
    move to ``../x`` or a removal of a file no dataset holds would reach outside the dataset."""
    if body.get("publish_format") != _FORMAT or body.get("run_id") != run_id:
        raise ValueError(f"not run {run_id}'s, or from another beam-prep version")
    moves = tuple((str(source), str(target)) for source, target in body["moves"])
    removes = tuple(str(name) for name in body["removes"])
    for i, (source, target) in enumerate(moves):
        folder, _, name = source.rpartition("/")
        if folder not in ("", STAGED):
            raise ValueError(f"moves[{i}] is from {source!r}, outside the run's folder")
        check_file_name(name, f"moves[{i}]'s source")
        _check_dataset_name(target, f"moves[{i}]'s target")
    for i, name in enumerate(removes):
        _check_dataset_name(name, f"removes[{i}]")
    if not moves or moves[-1][1] != MANIFEST:
        raise ValueError(f"its last move is not the {MANIFEST}")
    if body.get("append", False) and removes:
        raise ValueError("an append's publication removes nothing")
    return Publication(run_id, dict(body["options"]), moves, removes, bool(body.get("append", False)))


def _check_dataset_name(name: str, field: str) -> None:
    check_file_name(name, field)
    if not layout.is_dataset_name(name):
        raise ValueError(f"{field} is {name!r}, not a dataset's file")


def carry_out(output: str, publication: Publication, steps: Steps | None = None) -> None:
    """Does what ``publication`` records that is not done yet, then removes the run's folder.

    The old manifest first, while the new one is still staged (so no reader takes a half-replaced
    folder for a dataset, and a rerun never removes the new one), unless an append's (its new
    shards replace no file, and its manifest replaces the old in one move, last); each move whose source is still
    in the run's folder (a source gone with its target present was moved); the new manifest; the
    old dataset's other files; the run's folder, its record last.

    Raises:
      StorageError: a file could not be moved or removed (the same command finishes it later).
      DatasetError: a move's source and target are both gone (removed by hand): it cannot be finished.
    """
    steps = steps or Steps()
    work = layout.run_folder(output, publication.run_id)
    present = _files_under(work)
    *files, manifest = publication.moves
    gone = [target for source, target in publication.moves if source not in present]
    missing = sorted(set(gone) - _files_in(output)) if gone else []
    if missing:
        raise _lost(output, publication.run_id, missing)
    if manifest[0] in present and not publication.append and FileSystems.exists(join(output, MANIFEST)):
        layout.delete([join(output, MANIFEST)], f"the old dataset's {MANIFEST} in {output}")
        steps.done()
    _move(work, output, [move for move in files if move[0] in present], steps)
    _move(work, output, [manifest] if manifest[0] in present else [], steps)
    old = sorted(set(publication.removes) & _files_in(output))
    for group in ([name] for name in old) if is_local(output) else [old] if old else []:
        layout.delete([join(output, name) for name in group], f"the old dataset's files in {output}")
        steps.done()
    _remove_run_folder(work, steps)


def _lost(output: str, run_id: str, missing: list[str]) -> DatasetError:
    return DatasetError(f"cannot finish publishing run {run_id} into {output}: {len(missing)} of its files are "
                        f"neither in its folder nor in {output} (e.g. {missing[0]}, removed by hand?); "
                        "pass --overwrite to start over")


def _move(work: str, output: str, moves: list[tuple[str, str]], steps: Steps) -> None:
    """Moves each ``(source in work, name in output)``, replacing a file of that name: on local
    disk a rename each (atomic); elsewhere one ``rename`` (gs://: a copy, then a delete, 100 at a time)."""
    if not moves:
        return
    sources = [join(work, source) for source, _ in moves]
    targets = [join(output, target) for _, target in moves]
    if is_local(output):
        for source, target in zip(sources, targets):
            try:
                os.replace(source, target)
            except OSError as e:
                raise storage_error("move to", target, e) from e
            steps.done()
        return
    try:
        FileSystems.rename(sources, targets)
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("move files to", output, e) from e
    steps.done()


def _remove_run_folder(work: str, steps: Steps) -> None:
    """Removes the run's folder, its record last: a folder killed half-removed is still finished by a rerun,
    never taken for a run to resume. Its record gone, the run is over: no step is counted after it."""
    record = join(work, RECORD)
    try:
        if is_local(work):
            for entry in os.scandir(work):
                if entry.name != RECORD:
                    shutil.rmtree(entry.path) if entry.is_dir(follow_symlinks=False) else os.remove(entry.path)
            steps.done()
            with contextlib.suppress(FileNotFoundError):
                os.remove(record)
            os.rmdir(work)
        else:
            others = [join(work, name) for name in sorted(_files_under(work)) if name != RECORD]
            if others:
                FileSystems.delete(others)
            steps.done()
            if FileSystems.exists(record):
                FileSystems.delete([record])
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("remove", work, e) from e


def _files_under(folder: str) -> set[str]:
    """The files under ``folder``, at any depth, by their paths relative to it."""
    try:
        if is_local(folder):
            return {os.path.relpath(os.path.join(parent, name), folder).replace(os.sep, "/")
                    for parent, _, names in os.walk(folder) for name in names}
        prefix = folder.rstrip("/") + "/"
        return {m.path[len(prefix):] for m in FileSystems.match([join(folder, "**")])[0].metadata_list}
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("list", folder, e) from e


def _files_in(output: str) -> set[str]:
    """The names of the files directly in ``output``."""
    try:
        if is_local(output):
            return {entry.name for entry in os.scandir(output) if entry.is_file(follow_symlinks=False)}
        prefix = output.rstrip("/") + "/"
        return {m.path[len(prefix):] for m in FileSystems.match([join(output, "*")])[0].metadata_list}
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("list", output, e) from e


def finish_unfinished(output: str, run_ids: list[str], overwrite: bool) -> list[Publication]:
    """Finishes the publications that runs ``run_ids`` (``layout.unfinished_runs``) were stopped in.

    Call it holding the output's claim, before anything else: then none of them is running. With
    ``overwrite``, a publication that cannot be finished is left for ``--overwrite`` to remove.

    Returns:
      The publications finished, oldest first.

    Raises:
      OptionsError, DatasetError: without ``overwrite``, one cannot be finished, naming ``--overwrite``.
      StorageError: a file could not be moved or removed.
    """
    finished = []
    for run_id in run_ids:
        try:
            publication = read_record(output, run_id)
            if publication is None:
                continue
            _LOG.warning("finishing run %s, stopped while it published its dataset into %s", run_id, output)
            carry_out(output, publication)
        except BeamPrepError as e:
            if not overwrite or not isinstance(e, (OptionsError, DatasetError)):
                raise
            _LOG.warning("%s; --overwrite starts over", e)
            continue
        finished.append(publication)
    return finished
