"""What a rank leaves on its node when it ends, read from the node's process table: an
engine's server in a session of its own (which Ray does not end) is ended before the
rank's slot is used again, by repair(), restart() and shutdown(), also from a driver
that attached later; other ranks' processes are not touched."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

import clients
from clients.leftovers import alive
from tests.integration.conftest import local_cluster

CONFIG = {"num_nodes": 2, "component_placement": {"engine": "0-1"}}


class Engine:
    """A rank that starts its server the way engines do; it notes, when it starts, whether
    the processes named in ``watch`` (a file of pids) are still alive."""

    def __init__(self, watch: str):
        with open(watch) as f:
            self.found = {int(p): alive(int(p)) for p in f.read().split()}
        self.servers: list[subprocess.Popen] = []

    def serve(self, own_session: bool) -> int:
        proc = subprocess.Popen(["sleep", "600"], start_new_session=own_session)
        self.servers.append(proc)
        return proc.pid

    def pid(self) -> int:
        return os.getpid()

    def found_alive(self) -> dict[int, bool]:
        return self.found


@pytest.fixture(scope="module")
def cluster():
    yield from local_cluster(gpu_nodes=1)


@pytest.fixture
def res(ctl):
    yield ctl.reserve("leftovers", CONFIG, timeout_s=60)
    ctl.release("leftovers")


@pytest.fixture
def watch(tmp_path):
    path = tmp_path / "watch"
    path.write_text("")
    return path


def test_a_killed_ranks_server_is_ended_before_its_slot_is_used_again(res, watch):
    group = clients.WorkerGroup.launch(res, "engine", Engine, str(watch))
    try:
        server = group.execute_rank(0, "serve", True)  # a session of its own: not Ray's
        other = group.execute_rank(1, "serve", True)
        watch.write_text(f"{server}")
        os.kill(group.execute_rank(0, "pid"), signal.SIGKILL)  # as the OOM killer does
        assert group.repair(timeout=120) == [0]
        assert group.execute_rank(0, "found_alive") == {server: False}  # before the new rank
        assert not alive(server)
        assert alive(other)  # rank 1's, untouched

        again = group.execute_rank(0, "serve", True)
        assert group.restart([0]) == [0]
        assert not alive(again) and alive(other)
    finally:
        group.shutdown()
    assert not alive(other)


def test_shutdown_from_a_driver_that_attached_later_ends_every_ranks_server(res, watch):
    group = clients.WorkerGroup.launch(res, "engine", Engine, str(watch), detached=True)
    servers = [group.execute_rank(r, "serve", own) for r, own in ((0, True), (1, True))]
    attached = clients.WorkerGroup.attach(res, "engine")  # the tags follow from the names
    attached.shutdown()
    assert not any(alive(p) for p in servers)
