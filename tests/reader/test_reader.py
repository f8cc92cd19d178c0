"""The reader (``beam_prep.reader.make_dataset``) on datasets the real pipeline wrote.

Each dataset is written once per module by ``python -m pipelines.prepare_images``
(in-memory DirectRunner: the pipeline's own tests cover its process modes) and
checked against the records themselves, parsed by plain TensorFlow
(``helpers.read_split``), never against the reader's own idea of them.
"""
from __future__ import annotations

import io
import json
import math
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest
from helpers import REPO, child, encode, make_tree, prepare_here, read_split
from lazy import tf
from PIL import Image

from beam_prep.errors import DatasetError, OptionsError
from beam_prep.model import features
from beam_prep.reader import ImageInfo, RandomCropFlip, ReaderConfig, RecordFiles, load_info, make_dataset
from beam_prep.reader.decode import decode_window, resize
from beam_prep.tools.sample import picture

SIZE = 32
COUNTS = {"cat": 7, "dog": 6, "eel": 5}
SHARDS = 3


def _prepare(tmp_path_factory, name: str, *flags: str, sizes=((96, 64),)) -> pathlib.Path:
    root = tmp_path_factory.mktemp(name)
    tree = root / "tree"
    labels = list(COUNTS)
    for i, size in enumerate(sizes):
        # Several sizes: each in its own labels, so images of every size are read.
        part = {k: n for j, (k, n) in enumerate(COUNTS.items()) if j % len(sizes) == i}
        make_tree(tree, part, size=size)
    out = root / "out"
    prepare_here("--input", str(tree), "--output", str(out), "--num_shards", str(SHARDS), *flags)
    assert sorted(json.loads((out / "manifest.json").read_text())["labels"]) == sorted(labels)
    return out


@pytest.fixture(scope="module")
def jpeg_ds(tmp_path_factory) -> pathlib.Path:
    return _prepare(tmp_path_factory, "jpeg", "--image_size", str(SIZE), "--validation_percent", "30")


@pytest.fixture(scope="module")
def png_ds(tmp_path_factory) -> pathlib.Path:
    return _prepare(tmp_path_factory, "png", "--image_size", str(SIZE), "--image_format", "png")


@pytest.fixture(scope="module")
def raw_ds(tmp_path_factory) -> pathlib.Path:
    return _prepare(tmp_path_factory, "raw", "--image_size", str(SIZE), "--image_format", "raw")


@pytest.fixture(scope="module")
def gray_ds(tmp_path_factory) -> pathlib.Path:
    return _prepare(tmp_path_factory, "gray", "--image_size", str(SIZE), "--channels", "1")


@pytest.fixture(scope="module")
def plain_ds(tmp_path_factory) -> pathlib.Path:
    """Uncompressed shards: ``--compression none``, manifest compression NONE."""
    return _prepare(tmp_path_factory, "plain", "--image_size", str(SIZE), "--compression", "none")


@pytest.fixture(scope="module")
def varying_ds(tmp_path_factory) -> pathlib.Path:
    """Shorter side 24: 96x64 pictures become 36x24, 64x80 ones 24x30."""
    return _prepare(tmp_path_factory, "varying", "--resize_mode", "shorter_side", "--image_size", "24",
                    "--image_format", "png", sizes=((96, 64), (64, 80)))


@pytest.fixture(scope="module")
def originals_ds(tmp_path_factory) -> pathlib.Path:
    """The source JPEGs themselves (96x64 and 64x80), as ImageNet-style training reads them."""
    return _prepare(tmp_path_factory, "originals", "--resize_mode", "none", "--image_format", "original",
                    sizes=((96, 64), (64, 80)))


def _manifest(path: pathlib.Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def _read_all(ds: tf.data.Dataset) -> tuple[np.ndarray, np.ndarray, list[bytes]]:
    """Images, labels and filenames of a dataset made with extra_keys=(FILENAME,)."""
    images, labels, names = [], [], []
    for x, y, extra in ds:
        images.append(x.numpy())
        labels.append(y.numpy())
        names += list(extra[features.FILENAME].numpy())
    return np.concatenate(images), np.concatenate(labels), names


def _stored_pixels(record: dict) -> np.ndarray:
    """What the writer stored, decoded without TensorFlow."""
    data = record[features.ENCODED]
    if record[features.FORMAT] == b"raw":
        shape = (record[features.HEIGHT], record[features.WIDTH], record[features.CHANNELS])
        return np.frombuffer(data, np.uint8).reshape(shape)
    image = Image.open(io.BytesIO(data))
    if record[features.CHANNELS] == 1:
        return np.asarray(image.convert("L"))[..., None]
    return np.asarray(image.convert("RGB"))


def _eval(path, **kwargs) -> tf.data.Dataset:
    return make_dataset(str(path), training=False, extra_keys=(features.FILENAME,), **kwargs)


# --- what comes out ---------------------------------------------------------


def test_one_epoch_yields_every_record_exactly_once(jpeg_ds):
    ds = make_dataset(str(jpeg_ds), "train", batch_size=4, training=True, extra_keys=(features.FILENAME,))
    _, _, names = _read_all(ds)
    expected = [r[features.FILENAME] for r in read_split(jpeg_ds, "train")]
    assert sorted(names) == sorted(expected)
    assert len(names) == len(set(names)) == _manifest(jpeg_ds)["splits"]["train"]["num_examples"]


def test_labels_match_the_folders(jpeg_ds):
    labels = load_info(str(jpeg_ds)).labels
    for split in ("train", "validation"):
        _, ids, names = _read_all(_eval(jpeg_ds, split=split, batch_size=5))
        assert [labels[i] for i in ids] == [n.decode().split("/")[0] for n in names]


def test_jpeg_pixels_equal_what_pillow_decodes_from_the_stored_jpeg(jpeg_ds):
    images, _, names = _read_all(_eval(jpeg_ds, batch_size=5))
    stored = {r[features.FILENAME]: _stored_pixels(r) for r in read_split(jpeg_ds, "train")}
    for image, name in zip(images, names, strict=True):
        np.testing.assert_array_equal(image, stored[name], err_msg=name.decode())


@pytest.mark.parametrize("fmt", ["png", "raw"])
def test_lossless_pixels_equal_what_the_writer_stored(fmt, png_ds, raw_ds):
    path = {"png": png_ds, "raw": raw_ds}[fmt]
    images, _, names = _read_all(_eval(path, batch_size=5))
    records = read_split(path, "train")
    assert {r[features.FORMAT] for r in records} == {fmt.encode()}
    stored = {r[features.FILENAME]: _stored_pixels(r) for r in records}
    assert len(names) == len(stored)
    for image, name in zip(images, names, strict=True):
        np.testing.assert_array_equal(image, stored[name], err_msg=name.decode())


def test_grayscale_images_have_one_channel_and_the_stored_pixels(gray_ds):
    ds = _eval(gray_ds, batch_size=5)
    assert ds.element_spec[0].shape.as_list() == [None, SIZE, SIZE, 1]
    images, _, names = _read_all(ds)
    stored = {r[features.FILENAME]: _stored_pixels(r) for r in read_split(gray_ds, "train")}
    for image, name in zip(images, names, strict=True):
        np.testing.assert_array_equal(image, stored[name], err_msg=name.decode())


def test_batches_are_uint8_nhwc_with_int64_labels(jpeg_ds):
    ds = make_dataset(str(jpeg_ds), batch_size=4)
    images_spec, labels_spec = ds.element_spec
    assert images_spec.shape.as_list() == [None, SIZE, SIZE, 3] and images_spec.dtype == tf.uint8
    assert labels_spec.shape.as_list() == [None] and labels_spec.dtype == tf.int64
    n = _manifest(jpeg_ds)["splits"]["train"]["num_examples"]
    sizes = [int(x.shape[0]) for x, _ in ds]
    assert sizes == [4] * (n // 4) + ([n % 4] if n % 4 else [])


def test_drop_remainder_gives_a_static_batch_size(jpeg_ds):
    ds = make_dataset(str(jpeg_ds), batch_size=4, drop_remainder=True)
    assert ds.element_spec[0].shape.as_list() == [4, SIZE, SIZE, 3]
    n = _manifest(jpeg_ds)["splits"]["train"]["num_examples"]
    assert sum(1 for _ in ds) == n // 4 == ds.cardinality().numpy()


def test_float32_images_are_the_uint8_ones_scaled_to_unit_range(jpeg_ds):
    as_uint8, _, names8 = _read_all(_eval(jpeg_ds, batch_size=5))
    as_float, _, names32 = _read_all(_eval(jpeg_ds, batch_size=5, dtype="float32"))
    assert as_float.dtype == np.float32 and names8 == names32
    assert 0.0 <= as_float.min() and as_float.max() <= 1.0
    np.testing.assert_allclose(as_float, as_uint8 / 255.0, atol=1e-6)


def test_one_hot_labels_have_one_column_per_label(jpeg_ds):
    _, ids, _ = _read_all(_eval(jpeg_ds, batch_size=5))
    ds = make_dataset(str(jpeg_ds), training=False, batch_size=5, one_hot=True)
    assert ds.element_spec[1].shape.as_list() == [None, len(COUNTS)]
    one_hot = np.concatenate([y.numpy() for _, y in ds])
    assert one_hot.dtype == np.float32 and (one_hot.sum(axis=1) == 1).all()
    np.testing.assert_array_equal(one_hot.argmax(axis=1), ids)


def test_single_images_when_batch_size_is_none(jpeg_ds):
    ds = make_dataset(str(jpeg_ds), batch_size=None)
    assert ds.element_spec[0].shape.as_list() == [SIZE, SIZE, 3]
    assert sum(1 for _ in ds) == ds.cardinality().numpy() == _manifest(jpeg_ds)["splits"]["train"]["num_examples"]


# --- order --------------------------------------------------------------------


def test_evaluation_order_is_the_same_on_every_pass(jpeg_ds):
    ds = _eval(jpeg_ds, batch_size=3)
    first, second = _read_all(ds)[2], _read_all(ds)[2]
    assert first == second
    assert _read_all(_eval(jpeg_ds, batch_size=3))[2] == first


def test_seeded_deterministic_training_order_repeats_across_runs(jpeg_ds):
    def order():
        ds = make_dataset(str(jpeg_ds), batch_size=3, training=True, extra_keys=(features.FILENAME,),
                          config=ReaderConfig(deterministic=True, seed=7))
        return _read_all(ds)[2]

    assert order() == order()
    # Repeating is only worth checking on a shuffled order: an unshuffled one repeats anyway.
    assert order() != _read_all(_eval(jpeg_ds, batch_size=3))[2]
    # And in another process: a run, not only a second pass in this one.
    other = subprocess.run(child("seeded_order", str(jpeg_ds), "7"), cwd=REPO, capture_output=True,
                           text=True, timeout=120, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert other.returncode == 0, other.stderr[-3000:]
    assert json.loads(other.stdout.strip().splitlines()[-1]) == [n.decode() for n in order()]


def test_training_shuffles_records(jpeg_ds):
    in_file_order = _read_all(_eval(jpeg_ds, batch_size=3))[2]
    orders = {tuple(_read_all(make_dataset(str(jpeg_ds), batch_size=3, training=True,
                                           extra_keys=(features.FILENAME,),
                                           config=ReaderConfig(seed=s)))[2]) for s in range(3)}
    assert len(orders | {tuple(in_file_order)}) > 1
    # Interleaving shards (in any order, in parallel) keeps each shard's own
    # record order: only the record shuffle changes it. Seeded and in a fixed
    # order, so a pass or a failure repeats.
    records = read_split(jpeg_ds, "train")
    shards = {r["shard"] for r in records}
    written = {s: [r[features.FILENAME] for r in records if r["shard"] == s] for s in shards}
    shard_of = {r[features.FILENAME]: r["shard"] for r in records}
    reordered = 0
    for seed in range(3):
        names = _read_all(make_dataset(str(jpeg_ds), batch_size=3, training=True,
                                       extra_keys=(features.FILENAME,),
                                       config=ReaderConfig(seed=seed, deterministic=True)))[2]
        read = {s: [n for n in names if shard_of[n] == s] for s in shards}
        reordered += sum(read[s] != written[s] for s in shards)
    assert reordered > 0


# --- distribution -------------------------------------------------------------


@pytest.mark.parametrize("pipelines", [2, 3])
def test_input_context_partitions_the_records_by_file(jpeg_ds, pipelines):
    seen = []
    for i in range(pipelines):
        context = tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=i,
                                             num_replicas_in_sync=pipelines)
        ds = make_dataset(str(jpeg_ds), batch_size=2, extra_keys=(features.FILENAME,),
                          config=ReaderConfig(input_context=context))
        names = _read_all(ds)[2]
        assert ds.cardinality().numpy() == math.ceil(len(names) / 2)
        seen.append(set(names))
    everything = {r[features.FILENAME] for r in read_split(jpeg_ds, "train")}
    assert set().union(*seen) == everything
    assert sum(len(s) for s in seen) == len(everything)


def test_num_input_pipelines_without_a_context_partitions_the_same_way(jpeg_ds):
    ds = make_dataset(str(jpeg_ds), training=False, extra_keys=(features.FILENAME,),
                      config=ReaderConfig(num_input_pipelines=3, input_pipeline_id=1))
    shard = _manifest(jpeg_ds)["splits"]["train"]["shards"][1]
    assert sorted(_read_all(ds)[2]) == sorted(
        r[features.FILENAME] for r in read_split(jpeg_ds, "train") if r["shard"] == shard)


def test_fewer_files_than_input_pipelines_is_a_dataset_error(jpeg_ds):
    context = tf.distribute.InputContext(num_input_pipelines=SHARDS + 1, input_pipeline_id=0)
    with pytest.raises(DatasetError, match=f"{SHARDS} shard files .* {SHARDS + 1} input pipelines"):
        make_dataset(str(jpeg_ds), config=ReaderConfig(input_context=context))


def test_global_batch_size_is_split_between_replicas(jpeg_ds):
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=2)
    ds = make_dataset(str(jpeg_ds), config=ReaderConfig(input_context=context, global_batch_size=8))
    assert next(iter(ds))[0].shape[0] == 4


def test_distribute_datasets_from_function_reads_every_record(jpeg_ds):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    dist = strategy.distribute_datasets_from_function(
        lambda context: make_dataset(str(jpeg_ds),
                                     config=ReaderConfig(input_context=context, global_batch_size=4)))
    total = sum(int(strategy.experimental_local_results(x)[0].shape[0]) for x, _ in dist)
    assert total == _manifest(jpeg_ds)["splits"]["train"]["num_examples"]


# --- length -----------------------------------------------------------------


def test_cardinality_is_known_from_the_manifest(jpeg_ds):
    n = _manifest(jpeg_ds)["splits"]["validation"]["num_examples"]
    ds = make_dataset(str(jpeg_ds), "validation", batch_size=2)
    assert ds.cardinality().numpy() == math.ceil(n / 2)


def test_repeat_makes_an_infinite_dataset(jpeg_ds):
    ds = make_dataset(str(jpeg_ds), batch_size=2, repeat=True)
    assert ds.cardinality().numpy() == tf.data.INFINITE_CARDINALITY


def test_a_shard_shorter_than_the_manifest_says_fails_naming_it(jpeg_ds, tmp_path):
    copy = shutil.copytree(jpeg_ds, tmp_path / "copy")
    manifest = _manifest(copy)
    manifest["splits"]["train"]["num_examples"] += 1
    manifest["splits"]["train"]["shard_num_examples"][0] += 1
    (copy / "manifest.json").write_text(json.dumps(manifest))
    shard = f"{copy}/{manifest['splits']['train']['shards'][0]}"
    claimed = manifest["splits"]["train"]["shard_num_examples"][0]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=f"shard file {shard} is damaged .* ends before the {claimed} records"):
        for _ in make_dataset(str(copy), batch_size=2):
            pass


def test_without_shard_counts_a_short_split_still_fails_the_epoch(jpeg_ds, tmp_path):
    copy = shutil.copytree(jpeg_ds, tmp_path / "copy")
    manifest = _manifest(copy)
    manifest["splits"]["train"]["num_examples"] += 1
    del manifest["splits"]["train"]["shard_num_examples"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    claimed = manifest["splits"]["train"]["num_examples"]
    with pytest.raises(tf.errors.FailedPreconditionError, match=f"expected to contain {claimed} elements"):
        for _ in make_dataset(str(copy), batch_size=2):
            pass


# --- damaged shard files ---------------------------------------------------------


def _damage(path: pathlib.Path, how: str) -> None:
    """Cut the file mid-record, or flip 8 bytes in its middle (inside the GZIP stream or a record)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    if how == "truncate":
        del data[middle + 3:]
    else:
        data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    path.write_bytes(bytes(data))


def _damaged_copy(path: pathlib.Path, tmp_path: pathlib.Path, how: str,
                  index: int = 1) -> tuple[pathlib.Path, str]:
    """A copy of the dataset with train shard ``index`` damaged; and that shard's full path."""
    copy = shutil.copytree(path, tmp_path / "damaged")
    shard = copy / _manifest(copy)["splits"]["train"]["shards"][index]
    _damage(shard, how)
    return copy, str(shard)


@pytest.mark.parametrize("how", ["truncate", "flip"])
@pytest.mark.parametrize("compression", ["GZIP", "NONE"])
def test_a_damaged_shard_fails_the_epoch_naming_its_file(compression, how, jpeg_ds, plain_ds, tmp_path):
    source = {"GZIP": jpeg_ds, "NONE": plain_ds}[compression]
    assert _manifest(source)["compression"] == compression
    copy, shard = _damaged_copy(source, tmp_path, how)
    # TensorFlow's own error (DataLossError, or nothing at all for a plain file
    # cut short) does not say which file; this one does, whichever way it is read.
    for training in (True, False):
        with pytest.raises(tf.errors.InvalidArgumentError) as error:
            for _ in make_dataset(str(copy), batch_size=2, training=training):
                pass
        assert f"shard file {shard} is damaged or could not be read" in error.value.message
        others = [s for s in _manifest(copy)["splits"]["train"]["shards"] if f"{copy}/{s}" != shard]
        assert not any(s in error.value.message for s in others)


@pytest.mark.parametrize("source", ["jpeg", "plain"])
def test_the_sound_shards_of_a_damaged_dataset_yield_every_record(source, jpeg_ds, plain_ds, tmp_path):
    path = {"jpeg": jpeg_ds, "plain": plain_ds}[source]
    copy, _ = _damaged_copy(path, tmp_path, "flip", index=1)
    manifest = _manifest(copy)
    for i in (0, 2):
        ds = make_dataset(str(copy), training=False, batch_size=3, extra_keys=(features.FILENAME,),
                          config=ReaderConfig(num_input_pipelines=SHARDS, input_pipeline_id=i))
        stored = _filenames_in(copy / manifest["splits"]["train"]["shards"][i], manifest["compression"])
        assert len(stored) == manifest["splits"]["train"]["shard_num_examples"][i] > 0
        assert sorted(_read_all(ds)[2]) == sorted(stored)


def _filenames_in(shard: pathlib.Path, compression: str) -> list[bytes]:
    """The records' filenames, read by plain TensorFlow (``helpers.read_split`` reads GZIP only)."""
    spec = features.tf_parse_spec((features.FILENAME,))
    records = tf.data.TFRecordDataset(str(shard), "" if compression == "NONE" else compression)
    return [tf.io.parse_single_example(r, spec)[features.FILENAME].numpy() for r in records]


def test_model_fit_on_a_damaged_shard_fails_naming_its_file(jpeg_ds, tmp_path):
    import keras

    copy, shard = _damaged_copy(jpeg_ds, tmp_path, "truncate")
    model = keras.Sequential([keras.Input((SIZE, SIZE, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(len(COUNTS))])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"shard file {shard} is damaged"):
        model.fit(make_dataset(str(copy), batch_size=2), epochs=1, verbose=0)


def test_without_record_counts_a_damaged_shard_fails_with_tensorflows_error(jpeg_ds, tmp_path):
    # RecordFiles have no manifest, so no record counts to check a shard against: the
    # file is read as it is, and TensorFlow's error still stops the epoch.
    copy, _ = _damaged_copy(jpeg_ds, tmp_path, "flip")
    ds = make_dataset(RecordFiles(f"{copy}/train-*.tfrecord.gz", ImageInfo(SIZE, SIZE, 3, "jpeg")),
                      batch_size=2)
    with pytest.raises(tf.errors.DataLossError):
        for _ in ds:
            pass


# --- training -----------------------------------------------------------------


def test_a_keras_model_fits_one_epoch(jpeg_ds):
    import keras

    num_classes = load_info(str(jpeg_ds)).num_classes
    model = keras.Sequential([
        keras.Input((SIZE, SIZE, 3)),
        keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(num_classes),
    ])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(make_dataset(str(jpeg_ds), batch_size=4), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


@pytest.mark.parametrize("augment", ["crop_flip", RandomCropFlip(area_range=(0.3, 0.5), flip=False)])
def test_crop_flip_keeps_the_output_shape_and_changes_pixels(jpeg_ds, png_ds, augment):
    for path in (jpeg_ds, png_ds):
        plain, _, names = _read_all(_eval(path, batch_size=4))
        ds = _eval(path, batch_size=4, augment=augment)
        assert ds.element_spec[0].shape.as_list() == [None, SIZE, SIZE, 3]
        augmented, _, names_aug = _read_all(ds)
        assert names_aug == names and augmented.dtype == np.uint8
        assert (augmented != plain).any()


def test_a_user_augmentation_sees_each_uint8_image(jpeg_ds):
    plain, _, _ = _read_all(_eval(jpeg_ds, batch_size=4))

    def invert(image):
        assert image.dtype == tf.uint8 and image.shape.as_list() == [SIZE, SIZE, 3]
        return 255 - image

    inverted, _, _ = _read_all(_eval(jpeg_ds, batch_size=4, augment=invert))
    np.testing.assert_array_equal(inverted, 255 - plain)


# --- varying image sizes ---------------------------------------------------------


def test_varying_sizes_without_a_resize_target_cannot_be_batched(varying_ds):
    with pytest.raises(OptionsError, match="resize="):
        make_dataset(str(varying_ds), batch_size=4)


def test_varying_sizes_come_out_as_stored_one_by_one(varying_ds):
    stored = {r[features.FILENAME]: _stored_pixels(r) for r in read_split(varying_ds, "train")}
    ds = make_dataset(str(varying_ds), batch_size=None, training=False, extra_keys=(features.FILENAME,))
    shapes = set()
    for image, _, extra in ds:
        np.testing.assert_array_equal(image.numpy(), stored[extra[features.FILENAME].numpy()])
        shapes.add(tuple(image.shape))
    assert shapes == {(24, 36, 3), (30, 24, 3)}


def test_varying_sizes_resize_to_the_target(varying_ds):
    ds = make_dataset(str(varying_ds), batch_size=4, resize=(16, 20))
    assert ds.element_spec[0].shape.as_list() == [None, 16, 20, 3]
    assert sum(int(x.shape[0]) for x, _ in ds) == _manifest(varying_ds)["splits"]["train"]["num_examples"]


# --- originals: whole source JPEGs, cropped at read time -----------------------------


def test_originals_come_out_as_the_source_pixels_one_by_one(originals_ds):
    manifest = _manifest(originals_ds)
    assert manifest["originals"]["kept"] == manifest["counts"]["written"]
    assert manifest["image"]["format"] == "jpeg" and manifest["image"]["height"] is None
    stored = {r[features.FILENAME]: r for r in read_split(originals_ds, "train")}
    ds = make_dataset(str(originals_ds), batch_size=None, training=False, extra_keys=(features.FILENAME,))
    shapes = set()
    for image, _, extra in ds:
        record = stored[extra[features.FILENAME].numpy()]
        # The stored bytes are the source file's, decoded by the reader exactly as Pillow decodes them.
        np.testing.assert_array_equal(image.numpy(), _stored_pixels(record))
        shapes.add(tuple(image.shape))
    assert shapes == {(64, 96, 3), (80, 64, 3)}


def test_originals_batch_with_resize_and_train_with_the_random_resized_crop(originals_ds):
    count = _manifest(originals_ds)["splits"]["train"]["num_examples"]
    with pytest.raises(OptionsError, match="resize="):
        make_dataset(str(originals_ds), augment="random_resized_crop")
    centred, _, names = _read_all(_eval(originals_ds, batch_size=4, resize=SIZE))
    assert centred.shape == (count, SIZE, SIZE, 3)
    ds = _eval(originals_ds, batch_size=4, resize=SIZE, augment="random_resized_crop")
    assert ds.element_spec[0].shape.as_list() == [None, SIZE, SIZE, 3]
    cropped, _, cropped_names = _read_all(ds)
    assert cropped_names == names and (cropped != centred).any()


def test_the_random_resized_crop_is_imagenet_trainings():
    inception = RandomCropFlip.inception()
    assert (inception.area_range, inception.aspect_ratio_range, inception.flip) == ((0.08, 1.0), (3 / 4, 4 / 3), True)


@pytest.mark.parametrize("at_least,shape", [((100, 150), (125, 160, 3)), ((200, 150), (250, 320, 3)),
                                             ((300, 150), (500, 640, 3)), (None, (500, 640, 3))])
def test_a_crop_twice_the_output_or_more_is_decoded_scaled_down(at_least, shape):
    """A 500x640 box of an 800x600 JPEG: decoded at 1/4 for an output of 100x150 (not 1/8: 62
    rows), at 1/2 for 200x150, whole for 300x150; resized to the output, the same picture."""
    data = tf.constant(encode(picture(3, 800, 600), "JPEG", quality=95))
    info = ImageInfo(None, None, 3, "jpeg")
    box = lambda _: tf.constant([40, 80, 500, 640])
    window = decode_window(data, info, box, at_least=at_least)
    assert tuple(window.shape) == shape
    output = at_least or (100, 150)
    full = decode_window(data, info, box)
    diff = resize(window, output, 3).numpy().astype(int) - resize(full, output, 3).numpy().astype(int)
    assert np.abs(diff).mean() < 2


# --- resize= on real photographs ---------------------------------------------------

# Real JPEG photographs of Pillow's tests (``real_images``), 300x225 to 2000x1072.
PHOTOS = ("flower.jpg", "flower2.jpg", "iptc.jpg", "exif_gps_typeerror.jpg", "junk_jpeg_header.jpg",
          "xmp_test.jpg", "imageops_pad_v_0.jpg")
# The least PSNR of a resize= output against Lanczos from the full decode, at the sizes below.
# Measured on these photographs: 36.9 to 47.5 dB with the area filter; 33.6 to 44.3 with the
# antialiased bilinear it replaced; 22.8 to 46.8 with no antialiasing at all.
RESIZE_PSNR_DB = 35.0


@pytest.fixture(scope="module")
def photos_ds(tmp_path_factory, pillow_images) -> pathlib.Path:
    """The photographs' own JPEG bytes (``--image_format original``), as ImageNet-style training reads them."""
    root = tmp_path_factory.mktemp("photos")
    for i, name in enumerate(PHOTOS):
        folder = root / "tree" / ("a" if i % 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(pillow_images.path(name), folder / name)
    out = root / "out"
    prepare_here("--input", str(root / "tree"), "--output", str(out), "--resize_mode", "none",
                 "--image_format", "original", "--num_shards", "2")
    return out


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(float) - b.astype(float)) ** 2)
    return 10 * math.log10(255 ** 2 / max(mse, 1e-12))


def _lanczos_centre(data: bytes, size: tuple[int, int]) -> np.ndarray:
    """The reference: a full decode by Pillow, the centred box of the output's aspect, Lanczos."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = image.size
    crop_h = max(min(h, round(w * size[0] / size[1])), 1)
    crop_w = max(min(w, round(h * size[1] / size[0])), 1)
    y, x = (h - crop_h) // 2, (w - crop_w) // 2
    return np.asarray(image.resize((size[1], size[0]), Image.LANCZOS, box=(x, y, x + crop_w, y + crop_h)))


@pytest.mark.parametrize("size", [(96, 96), (60, 80), (150, 200)])
def test_resize_gives_every_photograph_near_a_lanczos_resize_of_its_full_decode(photos_ds, size):
    """Shrinking 1.5 to 20 times keeps the picture: every image, once, uint8 at the size, within
    RESIZE_PSNR_DB of the independent reference (fails on main before this commit: 33.6 dB)."""
    stored = {r[features.FILENAME]: r[features.ENCODED] for r in read_split(photos_ds, "train")}
    images, _, names = _read_all(_eval(photos_ds, batch_size=3, resize=size))
    assert sorted(names) == sorted(stored) and images.dtype == np.uint8
    assert images.shape == (len(stored), *size, 3)
    for image, name in zip(images, names):
        assert _psnr(image, _lanczos_centre(stored[name], size)) >= RESIZE_PSNR_DB, name


def test_resize_shrinks_with_the_area_filter():
    """Where resize='s CPU went (fails on main before this commit): TensorFlow's antialiased
    bilinear (ScaleAndTranslate) cost twice the decode; a shrink is now the box filter
    (ResizeArea), a third of that."""
    from beam_prep.reader.plan import make_plan

    plan = make_plan(ImageInfo(None, None, 3, "jpeg"), 2, 4, "uint8", False, None, 64, ())
    graph = tf.function(lambda e: plan.image_of({features.ENCODED: e})).get_concrete_function(
        tf.TensorSpec([], tf.string)).graph
    # The switch_case branches are functions of their own in the graph's library.
    library = graph.as_graph_def().library.function
    types = {node.op for f in library for node in f.node_def}
    assert "ResizeArea" in types


# --- errors -------------------------------------------------------------------


def test_missing_manifest_is_a_dataset_error_naming_the_path(jpeg_ds, tmp_path):
    copy = shutil.copytree(jpeg_ds, tmp_path / "unfinished")
    (copy / "manifest.json").unlink()
    with pytest.raises(DatasetError, match=f"{copy}/manifest.json"):
        make_dataset(str(copy))


def test_unknown_split_is_a_dataset_error_naming_the_splits(jpeg_ds):
    with pytest.raises(DatasetError, match=r"no split 'test'.*train, validation") as e:
        make_dataset(str(jpeg_ds), split="test")
    assert str(jpeg_ds) in str(e.value)


def test_a_missing_shard_is_a_dataset_error_naming_it(jpeg_ds, tmp_path):
    copy = shutil.copytree(jpeg_ds, tmp_path / "partial")
    shard = _manifest(copy)["splits"]["train"]["shards"][1]
    (copy / shard).unlink()
    with pytest.raises(DatasetError, match=f"{copy}/{shard}"):
        make_dataset(str(copy))


@pytest.mark.parametrize("kwargs, match", [
    ({"global_batch_size": 8}, "global_batch_size= goes with input_context="),
    ({"num_input_pipelines": 2}, "go together"),
    ({"num_input_pipelines": 2, "input_pipeline_id": 2}, r"input_pipeline_id must be in \[0, 2\)"),
    ({"shuffle_buffer": -1}, "shuffle_buffer must be 0"),
    ({"dct_method": "FLOAT"}, "dct_method must be one of"),
])
def test_reader_config_refuses_knobs_that_do_not_fit_together_when_made(kwargs, match):
    with pytest.raises(OptionsError, match=match):
        ReaderConfig(**kwargs)


def test_reader_config_takes_an_input_context_or_its_numbers_not_both():
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1)
    assert ReaderConfig(input_context=context).pipelines() == (2, 1)
    with pytest.raises(OptionsError, match="not both"):
        ReaderConfig(input_context=context, num_input_pipelines=2, input_pipeline_id=1)


def _write_records(path: pathlib.Path, records: list[features.ImageRecord], compression: str = "GZIP") -> None:
    with tf.io.TFRecordWriter(str(path), compression) as writer:
        for record in records:
            writer.write(features.encode_example(record))


def _record(encoded: bytes, label: int = 0, fmt: str = "jpeg") -> features.ImageRecord:
    return features.ImageRecord(encoded, fmt, SIZE, SIZE, 3, label, "x", "x/bad.jpg", "0" * 64)


def test_a_record_that_fails_to_decode_fails_loudly(tmp_path):
    good = io.BytesIO()
    Image.new("RGB", (SIZE, SIZE), (10, 20, 30)).save(good, "JPEG")
    _write_records(tmp_path / "bad.tfrecord.gz", [_record(good.getvalue()), _record(b"not a jpeg")])
    ds = make_dataset(RecordFiles(str(tmp_path / "*.tfrecord.gz"), ImageInfo(SIZE, SIZE, 3, "jpeg")),
                      batch_size=2)
    with pytest.raises(tf.errors.InvalidArgumentError):
        for _ in ds:
            pass


def test_a_label_outside_the_labels_fails_loudly(tmp_path):
    _write_records(tmp_path / "r.tfrecord.gz", [_record(bytes(SIZE * SIZE * 3), label=5, fmt="raw")])
    ds = make_dataset(RecordFiles(str(tmp_path / "r.tfrecord.gz"), ImageInfo(SIZE, SIZE, 3, "raw"),
                                  num_classes=2), one_hot=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="label id out of range of the labels"):
        next(iter(ds))


# --- without a manifest ---------------------------------------------------------


def test_glob_mode_reads_files_without_a_manifest(jpeg_ds):
    ds = make_dataset(RecordFiles(f"{jpeg_ds}/train-*.tfrecord.gz", ImageInfo(SIZE, SIZE, 3, "jpeg"),
                                  num_classes=len(COUNTS)),
                      batch_size=4, one_hot=True, extra_keys=(features.FILENAME,))
    images, labels, names = _read_all(ds)
    assert images.shape[1:] == (SIZE, SIZE, 3) and labels.shape[1] == len(COUNTS)
    assert sorted(names) == sorted(r[features.FILENAME] for r in read_split(jpeg_ds, "train"))
    assert ds.cardinality().numpy() == tf.data.UNKNOWN_CARDINALITY


def test_glob_mode_needs_the_image_info(jpeg_ds):
    with pytest.raises(OptionsError, match="image=ImageInfo"):
        make_dataset(RecordFiles(f"{jpeg_ds}/train-*.tfrecord.gz"))


@pytest.mark.slow  # make_dataset imports TensorFlow
def test_glob_matching_nothing_is_a_dataset_error(tmp_path):
    with pytest.raises(DatasetError, match=f"no files match {tmp_path}/nothing-"):
        make_dataset(RecordFiles(f"{tmp_path}/nothing-*.tfrecord.gz", ImageInfo(SIZE, SIZE)))


# --- gs:// --------------------------------------------------------------------

def test_a_gs_dataset_reads_like_a_local_one(jpeg_ds, gcs_server, gcs_bucket, repo):
    gcs_bucket.upload_tree(jpeg_ds, "out")
    result = gcs_server.run(child("read_gs_train", gcs_bucket.url("out"), gcs_bucket.url("nothing-here")),
                            cwd=repo, extra_env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout_s=120)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    expected = sorted(r[features.FILENAME].decode() for r in read_split(jpeg_ds, "train"))
    assert report["names"] == expected
    assert report["cardinality"] == math.ceil(len(expected) / 4)
    assert f"{gcs_bucket.url('nothing-here')}/manifest.json" in report["error"]


# --- the read-ahead --------------------------------------------------------------


def test_local_shards_are_read_with_a_small_read_ahead_and_gcs_ones_with_a_large_one():
    """A 4 MiB buffer allocated for every local file opened cost about a tenth of the reading's CPU
    with the default command's 1 MB shards (fails on main before this commit: one size for all)."""
    from beam_prep.reader.shards import LOCAL_READ_BUFFER_BYTES, READ_BUFFER_BYTES, read_buffer_bytes

    assert read_buffer_bytes("out/train-00000-of-00032.tfrecord.gz") == LOCAL_READ_BUFFER_BYTES < READ_BUFFER_BYTES
    assert read_buffer_bytes("gs://bucket/out/train-00000-of-00032.tfrecord.gz") == READ_BUFFER_BYTES


@pytest.mark.parametrize("suffix", [".tfrecord.gz", ".tfrecord"])
def test_records_larger_than_the_local_read_ahead_are_read_whole(tmp_path, suffix):
    """Raw records of 300x400x3 (360 KB, over the 256 KiB read-ahead): every pixel as written."""
    from beam_prep.reader.shards import LOCAL_READ_BUFFER_BYTES

    h, w = 300, 400
    assert h * w * 3 > LOCAL_READ_BUFFER_BYTES
    pixels = [np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8) for i in range(3)]
    records = [features.ImageRecord(p.tobytes(), "raw", h, w, 3, i, "x", f"x/{i}.png", "0" * 64)
               for i, p in enumerate(pixels)]
    compression = "GZIP" if suffix.endswith(".gz") else "NONE"
    _write_records(tmp_path / f"r{suffix}", records, "" if compression == "NONE" else compression)
    ds = make_dataset(RecordFiles(str(tmp_path / f"r{suffix}"), ImageInfo(h, w, 3, "raw"),
                                  compression=compression),
                      batch_size=None, training=False)
    out = [(x.numpy(), int(y)) for x, y in ds]
    assert [y for _, y in out] == [0, 1, 2]
    for (x, _), p in zip(out, pixels):
        np.testing.assert_array_equal(x, p)
