"""A run's claim on its output folder (beam_prep.write.run.claim), between real processes.

Each other run is an ``Agent``: a Python process that claims and releases on
command, so that two runs can race at an agreed instant, and a holder can be
SIGKILLed as a crashed run is. gs:// folders live on the GCS server on
loopback (``tests/gcs_harness/server.py``), whose gateway enforces ``ifGenerationMatch``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import select
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import REPO, child, make_tree

from beam_prep.errors import OptionsError
from beam_prep.write.run.claim import Holder, OutputBusy, _claim_best_effort, claim_output, claim_path, new_run_id

_ANSWER_TIMEOUT_S = 30.0
# Racing agents are told to start at this long from now: both have the command by then.
_RACE_DELAY_S = 0.15


class Agent:
    """Another run, in its own process."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            child("claim_agent"), cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)}, bufsize=0)
        self.pid = self.proc.pid

    def wait_ready(self) -> None:
        assert self.answer() == {"ready": self.pid}

    def send(self, op: str, **fields: Any) -> None:
        self.proc.stdin.write((json.dumps({"op": op, **fields}) + "\n").encode())

    def answer(self) -> dict[str, Any]:
        ready, _, _ = select.select([self.proc.stdout], [], [], _ANSWER_TIMEOUT_S)
        assert ready, f"agent {self.pid} did not answer within {_ANSWER_TIMEOUT_S} s"
        line = self.proc.stdout.readline()
        assert line, f"agent {self.pid} exited with {self.proc.poll()}"
        reply = json.loads(line)
        assert "error" not in reply, reply["error"]
        return reply

    def ask(self, op: str, **fields: Any) -> dict[str, Any]:
        self.send(op, **fields)
        return self.answer()

    def kill(self) -> None:
        """SIGKILL, as a crash or the OOM killer ends a run; reaped, so its pid is gone."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture(scope="module")
def agent_pool() -> Iterator[list[Agent]]:
    """Two agents for the module: each costs seconds to start (it imports Beam)."""
    pool = [Agent(), Agent()]
    for agent in pool:
        agent.wait_ready()
    yield pool
    for agent in pool:
        agent.stop()


@pytest.fixture
def agents(agent_pool: list[Agent]) -> Iterator[list[Agent]]:
    """The pool's two agents, a killed one replaced; whatever they hold is released afterwards."""
    for i, agent in enumerate(agent_pool):
        if agent.proc.poll() is not None:
            agent_pool[i] = Agent()
            agent_pool[i].wait_ready()
    yield agent_pool
    for agent in agent_pool:
        if agent.proc.poll() is None:
            agent.ask("release")


def race(agents: list[Agent], output: str, env: dict[str, str] | None = None,
         holder: Agent | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """Every agent claims ``output`` at the same instant; ``holder`` first releases what it holds."""
    at = time.time() + _RACE_DELAY_S
    for i, agent in enumerate(agents):
        agent.send("claim", output=output, run_id=f"racer-{i}", at=at, env=env or {},
                   release_first=agent is holder, kwargs=kwargs)
    return [agent.answer() for agent in agents]


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# --- local folders --------------------------------------------------------------------

def test_a_second_run_is_refused_while_the_first_holds_the_folder(agents, tmp_path):
    out = str(tmp_path / "out")
    first = agents[0].ask("claim", output=out, run_id="run-a")["won"]
    with pytest.raises(OutputBusy) as busy:
        claim_output(out)
    message = str(busy.value)
    assert f"--output {out} is in use by run run-a (pid {agents[0].pid} on {first['host']})" in message
    assert f"since {first['started']}" in message and "wait for it to end, or stop it" in message
    assert busy.value.holder.run_id == "run-a"

    agents[0].ask("release")
    with claim_output(out) as claim:
        assert claim.taken_over is None  # the first run released: nothing to clean up after it


def test_a_killed_run_is_taken_over_at_once(agents, tmp_path):
    out = str(tmp_path / "out")
    agents[0].ask("claim", output=out, run_id="run-a")
    agents[0].kill()
    with claim_output(out, "run-b") as claim:
        assert claim.taken_over is not None
        assert (claim.taken_over.run_id, claim.taken_over.pid) == ("run-a", agents[0].pid)
        with open(claim_path(out), "rb") as f:
            on_disk = json.loads(f.read())
        assert (on_disk["run_id"], on_disk["pid"]) == ("run-b", os.getpid())


def test_release_removes_the_claim_and_its_empty_folder(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    claim = claim_output(str(out))
    assert json.loads((out / ".beam-prep" / "claim.json").read_text())["run_id"] == claim.run_id
    claim.release()
    assert out.is_dir() and not (out / ".beam-prep").exists()
    claim.release()  # idempotent

    with claim_output(str(out)):
        (out / ".beam-prep" / "listing.jsonl").write_text("{}\n")  # a work file of the run
    assert sorted(p.name for p in (out / ".beam-prep").iterdir()) == ["listing.jsonl"]


def test_release_removes_the_folders_the_claim_made_while_they_are_empty(tmp_path):
    """A run refused after it claimed (a split tree with --validation_percent) leaves nothing."""
    out = tmp_path / "new" / "out"
    claim_output(str(out)).release()
    assert list(tmp_path.iterdir()) == []
    with claim_output(str(out)):
        (out / "manifest.json").write_text("{}")  # what a run wrote stays, and so do its folders
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"]


def test_a_claim_whose_file_was_removed_knows_it_and_spares_the_next_one(tmp_path):
    """As when something deletes the work folder under a live run."""
    out = str(tmp_path / "out")
    first = claim_output(out, "run-a")
    os.unlink(claim_path(out))
    assert first.lost
    with claim_output(out, "run-b") as second:
        first.release()  # must not remove run-b's claim
        with open(claim_path(out), "rb") as f:
            assert json.loads(f.read())["run_id"] == "run-b"
        assert not second.lost


def test_two_runs_racing_for_a_folder_never_both_hold_it(agents, tmp_path):
    """Even rounds: both claim a free folder at once. Odd rounds: the holder releases and
    claims again at the very instant the other claims (the unlink race)."""
    out = str(tmp_path / "out")
    holder = None
    for round_ in range(20):
        if round_ % 2 == 0:
            for agent in agents:
                agent.ask("release")
            holder = None
        replies = race(agents, out, holder=holder)
        winners = [agent for agent, reply in zip(agents, replies) if "won" in reply]
        assert len(winners) == 1, (round_, replies)
        holder = winners[0]
        loser = replies[1 - agents.index(holder)]
        assert f"is in use by run racer-{agents.index(holder)} " in loser["busy"]


def test_claims_and_releases_in_a_tight_loop_never_overlap(tmp_path):
    """Threads stand in for processes here (each claim opens the file anew, and flock is per
    open file), to hit the moment a release unlinks the file that a claim has just opened."""
    out = str(tmp_path / "out")
    guard = threading.Lock()
    state = {"holding": 0, "most": 0, "wins": 0}
    errors: list[BaseException] = []

    def contend() -> None:
        try:
            for _ in range(300):
                try:
                    claim = claim_output(out)
                except OutputBusy:
                    continue
                with guard:
                    state["holding"] += 1
                    state["most"] = max(state["most"], state["holding"])
                    state["wins"] += 1
                time.sleep(0)
                with guard:
                    state["holding"] -= 1
                claim.release()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=contend) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert state["most"] == 1 and state["wins"] > 0


def test_elsewhere_a_claim_is_kept_unless_its_run_is_gone_here(tmp_path):
    """Schemes other than local and gs:// claim by best effort; here a local folder stands in."""
    out = str(tmp_path / "out")
    claim = _claim_best_effort(out, Holder.this_process("run-a"))
    with pytest.raises(OutputBusy, match=f"if it is gone, delete {claim_path(out)}"):
        _claim_best_effort(out, Holder.this_process("run-b"))
    claim.release()
    assert not os.path.exists(claim_path(out))

    gone = dataclasses.replace(Holder.this_process("run-c"), pid=dead_pid())
    os.makedirs(os.path.dirname(claim_path(out)), exist_ok=True)
    with open(claim_path(out), "wb") as f:
        f.write(gone.to_json())
    assert _claim_best_effort(out, Holder.this_process("run-d")).taken_over == gone


def test_run_ids_sort_by_time_and_differ():
    ids = [new_run_id() for _ in range(100)]
    assert len(set(ids)) == 100
    assert all(re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{8}", i) for i in ids)
    assert ids[0][:16] <= ids[-1][:16] <= time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


# --- gs:// folders ----------------------------------------------------------------------

def test_gcs_a_second_run_is_refused_until_the_first_releases(agents, gcs_server, gcs_bucket):
    out = gcs_bucket.url("out")
    first = agents[0].ask("claim", output=out, run_id="run-a", env=gcs_server.env())["won"]
    assert gcs_bucket.exists("out/.beam-prep/claim.json")
    with pytest.raises(OutputBusy) as busy:
        claim_output(out)
    message = str(busy.value)
    assert f"--output {out} is in use by run run-a (pid {agents[0].pid} on {first['host']})" in message
    assert f"since {first['started']}, last seen " in message and "wait for it to end, or stop it" in message

    assert agents[0].ask("release") == {"released": [False]}
    assert not gcs_bucket.exists("out/.beam-prep/claim.json")
    with claim_output(out) as claim:
        assert claim.taken_over is None
    assert not gcs_bucket.exists("out/.beam-prep/claim.json")


def test_gcs_a_killed_run_on_this_machine_is_taken_over_at_once(agents, gcs_server, gcs_bucket):
    out = gcs_bucket.url("out")
    agents[0].ask("claim", output=out, run_id="run-a", env=gcs_server.env())
    agents[0].kill()
    with claim_output(out, "run-b") as claim:  # the default stale_after_s: minutes
        assert claim.taken_over is not None and claim.taken_over.run_id == "run-a"
        assert json.loads(gcs_bucket.read_bytes("out/.beam-prep/claim.json"))["run_id"] == "run-b"


def test_gcs_a_claim_not_renewed_is_taken_over_and_its_holder_learns_it(agents, gcs_server, gcs_bucket):
    out = gcs_bucket.url("out")
    agents[0].ask("claim", output=out, run_id="run-a", env=gcs_server.env(), kwargs={"heartbeat_s": None})
    time.sleep(0.3)
    with claim_output(out, "run-b", stale_after_s=0.2, heartbeat_s=None) as claim:
        assert claim.taken_over is not None and claim.taken_over.run_id == "run-a"
        assert agents[0].ask("release") == {"released": [True]}  # lost, so it deleted nothing
        assert json.loads(gcs_bucket.read_bytes("out/.beam-prep/claim.json"))["run_id"] == "run-b"


def test_gcs_a_renewed_claim_is_not_taken_over(agents, gcs_server, gcs_bucket):
    """A claim older than the contender's stale_after_s, renewed every 0.1 s: that limit is 20
    heartbeats, so that a loaded machine's late heartbeat does not make the claim look stale."""
    out = gcs_bucket.url("out")
    agents[0].ask("claim", output=out, run_id="run-a", env=gcs_server.env(),
                  kwargs={"heartbeat_s": 0.1, "stale_after_s": 5.0})
    time.sleep(2.5)
    with pytest.raises(OutputBusy, match="in use by run run-a "):
        claim_output(out, stale_after_s=2.0, heartbeat_s=None)


def test_gcs_the_heartbeat_renews_the_claim(gcs_server, gcs_bucket):
    from beam_prep.io.gcs import GcsClient

    out = gcs_bucket.url("out")
    path = claim_path(out)
    client = GcsClient()
    with claim_output(out, heartbeat_s=0.05) as claim:
        first = client.stat(path).generation
        deadline = time.monotonic() + 5
        while client.stat(path).generation == first and time.monotonic() < deadline:
            time.sleep(0.02)
        renewed = json.loads(gcs_bucket.read_bytes("out/.beam-prep/claim.json"))
        assert client.stat(path).generation > first
        assert renewed["run_id"] == claim.run_id and renewed["heartbeat"] is not None
        assert not claim.lost
    assert not gcs_bucket.exists("out/.beam-prep/claim.json")


def test_gcs_a_holder_whose_claim_is_taken_over_learns_it_at_its_next_renewal(agents, gcs_server,
                                                                              gcs_bucket):
    out = gcs_bucket.url("out")
    claim = claim_output(out, "run-a", heartbeat_s=0.2)
    for _ in range(20):  # run-b judges a claim stale after 0.05 s: most instants between renewals
        reply = agents[0].ask("claim", output=out, run_id="run-b", env=gcs_server.env(),
                              kwargs={"stale_after_s": 0.05, "heartbeat_s": None})
        if "won" in reply:
            break
    assert reply["taken_over"]["run_id"] == "run-a"
    deadline = time.monotonic() + 5
    while not claim.lost and time.monotonic() < deadline:
        time.sleep(0.02)
    assert claim.lost
    claim.release()
    assert json.loads(gcs_bucket.read_bytes("out/.beam-prep/claim.json"))["run_id"] == "run-b"


def test_gcs_only_one_run_wins_a_takeover_race(agents, gcs_server, gcs_bucket):
    """Two runs find the same stale claim (its run gone) and take it over at the same instant."""
    out = gcs_bucket.url("out")
    for round_ in range(8):
        gone = dataclasses.replace(Holder.this_process(f"gone-{round_}"), pid=dead_pid())
        gcs_bucket.write_bytes("out/.beam-prep/claim.json", gone.to_json())
        replies = race(agents, out, env=gcs_server.env())
        winners = [i for i, reply in enumerate(replies) if "won" in reply]
        assert len(winners) == 1, (round_, replies)
        # The winner took the stale claim over, or came after the loser had deleted it and
        # found the folder free: either way, one run holds it.
        taken = replies[winners[0]]["taken_over"]
        assert taken is None or taken["run_id"] == f"gone-{round_}", replies
        assert f"is in use by run racer-{winners[0]} " in replies[1 - winners[0]]["busy"]
        for agent in agents:
            agent.ask("release")
        assert not gcs_bucket.exists("out/.beam-prep/claim.json")



@pytest.mark.slow  # on main the run went on, into a pipeline
def test_a_work_folder_that_is_a_link_is_refused_before_anything_is_written_through_it(tmp_path, capsys):
    """``<output>/.beam-prep`` linked to a folder elsewhere: its entries were taken for unfinished
    runs, and ``--overwrite`` removed them (a folder of the link's target, with its files); the claim
    was written there too. Refused in one line, exit 2 from the command, nothing touched."""
    from pipelines import prepare_images

    victim = tmp_path / "victim"
    (victim / "precious").mkdir(parents=True)
    (victim / "precious" / "thesis.tex").write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / ".beam-prep").symlink_to(victim, target_is_directory=True)
    make_tree(tmp_path / "in", {"ant": 2, "bee": 2}, size=(8, 8))
    argv = ["--input", str(tmp_path / "in"), "--output", str(out), "--image_size", "8", "--overwrite"]
    assert prepare_images.main(argv) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: --output {out} holds .beam-prep as a link to {victim}: beam-prep keeps each run's files in a "
        "folder of its own there, and removes them; remove the link")
    assert sorted(str(p.relative_to(victim)) for p in victim.rglob("*")) == ["precious", "precious/thesis.tex"]
    with pytest.raises(OptionsError):
        claim_output(str(out))
