"""One request type per driver call: what the client, Ray and the controller each make
of a call's parameters, and bad ones refused with the names that are allowed."""

from __future__ import annotations

import inspect

import pytest
from ray._common import signature as ray_signature

from clients.reservation import Reservation
from clients.session import Controller
from controller.errors import ReservationError
from controller.runtime.controller import PlacementController
from controller.state import lease_requests as lq
from controller.state import requests as rq
from tests.unit.fakes import cluster, controller, info, live_groups, run, spec

# A driver call's client method, its request type, and the parameters only the client
# has (what it does while it waits) or fills itself (the token, a request id).
CLIENT_CALLS = [
    (Controller.reserve, rq.Reserve, {"progress"}, {"token"}),
    (Controller.apply, rq.Apply, {"progress"}, {"token"}),
    (Controller.resize, rq.Resize, set(), {"token"}),
    (Controller.release, rq.Owned, set(), {"token"}),
    (Controller.repair, rq.Owned, set(), {"token"}),
    (Controller.release_all, rq.Everyone, set(), {"token"}),
    (Controller.set_quota, rq.SetQuota, {"limits"}, {"token", "limits"}),
    (Controller.set_operator, rq.SetOperator, set(), set()),
    (Controller.events, rq.EventsSince, set(), set()),
    (Controller.verdicts, rq.NodesOf, set(), set()),
    (Reservation.lease_ports, lq.LeasePorts, set(), {"job", "token", "request_id", "force"}),
    (Reservation.lease_cores, lq.LeaseCores, set(), {"job", "token", "force"}),
]


def params(fn) -> set[str]:
    return {p for p in inspect.signature(fn).parameters if p != "self"}


@pytest.mark.parametrize("method,request_type,own,filled", CLIENT_CALLS)
def test_the_client_names_each_parameter_as_its_request_type_does(
    method, request_type, own, filled
):
    fields = set(inspect.signature(request_type).parameters)
    assert params(method) - own == fields - filled


def test_ray_binds_a_call_against_its_request_type():
    """Ray reads an actor method's signature after unwrapping it; a call to the actor is
    checked against it before it is sent."""
    for name in ("reserve", "apply", "lease_ports", "lease_cores", "events", "list", "health"):
        method = getattr(PlacementController, name)
        seen = ray_signature.extract_signature(inspect.unwrap(method), ignore_first=True)
        assert [p.name for p in seen] == [
            p.name for p in ray_signature.get_signature(method).parameters.values()
        ][1:]
    reserve = ray_signature.extract_signature(
        inspect.unwrap(PlacementController.reserve), ignore_first=True
    )
    ray_signature.validate_args(reserve, (), {"job": "j", "spec": {}, "priority": 3})
    with pytest.raises(TypeError):
        ray_signature.validate_args(reserve, (), {"job": "j", "spec": {}, "plan": True})


def test_a_call_with_an_unknown_parameter_names_the_allowed_ones():
    async def go():
        fake = cluster()
        ctl = await controller(fake)
        with pytest.raises(ReservationError, match=r"apply\(\): .*'plan'.*job, spec, timeout_s"):
            await ctl.apply("j", spec(), plan=True)
        with pytest.raises(ReservationError, match=r"quotas\(\) takes no arguments"):
            await ctl.quotas("research")
        # positional and by name are the same call
        first = info(await ctl.reserve("j", spec("0-3"), 5, token="t"))
        again = info(await ctl.reserve(job="j", spec=spec("0-3"), timeout_s=5, token="t"))
        assert (first.uid, first.state) == (again.uid, "ready")
        assert len(live_groups(fake)) == len(first.slots)  # nothing placed twice
        await ctl.stop()

    run(go())


class NoActor:
    """A handle that fails the test if anything is sent through it."""

    def __getattr__(self, name):
        raise AssertionError(f"{name} was called: bad input must be refused before it")


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda c: c.reserve("bad name!", spec()), "job name 'bad name!'"),
        (lambda c: c.reserve("j", spec(), timeout_s=-5), "timeout_s -5"),
        (lambda c: c.reserve("j", spec(), priority="high"), "priority 'high'"),
        (lambda c: c.release("j", force="yes"), "force 'yes'"),
        (lambda c: c.resize("j", "", "0-3"), "component ''"),
        (lambda c: c.events(after=-1), "after -1"),
        (lambda c: c.set_quota("research", GPU=-1), "quota GPU=-1"),
        (lambda c: c.verdicts("j", ["n"], wait_s=60), "wait_s 60: expected seconds from 0 to 10"),
        (lambda c: c.verdicts("j", ["n"], unless={"n": 1}), "unless {'n': 1}"),
    ],
)
def test_the_client_refuses_bad_input_before_it_travels(call, message):
    ctl = Controller(handle=NoActor(), table=object(), token="t")
    with pytest.raises(ReservationError, match=message.replace("(", r"\(")):
        call(ctl)
