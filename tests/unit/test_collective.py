"""The guarded group (clients.collective) over real gloo groups of local processes: a
peer that hangs inside a collective (its connections open, as a cut-off or stopped
host's are) ends the survivors' pending call within a second of the verdict on it, and
every later call refuses; the survivors, the same processes, form the next generation
with its replacement; a peer that is only slow ends nothing. The verdict is what the
test writes where each rank's look reads it (the controller's, in production). No Ray."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import time
from pathlib import Path

import pytest

from clients.members import ENDING, lost_members


@pytest.fixture
def gloo():
    """torch's gloo (the full test environment's; the dev extra's has no torch)."""
    return pytest.importorskip("torch")


NODES = ["node-a", "node-b", "node-c"]


def test_lost_members_are_the_ones_a_verdict_or_a_move_names():
    assert lost_members(NODES, 0, {"node-b": "alive", "node-c": "silent"}, NODES) == {}
    got = lost_members(NODES, 0, {"node-c": "suspected"}, NODES)
    assert got == {2: "its node node-c is suspected"}
    assert lost_members(NODES, 2, {"node-c": "moved"}, NODES) == {}  # its own: not a peer
    moved = lost_members(NODES, 0, {}, ["node-a", "node-d", "node-c"])
    assert moved == {1: "its slot moved from node node-b to node-d"}
    gone = lost_members(NODES, 1, {}, None)
    assert sorted(gone) == [0, 2] and "released or replaced" in gone[0]
    assert set(ENDING) == {"suspected", "moved", "dead"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, verdict: str, out: str, plan: str, size: int = 3) -> None:
    """One rank: form, then what ``plan`` says; each result a JSON line in ``out``."""
    import torch

    from clients.collective import GuardedGroup, PeerLost

    def look(members, own):
        said = json.loads(Path(verdict).read_text() or "{}")
        return lost_members(members, own, said, members)

    def say(**fields) -> None:
        with open(out, "a") as f:
            f.write(json.dumps({"rank": rank, "pid": os.getpid(), **fields}) + "\n")

    def form():
        members = NODES if size == 3 else [f"node-{i}" for i in range(size)]
        return GuardedGroup.form_at("127.0.0.1", port, rank, members, 1, look, "t", 60)

    group = form()
    say(event="formed", generation=group.generation)
    if plan == "hang":  # in the collective's place, silent, its connections open
        time.sleep(600)
    if plan == "slow":
        time.sleep(2.0)
    t = torch.ones(4) * (rank + 1)
    try:
        group.all_reduce(t)
        say(event="reduced", value=t[0].item())
    except PeerLost as e:
        say(event="lost", at=time.time(), ranks=e.ranks, message=str(e))
        try:
            group.all_reduce(torch.ones(1))
        except PeerLost:
            say(event="refused")
        if plan == "survive":
            group = form()  # the next generation: a new round at the same epoch
            t = torch.ones(4) * (rank + 1)
            group.all_reduce(t)
            say(event="reduced", value=t[0].item(), generation=group.generation)


def _start(ctx, rank, port, verdict, out, plan, size=3):
    args = (rank, port, str(verdict), str(out), plan, size)
    p = ctx.Process(target=_rank, args=args, daemon=True)
    p.start()
    return p


def _lines(out: Path) -> list[dict]:
    return [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []


def _until(out: Path, test, timeout: float = 60.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = _lines(out)
        if test(got):
            return got
        time.sleep(0.02)
    raise AssertionError(f"not seen within {timeout:g}s: {_lines(out)}")


def test_a_hung_peer_ends_the_survivors_call_at_its_verdict_and_they_reform_with_its_replacement(
    tmp_path, gloo
):
    ctx = multiprocessing.get_context("spawn")
    port, verdict, out = _free_port(), tmp_path / "verdict.json", tmp_path / "out.jsonl"
    verdict.write_text("{}")
    procs = [
        _start(ctx, r, port, verdict, out, p) for r, p in enumerate(("survive",) * 2 + ("hang",))
    ]
    try:
        _until(out, lambda got: len([x for x in got if x["event"] == "formed"]) == 3)
        time.sleep(1.5)  # the survivors wait in their all-reduce, the peer silent
        assert not [x for x in _lines(out) if x["event"] != "formed"]
        verdict.write_text(json.dumps({"node-c": "suspected"}))
        said = time.time()
        got = _until(out, lambda g: len([x for x in g if x["event"] == "refused"]) == 2)
        lost = [x for x in got if x["event"] == "lost"]
        assert sorted(x["rank"] for x in lost) == [0, 1]
        # Each survivor hears it from its own look, or (a loaded machine, its look a
        # moment late) from the other's word in the store: the same rank, the same why.
        for x in lost:
            assert list(x["ranks"]) == ["2"], x
            assert x["ranks"]["2"] in (
                "its node node-c is suspected",
                *(f"its node node-c is suspected, said by rank {r}" for r in (0, 1)),
            ), x
        assert all(x["at"] - said < 1.0 for x in lost), [x["at"] - said for x in lost]
        assert "generation 1.0" in lost[0]["message"]
        # The replacement (a new process for rank 2) forms the next generation with
        # the survivors, who kept their processes.
        procs[2].kill()
        verdict.write_text("{}")
        procs.append(_start(ctx, 2, port, verdict, out, "replace"))
        got = _until(out, lambda g: len([x for x in g if x["event"] == "reduced"]) == 3)
        reduced = [x for x in got if x["event"] == "reduced"]
        assert {x["value"] for x in reduced} == {6.0}
        survivors = {x["rank"]: x["pid"] for x in got if x["event"] == "formed" and x["rank"] < 2}
        assert {x["rank"]: x["pid"] for x in reduced if x["rank"] < 2} == survivors
        assert {x.get("generation") for x in reduced if x["rank"] < 2} == {"1.1"}
    finally:
        for p in procs:
            p.kill()


def test_a_killed_peer_ends_every_survivor_whether_or_not_it_waited_on_that_peer(tmp_path, gloo):
    """No verdict at all: a peer's process is killed inside the collective. The ranks
    whose connections to it close fail in gloo and say so in the generation's store;
    the others, waiting on a survivor rather than on the dead peer, hear it there."""
    ctx = multiprocessing.get_context("spawn")
    port, verdict, out = _free_port(), tmp_path / "verdict.json", tmp_path / "out.jsonl"
    verdict.write_text("{}")
    # Eight ranks, as the benchmark's: with four, every survivor's own connections
    # failed, and the test passed without the store's word.
    plans = ("",) * 5 + ("hang", "", "")
    procs = [_start(ctx, r, port, verdict, out, p, size=8) for r, p in enumerate(plans)]
    try:
        _until(out, lambda got: len([x for x in got if x["event"] == "formed"]) == 8)
        time.sleep(1.0)  # seven wait in their all-reduce, the sixth silent
        procs[5].kill()
        killed = time.time()
        got = _until(out, lambda g: len([x for x in g if x["event"] == "lost"]) == 7, 30)
        lost = [x for x in got if x["event"] == "lost"]
        assert all(x["at"] - killed < 2.0 for x in lost), [x["at"] - killed for x in lost]
        assert not [x for x in got if x["event"] == "reduced"]
    finally:
        for p in procs:
            p.kill()


def test_a_slow_peer_is_waited_for_and_ends_nothing(tmp_path, gloo):
    ctx = multiprocessing.get_context("spawn")
    port, verdict, out = _free_port(), tmp_path / "verdict.json", tmp_path / "out.jsonl"
    verdict.write_text("{}")
    procs = [_start(ctx, r, port, verdict, out, p) for r, p in enumerate(("", "", "slow"))]
    try:
        got = _until(out, lambda g: len([x for x in g if x["event"] == "reduced"]) == 3)
        assert {x["value"] for x in got if x["event"] == "reduced"} == {6.0}
        assert not [x for x in got if x["event"] in ("lost", "refused")]
    finally:
        for p in procs:
            p.kill()


class _Spec:
    def __init__(self, short: bool) -> None:
        self.short = short

    def component(self, name):
        return type("C", (), {"runs_short": self.short})()


class _Record:
    def __init__(self, short: bool) -> None:
        self.world_sizes, self.spec, self.state = {"rollout": 4}, _Spec(short), "ready"


def test_a_group_over_a_component_that_runs_short_is_refused(monkeypatch):
    from clients import session
    from clients.collective import GuardedGroup
    from controller.errors import PlacementError

    monkeypatch.delenv("PLACECTL_JOB", raising=False)
    with pytest.raises(PlacementError, match="not a placectl worker: PLACECTL_JOB"):
        GuardedGroup.form()
    monkeypatch.setenv("PLACECTL_JOB", "j")
    monkeypatch.setenv("PLACECTL_COMPONENT", "rollout")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(session, "Controller", lambda *a: type("C", (), {
        "record": staticmethod(lambda job: _Record(short=True))})())  # fmt: skip
    with pytest.raises(PlacementError, match=r"j/rollout runs short \(on_loss: continue\)"):
        GuardedGroup.form()
