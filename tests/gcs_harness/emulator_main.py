"""``python -m gcp_storage_emulator`` with two costs taken out that real GCS does not have.

* After every write the emulator re-serialises the metadata of every object it
  holds (indented JSON, into its own store), which it reads back only when it
  starts: loading N objects cost O(N^2), hours for a benchmark corpus. Here the
  hook only marks the object table as changed.
* Every list request scanned every object of the bucket for its prefix. Here it
  is answered from a sorted index of names, rebuilt after a change.

Run by path (``python emulator_main.py start ...``, the emulator's own
arguments): ``EmulatorProcess`` starts it in a scratch folder, from tests and
benchmarks alike.
"""
import bisect
import sys

from gcp_storage_emulator import storage
from gcp_storage_emulator.__main__ import main

changes = [0]
index = {}


def changed(self):
    changes[0] += 1


def live_candidates(self, bucket_name, prefix=None):
    objects = self.objects.get(bucket_name, {})
    version, names = index.get(bucket_name, (None, None))
    if version != changes[0]:
        names = sorted(objects)
        index[bucket_name] = (changes[0], names)
    prefix = prefix or ""
    found = []
    for i in range(bisect.bisect_left(names, prefix), len(names)):
        if not names[i].startswith(prefix):
            break
        found.append((names[i], objects[names[i]]))
    return found


if __name__ == "__main__":
    storage.Storage._write_config_to_file = changed
    storage.Storage._list_live_candidates = live_candidates
    main(sys.argv[1:])
