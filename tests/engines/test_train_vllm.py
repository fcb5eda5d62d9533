"""The GRPO job (scripts/job/train.py) rolling out with a real vLLM engine: a language model
trained on the task in tokens by two trainer ranks, an engine on the reservation taking
their weights after every step, through an abrupt node loss that takes the engine with it
and a driver crash, against a fault-free run of the same seed. The job holds a spare node
with a standby trainer and a standby engine (``--standby``): the loss promotes them. The
training math is the oracle: the engine's samples decide every reward, so a promoted
engine that did not take the committed weights, or sampled anything else, changes the
numbers."""

from __future__ import annotations

from tests.training import recoveries, train

# The stated figure is 3.64 s from the node's loss to the next finished step with the
# engine promoted (33.1 s relaunching it); CI's bound stays under one engine start.
NEXT_STEP_BOUND_S = 15.0


def test_an_engine_rolls_out_through_a_node_loss_and_a_driver_crash_as_without_them(tmp_path):
    runs = train(tmp_path, 8, "node@3,driver@6", "--rollout=vllm", "--standby")
    reference, faulted = runs["fault-free"]["steps"], runs["placectl"]["steps"]
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
    assert kinds == ["launched", "repaired", "attached"], kinds
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
