"""Holds ``--output OUT`` as another run would: claims it, prints ``held``, releases at end of stdin."""
import sys

from beam_prep.write.run.claim import claim_output

if __name__ == "__main__":
    with claim_output(sys.argv[1], "run-elsewhere"):
        print("held", flush=True)
        sys.stdin.read()
