"""Running the writer: ``prepare``'s job planned, built and run (``pipeline``), ``WriteImageDataset``
for a user's own Beam pipeline (``write_image_dataset``), the output folder's claim (``claim``),
stopping on a signal (``interrupt``), and what the runners need (``beam_compat``, ``worker_requirements``)."""
