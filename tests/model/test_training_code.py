"""Existing training code reads our output with the flags and settings the README's
"Use with existing training code" section gives.

Each consumer's input code is re-implemented from its facts (file patterns,
compression, feature keys, types and defaults, label arithmetic), not copied:
tensorflow/tpu's ResNet ``imagenet_input``, TF Model Garden's classification
``Decoder``/``Parser``, TF-slim's ``datasets/imagenet.py`` with
``dataset_utils``. TensorFlow Datasets is the real one: ``builder_from_directory``.
Every result is compared with our own reader, record by record, by file name.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import pathlib
import shutil

import numpy as np
import pytest
from helpers import encode, make_tree, prepare_here, read_split
from lazy import tf
from PIL import Image

from beam_prep.errors import DatasetError
from beam_prep.model import features, tfds_metadata
from beam_prep.model.dataset import DatasetInfo, SplitInfo, VersionInfo
from beam_prep.reader import ImageInfo, RecordFiles, load_info, make_dataset
from beam_prep.tools.sample import picture
from beam_prep.write.shared import layout

COUNTS = {"cat": 2, "dog": 3, "emu": 2}
SIZE = 16


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("tree")
    make_tree(root, COUNTS, splits=("train", "validation"), size=(24, 20))
    return root


def _prepare(tmp_path_factory, tree: pathlib.Path, name: str, *flags: str) -> pathlib.Path:
    """``flags`` after ``--image_size SIZE``; ``--resize_mode none`` takes none."""
    out = tmp_path_factory.mktemp(name) / "out"
    keeps_size = any(flag == "--resize_mode" and value == "none" for flag, value in itertools.pairwise(flags))
    size = () if keeps_size else ("--image_size", str(SIZE))
    prepare_here("--input", str(tree), "--output", str(out), *size, "--num_shards", "2", *flags)
    return out


@pytest.fixture(scope="module")
def imagenet_style(tmp_path_factory, tree) -> pathlib.Path:
    """What ImageNet-style code (tpu, slim) reads: uncompressed, id 0 kept for background,
    TF-slim's labels.txt."""
    return _prepare(tmp_path_factory, tree, "imagenet_style", "--compression", "none",
                    "--label_offset", "1", "--labels_txt", "slim")


@pytest.fixture(scope="module")
def default_gzip(tmp_path_factory, tree) -> pathlib.Path:
    return _prepare(tmp_path_factory, tree, "default_gzip")


@pytest.fixture(scope="module")
def plain_gray_png(tmp_path_factory, tree) -> pathlib.Path:
    return _prepare(tmp_path_factory, tree, "plain_gray_png", "--compression", "none",
                    "--image_format", "png", "--channels", "1")


@pytest.fixture(scope="module")
def plain_raw(tmp_path_factory, tree) -> pathlib.Path:
    return _prepare(tmp_path_factory, tree, "plain_raw", "--compression", "none",
                    "--image_format", "raw", "--label_offset", "2")


@pytest.fixture(scope="module")
def originals(tmp_path_factory, tree) -> pathlib.Path:
    """Whole images for ImageNet-style training (README: the originals recipe, uncompressed for the
    TPU code): the sources' own JPEG bytes, and JPEGs made of a PNG, a CMYK, a grey and a rotated
    source, of varying sizes."""
    root = tmp_path_factory.mktemp("originals_tree") / "tree"
    shutil.copytree(tree, root)
    exif = Image.Exif()
    exif[0x0112] = 8
    extras = {"drawing.png": encode(picture(1, 40, 28), "PNG"),
              "cmyk.jpg": encode(picture(2, 36, 30).convert("CMYK"), "JPEG"),
              "grey.jpg": encode(picture(3, 30, 36).convert("L"), "JPEG"),
              "rotated.jpg": encode(picture(4, 44, 30), "JPEG", exif=exif.tobytes())}
    for name, data in extras.items():
        (root / "train" / "cat" / name).write_bytes(data)
    return _prepare(tmp_path_factory, root, "originals", "--resize_mode", "none", "--image_format", "original",
                    "--compression", "none", "--label_offset", "1")


def _manifest(out: pathlib.Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def ours(out: pathlib.Path, split: str) -> dict[bytes, tuple[int, np.ndarray]]:
    """Our reader's (label id, uint8 image) for each record, by file name."""
    ds = make_dataset(str(out), split, batch_size=None, training=False, extra_keys=[features.FILENAME])
    return {extra[features.FILENAME].numpy(): (int(label), image.numpy()) for image, label, extra in ds}


def test_our_reader_yields_ids_that_index_the_labels_whatever_the_offset(imagenet_style, plain_raw):
    for out, offset in ((imagenet_style, 1), (plain_raw, 2)):
        manifest = _manifest(out)
        assert manifest["label_offset"] == offset
        info = load_info(str(out))
        for split in ("train", "validation"):
            stored = {r["image/filename"]: r for r in read_split(out, split)}
            read = ours(out, split)
            assert len(read) == len(stored) == manifest["splits"][split]["num_examples"]
            for name, (label, _) in read.items():
                assert stored[name]["image/class/label"] == label + offset
                assert info.labels[label] == stored[name]["image/class/text"].decode()
        # One-hot vectors are as deep as the labels: no column for the reserved ids.
        _, one_hot = next(iter(make_dataset(str(out), "train", batch_size=4, one_hot=True)))
        assert one_hot.shape[1] == len(COUNTS)


def test_bare_files_take_the_offset_too(imagenet_style):
    files = RecordFiles(str(imagenet_style / "train-*"), ImageInfo(SIZE, SIZE, 3, "jpeg"),
                        num_classes=len(COUNTS), compression="NONE", label_offset=1)
    ds = make_dataset(files, batch_size=None, extra_keys=[features.FILENAME])
    bare = {extra[features.FILENAME].numpy(): int(label) for _, label, extra in ds}
    assert bare == {name: label for name, (label, _) in ours(imagenet_style, "train").items()}


def test_labels_txt_stays_the_label_list_with_an_offset(plain_raw, default_gzip):
    # Line k (from 0) is stored id k + label_offset: the file is still a valid --labels_file.
    for out in (plain_raw, default_gzip):
        assert (out / "labels.txt").read_text().splitlines() == sorted(COUNTS)


# --- tensorflow/tpu ResNet: imagenet_input.ImageNetInput.dataset_parser -----------------


def _tpu_features(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
    """Its spec (keys, types, defaults)."""
    spec = {
        "image/encoded": tf.io.FixedLenFeature((), tf.string, ""),
        "image/format": tf.io.FixedLenFeature((), tf.string, "jpeg"),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64, -1),
        "image/class/text": tf.io.FixedLenFeature([], tf.string, ""),
        "image/object/bbox/xmin": tf.io.VarLenFeature(tf.float32),
        "image/object/bbox/ymin": tf.io.VarLenFeature(tf.float32),
        "image/object/bbox/xmax": tf.io.VarLenFeature(tf.float32),
        "image/object/bbox/ymax": tf.io.VarLenFeature(tf.float32),
        "image/object/class/label": tf.io.VarLenFeature(tf.int64),
    }
    return tf.io.parse_single_example(serialized, spec)


def _tpu_label(parsed: dict[str, tf.Tensor]) -> tf.Tensor:
    """Its label arithmetic: ids from 1, 0 is background."""
    return tf.cast(tf.reshape(parsed["image/class/label"], []), tf.int32) - 1


def _tpu_parse(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    parsed = _tpu_features(serialized)
    return tf.io.decode_jpeg(parsed["image/encoded"], channels=3), _tpu_label(parsed)


# resnet_preprocessing: IMAGE_SIZE (ours is SIZE) and CROP_PADDING.
TPU_CROP_PADDING = 32


def _tpu_decode_and_center_crop(image_bytes: tf.Tensor) -> tf.Tensor:
    """Evaluation: the centre square of SIZE / (SIZE + 32) of the shorter side, decoded alone (the
    stored channels: decode_and_crop_jpeg's default), bicubic to SIZE."""
    shape = tf.image.extract_jpeg_shape(image_bytes)
    crop = tf.cast(SIZE / (SIZE + TPU_CROP_PADDING) * tf.cast(tf.minimum(shape[0], shape[1]), tf.float32),
                   tf.int32)
    window = tf.stack([(shape[0] - crop + 1) // 2, (shape[1] - crop + 1) // 2, crop, crop])
    image = tf.image.convert_image_dtype(tf.image.decode_and_crop_jpeg(image_bytes, window), tf.float32)
    return tf.image.resize([image], [SIZE, SIZE], method="bicubic")[0]


def _tpu_decode_and_random_crop(image_bytes: tf.Tensor) -> tf.Tensor:
    """Training: a crop of 8-100% of the area (10% covered at least), aspect 3/4 to 4/3, 10
    attempts, decoded alone; when the sampler gives the whole image back, the evaluation crop."""
    shape = tf.image.extract_jpeg_shape(image_bytes)
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape, bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4]), min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    image = tf.image.convert_image_dtype(tf.image.decode_and_crop_jpeg(image_bytes, window), tf.float32)
    bad = tf.reduce_sum(tf.cast(tf.equal(shape, tf.shape(image)), tf.int32)) >= 3
    return tf.cond(bad, lambda: _tpu_decode_and_center_crop(image_bytes),
                   lambda: tf.image.resize([image], [SIZE, SIZE], method="bicubic")[0])


def test_tpu_resnet_reads_uncompressed_output_with_label_offset_1(imagenet_style):
    manifest = _manifest(imagenet_style)
    names = manifest["labels"]
    filename_spec = {"image/filename": tf.io.FixedLenFeature([], tf.string)}
    for split, pattern in (("train", "train-*"), ("validation", "validation-*")):
        # Its file patterns match exactly the split's shards, nothing else in the folder.
        files = sorted(tf.io.gfile.glob(str(imagenet_style / pattern)))
        assert [f.rsplit("/", 1)[-1] for f in files] == manifest["splits"][split]["shards"]
        read = ours(imagenet_style, split)
        seen = 0
        for serialized in tf.data.TFRecordDataset(files):  # uncompressed, as it opens them
            image, label = _tpu_parse(serialized)
            name = tf.io.parse_single_example(serialized, filename_spec)["image/filename"].numpy()
            assert int(label) == read[name][0] and 0 <= int(label) < len(names)
            assert names[int(label)] == name.decode().split("/")[-2]
            assert image.shape == (SIZE, SIZE, 3)
            seen += 1
        assert seen == len(read)


def test_tpu_resnet_trains_and_evaluates_on_originals(originals):
    """preprocess_for_train and _for_eval, reshaped to [SIZE, SIZE, 3] as it does: every record
    must decode to 3 channels with decode_and_crop_jpeg's default (the stored channels)."""
    manifest = _manifest(originals)
    assert manifest["originals"]["reencoded_by_reason"] == {"not_jpeg": 1, "cmyk": 1, "channels": 1, "rotated": 1}
    for split in ("train", "validation"):
        files = sorted(tf.io.gfile.glob(str(originals / f"{split}-*")))
        assert [f.rsplit("/", 1)[-1] for f in files] == manifest["splits"][split]["shards"]
        read = ours(originals, split)
        sizes = set()
        for serialized in tf.data.TFRecordDataset(files):
            parsed = _tpu_features(serialized)
            name = _filename(serialized)
            assert int(_tpu_label(parsed)) == read[name][0]
            for image in (_tpu_decode_and_random_crop(parsed["image/encoded"]),
                          _tpu_decode_and_center_crop(parsed["image/encoded"])):
                image = tf.reshape(tf.image.random_flip_left_right(image), [SIZE, SIZE, 3])
                assert np.isfinite(image.numpy()).all()
            # The whole stored image, as its decode gives it: the reader's pixels (another DCT).
            whole = tf.io.decode_jpeg(parsed["image/encoded"]).numpy()
            assert whole.shape == read[name][1].shape
            assert np.abs(whole.astype(int) - read[name][1]).mean() < 3
            sizes.add(whole.shape)
        assert len(sizes) > 1 or split == "validation"  # whole images of their own sizes


def test_tpu_resnet_cannot_read_the_default_gzip_output(default_gzip):
    files = tf.io.gfile.glob(str(default_gzip / "train-*"))
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset(files))


# --- TF Model Garden: official/vision/dataloaders/classification_input -----------------


def _garden_records(pattern: str, file_type: str) -> tf.data.Dataset:
    """Its input reader: list_files, then TFRecordDataset, GZIP for ``tfrecord_compressed``."""
    compression = "GZIP" if file_type == "tfrecord_compressed" else None
    files = tf.data.Dataset.list_files(pattern, shuffle=False)
    return files.interleave(lambda f: tf.data.TFRecordDataset(f, compression_type=compression))


def _garden_decode(serialized: tf.Tensor, decode_jpeg_only: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """Its Decoder's spec, then its Parser's decode: a crop-decode of the JPEG
    (``decode_jpeg_only: true``, the default) or ``decode_image`` to 3 channels; labels as stored."""
    spec = {
        "image/encoded": tf.io.FixedLenFeature((), tf.string, ""),
        "image/format": tf.io.FixedLenFeature((), tf.string, "jpeg"),
        "image/class/label": tf.io.FixedLenFeature((), tf.int64, -1),
    }
    parsed = tf.io.parse_single_example(serialized, spec)
    encoded = parsed["image/encoded"]
    if decode_jpeg_only:
        shape = tf.image.extract_jpeg_shape(encoded)
        image = tf.image.decode_and_crop_jpeg(encoded, tf.stack([0, 0, shape[0], shape[1]]), channels=3)
    else:
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    return image, tf.cast(parsed["image/class/label"], tf.int32)


def _filename(serialized: tf.Tensor) -> bytes:
    spec = {"image/filename": tf.io.FixedLenFeature([], tf.string)}
    return tf.io.parse_single_example(serialized, spec)["image/filename"].numpy()


def test_model_garden_reads_the_default_gzip_output_as_tfrecord_compressed(default_gzip):
    for split in ("train", "validation"):
        read = ours(default_gzip, split)
        records = list(_garden_records(str(default_gzip / f"{split}*"), "tfrecord_compressed"))
        assert len(records) == len(read)
        for serialized in records:
            image, label = _garden_decode(serialized, decode_jpeg_only=True)
            ours_label, ours_image = read[_filename(serialized)]
            assert int(label) == ours_label
            # The same JPEG decoded by another DCT: within a few levels of ours.
            assert np.abs(image.numpy().astype(int) - ours_image).mean() < 3


def _garden_train_image(image_bytes: tf.Tensor) -> tf.Tensor:
    """Its Parser's training image with ``decode_jpeg_only: true``: random_crop_image_v2 (8-100%
    of the area, aspect 3/4 to 4/3, 10 attempts, the crop decoded alone, 3 channels), or the
    centre 0.875 of the shorter side when the sampler gives the whole image back; a flip;
    bilinear to the output size."""
    shape = tf.image.extract_jpeg_shape(image_bytes)
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape, tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4]), seed=1, min_object_covered=0.08,
        aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10)
    cropped = tf.image.decode_and_crop_jpeg(image_bytes, tf.stack([begin[0], begin[1], size[0], size[1]]),
                                            channels=3)

    def center() -> tf.Tensor:
        float_shape = tf.cast(shape, tf.float32)
        side = 0.875 * tf.minimum(float_shape[0], float_shape[1])
        offset = tf.cast((float_shape - side) / 2.0, tf.int32)
        side = tf.cast(side, tf.int32)
        return tf.image.decode_and_crop_jpeg(image_bytes, tf.stack([offset[0], offset[1], side, side]), channels=3)

    image = tf.cond(tf.reduce_all(tf.equal(tf.shape(cropped), shape)), center, lambda: cropped)
    image = tf.image.random_flip_left_right(image)
    return tf.image.resize(image, [SIZE, SIZE], method="bilinear")


def test_model_garden_trains_on_originals(originals):
    """``file_type: tfrecord`` on the uncompressed originals; ids as stored (offset 1 included)."""
    for split in ("train", "validation"):
        read = ours(originals, split)
        records = list(_garden_records(str(originals / f"{split}*"), "tfrecord"))
        assert len(records) == len(read)
        for serialized in records:
            parsed = tf.io.parse_single_example(serialized, {
                "image/encoded": tf.io.FixedLenFeature((), tf.string, ""),
                "image/class/label": tf.io.FixedLenFeature((), tf.int64, -1)})
            assert int(parsed["image/class/label"]) == read[_filename(serialized)][0] + 1
            assert _garden_train_image(parsed["image/encoded"]).shape == (SIZE, SIZE, 3)


def test_model_garden_default_file_type_cannot_read_gzip(default_gzip):
    with pytest.raises(tf.errors.DataLossError):
        list(_garden_records(str(default_gzip / "train*"), "tfrecord"))


def test_model_garden_reads_png_with_decode_jpeg_only_false(plain_gray_png):
    read = ours(plain_gray_png, "train")
    records = list(_garden_records(str(plain_gray_png / "train*"), "tfrecord"))
    with pytest.raises(tf.errors.InvalidArgumentError):
        _garden_decode(records[0], decode_jpeg_only=True)
    for serialized in records:
        image, label = _garden_decode(serialized, decode_jpeg_only=False)
        ours_label, ours_image = read[_filename(serialized)]
        assert int(label) == ours_label
        # Grayscale comes out as 3 equal channels, each exactly our pixels (PNG is lossless).
        assert (image.numpy() == np.repeat(ours_image, 3, axis=-1)).all()


# --- TF-slim: datasets/imagenet.py get_split with dataset_utils ---------------------------


def _slim_read_label_file(folder: pathlib.Path) -> dict[int, str]:
    """dataset_utils.read_label_file: non-empty lines, split at the first ':'."""
    labels = {}
    for line in filter(None, (folder / "labels.txt").read_text().split("\n")):
        index = line.index(":")
        labels[int(line[:index])] = line[index + 1:]
    return labels


def _slim_decode(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
    """get_split's keys_to_features and items_to_handlers (Image by image/format, the label as stored)."""
    spec = {
        "image/encoded": tf.io.FixedLenFeature((), tf.string, ""),
        "image/format": tf.io.FixedLenFeature((), tf.string, "jpeg"),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64, -1),
        "image/class/text": tf.io.FixedLenFeature([], tf.string, ""),
        "image/object/bbox/xmin": tf.io.VarLenFeature(tf.float32),
        "image/object/class/label": tf.io.VarLenFeature(tf.int64),
    }
    parsed = tf.io.parse_single_example(serialized, spec)
    assert parsed["image/format"].numpy() in (b"jpeg", b"JPEG")
    return {"image": tf.io.decode_jpeg(parsed["image/encoded"], channels=3),
            "label": parsed["image/class/label"], "label_text": parsed["image/class/text"]}


def test_slim_get_split_reads_output_written_with_labels_txt_slim(imagenet_style):
    labels_to_names = _slim_read_label_file(imagenet_style)
    assert labels_to_names == {i + 1: name for i, name in enumerate(sorted(COUNTS))}
    for split in ("train", "validation"):
        files = sorted(tf.io.gfile.glob(str(imagenet_style / f"{split}-*")))  # _FILE_PATTERN '%s-*'
        read = ours(imagenet_style, split)
        items = [(_slim_decode(s), _filename(s)) for s in tf.data.TFRecordDataset(files)]
        assert len(items) == len(read)
        for item, name in items:
            label = int(item["label"])
            assert labels_to_names[label] == item["label_text"].numpy().decode()
            # train_image_classifier's --labels_offset=1 gives our reader's ids.
            assert label - 1 == read[name][0]


def test_slim_cannot_parse_the_default_labels_txt(default_gzip):
    with pytest.raises(ValueError, match="substring not found"):
        _slim_read_label_file(default_gzip)


# --- TensorFlow Datasets: the real builder_from_directory ----------------------------------


@pytest.fixture(scope="module")
def plain_shuffled(tmp_path_factory, tree) -> pathlib.Path:
    """The shuffle sink's (Dataflow's) output: WriteToTFRecord's shards, counted afterwards."""
    return _prepare(tmp_path_factory, tree, "plain_shuffled", "--compression", "none", "--sink", "shuffle")


@pytest.mark.parametrize("which", ["imagenet_style", "plain_gray_png", "plain_raw", "plain_shuffled"])
def test_tfds_reads_every_record_with_the_right_label(which, request):
    import tensorflow_datasets as tfds

    out = request.getfixturevalue(which)
    manifest = _manifest(out)
    offset = manifest["label_offset"]
    builder = tfds.builder_from_directory(str(out))
    label_feature = builder.info.features[features.LABEL]
    assert label_feature.names == tfds_metadata.class_names(manifest["labels"], offset)
    assert set(builder.info.splits) == set(manifest["splits"])
    for split, expected in manifest["splits"].items():
        assert builder.info.splits[split].num_examples == expected["num_examples"]
        read = ours(out, split)
        examples = list(tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)))
        assert len(examples) == len(read)
        for ex in examples:
            label, image = read[ex[features.FILENAME]]
            assert ex[features.LABEL] == label + offset
            assert label_feature.int2str(ex[features.LABEL]) == ex[features.LABEL_TEXT].decode()
            if manifest["image"]["format"] == "jpeg":  # TFDS decodes with TensorFlow's default DCT
                assert np.abs(ex[features.ENCODED].astype(int) - image).mean() < 3
            else:
                assert (ex[features.ENCODED] == image).all()
    image, label = next(iter(tfds.as_numpy(builder.as_dataset(split="train", as_supervised=True))))
    assert image.shape == (SIZE, SIZE, manifest["image"]["channels"]) and label >= offset


def test_tfds_show_examples_draws_the_dataset(imagenet_style):
    import matplotlib
    import tensorflow_datasets as tfds

    matplotlib.use("Agg")
    builder = tfds.builder_from_directory(str(imagenet_style))
    figure = tfds.show_examples(builder.as_dataset(split="train"), builder.info, rows=1, cols=2)
    titles = sorted(ax.get_xlabel() for ax in figure.axes)
    assert len(titles) == 2 and all(t.split(" ")[0] in COUNTS for t in titles)


def test_gzip_output_has_no_tfds_metadata(default_gzip):
    for name in tfds_metadata.FILES:
        assert not (default_gzip / name).exists()


def test_tfds_metadata_belongs_to_the_dataset(imagenet_style, tmp_path):
    """--overwrite and the check for an occupied --output see TFDS's files as the dataset's."""
    copy = tmp_path / "copy"
    shutil.copytree(imagenet_style, copy)
    (copy / "manifest.json").unlink()
    owned = {p.rsplit("/", 1)[-1] for p in layout.existing_dataset_files(str(copy))}
    assert set(tfds_metadata.FILES) <= owned


def test_reserved_ids_get_names_no_label_has():
    names = tfds_metadata.class_names(["reserved_0", "cat"], 2)
    assert names == ["_reserved_0", "reserved_1", "reserved_0", "cat"]


def test_tfds_metadata_is_refused_where_tfds_could_not_read_the_shards():
    image = ImageInfo(SIZE, SIZE, 3, "jpeg")
    counted = {"train": SplitInfo("train", ("train-00000-of-00001.tfrecord",), 3, (3,))}
    uncounted = {"train": SplitInfo("train", ("train-00000-of-00001.tfrecord",), 3, None)}
    readable = DatasetInfo("out", ("a",), counted, image, "NONE")
    assert tfds_metadata.unsupported(readable) is None
    misnamed = {"train": SplitInfo("train", ("train-00000-of-00002.tfrecord",), 3, (3,))}
    for info, reason in ((dataclasses.replace(readable, compression="GZIP"), "--compression none"),
                         (dataclasses.replace(readable, splits=uncounted), "record count"),
                         (dataclasses.replace(readable, splits=misnamed), "not named as its template"),
                         (dataclasses.replace(readable, image=ImageInfo(None, None, 3, "raw")), "--image_size")):
        assert reason in tfds_metadata.unsupported(info)
        with pytest.raises(DatasetError, match="no TFDS metadata"):
            tfds_metadata.metadata_files(info, "out")


def test_the_tfds_split_of_a_version_names_each_versions_additions():
    image = ImageInfo(SIZE, SIZE, 3, "jpeg")
    v1 = VersionInfo(1, {"train": (("train-00000-of-00001.tfrecord",), 3, None)}, 1)
    v2 = VersionInfo(2, {"train": (("train-v2-00000-of-00001.tfrecord",), 1, None),
                         "test": (("test-v2-00000-of-00001.tfrecord",), 1, None)}, 2)
    splits = {"train": SplitInfo("train", (*v1.added["train"][0], *v2.added["train"][0]), 4, (3, 1)),
              "test": SplitInfo("test", v2.added["test"][0], 1, (1,))}
    info = DatasetInfo("out", ("a", "b"), splits, image, "NONE", versions=(v1, v2))
    assert [name for name, _, _ in tfds_metadata.tfds_splits(info)] == ["train", "train-v2", "test-v2"]
    assert tfds_metadata.unsupported(info) is None
    assert (tfds_metadata.split_spec(info, "train"), tfds_metadata.split_spec(info, "train", 1),
            tfds_metadata.split_spec(info, "test")) == ("train+train-v2", "train", "test-v2")
    for split, version, message in (("test", 1, "no split 'test' at version 1: it has 'train'"),
                                    ("train", 3, "has no version 3: it has versions 1-2")):
        with pytest.raises(DatasetError, match=message):
            tfds_metadata.split_spec(info, split, version)
