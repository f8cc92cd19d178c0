"""A run's claim on its output folder, so that two runs never write into one folder at once.

A run claims ``--output`` first and holds the claim until it ends; a second run
is refused with ``OutputBusy``, naming the holder, unless the holder is gone:
then its claim is taken over (``Claim.taken_over``) so the new run can clean up
after it. The claim is ``<output>/.beam-prep/claim.json``, a ``Holder`` as JSON,
made exclusive by a kernel lock on local disk (``flock``), by generation
preconditions on gs:// (``generations``), and best effort elsewhere
(``best_effort``). Code that clears ``.beam-prep`` must leave ``claim.json`` alone.

See docs/design/claim.md for how each kind works, staleness and takeover, and why the defaults.
"""
from __future__ import annotations

import logging

from beam_prep.errors import OptionsError
from beam_prep.io.storage import is_local
from beam_prep.write.run.claim.best_effort import _claim_best_effort
from beam_prep.write.run.claim.flock import _claim_local
from beam_prep.write.run.claim.generations import _claim_gcs
from beam_prep.write.run.claim.holder import (
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
    """Claims ``output`` for this run, taking over a stale claim; see docs/design/claim.md.

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
