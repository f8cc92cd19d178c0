"""The way to the shard cache's root: which folders it trusts (``beam_prep.reader.cache_path``) and the
root it refuses (``cache_room.open_root``), on real folders of this machine's users."""
from __future__ import annotations

import grp
import os
import pathlib
import pwd
import shutil
import tempfile

import pytest

from beam_prep.errors import StorageError
from beam_prep.reader import cache_path, cache_room

NOBODY = 65534


@pytest.mark.parametrize(("gid", "members", "primary_gids", "private"), [
    (1000, [], [0, 65534], True),  # the user's own group, no one else in it
    (1000, ["alice"], [0], True),  # listing the user themself
    (1000, ["alice", "bob"], [0], False),  # another member
    (1000, [], [0, 1000], False),  # another user's primary group too
    (100, [], [0], False),  # not the user's primary group (``users``)
])
def test_a_group_is_the_users_private_group_only_where_no_one_else_is_in_it(gid, members, primary_gids, private):
    """umask 002 with user private groups (RHEL, Fedora) leaves ``~`` and ``~/.cache`` 0775: group-write by
    the user's own group, which no one else is in, is no one else's write."""
    assert cache_path.is_private_group(gid, "alice", 1000, members, primary_gids) is private


def _private_group_of_this_user() -> int:
    """This user's primary gid, where no one else is in that group (skips, naming why, where it is shared)."""
    user = pwd.getpwuid(os.geteuid())
    if any(m != user.pw_name for m in grp.getgrgid(user.pw_gid).gr_mem) or any(
            e.pw_gid == user.pw_gid and e.pw_uid != user.pw_uid for e in pwd.getpwall()):
        pytest.skip(f"this user's primary group {user.pw_gid} is shared with another user on this machine")
    return user.pw_gid


def test_a_cache_dir_writable_by_the_users_private_group_is_the_root(tmp_path):
    """``~/.cache`` made 0775 under umask 002, in the user's private group: used as it is."""
    gid = _private_group_of_this_user()
    home = tmp_path / "home"
    (home / ".cache").mkdir(parents=True)
    for folder in (home, home / ".cache"):
        os.chown(folder, os.geteuid(), gid)
        folder.chmod(0o775)
    root = cache_room.open_root(str(home / ".cache" / "beam-prep"))
    try:
        assert root.path == str(home / ".cache" / "beam-prep")
    finally:
        root.close()
    top = cache_room.open_root(str(home / ".cache"))
    try:
        assert top.path == str(home / ".cache")
    finally:
        top.close()


def test_a_cache_dir_writable_by_a_group_others_share_is_refused():
    """``nobody``'s primary group is shared (``sync``, ``_apt`` have it here): a 0775 folder in it is refused,
    as another user in that group could replace what it holds."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to make a folder of another uid and run as it")
    others = [e.pw_name for e in pwd.getpwall() if e.pw_gid == NOBODY and e.pw_uid != NOBODY]
    if not others and not grp.getgrgid(NOBODY).gr_mem:
        pytest.skip(f"gid {NOBODY} is nobody's private group on this machine")
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="beam-prep-group-", dir="/tmp"))  # root's tmp_path is 0700
    try:
        shared = scratch / "shared"
        shared.mkdir()
        os.chown(shared, NOBODY, NOBODY)
        shared.chmod(0o775)
        scratch.chmod(0o755)
        said = _as_nobody(lambda: cache_room.open_root(str(shared / "cache")).close())
        assert said == (f"the shard cache's folder {shared / 'cache'} is inside {shared}, which can be written by "
                        "others without the sticky bit (mode 775): another user could replace it; give a private "
                        "cache_dir (BEAM_PREP_CACHE): a folder of yours that no one else can write")
        assert not (shared / "cache").exists()
    finally:
        shutil.rmtree(scratch)


def _as_nobody(action) -> str:
    """``action`` run in a forked child as ``nobody`` (no other groups): its ``StorageError``, else "accepted"."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            try:
                action()
                os.write(write, b"accepted")
            except StorageError as e:
                os.write(write, str(e).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as got:
        said = got.read().decode()
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    return said


def test_the_file_systems_root_is_refused_as_the_cache_root():
    """``cache_dir="/"`` as root would put the cache's lock files and folders among the system's."""
    if os.geteuid() != 0:
        pytest.skip("needs root: for any other user / is root's, and refused as such")
    with pytest.raises(StorageError, match=r"^the shard cache's folder / is the file system's root /, where the "
                                           r"cache's own files would lie among the system's; give a private cache_dir"):
        cache_room.open_root("/")
