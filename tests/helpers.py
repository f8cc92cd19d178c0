"""What tests share besides fixtures: run the pipeline as a user does, read its records
back with plain TensorFlow, and make small labelled image trees.

Tests import these (``from helpers import ...``); ``conftest.py`` keeps only
fixtures and pytest hooks.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from PIL import Image

from beam_prep.tools.sample import picture
from pipelines.prepare_images import command

UNFINISHED_RUN = "20260101-000000-abcdef"  # the run id ``leave_unfinished_run`` gives

REPO = pathlib.Path(__file__).resolve().parent.parent


# --- running the pipeline -------------------------------------------------------


def run_prepare(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
                preexec_fn: Callable[[], None] | None = None) -> subprocess.CompletedProcess:
    """``python -m pipelines.prepare_images ARGS`` in a fresh process, as a user runs it."""
    return subprocess.run(command(*args), cwd=REPO, env=env or dict(os.environ), capture_output=True,
                          text=True, timeout=timeout, preexec_fn=preexec_fn)


def prepare_here(*args: str) -> dict[str, Any] | None:
    """The job of ``beam-prep prepare ARGS`` in this process, on Beam's in-memory DirectRunner.

    The command's own checks, defaults and pipeline (``beam_prep.prepare``), without the
    launcher and worker processes whose start costs seconds a run: for a test of what a run
    writes. A test of the command itself (exit codes, console lines, worker processes,
    signals) runs it with ``run_prepare``. Returns the manifest; a refused or failed run raises.
    """
    import beam_prep

    options: dict[str, Any] = {}
    tokens = list(args)
    while tokens:
        flag = tokens.pop(0)
        assert flag.startswith("--"), f"{flag!r}: not a flag"
        name, eq, value = flag[2:].partition("=")
        if not eq:
            value = tokens.pop(0) if tokens and not tokens[0].startswith("--") else True
        assert name.replace("-", "_") not in options, f"{flag}: given twice"
        options[name.replace("-", "_")] = value
    options.setdefault("direct_running_mode", "in_memory")
    return beam_prep.prepare(options.pop("input"), options.pop("output"), **options)


def child(name: str, *args: str) -> list[str]:
    """The command that runs ``tests/children/<name>.py`` in a fresh Python process (cwd: REPO)."""
    return [sys.executable, "-m", f"tests.children.{name}", *args]


# --- reading what it wrote ------------------------------------------------------


def read_split(output: str | pathlib.Path, split: str) -> list[dict[str, Any]]:
    """Every record of a split, in file order, parsed by TensorFlow itself (not our reader)."""
    import tensorflow as tf

    manifest = json.loads(tf.io.gfile.GFile(f"{output}/manifest.json").read())
    files = [f"{output}/{name}" for name in manifest["splits"][split]["shards"]]
    compression = "" if manifest.get("compression") == "NONE" else "GZIP"
    spec = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/format": tf.io.FixedLenFeature([], tf.string),
        "image/height": tf.io.FixedLenFeature([], tf.int64),
        "image/width": tf.io.FixedLenFeature([], tf.int64),
        "image/channels": tf.io.FixedLenFeature([], tf.int64),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
        "image/class/text": tf.io.FixedLenFeature([], tf.string),
        "image/filename": tf.io.FixedLenFeature([], tf.string),
        "image/key/sha256": tf.io.FixedLenFeature([], tf.string),
    }
    records = []
    for path in files:
        for serialized in tf.data.TFRecordDataset(path, compression_type=compression):
            parsed = tf.io.parse_single_example(serialized, spec)
            row = {k: v.numpy() for k, v in parsed.items()}
            row["shard"] = path.rsplit("/", 1)[-1]
            records.append(row)
    return records


def assert_shard_checksums(output: str | pathlib.Path) -> None:
    """Each split's ``shard_sha256`` and ``shard_bytes`` in the manifest are hashlib's sha256 and
    the size of each local shard file, read back here."""
    import hashlib

    output = pathlib.Path(output)
    manifest = json.loads((output / "manifest.json").read_text(encoding="utf-8"))
    for split, info in manifest["splits"].items():
        files = [(output / name).read_bytes() for name in info["shards"]]
        assert info["shard_sha256"] == [hashlib.sha256(data).hexdigest() for data in files], split
        assert info["shard_bytes"] == [len(data) for data in files], split


def as_two_versions(out: pathlib.Path) -> dict:
    """The manifest of ``out`` rewritten to say its first shard of each split was version 1 and the
    rest version 2, each version's kept hash file made again from its shards; returns it."""
    from beam_prep.model.dataset import DatasetInfo
    from beam_prep.write.grow.existing import write_unkept
    from beam_prep.write.shared.kept_hashes import KeptFile

    manifest = json.loads((out / "manifest.json").read_text())
    (first,) = manifest["versions"]
    second = {**first, "version": 2, "input": "/new", "splits": {}}
    for name, split in manifest["splits"].items():
        counts = split["shard_num_examples"]
        first["splits"][name] = {"num_examples": counts[0], "shards": split["shards"][:1]}
        second["splits"][name] = {"num_examples": sum(counts[1:]), "shards": split["shards"][1:]}
    manifest["versions"] = [first, second]
    manifest.pop("hash_files", None)
    for kept in out.glob("hashes-v*.tsv.gz"):
        kept.unlink()
    info = DatasetInfo.from_json(manifest, str(out), str(out / "manifest.json"))
    manifest["hash_files"] = []
    for version, name in enumerate(write_unkept(str(out), info, manifest, str(out)), 1):
        data = (out / name).read_bytes()
        lines = gzip.decompress(data).count(b"\n")
        manifest["hash_files"].append(dict(KeptFile.of(version, lines, hashlib.sha256(data).hexdigest())))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


# --- image trees ----------------------------------------------------------------


def encode(img: Image.Image, fmt: str = "JPEG", **params) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **params)
    return buf.getvalue()


def make_tree(
    root: pathlib.Path,
    counts: Mapping[str, int],
    *,
    splits: Iterable[str] | None = None,
    size: tuple[int, int] = (96, 64),
    fmt: str = "JPEG",
    ext: str = ".jpg",
) -> list[pathlib.Path]:
    """Writes ``root/[split/]label/img_NNN.ext`` and returns the files written.

    Every image differs (the seed is its position), so tests can tell records apart.
    """
    written = []
    seed = 0
    for split in (list(splits) if splits else [None]):
        for label, n in counts.items():
            folder = root / split / label if split else root / label
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                path = folder / f"img_{i:03d}{ext}"
                path.write_bytes(encode(picture(seed, *size), fmt))
                written.append(path)
                seed += 1
    return written


def leave_unfinished_run(argv: list[str], output: str | os.PathLike) -> None:
    """What a launcher killed after planning leaves in ``output`` for the command ``argv``: its run
    record, no shard finished (run ``UNFINISHED_RUN``)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_prep.cli.options import config_from_options
    from beam_prep.write.journal import resume
    from beam_prep.write.shared import layout

    recorded = resume.record_options(config_from_options(PipelineOptions(argv)), None)
    work = layout.run_folder(str(output), UNFINISHED_RUN)
    os.makedirs(work)
    resume.write_run_record(work, resume.RunRecord(UNFINISHED_RUN, recorded, False, {"run_id": UNFINISHED_RUN}))


def assert_edited_table_refused(capsys: Any, argv: list[str], output: str | os.PathLike, table: pathlib.Path,
                                edit: Callable[[], None]) -> None:
    """A run left unfinished (``leave_unfinished_run``) with ``table`` as it was, then ``edit``: the
    same command exits 2 naming the table's sha256 then and now, and leaves the unfinished run as it was."""
    from pipelines import prepare_images

    leave_unfinished_run(argv, output)
    before = hashlib.sha256(table.read_bytes()).hexdigest()
    edit()
    after = hashlib.sha256(table.read_bytes()).hexdigest()
    assert prepare_images.main(argv) == 2
    assert capsys.readouterr().err == (
        f"error: --output {output} holds unfinished run {UNFINISHED_RUN}, started with --metadata {table} "
        f"(sha256 {before[:12]}) where this run has {table} (sha256 {after[:12]}); run it with the same options "
        "to resume it, or pass --overwrite to start over\n")
    assert os.listdir(pathlib.Path(output) / ".beam-prep") == [UNFINISHED_RUN]
