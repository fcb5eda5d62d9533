"""Fences on the fake cluster: sent once, only to a node that needs it, never holding a
caller, and never when the answer was a refusal of placectl itself (a secured cluster
whose token or TLS settings placectl's calls do not carry): then Ray decides."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from controller.errors import ReservationError
from controller.runtime import core
from controller.runtime.core.settings import FAST, Settings
from controller.runtime.edge.answers import CallDenied
from tests.unit.fakes import cluster, controller, info, run, stored, until
from tests.unit.test_liveness import _reserved

SLOW_WATCH = msgspec.structs.replace(FAST, liveness_period=60.0)  # only calls ask


def kinds(fake) -> list[str]:
    return [e.kind for e in fake.metrics.events]


def test_a_raylet_that_refuses_placectl_is_never_taken_for_dead():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await _reserved(fake)
        node = stored(fake, "j").slots[0].node_id
        fake.crash_node(node, "denied")  # it answers, but not to placectl's credentials
        await asyncio.sleep(0.3)  # many sweeps, each past suspect_after for a silent node
        assert await ctl.suspects("j") == []
        assert fake.fenced == {} and fake.calls["fence"] == 0
        record = stored(fake, "j")
        assert record.epoch == 1 and record.state == "ready"
        health = await ctl.health()
        assert "UNAUTHENTICATED" in health["denied"][node]
        assert kinds(fake).count("denied") == 1  # said once, however many sweeps
        assert fake.metrics.fences == ["denied"]
        fake.kill_node(node)  # Ray's own health checks decide: repaired then
        await until(lambda: (r := stored(fake, "j")).epoch == 2 and r.state == "ready")
        await ctl.stop()

    run(go())


def test_a_gcs_that_refuses_the_fence_leaves_the_verdict_to_ray():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await _reserved(fake)
        fake.fence_refusal = CallDenied("UNAUTHENTICATED: InvalidAuthToken")
        lost = stored(fake, "j").slots[0].node_id
        fake.crash_node(lost)  # its raylet refuses connections: a fence is due
        await until(lambda: "gcs" in fake_health(ctl))
        await asyncio.sleep(0.2)
        assert fake.calls["fence"] == 1  # refused once: not asked again every sweep
        assert stored(fake, "j").epoch == 1  # nothing moved on placectl's say-so
        assert kinds(fake).count("denied") == 1
        fake.kill_node(lost)  # Ray's health checks give up: the slot moves as ever
        await until(lambda: (r := stored(fake, "j")).epoch == 2 and r.state == "ready")
        await ctl.stop()

    def fake_health(ctl):
        return ctl.ops.fencer.denied

    run(go())


def test_a_node_ray_reports_dead_already_is_not_fenced_again():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await _reserved(fake, SLOW_WATCH)
        lost = stored(fake, "j").slots[0].node_id
        node = fake.nodes_by_id[lost]
        node.info = msgspec.structs.replace(node.info, alive=False)  # its event not seen yet
        fake.crash_node(lost)
        status = info(await ctl.status("j"))
        assert status.state != "ready" or lost not in {s.node_id for s in status.slots}
        assert fake.calls["fence"] == 0 and fake.fenced == {}
        await until(lambda: (r := stored(fake, "j")).epoch == 2 and r.state == "ready")
        await ctl.stop()

    run(go())


def test_a_draining_node_is_not_fenced():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await _reserved(fake, SLOW_WATCH)
        leaving = stored(fake, "j").slots[0].node_id
        fake.draining[leaving] = core.wall() + 60  # Ray is taking it away
        fake.crash_node(leaving)  # its raylet exits as the drain ends
        await ctl.suspects("j")
        assert fake.calls["fence"] == 0 and fake.fenced == {}
        await ctl.stop()

    run(go())


def test_a_failed_fence_is_tried_again_later_and_counted():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await _reserved(fake)
        real = fake.fence
        failures = [RuntimeError("DEADLINE_EXCEEDED"), RuntimeError("DEADLINE_EXCEEDED")]

        async def flaky(node_id, why):
            if failures:
                raise failures.pop(0)
            await real(node_id, why)

        fake.fence = flaky
        lost = stored(fake, "j").slots[0].node_id
        started = core.now()
        fake.crash_node(lost)
        await until(lambda: lost in fake.fenced, timeout=10)
        # Two failures: tried again after 0.5 s, then 1 s, not at every sweep (5 ms).
        assert core.now() - started >= 1.4
        assert fake.metrics.fences == ["failed", "failed", "fenced"]
        assert (await ctl.health())["fence_failures"] == 2
        await until(lambda: stored(fake, "j").epoch == 2)
        await ctl.stop()

    run(go())


def test_a_stalled_fence_holds_no_caller_and_is_sent_once():
    async def go():
        fake = cluster(gpu_nodes=3)
        ctl = await _reserved(fake, msgspec.structs.replace(SLOW_WATCH, fence_wait=0.3))
        calls = []
        release = asyncio.Event()
        real = fake.fence

        async def stalled(node_id, why):  # the GCS holds the call (Ray 2.60: 10 s)
            calls.append(node_id)
            await release.wait()
            await real(node_id, why)

        fake.fence = stalled
        lost = stored(fake, "j").slots[0].node_id
        fake.crash_node(lost)
        started = core.now()
        await asyncio.gather(*(ctl.suspects("j") for _ in range(3)))
        await ctl.repair("j")
        assert core.now() - started < 3.0  # each caller waited 0.3 s at most
        assert calls == [lost]
        release.set()
        await until(lambda: (r := stored(fake, "j")).epoch == 2 and r.state == "ready")
        assert calls == [lost]
        await ctl.stop()

    run(go())


def test_the_test_hook_answers_only_a_controller_started_for_tests():
    async def go():
        fake = cluster(gpu_nodes=2)
        plain = await controller(fake, Settings())
        with pytest.raises(ReservationError, match=r"arm_fault.*test hook.*PLACECTL_TEST_HOOKS"):
            await plain.arm_fault("after_create")
        await plain.stop()
        testing = await controller(cluster(gpu_nodes=2), FAST)
        await testing.arm_fault("after_create")  # armed
        await testing.arm_fault(None)
        await testing.stop()

    run(go())


class _RpcError(Exception):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


@pytest.mark.parametrize(
    ("code", "details", "refused_us"),
    [
        ("UNAUTHENTICATED", "InvalidAuthToken: Authentication token is missing", True),
        ("PERMISSION_DENIED", "not allowed", True),
        ("UNAVAILABLE", "ipv4:10.0.0.1:4000: Ssl handshake failed: SSL_ERROR_SSL", True),
        ("UNAVAILABLE", "failed to connect to all addresses; ...: Socket closed", True),
        ("UNAVAILABLE", "failed to connect to all addresses; ...: Connection refused", False),
        ("DEADLINE_EXCEEDED", "Deadline Exceeded", False),
    ],
)
def test_a_refusal_of_placectl_is_told_apart_from_a_dead_or_silent_process(
    code, details, refused_us
):
    import grpc

    from controller.runtime.edge.answers import denied

    got = denied(_RpcError(getattr(grpc.StatusCode, code), details))
    assert (got is not None) == refused_us, got
