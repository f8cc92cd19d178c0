"""Typed errors: the library raises these; only the command line turns them into messages."""
from __future__ import annotations


class BeamPrepError(Exception):
    """Base class of every error beam-prep raises on purpose."""


class OptionsError(BeamPrepError):
    """A bad option or input layout, found before any work starts."""


class DatasetError(BeamPrepError):
    """A prepared dataset that is missing, incomplete or inconsistent."""


class UnsafeName(DatasetError):
    """A name read from a dataset's own files that would reach outside its folder.

    A manifest's shard name or a path in duplicates.jsonl: absolute, with ``..``, a separator
    or a control character. Refused before anything is read or written; the command exits 2 with its one line.
    """


class StorageError(BeamPrepError):
    """A path that cannot be listed, read or written (missing bucket, no permission...)."""


class WrittenButFailed(BeamPrepError):
    """The dataset was written, then the run failed on a bound its options set, for an automated job.

    The command exits 1 with this one line after its summary.

    Args:
      message: which bound, by how much, and which report says more.
      result: the finished run (``pipeline.RunResult``, or the manifest from
        ``WriteImageDataset``), its manifest included.
    """

    def __init__(self, message: str, result: object = None):
        super().__init__(message)
        self.result = result


class TooManyFailures(WrittenButFailed):
    """More files failed than ``--max_failures`` allows; the dataset was written all the same."""


class CrossSplitLeakage(WrittenButFailed):
    """``--cross_split_duplicates fail`` found copies or near copies in two splits (duplicates.jsonl).

    The dataset was written all the same.
    """


class ElementError(BeamPrepError, TypeError):
    """An element of the wrong shape given to ``WriteImageDataset``.

    A bug in the calling pipeline, not bad data, so it fails the job instead of going to errors.jsonl.
    """


class KernelUnavailable(BeamPrepError):
    """The resize kernel was required (``BEAM_PREP_RESIZE_KERNEL=kernel``) and cannot load here.

    The environment, not an image, is at fault, so it fails the job.
    """


class ImageError(BeamPrepError):
    """One image that cannot become a record; it goes to the errors report, never fails a job.

    ``stage`` says where it failed (read, decode, too_large, convert, resize, encode,
    label, and for ``WriteImageDataset`` split and features) so a user can count failures by reason.

    Args:
      stage: where the image failed; errors.jsonl's ``stage`` field.
      message: what went wrong, for a person; errors.jsonl's ``error`` field.
    """

    def __init__(self, stage: str, message: str):
        super().__init__(message)
        self.stage = stage


class BeamPrepWarning(UserWarning):
    """Something the caller should look at, though the run goes on (``warnings.warn``).

    A library's logging is the caller's to configure, and may show nothing; a warning is seen.
    """


class RunInterrupted(KeyboardInterrupt):
    """A local run stopped by Ctrl-C (SIGINT) or SIGTERM, its workers stopped.

    A ``KeyboardInterrupt``, so that code that stops on one stops on this. What
    the run finished is kept for the same command to resume, where it can be.

    Args:
      message: what was stopped and what was kept, for a person.
      signum: the signal's number (2: SIGINT, 15: SIGTERM); the command exits ``128 + signum``.
      resumable: whether the same command resumes the run (False: it starts over).
    """

    def __init__(self, message: str, signum: int, resumable: bool):
        super().__init__(message)
        self.signum = signum
        self.resumable = resumable
