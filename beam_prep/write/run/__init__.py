"""Running the writer: ``prepare``'s job planned, built and run (``pipeline``), ``WriteImageDataset``
for a user's own Beam pipeline (``write_image_dataset``), the output folder's claim (``claim``),
stopping on a signal (``interrupt``), the workers started while the run lists (``warm_pool``,
``warm_worker``), and what the runners need (``beam_compat``, ``worker_requirements``)."""
