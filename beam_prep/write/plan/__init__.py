"""Planning, in the launching process before any worker starts: the run's configuration and its checks
(``config``), the tree's listing (``walk``, ``listing``, ``metadata``, ``spill``), the shard counts
(``sharding``), the plan the manifest records (``run_plan``), and the listings the workers read
(``work_files``, ``skipped``)."""
