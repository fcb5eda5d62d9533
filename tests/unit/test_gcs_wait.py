"""Waiting out the GCS: retried while it is away, bounded, said, other errors untouched."""

from __future__ import annotations

import asyncio

import pytest

from controller.errors import ClusterUnavailable, PlacementError
from controller.runtime.edge import ray_gcs


class Away(Exception):
    """Stands in for Ray's RpcError("Timed out while waiting for GCS ...")."""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def flaky(clock: Clock, failures: int, cost: float = 5.0):
    """A GCS call that times out ``failures`` times (each attempt costing ``cost``
    seconds of the clock), then answers; records the timeouts it was given."""
    given: list[float] = []

    def call(timeout: float):
        given.append(timeout)
        if len(given) <= failures:
            clock.now += cost
            raise Away("Timed out while waiting for GCS to become available.")
        return "answer"

    return call, given


def test_waits_while_the_gcs_is_away_and_says_why():
    clock, said = Clock(), []
    call, given = flaky(clock, failures=3)
    got = ray_gcs.retry(
        call, "reading the table", said.append, lambda e: isinstance(e, Away), bound=60, clock=clock
    )
    assert got == "answer"
    assert given == [5.0, 5.0, 5.0, 5.0]
    assert len(said) == 3
    assert "reading the table" in said[0] and "head node is restarting" in said[0]
    assert "waiting up to 60s" in said[-1] and "(15s so far)" in said[-1]


def test_gives_up_after_the_bound_with_one_clear_error():
    clock, said = Clock(), []
    call, given = flaky(clock, failures=100)
    with pytest.raises(ClusterUnavailable) as e:
        ray_gcs.retry(
            call,
            "reading the table",
            said.append,
            lambda e: isinstance(e, Away),
            bound=12,
            clock=clock,
        )
    assert isinstance(e.value, PlacementError)
    assert "did not answer reading the table for 12s" in str(e.value)
    assert "RAY_REDIS_ADDRESS" in str(e.value)
    assert "\n" not in str(e.value)
    # the last attempt is given only what is left of the bound
    assert given == [5.0, 5.0, 2.0]


def test_other_errors_pass_through_at_once():
    clock, said = Clock(), []

    def call(timeout):
        raise KeyError("not a GCS outage")

    with pytest.raises(KeyError):
        ray_gcs.retry(call, "x", said.append, lambda e: isinstance(e, Away), clock=clock)
    assert said == []


def test_a_refused_connection_is_not_a_hot_loop(monkeypatch):
    # A call that fails at once (connection refused) is retried after a pause, and the
    # waiter says so at most once per attempt period.
    clock, said, slept = Clock(), [], []
    monkeypatch.setattr(
        ray_gcs.time, "sleep", lambda s: (slept.append(s), setattr(clock, "now", clock.now + s))
    )
    call, _ = flaky(clock, failures=30, cost=0.0)
    assert (
        ray_gcs.retry(
            call, "x", said.append, lambda e: isinstance(e, Away), bound=60, clock=clock, pause=0.2
        )
        == "answer"
    )
    assert len(slept) == 30 and all(s == 0.2 for s in slept)
    assert len(said) == 2  # at 0 s and at 5 s, not 30 times


def test_the_async_wait_does_the_same():
    clock, said = Clock(), []
    call, _ = flaky(clock, failures=2)

    async def acall(timeout):
        return call(timeout)

    got = asyncio.run(
        ray_gcs.aretry(
            acall,
            "writing the table",
            said.append,
            lambda e: isinstance(e, Away),
            bound=60,
            clock=clock,
        )
    )
    assert got == "answer" and len(said) == 2 and "writing the table" in said[0]


def test_the_bound_follows_placectl_then_ray(monkeypatch):
    monkeypatch.delenv("PLACECTL_GCS_WAIT_S", raising=False)
    monkeypatch.delenv("RAY_gcs_rpc_server_reconnect_timeout_s", raising=False)
    assert ray_gcs.bound_s() == 60.0
    monkeypatch.setenv("RAY_gcs_rpc_server_reconnect_timeout_s", "120")
    assert ray_gcs.bound_s() == 120.0
    monkeypatch.setenv("PLACECTL_GCS_WAIT_S", "30")
    assert ray_gcs.bound_s() == 30.0
    monkeypatch.setenv("PLACECTL_GCS_WAIT_S", "1")
    assert ray_gcs.bound_s() == ray_gcs.ATTEMPT_S


def test_where_the_gcs_keeps_its_tables():
    pytest.importorskip("ray")
    from controller.runtime.edge.ray_gcs import gcs_store

    assert gcs_store({}) == "memory"
    assert gcs_store({"RAY_REDIS_ADDRESS": "10.0.0.1:6379"}) == "redis"
    assert gcs_store({"RAY_gcs_storage": "rocksdb"}) == "rocksdb"
