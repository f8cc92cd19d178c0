"""Reads a dataset's split through a torch ``DataLoader`` with 2 worker processes, two epochs.

    python -m tests.children.torch_loaders data_source|webdataset|orders DATASET

``data_source`` (dict items, shuffled by the ``DataLoader``) or the WebDataset recipe
(``webdataset_pipeline(..., with_meta=True)``), as a training script would use them: worker
processes, hence a child. Two epochs of ``train`` (the same, persistent, workers) and one of
``validation``. Prints one JSON line: per epoch, every ``[filename, label]`` read, and whether
every image was a writable uint8 array.

``orders``: the WebDataset recipe's ``train`` order, three epochs, for each worker setting (none,
two started each epoch, two persistent), with and without ``set_epoch`` before each epoch; and
the order of an epoch set on persistent workers already running. Prints one JSON line:
setting -> the file names of each epoch, in the order the loader gave them.
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


def names(loader: torch.utils.data.DataLoader) -> list[str]:
    return [meta["filename"] for batch in loader for _, _, meta in batch]


def orders(dataset: str) -> dict[str, list[list[str]]]:
    out = {}
    for workers, persistent in ((0, False), (2, False), (2, True)):
        for set_epoch in (False, True):
            items = beam_prep.webdataset_pipeline(dataset, "train", with_meta=True, seed=7)
            loader = torch.utils.data.DataLoader(items, batch_size=16, num_workers=workers, collate_fn=keep,
                                                 persistent_workers=persistent)
            epochs = []
            for epoch in range(3):
                if set_epoch:
                    items.set_epoch(epoch)
                epochs.append(names(loader))
            out[f"workers={workers} persistent={persistent} set_epoch={set_epoch}"] = epochs
    # An epoch set once persistent workers run (a resumed training) reaches them.
    items = beam_prep.webdataset_pipeline(dataset, "train", with_meta=True, seed=7)
    loader = torch.utils.data.DataLoader(items, batch_size=16, num_workers=2, collate_fn=keep, persistent_workers=True)
    first = names(loader)
    items.set_epoch(5)
    out["persistent, then set_epoch(5)"] = [first, names(loader)]
    items = beam_prep.webdataset_pipeline(dataset, "train", with_meta=True, seed=7)
    items.set_epoch(5)
    out["started anew at set_epoch(5)"] = [names(torch.utils.data.DataLoader(items, batch_size=16, num_workers=2,
                                                                             collate_fn=keep))]
    other = beam_prep.webdataset_pipeline(dataset, "train", with_meta=True, seed=8)
    out["seed=8"] = [names(torch.utils.data.DataLoader(other, batch_size=16, num_workers=2, collate_fn=keep))]
    return out


if __name__ == "__main__":
    reader, dataset = sys.argv[1:3]
    if reader == "orders":
        print(json.dumps(orders(dataset)))
        sys.exit(0)
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
