# Dataflow worker image for beam-prep: Beam's own SDK image (its boot entrypoint
# is kept as is) with the project and its pinned dependencies installed, so jobs
# start without installing anything. The tag must equal setup.py's BEAM_VERSION.
FROM apache/beam_python3.11_sdk:2.77.0

WORKDIR /opt/beam-prep
COPY setup.py README.md ./
COPY beam_prep ./beam_prep
COPY pipelines ./pipelines
RUN pip install --no-cache-dir . && python -c "import beam_prep.transforms, pipelines.prepare_images"
