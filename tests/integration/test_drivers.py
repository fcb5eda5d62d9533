"""What a driver and its processes meet on a real local cluster: two drivers starting the
controller at once, a caller's Ray settings left alone, a process seeing its node's GPUs
and reading its own assignment back, a dry run planned on the running cluster, and the
CLI's exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import ray

import clients
from controller import PlacementError
from controller.errors import ReservationTimeout
from controller.state.scheduling import group_handle
from tests.integration.conftest import one_node


def test_two_drivers_starting_the_controller_at_once_get_one(cluster):
    script = textwrap.dedent(
        f"""
        import ray, clients
        ray.init(address={cluster.address!r}, logging_level="ERROR", log_to_driver=False)
        print(clients.connect(name="placectl-race").check_alive())
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    answers = {p.communicate(timeout=120)[0].strip().splitlines()[-1] for p in procs}
    assert len(answers) == 1  # both talked to the same incarnation of one actor
    named = [
        a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"] == "placectl-race"
    ]
    assert len(named) == 1
    ray.kill(ray.get_actor("placectl-race", namespace="placectl"), no_restart=True)


def test_connect_leaves_the_callers_ray_settings_alone(cluster, ctl):
    """A driver in its own namespace, with worker logs on (Ray's default), connects and
    uses a reservation: its namespace and its logs are as it set them."""
    ctl.reserve("manners", one_node("0-1"), 120)
    script = textwrap.dedent(
        f"""
        import io, sys, time
        import ray, clients

        class Tee(io.TextIOBase):  # Ray prints worker logs to sys.stdout as it is then
            def __init__(self, inner):
                self.inner, self.seen = inner, []
            def write(self, text):
                self.seen.append(text)
                return self.inner.write(text)
            def flush(self):
                self.inner.flush()

        sys.stdout = tee = Tee(sys.stdout)
        ray.init(address={cluster.address!r}, namespace="team-a", logging_level="ERROR")
        ctl = clients.connect()
        res = ctl.reservation("manners")
        print("namespace", ray.get_runtime_context().namespace, len(res.assignments("actor")))

        @ray.remote(num_cpus=0)
        def hello():
            print("hello-from-a-worker", flush=True)

        ray.get(hello.remote())
        deadline = time.monotonic() + 60  # worker logs reach the driver asynchronously
        while "hello-from-a-worker" not in "".join(tee.seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert "namespace team-a 2" in out.stdout
    assert "hello-from-a-worker" in out.stdout


@ray.remote(num_cpus=0, max_calls=0)
def _bundle_gpus():
    return sorted(int(i) for i in ray.get_runtime_context().get_accelerator_ids()["GPU"])


@ray.remote
class _Seer:
    def visible(self):
        import os

        return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_a_node_process_sees_its_nodes_gpus_and_the_job_holds_them(ctl):
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    conf = {
        "num_nodes": 3,
        "node_groups": [{"label": "n2", "node_ranks": 2, "ignore_hardware": True}],
        "component_placement": {"svc": {"node_group": "n2", "placement": "0"}},
    }
    res = ctl.reserve("seer", conf, timeout_s=60)
    (a,) = res.assignments("svc")
    seer = _Seer.options(**a.actor_options()).remote()
    (slot,) = res.info.slots
    # Ray's own ids of the node's accelerators, probed in the job's bundles
    ids = [
        ray.get(
            _bundle_gpus.options(
                num_gpus=0.0001,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    group_handle(slot.group_id), placement_group_bundle_index=i
                ),
            ).remote()
        )[0]
        for i in range(len(slot.accelerators))
    ]
    assert len(ids) == 4
    assert [int(d) for d in ray.get(seer.visible.remote()).split(",")] == sorted(ids)
    assert a.num_gpus == 0 and a.placement.local_gpu_id == -1
    # nothing the process is shown can be taken by another job
    with pytest.raises(ReservationTimeout, match=r"free CPU .*GPU 0"):
        ctl.reserve("thief", one_node("4-4"), timeout_s=2, progress=lambda m: None)
    ray.kill(seer)


@ray.remote(num_cpus=0)
class _Reader:
    def mine(self):
        import os

        a = clients.current(strict=True)  # read back from the table, as a worker does
        return a.placement.component, a.placement.rank, os.environ["PLACECTL_CONTROLLER"]


def test_a_process_started_from_its_assignment_alone_reads_itself_back(cluster):
    """``Actor.options(**a.actor_options())``, the one path from an assignment to Ray's
    options, names the controller the assignment came from, as a worker group does: a
    second controller's worker finds its own table, not the default one's."""
    second = clients.connect(name="placectl-second")
    try:
        res = second.reserve("bare", one_node("0-1"), timeout_s=60)
        (a,) = res.assignments("actor")[1:]
        reader = _Reader.options(**a.actor_options()).remote()
        assert ray.get(reader.mine.remote(), timeout=60) == ("actor", 1, "placectl-second")
        ray.kill(reader)
    finally:
        second.release_all()
        second.stop()


def plan_on(cluster, config, *args: str) -> subprocess.CompletedProcess:
    """`placectl plan CONFIG ARGS` on a machine of the running ``cluster``."""
    return subprocess.run(
        [sys.executable, "-m", "clients.cli", "plan", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_ADDRESS": cluster.address},
        check=False,
    )


def test_plan_without_gpus_per_node_plans_on_the_running_cluster(cluster, tmp_path):
    """`placectl plan CONFIG` on a machine of a running cluster takes the nodes Ray
    reports (it failed with an ImportError once a helper moved)."""
    config = tmp_path / "conf.yaml"
    config.write_text("cluster:\n  num_nodes: 3\n  component_placement:\n    actor: 0-7\n")
    done = plan_on(cluster, config, "--json")
    assert done.returncode == 0, done.stderr
    placed = json.loads(done.stdout)["components"]["actor"]
    gpus = {n["NodeID"]: n["Resources"].get("GPU", 0) for n in ray.nodes() if n["Alive"]}
    on = [p["node_id"] for p in placed]
    assert set(on) == {n for n, g in gpus.items() if g}  # the GPU nodes Ray reports
    for node in set(on):
        assert on.count(node) == gpus[node]  # one rank per GPU Ray counts there


def test_plan_with_nodes_plans_for_that_many_whatever_cluster_is_up(cluster, tmp_path):
    """`--nodes N` is the plan's node count even with a smaller cluster up: the running
    cluster's nodes, then more shaped like its last, and a word that it could not hold
    the plan (it used to take the running cluster whole and refuse)."""
    config = tmp_path / "conf.yaml"
    config.write_text("cluster:\n  num_nodes: 5\n  component_placement:\n    actor: 0-15\n")
    done = plan_on(cluster, config, "--nodes", "5", "-o", "json")
    assert done.returncode == 0, done.stderr
    placed = json.loads(done.stdout)["components"]["actor"]
    alive = [n for n in ray.nodes() if n["Alive"]]
    gpus_last = max(n["Resources"].get("GPU", 0) for n in alive)
    assert len(placed) == 16
    assert {p["node_rank"] for p in placed} == {1, 2, 3, 4}  # the head has no GPU
    assert all(sum(p["node_rank"] == r for p in placed) == gpus_last for r in (1, 2, 3, 4))
    assert "could not hold this plan" in done.stderr


def test_the_cli_exit_codes_tell_not_found_conflict_and_timeout_apart(cluster, ctl, tmp_path):
    from tests.integration.conftest import placectl_cli

    assert placectl_cli(cluster.address, "status", "no-such-job").returncode == 3
    ctl.reserve("codes", one_node("0-1"), timeout_s=60)
    other = tmp_path / "other.yaml"
    other.write_text("cluster:\n  num_nodes: 3\n  component_placement:\n    actor: 0-3\n")
    assert placectl_cli(cluster.address, "reserve", "codes", str(other)).returncode == 4
    huge = tmp_path / "huge.yaml"  # more nodes than the cluster has: it waits, then times out
    huge.write_text("cluster:\n  num_nodes: 9\n  component_placement:\n    actor: 0-3\n")
    done = placectl_cli(cluster.address, "reserve", "huge", str(huge), "--timeout", "2")
    assert done.returncode == 5, done.stderr
    assert placectl_cli(cluster.address, "release", "codes").returncode == 0


def test_start_set_reaches_the_controller_it_starts_and_a_bad_value_starts_nothing(cluster):
    from tests.integration.conftest import placectl_cli

    named = ("--name", "with-settings")
    bad = placectl_cli(cluster.address, *named, "start", "--set", "suspect_after=soon")
    assert bad.returncode == 2, bad.stderr
    assert "PLACECTL_SUSPECT_AFTER='soon': expected a number of seconds > 0" in bad.stderr
    with pytest.raises(ValueError):  # nothing was started
        ray.get_actor("with-settings", namespace="placectl")
    args = ("start", "--set", "suspect_after=3", "--set", "events_kept=50", "-o", "json")
    done = placectl_cli(cluster.address, *named, *args)
    try:
        assert done.returncode == 0, done.stderr
        # what the running controller reports of itself, read from its health (a test
        # cluster's processes all have PLACECTL_TEST_HOOKS=1: that one is the cluster's)
        settings = json.loads(done.stdout)["settings"]
        assert settings == {"suspect_after": 3.0, "events_kept": 50, "test_hooks": True}
    finally:
        placectl_cli(cluster.address, *named, "stop")


class _Idle:
    def ping(self) -> int:
        return 1


def test_current_outside_a_worker_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("PLACECTL_JOB", raising=False)
    with pytest.raises(PlacementError, match="not a placectl worker"):
        clients.current()


def test_launch_timeout_kills_what_it_started(ctl):
    hog = ctl.reserve("hog", one_node("6-7"), timeout_s=30)
    first = clients.WorkerGroup.launch(hog, "actor", _Idle)  # whole GPUs: nothing left
    started = time.monotonic()
    with pytest.raises(clients.ReservationTimeout, match=r"ranks \[0, 1\] did not start"):
        clients.WorkerGroup.launch(hog, "actor", _Idle, timeout=2)
    assert time.monotonic() - started < 30
    first.shutdown()
    ctl.release("hog")
