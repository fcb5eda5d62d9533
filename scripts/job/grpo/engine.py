"""The rollout worker of the job's ``--rollout vllm`` mode: a real vLLM engine serving the
policy of :mod:`grpo.lm`, one per rank of the ``rollout`` component (``engine: vllm``).

The engine's ports and cores come from the reservation (``WorkerGroup`` leased its
``VLLM_PORT``; :func:`clients.engines.vllm_environment` gives its workers' cores). New
weights reach the engine's own worker processes as the frameworks send them: a worker
extension (``worker_extension_cls``) whose method ``collective_rpc`` calls in each worker,
taking the tensors by their Hugging Face names through the model's ``load_weights``
(:mod:`clients.testing.tiny_model`).

Sampling is seeded per prompt by (seed, step, prompt index), as :func:`grpo.task.sample`
is, so a prompt's group is the same whichever engine draws it.
"""

from __future__ import annotations

import os

import clients.engines
import clients.weights
from clients.testing import tiny_model
from grpo.config import TrainConfig
from grpo.reward import DIGITS


class Rollout:
    """A rollout rank: a vLLM engine on ``config.model``, sampling the task's answers."""

    def __init__(self, config: TrainConfig) -> None:
        from vllm import LLM

        from grpo import lm

        os.environ.update(clients.engines.vllm_environment(1))
        self.config = config
        self.llm = LLM(
            model=config.model,
            enforce_eager=True,
            dtype="float32",
            max_model_len=32,
            seed=config.seed,
            # On the CPU platform vLLM has no Ray executor: its own processes.
            distributed_executor_backend="mp",
            worker_extension_cls=tiny_model.EXTENSION,
        )
        tokenizer = self.llm.get_tokenizer()
        self.digits = lm.digit_ids(tokenizer)
        self.digit_of = {token: d for d, token in enumerate(self.digits)}
        self.prompts = lm.prompt_ids(tokenizer)
        self.sampled: dict[int, int] = {}  # prompts sampled, by step: generate()'s calls

    def load(self, weights: dict, version: int) -> int:
        """Take the trainer's pushed tensors (``grpo.lm.Policy.pushed``) of step
        ``version``; returns that version once every engine worker has loaded them."""
        self.llm.collective_rpc("push", args=(tiny_model.encode(weights),))
        clients.weights.hold(version)  # the engine says it holds them (clients.weights)
        return version

    def generate(self, step: int, indices: list[int], version: int) -> list[tuple[int, int, list]]:
        """The groups of the step's prompts ``indices``: (index, target, samples) each,
        with the weights of step ``version`` or refused (a promoted standby engine
        before the job's push)."""
        from vllm import SamplingParams

        from grpo import task

        clients.weights.require(version)

        targets = task.targets(self.config, step)
        prompts, params = [], []
        for i in indices:
            prompts.append({"prompt_token_ids": self.prompts[targets[i]]})
            params.append(
                SamplingParams(
                    n=self.config.samples,
                    temperature=1.0,
                    max_tokens=DIGITS,
                    min_tokens=DIGITS,
                    allowed_token_ids=self.digits,
                    seed=task.seed_of(self.config, step, i),
                )
            )
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        self.sampled[step] = self.sampled.get(step, 0) + len(indices)
        return [
            (i, targets[i], [[self.digit_of[t] for t in c.token_ids] for c in out.outputs])
            for i, out in zip(indices, outs, strict=True)
        ]

    def sampled_prompts(self) -> dict[int, int]:
        """How many prompts this engine has sampled for each step, all calls counted."""
        return dict(self.sampled)

    def where(self) -> dict:
        from grpo.roles import where

        return where()
