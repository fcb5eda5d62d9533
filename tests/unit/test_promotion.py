"""One promotion per standby (clients.standby.promote_here), run here as it runs inside
a standby: on this process's own environment, which each test restores."""

from __future__ import annotations

import os

import pytest

from clients.standby import AGAIN, BECAME, NEWER, PROMOTED, TAKEN, promote_here
from controller.state.standbys import STANDBY


class Standby:
    def __init__(self) -> None:
        self.calls: list[dict] = []

    def on_promote(self, env: dict) -> None:
        self.calls.append(env)


@pytest.fixture
def standby(monkeypatch):
    """A standby's environment: PLACECTL_STANDBY=1, no rank, no promotion yet."""
    monkeypatch.setenv(STANDBY, "1")
    for key in ("RANK", "PLACECTL_EPOCH", PROMOTED, "MASTER_ADDR"):
        monkeypatch.delenv(key, raising=False)
    yield Standby()
    for key in ("RANK", "PLACECTL_EPOCH", PROMOTED, "MASTER_ADDR"):
        os.environ.pop(key, None)  # set by the promotion, not through monkeypatch


def rank(r: int, epoch: int, master: str = "10.0.0.1") -> dict[str, str]:
    return {"RANK": str(r), "PLACECTL_EPOCH": str(epoch), "MASTER_ADDR": master}


def test_a_standby_becomes_the_rank_once(standby):
    assert promote_here(standby, rank(2, 5)) == (os.getpid(), BECAME)
    assert os.environ["RANK"] == "2" and STANDBY not in os.environ
    assert standby.calls == [rank(2, 5)]


def test_the_same_promotion_again_changes_nothing(standby):
    promote_here(standby, rank(2, 5))
    assert promote_here(standby, rank(2, 5))[1] == AGAIN
    assert len(standby.calls) == 1  # on_promote ran once


def test_a_newer_epoch_of_the_same_rank_takes_its_environment(standby):
    promote_here(standby, rank(2, 5))
    assert promote_here(standby, rank(2, 6, master="10.0.0.9"))[1] == AGAIN
    assert os.environ["MASTER_ADDR"] == "10.0.0.9" and os.environ["PLACECTL_EPOCH"] == "6"


def test_an_older_epoch_never_undoes_a_newer_promotion(standby):
    promote_here(standby, rank(2, 6, master="10.0.0.9"))
    assert promote_here(standby, rank(2, 5))[1] == NEWER
    assert os.environ["MASTER_ADDR"] == "10.0.0.9" and os.environ["PLACECTL_EPOCH"] == "6"


def test_another_rank_is_refused(standby):
    promote_here(standby, rank(2, 5))
    assert promote_here(standby, rank(3, 5))[1] == TAKEN
    assert os.environ["RANK"] == "2"


def test_keys_the_standbys_assignment_set_and_the_ranks_has_not_are_removed(standby, monkeypatch):
    monkeypatch.setenv("NODE_ONLY", "from the node it shadowed")  # env_configs of that node
    promote_here(standby, rank(2, 5), drop=("NODE_ONLY",))
    assert "NODE_ONLY" not in os.environ and os.environ["RANK"] == "2"
