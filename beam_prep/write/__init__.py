"""The writer: an image tree (or a pipeline's own elements) to sharded TFRecords and a manifest.

Its modules live in sub-rooms by what they hold, each importing only the rooms
listed before it (tests/test_layout.py keeps it so):

* ``shared``: what every stage shares: a listed file (``FileEntry``), where a
  run's and a dataset's files go (``layout``), the shard file formats.
* ``images``: one file's bytes to one record: decode, resize (the resize
  kernel), encode; reads running ahead of the work.
* ``plan``: in the launcher, before any worker starts: the configuration and
  its checks, the tree's listing, the shard counts, the ``RunPlan`` the
  manifest records, and the listings the workers read.
* ``journal``: what a run records while it runs (a finished shard's
  ``ShardRecord``, the run's ``RunRecord``, the images done so far), below
  both the sinks that write it and the launcher that reads it back.
* ``finish``: the dataset's description (the manifest), built by a pure
  function from what the shards report, and the one step that publishes it
  with the shards; the duplicates report.
* ``sinks``: the Beam transforms and steps that write the shards, and the
  per-image tally both sinks share.
* ``run``: what orchestrates a run and so sits above everything it calls:
  ``prepare``'s pipeline, ``WriteImageDataset`` for a user's own pipeline, the
  output folder's claim, signals, Beam's private API.

Why this order and not the stages' own (plan, images, sinks, finish, run): a
room may only use what is below it. Planning checks image options and lists
image names, so it sits on the image room; what the sinks record for a resumed
run and the progress display sits below them; and the manifest step is called
by the orchestration, never by the sinks, so a run's calls only go down.
Nothing here imports TensorFlow or the rooms above the writer (tools, cli, api).
"""
