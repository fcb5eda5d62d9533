"""The queue on a real local cluster: three reservations that do not fit together are
placed in priority order as others release; a queued one holds no placement group
(Ray's group table); ``placectl queue`` shows the order, what each waits for and whose
reservation holds it; a controller restart keeps the queue."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

import clients
from controller.errors import NotOwner
from tests.integration.conftest import (
    live_groups,
    one_node,
    placectl_cli,
    restart_controller,
    wait_for,
)

BOTH = one_node("0-7")  # both GPU nodes
FIRST = one_node("0-3")  # the first GPU node


def _reserve_in_background(ctl, job, spec, priority, out: dict) -> threading.Thread:
    def run():
        try:
            out[job] = ctl.reserve(
                job, spec, timeout_s=240, queue="team", priority=priority, progress=lambda m: None
            )
        except Exception as e:  # the test asserts on it
            out[job] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _state(ctl, job):
    try:
        return ctl.status(job).state
    except Exception:
        return None


def test_queued_reservations_are_placed_in_priority_order_as_others_release(cluster, ctl):
    holder = ctl.reserve("holder", BOTH, timeout_s=120)
    groups_before = set(live_groups())
    out: dict = {}
    low = _reserve_in_background(ctl, "low", FIRST, 0, out)
    wait_for(lambda: _state(ctl, "low") == "queued", timeout=60)
    high = _reserve_in_background(ctl, "high", FIRST, 5, out)
    wait_for(lambda: _state(ctl, "high") == "queued", timeout=60)

    # queued: recorded, nothing placed
    assert set(live_groups()) == groups_before
    shown = placectl_cli(cluster.address, "queue", "--json")
    assert shown.returncode == 0, shown.stderr
    entries = json.loads(shown.stdout)
    assert [(e["position"], e["job"], e["priority"]) for e in entries] == [
        (1, "high", 5),
        (2, "low", 0),
    ]
    wait_for(lambda: "held by holder" in (ctl.queue()[0].why or ""), timeout=30)
    text = placectl_cli(cluster.address, "queue").stdout
    assert "high" in text and "held by holder" in text and "GPU 4" in text

    # the controller restarts: the queue is in the table, the callers keep waiting
    restart_controller(ctl)
    assert [e.job for e in ctl.queue()] == ["high", "low"]

    holder.release()
    high.join(timeout=180)
    assert not isinstance(out.get("high"), Exception), out.get("high")
    assert out["high"].state == "ready" and _state(ctl, "low") == "queued"
    wait_for(lambda: "held by high" in (ctl.queue()[0].why or ""), timeout=30)

    ctl.release("high")
    low.join(timeout=180)
    assert not isinstance(out.get("low"), Exception), out.get("low")
    assert out["low"].state == "ready" and ctl.queue() == []
    assert ctl.status("low").queue == "team"


def test_another_clients_change_is_refused_unless_forced(cluster, ctl):
    ctl.reserve("mine", FIRST, timeout_s=120)
    other = clients.connect(token="someone-else")
    assert other.reservation("mine").state == "ready"  # reading and attaching are open
    with pytest.raises(NotOwner, match="reserved by another client"):
        other.release("mine")
    env = dict(os.environ, PLACECTL_TOKEN="someone-else")
    cli = [sys.executable, "-m", "clients.cli", "release", "mine", "--address", cluster.address]
    refused = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 4 and "--force" in refused.stderr  # exit 4: not owner
    assert ctl.status("mine").state == "ready"
    forced = subprocess.run([*cli, "--force"], env=env, capture_output=True, text=True, timeout=120)
    assert forced.returncode == 0 and "released mine" in forced.stdout
    assert ctl.list() == []


def test_a_preemptible_reservation_sees_its_deadline_and_is_released_for_a_higher_one(
    cluster, ctl, monkeypatch
):
    ctl.reserve("spot", FIRST, timeout_s=120, preemptible=True, preempt_grace_s=5)
    out: dict = {}
    vip = _reserve_in_background(ctl, "vip", FIRST, 7, out)
    # what a worker of "spot" reads (its environment names the job)
    monkeypatch.setenv("PLACECTL_JOB", "spot")
    monkeypatch.setenv("PLACECTL_CONTROLLER", ctl.name)
    deadline = wait_for(lambda: clients.preempt_deadline(), timeout=60)
    info = ctl.status("spot")
    assert info.preempting and info.preempt_at == deadline and info.state == "ready"
    assert "preempting: released at" in placectl_cli(cluster.address, "status", "spot").stdout
    vip.join(timeout=120)
    assert not isinstance(out.get("vip"), Exception), out.get("vip")
    assert out["vip"].state == "ready"
    assert [i.job for i in ctl.list()] == ["vip"]


def test_a_job_needing_the_node_a_preemptible_reservation_holds_as_a_spare_preempts_it(
    cluster, ctl
):
    """Held spares count in preemption as slots do: "spot" holds the first GPU node and
    the second as a spare (a placement group of its own in Ray's table); "vip" asks for
    the second. It used to wait for its whole timeout with the node held idle."""
    spot = ctl.reserve(
        "spot", {**FIRST, "spares": 1}, timeout_s=120, preemptible=True, preempt_grace_s=5
    )
    spare = wait_for(lambda: (i := spot.refresh()).spares and i.spares[0], timeout=60)
    assert live_groups()[spare.group_id]["state"] == "CREATED"
    assert spare.node_id != spot.refresh().slots[0].node_id
    out: dict = {}
    vip = _reserve_in_background(ctl, "vip", one_node("4-7"), 7, out)
    vip.join(timeout=180)
    assert "vip" in out, f"vip still waits after 180 s: {ctl.status('vip').reason}"
    assert not isinstance(out["vip"], Exception), out["vip"]
    assert out["vip"].state == "ready"
    assert [s.node_id for s in out["vip"].refresh().slots] == [spare.node_id]
    assert [i.job for i in ctl.list()] == ["vip"]  # spot released at its deadline
    assert spare.group_id not in live_groups()
