"""What an operator of a shared cluster reads, on a real local cluster: Ray's own
Prometheus export holds every documented metric with its labels after a reservation is
queued, admitted, preempted, loses a node abruptly and is repaired; `placectl events`
tells the same story (whose token acted, the cause); every command's `-o json` parses and
exit codes are as documented; `--name` reaches another controller."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import urllib.request

import pytest
import ray
import yaml

import clients
from clients.testing.local import local_cluster
from controller.runtime.edge.metrics import METRICS, exported
from tests.integration.conftest import GPUS_PER_NODE, wait_for
from tests.integration.conftest import placectl_cli as cli

# Alone: beside another lane's busy cluster (load 15 on 2 cores), its cluster was once
# counted two nodes alive of three for two minutes after the first test's abrupt node
# loss and repair (the next reserve timed out waiting for nodes): not explained yet, not
# seen alone (2 of 2 runs passed there).
pytestmark = pytest.mark.alone

OPERATOR = "operator-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def metrics_cluster():
    """Head (no GPUs) exporting metrics every second on a known port + two GPU nodes."""
    port = _free_port()
    head = {
        "num_cpus": 2,
        "num_gpus": 0,
        "metrics_export_port": port,
        "_system_config": {"metrics_report_interval_ms": 1000},
    }
    with local_cluster(2, gpus=GPUS_PER_NODE, head=head) as (c, _):
        yield c, port


@pytest.fixture(autouse=True)
def _released(metrics_cluster):
    """Each test starts on an empty cluster, whatever the one before it left."""
    yield
    clients.connect().release_all(force=True)


def _scrape(port: int) -> dict[str, list[dict[str, str]]]:
    """Each sample name of Ray's Prometheus export -> the label sets it has."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found: dict[str, list[dict[str, str]]] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? ", line)
        if m and not line.startswith("#"):
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            found.setdefault(m.group(1), []).append(labels)
    return found


def spec(placement: str) -> dict:
    return {"num_nodes": 3, "component_placement": {"actor": placement}}


def test_an_operator_sees_the_queue_preemption_and_an_abrupt_repair(metrics_cluster):
    cluster, port = metrics_cluster
    ctl = clients.connect()
    ctl.set_operator(OPERATOR)
    os.environ["PLACECTL_OPERATOR_TOKEN"] = OPERATOR
    try:
        ctl.set_quota("research", GPU=8)
    finally:
        del os.environ["PLACECTL_OPERATOR_TOKEN"]
    low = ctl.reserve(
        "low", spec("0-7"), timeout_s=120, queue="research", preemptible=True, preempt_grace_s=1
    )
    assert low.info.state == "ready"
    got = {}

    def vip():
        got["vip"] = ctl.reserve("vip", spec("0-3"), timeout_s=120, queue="prod", priority=5)

    thread = threading.Thread(target=vip, daemon=True)
    thread.start()
    thread.join(120)
    assert got["vip"].info.state == "ready"
    assert "low" not in [i.job for i in ctl.list()]  # taken back at its deadline

    # A spare joins; vip's node dies without a word; the controller repairs on the spare.
    cluster.add_node(num_cpus=GPUS_PER_NODE, num_gpus=GPUS_PER_NODE)
    cluster.wait_for_nodes()
    lost = got["vip"].info.slots[0].node_id
    cluster.remove_node(next(n for n in cluster.list_all_nodes() if n.node_id == lost), False)
    wait_for(lambda: (i := ctl.status("vip")).state == "ready" and i.epoch > 1, timeout=120)
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert {s.node_id for s in ctl.status("vip").slots} <= alive  # Ray's node table

    told = [(e.job, e.kind) for e in ctl.events()]
    for expected in [
        ("", "operator"),
        ("", "quota"),
        ("low", "admitted"),
        ("low", "preempted"),
        ("low", "released"),
        ("vip", "admitted"),
        ("vip", "degraded"),
        ("vip", "repaired"),
    ]:
        assert expected in told, (expected, told)
    repaired = next(e for e in ctl.events("vip") if e.kind == "repaired")
    assert repaired.cause == "node-lost" and repaired.by == "controller" and repaired.seconds > 0

    wanted = {
        "placectl_reservations": {"state": "ready"},
        "placectl_reserved_accelerators": {"queue": "prod"},
        "placectl_queue_depth": {"queue": "prod"},
        "placectl_queue_oldest_wait_seconds": {"queue": "prod"},
        "placectl_admission_wait_seconds": {"queue": "research"},
        "placectl_repairs": {"cause": "node-lost"},
        "placectl_repair_seconds": {"cause": "node-lost"},
        "placectl_degraded_seconds": {"queue": "prod"},
        "placectl_preemptions": {"queue": "research"},
        "placectl_quota_limit": {"queue": "research", "resource": "GPU"},
        "placectl_quota_used": {"queue": "research", "resource": "GPU"},
        "placectl_reserve_latency_seconds": {},
        "placectl_fences": {"outcome": "fenced"},  # vip's node, killed without a word
        "placectl_table_readable": {},  # what the controller-down alert watches
    }
    assert set(wanted) | {"placectl_drain_moves"} == set(METRICS)  # drains: test_drains

    def missing() -> list[str]:
        found = _scrape(port)
        out = []
        for name, labels in wanted.items():
            sample = exported(name) + ("_count" if METRICS[name][0] == "histogram" else "")
            if not any(labels.items() <= s.items() for s in found.get(sample, [])):
                out.append(f"{sample}{labels}")
        return out

    wait_for(lambda: not missing(), timeout=60, interval=1.0)
    ctl.release_all(force=True)


def test_every_command_prints_json_and_exits_as_documented(metrics_cluster, tmp_path):
    cluster, _ = metrics_cluster
    address = cluster.address
    config = str(tmp_path / "job.yaml")
    with open(config, "w") as f:
        yaml.safe_dump({"cluster": {"num_nodes": 3, "component_placement": {"actor": "0-1"}}}, f)
    env = {"PLACECTL_TOKEN": "cli-owner"}
    for args, check in [
        (("reserve", "clijob", config), lambda d: d["state"] == "ready"),
        (("status",), lambda d: "clijob" in [i["job"] for i in d]),
        (("status", "clijob"), lambda d: len(d["assignments"]["actor"]) == 2),
        (("queue",), lambda d: d == []),
        (("quota",), lambda d: any(u["queue"] == "" and u["accelerators"] >= 2 for u in d)),
        (("events", "clijob"), lambda d: [e["kind"] for e in d] == ["reserved"]),
        (("repair", "clijob"), lambda d: d["job"] == "clijob"),
        (("release", "clijob"), lambda d: d == {"released": ["clijob"]}),
    ]:
        out = cli(address, *args, "-o", "json", env=env)
        assert out.returncode == 0, (args, out.stderr)
        assert check(json.loads(out.stdout)), (args, out.stdout)
    as_yaml = cli(address, "events", "clijob", "-o", "yaml")
    kinds = [e["kind"] for e in yaml.safe_load(as_yaml.stdout)]
    assert kinds == ["reserved", "releasing", "released"]
    by = {e["by"] for e in yaml.safe_load(as_yaml.stdout)}
    assert len(by) == 1 and by.pop().startswith("client ")  # the CLI's token, not anyone

    for args, code, words in [
        (("release", "--all"), 2, "add --force"),
        (("status", "nosuch"), 3, "no reservation named 'nosuch'"),
        # refused whether an operator token is set or not: the message names its variable
        (("quota", "research", "GPU=1"), 4, "PLACECTL_OPERATOR_TOKEN"),
        (("--name", "elsewhere", "status"), 3, "no placectl controller named 'elsewhere'"),
    ]:
        out = cli(address, *args)
        assert out.returncode == code and words in out.stderr, (args, out.returncode, out.stderr)

    other = cli(address, "--name", "other", "start", "-o", "json")
    assert other.returncode == 0 and json.loads(other.stdout)["controller"] == "other"
    listed = cli(address, "--name", "other", "status", "-o", "json")
    assert json.loads(listed.stdout) == []
    assert cli(address, "--name", "other", "stop").returncode == 0


class Pid:
    def pid(self) -> int:
        return os.getpid()


def test_the_upgrade_procedure_keeps_reservations_workers_history_and_quotas(metrics_cluster):
    """docs/operations/upgrades.md, steps 2 and 3, as written: `placectl stop`, then
    `placectl start` over the same table (the same version here: the table's migration
    from an older format is test_lifecycle's)."""
    cluster, _ = metrics_cluster
    ctl = clients.connect()
    ctl.set_quota("kept-queue", force=True, GPU=4)
    res = ctl.reserve("kept", spec("0-1"), timeout_s=120)
    group = clients.WorkerGroup.launch(res, "actor", Pid)
    pids = group.execute("pid")
    seqs = [e.seq for e in ctl.events()]
    assert cli(cluster.address, "stop").returncode == 0

    def gone() -> bool:
        try:
            ray.get_actor("placectl", namespace="placectl")
            return False
        except ValueError:
            return True

    wait_for(gone, timeout=60)
    started = cli(cluster.address, "start")
    assert started.returncode == 0, started.stderr
    after = ctl.status("kept")
    assert (after.state, after.uid, after.epoch) == ("ready", res.info.uid, res.info.epoch)
    table = ray.util.placement_group_table()
    assert {table[s.group_id]["state"] for s in after.slots} == {"CREATED"}  # Ray's table
    assert group.execute("pid") == pids  # the same worker processes, untouched
    assert [e.seq for e in ctl.events()][: len(seqs)] == seqs  # the history, all of it
    assert ctl.quotas()["kept-queue"] == {"GPU": 4.0}
    ctl.release("kept")
    assert ctl.events("kept")[-1].seq > seqs[-1]  # numbered on after the restart


def test_status_names_a_group_that_waits_outside_every_reservation(metrics_cluster):
    """An engine started outside placectl asks Ray for GPUs the reservations hold (vLLM's
    Ray executor makes a group of its own, as here); `placectl status` says so, with
    Ray's reason, until the group goes."""
    from ray.util.placement_group import (
        placement_group,
        placement_group_table,
        remove_placement_group,
    )

    cluster, _ = metrics_cluster
    ctl = clients.connect()
    ctl.reserve("holder", spec("0-7"), timeout_s=120)
    engine = placement_group([{"GPU": 1, "CPU": 1}] * 2, name="vllm-outside")
    try:
        gid = engine.id.hex()
        wait_for(lambda: placement_group_table(engine)["stats"]["scheduling_attempt"] > 0)
        assert placement_group_table(engine)["state"] == "PENDING"  # per Ray: it waits
        shown = cli(cluster.address, "status")
        assert shown.returncode == 0, shown.stderr
        (line,) = [x for x in shown.stderr.splitlines() if "waits outside" in x]
        assert f"'vllm-outside' ({gid[:8]})" in line and "2 GPU" in line, line
        why = placement_group_table(engine)["stats"]["scheduling_state"]
        assert f"Ray: PENDING, {why}" in line, line
        total = ray.cluster_resources()["GPU"]
        assert f"reservations hold 8 of {total:g} GPU" in line, line
    finally:
        remove_placement_group(engine)
    shown = cli(cluster.address, "status")
    assert "waits outside" not in shown.stderr and "holder" in shown.stdout
    ctl.release("holder")
