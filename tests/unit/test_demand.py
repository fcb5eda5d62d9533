"""What a reservation asks the autoscaler for: the shapes (pure), and on the fake cluster
with an autoscaler that adds a node only for demand the cluster reports."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from controller import load_spec
from controller.errors import ReservationTimeout
from controller.planning.cluster import ClusterView, NodeView
from controller.runtime.core.settings import FAST
from controller.state.wants import (
    NODE_BUNDLE,
    PACK,
    STRICT_PACK,
    STRICT_SPREAD,
    accelerators_named,
    for_missing_nodes,
    for_spare,
)
from tests.unit.fakes import cluster, controller, live_groups, run, spec, stored, until

HEAD = NodeView(num_gpus=0, node_id="h" * 56, is_head=True)


def gpu_node(i: int, gpus: int = 4, **labels) -> NodeView:
    return NodeView(num_gpus=gpus, node_id=f"{i:056x}", ip=f"10.0.0.{i}", labels=labels)


def test_a_reservation_on_no_gpu_node_asks_for_the_accelerators_its_strings_count():
    want = for_missing_nodes(load_spec(spec("0-7", num_nodes=3)), ClusterView(nodes=[HEAD]))
    (group,) = want.groups
    assert group.strategy == PACK and group.bundles == [{"GPU": 1.0, "CPU": 1.0}] * 8
    assert group.avoid == []  # the head holds no GPU bundle: nothing to keep it off
    assert want.describe() == "8 x {CPU: 1, GPU: 1}"


def test_whole_nodes_when_the_configuration_states_gpus_per_node():
    block = {**spec("0-11", num_nodes=4), "num_gpus_per_node": 4}
    view = ClusterView(nodes=[HEAD, gpu_node(1)])
    want = for_missing_nodes(load_spec(block), view)
    assert [g.strategy for g in want.groups] == [STRICT_PACK, STRICT_PACK]  # 8 more GPUs
    assert all(len(g.bundles) == 4 for g in want.groups)
    assert want.groups[0].avoid == [gpu_node(1).node_id]  # never placed on a live GPU node
    assert "!in(" in want.groups[0].selector()["ray.io/node-id"]


def test_once_the_accelerators_are_there_it_asks_for_the_nodes_still_missing():
    view = ClusterView(nodes=[HEAD, gpu_node(1, gpus=8)])
    want = for_missing_nodes(load_spec(spec("0-7", num_nodes=3)), view)
    (group,) = want.groups
    assert group.strategy == STRICT_SPREAD and group.bundles == [NODE_BUNDLE]
    assert set(group.avoid) == {HEAD.node_id, gpu_node(1).node_id}
    enough = ClusterView(nodes=[HEAD, gpu_node(1), gpu_node(2)])
    assert for_missing_nodes(load_spec(spec("0-7", num_nodes=3)), enough) is None


def test_accelerators_named_counts_accelerator_groups_only():
    assert accelerators_named(load_spec(spec("2-5"))) == 6
    assert accelerators_named(load_spec(spec("all"))) == 0  # takes what is there
    on_nodes = {
        "num_nodes": 2,
        "component_placement": {"r": {"node_group": "node", "placement": "0-1"}},
    }
    assert accelerators_named(load_spec(on_nodes)) == 0


def test_a_slot_without_spare_asks_for_a_node_of_the_lost_kind():
    from controller.state.records import BundleRecord, SlotRecord

    lost = gpu_node(1, **{"ray.io/node-group": "gpu-workers", "ray.io/node-id": "x"})
    slot = SlotRecord(
        node_rank=1,
        node_id=lost.node_id,
        node_ip=lost.ip,
        group_name="g",
        bundles=[
            BundleRecord(kind="accelerator", local_index=i, resources={"GPU": 1.0, "CPU": 1.0})
            for i in range(2)
        ],
    )
    view = ClusterView(nodes=[HEAD, gpu_node(2)])
    (group,) = for_spare([slot], lost, view, "GPU").groups
    assert group.strategy == STRICT_PACK
    assert sum(b.get("GPU", 0) for b in group.bundles) == 4  # the lost node's four
    assert group.labels == {"ray.io/node-group": "gpu-workers"}
    assert group.avoid == [gpu_node(2).node_id]


# ---------------------------------------------------------------- with an autoscaler


class Autoscaler:
    """Adds nodes of one shape for the demand the fake cluster reports pending, as many
    as it needs beside those added and not used yet; removes the nodes it added once
    idle for ``idle_s``."""

    def __init__(self, fake, gpus: int = 4, labels: dict | None = None, idle_s=0.3) -> None:
        self.fake, self.gpus, self.labels, self.idle_s = fake, gpus, labels or {}, idle_s
        self.added: list[str] = []
        self.removed: list[str] = []
        self._idle_since: dict[str, float] = {}

    def _nodes_for(self, group) -> int:
        if any(self.labels.get(k) != v for k, v in group.labels.items()):
            return 0
        if any(b.get(k, 0) > self.gpus for b in group.bundles for k in ("GPU", "CPU")):
            return 0  # no node of this shape could take it
        if group.strategy == "STRICT_SPREAD":
            return len(group.bundles)
        gpus = sum(b.get("GPU", 0) for b in group.bundles)
        return 1 if group.strategy == "STRICT_PACK" else max(1, -(-int(gpus) // self.gpus))

    def _idle(self, node_id: str) -> bool:
        n = self.fake.nodes_by_id[node_id]
        return n.info.alive and n.free == dict(n.info.resources)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            unused = [n for n in self.added if n not in self.removed and self._idle(n)]
            wanted = sum(self._nodes_for(g) for g in self.fake.pending_demand())
            for _ in range(wanted - len(unused)):
                node = self.fake.add_node(
                    num_gpus=self.gpus, num_cpus=self.gpus, labels=self.labels
                )
                self.added.append(node)
                self._idle_since[node] = now
            for node in [n for n in self.added if n not in self.removed]:
                if not self._idle(node):
                    self._idle_since[node] = now
                elif now - self._idle_since[node] >= self.idle_s and not wanted:
                    self.fake.kill_node(node)
                    self.removed.append(node)
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def autoscaled(fake, **kw):
    scaler = Autoscaler(fake, **kw)
    task = asyncio.ensure_future(scaler.run())
    try:
        yield scaler
    finally:
        task.cancel()


def demand_groups(fake) -> set[str]:
    return {g for g in live_groups(fake) if fake.groups_by_id[g].demand is not None}


def test_a_reservation_on_a_cluster_with_no_gpu_node_gets_its_nodes_and_withdraws_its_demand():
    async def go():
        fake = cluster(gpu_nodes=0)
        ctl = await controller(fake)
        async with autoscaled(fake) as scaler:
            await ctl.reserve("j", spec("0-7", num_nodes=3), timeout_s=5)
            assert stored(fake, "j").state == "ready"
            assert len(scaler.added) == 2  # 8 GPUs on 4-GPU nodes: two, no more
            assert stored(fake, "j").node_ids() == set(scaler.added)
            assert demand_groups(fake) == set()  # withdrawn once placed
            await ctl.release("j")
            await until(lambda: len(scaler.removed) == 2)  # idle nodes go
            assert ctl.state.records == {}
        await ctl.stop()

    run(go())


def test_without_an_autoscaler_the_reserve_times_out_saying_so_and_leaves_nothing():
    async def go():
        fake = cluster(gpu_nodes=0)
        ctl = await controller(fake)
        with pytest.raises(ReservationTimeout, match="no autoscaler added the nodes asked for"):
            await ctl.reserve("j", spec("0-7", num_nodes=3), timeout_s=0.3)
        assert live_groups(fake) == set()
        await ctl.stop()

    run(go())


def test_a_lost_node_without_a_spare_is_replaced_by_one_the_autoscaler_adds():
    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        lost = stored(fake, "j").slots[0].node_id
        async with autoscaled(fake) as scaler:
            fake.kill_node(lost)
            repaired = await until(lambda: (r := stored(fake, "j")).epoch == 2 and r)
            assert repaired.state == "ready" and lost not in repaired.node_ids()
            assert set(scaler.added) <= repaired.node_ids() and len(scaler.added) == 1
            await until(lambda: demand_groups(fake) == set())
        await ctl.stop()

    run(go())


def test_a_draining_node_without_a_spare_asks_for_one_and_moves_there():
    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        node = stored(fake, "j").slots[1].node_id
        async with autoscaled(fake) as scaler:
            fake.draining[node] = 0.0
            moved = await until(lambda: (r := stored(fake, "j")).epoch == 2 and r)
            assert moved.state == "ready" and node not in moved.node_ids()
            assert len(scaler.added) == 1 and scaler.added[0] in moved.node_ids()
        await ctl.stop()

    run(go())


def test_a_spare_asked_for_is_withdrawn_when_the_reservation_is_released():
    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake, FAST)
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        fake.kill_node(stored(fake, "j").slots[0].node_id)
        await until(lambda: demand_groups(fake))  # no autoscaler: it waits, asking
        assert "asked the autoscaler" in stored(fake, "j").reason
        await ctl.release("j")
        assert demand_groups(fake) == set()
        await ctl.stop()

    run(go())


def test_a_spare_no_free_node_can_be_is_asked_of_the_autoscaler_and_held_where_it_joins():
    async def go():
        fake = cluster(gpu_nodes=1)  # the job's node, and no other
        ctl = await controller(fake)
        await ctl.reserve("j", {**spec("0-3", num_nodes=2), "spares": 1}, 5)
        assert stored(fake, "j").state == "ready"  # the spare never holds the job up
        await until(lambda: demand_groups(fake))  # asked: one node of the job's kind
        (asked,) = [fake.groups_by_id[g].demand for g in demand_groups(fake)]
        assert sum(b.get("GPU", 0) for b in asked.bundles) == 4
        async with autoscaled(fake) as scaler:
            rec = await until(lambda: (r := stored(fake, "j")).spares and r, timeout=10)
            (spare,) = rec.spares
            assert scaler.added == [spare.node_id]  # held on the node added for it
            assert fake.groups_by_id[spare.group_id].node_id == spare.node_id
            await until(lambda: not demand_groups(fake))  # withdrawn once held
            await asyncio.sleep(1.0)  # the autoscaler's idle timeout, three times over
            assert scaler.removed == []  # a held spare is not an idle node
        await ctl.stop()

    run(go())


def test_a_released_reservation_takes_back_what_it_asked_for_its_spares():
    async def go():
        fake = cluster(gpu_nodes=1)
        ctl = await controller(fake)
        await ctl.reserve("j", {**spec("0-3", num_nodes=2), "spares": 1}, 5)
        await until(lambda: demand_groups(fake))
        await ctl.release("j")
        await until(lambda: not demand_groups(fake))
        assert live_groups(fake) == set()
        await ctl.stop()

    run(go())


def test_a_spare_freed_by_another_job_is_held_and_the_demand_for_one_withdrawn():
    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake)
        await ctl.reserve("other", spec("0-3", num_nodes=3), 5)  # one node each
        await ctl.reserve("j", {**spec("4-7", num_nodes=3), "spares": 1}, 5)
        await until(lambda: demand_groups(fake))  # no free node: asked
        freed = stored(fake, "other").slots[0].node_id
        await ctl.release("other")
        rec = await until(lambda: (r := stored(fake, "j")).spares and r, timeout=10)
        assert rec.spares[0].node_id == freed
        await until(lambda: not demand_groups(fake))  # nothing asked any more
        await ctl.stop()

    run(go())
