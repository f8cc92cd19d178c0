"""Reads a dataset's split through a torch ``DataLoader`` with 2 worker processes, two epochs.

    python -m tests.children.torch_loaders data_source|webdataset DATASET

``data_source`` (dict items, shuffled by the ``DataLoader``) or the WebDataset recipe
(``webdataset_pipeline(..., with_meta=True)``), as a training script would use them: worker
processes, hence a child. Two epochs of ``train`` (the same, persistent, workers) and one of
``validation``. Prints one JSON line: per epoch, every ``[filename, label]`` read, and whether
every image was a writable uint8 array.
"""
import json
import sys

import numpy as np
import torch

import beam_prep


def keep(batch):
    return batch  # a list of items: file names stay strings, images as they came


def loader(reader: str, dataset: str, split: str) -> torch.utils.data.DataLoader:
    if reader == "data_source":
        items = beam_prep.data_source(dataset, split)
        return torch.utils.data.DataLoader(items, batch_size=64, shuffle=split == "train", num_workers=2,
                                           collate_fn=keep, persistent_workers=True)
    items = beam_prep.webdataset_pipeline(dataset, split, with_meta=True)
    return torch.utils.data.DataLoader(items, batch_size=64, num_workers=2, collate_fn=keep,
                                       persistent_workers=True)


if __name__ == "__main__":
    reader, dataset = sys.argv[1:3]
    epochs, writable = {"train": [], "validation": []}, True
    for split, count in (("train", 2), ("validation", 1)):
        batches = loader(reader, dataset, split)
        for _ in range(count):
            read = []
            for batch in batches:
                for item in batch:
                    image, label, name = ((item["image"], item["label"], item["filename"]) if reader == "data_source"
                                          else (item[0], item[1], item[2]["filename"]))
                    writable &= isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.flags.writeable
                    read.append([name, int(label)])
            epochs[split].append(read)
    print(json.dumps({"epochs": epochs, "writable": bool(writable)}))
