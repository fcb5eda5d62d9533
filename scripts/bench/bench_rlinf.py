#!/usr/bin/env python
"""RLinf's own Cluster against placectl's ReservedCluster: same workers, one run.

Starts a local cluster (head and one node, 4 fake GPUs each; RLinf's probe sees them
through tests/integration/rlinf_site), then per trial runs the driver of
tests/integration/rlinf_driver.py three times on RLinf's libero DAgger block (12 RLinf
workers: actor on node 0, env and rollout sharing node 1):

* ``rlinf``: RLinf's own ``Cluster`` and ``ComponentPlacement`` (no reservation);
* ``placectl``: a ``ReservedCluster`` that reserves first;
* ``restart``: a new driver on the kept reservation (what a driver restart costs).

Each row is the driver's own clock: cluster up, and cluster up plus every group
launched and answering. The reservation is released after each trial, so RLinf's own
workers (which ask Ray for a CPU each) find the CPUs free.

Usage: scripts/bench/bench_rlinf.py [--trials N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "integration" / "rlinf_driver.py"
CONFIG = REPO / "tests" / "integration" / "data" / "rlinf_libero_dagger.yaml"


def run(address: str, out: Path, own: bool) -> dict:
    args = [sys.executable, str(DRIVER), "bench-rlinf", str(CONFIG), str(out)]
    if own:
        args.append("--own")
    p = subprocess.run(
        args,
        env=dict(os.environ, RAY_ADDRESS=address),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if p.returncode != 0:
        sys.exit(f"driver failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return json.loads(out.read_text())["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=2)
    args = ap.parse_args()
    os.environ["PLACECTL_FAKE_NVML"] = "1"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "tests" / "integration" / "rlinf_site"), str(REPO)]
    )
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    sys.path[:0] = [str(REPO)]
    import ray
    from ray.cluster_utils import Cluster

    import clients

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 8, "num_gpus": 4})
    c.add_node(num_cpus=4, num_gpus=4)
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
    ctl = clients.connect()
    rows: dict[str, list[dict]] = {"rlinf": [], "placectl": [], "restart": []}
    with tempfile.TemporaryDirectory() as tmp:
        for t in range(args.trials):
            rows["rlinf"].append(run(c.address, Path(tmp) / f"own{t}.json", own=True))
            rows["placectl"].append(run(c.address, Path(tmp) / f"pc{t}.json", own=False))
            rows["restart"].append(run(c.address, Path(tmp) / f"re{t}.json", own=False))
            ctl.release("bench-rlinf")
            print(f"trial {t + 1}/{args.trials} done", file=sys.stderr, flush=True)
    base = statistics.median(r["launch"] for r in rows["rlinf"])
    print(f"{'driver':10} {'cluster up s':>14} {'all launched s':>16} {'vs RLinf':>9}")
    for name, rs in rows.items():
        cl = statistics.median(r["cluster"] for r in rs)
        la = statistics.median(r["launch"] for r in rs)
        samples = ", ".join(f"{r['launch']:.1f}" for r in rs)
        print(f"{name:10} {cl:14.2f} {la:16.2f} {la / base:8.2f}x   ({samples})")
    ray.shutdown()
    c.shutdown()


if __name__ == "__main__":
    main()
