"""gs:// for real: the pipeline reads and writes a GCS server on loopback, and Dataflow jobs build offline."""
from __future__ import annotations

import gzip
import json

import pytest
from helpers import REPO, child, make_tree, prepare_here

from beam_prep.model.features import decode_all
from pipelines import prepare_images

LABELS = {"cat": 6, "dog": 5}


def prepare(gcs_server, *args, check=True):
    return gcs_server.run(prepare_images.command(*args), cwd=REPO, check=check)


def refused_here(capsys, *args) -> tuple[int, str]:
    """The command's main in this process (under ``gcs_env``), for a run refused before any work,
    which starts nothing: its exit code and what it wrote on stderr."""
    capsys.readouterr()
    code = prepare_images.main(list(args))
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def gcs_run(gcs_server, tmp_path_factory):
    """One multi-process DirectRunner run from gs:// to gs://, as users run it."""
    tree = tmp_path_factory.mktemp("tree")
    make_tree(tree, LABELS)
    (tree / "dog" / "broken.jpg").write_bytes(b"not a jpeg")
    (tree / "cat" / "copy.jpg").write_bytes((tree / "dog" / "img_000.jpg").read_bytes())  # a duplicate
    (tree / "dog" / "notes.txt").write_text("not an image")  # skipped, named in skipped.jsonl
    (tree / "loose.jpg").write_bytes((tree / "cat" / "img_000.jpg").read_bytes())  # skipped too
    bucket = gcs_server.new_bucket()
    bucket.upload_tree(tree, "images")
    result = prepare(gcs_server, "--input", bucket.url("images"), "--output", bucket.url("records"),
                     "--image_size", "16", "--validation_percent", "50")
    return bucket, result


def test_pipeline_reads_and_writes_gs_paths(gcs_run):
    bucket, result = gcs_run
    assert "12 of 13 images written" in result.stdout
    manifest = json.loads(bucket.read_bytes("records/manifest.json"))
    assert manifest["counts"] == {"listed": 13, "written": 12, "failed": 1, "skipped": 2}
    assert manifest["labels"] == ["cat", "dog"]
    shards = [name for split in manifest["splits"].values() for name in split["shards"]]
    assert sorted(f"records/{s}" for s in shards) == [
        n for n in bucket.list_names("records/") if n.endswith(".tfrecord.gz")]
    for name in shards:
        gzip.decompress(bucket.read_bytes(f"records/{name}"))
    assert bucket.read_bytes("records/labels.txt").decode().splitlines() == ["cat", "dog"]


def test_errors_report_names_the_gs_path(gcs_run):
    bucket, _ = gcs_run
    (error,) = [json.loads(line) for line in bucket.read_bytes("records/errors.jsonl").decode().splitlines()]
    assert error["path"] == bucket.url("images/dog/broken.jpg") and error["stage"] == "decode"


def test_nothing_is_left_in_temporary_locations(gcs_run):
    bucket, _ = gcs_run
    expected = {"manifest.json", "labels.txt", "errors.jsonl", "skipped.jsonl", "duplicates.jsonl", "hashes-v1.tsv.gz", "README.md", "flat.jsonl",
                "stamps-v1.tsv.gz"}
    leftovers = [n for n in bucket.list_names("records/")
                 if n.split("/", 1)[1] not in expected and not n.endswith(".tfrecord.gz")]
    assert leftovers == []


def test_shuffle_sink_finalises_on_gcs(gcs_server, gcs_run):
    bucket, _ = gcs_run
    prepare(gcs_server, "--input", bucket.url("images"), "--output", bucket.url("shuffled"),
            "--image_size", "16", "--validation_percent", "50", "--sink", "shuffle")
    streamed = json.loads(bucket.read_bytes("records/manifest.json"))
    shuffled = json.loads(bucket.read_bytes("shuffled/manifest.json"))
    assert shuffled["counts"] == streamed["counts"]
    # The copy is found by both sinks, from hash files in gs://, and listed in duplicates.jsonl there.
    assert shuffled["duplicates"]["extra_copies"] == streamed["duplicates"]["extra_copies"] == 1
    for folder in ("records", "shuffled"):
        rows = [json.loads(line) for line in bucket.read_bytes(f"{folder}/duplicates.jsonl").decode().splitlines()]
        assert sorted(r["path"] for r in rows if r["kind"] == "exact") == [bucket.url("images/cat/copy.jpg"), bucket.url("images/dog/img_000.jpg")]
    assert {s: v["class_counts"] for s, v in shuffled["splits"].items()} == {
        s: v["class_counts"] for s, v in streamed["splits"].items()}
    assert all(n.split("/", 1)[1] in ("manifest.json", "labels.txt", "errors.jsonl", "skipped.jsonl",
                                      "duplicates.jsonl", "hashes-v1.tsv.gz", "README.md", "flat.jsonl", "stamps-v1.tsv.gz")
               or n.endswith(".tfrecord.gz")
               for n in bucket.list_names("shuffled/"))
    # Both sinks name the skipped files, each with its reason, byte for byte alike: the shuffle
    # sink's manifest step runs in a worker and copies the file the launcher wrote to gs://.
    skipped = bucket.read_bytes("records/skipped.jsonl")
    assert bucket.read_bytes("shuffled/skipped.jsonl") == skipped
    assert [json.loads(line) for line in skipped.decode().splitlines()] == [
        {"path": bucket.url("images/dog/notes.txt"), "relpath": "dog/notes.txt", "reason": "not an image file"},
        {"path": bucket.url("images/loose.jpg"), "relpath": "loose.jpg", "reason": "image outside the label folders"}]


def test_empty_gs_input_is_reported(gcs_server, gcs_bucket, capsys):
    code, stderr = refused_here(capsys, "--input", gcs_bucket.url("nothing"), "--output", gcs_bucket.url("out"))
    assert code == 2
    assert f"no images under {gcs_bucket.url('nothing')}" in stderr
    assert "Traceback" not in stderr


def test_missing_bucket_is_reported(gcs_server, gcs_missing_bucket, gcs_bucket, capsys):
    code, stderr = refused_here(capsys, "--input", f"gs://{gcs_missing_bucket}/images",
                                "--output", gcs_bucket.url("out"))
    assert code != 0
    assert f"gs://{gcs_missing_bucket}" in stderr and "does not exist" in stderr
    assert "Traceback" not in stderr


def test_permission_error_is_reported(gcs_server, gcs_run, gcs_forbidden_bucket, capsys):
    bucket, _ = gcs_run
    code, stderr = refused_here(capsys, "--input", bucket.url("images"), "--output", gcs_forbidden_bucket.url("out"))
    assert code != 0
    assert f"gs://{gcs_forbidden_bucket.name}" in stderr and "permission" in stderr.lower()
    assert "Traceback" not in stderr


def test_dataflow_job_builds_offline_with_the_designed_steps(gcs_server, gcs_run, tmp_path):
    """The Dataflow runner's own job construction, stopped before submission (--dry_run)."""
    bucket, _ = gcs_run
    job_json = tmp_path / "job.json"
    args = ["--runner", "DataflowRunner", "--dry_run=True", "--project", "my-project",
            "--region", "us-central1", "--temp_location", bucket.url("tmp"),
            "--input", bucket.url("images"), "--output", bucket.url("dataflow-out"),
            "--image_size", "16", "--validation_percent", "50"]
    gcs_server.run(child("dataflow_job", str(job_json), *args, "--setup_file", str(REPO / "setup.py")),
                   cwd=REPO)
    job = json.loads(job_json.read_text())
    names = job["transforms"]
    for step in ("WriteShards/ReadListing", "WriteShards/ParseEntries", "WriteShards/Write/Reshuffle",
                 "WriteShards/Write/ImageToExample", "WriteShards/Write/WriteFiles[train]",
                 "WriteShards/Write/WriteFiles[validation]", "ReadUnknownLabels", "UnknownLabels", "Finalize"):
        assert step in names, step
    assert any(n.startswith("WriteShards/Write/Reshuffle/") and urn == "beam:transform:group_by_key:v1"
               for n, urn in names.items())
    assert "workflow.tar.gz" in job["deps"]
    assert bucket.list_names("dataflow-out/") == []  # a dry run touches nothing

    image = "gcr.io/my-project/beam-prep:1"
    gcs_server.run(child("dataflow_job", str(job_json), *args, "--sdk_container_image", image), cwd=REPO)
    job = json.loads(job_json.read_text())
    assert job["images"] == [image]


def test_dataflow_workers_staged_with_setup_file_get_the_file_formats_library(gcs_server, gcs_run, tmp_path):
    """setup.py's extras are not installed from --setup_file: the format's library is staged as a
    requirement (the user's own requirements kept), and a worker image needs none."""
    bucket, _ = gcs_run
    job_json = tmp_path / "job.json"
    args = ["--runner", "DataflowRunner", "--dry_run=True", "--project", "my-project",
            "--region", "us-central1", "--temp_location", bucket.url("tmp"),
            "--input", bucket.url("images"), "--output", bucket.url("dataflow-out"),
            "--image_size", "16", "--file_format", "array_record", "--setup_file", str(REPO / "setup.py")]
    gcs_server.run(child("dataflow_job", str(job_json), *args), cwd=REPO)  # nothing downloaded: offline
    job = json.loads(job_json.read_text())
    assert {"workflow.tar.gz", "requirements.txt"} <= set(job["deps"])
    assert "WriteShards/Write/WriteFiles[train]" in job["transforms"]
    assert bucket.list_names("dataflow-out/") == []


def test_the_staged_requirements_hold_the_users_lines_and_the_library(tmp_path):
    from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions

    from beam_prep.write.run.worker_requirements import add_format_requirement

    mine = tmp_path / "requirements.txt"
    mine.write_text("pandas==2.2.3\n")
    options = PipelineOptions(["--setup_file", "./setup.py", "--requirements_file", str(mine)])
    staged = add_format_requirement(options, "array_record")
    assert open(staged).read().splitlines() == ["pandas==2.2.3", "array-record>=0.8,<0.9"]
    assert options.view_as(SetupOptions).requirements_file == staged
    assert options.view_as(SetupOptions).requirements_cache is None  # the user's file: Beam's own choice
    bare = PipelineOptions(["--setup_file", "./setup.py"])
    assert open(add_format_requirement(bare, "array_record")).read() == "array-record>=0.8,<0.9\n"
    assert bare.view_as(SetupOptions).requirements_cache == "skip"  # the workers install it from PyPI
    assert add_format_requirement(PipelineOptions(["--setup_file", "./setup.py"]), "webdataset") is None
    image = PipelineOptions(["--setup_file", "./setup.py", "--sdk_container_image", "gcr.io/p/beam-prep:1"])
    assert add_format_requirement(image, "array_record") is None


def test_reader_reads_gs_output_through_tensorflows_gcs_filesystem(gcs_server, gcs_run, tmp_path):
    """What training code does: make_dataset on gs://, through TF's own GCS client (via the TLS proxy)."""
    bucket, _ = gcs_run
    gcs_server.run(child("read_gs_splits", str(tmp_path / "read.json"), bucket.url("records")), cwd=REPO)
    seen = json.loads((tmp_path / "read.json").read_text())
    manifest = json.loads(bucket.read_bytes("records/manifest.json"))
    for split, info in manifest["splits"].items():
        counts = info["class_counts"]
        assert sorted(seen[split]["labels"]) == sorted(
            manifest["labels"].index(label) for label, n in counts.items() for _ in range(n))
        assert seen[split]["shapes"] == [[16, 16, 3]]
        assert seen[split]["cardinality"] == -(-info["num_examples"] // 4)
    tunnelled = [r for r in gcs_server.gateway.requests_for(bucket.name)
                 if r.host == "storage.googleapis.com" and "/download/" in r.path and r.status in (200, 206)]
    assert tunnelled, "the shards were not read through TensorFlow's GCS filesystem"


def test_reader_reports_empty_missing_and_forbidden_gs_paths(
        gcs_server, gcs_bucket, gcs_missing_bucket, gcs_forbidden_bucket, tmp_path):
    gcs_forbidden_bucket.write_bytes("records/manifest.json", b"{}")
    paths = {"empty": gcs_bucket.url("nothing-here"), "missing": f"gs://{gcs_missing_bucket}/records",
             "forbidden": gcs_forbidden_bucket.url("records")}
    gcs_server.run(child("reader_errors", str(tmp_path / "errors.json"), json.dumps(paths)), cwd=REPO)
    errors = json.loads((tmp_path / "errors.json").read_text())
    assert errors["empty"][0] == "DatasetError" and "no manifest.json at" in errors["empty"][1]
    assert errors["missing"] == [
        "StorageError", f"cannot read {paths['missing']}/manifest.json: bucket gs://{gcs_missing_bucket} does not exist"]
    assert errors["forbidden"][0] == "StorageError" and "permission denied" in errors["forbidden"][1]


def test_an_interrupted_run_into_gs_resumes_from_its_folder_there(gcs_server, gcs_env, tmp_path):
    """The run's record and finished shards live in gs://.../OUT/.beam-prep: any machine resumes it.
    The uninterrupted run it resumes to is made in this process (under ``gcs_env``), with the same
    shard count: the workers' count changes nothing it writes."""
    import os
    import signal
    import subprocess
    import time

    make_tree(tmp_path / "tree", {"ant": 24, "bee": 24}, size=(32, 24))
    bucket = gcs_server.new_bucket()
    bucket.upload_tree(tmp_path / "tree", "images")
    written = ("--input", bucket.url("images"), "--image_size", "16", "--num_shards", "8", "--read_concurrency", "1")
    args = (*written, "--direct_num_workers", "2")
    prepare_here(*written, "--output", bucket.url("whole"))
    shards = [f"train-{i:05d}-of-00008.tfrecord.gz" for i in range(8)]

    def finished() -> list[str]:
        return [n for n in bucket.list_names("records/.beam-prep/") if n.endswith(".done.json")]

    gcs_server.gateway.set_latency(0.05)  # each image's read takes 50 ms or more: time to stop midway
    try:
        run = subprocess.Popen(prepare_images.command(*args, "--output", bucket.url("records")), cwd=REPO,
                               env=gcs_server.subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while len(finished()) < 2:
                assert run.poll() is None and time.monotonic() < deadline, run.communicate()
                time.sleep(0.1)
            run.send_signal(signal.SIGTERM)
            _, stderr = run.communicate(timeout=60)
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
    finally:
        gcs_server.gateway.set_latency(0.0)  # the resumed run needs no time to stop in
    assert run.returncode == 143, stderr
    done = len(finished())
    assert 2 <= done < 8 and stderr.splitlines()[-1].startswith(f"interrupted: {done} of 8 shards written")
    resumed = prepare(gcs_server, *args, "--output", bucket.url("records"))
    assert f"{done} of 8 shards already written" in resumed.stderr, resumed.stderr
    for name in [*shards, "errors.jsonl", "labels.txt"]:
        assert bucket.read_bytes(f"records/{name}") == bucket.read_bytes(f"whole/{name}"), name
    assert not [n for n in bucket.list_names("records/") if "/.beam-prep/" in n]


def _records(data: bytes) -> list[bytes]:
    """The records of an uncompressed TFRecord file's bytes (length, crc, data, crc)."""
    records, at = [], 0
    while at < len(data):
        length = int.from_bytes(data[at:at + 8], "little")
        records.append(data[at + 12:at + 12 + length])
        at += 12 + length + 4
    return records


def test_a_metadata_table_on_gcs_labels_a_flat_folder(gcs_server, gcs_bucket, tmp_path):
    """--metadata gs://...: the table is read from the bucket, its rows joined with the gs:// listing."""
    make_tree(tmp_path / "tree", {"flat": 4}, size=(24, 20))
    rows = [{"file_name": f"flat/img_{i:03d}.jpg", "labels": ["a", "b"][: i % 2 + 1], "caption": f"image {i}"}
            for i in range(4)] + [{"file_name": "flat/gone.jpg", "labels": ["a"], "caption": "missing"}]
    (tmp_path / "tree" / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    gcs_bucket.upload_tree(tmp_path / "tree", "images")
    prepare(gcs_server, "--input", gcs_bucket.url("images"), "--output", gcs_bucket.url("out"), "--image_size", "8",
            "--metadata", gcs_bucket.url("images/metadata.jsonl"), "--compression", "none")
    manifest = json.loads(gcs_bucket.read_bytes("out/manifest.json"))
    assert manifest["counts"] == {"listed": 5, "written": 4, "failed": 1, "skipped": 1}
    assert (manifest["multi_label"], manifest["extra_features"]) == (True, {"caption": "bytes"})
    (error,) = [json.loads(line) for line in gcs_bucket.read_bytes("out/errors.jsonl").decode().splitlines()]
    assert (error["path"], error["stage"]) == (gcs_bucket.url("images/flat/gone.jpg"), "read")
    seen = {}
    for shard in manifest["splits"]["train"]["shards"]:
        for record in _records(gcs_bucket.read_bytes(f"out/{shard}")):
            values = decode_all(record)
            seen[values["image/filename"][0].decode()] = (values["image/class/label"], values["caption"][0].decode())
    assert seen == {f"flat/img_{i:03d}.jpg": ([0, 1][: i % 2 + 1], f"image {i}") for i in range(4)}


def test_a_metadata_table_missing_from_gcs_is_refused(gcs_server, gcs_bucket, tmp_path, capsys):
    make_tree(tmp_path / "tree", {"a": 1}, size=(24, 20))
    gcs_bucket.upload_tree(tmp_path / "tree", "images")
    code, stderr = refused_here(capsys, "--input", gcs_bucket.url("images"), "--output", gcs_bucket.url("out"),
                                "--metadata", gcs_bucket.url("nope.csv"))
    assert code == 2, stderr
    assert stderr.startswith(f"error: cannot read --metadata {gcs_bucket.url('nope.csv')}: ")
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    assert gcs_bucket.list_names("out/") == []


def test_tables_in_split_folders_on_gcs_are_found_without_a_flag(gcs_server, gcs_bucket, tmp_path):
    """Hugging Face's layout in a bucket: each split folder's table found and read (a dry run lists it)."""
    make_tree(tmp_path / "tree" / "train", {"cat": 3}, size=(24, 20))
    make_tree(tmp_path / "tree" / "test", {"dog": 2}, size=(24, 20))
    for split, label, n in (("train", "cat", 3), ("test", "dog", 2)):
        rows = [{"file_name": f"{label}/img_{i:03d}.jpg", "caption": f"{split} {i}"} for i in range(n)]
        (tmp_path / "tree" / split / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    gcs_bucket.upload_tree(tmp_path / "tree", "hf")
    result = prepare(gcs_server, "--input", gcs_bucket.url("hf"), "--output", gcs_bucket.url("out"), "--dry_run")
    assert "lists 5 images in 2 labels (cat, dog)" in result.stdout, result.stdout
    assert "train: 3 images" in result.stdout and "test: 2 images" in result.stdout, result.stdout
