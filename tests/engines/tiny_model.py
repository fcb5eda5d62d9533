"""A tiny causal language model made here, offline: a byte-level BPE tokenizer trained on
a few sentences and a randomly initialised Qwen2 (hidden 256, 2 layers, head size 64,
the smallest the CPU attention backend takes), its embeddings untied from its output
head. Weights are drawn wide (std 0.2) so that greedy choices are far apart and an
engine and transformers agree on them. And transformers' own greedy generation, the
oracle the engine's tokens are compared with."""

from __future__ import annotations

import pathlib

VOCAB = 320
PROMPT = "one two three"
TOKENS = 8
TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "one two three four five six seven eight nine ten",
]


def build(path: pathlib.Path, seed: int) -> pathlib.Path:
    """Write the tokenizer and a model drawn from ``seed`` to ``path``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(TEXT * 50, trainer)
    eos = "<|endoftext|>"
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=eos).save_pretrained(
        path
    )
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        eos_token_id=0,
        bos_token_id=0,
        initializer_range=0.2,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def weights(path: pathlib.Path, names: set[str]) -> dict[str, tuple[str, list[int], bytes]]:
    """The tensors ``names`` of the model at ``path``, as a trainer sends them: dtype,
    shape and bytes (vLLM's RPC carries bytes, not tensors)."""
    from safetensors.torch import load_file

    found = load_file(str(path / "model.safetensors"))
    return {
        n: (str(t.dtype).removeprefix("torch."), list(t.shape), t.numpy().tobytes())
        for n, t in found.items()
        if n in names
    }


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
