"""The Beam sinks that write the shards: their transforms (``shard_sinks``), their per-element steps
(``steps``), the per-image tally both share (``tally``) and Beam's file sink they use (``file_sink``)."""
