"""Claims on local folders: a kernel lock (``flock``) that ends with its process; see ``beam_prep.write.run.claim``."""
from __future__ import annotations

import fcntl
import logging
import os
import time

from beam_prep.errors import OptionsError, StorageError
from beam_prep.io.storage import storage_error
from beam_prep.write.run.claim.holder import (
    _ATTEMPTS,
    Claim,
    Holder,
    OutputBusy,
    claim_path,
)

_LOG = logging.getLogger(__name__)

# A busy local claim's file may be read while its holder writes it.
_READ_TRIES = 20
_READ_PAUSE_S = 0.01


class _LocalClaim(Claim):
    def __init__(self, output: str, holder: Holder, taken_over: Holder | None, fd: int,
                 created: list[str]) -> None:
        super().__init__(output, holder, taken_over)
        self._fd = fd
        self._created = created  # folders the claim made, deepest first: a refused run leaves none

    @property
    def lost(self) -> bool:
        return not self._released and not _names_file(self.path, self._fd)

    def _release(self) -> None:
        try:
            if _names_file(self.path, self._fd):  # never unlink a later run's claim
                os.unlink(self.path)
            else:
                _LOG.warning("the claim %s was removed or replaced while run %s held it",
                             self.path, self.run_id)
        finally:
            os.close(self._fd)  # drops the lock
        for folder in [os.path.dirname(self.path), *self._created]:
            try:
                os.rmdir(folder)
            except OSError:
                return  # not empty (the run's work files, its dataset), or gone already


def _claim_local(output: str, holder: Holder) -> Claim:
    path = claim_path(output)
    work = os.path.dirname(path)
    if os.path.islink(work):  # its entries are taken for runs' folders, and removed with --overwrite
        raise OptionsError(f"--output {output} holds {os.path.basename(work)} as a link to {os.readlink(work)}: "
                           "beam-prep keeps each run's files in a folder of its own there, and removes them; "
                           "remove the link")
    created = _missing_folders(output)
    for _ in range(_ATTEMPTS):
        fd = _open_claim_file(path)
        if fd is None:
            continue  # a release removed the folder between makedirs and open
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            busy = _read_local_holder(fd, wait=True) or Holder.unknown()
            os.close(fd)
            raise OutputBusy(output, busy, f"still running (it holds the lock on {path})",
                             "wait for it to end, or stop it") from None
        except OSError as e:
            os.close(fd)
            raise StorageError(f"cannot lock {path}: {e}; the output folder's filesystem must "
                               "support flock") from e
        if not _names_file(path, fd):
            os.close(fd)  # released and unlinked while we waited for the lock
            continue
        previous = _read_local_holder(fd, wait=False)
        _write_local_holder(fd, holder)
        return _LocalClaim(output, holder, previous, fd, created)
    raise StorageError(f"cannot claim {output}: {path} kept being replaced")


def _missing_folders(folder: str) -> list[str]:
    """``folder`` and its parents that do not exist yet, deepest first."""
    missing = []
    while folder and not os.path.exists(folder) and folder != os.path.dirname(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    return missing


def _open_claim_file(path: str) -> int | None:
    """The claim file, created if need be; None if a release removed its folder meanwhile."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except (FileNotFoundError, FileExistsError):
        # makedirs raises FileExistsError too when the folder it found existing is removed
        # before it checks that it is a folder.
        return None
    except OSError as e:
        raise storage_error("create the claim", path, e) from e


def _names_file(path: str, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        by_path = os.stat(path)
    except FileNotFoundError:
        return False
    by_fd = os.fstat(fd)
    return (by_path.st_dev, by_path.st_ino) == (by_fd.st_dev, by_fd.st_ino)


def _read_local_holder(fd: int, wait: bool) -> Holder | None:
    """The holder in the file, None if it is empty; ``wait``: give a writer a moment to finish."""
    for attempt in range(_READ_TRIES if wait else 1):
        data = os.pread(fd, 64 * 1024, 0)
        if not data.strip():
            if not wait:
                return None
        else:
            try:
                return Holder.from_json(data)
            except ValueError:
                if not wait:
                    return Holder.unknown()
        time.sleep(_READ_PAUSE_S)
    return None


def _write_local_holder(fd: int, holder: Holder) -> None:
    data = holder.to_json()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
