"""A manifest is data: one naming a shard beam-prep never writes is refused by every reader, ``verify``,
``inspect`` and the gs:// shard cache, with one line naming the manifest, the field and the value, before
anything is read or written. Names outside the folder (``../../victim/evil.txt``, an absolute path, a
fullwidth or NUL variant): no file appears at the victim's path and the cache folder gains nothing. Names
for a shell (``;``, ``|``, ``$(...)``, backquotes, ``&``, spaces, ``${IFS}``), fullwidth letters, the
manifest's own name in another case, a shard named twice: refused as well, and no command runs (nothing
named ``PWNED`` appears). ``shard_urls(pipe=...)`` quotes what it puts in a ``pipe:`` command: a folder's
unusual but legal name reaches the command as one word.

On local disk and served by the GCS test server (tests/gcs_harness), where the objects the hostile
names point at exist, so that a reader that followed them would find bytes to write out.
"""
from __future__ import annotations

import json
import pathlib
import sys

import pytest
from helpers import REPO

import beam_prep
from beam_prep.errors import OptionsError, UnsafeName
from beam_prep.model.dataset import DatasetInfo, ImageInfo, SplitInfo
from pipelines import inspect_output, verify_output

pytestmark = pytest.mark.slow  # make_dataset and verify start TensorFlow; the gs:// cases the GCS test server

GOOD = "train-00000-of-00002"
_CHARS = "(beam-prep writes names of ASCII letters, digits, '.', '_' and '-' only)"
# name(victim) -> the hostile shard name, and the reason the refusal gives. The dataset lies at
# BASE/a/ds and the cache at BASE/a/cache, so ../../victim is BASE/victim from both.
HOSTILE = {
    "parent": (lambda victim: "../../victim/evil.txt", "climbs out of the folder with '..'"),
    "absolute": (lambda victim: str(victim), "is an absolute path"),
    "fullwidth": (lambda victim: "\uff0e\uff0e\uff0f\uff0e\uff0e\uff0fvictim\uff0fevil.txt",
                  "climbs out of the folder with '..'"),
    "nul": (lambda victim: "evil\x00/../../victim/evil.txt", "holds a control character (NUL, a line break...)"),
}
# Names inside the folder, each a word for a shell or a lookalike (the first finding: the first ran
# its command through the pipe: recipe), and names of a file already named. Each would write PWNED were it run.
SHELL = {
    "semicolon": ("train-00000.tar;touch${IFS}PWNED;#", f"holds ';' {_CHARS}"),
    "pipe": ("train-00000.tar|touch PWNED", f"holds '|' {_CHARS}"),
    "subshell": ("train-$(touch PWNED).tar", f"holds '$' {_CHARS}"),
    "backquote": ("train-`touch PWNED`.tar", f"holds '`' {_CHARS}"),
    "ampersand": ("train.tar&touch PWNED&", f"holds '&' {_CHARS}"),
    "space": ("train-00000.tar -o PWNED", f"holds ' ' {_CHARS}"),
    "ifs": ("x${IFS}-oPWNED", f"holds '$' {_CHARS}"),
    "fullwidth_letters": ("\uff54\uff52\uff41\uff49\uff4e.tar", f"holds '\uff54' {_CHARS}"),
    "option": ("-oPWNED", "starts with '-' (beam-prep's names start with a letter, a digit or '_': '.' makes a "
                          "hidden file, '-' an option to a command)"),
    "manifest_case": ("Manifest.json", "names the same file as the manifest ('manifest.json') where case is not "
                                       "told apart (macOS, Windows)"),
}
HOSTILE.update({kind: (lambda victim, name=name: name, why) for kind, (name, why) in SHELL.items()})
SUFFIX = {"tfrecord": ".tfrecord.gz", "array_record": ".array_record", "webdataset": ".tar"}


def _manifest(file_format: str, hostile: str) -> dict:
    """A dataset's manifest (the writer's own model) whose train split lists a good shard, then ``hostile``."""
    good = GOOD + SUFFIX[file_format]
    info = DatasetInfo(root="", labels=("ant", "bee"), image=ImageInfo(8, 8), file_format=file_format,
                       compression="GZIP" if file_format == "tfrecord" else "NONE",
                       splits={"train": SplitInfo("train", (good, "placeholder"), 2, (1, 1), {"ant": 1, "bee": 1})})
    manifest = info.to_json()
    manifest["splits"]["train"]["shards"] = [good, hostile]
    return manifest


def _refusal(manifest_path: str, hostile: str, why: str) -> str:
    return (f"{manifest_path}: splits.train.shards[1] is {hostile!r}, which {why}: a dataset names only files "
            "in its own folder, by their plain names")


def _hostile(kind: str, base: pathlib.Path) -> tuple[pathlib.Path, str, str]:
    """``(victim, name, why)``: the victim path (absent) and the hostile name of kind ``kind`` pointing at it."""
    victim = base / "victim" / "evil.txt"
    make, why = HOSTILE[kind]
    return victim, make(victim), why


def _can_be_a_file(name: str) -> bool:
    return "/" not in name and "\x00" not in name and name not in ("", ".", "..")


def _local(base: pathlib.Path, file_format: str, name: str) -> pathlib.Path:
    """The hostile manifest, beside files at the names it gives where a folder can hold them."""
    folder = base / "a" / "ds"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(_manifest(file_format, name)))
    for shard in (GOOD + SUFFIX[file_format], name):
        if _can_be_a_file(shard) and shard.lower() != "manifest.json":
            (folder / shard).write_bytes(b"bytes a follower would read")
    return folder


def _nothing_ran(base: pathlib.Path) -> bool:
    """No command of a hostile name ran: nothing named PWNED, under the test's folder or the working one."""
    return not list(base.rglob("PWNED*")) and not list(pathlib.Path.cwd().glob("PWNED*"))


def _serve(bucket, file_format: str, name: str) -> str:
    """The hostile manifest on the GCS test server, with objects at the names it gives where the server
    takes such a name (as a bucket someone else controls would hold them: a reader that followed them would
    find bytes to write out; the emulator drops the connection on a name with a ``..`` part)."""
    bucket.write_bytes("ds/manifest.json", json.dumps(_manifest(file_format, name)).encode())
    for shard in (GOOD + SUFFIX[file_format], name):
        if "\x00" not in shard and ".." not in shard.split("/") and shard != "manifest.json":
            bucket.write_bytes(f"ds/{shard}", b"bytes a follower would write out")
    return bucket.url("ds")


# Each reader, the format it reads, and how it is called on a dataset folder.
READERS = {
    "make_dataset": ("tfrecord", lambda path, cache: beam_prep.make_dataset(path, "train", batch_size=1)),
    "load_info": ("tfrecord", lambda path, cache: beam_prep.load_info(path)),
    "data_source": ("array_record", lambda path, cache: beam_prep.data_source(path, "train", cache_dir=cache)),
    "shard_urls": ("webdataset", lambda path, cache: beam_prep.shard_urls(path, "train", cache_dir=cache)),
    "shard_urls_uncached": ("webdataset", lambda path, cache: beam_prep.shard_urls(path, "train", cache_dir=False)),
    "shard_urls_piped": ("webdataset", lambda path, cache: beam_prep.shard_urls(path, "train", cache_dir=False,
                                                                               pipe="cat")),
    "webdataset_pipeline": ("webdataset",
                            lambda path, cache: beam_prep.webdataset_pipeline(path, "train", cache_dir=cache)),
    "dali_reader": ("tfrecord", lambda path, cache: beam_prep.dali_reader(path, "train")),  # before DALI starts
}
GCS_READERS = ["load_info", "data_source", "shard_urls", "shard_urls_uncached", "shard_urls_piped",
               "webdataset_pipeline"]


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_refuses_a_local_manifest_naming_a_shard_beam_prep_never_writes(tmp_path, monkeypatch, kind,
                                                                                      reader):
    monkeypatch.chdir(tmp_path)
    victim, name, why = _hostile(kind, tmp_path)
    file_format, read = READERS[reader]
    folder = _local(tmp_path, file_format, name)
    victim.parent.mkdir()
    victim.write_bytes(b"not a shard")  # there to be read, were the name followed
    cache = tmp_path / "a" / "cache"
    with pytest.raises(UnsafeName) as caught:
        read(str(folder), str(cache))
    assert str(caught.value) == _refusal(str(folder / "manifest.json"), name, why)
    assert not cache.exists() and _nothing_ran(tmp_path)


@pytest.mark.parametrize("field", ["shards", "dali_index"])
@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_refuses_a_manifest_naming_a_file_twice(tmp_path, field, reader):
    """A shard named twice in a split (the cache would fill it twice at once), an index named twice."""
    file_format, read = READERS[reader]
    manifest = _manifest(file_format, GOOD + SUFFIX[file_format])  # the good shard, then again
    if field == "dali_index":
        manifest["splits"]["train"]["shards"][1] = "train-00001-of-00002" + SUFFIX[file_format]
        manifest["splits"]["train"]["dali_index"] = ["dali-a.idx", "dali-a.idx"]
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    named = manifest["splits"]["train"][field][1]
    with pytest.raises(UnsafeName) as caught:
        read(str(folder), str(tmp_path / "cache"))
    assert str(caught.value) == (f"{folder / 'manifest.json'}: splits.train.{field}[1] is {named!r}, which names "
                                 f"the same file as splits.train.{field}[0]: a dataset names only files in its own "
                                 "folder, by their plain names")
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_inspect_and_verify_exit_2_on_a_local_manifest_naming_a_shard_beam_prep_never_writes(
        tmp_path, monkeypatch, kind, command, capsys):
    monkeypatch.chdir(tmp_path)
    victim, name, why = _hostile(kind, tmp_path)
    folder = _local(tmp_path, "tfrecord", name)
    main = inspect_output.main if command == "inspect" else verify_output.main
    assert main([str(folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "error: " + _refusal(str(folder / "manifest.json"), name, why)
    assert not victim.parent.exists() and _nothing_ran(tmp_path)


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("reader", GCS_READERS)
def test_the_shard_cache_and_every_reader_refuse_a_gs_manifest_naming_a_shard_beam_prep_never_writes(
        gcs_server, gcs_bucket, tmp_path, monkeypatch, kind, reader):
    monkeypatch.chdir(tmp_path)
    victim, name, why = _hostile(kind, tmp_path)
    file_format, read = READERS[reader]
    url = _serve(gcs_bucket, file_format, name)
    cache = tmp_path / "a" / "cache"
    cache.mkdir(parents=True)
    (cache / "mine.txt").write_text("a user's own file")
    victim.parent.mkdir()  # there to be written into, were the name followed
    with pytest.raises(UnsafeName) as caught:
        read(url, str(cache))
    assert str(caught.value) == _refusal(f"{url}/manifest.json", name, why)
    assert list(victim.parent.iterdir()) == []  # no shard, no stamp, no partial file
    assert [p.name for p in cache.iterdir()] == ["mine.txt"]  # the cache made nothing, wrote nothing
    assert _nothing_ran(tmp_path)


# Runs ``beam-prep inspect`` and ``beam-prep verify`` (their ``main``) on each URL in one process, as the
# commands would each in theirs: one import of TensorFlow for them all. Prints [exit code, stderr] per run.
_COMMANDS_ON_EACH = """
import contextlib, io, json, sys
from pipelines import inspect_output, verify_output
for url in sys.argv[1:]:
    for command in (inspect_output, verify_output):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = command.main([url])
        print(json.dumps([code, err.getvalue()]), flush=True)
"""


def test_inspect_and_verify_exit_2_on_a_gs_manifest_naming_a_shard_beam_prep_never_writes(gcs_server, tmp_path):
    kinds = ["parent", "absolute", "semicolon", "manifest_case"]
    hostile = {kind: _hostile(kind, tmp_path / kind) for kind in kinds}
    urls = {kind: _serve(gcs_server.new_bucket(), "tfrecord", hostile[kind][1]) for kind in kinds}
    for victim, _, _ in hostile.values():
        victim.parent.mkdir(parents=True)
    done = gcs_server.run([sys.executable, "-c", _COMMANDS_ON_EACH, *urls.values()], cwd=REPO)
    runs = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(runs) == 2 * len(kinds), done.stdout
    for (kind, url), (inspected, verified) in zip(urls.items(), zip(runs[::2], runs[1::2]), strict=True):
        _, name, why = hostile[kind]
        for code, stderr in (inspected, verified):
            assert code == 2, stderr[-3000:]
            assert stderr.strip().splitlines()[-1] == "error: " + _refusal(f"{url}/manifest.json", name, why)
    assert all(list(victim.parent.iterdir()) == [] for victim, _, _ in hostile.values())
    assert not list(REPO.glob("PWNED*"))


def test_a_manifest_of_plain_names_reads(tmp_path):
    """The check refuses names, not datasets: the same manifest with plain names passes."""
    folder = _local(tmp_path, "webdataset", "train-00001-of-00002.tar")
    assert beam_prep.shard_urls(folder, "train", cache_dir=False) == [str(folder / f"{GOOD}.tar"),
                                                                      str(folder / "train-00001-of-00002.tar")]


_HIDDEN = ("starts with '.' (beam-prep's names start with a letter, a digit or '_': '.' makes a hidden file, '-' "
           "an option to a command)")


@pytest.mark.parametrize(("name", "why"), [
    *((name, _HIDDEN) for name in (".beam-prep-cache.json", ".use.lock", ".Use.Lock", ".fill.lock", ".reserved",
                                   ".last_used", ".stamps", ".evict.lock")),
    ("manifest.json", "names the same file as the manifest"),
    ("MANIFEST.JSON", "names the same file as the manifest ('manifest.json') where case is not told apart "
                      "(macOS, Windows)"),
])
def test_the_shard_cache_refuses_a_shard_named_as_one_of_its_own_files(gcs_server, gcs_bucket, tmp_path, name, why):
    """A shard named as the cache's marker or one of its locks would be written over it: a folder whose
    marker is the shard's bytes is no longer the cache's (never evicted, never counted), one whose
    ``use`` lock is replaced is evicted under its readers; in another case, so on a case-insensitive file
    system. Beam-prep writes no name starting with '.', and the manifest is named once: refused before
    anything is fetched."""
    url = _serve(gcs_bucket, "array_record", name)
    cache = tmp_path / "cache"
    with pytest.raises(UnsafeName) as caught:
        beam_prep.data_source(url, "train", cache_dir=str(cache))
    assert str(caught.value) == _refusal(f"{url}/manifest.json", name, why)
    assert not cache.exists() or list(cache.iterdir()) in ([], [cache / ".evict.lock"])


# A folder's or a prefix's name is the user's, and may be anything its file system or bucket takes: a pipe:
# URL quotes it, so that the command gets it as one word and the shell runs none of it.
UNUSUAL = "we ird $(touch PWNED) `touch PWNED`; 'q' \"d\" &|*"


def _webdataset_shards(file_format: str = "webdataset") -> dict[str, bytes]:
    return {f"train-0000{i}-of-00002{SUFFIX[file_format]}": f"shard {i}'s bytes".encode() for i in range(2)}


def _plain_manifest(shards: dict[str, bytes]) -> str:
    manifest = _manifest("webdataset", "placeholder")
    manifest["splits"]["train"]["shards"] = list(shards)
    return json.dumps(manifest)


def test_pipe_urls_give_a_local_folders_unusual_name_to_the_command_as_one_word(tmp_path, monkeypatch):
    gopen = pytest.importorskip("webdataset.gopen", reason="webdataset is not installed").gopen
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / UNUSUAL / "ds"
    folder.mkdir(parents=True)
    shards = _webdataset_shards()
    (folder / "manifest.json").write_text(_plain_manifest(shards))
    for name, data in shards.items():
        (folder / name).write_bytes(data)
    urls = beam_prep.shard_urls(folder, "train", pipe="cat")
    assert [url.startswith("pipe:cat '") for url in urls] == [True, True]
    for url, data in zip(urls, shards.values()):
        with gopen(url) as f:  # WebDataset's own opener: the URL through a shell
            assert f.read() == data
    assert _nothing_ran(tmp_path)


def test_pipe_urls_give_a_gs_prefixs_unusual_name_to_the_command_as_one_word(gcs_server, gcs_bucket, tmp_path,
                                                                             monkeypatch):
    """``cache_dir=False``: the gs:// URLs, whose prefix is anything a bucket takes, each one word to the
    command (here printf, which writes it back as it got it)."""
    gopen = pytest.importorskip("webdataset.gopen", reason="webdataset is not installed").gopen
    monkeypatch.chdir(tmp_path)
    shards = _webdataset_shards()
    gcs_bucket.write_bytes(f"{UNUSUAL}/ds/manifest.json", _plain_manifest(shards).encode())
    for name, data in shards.items():
        gcs_bucket.write_bytes(f"{UNUSUAL}/ds/{name}", data)
    url = gcs_bucket.url(f"{UNUSUAL}/ds")
    urls = beam_prep.shard_urls(url, "train", cache_dir=False, pipe="printf %s")
    for piped, name in zip(urls, shards):
        with gopen(piped) as f:
            assert f.read().decode() == f"{url}/{name}"
    assert _nothing_ran(tmp_path)


@pytest.mark.parametrize("pipe", ["", "  ", 3])
def test_a_pipe_that_is_no_command_is_refused(tmp_path, pipe):
    with pytest.raises(OptionsError, match=r"^pipe is a command that writes a file to its output"):
        beam_prep.shard_urls(tmp_path, "train", pipe=pipe)
