"""``bench_writer --profile``'s attribution of py-spy's samples to stages: the innermost stage a
stack passes through, blocked threads and native-only samples apart."""
from __future__ import annotations

from benchmarks.report.tables import writer_profile
from benchmarks.writer_profile import NATIVE, OTHER, WAITING, stage_of, tally

PROCESS = 'process 12:"python -m pipelines.prepare_images"'
WORKER = [PROCESS, 'process 30:"python -m apache_beam.runners.worker.sdk_worker_main"', "<module> (sdk_worker_main.py:9)",
          "SdkWorker.process_bundle (apache_beam/runners/worker/sdk_worker.py:700)",
          "WriteShardFn.process (beam_prep/write/sinks/steps.py:120)", "_Shard.add (beam_prep/write/sinks/steps.py:80)",
          "make_example (beam_prep/write/images/examples.py:50)",
          "process_image (beam_prep/write/images/imaging.py:200)"]


def test_a_sample_goes_to_the_innermost_stage_it_passes_through():
    assert stage_of([*WORKER, "ImageFile.load (PIL/ImageFile.py:300)"]) == "image: decode (Pillow's load)"
    assert stage_of([*WORKER, "resize (beam_prep/write/images/resample.py:190)",
                     "_by_kernel (beam_prep/write/images/resample.py:260)"]) == "image: resize (the kernel)"
    assert stage_of([*WORKER, "_orientation (beam_prep/write/images/imaging.py:305)"]) == \
        "image: open, header, EXIF, convert"
    assert stage_of(WORKER[:6]) == "record: SHA-256, hash line, counts"
    assert stage_of([*WORKER, "_find_and_load (<frozen importlib._bootstrap>:1176)"]) == "start-up: imports"
    assert stage_of(WORKER[:4]) == "Beam: runner and workers' harness"
    assert stage_of([PROCESS, "main (pipelines/prepare_images.py:3)"]) == OTHER


def test_blocked_threads_and_samples_without_python_frames_are_apart_from_the_shares():
    waiting = [PROCESS, "Thread.run (threading.py:975)", "Condition.wait (threading.py:320)"]
    # The warm pool's thread, blocked on its socket until a relay connects (py-spy counts it busy).
    accepting = [PROCESS, "Thread.run (threading.py:975)", "WarmPool._hand_over (beam_prep/write/run/warm_pool.py:250)",
                 "socket.accept (socket.py:294)"]
    lines = [";".join(waiting) + " 20\n", ";".join(accepting) + " 10\n", PROCESS + " 10\n",
             ";".join([*WORKER, "ImageFile.load (PIL/ImageFile.py:300)"]) + " 3\n",
             ";".join([*WORKER, "_encode (beam_prep/write/images/imaging.py:450)"]) + " 1\n"]
    samples = tally(lines)
    assert samples == {WAITING: 30, NATIVE: 10, "image: decode (Pillow's load)": 3, "image: encode JPEG": 1}
    table = writer_profile({"samples": dict(samples), "cpu_ms_per_image": 2.0, "images": 100, "rate": 100})
    assert "| image: decode (Pillow's load) | 3 | 75.0% | 1.500 |" in table
    assert "| image: encode JPEG | 1 | 25.0% | 0.500 |" in table
    assert "waiting 30" in table and WAITING + " |" not in table
