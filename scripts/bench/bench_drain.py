#!/usr/bin/env python3
"""A drain with notice against a crash at the deadline, on a real training job.

Each trial runs the GRPO job of ``scripts/job/train.py`` on one local cluster twice with the
same seed: once with ``drain@N`` (Ray's PREEMPTION drain of trainer rank 0's node with a
``--notice`` deadline; placectl moves the slot to the spare, the job starts the moved
ranks' replacements beside the running ones and swaps them in at a step boundary), once
with ``crash@N`` (the node dies without a word, which is what a drain nobody acts on
becomes at its deadline). For each it reports the steps run again, the normal step, the
slowest step after the fault and the seconds lost (every step after the fault beyond
the normal one, recoveries included), and checks that both runs' per-step metrics equal
the first run's.

Usage: scripts/bench/bench_drain.py [--trials 2] [--steps 30] [--at 3] [--notice 30]
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


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--at", type=int, default=3)
    ap.add_argument("--notice", type=float, default=30.0)
    args = ap.parse_args()
    config = TrainConfig(steps=args.steps)
    out = tempfile.mkdtemp(prefix="placectl-bench-drain-")
    cluster = train.Cluster(None, None, args.notice)
    rows: dict[str, list[dict]] = {"drain": [], "crash": []}
    reference, unequal = None, []
    try:
        for trial in range(args.trials):
            kinds = ["drain", "crash"] if trial % 2 == 0 else ["crash", "drain"]
            for kind in kinds:
                name = f"{kind}-{trial}"
                record = train.run(cluster, name, config, [(kind, args.at)], False, out)
                rows[kind].append(report.lost_seconds(record, record["faults"][0]))
                if reference is None:
                    reference = record["steps"]
                else:
                    ok, verdict = report.compare(reference, record["steps"])
                    if not ok:
                        unequal.append(f"{name}: {verdict}")
    finally:
        cluster.close()
    print(
        f"\n== {args.trials} trials, {args.steps} steps, fault at step {args.at}, "
        f"notice {args.notice:g}s"
    )
    print(
        f"{'fault':<34} {'steps again':>11} {'normal step':>12} {'slowest after':>14} "
        f"{'seconds lost':>13}"
    )
    results = Results("drain", args)
    for kind in ("crash", "drain"):  # the crash is the baseline
        r = rows[kind]
        for key, unit in (("steps_run_again", "steps"), ("normal_step_s", "s")):
            results.add(f"{kind} {key}", [x[key] for x in r], unit=unit)
        results.add(f"{kind} slowest_after_s", [x["slowest_after_s"] for x in r])
        base = None if kind == "crash" else "crash lost_s"
        results.add(f"{kind} lost_s", [x["lost_s"] for x in r], baseline=base)
    for kind, what in (
        ("drain", "drain, placectl moves first"),
        ("crash", "crash at the deadline"),
    ):
        r = rows[kind]
        med = {k: statistics.median(x[k] for x in r) for k in r[0]}
        print(
            f"{what:<34} {med['steps_run_again']:>11g} {med['normal_step_s']:>11.2f}s "
            f"{med['slowest_after_s']:>13.2f}s {med['lost_s']:>12.2f}s  "
            f"(lost: {', '.join(format(x['lost_s'], '.2f') for x in r)})"
        )
    runs = 2 * args.trials
    print(
        f"metrics equal to the first run's: {runs - len(unequal)} of {runs} runs"
        + "".join(f"\n  UNEQUAL {u}" for u in unequal)
    )
    results.add("runs with metrics unequal to the first", [len(unequal)], unit="runs")
    results.write()
    return 1 if unequal else 0


if __name__ == "__main__":
    raise SystemExit(main())
