"""The stable hashes every listing decision is made by: a file's split, its place in its split,
its rank within its label (``selection``).

Each is a pure function of the path relative to the root, the same on every machine, process
and run, so reruns, resumes and workers agree without coordination.
"""
from __future__ import annotations

import hashlib

from beam_prep.write.shared.entry import DEFAULT_SPLIT, VALIDATION_SPLIT, raw_name

__all__ = ["order_key", "split_for", "stable_hash"]


def stable_hash(text: str, salt: str) -> int:
    """A 64-bit hash that is the same on every machine, process and run.

    Hashes the name's raw bytes, so a file name that is not UTF-8 hashes too.
    """
    digest = hashlib.sha256(salt.encode() + b":" + raw_name(text)).digest()
    return int.from_bytes(digest[:8], "big")


def order_key(relpath: str) -> int:
    """A file's place in its split: files are dealt to shards in key order and written in it.

    A hash, not the path, so classes are interleaved in every shard.
    """
    return stable_hash(relpath, "order")


def split_for(relpath: str, validation_percent: float) -> str:
    if not validation_percent:  # no hash can fall below 0%
        return DEFAULT_SPLIT
    fraction = stable_hash(relpath, "split") / 2**64
    return VALIDATION_SPLIT if fraction * 100 < validation_percent else DEFAULT_SPLIT
