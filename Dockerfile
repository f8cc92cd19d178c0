# Dataflow worker image for beam-prep: Beam's own SDK image (its boot entrypoint
# is kept as is) with the project and its pinned dependencies installed, so jobs
# start without installing anything. The tag must equal setup.py's BEAM_VERSION.
FROM apache/beam_python3.11_sdk:2.77.0

WORKDIR /opt/beam-prep
COPY setup.py README.md ./
COPY beam_prep ./beam_prep
COPY pipelines ./pipelines
COPY .ci/build-pillow-simd ./
# With --file_format's libraries (setup.py's extras), checked as a run checks them before any work.
RUN pip install --no-cache-dir ".[array_record,webdataset]" \
 && python -c "import beam_prep.write.sinks.shard_sinks, pipelines.prepare_images, webdataset; from beam_prep.write.shared.shard_formats import check_installed; check_installed('array_record')"
# pillow-simd in place of Pillow (docs/design/resizing.md): the workers decode and
# resize every image. It ships no wheels, so it is built here; the compiler and
# headers leave again in the same layer, the libraries it links stay.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev libjpeg62-turbo-dev zlib1g-dev \
 && apt-mark manual libjpeg62-turbo zlib1g \
 && bash build-pillow-simd \
 && apt-get purge -y gcc libc6-dev libjpeg62-turbo-dev zlib1g-dev \
 && apt-get autoremove -y && rm -rf /var/lib/apt/lists/* \
 && python -c "from beam_prep.write.images import imaging; assert imaging.library().startswith('pillow-simd'), imaging.library()"
