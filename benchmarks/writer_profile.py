"""``bench_writer --profile``: where the default command's CPU goes, per image, stage by stage.

The default command (c) on the cached corpus, run twice: once timed as in the
other rows (its whole process tree's CPU per image), once under py-spy
(``py-spy record --subprocesses``: the launcher and every worker, sampled
while busy; ``pip install -e '.[bench]'`` installs it). Each sample is put in
the innermost stage its stack passes through (``STAGES``: the decode inside
``process_image`` is decode, not ``process_image``), and each stage's share of
the samples times the timed run's CPU per image is what it costs an image.

A sampling profile: the shares are those of the samples (a few thousand), and
py-spy counts a thread busy when it holds the GIL or runs native code, so the
figures are close to, not exactly, each stage's CPU.

    python -m benchmarks.bench_writer --profile [--images 2000] [--rate 200] [--json p.json]
"""
from __future__ import annotations

import argparse
import collections
import logging
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence

from benchmarks import CACHE_DIR, REPO_ROOT, machine
from benchmarks.corpus import ensure_corpus
from benchmarks.measure import check_manifest, run_measured
from benchmarks.report import tables
from benchmarks.results import Recording
from pipelines import prepare_images

DEFAULT_IMAGES = 2000
FLAGS = ("--image_size", "224", "--jpeg_quality", "90")

# (stage, where: a frame's function name and file, as py-spy names them). A sample goes to the first
# stage, from the innermost frame out, whose frame it passes through; "other" where none.
STAGES: tuple[tuple[str, str, str], ...] = (
    ("start-up: imports", "_find_and_load", "<frozen importlib._bootstrap>"),
    ("image: decode (Pillow's load)", "load", "ImageFile.py"),
    ("image: resize (the kernel)", "resize", "resample.py"),
    ("image: perceptual hash", "phash", "phash.py"),
    ("image: encode JPEG", "_encode", "imaging.py"),
    ("image: flat-colour check", "_flat", "imaging.py"),
    ("image: the JPEG fast path (one native call)", "make", "jpeg_path.py"),
    ("image: open, header, EXIF, convert", "process_image", "imaging.py"),
    ("record: the Example", "payload", "shard_formats.py"),
    ("record: framing and GZIP", "write_record", "tfrecord.py"),
    ("record: SHA-256, hash line, counts", "add", "steps.py"),
    ("read: the file", "FileReader.__call__", "examples.py"),
    ("read: read-ahead", "ReadAhead._fetched", "readahead.py"),
    ("worker: its loop (entries, shards)", "WriteShardFn.process", "steps.py"),
    ("launcher: listing and plan", "plan_run", "pipeline.py"),
    ("launcher: finishing (counts, manifest)", "finalize_from_records", "pipeline.py"),
    ("Beam: runner and workers' harness", "", "fn_runner.py"),
    ("Beam: runner and workers' harness", "", "sdk_worker.py"),
    ("Beam: runner and workers' harness", "", "worker_handlers.py"),
)
OTHER = "other"
NATIVE = "outside Python frames (interpreter start and exit, native threads)"
WAITING = "waiting"
# A sample whose innermost frame is one of these is a thread blocked, not working (py-spy counts
# some blocked threads busy): a lock, a queue, a child process, gRPC's threads blocked in C.
_WAITS = {"Condition.wait", "Event.wait", "Semaphore.acquire", "Queue.get", "Popen._try_wait", "_wait_once",
          "wait", "select", "poll", "sleep", "_serve", "channel_spin", "_poll_connectivity", "accept"}
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def stage_of(stack: Sequence[str]) -> str:
    """The stage of one sample: its frames, outermost first, as py-spy's raw format gives them
    (with ``--subprocesses``, a ``process N:"command"`` frame first for each process)."""
    frames = [m for m in map(_FRAME.match, stack) if m and not m["function"].startswith("process ")]
    if not frames:
        return NATIVE
    if frames[-1]["function"] in _WAITS or frames[-1]["function"].rsplit(".", 1)[-1] in _WAITS:
        return WAITING
    for m in reversed(frames):
        function, file = m["function"], m["file"].rsplit("/", 1)[-1]
        for stage, name, where in STAGES:
            if file == where and (not name or function == name or function.endswith("." + name)):
                return stage
    return OTHER


def tally(lines: Iterable[str]) -> collections.Counter:
    """Samples by stage, from py-spy's raw (collapsed stacks) output."""
    counts: collections.Counter = collections.Counter()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if stack and count.isdigit():
            counts[stage_of(stack.split(";"))] += int(count)
    return counts


def py_spy() -> str | None:
    beside = pathlib.Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def profile(spy: str, command: Sequence[str], rate: int, raw: pathlib.Path) -> None:
    subprocess.run([spy, "record", "--subprocesses", "--nonblocking", "--rate", str(rate), "--format", "raw", "--output", str(raw),
                    "--", *command], cwd=REPO_ROOT, check=True, capture_output=True)


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_writer --profile",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", action="store_true", help="this mode")
    parser.add_argument("--images", type=int, default=DEFAULT_IMAGES, help=f"corpus size (default {DEFAULT_IMAGES})")
    parser.add_argument("--rate", type=int, default=200, help="py-spy's samples a second (default 200)")
    parser.add_argument("--json", type=pathlib.Path, help="also write the results here as JSON")
    args = parser.parse_args(argv)
    if args.images < 1 or args.rate < 1:
        parser.error("--images and --rate must be positive")
    spy = py_spy()
    if spy is None:
        parser.error("py-spy is not installed: pip install -e '.[bench]'")
    recording = Recording("writer-profile", argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    corpus = ensure_corpus(args.images, CACHE_DIR)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="profile-", dir=CACHE_DIR))
    try:
        out = workdir / "out"
        command = prepare_images.command("--input", str(corpus.root), "--output", str(out), *FLAGS, "--overwrite")
        measured = run_measured(command, cwd=REPO_ROOT, private=True)
        error = f"exit status {measured.returncode}" if measured.returncode else check_manifest(
            out / "manifest.json", corpus.images)
        if error:
            sys.exit(f"the command failed: {error}\n{measured.stderr_tail[-2000:]}")
        raw = workdir / "profile.txt"
        profile(spy, command, args.rate, raw)
        with raw.open() as lines:
            samples = tally(lines)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results = {"images": corpus.images, "cpu_ms_per_image": measured.cpu_seconds / corpus.images * 1e3,
               "seconds": measured.seconds, "rate": args.rate, "samples": dict(samples.most_common())}
    print(f"{machine.describe(machine.machine_info())}\n")
    print(tables.writer_profile(results))
    recording.write(args.json, results)
