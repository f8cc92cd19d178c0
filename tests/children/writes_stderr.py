"""Writes one line to stderr, as a Beam worker's traceback would reach the job log."""
import sys

if __name__ == "__main__":
    sys.stderr.write("a worker traceback\n")
