"""A real GRPO job (scripts/job/train.py) through machines that fail as real ones do (a node
killed without a word, a hung node, a worker killed by the OOM killer, a worker stopped
inside a step, a drain, an eviction), a driver crash, a controller kill and a grow,
against a fault-free run of the same seed. The training math is the oracle: its rewards
and losses do not care what placectl believes."""

from __future__ import annotations

import pytest

from tests.training import assert_equal, recoveries, rolled_again, run_job, train

# Figures the docs state, measured alone as they measured them: beside another lane's busy
# cluster the next step after the node loss came 23.4 s after it (CI), the standby
# repair's 7.4 s.
pytestmark = pytest.mark.alone

# The figure the docs state for an abrupt node loss: the next step finished 6.2 s after
# it (starting over: 24.2 s; Ray's own detection alone 16.5 s). Bound for 2 loaded cores.
NEXT_STEP_AFTER_NODE_LOSS_S = 16.0
# Seconds between a drain's notice (or an eviction's SIGTERM) and the node's end: more
# than the job's margin (scripts/job/grpo/job.py DRAIN_MARGIN_S, 10 s) plus a trainer's
# start on 2 loaded cores (about 10 s), so that the job prepares the replacements beside
# the running ranks and swaps them in once up, as it would with a real notice (Ray's
# PREEMPTION drains give minutes; 30 s in scripts/bench/bench_drain.py).
NOTICE_S = 20.0
# One run through them all: each run pays a cluster, a fault-free reference and two
# launches (about 65 s of CI's 2 cores). drain: Ray's PREEMPTION drain of trainer rank 0's
# node, the node killed at its deadline; spot: SIGTERM to rank 0's node (by then the
# spare it moved to), as a pod evicted gets (Ray drains it itself); node: every process
# of rank 0's node killed at once, Ray not told; hang: rank 2's node stopped; oom: rank
# 1's worker killed on a live node; stall: rank 1's worker stopped inside the step. The
# drains first, on a calm cluster, as a spot fleet has them; a fault due on a node that
# is being drained waits until its rank has moved (grpo.job).
FAULTS = "drain@2,spot@20,node@30,hang@32,oom@34,stall@35,driver@36,controller@37,grow@38"
STEPS = 39
# The steps from the node loss on, and the epochs they ran at: the drains made epochs
# 2 and 3, the node loss 4, the hang 5, the grow 6.
LATE = 29


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("train")
    picture = out / "reward.png"
    runs = train(out, STEPS, FAULTS, f"--plot={picture}", f"--drain-notice={NOTICE_S}")
    assert picture.stat().st_size > 10_000
    return runs


def faults_at(run: dict) -> dict[str, float]:
    return {f["kind"]: f["at"] for f in run["faults"]}


def test_a_run_through_every_kind_of_fault_ends_equal_to_a_fault_free_run(runs):
    faulted, raw = runs["placectl"]["steps"], runs["placectl"]["events"]
    failed = [e for e in raw if e["kind"] == "recovery failed"]
    assert len(failed) <= 2, failed  # a recovery tried again, not a job in a loop
    events = recoveries(raw)
    kinds = [e["kind"] for e in events if e["kind"] not in ("machine", "preparing", "moved")]
    assert kinds == ["launched", *["repaired"] * 4, "attached", "grew", "sampled"], kinds
    # A recovery the driver lives through trains on the batch the failed attempt rolled
    # out (with the weights the trainers restore); the new driver after the driver's
    # kill (step 36) rolls its step out again. The rollout workers' own count.
    assert rolled_again(raw) == [36]
    node, hang, oom, stall = [e for e in events if e["kind"] == "repaired"]
    # node: one repair, the instant the step failed: the lost node held trainer rank 0
    # and rollout rank 0, and exactly those came back.
    assert node["relaunched"] == {"actor": [0], "rollout": [0]} and node["epoch"] == 4
    # hang: suspected, its ranks relaunched on the spare; the survivors blocked in the
    # collective on it restarted in their bundles, unless the stopped node was fenced at
    # its grace and its process ended first, which resets their collective: then they
    # come out of the step on their own and rejoin with nothing to restart
    assert hang["relaunched"] == {"actor": [2], "rollout": [2]}
    assert hang["restarted"] in ([0, 1, 3], []) and hang["epoch"] == 5
    # oom: it alone, in its own bundle; stall: the step's deadline, then it alone
    assert oom["relaunched"] == {"actor": [1]} and oom["restarted"] == []
    assert stall["cause"].startswith("StepTimeout")
    assert stall["relaunched"] == {"actor": [1]}
    assert [oom["epoch"], stall["epoch"]] == [5, 5]  # workers' faults move no slot
    back = [e["what"] for e in events if e["kind"] == "machine"]
    assert any("resumed after Ray declared it dead" in w for w in back), back
    assert any("its raylet exited, told it is dead" in w for w in back), back
    # The new driver found every worker alive: nothing relaunched.
    (attached,) = [e for e in events if e["kind"] == "attached"]
    assert attached["relaunched"] == {}
    (grew,) = [e for e in events if e["kind"] == "grew"]
    assert grew["rollout"] == 8 and grew["started"] == [4, 5, 6, 7]
    assert grew["trainers_kept"] == 4
    assert [m["epoch"] for m in faulted][LATE - 1 :] == [3, 4, 4, 5, 5, 5, 5, 5, 5, 6, 6]
    assert [m["rollout_workers"] for m in faulted] == [4] * (STEPS - 2) + [8] * 2
    assert sorted(f["kind"] for f in runs["placectl"]["faults"]) == sorted(
        k.split("@")[0] for k in FAULTS.split(",")
    )
    lost = faults_at(runs["placectl"])["node"]
    finished = min(s["finished_at"] for s in faulted if s["finished_at"] > lost)
    took = finished - lost
    assert took < NEXT_STEP_AFTER_NODE_LOSS_S, f"next step {took:.1f}s after the node loss"


def test_a_drained_and_an_evicted_node_cost_no_step(runs):
    run = runs["placectl"]
    faults = faults_at(run)
    events = [e for e in run["events"] if e["kind"] != "machine"]
    early = events[: [e["kind"] for e in events].index("repaired")]
    # Never a repair: the ranks moved between two steps, before each node went. The
    # node held trainer rank 0 and its rollout rank 0.
    kinds = [e["kind"] for e in early]
    assert kinds == ["launched", "preparing", "moved", "preparing", "moved"], early
    moved = [e for e in early if e["kind"] == "moved"]
    assert all(e["moved"] == {"actor": [0], "rollout": [0]} for e in moved), moved
    assert [e["epoch"] for e in moved] == [2, 3]
    for fault, event in zip(("drain", "spot"), moved, strict=True):
        # The old ranks were off the node before its deadline (the swap); the trainers'
        # group forming again (the rejoin) may end after it: it needs no old node.
        began = event["at"] - event["seconds"]
        swapped = began + event["parts"]["swap"]
        assert faults[fault] < began <= swapped < faults[fault] + NOTICE_S, (fault, event)
    assert run["steps"][LATE - 1]["epoch"] == 3  # no other move until the node loss


# With standbys (--standby: a held spare node, standby trainers and rollout workers
# there), the next step after an abrupt node loss: stated 1.59 s (7.70 s relaunching,
# scripts/bench/bench_train_faults.py --modes placectl,standby). Bound for 2 loaded
# cores, below relaunching: a promotion that fell back to a start fails it. That the
# ranks were promoted, not started, is read from Ray's actor ids.
NEXT_STEP_WITH_STANDBYS_S = 6.0


def test_with_standbys_a_node_loss_is_repaired_by_promotion_and_ends_equal(tmp_path, runs):
    # Compared with the first steps of the module's fault-free run (standbys change
    # nothing computed; a run's length only bounds its loop): one run fewer.
    got = run_job(tmp_path, 8, "node@3", "--standby")["placectl"]
    assert_equal(runs["fault-free"]["steps"], got["steps"])
    events = [e for e in recoveries(got["events"]) if e["kind"] != "machine"]
    assert [e["kind"] for e in events] == ["launched", "repaired", "sampled"], events
    assert rolled_again(events) == []
    (repaired,) = [e for e in events if e["kind"] == "repaired"]
    # Trainer rank 0's node held rollout rank 0 too: both came back as standbys, the
    # same Ray actors that waited on the spare (the job reads their ids from Ray).
    assert repaired["relaunched"] == {"actor": [0], "rollout": [0]}
    assert repaired["promoted"] == repaired["relaunched"], repaired
    faulted = got["steps"]
    lost = faults_at(got)["node"]
    took = min(s["finished_at"] for s in faulted if s["finished_at"] > lost) - lost
    assert took < NEXT_STEP_WITH_STANDBYS_S, f"next step {took:.1f}s after the node loss"
