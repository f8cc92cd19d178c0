"""What every stage of the writer shares: a listed file (``entry``), where a run's and a dataset's
files go (``layout``), and the shard file formats (``shard_formats``). Imports no other room of the writer."""
