"""TFRecord framing benchmark: beam_prep's own (``beam_prep.io.tfrecord``) against Beam's ``_TFRecordUtil``.

Frames 20,000 records of 15-25 KB (random bytes, about a 224x224 JPEG each) with
each, into a file object that drops the bytes, so the time is the framing alone
(CRC32C, packing, joining); runs alternate, so other load falls on both alike.
Both outputs are first checked to be byte-identical.

    python -m benchmarks.bench_framing [--records 20000] [--repeat 15] [--json framing.json]
"""
from __future__ import annotations

import argparse
import io
import random
import time
from collections.abc import Callable, Sequence

from apache_beam.io.tfrecordio import _TFRecordUtil

from beam_prep.io import tfrecord
from benchmarks.report import tables
from benchmarks.results import Recording

Write = Callable[[object, bytes], None]


class _Discard:
    def write(self, data: bytes) -> int:
        return len(data)


def _seconds(write: Write, records: Sequence[bytes]) -> float:
    sink = _Discard()
    start = time.perf_counter()
    for data in records:
        write(sink, data)
    return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--json", help="also write the results here as JSON")
    args = parser.parse_args(argv)
    recording = Recording("framing", argv)
    rng = random.Random(0)
    records = [rng.randbytes(rng.randint(15_000, 25_000)) for _ in range(args.records)]
    writers: dict[str, Write] = {"Beam _TFRecordUtil.write_record": _TFRecordUtil.write_record,
                                 "beam_prep.io.tfrecord.write_record": tfrecord.write_record}
    outputs = []
    for write in writers.values():
        f = io.BytesIO()
        for data in records:
            write(f, data)
        outputs.append(f.getvalue())
    assert outputs[0] == outputs[1], "the two framings differ"
    times: dict[str, list[float]] = {name: [] for name in writers}
    for _ in range(args.repeat):
        for name, write in writers.items():
            times[name].append(_seconds(write, records))
    results = {"records": len(records), "bytes": sum(map(len, records)), "repeat": args.repeat,
               "seconds": times}
    recording.write(args.json, results)
    print(tables.framing(results))

if __name__ == "__main__":
    main()
