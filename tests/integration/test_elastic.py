"""apply + WorkerGroup.sync on a real local cluster, checked against Ray: which placement
groups exist, which actors are still the same processes, which devices Ray gave them."""

from __future__ import annotations

import os

import pytest
import ray
from ray.util.placement_group import placement_group_table

import clients
from controller import PlacementError, version
from controller.errors import ReservationTimeout
from tests.integration.conftest import GPU_NODES, live_groups, placectl_cli, wait_for


def conf(**components) -> dict:
    return {"num_nodes": 1 + GPU_NODES, "component_placement": components}


class Worker:
    def where(self):
        ctx = ray.get_runtime_context()
        return {
            "actor": ctx.get_actor_id(),
            "group": ctx.get_placement_group_id(),
            "gpus": sorted(int(i) for i in ctx.get_accelerator_ids()["GPU"]),
            "rank": int(os.environ["RANK"]),
            "world": int(os.environ["WORLD_SIZE"]),
        }


def groups_of(ctl, job: str) -> list[str]:
    return [s.group_id for s in ctl.record(job).slots]


def test_grow_and_shrink_a_running_component(ctl):
    res = ctl.reserve("elastic", conf(actor="0-3", rollout="4-5"), 120)
    actor = clients.WorkerGroup.launch(res, "actor", Worker)
    rollout = clients.WorkerGroup.launch(res, "rollout", Worker)
    actors_before = actor.execute("where")
    rollout_before = rollout.execute("where")
    groups_before = groups_of(ctl, "elastic")

    summary = ctl.apply("elastic", conf(actor="0-3", rollout="4-7"))
    assert summary.applied and summary.epoch == 2
    assert groups_of(ctl, "elastic")[:2] == groups_before  # kept: the same groups
    assert len(live_groups(ray.get(ctl.handle.group_prefix.remote()))) == 3
    assert actor.sync().kept == [0, 1, 2, 3]  # nothing to do for the untouched component
    synced = rollout.sync()
    assert (synced.kept, synced.started) == ([0, 1], [2, 3])
    assert synced.restart_needed == "world size 2 -> 4"
    now = rollout.execute("where")
    assert [w["actor"] for w in now[:2]] == [w["actor"] for w in rollout_before]
    assert [w["rank"] for w in now] == [0, 1, 2, 3]
    # Ray gave the new ranks the devices placectl assigned, in the new group
    fresh = res.assignments("rollout")
    assert [w["gpus"] for w in now] == [list(a.placement.cuda_visible_devices) for a in fresh]
    assert {w["group"] for w in now[2:]} == {fresh[2].placement_group_id}
    assert fresh[2].placement_group_id not in groups_before
    assert actor.execute("where") == actors_before  # the same processes, untouched

    ctl.apply("elastic", conf(actor="0-3", rollout="4-5"))
    assert groups_of(ctl, "elastic") == groups_before
    shrunk = rollout.sync()
    assert (shrunk.kept, shrunk.stopped) == ([0, 1], [2, 3])
    assert [w["actor"] for w in rollout.execute("where")] == [w["actor"] for w in rollout_before]
    # the two GPUs the shrink gave back are free at once for another job
    other = ctl.reserve("neighbour", conf(x="6-7"), 30)
    assert [a.placement.node_id for a in other.assignments("x")] == [
        a.placement.node_id for a in fresh[2:]
    ]
    actor.shutdown()
    rollout.shutdown()


def test_an_apply_that_does_not_fit_changes_nothing(ctl):
    ctl.reserve("tight", conf(actor="0-3"), 120)
    ctl.reserve("blocker", conf(y="4-7"), 120)
    record = ctl.record("tight")
    before = {g: i["state"] for g, i in placement_group_table().items()}
    with pytest.raises(ReservationTimeout):
        ctl.apply("tight", conf(actor="0-7"), timeout_s=3)
    assert ctl.record("tight") == record
    wait_for(
        lambda: (
            {g: i["state"] for g, i in placement_group_table().items() if i["state"] != "REMOVED"}
            == {g: s for g, s in before.items() if s != "REMOVED"}
        )
    )
    with pytest.raises(PlacementError, match="unknown component"):
        ctl.resize("tight", "critic", "0-1")


@pytest.mark.parametrize("step", ["apply_after_create", "apply_after_write"])
def test_a_controller_killed_during_apply_leaves_the_old_or_the_new(ctl, step):
    ctl.reserve("crashy", conf(actor="0-3"), 120)
    old = ctl.record("crashy")
    before = ctl.check_alive()
    ray.get(ctl.handle.arm_fault.remote(step))
    # The controller process exits at the step; Ray restarts it, the restarted one
    # rolls back or keeps what was written, and Ray's retry of the call finishes it.
    summary = ctl.apply("crashy", conf(actor="0-7"), timeout_s=120)
    assert ctl.check_alive() != before
    rec = ctl.record("crashy")
    assert summary.epoch == rec.epoch == old.epoch + 1 and rec.applying is None
    assert rec.slots[0] == old.slots[0]  # the slot the change did not touch
    prefix = ray.get(ctl.handle.group_prefix.remote())
    wait_for(lambda: set(live_groups(prefix)) == rec.group_ids())


def test_the_command_line_plans_and_resizes(cluster, ctl, tmp_path):
    ctl.reserve("cli-job", conf(actor="0-3", rollout="4-5"), 120)
    path = tmp_path / "grown.yaml"
    path.write_text(
        "cluster:\n  num_nodes: 3\n  component_placement:\n    actor: 0-3\n    rollout: 4-7\n"
    )

    def placectl(*args: str) -> str:
        out = placectl_cli(cluster.address, *args)
        assert out.returncode == 0, out.stderr
        return out.stdout

    planned = placectl("apply", "cli-job", str(path), "--plan")
    assert "would apply, epoch 2" in planned
    assert "rollout: 2 -> 4 ranks; stay 0-1, start 2-3" in planned
    assert ctl.record("cli-job").epoch == 1
    resized = placectl("resize", "cli-job", "rollout", "4-7")
    assert "cli-job: applied, epoch 2" in resized and "slots: 2 kept, 1 made" in resized
    assert ctl.record("cli-job").spec.component("rollout").placement == "4-7"
    shown = placectl_cli(cluster.address, "status")
    assert "cli-job" in shown.stdout and f"placectl {version()}" in shown.stdout
    # This test cluster keeps the GCS in memory: the user is told what a head loss costs.
    assert "no GCS fault tolerance" in shown.stderr and "RAY_REDIS_ADDRESS" in shown.stderr
