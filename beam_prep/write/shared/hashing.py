"""The stable hashes every listing decision is made by: a file's split, its place in its split,
its rank within its label (``selection``).

Each is a pure function of the path relative to the root, the same on every machine, process
and run, so reruns, resumes and workers agree without coordination.
"""
from __future__ import annotations

import hashlib

from beam_prep.write.shared.entry import DEFAULT_SPLIT, VALIDATION_SPLIT

__all__ = ["hashed_split", "order_key", "split_and_cap_hashes", "split_for", "stable_hash"]


_PREFIXES: dict[str, bytes] = {}  # salt -> b"salt:"


def stable_hash(text: str, salt: str) -> int:
    """A 64-bit hash that is the same on every machine, process and run.

    Hashes the name's raw bytes (``raw_name``, spelled out: the listing hashes each file
    two or three times), so a file name that is not UTF-8 hashes too.
    """
    return int.from_bytes(_digest(text, salt)[:8], "big")


def split_and_cap_hashes(relpath: str) -> tuple[int, int]:
    """A file's split hash (``stable_hash(relpath, "split")``) and its cap hash (``--max_per_class``):
    the next 64 bits of the same SHA-256, independent of the first, for one hash's cost."""
    digest = _digest(relpath, "split")
    return int.from_bytes(digest[:8], "big"), int.from_bytes(digest[8:16], "big")


def _digest(text: str, salt: str) -> bytes:
    prefix = _PREFIXES.get(salt)
    if prefix is None:
        prefix = _PREFIXES[salt] = salt.encode() + b":"
    return hashlib.sha256(prefix + text.encode("utf-8", "surrogateescape")).digest()


def order_key(relpath: str) -> int:
    """A file's place in its split: files are dealt to shards in key order and written in it.

    A hash, not the path, so classes are interleaved in every shard.
    """
    return stable_hash(relpath, "order")


def split_for(relpath: str, validation_percent: float) -> str:
    if not validation_percent:  # no hash can fall below 0%
        return DEFAULT_SPLIT
    return hashed_split(stable_hash(relpath, "split"), validation_percent)


def hashed_split(split_hash: int, validation_percent: float) -> str:
    """The split a file of ``split_hash`` goes to: validation where the hash, as a share of 2**64,
    is below ``validation_percent``."""
    return VALIDATION_SPLIT if split_hash / 2**64 * 100 < validation_percent else DEFAULT_SPLIT
