"""The tiny model the engine tests serve (:mod:`clients.testing.tiny_model` makes it), the
tensors a trainer sends, and transformers' own greedy generation: the oracle the
engine's tokens are compared with."""

from __future__ import annotations

import pathlib

from clients.testing.tiny_model import build, encode

PROMPT = "one two three"
TOKENS = 8


def weights(path: pathlib.Path, names: set[str]) -> dict[str, tuple[str, list[int], bytes]]:
    """The tensors ``names`` of the model at ``path``, as a trainer sends them: dtype,
    shape and bytes (vLLM's RPC carries bytes, not tensors)."""
    from safetensors.torch import load_file

    found = load_file(str(path / "model.safetensors"))
    return encode({n: t for n, t in found.items() if n in names})


def greedy(path: pathlib.Path, replaced: pathlib.Path | None = None, names=()) -> list[int]:
    """transformers' greedy tokens for PROMPT from the model at ``path``, with the
    tensors ``names`` taken from the model at ``replaced``."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if replaced is not None:
        new = load_file(str(replaced / "model.safetensors"))
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in names:
                    p.copy_(new[n])
    ids = AutoTokenizer.from_pretrained(path)(PROMPT, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=TOKENS, do_sample=False)
    return out[0, ids.shape[1] :].tolist()


__all__ = ["PROMPT", "TOKENS", "build", "greedy", "weights"]
