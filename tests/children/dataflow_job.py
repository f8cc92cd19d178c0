"""Builds the Dataflow job for the pipeline options given, stopped before submission (``--dry_run``).

    python -m tests.children.dataflow_job OUT.json PIPELINE_OPTIONS...

Writes the job's transforms (unique name -> URN), its container images and
its staged dependencies: what the Dataflow runner itself made of the job.
"""
import json
import sys

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_runner_api_pb2

from beam_prep.cli.options import config_from_options
from beam_prep.write.run.pipeline import run

if __name__ == "__main__":
    out, argv = sys.argv[1], sys.argv[2:]
    options = PipelineOptions(argv)
    result = run(config_from_options(options), options)
    pipeline = result.job.proto_pipeline
    environments = pipeline.components.environments.values()
    images = [beam_runner_api_pb2.DockerPayload.FromString(e.payload).container_image for e in environments]
    deps = [beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(d.role_payload).staged_name
            for e in environments for d in e.dependencies]
    transforms = {t.unique_name: t.spec.urn for t in pipeline.components.transforms.values()}
    with open(out, "w") as f:
        json.dump({"transforms": transforms, "images": images, "deps": deps}, f)
