"""Image work: one file's bytes to one record (``examples``), by decoding, resizing and encoding it
(``imaging``, the resize kernel ``resample*``), with its reads running ahead (``readahead``)."""
