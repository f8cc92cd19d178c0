"""A run's publication: recorded before ``--output`` is touched, finished after a kill, undone after an error.

``publish.complete`` stages the files the dataset gains in the run's folder, then writes ``publish.json``
naming each move and each old file with its identity (``identity``). ``carry_out`` then moves the old
dataset aside into the run's folder (``replaced/``, its entry files first), the new files in (the
manifest last), and only then removes the old files; an error before the new manifest is in puts the
old dataset back. An append (``--append``) replaces only the files it rewrites (the manifest, the
metadata): each stays in place, a copy set aside, until its new file replaces it in one move, so a
reader sees the previous version whole until the new manifest is in. The order and the guarantees:
docs/design/claim.md, "Publishing".
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import re
import shutil
import signal
import stat
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from apache_beam.io.filesystems import FileSystems

from beam_prep.errors import BeamPrepError, DatasetError, OptionsError, StorageError
from beam_prep.io.storage import is_local, join, open_to_read, read_bytes, storage_error
from beam_prep.model import tfds_metadata
from beam_prep.model.dataset import MANIFEST
from beam_prep.model.names import check_file_name
from beam_prep.write.finish import identity
from beam_prep.write.journal import resume
from beam_prep.write.shared import layout

__all__ = ["ENTRY_FILES", "KEPT_PREFIX", "KILL_VARIABLE", "RECORD", "REPLACED", "STAGED", "Publication", "Steps", "carry_out",
           "finish_unfinished", "is_recorded", "planned", "read_record", "staging_folder", "write_record"]

_LOG = logging.getLogger(__name__)
RECORD = "publish.json"
STAGED = "staged"  # the run folder's subfolder of the files the dataset gains besides its shards
REPLACED = "replaced"  # the run folder's subfolder of the old dataset's files, until the new manifest is in
_FORMAT = 3
_SHA256 = re.compile(r"[0-9a-f]{64}")
# Where ``--overwrite`` keeps an unfinishable publication's old files whose names in ``--output`` are taken.
KEPT_PREFIX = "old-dataset-of-run-"
# What readers open first (beam-prep's manifest, then TFDS's metadata): these leave first, in this
# order, and come in last, in the reverse order, so no reader takes a half-replaced folder for a dataset.
ENTRY_FILES = (MANIFEST, *tfds_metadata.FILES)
_RANK = {name: i for i, name in enumerate(ENTRY_FILES)}
# Test-only: "N" SIGKILLs the run right after step N of its publication (0: as it begins, before
# anything is staged); "fail:N" makes step N fail (an OSError) instead, and "fail:N,kill:M" then
# kills it after step M, while it undoes the publication (tests/write/test_publish_kills.py).
KILL_VARIABLE = "BEAM_PREP_TEST_KILL_AFTER_PUBLISH_STEP"


class Steps:
    """Counts a publication's steps (each write, move or removal), for ``KILL_VARIABLE``."""

    def __init__(self) -> None:
        self._done = 0
        self._kill: int | None = None
        self._fail: int | None = None
        for part in filter(None, os.environ.get(KILL_VARIABLE, "").split(",")):
            what, _, step = part.rpartition(":")
            if what == "fail":
                self._fail = int(step)
            else:
                self._kill = int(step)
        self._check()

    def done(self) -> None:
        """A step is done: the process is killed, or the step fails, here if the test hook names it."""
        self._done += 1
        self._check()

    def _check(self) -> None:
        if self._done == self._kill:
            os.kill(os.getpid(), signal.SIGKILL)
        if self._done == self._fail:
            raise OSError(errno.EIO, f"{KILL_VARIABLE} fails step {self._done}")


@dataclasses.dataclass(frozen=True)
class Publication:
    """``publish.json``: what a run does to ``--output``.

    Attributes:
      run_id: the run, whose folder holds the sources.
      output: the ``--output`` it publishes into.
      options: what a rerun must repeat to be the same command (``resume.record_options``), as JSON.
      moves: ``(source, target, file)``: a path relative to the run's folder, a name in
        ``--output``, and what the file is (``identity.File``); the manifest last.
      old: ``(name, file)``: the old dataset's files in ``--output`` when it was recorded
        (an append's: those its moves replace, no other).
      append: an append's (``--append``): its old files are copied aside, not moved, and each is
        replaced in one move (the manifest last); no file of the dataset is removed, but the report of
        the old version (``layout.REPORT``), moved aside.
    """

    run_id: str
    output: str
    options: dict[str, Any]
    moves: tuple[tuple[str, str, identity.File], ...]
    old: tuple[tuple[str, identity.File], ...]
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


def _leaving(name: str) -> tuple[int, str]:
    """The order files leave ``--output`` in: the entry files first, the manifest first of all."""
    return _RANK.get(name, len(ENTRY_FILES)), name


def _arriving(name: str) -> int:
    """The order files arrive in (a stable sort key): the entry files last, the manifest last of all."""
    return -_RANK.get(name, len(ENTRY_FILES))


def planned(output: str, run_id: str, options: Mapping[str, Any], shards: Mapping[str, str],
            staged: Iterable[str], known: Mapping[str, str] | None = None, append: bool = False) -> Publication:
    """The publication of a run whose files are all in its folder, as ``--output`` holds it now.

    On local disk each file's sha256 is recorded with it (``identity.File``): taken from ``known`` and the
    old manifest's ``shard_sha256`` where they have it, else hashed (the small files, mostly).

    Args:
      output: the output folder.
      run_id: the run.
      options: what a rerun must repeat to be the same command.
      shards: each shard and index file's name -> its path relative to the run's folder.
      staged: the names of the other files, in ``staging_folder``, the manifest among them.
      known: the sha256 of files to publish, by name (the shards', from the run's reports).
      append: the run adds to the dataset (``Publication.append``): only the files it replaces are old.

    Raises:
      DatasetError: a folder or a link stands where a file of the dataset goes (nothing is touched),
        or a file to publish is missing from the run's folder.
      StorageError: a folder cannot be listed.
    """
    work = layout.run_folder(output, run_id)
    pairs = sorted([*((source, name) for name, source in shards.items()),
                    *((f"{STAGED}/{name}", name) for name in sorted(staged))], key=lambda pair: _arriving(pair[1]))
    there, here = identity.identities(work, deep=True), identity.identities(output)
    moves = []
    for source, target in pairs:
        found = there.get(source)
        if found is None or found == identity.NOT_A_FILE:
            raise DatasetError(f"cannot publish run {run_id}: {join(work, source)} is missing or not a file")
        moves.append((source, target, found))
    targets = {target for _, target, _ in moves}
    old = []
    for name in sorted(here, key=_leaving):
        if name in targets or (not append and layout.is_dataset_name(name)) or _is_our_report(output, name, here):
            if here[name] == identity.NOT_A_FILE:
                raise DatasetError(f"cannot publish run {run_id} into {output}: {join(output, name)} is a folder "
                                   f"or a link, where a file of the dataset goes; move it out of {output} and run "
                                   "the same command again")
            old.append((name, here[name]))
    if is_local(output):
        known, old_sums = known or {}, _shard_sha256(output) if here.get(MANIFEST) not in (None, identity.NOT_A_FILE) else {}
        moves = [(s, t, identity.File(f, known.get(t) or identity.sha256_of(join(work, s)))) for s, t, f in moves]
        old = [(n, identity.File(f, old_sums.get(n) or identity.sha256_of(join(output, n)))) for n, f in old]
    else:  # the CRC32C (or the filesystem's checksum) is of the bytes already
        moves = [(s, t, identity.File(f)) for s, t, f in moves]
        old = [(n, identity.File(f)) for n, f in old]
    return Publication(run_id, output, json.loads(json.dumps(dict(options))), tuple(moves), tuple(old), append)


def _is_our_report(output: str, name: str, here: Mapping[str, str]) -> bool:
    """Whether ``name`` is the report of the dataset in ``output`` (``layout.REPORT``, a file beam-prep wrote):
    it shows the old dataset, so a run that changes the dataset, appending or not, moves it aside with the old
    files (``carry_out``), and it goes with them.

    Raises:
      StorageError: the file cannot be read.
    """
    if name != layout.REPORT or here[name] == identity.NOT_A_FILE:
        return False
    path = join(output, name)
    try:
        with open_to_read(path) as f:
            return layout.is_report(f.read(layout.REPORT_HEAD))
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("read", path, e) from e


def _shard_sha256(output: str) -> dict[str, str]:
    """The old manifest's ``shard_sha256`` by shard name: what need not be hashed again (nothing where it has
    none or cannot be read: its files are hashed then)."""
    try:
        body = json.loads(read_bytes(join(output, MANIFEST)).decode("utf-8"))
        return {name: sha for split in body["splits"].values()
                for name, sha in zip(split["shards"], split.get("shard_sha256") or ())
                if isinstance(name, str) and isinstance(sha, str) and _SHA256.fullmatch(sha)}
    except Exception:  # noqa: BLE001 - any manifest beam-prep cannot use: its files are hashed instead
        return {}


def write_record(output: str, publication: Publication) -> None:
    """Writes ``publish.json`` in the run's folder, whole or not at all: the publication is committed."""
    body = {"publish_format": _FORMAT, "run_id": publication.run_id, "output": publication.output,
            "options": publication.options,
            "moves": [{"from": s, "to": t, "file": f.identity, "sha256": f.sha256} for s, t, f in publication.moves],
            "old": [{"name": n, "file": f.identity, "sha256": f.sha256} for n, f in publication.old],
            "append": publication.append}
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
    """The publication run ``run_id`` recorded into ``output``, or None where it recorded none.

    Raises:
      OptionsError: the run's folder is a link, or the record cannot be read or is not one
        beam-prep writes for this ``output`` (naming its field and why, and ``--overwrite``).
    """
    layout.check_run_folder(output, run_id)
    if not is_recorded(output, run_id):
        return None
    path = join(layout.run_folder(output, run_id), RECORD)
    try:
        return _checked(json.loads(read_bytes(path).decode("utf-8")), run_id, output)
    except Exception as e:  # unreadable (each filesystem raises its own types), damaged, or not beam-prep's
        raise OptionsError(f"--output {output} holds run {run_id}, stopped while publishing, whose record "
                           f"{path} cannot be used ({e}); pass --overwrite to start over") from e


def _checked(body: Any, run_id: str, output: str) -> Publication:
    """The record's publication, once every field is checked: it is data in the output folder, and
    a move to ``../x``, or of a file no dataset holds, would reach outside the dataset.

    Raises:
      ValueError, TypeError, UnsafeName: naming the field and what is wrong with it.
    """
    _typed(body, dict, "the record")
    if body.get("publish_format") != _FORMAT:
        raise ValueError(f"publish_format is {body.get('publish_format')!r}, not {_FORMAT} (another beam-prep version)")
    if body.get("run_id") != run_id:
        raise ValueError(f"run_id is {body.get('run_id')!r}: another run's")
    if body.get("output") != output:
        raise ValueError(f"output is {body.get('output')!r}: it publishes into another folder")
    options = _field(body, "options", dict, "options")
    moves = tuple(_move(entry, f"moves[{i}]") for i, entry in enumerate(_field(body, "moves", list, "moves")))
    old = tuple(_old(entry, f"old[{i}]") for i, entry in enumerate(_field(body, "old", list, "old")))
    for field, names in (("from", [m[0] for m in moves]), ("to", [m[1] for m in moves]), ("name", [o[0] for o in old])):
        for i, name in enumerate(names):
            if name in names[:i]:
                where = "old" if field == "name" else "moves"
                raise ValueError(f"{where}[{i}].{field} names {name!r} a second time")
    if not moves or moves[-1][1] != MANIFEST:
        raise ValueError(f"the last of moves is not the {MANIFEST}")
    append = _typed(body.get("append", False), bool, "append")
    kept = [name for name, _ in old if name not in {target for _, target, _ in moves} and name != layout.REPORT]
    if append and kept:
        raise ValueError(f"append is true, but old names {kept[0]!r}, which no move replaces (an append removes "
                         f"nothing but the old version's {layout.REPORT})")
    return Publication(run_id, output, options, moves, old, append)


_KINDS = {dict: "an object", list: "a list", str: "a string", bool: "true or false"}


def _typed(value: Any, kind: type, field: str) -> Any:
    if not isinstance(value, kind):
        found = next((name for k, name in _KINDS.items() if isinstance(value, k)), json.dumps(value)[:40])
        raise TypeError(f"{field} is {found}, not {_KINDS[kind]}")
    return value


def _field(body: Mapping[str, Any], key: str, kind: type, field: str) -> Any:
    if key not in body:
        raise ValueError(f"{field} is missing")
    return _typed(body[key], kind, field)


def _move(entry: Any, field: str) -> tuple[str, str, identity.File]:
    _typed(entry, dict, field)
    source, target, found = (_field(entry, key, str, f"{field}.{key}") for key in ("from", "to", "file"))
    folder, _, name = source.rpartition("/")
    if folder not in ("", STAGED):
        raise ValueError(f"{field}.from is {source!r}, outside the run's folder")
    check_file_name(name, f"{field}.from")
    if name in (RECORD, resume.RUN_RECORD):
        raise ValueError(f"{field}.from is {source!r}, the run's own record")
    _check_dataset_name(target, f"{field}.to")
    return source, target, _checked_file(entry, found, field)


def _old(entry: Any, field: str) -> tuple[str, identity.File]:
    _typed(entry, dict, field)
    name, found = _field(entry, "name", str, f"{field}.name"), _field(entry, "file", str, f"{field}.file")
    _check_dataset_name(name, f"{field}.name")
    return name, _checked_file(entry, found, field)


def _checked_file(entry: Mapping[str, Any], found: str, field: str) -> identity.File:
    """A file's identity (never what stands for a folder or a link, which a publication never moves) and its
    sha256, if any (64 lowercase hex digits)."""
    if found == identity.NOT_A_FILE:
        raise ValueError(f"{field}.file is {found!r}, not a file's identity")
    sha256 = entry.get("sha256")
    if sha256 is not None and not (isinstance(sha256, str) and _SHA256.fullmatch(sha256)):
        raise ValueError(f"{field}.sha256 is {json.dumps(sha256)[:80]}, not a sha256 (64 lowercase hex digits)")
    return identity.File(found, sha256)


def _check_dataset_name(name: str, field: str) -> None:
    check_file_name(name, field)
    if not layout.is_published_name(name):
        raise ValueError(f"{field} is {name!r}, not a dataset's file")


@dataclasses.dataclass
class _State:
    """What is left of a publication: the old files still in ``--output`` and the moves not made."""

    aside: list[str]
    incoming: list[tuple[str, str]]


def _state(output: str, work: str, publication: Publication) -> _State:
    """Where the publication stands, from the identity of each file it names.

    A move is made when its target is the very file it moved; it is to make when its source is; a
    target held by anything else (a file put there by hand, a folder, a link) stops it, as does an
    old file's name held by another file.

    Raises:
      DatasetError: naming the first such file, or the files lost (neither moved nor to move).
    """
    here, there = identity.Listing(output), identity.Listing(work, deep=True)
    old = dict(publication.old)
    incoming, done, lost = [], set(), []
    for source, target, file in publication.moves:
        now = here.get(target)
        if there.holds(source, file):  # to move (on gs://, maybe copied already: a copy again is harmless)
            if now is not None and not here.holds(target, file) and not here.holds(target, old.get(target)):
                raise _in_the_way(output, publication.run_id, target, now)
            incoming.append((source, target))
        elif here.holds(target, file):
            done.add(target)
        elif now is None or here.holds(target, old.get(target)):
            lost.append(target)
        else:
            raise _in_the_way(output, publication.run_id, target, now)
    targets = {target for _, target, _ in publication.moves}
    for name, file in publication.old:
        if name in here and not here.holds(name, file) and name not in targets:
            raise _in_the_way(output, publication.run_id, name, here.get(name))
    if lost:
        raise DatasetError(f"cannot finish publishing run {publication.run_id} into {output}: {len(lost)} of its "
                           f"files are neither in its folder nor in {output} (e.g. {lost[0]}, removed or overwritten by hand?)"
                           f"{_where_old(output, publication.run_id)}; pass --overwrite to start over (it puts "
                           "those back where their names are free)")
    # On gs:// an old file may have the new one's bytes (labels.txt, run again): the name's move decides.
    # An append's old file stays in place: it is aside once its copy is.
    aside = [name for name, file in sorted(publication.old, key=lambda o: _leaving(o[0]))
             if here.holds(name, file) and name not in done
             and not (publication.append and there.holds(f"{REPLACED}/{name}", file))]
    return _State(aside, sorted(incoming, key=lambda move: _arriving(move[1])))


def _in_the_way(output: str, run_id: str, name: str, found: str | None) -> DatasetError:
    what = ("a folder or a link" if found == identity.NOT_A_FILE
            else "neither the old dataset's file nor the one the run moved there (put there by hand?)")
    return DatasetError(f"cannot finish publishing run {run_id} into {output}: {join(output, name)} is {what}"
                        f"{_where_old(output, run_id)}; move it out of {output} and run the same command again, or "
                        "pass --overwrite to start over (it puts those back where their names are free)")


def _where_old(output: str, run_id: str) -> str:
    """Where the old dataset's files the publication moved aside are, said in a refusal ("" where none are)."""
    try:
        aside = len(_replaced_files(output, run_id))
    except BeamPrepError:
        aside = 0
    folder = join(layout.run_folder(output, run_id), REPLACED)
    return f" (the old dataset's {aside} files moved aside are in {folder}/)" if aside else ""


def _replaced_files(output: str, run_id: str) -> dict[str, str]:
    """The old dataset's files a run moved aside (``replaced/``), by name -> identity; none where its folder
    (or ``replaced/``) is a link, never followed.

    Raises:
      StorageError: the folder cannot be listed.
    """
    try:
        layout.check_run_folder(output, run_id)
    except OptionsError:
        return {}
    folder = join(layout.run_folder(output, run_id), REPLACED)
    if is_local(folder) and os.path.islink(folder):
        return {}
    return {name: found for name, found in identity.identities(folder).items() if found != identity.NOT_A_FILE}


def carry_out(output: str, publication: Publication, steps: Steps | None = None) -> None:
    """Does what ``publication`` records that is not done yet, then removes the run's folder.

    The old dataset's files still in ``--output`` are moved aside into the run's folder (its
    manifest, then TFDS's metadata, first; an append's are copied there, and stay in place until
    their new files replace them); the new files still in the run's folder are moved in
    (TFDS's metadata, then the manifest, last); then the run's folder goes, the old files with it,
    its record last. An error before the new manifest is in moves every file back where it was.

    Raises:
      DatasetError: a file it names is not where the publication left it (``_state``): nothing is touched.
      StorageError: a file could not be moved (the old dataset is put back, and the same command
        finishes the publication later) or removed.
    """
    steps = steps or Steps()
    work = layout.run_folder(output, publication.run_id)
    state = _state(output, work, publication)
    try:
        if state.aside:
            _make_folder(join(work, REPLACED))
        aside = {name: (join(output, name), join(work, REPLACED, name)) for name in state.aside}
        if publication.append:  # its old files stay until replaced, but the report of the old version
            _move_all([pair for name, pair in aside.items() if name == layout.REPORT], steps)
            _copy_all([pair for name, pair in aside.items() if name != layout.REPORT], steps)
        else:
            _move_all(list(aside.values()), steps)
        _move_all([(join(work, source), join(output, target)) for source, target in state.incoming], steps)
    except BaseException as e:
        _undo(output, work, publication, steps, e)
        raise
    _remove_run_folder(work, steps)


def _undo(output: str, work: str, publication: Publication, steps: Steps, error: BaseException) -> None:
    """After ``error`` in ``carry_out``: the new files moved back into the run's folder, then the old
    ones back into ``--output``, its manifest last; unless the new manifest is in (then the
    publication is done but for removing the run's folder). Raises ``StorageError`` saying which."""
    try:
        here, there = identity.Listing(output), identity.Listing(work, deep=True)
        if here.holds(MANIFEST, publication.moves[-1][2]):
            return
        old = dict(publication.old)
        back, copies = [], []  # the moves made; on gs://, the copies made of moves not made
        for source, target, file in publication.moves:
            if here.holds(target, file) and not there.holds(source, file):
                back.append((target, source))
            elif here.holds(target, file) and (target not in old or there.holds(f"{REPLACED}/{target}", old[target])):
                copies.append(join(output, target))
        if copies:
            layout.delete(copies, f"the copies of run {publication.run_id}'s files in {output}")
        freed = {target for target, _ in back} | {path.rsplit("/", 1)[-1] for path in copies}
        _move_all([(join(output, target), join(work, source))
                   for target, source in sorted(back, key=lambda move: _leaving(move[0]))], steps)
        restored = [name for name, file in sorted(publication.old, key=lambda o: _arriving(o[0]))
                    if there.holds(f"{REPLACED}/{name}", file) and (name not in here or name in freed)]
        _move_all([(join(work, REPLACED, name), join(output, name)) for name in restored], steps)
        missing = [name for name, file in publication.old
                   if name not in restored and (name in freed or not here.holds(name, file))]
    except Exception as undoing:  # noqa: BLE001 - said with the error that started it
        if isinstance(error, Exception):
            raise StorageError(f"{error}; putting the old dataset back failed too ({undoing}): run the same command "
                               f"again to finish publishing run {publication.run_id}") from error
        _LOG.error("could not put the old dataset back into %s: %s", output, undoing)
        return
    if not isinstance(error, Exception):
        return
    if missing:
        raise StorageError(f"{error}; {len(missing)} of {output}'s old dataset's files could not be put back, being "
                           f"in neither {output} nor {join(work, REPLACED)}/ (e.g. {missing[0]}); run "
                           f"{publication.run_id}'s publication is kept in its folder: run the same command again to "
                           "finish it") from error
    raise StorageError(f"{error}; {output} holds its old dataset again, and run {publication.run_id}'s "
                       "publication is kept in its folder: run the same command again to finish it") from error


def _make_folder(folder: str) -> None:
    """Makes a subfolder of the run's folder on local disk (a folder there: not a link)."""
    if not is_local(folder):
        return
    try:
        os.makedirs(folder, exist_ok=True)
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", folder)
    except OSError as e:
        raise storage_error("create", folder, e) from e


def _move_all(pairs: list[tuple[str, str]], steps: Steps | None) -> None:
    """Moves each ``(source, target)`` in order, replacing a file at the target: on local disk a rename
    each (atomic), a step each; elsewhere an entry file alone and the others together, a ``rename``
    each (gs://: copies, then deletes, 100 at a time), a step each (none counted without ``steps``)."""
    for group in _groups(pairs):
        if is_local(group[0][0]):
            (source, target), = group
            try:
                os.replace(source, target)
            except OSError as e:
                raise storage_error("move to", target, e) from e
        else:
            try:
                FileSystems.rename([source for source, _ in group], [target for _, target in group])
            except Exception as e:  # each filesystem raises its own types.
                raise storage_error("move files to", group[0][1].rsplit("/", 1)[0], e) from e
        if steps is not None:
            steps.done()


def _copy_all(pairs: list[tuple[str, str]], steps: Steps) -> None:
    """Copies each ``(source, target)``, keeping what the file is (``identity``): on local disk a hard
    link each, a step each; elsewhere one ``copy`` (gs://: server-side copies, 100 at a time), a step."""
    if not pairs:
        return
    if is_local(pairs[0][0]):
        for source, target in pairs:
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(target)  # a copy that is not the file's: of another try
                os.link(source, target, follow_symlinks=False)
            except OSError as e:
                raise storage_error("copy to", target, e) from e
            steps.done()
        return
    try:
        FileSystems.copy([source for source, _ in pairs], [target for _, target in pairs])
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("copy files to", pairs[0][1].rsplit("/", 1)[0], e) from e
    steps.done()


def _groups(pairs: list[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
    together: list[tuple[str, str]] = []
    for pair in pairs:
        if is_local(pair[0]) or pair[0].rsplit("/", 1)[-1] in _RANK:
            if together:
                yield together
                together = []
            yield [pair]
        else:
            together.append(pair)
    if together:
        yield together


def _remove_run_folder(work: str, steps: Steps) -> None:
    """Removes the run's folder, its record last: a folder killed half-removed is still finished by a rerun,
    never taken for a run to resume. Its record gone, the run is over: no step is counted after it (an
    empty run's folder left by a kill is removed by the next run: ``finish_unfinished``)."""
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
            others = [join(work, name) for name in sorted(identity.identities(work, deep=True)) if name != RECORD]
            if others:
                FileSystems.delete(others)
            steps.done()
            if FileSystems.exists(record):
                FileSystems.delete([record])
    except Exception as e:  # each filesystem raises its own types.
        raise storage_error("remove", work, e) from e


def _holds_no_file(output: str, run_id: str) -> bool:
    """Whether run ``run_id``'s folder holds no file at any depth (a link is refused: ``check_run_folder``)."""
    layout.check_run_folder(output, run_id)
    work = layout.run_folder(output, run_id)
    return (not is_local(work) or os.path.isdir(work)) and not identity.identities(work, deep=True)


def _put_back_replaced(output: str, run_id: str) -> None:
    """Before ``--overwrite`` removes the folder of a run whose publication cannot be finished: the old
    dataset's files it moved aside (``replaced/``) go back into ``output`` where their names are free (its
    manifest last); the others into ``output/<KEPT_PREFIX><run_id>``: none is removed.

    Raises:
      StorageError: a file could not be moved (nothing is removed then).
    """
    aside_folder = join(layout.run_folder(output, run_id), REPLACED)
    here = identity.identities(output)
    names = sorted(_replaced_files(output, run_id), key=_arriving)
    back = [name for name in names if name not in here and layout.is_published_name(name)]
    _move_all([(join(aside_folder, name), join(output, name)) for name in back], None)
    kept = [name for name in names if name not in back]
    if back:
        _LOG.warning("put %d files of the old dataset back into %s (e.g. %s)", len(back), output, back[-1])
    if kept:
        folder = join(output, KEPT_PREFIX + run_id)
        _make_folder(folder)
        _move_all([(join(aside_folder, name), join(folder, name)) for name in kept], None)
        _LOG.warning("kept %d files of the old dataset, whose names in %s are taken, in %s", len(kept), output,
                     folder)


def finish_unfinished(output: str, run_ids: list[str], overwrite: bool) -> list[Publication]:
    """Finishes the publications that runs ``run_ids`` (``layout.unfinished_runs``) were stopped in.

    Call it holding the output's claim, before anything else: then none of them is running. A run's
    folder that holds no file (what a run killed as it removed its finished folder leaves) is
    removed. With ``overwrite``, a publication that cannot be finished is left for ``--overwrite``
    to remove.

    Returns:
      The publications finished, oldest first.

    Raises:
      OptionsError, DatasetError: without ``overwrite``, one cannot be finished, naming ``--overwrite``.
      StorageError: a file could not be moved or removed.
    """
    finished = []
    for run_id in run_ids:
        try:
            if _holds_no_file(output, run_id):
                layout.remove_run_folder(output, run_id)
                continue
            publication = read_record(output, run_id)
            if publication is None:
                continue
            _LOG.warning("finishing run %s, stopped while it published its dataset into %s", run_id, output)
            carry_out(output, publication)
        except BeamPrepError as e:
            if not overwrite or not isinstance(e, (OptionsError, DatasetError)):
                raise
            _LOG.warning("%s; --overwrite starts over", e)
            _put_back_replaced(output, run_id)
            continue
        finished.append(publication)
    return finished
