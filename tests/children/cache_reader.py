"""Reads gs:// array_record splits through the shard cache, as one of several jobs on a host.

    python -m tests.children.cache_reader CACHE_DIR SPLIT ORIGIN... [--max_bytes N]
        [--hold READY RELEASE] [--together DIR COUNT]

Prints one JSON line per origin: every record's file name and label, in index order.

--hold: the first fill stops once its first shard is written (its locks held, the
  folder half filled), creates READY and goes on when RELEASE exists.
--together: once its splits are cached, creates a file in DIR, then, until COUNT
  processes have done so (while the others fill and evict), reads its cached folders
  again and again, each time opening every shard afresh: a shard removed or changed
  under it fails the read.
"""
import argparse
import json
import os
import pathlib
import sys
import threading
import time

import beam_prep
from beam_prep.reader import shard_cache

WAIT_S = 120  # the longest any wait here lasts: a parent that died must not leave this running


def wait_for(done, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        if time.monotonic() > deadline:
            sys.exit(f"waited {WAIT_S} s for {what}")
        time.sleep(0.01)


def reread(sources: list, split: str, expected: list) -> bool:
    """Each source's cached folder read anew (its shards opened again) gives the records it gave."""
    again = [records(beam_prep.data_source(source.info.root, split)) for source in sources]
    assert again == expected, "a cached shard changed or vanished under its reader"
    return True


def hold_after_first_shard(ready: pathlib.Path, release: pathlib.Path) -> None:
    """The fill's first written shard creates READY, then waits for RELEASE."""
    fetch, once = shard_cache._fetch, threading.Lock()

    def held(*args):
        fetch(*args)
        if once.acquire(blocking=False):
            ready.touch()
            wait_for(release.exists, str(release))

    shard_cache._fetch = held


def records(source) -> list:
    return [[record["filename"], record["label"]] for record in source]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cache_dir")
    parser.add_argument("split")
    parser.add_argument("origins", nargs="+")
    parser.add_argument("--max_bytes", type=int)
    parser.add_argument("--hold", nargs=2, type=pathlib.Path)
    parser.add_argument("--together", nargs=2)
    args = parser.parse_args()
    if args.hold:
        hold_after_first_shard(*args.hold)
    sources = [beam_prep.data_source(origin, args.split, cache_dir=args.cache_dir, cache_max_bytes=args.max_bytes)
               for origin in args.origins]
    read = [records(source) for source in sources]
    if args.together:
        folder, count = pathlib.Path(args.together[0]), int(args.together[1])
        (folder / f"{os.getpid()}.cached").touch()
        wait_for(lambda: reread(sources, args.split, read) and len(list(folder.glob("*.cached"))) >= count,
                 f"{count} processes to cache their splits")
        reread(sources, args.split, read)
    for one in read:
        print(json.dumps(one))


if __name__ == "__main__":
    main()
