"""The standby case of ``scripts/gpu_check``: a standby promoted on a real GPU works on
the device its bundle holds.

Two Ray nodes on this one machine, each given one GPU (Ray numbers it 0 on both, so on a
machine of one GPU both are that device, as two hosts' GPU 0 would be): the job's one
rank on the first, a held spare (``cluster.spares: 1``) on the second, where the group
starts a standby (``standby: true``). Checked:

1. the standby runs on its bundle's device (the UUID placectl's probe read with
   nvidia-smi) and has no rank (``RANK`` unset, ``PLACECTL_STANDBY=1``);
2. the job's node dies abruptly (every process of it killed, Ray not told) and
   ``repair()`` promotes the standby: the same process is rank 0, not a new one;
3. promoted, its environment is the rank's (``RANK=0``, ``PLACECTL_STANDBY`` gone), and
   ``torch.cuda.set_device(LOCAL_RANK)`` and an allocation there land on the device the
   rank's assignment names.
"""

from __future__ import annotations

import time

JOB = "gpu-check-standby"
CONF = {
    "num_nodes": 2,  # the head and the job's node; the spare is held besides
    "spares": 1,
    "component_placement": {"actor": {"placement": "0", "standby": True}},
}


def _until(what: str, get, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = get()
        if got:
            return got
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def run(probe, check, info, same_uuid) -> None:
    """The case, on a local cluster of its own (``ray`` must not be initialised)."""
    import ray
    from ray.cluster_utils import Cluster

    import clients

    cluster = Cluster(
        initialize_head=True, connect=True, head_node_args={"num_cpus": 2, "num_gpus": 0}
    )
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=2, num_gpus=1)
        cluster.wait_for_nodes()
        ctl = clients.connect()
        res = ctl.reserve(JOB, CONF, timeout_s=120)
        group = None
        try:
            job_node = res.refresh().slots[0].node_id
            (spare,) = _until("a held spare", lambda: res.refresh().spares)
            (standing,) = res.standbys("actor")  # what the standby starts with
            held_uuid = standing.device_uuids[0] if standing.device_uuids else ""
            info("standby case", f"job node {job_node[:12]}, spare {spare.node_id[:12]}")
            group = clients.WorkerGroup.launch(res, "actor", probe, detached=True)

            def standby() -> dict | None:
                group.refill_standbys()
                found = ray.get([s.report.remote() for s in group.standbys], timeout=120)
                return found[0] if len(found) == 1 else None

            before = _until("a standby on the spare", standby)
            check(
                "standby: on its bundle's device, with no rank",
                not before["error"]
                and bool(held_uuid)
                and same_uuid(before["uuid"], held_uuid)
                and before["rank"] is None
                and before["standby"] == "1",
                before["error"]
                or f"torch {before['uuid']}, spare's bundle {held_uuid}, RANK {before['rank']}",
            )
            (node,) = [n for n in cluster.list_all_nodes() if n.node_id == job_node]
            cluster.remove_node(node, allow_graceful=False)
            started = time.monotonic()
            relaunched = group.repair(timeout=120)
            took = time.monotonic() - started
            after = ray.get(group.actors[0].report.remote(), timeout=60)
            check(
                "repair() after an abrupt node loss promotes the standby",
                relaunched == [0] and after["pid"] == before["pid"] and after["promoted"],
                f"relaunched {relaunched} in {took:.1f} s, pid {before['pid']} -> {after['pid']}",
            )
            (assignment,) = res.assignments("actor")
            wanted = assignment.device_uuids[0] if assignment.device_uuids else ""
            check(
                "promoted: the rank's environment, set_device(LOCAL_RANK) and an allocation "
                "on the assignment's device",
                not after["error"]
                and after["rank"] == "0"
                and after["standby"] is None
                and bool(wanted)
                and same_uuid(after["uuid"], wanted),
                after["error"]
                or f"RANK {after['rank']}, LOCAL_RANK {after['local_rank']}, torch "
                f"{after['uuid']}, assignment {wanted}",
            )
        finally:
            if group is not None:
                group.shutdown()
            ctl.release(JOB)
    finally:
        ray.shutdown()
        cluster.shutdown()
