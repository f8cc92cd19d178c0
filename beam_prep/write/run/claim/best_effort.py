"""Claims on other filesystems: written if absent, not atomic; see ``beam_prep.write.run.claim``."""
from __future__ import annotations

import logging

from apache_beam.io.filesystems import FileSystems

from beam_prep.write.run.claim.holder import (
    Claim,
    Holder,
    OutputBusy,
    _guarded,
    _parse_holder,
    claim_path,
)

_LOG = logging.getLogger(__name__)


class _BestEffortClaim(Claim):
    def _release(self) -> None:
        try:
            FileSystems.delete([self.path])
        except Exception as e:  # noqa: BLE001 - each filesystem raises its own types.
            _LOG.warning("could not remove the claim %s: %s", self.path, e)


def _claim_best_effort(output: str, holder: Holder) -> Claim:
    path = claim_path(output)
    previous = _guarded(path, "read the claim", lambda: _read_best_effort(path))
    if previous is not None and not previous.is_gone():
        raise OutputBusy(output, previous, "as its claim says",
                         f"wait for it to end, or stop it; if it is gone, delete {path}")

    def write() -> None:
        with FileSystems.create(path, mime_type="application/json") as f:
            f.write(holder.to_json())

    _guarded(path, "write the claim", write)
    return _BestEffortClaim(output, holder, previous)


def _read_best_effort(path: str) -> Holder | None:
    if not FileSystems.exists(path):
        return None
    with FileSystems.open(path, mime_type="application/json") as f:
        return _parse_holder(f.read())
