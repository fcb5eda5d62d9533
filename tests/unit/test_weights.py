"""The weights-version guard inside a worker (clients.weights), without Ray: a rank says
which version it holds, refuses work for another, and the group's refusal names every
rank not at the job's version."""

from __future__ import annotations

import pytest

import clients
from clients import weights


@pytest.fixture(autouse=True)
def _fresh_process(monkeypatch):
    monkeypatch.setattr(weights, "_held", None)
    monkeypatch.setattr(weights, "_loading", None)


def test_a_rank_holds_nothing_until_it_says_so_and_refuses_work_meanwhile():
    assert weights.held() is None
    with pytest.raises(clients.StaleWeights, match="holds the weights of version None"):
        weights.require(0)
    weights.hold(3)
    assert weights.held() == 3
    weights.require(3)
    with pytest.raises(clients.StaleWeights, match="version 3, the work is for version 4"):
        weights.require(4)


def test_the_group_refuses_naming_each_rank_not_at_the_version():
    weights.refuse_stale("job/rollout", [0, 1, 2], {0: 7, 1: 7, 2: 7}, 7)  # all at it
    with pytest.raises(clients.StaleWeights) as info:
        weights.refuse_stale("job/rollout", [0, 1, 2, 3], {0: 7, 1: None, 3: 6}, 7)
    said = str(info.value)
    assert "rank 1: None, rank 2: no answer, rank 3: 6" in said
    assert said.startswith("job/rollout: ranks not at weights version 7")
    assert isinstance(info.value, clients.PlacementError)


def test_a_load_begun_and_torn_holds_no_version_and_refuses_the_old_ones_work():
    """A push tells the rank a load begins before it sends the load: until the load
    says hold(), the rank holds nothing, so one that dies half-way (its old weights
    partly overwritten) serves neither version."""
    weights.hold(1)
    weights._begin_here(None, 2)  # what a push runs in each rank first
    assert weights.held() is None
    with pytest.raises(clients.StaleWeights, match=r"a load of version 2 began and did not"):
        weights.require(1)
    weights.hold(2)  # the load finished
    weights.require(2)
    with pytest.raises(clients.StaleWeights, match=r"version 2, the work is for version 1"):
        weights.require(1)


def test_a_push_timeout_is_stale_weights_and_a_placement_error():
    assert issubclass(clients.PushTimeout, clients.StaleWeights)
    assert issubclass(clients.PushTimeout, clients.PlacementError)


def test_a_push_begun_after_its_load_finished_leaves_the_version_held():
    """A rank that runs calls side by side may run the load before the push's word that
    it begins: the version it loaded stays held."""
    weights.hold(2)  # the load of 2 ran first
    weights._begin_here(None, 2)
    assert weights.held() == 2
    weights.require(2)
