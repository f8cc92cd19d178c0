"""What a run records while its workers write: each finished shard's record and the run's own
(``resume``, read back to resume a stopped run) and the images finished so far (``progress``).
Below the sinks that write these records and the launcher that reads them."""
