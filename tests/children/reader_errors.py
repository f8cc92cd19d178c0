"""``make_dataset`` on each of several paths that hold no dataset; writes the error each raised.

    python -m tests.children.reader_errors OUT.json '{"case": "gs://path", ...}'

Writes ``{"case": [error type, message]}`` (null where no error was raised).
"""
import json
import sys

from beam_prep.reader import make_dataset

if __name__ == "__main__":
    out, paths = sys.argv[1], json.loads(sys.argv[2])
    errors = {}
    for case, path in paths.items():
        try:
            make_dataset(path)
            errors[case] = None
        except Exception as e:
            errors[case] = [type(e).__name__, str(e)]
    with open(out, "w") as f:
        json.dump(errors, f)
