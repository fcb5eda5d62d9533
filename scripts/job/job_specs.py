"""The GRPO job's cluster block for each layout and way of recovering, and the settings
of its ``--rollout vllm`` mode: what ``train.py`` and the benchmarks run it with."""

from __future__ import annotations

import os
import pathlib

import msgspec
import yaml
from grpo.config import TrainConfig
from local_faults import GPU_NODES

HERE = pathlib.Path(__file__).resolve().parent
SPEC = HERE.parent / "examples" / "grpo.yaml"
VLLM_SPEC = HERE.parent / "examples" / "grpo_vllm.yaml"
SPLIT_SPEC = HERE.parent / "examples" / "grpo_split.yaml"
VLLM_SPLIT_SPEC = HERE.parent / "examples" / "grpo_vllm_split.yaml"
# --layout split: five for the job, and two held as spares with --standby or --degraded
# (one copies a trainer node, one a rollout node: each runs its kind's standbys), free
# otherwise.
SPLIT_GPU_NODES = 7
# What every process of the embedded cluster sees in --rollout vllm: the engines' own
# processes import the job's worker extension; a small KV cache (GiB; the default takes a
# share of the machine's memory); the model is made here, nothing comes from a hub.
VLLM_ENV = {
    "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1])]),
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
VLLM_LR = 1e-2  # Adam on the embeddings and norms (grpo.lm); the GRU's 2e-2 overshoots
VLLM_GPU_NODES = 3  # --rollout vllm: two for the job, one spare
# --rollout vllm --layout split: three for the job, its spare (with --degraded), and one
# free, where a lost engine's slot is placed at once (its start is most of an engine's
# replacement: on this machine 20-30 s, against steps of 0.3 s).
VLLM_SPLIT_GPU_NODES = 5
# Each (rollout, layout) of train.py: its cluster block, and the GPU nodes of the
# embedded cluster it runs on.
LAYOUTS = {
    ("policy", "shared"): (SPEC, GPU_NODES),
    ("policy", "split"): (SPLIT_SPEC, SPLIT_GPU_NODES),
    ("vllm", "shared"): (VLLM_SPEC, VLLM_GPU_NODES),
    ("vllm", "split"): (VLLM_SPLIT_SPEC, VLLM_SPLIT_GPU_NODES),
}


def engine_config(config: TrainConfig, out: str) -> TrainConfig:
    """``config`` for ``--rollout vllm``: the tiny language model, made under ``out``."""
    from clients.testing.tiny_model import build

    model = build(pathlib.Path(out) / "model", seed=config.seed)
    return msgspec.structs.replace(
        config, rollout="vllm", model=str(model), lr=VLLM_LR, gpu_ms_per_token=0.0
    )


def with_standby(spec: dict, degraded: bool = False, spares: int = 1) -> dict:
    """``spec`` holding ``spares`` spare nodes, with standbys of the components on GPUs
    there (the trainers and rollout, a vLLM engine included; with two spares and
    training and rollout on nodes of their own, one spare runs each's); ``degraded``:
    rollout runs short when it loses ranks (``on_loss: continue``), and takes a held
    spare for a lost node when none of its own kind is held and no node is free
    (``take_spares``); with one spare only the trainers keep standbys (the spare copies
    a trainer's node), with two rollout keeps its own too, promoted as the lost ranks'
    replacements and admitted at the next weight push."""
    out = {**spec, "spares": spares, "component_placement": {}}
    for key, value in spec["component_placement"].items():
        for name in (n.strip() for n in key.split(",")):
            comp = dict(value) if isinstance(value, dict) else {"placement": value}
            if degraded and name == "rollout":
                # Without a spare of its own kind, its slot takes the trainers' spare
                # only when no node is free: their standbys there end, and the
                # operator's node is held as the next spare.
                comp.update(on_loss="continue", take_spares=True, standby=spares > 1)
            elif "node_group" not in comp:
                comp["standby"] = True
            out["component_placement"][name] = comp
    return out


def job_spec(config: TrainConfig, layout: str, mode: str) -> dict:
    """The job's cluster block: its layout's, with what ``mode`` (``standby``,
    ``degraded``, or anything else: as written) adds."""
    path, _ = LAYOUTS[(config.rollout, layout)]
    spec = yaml.safe_load(path.read_text())["cluster"]
    if mode in ("standby", "degraded"):
        # The ETTR benchmark's layout holds a spare per kind of node; the vLLM split
        # layout one, for the trainers (a standby engine would take a core of this
        # machine for 20-30 s at every start).
        spares = 2 if (config.rollout, layout) == ("policy", "split") else 1
        spec = with_standby(spec, degraded=mode == "degraded", spares=spares)
    return spec
