"""beam-prep: labelled image folder trees to sharded TFRecords, and back.

    import beam_prep
    manifest = beam_prep.prepare("images", "records", image_size=224, validation_percent=10)
    train = beam_prep.make_dataset("records", "train", batch_size=256)

    # --file_format array_record, for Grain or PyTorch (no TensorFlow, no Beam):
    source = beam_prep.data_source("records", "train")
    # --file_format webdataset, for PyTorch's webdataset:
    dataset = beam_prep.webdataset_pipeline("records", "train")
    # --compression none or --file_format webdataset, inside an NVIDIA DALI pipeline_def:
    images, labels = beam_prep.dali_reader("records", "train")

    # or, inside a Beam pipeline that finds its images its own way:
    pairs | beam_prep.WriteImageDataset("records", labels=["cat", "dog"], image_size=224)

The names are loaded on first use: a Beam worker that imports the writer's
modules never imports TensorFlow, and a training script that only reads never
imports Beam's pipeline machinery.
"""
from __future__ import annotations

import importlib
import logging
from typing import Any

__version__ = "0.1.0"

# A library's records are the application's to show: none reach Python's last-resort
# handler (stderr) unless the application configures logging.
logging.getLogger(__name__).addHandler(logging.NullHandler())

_HOMES = {
    "prepare": "beam_prep.api",
    "PlannedRun": "beam_prep.write.plan.planned",
    "WriteImageDataset": "beam_prep.write.run.write_image_dataset",
    "ImageElement": "beam_prep.write.run.write_image_dataset",
    "make_dataset": "beam_prep.reader",
    "load_info": "beam_prep.reader",
    "ReaderConfig": "beam_prep.reader",
    "RecordFiles": "beam_prep.reader",
    "data_source": "beam_prep.reader.data_source",
    "webdataset_pipeline": "beam_prep.reader.webdataset_recipe",
    "shard_urls": "beam_prep.reader.webdataset_recipe",
    "dali_reader": "beam_prep.reader.dali",
    "tfds_split": "beam_prep.reader.tfds_split",
}
__all__ = ["__version__", *_HOMES]  # noqa: PLE0604  the lazy names, listed once in _HOMES


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'beam_prep' has no attribute {name!r}")
