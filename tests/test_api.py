"""The Python API beside the command: beam_prep.prepare, the package's names, the beam-prep script."""
from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import pytest
import real_images
from helpers import REPO, child, make_tree, read_split
from small_disk import small_disk

import beam_prep
from beam_prep.errors import BeamPrepWarning, OptionsError, StorageError

SMALL = {"image_size": 16, "max_pixels": 100000, "direct_running_mode": "in_memory"}


def test_prepare_runs_the_job_and_returns_its_manifest(tmp_path):
    make_tree(tmp_path / "in", {"a": 3, "b": 2}, size=(24, 20))
    (tmp_path / "in" / "b" / "broken.jpg").write_bytes(b"not a jpeg")
    seen = []
    manifest = beam_prep.prepare(str(tmp_path / "in"), str(tmp_path / "out"), **SMALL,
                                 validation_percent=40, overwrite=False, on_progress=seen.append)
    assert manifest == json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counts"] == {"listed": 6, "written": 5, "failed": 1, "skipped": 0}
    assert (manifest["image"]["height"], manifest["image"]["width"]) == (16, 16)
    written = sum(len(read_split(tmp_path / "out", split)) for split in manifest["splits"])
    assert written == 5 and set(manifest["splits"]) == {"train", "validation"}
    assert seen and (seen[-1].done, seen[-1].failed, seen[-1].total) == (6, 1, 6)  # the workers' counts


@pytest.mark.slow  # a multi-process run, on a tmpfs
def test_a_full_disk_raises_the_storage_error_a_worker_raised(tmp_path):
    """Beam wraps a worker's exception in a RuntimeError holding its traceback as text (80 lines):
    ``prepare`` raises the worker's own ``StorageError`` again, its one line, chained to Beam's."""
    make_tree(tmp_path / "in", {"a": 30, "b": 30}, size=(64, 64), fmt="PNG", ext=".png")  # 720 KB of raw pixels
    with small_disk(tmp_path / "disk") as disk, pytest.raises(StorageError) as raised:
        beam_prep.prepare(str(tmp_path / "in"), str(disk / "out"), image_format="raw", image_size=64,
                          direct_num_workers=2, direct_running_mode="multi_processing")
    message = str(raised.value)
    assert re.fullmatch(rf"cannot write {re.escape(str(disk))}/out/\S+/train-0000[01]-of-00002\.tfrecord\.gz: "
                        r"\[Errno 28\] No space left on device; free space on that disk, or write elsewhere",
                        message), message
    assert isinstance(raised.value.__cause__, RuntimeError) and "Traceback" in str(raised.value.__cause__)


@pytest.mark.parametrize("options,message", [
    ({"image_sise": 16}, "unknown option image_sise; did you mean image_size?"),
    ({"validation_percent": 100}, "validation_percent must be in [0, 100), not 100.0"),
])
def test_prepare_checks_options_before_any_work_and_names_keywords(tmp_path, options, message):
    make_tree(tmp_path / "in", {"a": 1})
    with pytest.raises(OptionsError) as e:
        beam_prep.prepare(str(tmp_path / "in"), str(tmp_path / "out"), **options)
    assert str(e.value) == message
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # runs a pipeline in this process
def test_a_refusal_names_the_keyword_that_overrides_it(tmp_path):
    make_tree(tmp_path / "in", {"a": 2}, size=(24, 20))
    args = (str(tmp_path / "in"), str(tmp_path / "out"))
    beam_prep.prepare(*args, **SMALL)
    with pytest.raises(OptionsError) as e:
        beam_prep.prepare(*args, **SMALL)
    files = [p.name for p in (tmp_path / "out").iterdir() if p.name != "README.md"]  # the card is not counted
    assert len(files) == 9 and "manifest.json" in files, files
    assert str(e.value) == (f"output {tmp_path / 'out'} already holds a dataset ({len(files)} files); "
                            "pass overwrite=True to replace it")


def test_prepare_prints_nothing_where_logging_is_left_unconfigured(tmp_path):
    """Beam's PipelineOptions would configure the root logger, and its two worker processes relay
    warnings on every run; a library prints none of that."""
    make_tree(tmp_path / "in", {"a": 3, "b": 3}, size=(24, 20))
    done = subprocess.run(child("quiet_prepare", str(tmp_path / "in"), str(tmp_path / "out")), cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", "")
    assert (tmp_path / "out" / "manifest.json").exists()


# Real images that make third-party code speak: Pillow's UserWarnings (a corrupt EXIF, a malformed MPO,
# an invalid APNG that fails), libtiff on fd 2 ("WEBP compression support is not configured"), with two
# plain ones. None decodes to one flat colour, which would be a warning of ours.
NOISY = ("hopper_bad_exif.jpg", "sugarshack_bad_mpo_header.jpg", "apng/syntax_num_frames_zero.png",
         "hopper_webp.tif", "hopper.jpg", "hopper.png")


@pytest.mark.slow  # runs a pipeline and TensorFlow in a subprocess
@pytest.mark.parametrize("mode", ["multi_processing", "in_memory"])
def test_the_library_is_as_quiet_as_the_command_on_damaged_images(pillow_images, tmp_path, mode):
    """prepare() then verify(): the damaged images are in errors.jsonl; nothing reaches stdout or stderr,
    neither Pillow's warnings, nor libtiff's or TensorFlow's native log ("Type inference failed")."""
    real_images.make_tree(pillow_images, tmp_path / "in", NOISY)
    done = subprocess.run(child("quiet_library", str(tmp_path / "in"), str(tmp_path / "out"), mode), cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", "")


@pytest.mark.slow  # runs a pipeline in this process
def test_a_percent_below_one_warns_the_caller_in_keywords(tmp_path):
    make_tree(tmp_path / "in", {"a": 20}, size=(24, 20))
    with pytest.warns(BeamPrepWarning) as caught:
        manifest = beam_prep.prepare(str(tmp_path / "in"), str(tmp_path / "out"), validation_percent=0.5, **SMALL)
    held = manifest["splits"].get("validation", {}).get("num_examples", 0)
    (warning,) = [w for w in caught if w.category is BeamPrepWarning]
    assert str(warning.message) == (f"validation_percent 0.5 puts {held} of 20 images in validation (0.5%): "
                                    "the value is a percent; for a fraction of 0.5, pass 50")
    assert warning.filename == __file__  # it points at the caller's line


def test_the_output_inside_the_input_is_refused_as_by_the_command(tmp_path):
    make_tree(tmp_path / "in", {"a": 1})
    with pytest.raises(OptionsError, match="is inside input"):
        beam_prep.prepare(str(tmp_path / "in"), str(tmp_path / "in" / "records"))


def test_the_package_names_the_reader_without_importing_tensorflow_until_used():
    done = subprocess.run(child("lazy_names"), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.stdout == "ok\n", done.stderr


def test_the_beam_prep_script_prepares_a_tree(tmp_path):
    script = pathlib.Path(sys.executable).parent / "beam-prep"
    make_tree(tmp_path / "in", {"a": 2}, size=(24, 20))
    usage = subprocess.run([str(script)], capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "usage: beam-prep COMMAND" in usage.stderr and "prepare" in usage.stderr
    done = subprocess.run([str(script), "prepare", "--input", str(tmp_path / "in"), "--output",
                           str(tmp_path / "out"), "--image_size", "16", "--direct_running_mode", "in_memory"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("beam-prep: 2 of 2 images written")
