"""A real vLLM engine as a rollout rank on a reservation, checked against transformers and
the OS: it generates what transformers generates from the same weights; a trainer rank's
push changes its greedy tokens exactly as the pushed tensors dictate; its processes carry
what placectl set; killed with SIGKILL it leaves no process behind and repair() brings it
back in its slot, generating again; shutdown() leaves nothing either."""

from __future__ import annotations

import os
import signal
import time

import pytest

import clients
from clients.testing import tiny_model
from clients.testing.vllm_ranks import Engine, Trainer, alive

CONFIG = {
    "num_nodes": 2,
    "component_placement": {"actor": "0", "rollout": {"placement": "1", "engine": "vllm"}},
}
# vLLM's CPU build repacks its linear layers when it loads them, so load_weights reaches
# the embeddings and norms only there (the GPU build takes every tensor).
PUSHED = ["model.embed_tokens.weight"]


def environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e]
    return {k.decode(): v.decode(errors="replace") for k, v in pairs}


@pytest.fixture(scope="module")
def res(ctl):
    yield ctl.reserve("engines", CONFIG, timeout_s=120)
    ctl.release("engines")


@pytest.fixture(scope="module")
def watch(tmp_path_factory):
    path = tmp_path_factory.mktemp("watch") / "pids"
    path.write_text("")
    return path


@pytest.fixture(scope="module")
def engine(res, models, watch):
    group = clients.WorkerGroup.launch(res, "rollout", Engine, str(models[0]), str(watch))
    yield group
    group.shutdown()


def test_the_engine_generates_and_shows_a_trainers_push(res, models, engine):
    m0, m1 = models
    before = tiny_model.greedy(m0)
    assert engine.execute("generate") == [before]

    trainer = clients.WorkerGroup.launch(res, "actor", Trainer)
    try:
        (took,) = trainer.execute("push", engine.actors, str(m1), PUSHED)
    finally:
        trainer.shutdown()
    after = tiny_model.greedy(m0, m1, PUSHED)
    assert after != before  # the push matters
    assert engine.execute("generate") == [after]
    assert took[0] < 10

    # What placectl set, read from the OS for each of the engine's own processes
    rank_pid = engine.execute("pid")[0]
    rank_env = environ(rank_pid)
    tree = engine.execute("tree")[0]
    names = {p["name"] for p in tree}
    assert {"VLLM::EngineCore", "VLLM::Worker"} <= names, tree
    for p in tree:
        env = environ(p["pid"])
        assert env["PLACECTL_WORKER"] == rank_env["PLACECTL_WORKER"], p
        assert (env["PLACECTL_JOB"], env["PLACECTL_COMPONENT"], env["RANK"]) == (
            "engines",
            "rollout",
            "0",
        ), p


def test_a_killed_engine_leaves_nothing_and_comes_back_in_its_slot(res, models, engine, watch):
    (a,) = res.assignments("rollout")
    tree = engine.execute("tree")[0]
    rank_pid = engine.execute("pid")[0]
    pids = [rank_pid, *(p["pid"] for p in tree)]
    watch.write_text(" ".join(map(str, pids)))

    os.kill(rank_pid, signal.SIGKILL)  # as the OOM killer does
    assert engine.repair(timeout=300) == [0]
    started = engine.execute("started")[0]
    assert started["found"] == {p: False for p in pids}  # all gone before it started
    (b,) = res.assignments("rollout")
    assert (b.placement.node_id, b.placement_group_id, b.bundle_index) == (
        a.placement.node_id,
        a.placement_group_id,
        a.bundle_index,
    )
    assert engine.execute("generate") == [tiny_model.greedy(models[0])]

    rank_pid = engine.execute("pid")[0]
    tree = [p["pid"] for p in engine.execute("tree")[0]]
    engine.shutdown()
    assert not any(alive(p) for p in tree)  # the engine's own processes: ended at once
    deadline = time.monotonic() + 30  # the rank's worker is Ray's to end, asynchronously
    while alive(rank_pid):
        assert time.monotonic() < deadline, "Ray did not end the rank's worker in 30 s"
        time.sleep(0.1)
