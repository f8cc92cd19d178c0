"""A user's own pipeline with ``WriteImageDataset``, from gs:// to gs://; prints the manifest.

    python -m tests.children.write_gs ROOT OUTPUT LABEL,LABEL PATH...

Each PATH (a gs:// image under ROOT/<label>/) is an element labelled by its
folder; one more element holds bytes that are not an image. A child, so that
it reads and writes through the GCS server's environment.
"""
import json
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from beam_prep.write.finish import manifest
from beam_prep.write.run.pipeline import local_runner
from beam_prep.write.run.write_image_dataset import ImageElement, WriteImageDataset

if __name__ == "__main__":
    root, output, labels, *paths = sys.argv[1:]
    elements = [(path, path.rsplit("/", 2)[-2]) for path in paths]
    elements.append(ImageElement(b"not an image", 0, name="memory/broken"))
    options = PipelineOptions([], direct_running_mode="in_memory")
    with beam.Pipeline(runner=local_runner(options), options=options) as p:
        _ = (p
             | beam.Create(elements)
             | WriteImageDataset(output, labels.split(","), image_size=16, root=root, num_shards=2))
    print(json.dumps(manifest.read(output)))
