"""Opens a gs:// array_record dataset's split through the shard cache, as each of several jobs starting at once.

    python -m tests.children.fill_cache gs://BUCKET/DATASET SPLIT CACHE_DIR [--max_bytes N]
        [--after_stdin] [--die_mid_write READY]

Prints one JSON line: every record's file name and label, in index order.

--after_stdin: starts once a line arrives on stdin (a test readies the cache for this pid first).
--die_mid_write: the first shard written stops half way (its partial file flushed), creates READY
  and waits to be killed; the fill's other writes wait with it.
"""
import argparse
import json
import os
import pathlib
import sys
import threading

import beam_prep

WAIT_S = 120  # the longest the held write waits: a parent that died must not leave this running


def die_mid_write(ready: pathlib.Path) -> None:
    """Holds every shard's write; the first one after writing half its bytes and creating READY."""
    from beam_prep.reader import cache_fs

    write_all, once, never = cache_fs.write_all, threading.Lock(), threading.Event()

    def held(fd: int, data: bytes) -> None:
        if ".array_record.partial-" not in os.readlink(f"/proc/self/fd/{fd}"):
            return write_all(fd, data)
        if once.acquire(blocking=False):
            write_all(fd, data[:len(data) // 2])
            os.fsync(fd)
            ready.touch()
        never.wait(WAIT_S)
        sys.exit(f"not killed after {WAIT_S} s")

    cache_fs.write_all = held


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("origin")
    parser.add_argument("split")
    parser.add_argument("cache_dir")
    parser.add_argument("--max_bytes", type=int)
    parser.add_argument("--after_stdin", action="store_true")
    parser.add_argument("--die_mid_write", type=pathlib.Path)
    args = parser.parse_args()
    if args.die_mid_write:
        die_mid_write(args.die_mid_write)
    if args.after_stdin:
        sys.stdin.readline()
    source = beam_prep.data_source(args.origin, args.split, cache_dir=args.cache_dir, cache_max_bytes=args.max_bytes)
    print(json.dumps([[record["filename"], record["label"]] for record in source]))


if __name__ == "__main__":
    main()
