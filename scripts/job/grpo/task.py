"""The training math, with no Ray and no placectl: a task with a verifiable reward, a tiny
autoregressive policy, GRPO sampling and loss.

The task: given a target ``t`` in 0..27, emit three digits that sum to it. A sample that
hits the target scores 1, one off 0.5, two off 0.25, otherwise 0, so a random policy
scores about 0.1 and a trained one close to 1.

Determinism is what lets a faulted run be compared with a fault-free one: every prompt's
samples come from a generator seeded by (seed, step, prompt index), and a prompt's
samples are drawn as one batch, so the result is the same whichever rollout worker draws
them and however the prompts are split; the trainer ranks always get the same shards.
"""

from __future__ import annotations

import torch

from grpo.config import TrainConfig
from grpo.reward import DIGITS, MAX_TARGET, VOCAB

BOS = VOCAB  # the token before the first digit


class Policy(torch.nn.Module):
    """A GRU over the digits emitted so far, told the target at every step."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.target = torch.nn.Embedding(MAX_TARGET + 1, hidden)
        self.token = torch.nn.Embedding(VOCAB + 1, hidden)
        self.cell = torch.nn.GRUCell(hidden, hidden)
        self.head = torch.nn.Linear(hidden, VOCAB)

    def step(self, h: torch.Tensor, prev: torch.Tensor, target: torch.Tensor):
        h = self.cell(self.token(prev) + self.target(target), h)
        return h, self.head(h)

    def start(self, target: torch.Tensor):
        return self.target(target), torch.full_like(target, BOS)

    def pushed(self) -> dict[str, torch.Tensor]:
        """What rollout workers take after an update: every tensor."""
        return self.state_dict()

    def forward(self, target: torch.Tensor, digits: torch.Tensor) -> torch.Tensor:
        """The log-probability of each row of ``digits`` given its target."""
        h, prev = self.start(target)
        logp = torch.zeros(len(target))
        for i in range(DIGITS):
            h, logits = self.step(h, prev, target)
            logp = logp + torch.log_softmax(logits, -1).gather(1, digits[:, i : i + 1]).squeeze(1)
            prev = digits[:, i]
        return logp


def build(config: TrainConfig) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The initial policy and optimizer of a run: the same on every rank (the language
    model of :mod:`grpo.lm` when vLLM engines roll out)."""
    if config.rollout == "vllm":
        from grpo import lm

        return lm.build(config)
    torch.manual_seed(config.seed)
    policy = Policy(config.hidden)
    return policy, torch.optim.Adam(policy.parameters(), lr=config.lr)


def _mix(*parts: int) -> int:
    value = 0x9E3779B97F4A7C15
    for p in parts:
        value = (value * 6364136223846793005 + p + 1442695040888963407) % (1 << 63)
    return value


def targets(config: TrainConfig, step: int) -> list[int]:
    """The step's prompts: one target each."""
    g = torch.Generator().manual_seed(_mix(config.seed, step))
    return torch.randint(0, MAX_TARGET + 1, (config.prompts,), generator=g).tolist()


def seed_of(config: TrainConfig, step: int, index: int) -> int:
    """The seed of prompt ``index``'s samples at ``step``."""
    return _mix(config.seed, step, index)


@torch.no_grad()
def sample(policy: Policy, config: TrainConfig, step: int, index: int, target: int) -> list:
    """The group of samples of prompt ``index`` at ``step``: ``samples`` lists of digits."""
    g = torch.Generator().manual_seed(seed_of(config, step, index))
    t = torch.full((config.samples,), target)
    h, prev = policy.start(t)
    out = []
    for _ in range(DIGITS):
        h, logits = policy.step(h, prev, t)
        prev = torch.multinomial(torch.softmax(logits, -1), 1, generator=g).squeeze(1)
        out.append(prev)
    return torch.stack(out, 1).tolist()


def loss(model, batch: list[tuple[int, list, list[float]]]) -> torch.Tensor:
    """GRPO's policy-gradient loss over ``batch`` (target, its samples, their rewards):
    each sample's advantage is its reward normalised within its prompt's group; one
    on-policy update per batch, so the importance ratio is 1. ``model`` is the policy
    or its DDP wrapper."""
    t = torch.tensor([target for target, samples, _ in batch for _ in samples])
    digits = torch.tensor([s for _, samples, _ in batch for s in samples])
    r = torch.tensor([rs for _, _, rs in batch], dtype=torch.float32)
    advantage = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).reshape(-1)
    return -(advantage * model(t, digits)).mean() / DIGITS
