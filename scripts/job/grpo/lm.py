"""The policy of the job's ``--rollout vllm`` mode: a small causal language model (a Qwen2
that vLLM serves) set the same task as :mod:`grpo.task`, in tokens.

The prompt of target ``t`` is three tokens, its two digits and ``=`` (``"07="``); the
answer is three digit tokens, sampled by the engine with every other token masked
(vLLM's ``allowed_token_ids``). The trainer scores a sample with the same mask: the
log-softmax of the ten digit tokens' logits, which is the distribution the engine drew
from. So the reward, the advantage and the loss are :mod:`grpo.task`'s.

Only the input embeddings and the RMSNorm scales train: they are the tensors vLLM's CPU
build takes through ``load_weights`` after its start (it repacks its linear layers, the
output head among them, when it first loads them). The frozen rest is the model the
engine loaded from disk, so the engine's model equals the trainer's after every push,
and a relaunched engine equals its predecessor after one.
"""

from __future__ import annotations

import torch

from grpo.config import TrainConfig
from grpo.reward import DIGITS, MAX_TARGET, VOCAB


def trains(name: str) -> bool:
    """Whether the parameter ``name`` (Hugging Face's name) trains and is pushed."""
    return name.endswith("embed_tokens.weight") or name.endswith("norm.weight")


def digit_ids(tokenizer) -> list[int]:
    """The token of each digit 0-9 (one token each in the model's tokenizer)."""
    ids = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(VOCAB)]
    if len(set(ids)) != VOCAB or tokenizer.unk_token_id in ids:
        raise ValueError(f"the tokenizer has no token of its own for every digit: {ids}")
    return ids


def prompt_ids(tokenizer) -> list[list[int]]:
    """The prompt of every target (its index): its two digits and ``=``, as token ids."""
    digits, eq = digit_ids(tokenizer), tokenizer.convert_tokens_to_ids("=")
    return [[digits[t // 10], digits[t % 10], eq] for t in range(MAX_TARGET + 1)]


class Policy(torch.nn.Module):
    """The language model, read as the task's policy: ``forward(target, digits)`` is the
    log-probability of each row of ``digits`` given its target, as :class:`grpo.task.Policy`
    gives it."""

    def __init__(self, path: str) -> None:
        super().__init__()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        for name, p in self.model.named_parameters():
            p.requires_grad_(trains(name))
        tokenizer = AutoTokenizer.from_pretrained(path)
        self.register_buffer("digits", torch.tensor(digit_ids(tokenizer)), persistent=False)
        self.register_buffer("prompts", torch.tensor(prompt_ids(tokenizer)), persistent=False)

    def forward(self, target: torch.Tensor, digits: torch.Tensor) -> torch.Tensor:
        ids = torch.cat([self.prompts[target], self.digits[digits]], 1)
        logits = self.model(input_ids=ids[:, :-1]).logits[:, -DIGITS:][..., self.digits]
        logp = torch.log_softmax(logits, -1).gather(2, digits[..., None]).squeeze(2)
        return logp.sum(1)

    def pushed(self) -> dict[str, torch.Tensor]:
        """The tensors an engine takes after an update, by Hugging Face's names."""
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if trains(n)}


def build(config: TrainConfig) -> tuple[Policy, torch.optim.Optimizer]:
    """The initial policy (the model on disk: the same on every rank) and its optimizer."""
    policy = Policy(config.model)
    trained = [p for p in policy.parameters() if p.requires_grad]
    return policy, torch.optim.Adam(trained, lr=config.lr)
