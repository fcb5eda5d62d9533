"""The ETTR benchmark's arithmetic and schedule (scripts/bench/bench_ettr.py,
``grpo.report.ettr``), on run records written by hand: what counts as training time,
what as a redone step, and that one seed gives one schedule for every mode."""

from __future__ import annotations

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "scripts" / "job"), str(ROOT / "scripts" / "bench")]

from bench_ettr import schedule  # noqa: E402
from grpo import report  # noqa: E402


def step(n: int, end: float, took: float = 2.0) -> dict:
    parts = {"rollout": took / 2, "reward": 0.0, "train": took / 2, "sync": 0.0}
    return {"step": n, "finished_at": end, "seconds": parts}


def timed(took: list[float]) -> list[dict]:
    """Steps that took ``took`` seconds each, one after the other from 0."""
    out, end = [], 0.0
    for n, x in enumerate(took, 1):
        end += x
        out.append(step(n, end, x))
    return out


def test_a_run_without_faults_has_an_ettr_of_one():
    run = {"steps": [step(n, 2.0 * n) for n in range(1, 11)], "events": [], "faults": []}
    got = report.ettr(run)
    assert got["ettr"] == pytest.approx(1.0)
    assert got["redone"] == 0


def test_a_stop_counts_against_it_and_a_redone_step_is_counted_once():
    # steps of 2 s; a fault at 9.0 during step 5, which is redone after a 10 s recovery
    ends = [2, 4, 6, 8, 22, 24, 26, 28, 30, 32]
    run = {
        "steps": [step(n, float(e)) for n, e in enumerate(ends, 1)],
        "events": [
            {"kind": "repaired", "step": 5},
            {"kind": "recovery failed", "step": 5},
            {"kind": "launched"},
        ],
        "faults": [{"kind": "node", "step": 5, "at": 9.0}],
    }
    got = report.ettr(run)
    assert got["wall_s"] == pytest.approx(32.0)  # from the first step's start
    assert got["ettr"] == pytest.approx(20.0 / 32.0)
    assert got["redone"] == 1
    assert got["to_next_step_s"] == [pytest.approx(13.0)]


def test_a_step_is_rolled_out_again_only_where_its_prompts_were_sampled_twice():
    """The rollout ranks' own count, as the record keeps it (JSON's keys are strings): a
    redone step whose batch was kept is redone, not rolled out again."""
    run = {
        "steps": timed([2.0] * 6),
        "events": [
            {"kind": "repaired", "step": 3},
            {"kind": "repaired", "step": 5},
            {"kind": "sampled", "per_step": 32, "prompts": {"1": 32, "3": 32, "5": 64, "6": 31}},
        ],
        "faults": [{"kind": "node", "step": 3, "at": 5.0}],
    }
    got = report.ettr(run)
    assert got["redone_steps"] == [3, 5]
    assert got["rolled_again"] == [5]
    assert report.ettr({**run, "events": run["events"][:2]})["rolled_again"] is None


def test_a_slow_step_counts_what_it_should_have_taken():
    """A step that ran slower while a rollout rank was missing is not training time in
    full: a step before the fault is the measure."""
    took = [2.0] * 8 + [3.0, 3.0]
    run = {
        "steps": timed(took),
        "events": [{"kind": "short", "step": 9}],
        "faults": [{"kind": "rollout", "step": 9, "at": 16.5}],
    }
    got = report.ettr(run)
    assert got["step_s"] == pytest.approx(2.0)
    assert got["ettr"] == pytest.approx(20.0 / 22.0)
    assert got["redone"] == 0  # running short redoes nothing


def test_a_run_that_spends_most_steps_slowed_is_measured_by_its_calm_steps():
    took = [3.0, 2.0, 2.0] + [3.0] * 7  # the first step is the slowest; slowed from step 4
    run = {
        "steps": timed(took),
        "events": [],
        "faults": [{"kind": "rollout", "step": 4, "at": 7.5}],
    }
    got = report.ettr(run)
    assert got["step_s"] == pytest.approx(2.0)  # not the run's median, 3.0
    assert got["ettr"] == pytest.approx(20.0 / 28.0)


def test_one_seed_gives_one_schedule_of_trainer_and_rollout_nodes_in_turn():
    faults = schedule(100, 20, seed=0)
    assert faults == schedule(100, 20, seed=0)
    assert len(faults) == 5
    assert [k for k, _ in faults] in (
        ["node", "rollout"] * 2 + ["node"],
        ["rollout", "node"] * 2 + ["rollout"],
    )
    for i, (_, at) in enumerate(faults):
        assert max(3, 20 * i + 1) <= at <= min(20 * (i + 1), 99)
    assert schedule(100, 20, seed=1) != faults
