"""A real GRPO job (scripts/train.py) through a node loss, a driver crash, a controller
kill and a grow, against a fault-free run of the same seed. The training math is the
oracle: its rewards and losses do not care what placectl believes."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 7


def test_a_faulted_run_ends_equal_to_a_fault_free_run(tmp_path):
    records = tmp_path / "runs.json"
    picture = tmp_path / "reward.png"
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "train.py"),
        f"--steps={STEPS}",
        "--faults=node@2,driver@4,controller@5,grow@6",
        "--compare",
        f"--json={records}",
        f"--plot={picture}",
        f"--out={tmp_path}",
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    runs = json.loads(records.read_text())["runs"]
    reference, faulted = runs["fault-free"]["steps"], runs["placectl"]["steps"]

    assert [m["step"] for m in faulted] == [m["step"] for m in reference] == list(range(1, 8))
    for a, b in zip(reference, faulted, strict=True):
        assert (a["reward"], a["exact"]) == (b["reward"], b["exact"]), a["step"]
        assert abs(a["loss"] - b["loss"]) <= 1e-6, a["step"]
    assert reference[-1]["reward"] > reference[0]["reward"]  # it learns

    kinds = [e["kind"] for e in runs["placectl"]["events"]]
    assert kinds == ["launched", "repaired", "attached", "grew"], kinds
    events = {e["kind"]: e for e in runs["placectl"]["events"]}
    # One repair, the instant the step failed: the lost node held trainer rank 0 and
    # rollout rank 0, and exactly those came back.
    assert events["repaired"]["relaunched"] == {"actor": [0], "rollout": [0]}
    assert events["repaired"]["epoch"] == 2
    # The new driver found every worker alive: nothing relaunched.
    assert events["attached"]["relaunched"] == {}
    assert events["grew"]["rollout"] == 8 and events["grew"]["started"] == [4, 5, 6, 7]
    assert events["grew"]["trainers_kept"] == 4
    assert [m["epoch"] for m in faulted] == [1, 2, 2, 2, 2, 3, 3]
    assert [m["rollout_workers"] for m in faulted] == [4] * 5 + [8] * 2
    assert sorted(f["kind"] for f in runs["placectl"]["faults"]) == [
        "controller",
        "driver",
        "grow",
        "node",
    ]
    assert picture.stat().st_size > 10_000
