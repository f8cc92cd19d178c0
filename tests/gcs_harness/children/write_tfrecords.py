"""Writes 40 records as GZIP TFRecords in two shards at PREFIX with Beam's DirectRunner.

    python -m tests.gcs_harness.children.write_tfrecords gs://BUCKET/PREFIX

In multi_processing mode, so the server's environment has to reach Beam's
worker processes too.
"""
import sys

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.options.pipeline_options import PipelineOptions

RECORDS = [f"record-{i:03d}".encode() for i in range(40)]

if __name__ == "__main__":
    prefix = sys.argv[1]
    options = PipelineOptions(
        runner="DirectRunner", direct_running_mode="multi_processing",
        direct_num_workers=2)
    with beam.Pipeline(options=options) as p:
        (p | beam.Create(RECORDS)
           | beam.io.WriteToTFRecord(prefix, file_name_suffix=".tfrecord.gz",
                                     num_shards=2,
                                     compression_type=CompressionTypes.GZIP))
