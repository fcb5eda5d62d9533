"""The GRPO job's math (scripts/job/grpo), without Ray: what makes a faulted run comparable
with a fault-free one. Sampling does not depend on how the prompts are split over
rollout workers, averaging equal shards' gradients (what DDP does) is the full batch's
gradient, and the comparison catches a difference."""

from __future__ import annotations

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts" / "job"))

from grpo import report, task  # noqa: E402
from grpo.calls import cause_of, split  # noqa: E402
from grpo.config import TrainConfig  # noqa: E402
from grpo.reward import reward  # noqa: E402

CONFIG = TrainConfig(seed=3, prompts=8, samples=4)


def rollout(policy, step: int, parts: list[list[int]]) -> list:
    targets = task.targets(CONFIG, step)
    out = []
    for part in parts:  # each part: one rollout worker's prompts
        out += [(i, targets[i], task.sample(policy, CONFIG, step, i, targets[i])) for i in part]
    return sorted(out)


def test_samples_do_not_depend_on_how_prompts_are_split():
    policy, _ = task.build(CONFIG)
    prompts = list(range(CONFIG.prompts))
    one = rollout(policy, 5, [prompts])
    assert rollout(policy, 5, split(prompts, 3)) == one
    assert rollout(policy, 5, split(prompts, 8)) == one
    assert rollout(policy, 6, [prompts]) != one  # another step, other samples


def test_equal_shards_averaged_are_the_full_batch_gradient():
    policy, _ = task.build(CONFIG)
    rolled = rollout(policy, 1, [list(range(CONFIG.prompts))])
    batch = [(t, s, [reward(t, x) for x in s]) for _, t, s in rolled]

    def grads(shard):
        policy.zero_grad()
        task.loss(policy, shard).backward()
        return [p.grad.clone() for p in policy.parameters()]

    full = grads(batch)
    shards = [grads(part) for part in split(batch, 4)]
    for k, g in enumerate(full):
        mean = sum(s[k] for s in shards) / 4
        assert torch.allclose(mean, g, atol=1e-7)


def test_reward_is_verifiable():
    assert reward(10, [3, 3, 4]) == 1.0
    assert reward(10, [3, 3, 5]) == 0.5
    assert reward(10, [3, 3, 2]) == 0.25
    assert reward(10, [0, 0, 0]) == 0.0


def test_split_is_contiguous_and_even():
    assert split(list(range(10)), 4) == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert [x for part in split(list(range(3)), 5) for x in part] == [0, 1, 2]


def test_compare_catches_a_different_reward_or_loss():
    a = [{"step": 1, "reward": 0.5, "exact": 0.25, "loss": -0.1}]
    assert report.compare(a, [dict(a[0], loss=-0.1 + 5e-7)])[0]
    assert not report.compare(a, [dict(a[0], loss=-0.1 + 2e-6)])[0]
    assert not report.compare(a, [dict(a[0], reward=0.5001)])[0]
    assert not report.compare(a, a + a)[0]


def test_a_remote_error_is_said_by_its_own_last_line():
    import ray

    try:
        raise RuntimeError("The server socket has failed to listen: EADDRINUSE")
    except RuntimeError as e:
        remote = ray.exceptions.RayTaskError("Trainer.join", "Traceback ...\n  File x", e)
    said = cause_of(remote)
    assert said.endswith("RuntimeError: The server socket has failed to listen: EADDRINUSE"), said
    assert cause_of(ValueError("first line\nsecond")) == "ValueError: first line"
    line = report.event_line({"kind": "recovery failed", "cause": said, "seconds": 1.5})
    assert "the recovery failed in 1.50s, the step is tried again" in line and said in line
