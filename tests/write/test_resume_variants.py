"""Interrupted local runs of every kind resume to what an uninterrupted run writes: the other
file formats, originals kept byte for byte, a metadata table, and a run stopped at halfway
keeping most of its work."""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
from collections.abc import Callable

import pytest
from helpers import encode, run_prepare
from interrupts import (
    ARGS,
    DATASET_FILES,
    PHOTOS_PER_LABEL,
    SHARDS,
    dataset_digests,
    finished_records,
    interrupt,
    photo_tree,
    uninterrupted,
)

from beam_prep.errors import BeamPrepWarning
from beam_prep.tools.sample import picture
from beam_prep.write.journal import progress, resume


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> pathlib.Path:
    """The photos ``interrupt`` stops a run of midway (``interrupts.photo_tree``)."""
    return photo_tree(tmp_path_factory.mktemp("resume") / "tree")


@pytest.fixture(scope="module")
def uninterrupted_as(tree, tmp_path_factory) -> Callable[[str], dict[str, str]]:
    """The digests of an uninterrupted run in ``--file_format``, made once a format (in this process:
    ``interrupts.uninterrupted``)."""
    made: dict[str, dict[str, str]] = {}

    def digests(file_format: str) -> dict[str, str]:
        if file_format not in made:
            out = tmp_path_factory.mktemp(f"whole-{file_format}") / "out"
            made[file_format] = uninterrupted(tree, out, "--file_format", file_format)
            assert len(made[file_format]) == SHARDS + len(DATASET_FILES)
        return made[file_format]

    return digests


@pytest.mark.parametrize("file_format, signum", [("array_record", signal.SIGKILL), ("webdataset", signal.SIGKILL)])
def test_every_file_format_resumes_to_the_bytes_of_an_uninterrupted_run(tree, uninterrupted_as, tmp_path,
                                                                         file_format, signum):
    """SIGKILL to the whole group, as a power loss: a format's shards torn mid-write. How SIGINT and
    SIGTERM stop a run does not depend on the format (test_a_stopped_run_ends_in_seconds...)."""
    out = tmp_path / "out"
    stopped, _, _ = interrupt(tree, out, signum, "--file_format", file_format,
                               whole_group=signum == signal.SIGKILL)
    assert stopped.returncode in (-signal.SIGKILL, 128 + signum), stopped.stderr
    assert 2 <= len(finished_records(out)) < SHARDS
    resumed = run_prepare("--input", str(tree), "--output", str(out), *ARGS, "--file_format", file_format)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming run" in resumed.stderr
    digests = dataset_digests(out)
    suffix = {"array_record": ".array_record", "webdataset": ".tar"}[file_format]
    assert sum(name.endswith(suffix) for name in digests) == SHARDS
    assert digests == uninterrupted_as(file_format)


def test_a_resumed_run_of_originals_counts_kept_and_reencoded_as_an_uninterrupted_one(tree, tmp_path):
    """The counts of the shards finished before the stop come from their records."""
    mixed = tmp_path / "mixed"
    shutil.copytree(tree, mixed)
    for label in ("ant", "bee", "cat", "dog"):
        for i in range(10):  # already 48x48: kept byte for byte
            (mixed / label / f"small_{i}.jpg").write_bytes(encode(picture(1000 + i, 48, 48), "JPEG", quality=90))
    args = (*ARGS, "--image_format", "original")
    whole = tmp_path / "whole"
    with pytest.warns(BeamPrepWarning, match="keeps only the JPEGs already exactly 48x48"):  # center_crop's
        uninterrupted(mixed, whole, "--image_format", "original")
    out = tmp_path / "out"
    stopped, _, _ = interrupt(mixed, out, signal.SIGTERM, "--image_format", "original")
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    resumed = run_prepare("--input", str(mixed), "--output", str(out), *args)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming run" in resumed.stderr
    assert dataset_digests(out) == dataset_digests(whole)
    assert sum(name.endswith(".tfrecord") for name in dataset_digests(whole)) == SHARDS  # uncompressed, by default
    # Every other record is one of the fixture's photos (the copies and the near copy too), all larger than 48x48.
    resized = json.loads((whole / "manifest.json").read_text())["counts"]["written"] - 40
    assert resized == 4 * PHOTOS_PER_LABEL + 4
    expected = {"kept": 40, "reencoded": resized, "reencoded_by_reason": {"resized": resized}}
    for folder in (whole, out):
        assert json.loads((folder / "manifest.json").read_text())["originals"] == expected
    assert "  originals kept byte for byte: 40" in resumed.stdout.splitlines()


def test_a_resumed_run_with_a_table_writes_what_the_whole_run_writes(tree, tmp_path):
    """--metadata through a stop and a resume: the resumed run works from the listing its first
    launcher wrote, label lists and fields included, and ends with the uninterrupted run's records."""
    names = sorted(p.relative_to(tree).as_posix() for p in tree.glob("*/*.jpg"))
    table = tmp_path / "metadata.jsonl"
    table.write_text("".join(
        json.dumps({"file_name": name, "labels": sorted({name.split("/")[0], ("ant", "bee", "cat", "dog")[i % 4]}),
                    "caption": f"photo {i}", "score": i / 7}) + "\n" for i, name in enumerate(names)))
    args = (*ARGS, "--metadata", str(table))
    whole = tmp_path / "whole"
    uninterrupted(tree, whole, "--metadata", str(table))
    out = tmp_path / "out"
    stopped, _, _ = interrupt(tree, out, signal.SIGTERM, "--metadata", str(table))
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr
    assert 2 <= len(finished_records(out)) < SHARDS, "the run ended before it could be stopped midway"
    resumed = run_prepare("--input", str(tree), "--output", str(out), *args)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming run" in resumed.stderr
    assert dataset_digests(out) == dataset_digests(whole)
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["multi_label"], manifest["extra_features"]) == (True, {"caption": "bytes", "score": "float"})
    assert manifest["counts"] == {"listed": len(names), "written": len(names) - 1, "failed": 1, "skipped": 2}


# Over 32 x 16 x 2 images, the default plan of a resumable run on 2 workers is 32 shards
# (sharding.max_shard_images): the share a stop at halfway keeps is then the same at any
# size, the 5,000 images included.
HALFWAY_IMAGES = 2560
HALFWAY_ARGS = ("--direct_num_workers", "2", "--direct_running_mode", "multi_processing")


@pytest.fixture(scope="module")
def halfway_tree(tmp_path_factory) -> pathlib.Path:
    """Photos whose shorter side is under twice the default 224 px, so that each is decoded
    whole (no JPEG draft) and the run lasts long enough to be stopped halfway. A few pictures,
    each file told apart by a JPEG comment: quicker to make than a picture each, and each picture
    encoded once (``_with_comment``)."""
    root = tmp_path_factory.mktemp("halfway") / "tree"
    jpegs = [encode(picture(seed, 640, 440), "JPEG", quality=90) for seed in range(8)]
    for i in range(HALFWAY_IMAGES):
        folder = root / f"label_{i % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img_{i:05d}.jpg").write_bytes(_with_comment(jpegs[i % 8], f"photo {i}".encode()))
    return root


def _with_comment(jpeg: bytes, comment: bytes) -> bytes:
    """``jpeg`` with a comment (a COM segment) after its JFIF header: another file of the same
    picture, byte for byte what Pillow's ``comment=`` writes, without encoding the picture again."""
    assert jpeg[:4] == b"\xff\xd8\xff\xe0", "not a JFIF JPEG"
    end = 4 + int.from_bytes(jpeg[4:6], "big")
    return jpeg[:end] + b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment + jpeg[end:]


def _progress_of(pid: int) -> progress.Progress:
    """The images the workers of the run launched as ``pid`` have finished, from their reports
    (in the test's TMPDIR, which the run inherits): what its progress bar shows."""
    folders = list(pathlib.Path(os.environ["TMPDIR"]).glob(f"{progress.FOLDER_PREFIX}{pid}-*"))
    return progress.read_progress(str(folders[0]), HALFWAY_IMAGES) if folders else progress.Progress(HALFWAY_IMAGES)


def test_a_run_stopped_halfway_keeps_most_of_its_work_and_rates_only_the_rest(halfway_tree, tmp_path):
    """Ctrl-C once the workers have done half the images, with the default shard plan: the
    resume keeps at least 40% of the images (the plan by size alone, two shards, one a worker,
    kept none).
    The resumed run's rate is that of the images it processed, not of its kept ones too."""
    out = tmp_path / "out"
    shares: list[float] = []

    def halfway(pid: int) -> bool:
        shares.append(_progress_of(pid).done / HALFWAY_IMAGES)
        return shares[-1] >= 0.5

    stopped, _, _ = interrupt(halfway_tree, out, signal.SIGINT, args=HALFWAY_ARGS, ready=halfway)
    assert stopped.returncode == 128 + signal.SIGINT, stopped.stderr
    assert shares[-1] < 0.75, f"stopped at {shares[-1]:.0%}, not halfway"
    assert re.search(r"interrupted: \d+ of 32 shards written", stopped.stderr), stopped.stderr
    finished = [resume.finished_shard(str(p.parent), p.name[:-len(".done.json")]) for p in finished_records(out)]

    resumed = run_prepare("--input", str(halfway_tree), "--output", str(out), *HALFWAY_ARGS)
    assert resumed.returncode == 0, resumed.stderr
    shards, images = (int(n.replace(",", "")) for n in re.search(
        rf"resuming run \S+: (\d+) of 32 shards already written \(([\d,]+) of {HALFWAY_IMAGES:,} images\)",
        resumed.stderr).groups())
    assert (shards, images) == (len(finished), resume.images_in(finished))  # the finished shards' records
    kept = images / HALFWAY_IMAGES
    assert 0.4 <= kept < 1, f"kept {kept:.0%} of the images, stopped at {shares[-1]:.0%}"
    rate, seconds = re.search(r"then ([\d,]+) images/s for ([\d.]+) s", resumed.stdout).groups()
    processed = float(rate.replace(",", "")) * float(seconds)
    assert processed == pytest.approx(HALFWAY_IMAGES - images, rel=0.15, abs=30), resumed.stdout
    assert json.loads((out / "manifest.json").read_text())["counts"]["written"] == HALFWAY_IMAGES
