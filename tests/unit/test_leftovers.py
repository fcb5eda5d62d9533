"""What a stopped worker leaves on its node, read from this machine's real process table:
processes that carry the worker's tag end, whatever session they moved to; the rest do
not; Ray's own workers are left to Ray."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from controller.runtime.edge import node_tasks
from controller.runtime.edge.node_tasks import alive


@pytest.fixture
def spawn():
    """Start ``sleep`` (or ``argv``) with a tag, in a session of its own; killed after."""
    started: list[subprocess.Popen] = []

    def start(tag: str | None, argv: list[str] | None = None) -> int:
        env = {k: v for k, v in os.environ.items() if k != node_tasks.TAG}
        if tag is not None:
            env[node_tasks.TAG] = tag
        proc = subprocess.Popen(argv or ["sleep", "300"], env=env, start_new_session=True)
        started.append(proc)
        return proc.pid

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def wait_started(pid: int, tag: str) -> None:
    deadline = time.monotonic() + 10
    while pid not in node_tasks.tagged([tag]):
        assert time.monotonic() < deadline, f"pid {pid} never showed its tag"
        time.sleep(0.01)


def test_ends_exactly_the_processes_of_the_stopped_worker(spawn):
    mine, other, untagged = (
        spawn("uid:job.rollout.0:aa"),
        spawn("uid:job.rollout.1:bb"),
        spawn(None),
    )
    wait_started(mine, "uid:job.rollout.0:aa")
    ended = node_tasks.end_tagged(["uid:job.rollout.0:aa"])
    assert [e.pid for e in ended] == [mine]
    assert ended[0].command.startswith("sleep") and ended[0].tag == "uid:job.rollout.0:aa"
    assert not alive(mine)
    assert alive(other) and alive(untagged)


def test_a_grandchild_that_left_for_a_session_of_its_own_is_found_by_its_tag(spawn):
    # a launcher that starts its server in a new session and exits, as a daemon does
    script = (
        "import subprocess, sys; "
        "p = subprocess.Popen(['sleep', '300'], start_new_session=True, "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)"
    )
    tag = "uid:job.engine.0:cc"
    env = {**os.environ, node_tasks.TAG: tag}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    grandchild = int(out.stdout)
    try:
        assert alive(grandchild)  # its parent is gone; it lives on, reparented
        assert [e.pid for e in node_tasks.end_tagged([tag])] == [grandchild]
        assert not alive(grandchild)
    finally:
        if alive(grandchild):
            os.kill(grandchild, 9)


# A worker running its actor, and one still starting (or idle in Ray's pool), whose
# command line is Ray's entry point: a release once killed those (CI, in test_abrupt).
@pytest.mark.parametrize(
    "title",
    ["ray::Trainer", "/v/bin/python /v/site-packages/ray/_private/workers/default_worker.py"],
)
def test_ray_workers_are_left_to_ray_and_waited_for_a_bounded_time(spawn, title):
    tag = "uid:job.actor.0:dd"
    worker = spawn(tag, ["bash", "-c", f'exec -a "{title}" sleep 300'])
    child = spawn(tag)
    wait_started(child, tag)
    deadline = time.monotonic() + 10
    while not node_tasks.tagged([tag]).get(worker, ("", ""))[1].startswith(title):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    started = time.monotonic()
    ended = node_tasks.end_tagged([tag], ray_grace=0.3)
    assert [e.pid for e in ended] == [child]
    assert alive(worker)  # Ray's to end
    assert 0.3 <= time.monotonic() - started < 5


def test_nothing_tagged_returns_at_once():
    started = time.monotonic()
    assert node_tasks.end_tagged(["uid:nobody:00"]) == []
    assert time.monotonic() - started < 5


def test_tags():
    assert node_tasks.new_tag("u1", "job.engine.0", detached=True) == "u1:job.engine.0"
    a, b = (node_tasks.new_tag("u1", "job.engine.0", detached=False) for _ in range(2))
    assert a != b and a.startswith("u1:job.engine.0:")


def test_a_reservations_prefix_ends_every_tag_of_it_and_no_other(spawn):
    uid = "u9f3"
    mine = [spawn(f"{uid}:job.engine.0"), spawn(f"{uid}:job.rollout.1:0a")]
    other = spawn("u9f30:job.engine.0")  # another reservation whose uid starts alike
    for pid, tag in zip(mine, [f"{uid}:job.engine.0", f"{uid}:job.rollout.1:0a"], strict=True):
        wait_started(pid, tag)
    ended = node_tasks.end_tagged([], prefixes=[node_tasks.reservation_prefix(uid)])
    assert sorted(e.pid for e in ended) == sorted(mine)
    assert alive(other)


def test_a_returned_nodes_sweep_ends_its_ray_workers_too_but_not_another_nodes(spawn):
    """The sweep of a node that answers again after its ranks moved off it ends their
    Ray workers as well (Ray would end them only once its GCS reaches the node again),
    and only this node's: on a local cluster every node shares one process table, each
    process telling its node by the raylet in its environment."""
    uid, title = "u7c1", "ray::Trainer"
    here = {**os.environ, node_tasks.RAYLET_PID: "111"}
    there = {**os.environ, node_tasks.RAYLET_PID: "222"}

    def worker(env: dict) -> int:
        proc = subprocess.Popen(
            ["bash", "-c", f'exec -a "{title}" sleep 300'],
            env={**env, node_tasks.TAG: f"{uid}:job.actor.0"},
            start_new_session=True,
        )
        spawned.append(proc)
        return proc.pid

    spawned: list[subprocess.Popen] = []
    try:
        mine, theirs = worker(here), worker(there)
        wait_started(mine, f"{uid}:job.actor.0")
        wait_started(theirs, f"{uid}:job.actor.0")
        ended = node_tasks.end_tagged(
            [], prefixes=[node_tasks.reservation_prefix(uid)], ray_workers=True,
            within=f"{node_tasks.RAYLET_PID}=111",
        )  # fmt: skip
        assert [e.pid for e in ended] == [mine]
        assert alive(theirs)
    finally:
        for proc in spawned:
            proc.kill()
            proc.wait()
