"""Another run racing for an output folder, driven by JSON lines on stdin (one reply per line).

Commands: ``{"op": "claim", "output": ..., "run_id": ..., "kwargs": {...}, "env": {...},
"release_first": bool, "at": epoch_s}`` and ``{"op": "release"}``. It prints
``{"ready": pid}`` first; a command that raises answers ``{"error": repr}``.
"""
import dataclasses
import json
import os
import sys
import time

from beam_prep.write.run.claim import OutputBusy, claim_output

claims = []


def answer(command):
    if command["op"] == "claim":
        os.environ.update(command.get("env", {}))
        if command.get("release_first"):
            for claim in claims:
                claim.release()
            claims.clear()
        while time.time() < command.get("at", 0):
            pass  # spin, so that racing agents start within microseconds of each other
        try:
            claim = claim_output(command["output"], command.get("run_id"), **command.get("kwargs", {}))
        except OutputBusy as e:
            return {"busy": str(e)}
        claims.append(claim)
        taken = claim.taken_over
        return {"won": dataclasses.asdict(claim.holder),
                "taken_over": dataclasses.asdict(taken) if taken else None}
    if command["op"] == "release":
        for claim in claims:
            claim.release()
        lost = [claim.lost for claim in claims]
        claims.clear()
        return {"released": lost}
    raise ValueError(command)


def main() -> None:
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        try:
            reply = answer(json.loads(line))
        except Exception as e:
            reply = {"error": repr(e)}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
