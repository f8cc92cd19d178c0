"""Packaging for beam-prep.

The same file stages the project onto Dataflow workers (``--setup_file``), so
the pins here are the pins every worker runs with.
"""
import os
import sys

from setuptools import Extension, find_packages, setup

# Beam is pinned exactly: a Dataflow job's launcher and its workers (the Dockerfile's
# apache/beam_python*_sdk image) must run the same SDK. The other ranges were checked
# to resolve together: Beam 2.77 and TensorFlow 2.21 both accept protobuf 6.31+.
BEAM_VERSION = "2.77.0"
REQUIRED = [
    f"apache-beam[gcp]=={BEAM_VERSION}",
    "tensorflow>=2.21,<2.22",
    # Below the next minor release: its resize may change, and our kernel resizes only for the Pillow
    # versions it was checked against (write/images/resample.py CHECKED_PILLOW; Pillow's loops otherwise).
    "pillow>=11.0,<12.4",
    "numpy>=1.26,<3",
    "protobuf>=6.31,<7",
    # GZIP for the local sink: ISA-L, ~5x faster than zlib at the same ratio.
    "isal>=1.6,<2",
    # TFRecord framing and gs:// read checks (also required by google-cloud-storage).
    "google-crc32c>=1.5,<2",
    # Progress bars: the local run, verify and bench.
    "tqdm>=4.66,<5",
    # Finding and stopping a local run's worker processes on Ctrl-C or SIGTERM, on any OS.
    "psutil>=5.9",
    # The dataset card's YAML front matter (Hugging Face's format; Beam requires it too).
    "pyyaml>=6,<7",
]

# --file_format's libraries (beam_prep/io/libraries.py names the same requirements in its
# install commands). array-record 0.8 has wheels for CPython 3.11-3.14 (Linux x86_64 and
# aarch64, macOS arm64), none for 3.10; webdataset 1.0 is pure Python (3.10+). beam-prep
# writes WebDataset's tar shards itself: webdataset is for reading them back.
FORMATS = {
    "array_record": ["array-record>=0.8,<0.9"],
    "webdataset": ["webdataset>=1.0,<1.1"],
}

# NVIDIA DALI, for beam_prep.dali_reader and docs/guides/gpu-dali.md: the CUDA 12 build (wheels for
# Linux x86_64 and aarch64), which runs CPU-only pipelines too (device_id=None), as CI does.
DALI = {"dali": ["nvidia-dali-cuda120>=2.4,<3"]}

# docs/guides/grain-pytorch.md's every block, run in CI by .ci/run: Grain, JAX for the CPU, PyTorch
# and torchvision beside both formats' libraries. torch and torchvision are pinned exactly, as a
# pair: another version would download gigabytes of CUDA wheels. Grain has wheels for CPython 3.11+.
GRAIN_PYTORCH = [
    *(f"{r}; python_version >= '3.11'" for r in FORMATS["array_record"]), *FORMATS["webdataset"],
    "grain>=0.2,<0.3; python_version >= '3.11'",
    "jax[cpu]>=0.10,<0.11",
    "torch==2.14.1",
    "torchvision==0.29.1",
]

TEST = [
    "pytest>=8",
    # pytest.ini runs the suite on a worker a core (-n auto); pytest-cov for the tiers' coverage.
    "pytest-xdist>=3.6,<4",
    "pytest-cov>=5",
    # The lint gate .ci/run runs (ruff.toml): pinned, so a ruff release's new findings arrive by choice.
    "ruff==0.17.5",
    "packaging>=23",
    "gcp-storage-emulator>=2024.8.3",
    "trustme>=1.1",
    "psutil>=5.9",
    # tests/test_bench_append.py runs the append benchmark small: its corpus is drawn from
    # scikit-image's sample photographs (benchmarks/corpus.py).
    "scikit-image>=0.24",
    # The reference the perceptual hash is checked against (tests/write/test_phash.py).
    "imagehash>=4.3",
    # The TFDS metadata test reads our output with the real tfds.builder_from_directory and
    # tfds.show_examples (matplotlib); the writer produces those files without either.
    "tensorflow-datasets>=4.9.10,<5",
    "matplotlib>=3.8,<4",
    # tests/write/test_formats.py reads each format with its own library, and data_source with
    # Grain (0.2: wheels for CPython 3.11-3.14, as array-record's).
    # Both have wheels for CPython 3.11+ only: on 3.10 the test extra installs without them.
    *(f"{r}; python_version >= '3.11'" for r in FORMATS["array_record"]), *FORMATS["webdataset"],
    "grain>=0.2,<0.3; python_version >= '3.11'",
    # tests/write/test_hf_oracle.py reads Hugging Face's imagefolder layouts with its own loader
    # (checked against 5.2: a table in each split folder, no folder labels beside a table).
    "datasets>=5.2,<6",
    # docs/guides/gpu-dali.md's other readers, each recipe run: Ray Data and the tfrecord package.
    "ray[data]>=2.60,<3",
    "tfrecord>=1.14,<2",
    # tests/tools/test_report_browser.py drives Debian's headless Chromium (.ci/run installs it) over
    # beam-prep report's page: console errors, requests, counts, pictures, a screenshot.
    "selenium>=4.20,<5",
]

BENCH = [
    "scikit-image>=0.24",
    "psutil>=5.9",
    # benchmarks/bench_resize.py's other ways to decode and resize, beside our kernel.
    "pyvips>=3", "pyvips-binary>=8.16", "opencv-python-headless>=4.10", "simplejpeg>=1.8",
    # bench_writer --profile: a sampling profile of the whole command, launcher and workers.
    "py-spy>=0.4",
]

# The writer benchmark's peers (img2dataset, MosaicML Streaming, LitData) pin versions of numpy,
# OpenCV and others that conflict with these: they are no extra, but a virtualenv of their own made
# from benchmarks/peers-requirements.txt.

# The documentation site (mkdocs.yml; .ci/run builds it with --strict), pinned so that a
# release of one of them cannot fail CI or change the pages' HTML unasked.
DOCS = ["mkdocs==1.6.1", "mkdocs-material==9.8.1", "mkdocstrings==1.0.8", "mkdocstrings-python==2.0.11"]

# Our resize kernel (write/images/_resample.c): Pillow's bicubic loops, vectorised for SSE4.1, AVX2 and
# AVX-512 (_resample_simd.h, the one the CPU runs chosen at load), built by the
# install where a C compiler is found. Optional: without one the install still succeeds, and
# Pillow's own loops resize (the same pixels, slower; the run says so once). -ffp-contract=off:
# no fused multiply-add in the weights, whose roundings must be Pillow's.
# The same extension holds the JPEG fast path (_jpeg_path.h, on Unix): compiled against libjpeg's
# interface headers kept here (write/images/libjpeg), it links no JPEG library but calls the one
# Pillow loaded, found at run time (dlsym; libdl on glibc before 2.34).
RESIZE_KERNEL = Extension(
    "beam_prep.write.images._resample", ["beam_prep/write/images/_resample.c"], optional=True,
    depends=["beam_prep/write/images/_resample_simd.h", "beam_prep/write/images/_phash.h",
             "beam_prep/write/images/_jpeg_path.h", "beam_prep/write/images/libjpeg/jpeglib.h",
             "beam_prep/write/images/libjpeg/jconfig.h", "beam_prep/write/images/libjpeg/jmorecfg.h"],
    libraries=["dl"] if sys.platform.startswith("linux") else [],
    extra_compile_args=["/O2", "/fp:precise"] if os.name == "nt" else ["-O3", "-ffp-contract=off"])

setup(
    name="beam-prep",
    version="0.1.0",
    description="Image folder trees to sharded GZIP TFRecords with Apache Beam, and a tf.data reader for them.",
    python_requires=">=3.10,<3.14",
    packages=find_packages(include=["beam_prep", "beam_prep.*", "pipelines", "pipelines.*"]),
    ext_modules=[RESIZE_KERNEL],
    install_requires=REQUIRED,
    extras_require={"test": TEST, "bench": BENCH, "docs": DOCS, "grain-pytorch": GRAIN_PYTORCH,
                    **DALI, **FORMATS},
    entry_points={"console_scripts": ["beam-prep=pipelines.cli:main"]},
)
