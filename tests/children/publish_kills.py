"""Kills a run at each step of its publication in turn, and runs the same command again after each.

    python -m tests.children.publish_kills OUTPUT SAVED [--fail] [--keep] -- ARGS... [--started_with_overwrite]

OUTPUT (local or gs://) holds what the runs start from (nothing, or an old dataset); SAVED is a
folder (local or gs://) of this program's copies of OUTPUT. Each run is the command
``prepare --output OUTPUT ARGS`` (``prepare_images.main``) in a process forked from this one,
which imported it once: a run costs its own work, not Python's and Beam's start-up. Always in
OUTPUT itself, as a run's record names its output folder. Prints one JSON line per run:

* ``{"initial": TREE}``: OUTPUT as given;
* ``{"reference": TREE}``: an uninterrupted run from it;
* ``{"base": TREE}``: a run from it killed as its publication began (its shards all written), which
  every later run starts from (OUTPUT put back as it left it): a run resumed from it publishes at once;
* per step N from 1: ``{"step": N, "killed": bool, "after_kill": TREE, "code": exit code of the run
  again, "stderr": its stderr, "stdout": its stdout, "final": TREE}``, until a run is not killed
  (N is past its last step): then ``killed`` is false and nothing is run again.

With ``--fail``, then, per step N from the first whose kill left a recorded publication:
``{"fail": N, "code": its exit code, "stderr", "after_fail": TREE, "again": exit code of the run
again, "again_stderr", "final": TREE}``, where step N failed (``fail:N``) rather than killed the
run, until a run exits 0; and one ``{"fail_kill": [N, N + 1], "killed": bool, "after_kill": TREE,
"code", "stderr", "final": TREE}`` for the step N in the middle of those that put the old dataset
back, killed while it undid the publication. With ``--keep``, OUTPUT after each kill is copied to
SAVED/kill-N (local folders only).

With ``--started_with_overwrite`` (last), the reference run and the base run are given ``--overwrite``,
and the runs from the base are not: they resume it, as the guide says to.

TREE maps each file under OUTPUT (``.beam-prep`` included) to its sha256 (on gs://, the MD5, CRC32C and
size the server keeps: one listing, not a download of each object); the manifest's
``created`` lines (its own and its versions'), the lines two runs of a command differ in, are left
out of its hash.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile

from apache_beam.io.filesystems import FileSystems

from beam_prep.write.finish import publication
from pipelines import prepare_images

_CREATED = re.compile(rb'\n *"created": "[^"]*",')  # the manifest's, and each version's


def files(folder: str) -> list[str]:
    """The files under ``folder``, at any depth, by their paths relative to it."""
    if "://" not in folder:
        return sorted(os.path.relpath(os.path.join(parent, name), folder)
                      for parent, _, names in os.walk(folder) for name in names)
    prefix = folder.rstrip("/") + "/"
    return sorted(m.path[len(prefix):] for m in FileSystems.match([prefix + "**"])[0].metadata_list)


def tree(folder: str) -> dict[str, str]:
    if "://" in folder:
        return _gcs_tree(folder)
    digests = {}
    for name in files(folder):
        with FileSystems.open(f"{folder.rstrip('/')}/{name}", compression_type="uncompressed") as f:
            data = f.read()
        digests[name] = _digest(name, data)
    return digests


def _digest(name: str, data: bytes) -> str:
    return hashlib.sha256(_CREATED.sub(b"", data) if name == "manifest.json" else data).hexdigest()


def _gcs_tree(folder: str) -> dict[str, str]:
    """A gs:// folder's TREE from one listing: each object's MD5 and CRC32C as the server keeps them
    (the manifest alone read, for its ``created`` lines), rather than a download of every object."""
    from apache_beam.io.gcp.gcsio import GcsIO, parse_gcs_path

    bucket, prefix = parse_gcs_path(folder.rstrip("/") + "/", object_optional=True)
    client = GcsIO().client
    digests = {}
    for blob in client.list_blobs(client.bucket(bucket), prefix=prefix):
        name = blob.name[len(prefix):]
        digests[name] = (_digest(name, blob.download_as_bytes()) if name == "manifest.json"
                         else f"md5:{blob.md5_hash} crc32c:{blob.crc32c} size:{blob.size}")
        assert blob.md5_hash and blob.crc32c, f"the server keeps no checksum of {blob.name}"
    return dict(sorted(digests.items()))


def copy(source: str, target: str) -> None:
    """Makes ``target`` hold exactly what ``source`` holds (local folders: empty ones too)."""
    if "://" not in target:
        shutil.rmtree(target, ignore_errors=True)
        if os.path.isdir(source):
            shutil.copytree(source, target, symlinks=True)
        return
    if files(target):
        FileSystems.delete([target.rstrip("/") + "/"])  # a folder: its objects in one batch
    names = files(source)
    if names:
        FileSystems.copy([f"{source.rstrip('/')}/{name}" for name in names],
                         [f"{target.rstrip('/')}/{name}" for name in names])


def run(output: str, args: list[str], kill_after: int | str | None) -> tuple[int | None, str, str]:
    """The command in a forked process: its exit code (None: SIGKILLed), stdout and stderr."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:
            code = 99
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                if kill_after is not None:
                    os.environ[publication.KILL_VARIABLE] = str(kill_after)
                code = prepare_images.main(["--output", output, *args])
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode("utf-8", "replace"))
        return None if killed else os.waitstatus_to_exitcode(status), texts[0], texts[1]


def say(**fields) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    output, saved = sys.argv[1:3]
    flags = sys.argv[3:sys.argv.index("--")]
    args = sys.argv[sys.argv.index("--") + 1:]
    first = args
    if args[-1] == "--started_with_overwrite":
        args = args[:-1]
        first = [*args, "--overwrite"]
    initial, base = saved.rstrip("/") + "/initial", saved.rstrip("/") + "/base"
    copy(output, initial)
    say(initial=tree(output))
    code, _, stderr = run(output, first, None)
    assert code == 0, stderr
    say(reference=tree(output))
    copy(initial, output)
    code, _, stderr = run(output, first, 0)
    assert code is None, f"not killed as its publication began ({code}): {stderr}"
    say(base=tree(output))
    copy(output, base)
    step, recorded = 1, None
    while True:
        copy(base, output)
        code, stdout, stderr = run(output, args, step)
        if code is not None:
            assert code == 0, stderr
            say(step=step, killed=False, final=tree(output))
            break
        after_kill = tree(output)
        if recorded is None and any(name.endswith(f"/{publication.RECORD}") for name in after_kill):
            recorded = step
        keep(output, saved, "--keep" in flags, f"kill-{step}")
        code, stdout, stderr = run(output, args, None)
        say(step=step, killed=True, after_kill=after_kill, code=code, stdout=stdout, stderr=stderr,
            final=tree(output))
        step += 1
    if "--fail" in flags:
        fail_at_each_step(output, base, args, recorded)


def fail_at_each_step(output: str, base: str, args: list[str], step: int) -> None:
    """The ``--fail`` rows, from step ``step`` on."""
    undone = []
    while True:
        copy(base, output)
        code, _, stderr = run(output, args, f"fail:{step}")
        if code == 0:
            break
        after_fail = tree(output)
        again, _, again_stderr = run(output, args, None)
        say(fail=step, code=code, stderr=stderr, after_fail=after_fail, again=again, again_stderr=again_stderr,
            final=tree(output))
        if "holds its old dataset again" in stderr:
            undone.append(step)
        step += 1
    if not undone:
        return
    middle = undone[len(undone) // 2]
    copy(base, output)
    code, _, stderr = run(output, args, f"fail:{middle},kill:{middle + 1}")
    after_kill = tree(output)
    again, _, again_stderr = run(output, args, None)
    say(fail_kill=[middle, middle + 1], killed=code is None, after_kill=after_kill, code=again, stderr=again_stderr,
        final=tree(output))


def keep(output: str, saved: str, kept: bool, name: str) -> None:
    if kept:
        copy(output, f"{saved.rstrip('/')}/{name}")


if __name__ == "__main__":
    main()
