"""A run's claim on its output folder, so that two runs never write into one folder at once.

Two runs into one ``--output`` used to mix: one read or deleted the other's
work files, and a folder could end with a manifest but no shards. So a run
first claims its output folder and holds the claim until it ends; a second
run is refused with ``OutputBusy``, which names the holder, unless the holder
is gone, in which case its claim is taken over and reported
(``Claim.taken_over``) so that the new run can clean up after it.

The claim is ``<output>/.beam-prep/claim.json`` and holds a ``Holder`` as
JSON: which run, which process on which host, since when. How it is made
exclusive depends on where the folder is:

Local folders
    The kernel decides: the run holds ``flock(LOCK_EX)`` on the claim file
    (through a descriptor that is closed on exec) until it releases the
    claim or its process ends, however it ends; SIGKILL included, so a
    local claim is never stale. A later run that gets the lock and finds a
    holder in the file knows that run ended without releasing. A release
    unlinks the file while still holding the lock; a run that opened the
    old file meanwhile sees, once it has the lock, that the path no longer
    names that file, and starts again. A process forked (not exec'd) from
    the holder shares its lock and keeps the claim alive until it exits.
    On network filesystems the lock is only as good as the server's lock
    support.

gs:// folders
    GCS has no locks, but it checks a write's or delete's generation
    precondition (``ifGenerationMatch``) atomically with the write. The
    claim is created only if absent (generation 0), so of two runs exactly
    one creates it. A daemon thread renews it every ``heartbeat_s``, each
    time only if it is still the version we wrote. A claim is stale when
    its holder ran on this very machine (same host, boot and process
    namespace) and that process is gone, at once; otherwise when GCS last
    updated it more than ``stale_after_s`` ago, by this machine's clock.
    A stale claim is taken over by deleting exactly the version judged
    stale, then creating ours only if absent: two runs taking over at once
    cannot both win. A holder whose renewal finds another version has been
    taken over and says so (``Claim.lost``).

    The numbers: a renewal every 30 s costs one write (2,880 a day, a
    fraction of a cent) and stays far below GCS's limit of one write a
    second per object. A claim is stale after 300 s, ten missed renewals:
    long enough to ride out a renewal's own retries (six attempts of at
    most 30 s each, the claim client's timeouts, and about 8 s of back-off:
    about 190 s at worst), a throttled GCS, a pause of the process or a
    clock a few seconds off, and short enough that a run started after a
    crash elsewhere waits minutes, not hours. A holder paused for longer
    than that (a suspended laptop, a preempted VM) loses its claim, which
    it learns at its next renewal.

Other schemes (through Beam's ``FileSystems``)
    Best effort, not atomic: the claim is written if it does not exist. Two
    runs starting in the same instant may both succeed. There is no renewal,
    so only a holder that ran on this machine and is gone is taken over; a
    claim left by a run that died elsewhere must be deleted by hand, as the
    error says.

The claim shares ``.beam-prep`` with the run's work files, so code that lists
or removes that folder must leave ``claim.json`` to the claim: deleting it
under a live run lets a second run in (a local holder then reports
``Claim.lost``). A release removes the folder once it is empty, and a local
output folder the claim itself created, if it is empty too: a run refused
before it wrote anything leaves nothing behind.
"""
from __future__ import annotations

import logging

from beam_prep.errors import OptionsError
from beam_prep.io.storage import is_local
from beam_prep.write.claim.best_effort import _claim_best_effort
from beam_prep.write.claim.flock import _claim_local
from beam_prep.write.claim.generations import _claim_gcs
from beam_prep.write.claim.holder import (
    CLAIM_NAME,
    DEFAULT_HEARTBEAT_S,
    DEFAULT_STALE_AFTER_S,
    Claim,
    Holder,
    OutputBusy,
    claim_path,
    new_run_id,
)

__all__ = ["CLAIM_NAME", "DEFAULT_HEARTBEAT_S", "DEFAULT_STALE_AFTER_S", "Claim", "Holder", "OutputBusy",
           "claim_output", "claim_path", "new_run_id"]

_LOG = logging.getLogger(__name__)


def claim_output(output: str, run_id: str | None = None, *,
                 stale_after_s: float = DEFAULT_STALE_AFTER_S,
                 heartbeat_s: float | None = DEFAULT_HEARTBEAT_S) -> Claim:
    """Claims ``output`` for this run, taking over a stale claim; see the module docstring.

    Args:
      output: the output folder, local or ``scheme://``.
      run_id: this run's id (``new_run_id()`` by default).
      stale_after_s: gs:// only: a claim not renewed for this long is taken over.
      heartbeat_s: gs:// only: how often ours is renewed; None renews never
        (for a claim held briefly, and for tests). Must be below ``stale_after_s``.

    Raises:
      OutputBusy: another run holds the folder.
      OptionsError: ``heartbeat_s`` is not below ``stale_after_s``.
      StorageError: the claim cannot be read or written.
    """
    if heartbeat_s is not None and not 0 < heartbeat_s < stale_after_s:
        raise OptionsError(f"heartbeat_s ({heartbeat_s}) must be above 0 and below stale_after_s "
                         f"({stale_after_s}), or others take the claim over while this run lives")
    holder = Holder.this_process(run_id or new_run_id())
    if is_local(output):
        claim: Claim = _claim_local(output, holder)
    elif output.startswith("gs://"):
        claim = _claim_gcs(output, holder, stale_after_s, heartbeat_s)
    else:
        claim = _claim_best_effort(output, holder)
    if claim.taken_over is not None:
        _LOG.warning("took over the claim on %s from %s, which had not released it",
                     output, claim.taken_over.describe())
    _LOG.info("run %s claimed %s", holder.run_id, output)
    return claim
