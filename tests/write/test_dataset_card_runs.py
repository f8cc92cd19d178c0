"""The dataset card every run writes (README.md), read by Hugging Face's own ``datasets``: the oracle.

``load_dataset(OUT)`` on a WebDataset output must give the label as a ``ClassLabel`` of the
manifest's names (hostile ones as written), each split's records as we wrote them (checked by
Hugging Face against the card's counts too); on a TFRecord output it finds nothing, and the card
says so. An append writes the card again; a README.md the user put there stays; gs:// gets one.
"""
from __future__ import annotations

import json
import pathlib

import pytest
import yaml
from helpers import make_tree, prepare_here

from beam_prep.io import tar

pytestmark = pytest.mark.slow  # every test runs a pipeline

LABELS = ("cat", "<b>\"dog\" & 'co'<i> | x", "שלום", "🐱 emoji")
CARD = "README.md"
ARGS = ("--image_size", "16", "--validation_percent", "40", "--file_format", "webdataset")


@pytest.fixture(scope="module")
def hf_datasets(tmp_path_factory):
    """Hugging Face's ``datasets``, offline, its caches under the test's folder."""
    home = tmp_path_factory.mktemp("hf-home")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in (("HF_DATASETS_OFFLINE", "1"), ("HF_HUB_OFFLINE", "1"), ("HF_HOME", str(home))):
            patch.setenv(key, value)
        datasets = pytest.importorskip("datasets")
        datasets.disable_progress_bars()
        yield datasets


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("card") / "tree"
    make_tree(root, {label: 3 + i for i, label in enumerate(LABELS)}, size=(20, 18))
    return root


@pytest.fixture(scope="module")
def webdataset(tree, tmp_path_factory) -> tuple[pathlib.Path, dict]:
    out = tmp_path_factory.mktemp("wds") / "records"
    return out, prepare_here("--input", str(tree), "--output", str(out), *ARGS)


def front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n", 2)[1])


def our_samples(out: pathlib.Path, shards: list[str]) -> list[tuple[str, int, bytes]]:
    """(file name, .cls, image bytes) of each sample of ``shards``, read from the tar members."""
    rows = []
    for shard in shards:
        with open(out / shard, "rb") as f:
            for _, members in tar.samples(f):
                by_ext = {name.rsplit(".", 1)[1]: data for name, data in members}
                rows.append((json.loads(by_ext["json"])["filename"], int(by_ext["cls"]), by_ext["jpg"]))
    return sorted(rows)


def load(datasets, out: pathlib.Path, tmp_path: pathlib.Path):
    return datasets.load_dataset(str(out), cache_dir=str(tmp_path / "hf-cache"))


def test_hugging_face_reads_a_webdataset_output_with_its_class_names_and_our_records(webdataset, hf_datasets, tmp_path):
    out, manifest = webdataset
    loaded = load(hf_datasets, out, tmp_path)
    assert set(loaded) == set(manifest["splits"]) == {"train", "validation"}
    for split, info in manifest["splits"].items():
        part = loaded[split]
        label = part.features["cls"]
        assert isinstance(label, hf_datasets.ClassLabel) and label.names == manifest["labels"] == sorted(LABELS)
        assert part.num_rows == info["num_examples"]
        raw = part.cast_column("jpg", hf_datasets.Image(decode=False))
        theirs = sorted((row["json"]["filename"], row["cls"], row["jpg"]["bytes"]) for row in raw)
        assert theirs == our_samples(out, info["shards"])
        by_name = {label.int2str(row["cls"]) for row in part}
        assert by_name == {name for name, n in info["class_counts"].items() if n}


def test_the_cards_counts_and_names_are_the_manifests_and_its_table_shows_names_as_written(webdataset):
    out, manifest = webdataset
    text = (out / CARD).read_text(encoding="utf-8")
    meta = front_matter(text)
    (cls,) = [f for f in meta["dataset_info"]["features"] if f["name"] == "cls"]
    assert list(cls["dtype"]["class_label"]["names"].values()) == manifest["labels"]
    assert {s["name"]: s["num_examples"] for s in meta["dataset_info"]["splits"]} == {
        name: s["num_examples"] for name, s in manifest["splits"].items()}
    (config,) = meta["configs"]
    assert {f["split"]: f["path"] for f in config["data_files"]} == {
        name: s["shards"] for name, s in manifest["splits"].items()}
    ids = {name: i for i, name in enumerate(manifest["labels"])}
    assert f"| &lt;b&gt;&quot;dog&quot; &amp; &#x27;co&#x27;&lt;i&gt; &#124; x | {ids[LABELS[1]]} |" in text
    assert f"| 🐱 emoji | {ids['🐱 emoji']} |" in text and f"| שלום | {ids['שלום']} |" in text


def test_a_tfrecord_output_gets_a_card_that_says_hugging_face_cannot_read_it(tree, hf_datasets, tmp_path):
    out = tmp_path / "records"
    manifest = prepare_here("--input", str(tree), "--output", str(out), "--image_size", "16")
    text = (out / CARD).read_text(encoding="utf-8")
    meta = front_matter(text)
    assert "configs" not in meta and "dataset_info" not in meta and meta["task_categories"] == ["image-classification"]
    assert "no reader for tfrecord shards" in text and "beam_prep.make_dataset(" in text
    assert f"| **all** | | {manifest['splits']['train']['num_examples']} |" in text
    with pytest.raises(hf_datasets.exceptions.DataFilesNotFoundError):
        load(hf_datasets, out, tmp_path)


def test_an_append_writes_the_card_again_with_its_new_class_and_counts(tree, hf_datasets, tmp_path):
    out = tmp_path / "records"
    prepare_here("--input", str(tree), "--output", str(out), *ARGS)
    batch = tmp_path / "batch"
    make_tree(batch, {"zebra": 2, "cat": 1}, size=(21, 17))
    manifest = prepare_here("--input", str(batch), "--output", str(out), "--append")
    assert manifest["labels"][-1] == "zebra"
    loaded = load(hf_datasets, out, tmp_path)
    for split, info in manifest["splits"].items():
        assert loaded[split].features["cls"].names == manifest["labels"]
        assert loaded[split].num_rows == info["num_examples"]
        assert sorted(r[:2] for r in our_samples(out, info["shards"])) == sorted(
            (row["json"]["filename"], row["cls"]) for row in loaded[split])


def test_a_readme_the_user_put_in_the_output_folder_stays_as_it_is(tree, tmp_path, caplog):
    out = tmp_path / "records"
    out.mkdir()
    mine = "---\nlicense: mit\n---\n# My dataset\n\nWritten by hand.\n"
    (out / "README.md").write_text(mine, encoding="utf-8")
    prepare_here("--input", str(tree), "--output", str(out), *ARGS)
    assert (out / "README.md").read_text(encoding="utf-8") == mine
    assert any("README.md is not a dataset card beam-prep wrote" in r.getMessage() for r in caplog.records)
    # The next run (--overwrite) leaves it too: it is not the dataset's to replace.
    prepare_here("--input", str(tree), "--output", str(out), *ARGS, "--overwrite")
    assert (out / "README.md").read_text(encoding="utf-8") == mine


def test_a_card_beam_prep_wrote_is_replaced_by_an_overwrite(tree, tmp_path):
    out = tmp_path / "records"
    prepare_here("--input", str(tree), "--output", str(out), *ARGS)
    prepare_here("--input", str(tree), "--output", str(out), "--image_size", "16", "--overwrite")
    assert "no reader for tfrecord shards" in (out / CARD).read_text(encoding="utf-8")


def test_a_dataset_on_gs_gets_its_card(tree, gcs_bucket):
    out = gcs_bucket.url("records")
    manifest = prepare_here("--input", str(tree), "--output", out, *ARGS)
    meta = front_matter(gcs_bucket.read_bytes("records/README.md").decode("utf-8"))
    assert meta["task_categories"] == ["image-classification"]
    assert {s["name"]: s["num_examples"] for s in meta["dataset_info"]["splits"]} == {
        name: s["num_examples"] for name, s in manifest["splits"].items()}


def test_the_card_is_the_same_bytes_on_a_rerun_into_another_folder(tree, webdataset, tmp_path):
    out, _ = webdataset
    again = tmp_path / "elsewhere"
    prepare_here("--input", str(tree), "--output", str(again), *ARGS)
    assert (again / "README.md").read_bytes() == (out / "README.md").read_bytes()

