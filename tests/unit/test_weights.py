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
