# Dataflow worker image for beam-prep: Beam's own SDK image (its boot entrypoint
# is kept as is) with the project and its pinned dependencies installed, so jobs
# start without installing anything. The tag must equal setup.py's BEAM_VERSION.
FROM apache/beam_python3.11_sdk:2.77.0

WORKDIR /opt/beam-prep
COPY setup.py README.md ./
COPY beam_prep ./beam_prep
COPY pipelines ./pipelines
# Python never imports from the working folder (PYTHONSAFEPATH): the sources copied here for the
# install lack the kernel it builds, and the workers start in this folder.
ENV PYTHONSAFEPATH=1
# With --file_format's libraries (setup.py's extras), checked as a run checks them before any work.
# The install builds the resize kernel (a C extension, docs/design/resizing.md): Pillow's bytes,
# the same as a local run's, at pillow-simd's speed. The compiler leaves again in the same layer;
# the image is refused if the kernel did not build or does not run with the Pillow installed.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && pip install --no-cache-dir ".[array_record,webdataset]" \
 && apt-get purge -y gcc libc6-dev \
 && apt-get autoremove -y && rm -rf /var/lib/apt/lists/* \
 && python -c "import beam_prep.write.sinks.shard_sinks, pipelines.prepare_images, webdataset; from beam_prep.write.shared.shard_formats import check_installed; check_installed('array_record')" \
 && python -c "from beam_prep.write.images import resample; assert resample.available() == resample.KERNEL, resample.available()"
