"""The GRPO job (scripts/job/train.py) rolling out with a real vLLM engine: a language model
trained on the task in tokens by two trainer ranks, engines on the reservation taking
their weights after every step, against one fault-free run of the same seed. The
training math is the oracle: the engines' samples decide every reward, so an engine
that did not take the committed weights, or sampled anything else, changes the numbers.

The faulted runs differ from the fault-free one in layout too (two engines on nodes of
their own against one beside a trainer): each prompt's samples are seeded by the prompt,
so whichever engine draws them draws the same, and the runs are equal step by step."""

from __future__ import annotations

import pytest

from tests.training import assert_equal, recoveries, rolled_again, run_job

# The stated figure is 3.64 s from the node's loss to the next finished step with the
# engine promoted (33.1 s relaunching it); CI's bound stays under one engine start.
NEXT_STEP_BOUND_S = 15.0
# The stated figure: the step after an engine's node died came 1.4 s after it (the step
# it struck, finished by the engine left). Bounded well under one engine start: the
# step does not wait for the replacement.
NEXT_STEP_AFTER_ENGINE_LOSS_S = 10.0
# Enough steps of about 0.25 s for a replacement engine to start and be admitted (31 s
# after the loss here, at step 116; 150 leave room for a slower machine); the fault-free
# run has as many, and each faulted run is compared with its first steps.
STEPS = 150


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory) -> list[dict]:
    """One engine beside trainer rank 0, no faults: the steps every faulted run equals."""
    runs = run_job(tmp_path_factory.mktemp("fault-free"), STEPS, "", "--rollout=vllm")
    steps = runs["placectl"]["steps"]
    assert steps[-1]["reward"] > steps[0]["reward"]  # it learns
    return steps


def test_an_engine_rolls_out_through_a_node_loss_and_a_driver_crash_as_without_them(
    tmp_path, fault_free
):
    """The job holds a spare node with a standby trainer and a standby engine
    (``--standby``); an abrupt loss of trainer rank 0's node, which holds the engine,
    promotes them; then the driver is killed and a new one attaches."""
    runs = run_job(tmp_path, 8, "node@3,driver@6", "--rollout=vllm", "--standby")
    reference, faulted = fault_free[:8], runs["placectl"]["steps"]
    assert_equal(reference, faulted)
    assert all(m["rollout_workers"] == 1 for m in faulted)
    # It learns: the engine samples what the pushed weights make likelier. An engine that
    # never took a push would sample the first model at every step, in both runs alike:
    # equal rewards, but no rise (measured: 0.067 over the first three steps, 0.231
    # over the last three).
    early = sum(m["reward"] for m in reference[:3]) / 3
    late = sum(m["reward"] for m in reference[-3:]) / 3
    assert late > 2 * early, [m["reward"] for m in reference]

    events = runs["placectl"]["events"]
    failed = [e for e in events if e["kind"] == "recovery failed"]
    assert len(failed) <= 1, failed  # a recovery tried again, not a job in a loop
    events = recoveries(events)
    kinds = [e["kind"] for e in events if e["kind"] != "machine"]
    assert kinds == ["launched", "repaired", "attached", "sampled"], kinds
    # The new driver rolled step 6 out again; the node loss's step trained on the batch
    # its failed attempt had (the engines' own count).
    assert rolled_again(events) == [6]
    (node,) = [e for e in events if e["kind"] == "repaired"]
    # Trainer rank 0's node held the engine too: exactly those two came back, on the spare,
    # as the standbys that ran there (Ray's actor ids, read by the job before the repair).
    assert node["relaunched"] == {"actor": [0], "rollout": [0]} and node["epoch"] == 2
    assert node["promoted"] == {"actor": [0], "rollout": [0]}
    (lost,) = [f for f in runs["placectl"]["faults"] if f["kind"] == "node"]
    done = [m["finished_at"] for m in runs["placectl"]["steps"]]
    took = min(t for t in done if t > lost["at"]) - lost["at"]
    assert took < NEXT_STEP_BOUND_S, took
    # The new driver found the engine and the trainers alive (detached): none relaunched.
    (attached,) = [e for e in events if e["kind"] == "attached"]
    assert attached["relaunched"] == {}


def test_an_engine_lost_mid_rollout_costs_no_step_and_its_replacement_is_admitted(
    tmp_path, fault_free
):
    """Two engines on nodes of their own, rollout that runs short (``--degraded``): the
    node of one dies while the step's rollout calls are out. The other engine takes its
    prompts in that same step (none run again), the replacement starts from the model on
    disk in the background and is admitted at a weight push, and the run ends equal to
    the fault-free one: an admitted engine that sampled with other weights would change
    the rewards of every step after."""
    runs = run_job(tmp_path, STEPS, "rollout@3", "--rollout=vllm", "--layout=split", "--degraded")
    faulted, events = runs["placectl"]["steps"], runs["placectl"]["events"]
    assert_equal(fault_free, faulted)
    kinds = [e["kind"] for e in events if e["kind"] != "machine"]
    assert "repaired" not in kinds and "recovery failed" not in kinds, events  # none redone
    assert rolled_again(events) == []
    (short,) = [e for e in events if e["kind"] == "short"]
    assert short["step"] == 3 and short["lost"] == [1] and short["serving"] == 1, short
    (admitted,) = [e for e in events if e["kind"] == "admitted"]
    assert admitted["ranks"] == [1] and admitted["short"] == [], admitted
    serving = [m["rollout_workers"] for m in faulted]
    assert serving[:3] == [2, 2, 2] and serving[3] == 1 and serving[-1] == 2, serving
    # Served short from the step after the loss until the step after the admission.
    back = next(m["step"] for m in faulted if m["finished_at"] > admitted["at"])
    assert set(serving[3:back]) == {1} and set(serving[back:]) == {2}, (serving, back)
    (lost,) = [f for f in runs["placectl"]["faults"] if f["kind"] == "rollout"]
    took = min(m["finished_at"] for m in faulted if m["finished_at"] > lost["at"]) - lost["at"]
    assert took < NEXT_STEP_AFTER_ENGINE_LOSS_S, took
