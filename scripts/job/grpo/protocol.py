"""What ``train.py`` and a driver of the GRPO job say to each other: the driver's options
(one JSON argument), ``@step``/``@event``/``@fault`` lines on the driver's stdout, and one
line back on its stdin once a fault it asked for is done."""

from __future__ import annotations

import json
import sys

import msgspec

from grpo.config import TrainConfig

# Faults of a machine or a process, injected by train.py in the middle of a step; a drain
# (a spot notice with a deadline) and a spot reclaim (SIGTERM to the node) announce the
# node's end instead of failing it.
MACHINE_FAULTS = ("node", "crash", "raylet", "hang", "oom", "stall", "drain", "spot", "rollout")


class Options(msgspec.Struct, frozen=True, kw_only=True):
    """What one driver process is told by ``train.py``."""

    address: str
    job: str
    spec: dict  # the cluster block
    config: TrainConfig
    checkpoints: str
    faults: list[tuple[str, int]] = []  # (kind, step) still to happen in this run
    resume: bool = False  # a new driver of a running job
    baseline: bool = False


def send(tag: str, **data) -> None:
    print(f"@{tag} {json.dumps(data)}", flush=True)


def fault(kind: str, step: int, **where) -> dict:
    """Ask ``train.py`` to inject a fault now; returns its reply once done."""
    send("fault", kind=kind, step=step, **where)
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("train.py went away")
    return json.loads(line)
