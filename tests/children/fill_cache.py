"""Opens a gs:// array_record dataset's split through the shard cache, as each of several jobs starting at once.

    python -m tests.children.fill_cache gs://BUCKET/DATASET SPLIT CACHE_DIR

Prints one JSON line: every record's file name and label, in index order.
"""
import json
import sys

import beam_prep

if __name__ == "__main__":
    source = beam_prep.data_source(sys.argv[1], sys.argv[2], cache_dir=sys.argv[3])
    print(json.dumps([[record["filename"], record["label"]] for record in source]))
