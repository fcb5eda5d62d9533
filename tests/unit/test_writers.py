"""One writer per reservation: a change of a job's record is never built on a record
another change has replaced meanwhile. Each race is made deterministic by holding one
GCS write open (a slow write, as a busy GCS gives) while another call runs."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from controller.errors import NotOwner, StaleChange
from controller.state.records import ReservationRecord
from controller.state.table import RECORD, key
from tests.unit.fakes import cluster, controller, run, spec, stored, until


class Gate:
    """Holds the next write of one job's record until :meth:`open` is called."""

    def __init__(self, job: str) -> None:
        self.key = key(RECORD, job)
        self.held = asyncio.Event()
        self._open = asyncio.Event()

    async def __call__(self, written: bytes) -> None:
        if written == self.key and not self.held.is_set():
            self.held.set()
            await self._open.wait()

    def open(self) -> None:
        self._open.set()


def watch(fake, job: str) -> list[ReservationRecord]:
    """Every record of ``job`` the GCS is given, in order."""
    written, put = [], fake.kv_put

    async def kv_put(k: bytes, v: bytes) -> None:
        await put(k, v)
        if k == key(RECORD, job):
            written.append(msgspec.msgpack.decode(v, type=ReservationRecord))

    fake.kv_put = kv_put
    return written


def test_a_lease_taken_while_a_check_records_a_dead_node_is_kept():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-7", num_nodes=3), repair="manual")
        fake.write_gate = gate = Gate("j")
        fake.kill_node(stored(fake, "j").slots[0].node_id)
        await until(gate.held.is_set)  # the check's "degraded" is being written
        lease = asyncio.create_task(ctl.lease_ports("j", "actor", rank=4, name="nccl"))
        await asyncio.sleep(0.05)  # the lease runs as far as it can
        gate.open()
        ports = await asyncio.wait_for(lease, 5)
        record = await until(lambda: (r := stored(fake, "j")).state == "degraded" and r)
        assert [lease.ports for lease in record.leases if lease.purpose != "master"] == [ports]
        assert ctl.state.get("j") == record  # memory and table agree
        await ctl.stop()

    run(go())


def test_a_preemption_is_not_erased_by_a_change_in_flight():
    async def go():
        fake = cluster(gpu_nodes=1)
        ctl = await controller(fake)
        low = spec("0-3", num_nodes=2)
        await ctl.reserve("low", low, 5, preemptible=True, preempt_grace_s=60)
        written = watch(fake, "low")
        fake.write_gate = gate = Gate("low")
        lease = asyncio.create_task(ctl.lease_ports("low", "actor", rank=1, name="nccl"))
        await until(gate.held.is_set)  # the lease's record is being written
        vip = asyncio.create_task(
            ctl.reserve("vip", spec("0-3", num_nodes=2), 30, queue="q", priority=5)
        )
        await asyncio.sleep(0.1)  # the admitter decides to preempt low meanwhile
        gate.open()
        await asyncio.wait_for(lease, 5)
        record = await until(lambda: (r := stored(fake, "low")).preempt_at and r, timeout=5)
        assert "preempted for 'vip'" in record.reason
        assert any(lease.purpose != "master" for lease in record.leases)
        first = next(i for i, r in enumerate(written) if r.preempt_at)
        # Once drivers were told the deadline, no later write takes it back or moves it.
        assert {r.preempt_at for r in written[first:]} == {record.preempt_at}
        assert ctl.state.get("low") == record
        vip.cancel()
        await ctl.stop()

    run(go())


def test_a_commit_built_on_a_replaced_record_is_refused():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-7", num_nodes=3))
        old = ctl.state.get("j")
        await ctl.lease_ports("j", "actor", rank=0, name="a")
        with pytest.raises(StaleChange, match="'j' changed"):
            await ctl.state.commit(msgspec.structs.replace(old, reason="x"), base=old)
        assert stored(fake, "j") == ctl.state.get("j") != old
        await ctl.stop()

    run(go())


def test_a_change_checked_before_the_job_existed_is_refused_on_the_one_reserved_meanwhile():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        fake.write_gate = gate = Gate("j")
        mine = asyncio.create_task(ctl.reserve("j", spec("0-3"), token="alice"))
        await until(gate.held.is_set)  # alice's reservation is being recorded: none yet
        theirs = asyncio.create_task(ctl.apply("j", spec("0-7"), token="bob"))
        await asyncio.sleep(0.05)  # bob's call gets as far as it can
        gate.open()
        await asyncio.wait_for(mine, 5)
        with pytest.raises(NotOwner, match="apply of 'j' refused"):
            await asyncio.wait_for(theirs, 5)
        record = stored(fake, "j")
        assert (record.epoch, record.spec.component("actor").placement) == (1, "0-3")
        await ctl.stop()

    run(go())


def test_a_resize_edits_the_configuration_a_concurrent_apply_left():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await controller(fake)
        await ctl.reserve("j", spec("0-3", rollout="4-7"))
        fake.write_gate = gate = Gate("j")
        first = asyncio.create_task(ctl.apply("j", spec("0-1", rollout="4-7")))
        await until(gate.held.is_set)  # the apply's intent is being written
        second = asyncio.create_task(ctl.resize("j", "rollout", "4-5"))
        await asyncio.sleep(0.05)
        gate.open()
        await asyncio.wait_for(first, 5)
        await asyncio.wait_for(second, 5)
        placed = {c.name: c.placement for c in stored(fake, "j").spec.components}
        assert placed == {"actor": "0-1", "rollout": "4-5"}  # both changes, neither undone
        await ctl.stop()

    run(go())


def test_stop_ends_every_task_the_controller_started():
    async def go():
        fake = cluster(gpu_nodes=1)
        ctl = await controller(fake)
        await ctl.reserve("low", spec("0-3", num_nodes=2), 5, preemptible=True)
        fake.write_gate = gate = Gate("low")
        lease = asyncio.create_task(ctl.lease_ports("low", "actor", rank=1, name="nccl"))
        await until(gate.held.is_set)  # the lease holds low's lock: a preemption waits
        vip = asyncio.create_task(
            ctl.reserve("vip", spec("0-3", num_nodes=2), 30, queue="q", priority=5)
        )
        await until(lambda: "preempted low" in (ctl.ops.admitter.why("vip") or ("", ""))[1])
        await asyncio.sleep(0)  # the preemption is started, and waits for low's lock
        await ctl.stop()
        ours = {asyncio.current_task(), lease}  # the test's own, not the controller's
        await until(lambda: all(t.done() for t in asyncio.all_tasks() - ours))
        assert vip.cancelled() or isinstance(vip.exception(), Exception)
        lease.cancel()

    run(go())


def test_a_reserve_cancelled_twice_finishes_its_rollback_before_the_next_writer():
    """A release and a cancel of one job at once cancel its reserve twice; the second
    cancel used to end the reserve's call while its rollback was still writing, so the
    release took the job's lock and collided with that write (StaleChange, seen from
    four drivers racing in tests/integration/test_faults.py)."""

    async def go():
        fake = cluster(gpu_nodes=2)
        ctl = await controller(fake)
        fake.create_delay = 0.3  # the reserve is placing its groups
        reserve = asyncio.create_task(ctl.reserve("j", spec("0-3", num_nodes=2), 5))
        await until(lambda: (r := stored(fake, "j")) is not None and r.state == "pending")
        fake.write_gate = gate = Gate("j")  # the rollback's write is held open
        release = asyncio.create_task(ctl.release("j"))
        await until(gate.held.is_set)
        cancel = asyncio.create_task(ctl.cancel("j"))  # the second cancel, meanwhile
        await asyncio.sleep(0.05)
        gate.open()
        assert await asyncio.wait_for(release, 5) is True  # no StaleChange
        assert await asyncio.wait_for(cancel, 5) is True
        with pytest.raises(Exception, match="cancelled"):
            await reserve
        assert stored(fake, "j") is None and ctl.state.get("j") is None
        assert {g.state for g in fake.groups_by_id.values()} <= {"REMOVED"}
        await ctl.stop()

    run(go())
