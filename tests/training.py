"""The GRPO job (``scripts/job/train.py``) run as a test runs it: a faulted run against a
fault-free run of the same seed, compared step by step."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def quiet(text: str) -> str:
    """Output without the state dumps Ray prints when a node's raylet dies."""
    return "".join(ln for ln in text.splitlines(keepends=True) if "[state-dump]" not in ln)


def run_job(tmp_path, steps: int, faults: str, *extra: str) -> dict:
    """Run ``scripts/job/train.py`` in this interpreter; its runs' records, by name."""
    records = tmp_path / "runs.json"
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "job" / "train.py"),
        f"--steps={steps}",
        f"--faults={faults}",
        f"--json={records}",
        f"--out={tmp_path}",
        *extra,
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, quiet(done.stdout)[-4000:] + quiet(done.stderr)[-6000:]
    return json.loads(records.read_text())["runs"]


def assert_equal(reference: list[dict], faulted: list[dict]) -> None:
    """``faulted``'s steps are ``reference``'s first ones, equal step by step (rewards
    exactly, losses within 1e-6)."""
    want = list(range(1, len(faulted) + 1))
    assert [m["step"] for m in faulted] == [m["step"] for m in reference[: len(faulted)]] == want
    for a, b in zip(reference, faulted, strict=False):
        assert (a["reward"], a["exact"]) == (b["reward"], b["exact"]), a["step"]
        assert abs(a["loss"] - b["loss"]) <= 1e-6, a["step"]


def train(tmp_path, steps: int, faults: str, *extra: str) -> dict:
    """Run ``scripts/job/train.py`` with ``--compare`` in this interpreter; both runs'
    records, checked equal step by step (rewards exactly, losses within 1e-6), and the
    fault-free run learning."""
    runs = run_job(tmp_path, steps, faults, "--compare", *extra)
    reference, faulted = runs["fault-free"]["steps"], runs["placectl"]["steps"]
    assert len(reference) == len(faulted) == steps
    assert_equal(reference, faulted)
    assert reference[-1]["reward"] > reference[0]["reward"]  # it learns
    return runs


def recoveries(events: list[dict]) -> list[dict]:
    """The events, a step's recovery as one: a recovery that failed (a group that could
    not form again: a peer's connection reset) is tried again at the step's next
    attempt, and what every attempt relaunched, promoted or restarted counts for the
    step."""
    out: list[dict] = []
    held: dict = {}  # what failed attempts of a step did, by step
    for e in events:
        if e["kind"] not in ("recovery failed", "repaired"):
            out.append(e)
            continue
        done = held.setdefault(e["step"], {"relaunched": {}, "promoted": {}, "restarted": []})
        for field in ("relaunched", "promoted"):
            for c, ranks in e.get(field, {}).items():
                done[field][c] = sorted(set(done[field].get(c, [])) | set(ranks))
        done["restarted"] = sorted(set(done["restarted"]) | set(e.get("restarted", [])))
        if e["kind"] == "repaired":
            out.append({**e, **held.pop(e["step"])})
    return out


def rolled_again(events: list[dict]) -> list[int]:
    """The steps whose prompts the rollout ranks alive at the run's end sampled more
    than once, by their own count (the driver's last event, ``sampled``); a rank lost
    took its count with it."""
    (sampled,) = [e for e in events if e["kind"] == "sampled"]
    return sorted(int(s) for s, n in sampled["prompts"].items() if n > sampled["per_step"])
