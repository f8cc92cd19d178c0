"""The dataset card's text for each kind of dataset, read by Hugging Face's own card parser and
``DatasetInfo``: names as written, whatever they hold; the label a ``ClassLabel`` only where
Hugging Face's WebDataset reader can give one; a card that says why where it cannot."""
from __future__ import annotations

import pytest

from beam_prep.model import dataset_card
from beam_prep.model.dataset import DatasetInfo, ImageInfo, SplitInfo

HOSTILE = ("<script>alert('x')</script>", 'a "quoted" | piped `name`', "שלום עולם", "🐱‍👤 cat", "back\\slash",
           "- not a list", "null", "yes", "0", "  spaced  ", "#hash", "a: b")


def info(labels=("cat", "dog"), file_format="webdataset", splits=("train", "validation"), **kwargs) -> DatasetInfo:
    return DatasetInfo("out", tuple(labels), {
        split: SplitInfo(split, (f"{split}-00000-of-00001.tar",), 2 * len(labels), (2 * len(labels),),
                         {label: 2 for label in labels} if labels else None, shard_bytes=(10240,))
        for split in splits}, ImageInfo(16, 16), "NONE", file_format=file_format, **kwargs)


def hf_features(text: str):
    hub = pytest.importorskip("huggingface_hub")
    datasets = pytest.importorskip("datasets")
    data = hub.DatasetCard(text).data.to_dict()
    return datasets, datasets.DatasetInfo._from_yaml_dict(data["dataset_info"]), data


@pytest.mark.parametrize("count", [1, 1000])
def test_hugging_face_reads_every_class_name_as_written(count):
    labels = sorted({*HOSTILE, *(f"class {i:04d}" for i in range(count - len(HOSTILE)))})[:count]
    text = dataset_card.card(info(labels), {"counts": {"listed": 1}})
    datasets, parsed, data = hf_features(text)
    assert isinstance(parsed.features["cls"], datasets.ClassLabel) and parsed.features["cls"].names == labels
    assert {name: split.num_examples for name, split in parsed.splits.items()} == {
        "train": 2 * count, "validation": 2 * count}
    assert data["configs"][0]["data_files"][0] == {"split": "train", "path": ["train-00000-of-00001.tar"]}
    assert dataset_card.is_ours(text)


def test_names_show_as_written_in_the_markdown_table_never_as_markup():
    text = dataset_card.card(info(HOSTILE[:3]), {})
    body = text.split("\n---\n", 1)[1]
    assert "<script>" not in body and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in body
    assert "| a &quot;quoted&quot; &#124; piped &#96;name&#96; |" in body
    assert "| שלום עולם |" in body


def test_a_label_offset_makes_cls_a_plain_int():
    _, parsed, _ = hf_features(dataset_card.card(info(label_offset=1), {}))
    assert parsed.features["cls"].dtype == "int64"


def test_an_unlabelled_webdataset_has_no_cls_column():
    _, parsed, _ = hf_features(dataset_card.card(info(labels=()), {}))
    assert "cls" not in parsed.features and "label" not in parsed.features["json"]
    assert "jpg" in parsed.features


@pytest.mark.parametrize("kind, why", [
    ({"file_format": "tfrecord"}, "no reader for tfrecord shards"),
    ({"file_format": "array_record"}, "no reader for array_record shards"),
    ({"multi_label": True}, "these records hold a list of labels"),
])
def test_a_dataset_hugging_face_cannot_read_gets_a_card_saying_why_without_data_files(kind, why):
    text = dataset_card.card(info(**kind), {})
    front = text.split("\n---\n", 1)[0]
    assert why in text and "configs" not in front and "dataset_info" not in front


def test_a_readme_of_ones_own_is_not_ours():
    assert not dataset_card.is_ours("# My dataset\n")
    assert not dataset_card.is_ours("---\nlicense: mit\n---\n")
    assert dataset_card.is_ours(dataset_card.card(info(), {}))
    assert dataset_card.is_ours("\ufeff" + dataset_card.card(info(), {}))
