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

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import Results, local_cluster, parser

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
    ap = parser(__doc__)
    ap.add_argument("--trials", type=int, default=2)
    args = ap.parse_args()
    results = Results("rlinf", args)
    env = {
        "PLACECTL_FAKE_NVML": "1",
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "tests" / "integration" / "rlinf_site"), str(REPO)]
        ),
    }
    os.environ.update(env)  # for the drivers this script starts
    sys.path[:0] = [str(REPO)]
    import clients

    head = {"num_cpus": 8, "num_gpus": 4}
    rows: dict[str, list[dict]] = {"rlinf": [], "placectl": [], "restart": []}
    with local_cluster(1, head=head, env=env, log_level="ERROR") as (c, _):
        ctl = clients.connect()
        with tempfile.TemporaryDirectory() as tmp:
            for t in range(args.trials):
                rows["rlinf"].append(run(c.address, Path(tmp) / f"own{t}.json", own=True))
                rows["placectl"].append(run(c.address, Path(tmp) / f"pc{t}.json", own=False))
                rows["restart"].append(run(c.address, Path(tmp) / f"re{t}.json", own=False))
                ctl.release("bench-rlinf")
                print(f"trial {t + 1}/{args.trials} done", file=sys.stderr, flush=True)
    for name, rs in rows.items():
        results.add(f"{name} cluster up", [r["cluster"] for r in rs])
        baseline = None if name == "rlinf" else "rlinf launch"
        results.add(f"{name} launch", [r["launch"] for r in rs], baseline=baseline)
    base = statistics.median(r["launch"] for r in rows["rlinf"])
    print(f"{'driver':10} {'cluster up s':>14} {'all launched s':>16} {'vs RLinf':>9}")
    for name, rs in rows.items():
        cl = statistics.median(r["cluster"] for r in rs)
        la = statistics.median(r["launch"] for r in rs)
        samples = ", ".join(f"{r['launch']:.1f}" for r in rs)
        print(f"{name:10} {cl:14.2f} {la:16.2f} {la / base:8.2f}x   ({samples})")
    results.write()


if __name__ == "__main__":
    main()
