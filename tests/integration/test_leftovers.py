"""What a rank leaves on its node when it ends, read from the node's process table: an
engine's server in a session of its own (which Ray does not end) is ended before the
rank's slot is used again, by repair() (of a killed rank or a hung one), restart() and
shutdown(), also from a driver that attached later, and by a release with no shutdown()
at all; other ranks' processes are not touched."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

import pytest

import clients
from controller.runtime.edge.node_tasks import alive
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

    def daemon(self) -> int:
        """Start a server as a daemon does: double-forked into a session of its own, its
        launcher gone (not the worker's child, which Ray ends with the worker)."""
        launch = "setsid sleep 600 >/dev/null 2>&1 & echo $!"
        return int(subprocess.run(["sh", "-c", launch], capture_output=True, text=True).stdout)

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


def test_a_hung_ranks_server_is_ended_before_its_slot_is_used_again(res, watch):
    # A rank stopped on a live node (SIGSTOP: a wedged kernel, a debugger) answers no
    # health check: repair() waits hung_after seconds, kills it as hung, and relaunches
    # it; its server, in a session of its own, neither stopped nor ended by Ray, is gone
    # before the new rank starts.
    group = clients.WorkerGroup.launch(res, "engine", Engine, str(watch))
    try:
        server = group.execute_rank(0, "serve", True)
        other = group.execute_rank(1, "serve", True)
        watch.write_text(f"{server}")
        os.kill(group.execute_rank(0, "pid"), signal.SIGSTOP)
        assert group.repair(timeout=120, hung_after=3.0) == [0]
        assert group.execute_rank(0, "found_alive") == {server: False}
        assert not alive(server) and alive(other)
    finally:
        group.shutdown()


def test_shutdown_from_a_driver_that_attached_later_ends_every_ranks_server(res, watch):
    group = clients.WorkerGroup.launch(res, "engine", Engine, str(watch), detached=True)
    servers = [group.execute_rank(r, "serve", own) for r, own in ((0, True), (1, True))]
    attached = clients.WorkerGroup.attach(res, "engine")  # the tags follow from the names
    attached.shutdown()
    assert not any(alive(p) for p in servers)


def test_a_release_with_no_shutdown_ends_the_daemons_its_ranks_started(ctl):
    # Ray ends the workers with their groups, and a worker's own children (checked: a
    # child in a session of its own ended without placectl); a daemon it outlives by
    # 30 s and more unless the release ends it.
    res = ctl.reserve("released", CONFIG, timeout_s=60)
    other = ctl.reserve("kept", CONFIG, timeout_s=60)
    group = clients.WorkerGroup.launch(res, "engine", Engine, "/dev/null")
    kept = clients.WorkerGroup.launch(other, "engine", Engine, "/dev/null")
    daemons = [group.execute_rank(r, "daemon") for r in (0, 1)]
    theirs = kept.execute_rank(0, "daemon")
    try:
        assert all(alive(p) for p in [*daemons, theirs])
        assert ctl.release("released")
        assert [alive(p) for p in daemons] == [False, False]  # when release returns
        assert alive(theirs)  # another reservation's, on the same node
    finally:
        kept.shutdown()
        ctl.release("kept")
        for p in daemons:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
    assert not alive(theirs)
