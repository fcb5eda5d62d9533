#!/usr/bin/env python3
"""Effective training time ratio (ETTR) of the GRPO job under one seeded fault schedule,
in each way of recovering, side by side on one local cluster.

The job is ``scripts/job/train.py``'s, with training and rollout on nodes of their own
(``--layout split``: four trainer ranks on two nodes, six rollout workers on three, a
head and seven GPU nodes of 2 fake GPUs, two free; a node lost is replaced by a fresh one
after the next step, as an operator's would be; ``--free-nodes`` adds nodes up and free
from the start, a warm pool's headroom). Every trainer and rollout rank takes
``--load-s`` seconds to start (a stand-in for a model's load). Faults are abrupt node
deaths (every process of the node killed at once), of trainer rank 0's node (``node``:
in the middle of a step, after its rollout) or of the last rollout rank's node
(``rollout``: while the step's rollout calls are out), about one per ``--every`` steps,
trainer and rollout nodes in turn, the steps (and which comes first) drawn from ``--seed``. Modes:

* ``restart``: what a job on Ray alone does: release, a new placement, every process
  started, the last checkpoint restored (the driver process itself is kept, which
  spares restart a driver's start).
* ``relaunch``: placectl's ``repair()`` relaunches the lost ranks where the reservation
  puts them; the others keep running and rejoin.
* ``standby``: two held spare nodes, one copying a trainer node (standby trainers) and
  one a rollout node (standby rollout workers), promoted in place of the lost ranks.
* ``degraded``: rollout runs short when it loses ranks (``on_loss: continue``): the
  others take the lost ranks' prompts and the step goes on; its standbys on the rollout
  spare are the replacements, promoted in the background and admitted at the weight
  push. Trainers have standbys on the other spare: a trainer rank lost stops every step.

In every mode a step's rollout outlives a failed attempt the driver survives: a trainer
node lost after the rollout costs its update again (``redone``), not its rollout (the
batch was sampled with the weights the recovery restores); ``rolled`` counts the steps
the rollout ranks sampled twice, by their own count.

ETTR is the time the steps would take without faults (the run's median step, times its
steps) over the wall time from the first step's start to the last one's end
(:func:`grpo.report.ettr`). Every mode's per-step metrics are checked equal to the
first mode's (``--reference`` runs a fault-free run first, for them all to equal):
recovering changes nothing the job computes.

The last line: ``ettr: restart <x> relaunch <y> standby <z> degraded <w> (faults <n>,
steps <m>)``. ``--quick`` runs a short schedule (10 steps of about 1.2 s, a fault each 5,
3 s starts) in under 10 minutes here.

Usage: scripts/bench/bench_ettr.py [--steps 100] [--every 20] [--load-s 10] [--seed 0]
                                   [--free-nodes 0]
                                   [--gpu-ms-per-token 200]
                                   [--modes restart,relaunch,standby,degraded] [--quick]
                                   [--reference]
"""

from __future__ import annotations

import pathlib
import random
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "job"))

import train
from grpo import report
from grpo.config import TrainConfig
from harness import Results, parser
from job_specs import SPLIT_GPU_NODES

MODES = ("restart", "relaunch", "standby", "degraded")
KINDS = ("node", "rollout")  # a trainer node, a rollout node: each dies abruptly


def schedule(steps: int, every: int, seed: int) -> list[tuple[str, int]]:
    """One fault per ``every`` steps, never in the first two (the job's first step is
    its slowest) nor the last: each at a step drawn within its window of ``every``
    steps; trainer and rollout nodes in turn, which first drawn; the same for a seed."""
    rng = random.Random(seed)
    turn = rng.randrange(len(KINDS))
    out = []
    for start in range(0, steps, every):
        low, high = max(start + 1, 3), min(start + every, steps - 1)
        if low <= high:
            out.append((KINDS[(turn + len(out)) % len(KINDS)], rng.randint(low, high)))
    return out


def run_mode(cluster, mode: str, config, faults, out, name: str | None = None) -> dict:
    """One run of the job recovering as ``mode`` says; its record."""
    spec = train.job_spec(config, "split", mode)
    return train.run(cluster, name or mode, config, faults, mode == "restart", out, spec=spec)


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--every", type=int, default=20, help="about one fault per this many steps")
    ap.add_argument("--load-s", type=float, default=10.0, help="each rank's start (a load)")
    ap.add_argument(
        "--gpu-ms-per-token",
        type=float,
        default=200.0,
        help="the simulated accelerator's decode time: a step of about 3.8 s",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--free-nodes",
        type=int,
        default=0,
        help="GPU nodes up and free beside the job's (and its spare): headroom a lost "
        "slot is placed on at once, as a cluster with a warm pool has",
    )
    ap.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    ap.add_argument("--quick", action="store_true", help="10 steps, a fault each 5, 3 s starts")
    ap.add_argument("--reference", action="store_true", help="a fault-free run first")
    args = ap.parse_args()
    if args.quick:  # under 10 minutes here: a launch per mode is most of it
        args.steps, args.every, args.load_s, args.gpu_ms_per_token = 10, 5, 3.0, 50.0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        raise SystemExit(f"--modes {args.modes!r}: a list of {', '.join(MODES)}")
    if args.steps < 6 or args.every < 3:
        raise SystemExit("--steps >= 6 and --every >= 3")
    if not 0 <= args.free_nodes <= 4:
        raise SystemExit(f"--free-nodes {args.free_nodes}: 0 to 4 (each is a node of 2 GPUs)")
    faults = schedule(args.steps, args.every, args.seed)
    config = TrainConfig(
        seed=args.seed,
        steps=args.steps,
        gpu_ms_per_token=args.gpu_ms_per_token,
        load_s=args.load_s,
    )
    out = tempfile.mkdtemp(prefix="placectl-bench-ettr-")
    started = time.time()
    cluster = train.Cluster(None, gpu_nodes=SPLIT_GPU_NODES + args.free_nodes)
    records = {}
    try:
        if args.reference:
            records["fault-free"] = run_mode(cluster, "relaunch", config, [], out, "reference")
        for mode in modes:
            records[mode] = run_mode(cluster, mode, config, faults, out)
    finally:
        cluster.close()
    figures = {m: report.ettr(r) for m, r in records.items()}
    runs = list(records)
    first = records[runs[0]]["steps"]
    unequal = [
        f"{m}: {why}"
        for m in runs[1:]
        for ok, why in [report.compare(first, records[m]["steps"])]
        if not ok
    ]
    print(
        f"\n== ETTR: {args.steps} steps, faults {faults} (seed {args.seed}), starts "
        f"{args.load_s:g}s, {args.free_nodes} free node(s); {time.time() - started:.0f}s in all"
    )
    print(
        f"{'mode':<10} {'ettr':>6} {'wall':>8} {'step':>6} {'redone':>6} {'rolled':>6}  "
        "to the next step"
    )
    results = Results("ettr", args)
    for m in runs:
        f = figures[m]
        nxt = ", ".join(
            f"{kind} {s:.1f}s" for (kind, _), s in zip(faults, f["to_next_step_s"], strict=False)
        )
        print(
            f"{m:<10} {f['ettr']:6.3f} {f['wall_s']:7.1f}s {f['step_s']:5.2f}s "
            f"{f['redone']:>6} {len(f['rolled_again'] or []):>6}  {nxt}"
        )
        results.add(
            f"ettr, {m}",
            [f["ettr"]],
            unit="ratio",
            steps_redone=f["redone_steps"],
            rolled_again=f["rolled_again"],
            faults=faults,
        )
        if f["to_next_step_s"]:
            results.add(f"to the next step after a fault, {m}", f["to_next_step_s"])
    print(
        f"metrics equal to {runs[0]}'s: {len(runs) - 1 - len(unequal)} of {len(runs) - 1}"
        + "".join(f"\n  UNEQUAL {u}" for u in unequal)
    )
    results.add("modes with metrics unequal to the first", [len(unequal)], unit="runs")
    results.write()
    line = " ".join(f"{m} {figures[m]['ettr']:.3f}" for m in modes)
    print(f"ettr: {line} (faults {len(faults)}, steps {args.steps})")
    return 1 if unequal else 0


if __name__ == "__main__":
    raise SystemExit(main())
