"""Tiny random Hugging Face targets built in-process with a fixed seed (tests, no download).

``make_tiny_causal_lm`` builds a Llama (or Qwen3) architecture of a few layers; its weights are
drawn with a wider spread than Hugging Face's default (``initializer_range``) so that greedy
logits are decisive and token-exact comparisons do not sit on near-ties.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch

from draftsmith.runtime.targets.hf import HFTarget
from draftsmith.runtime.targets.hf_model import require_transformers


def make_tiny_causal_lm(
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 6,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    architecture: Literal["llama", "qwen2", "qwen3", "mistral"] = "llama",
    tie_word_embeddings: bool = False,
    rope_parameters: dict[str, Any] | None = None,
    initializer_range: float = 0.1,
    max_position_embeddings: int = 2048,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    random_norms: bool = False,
) -> torch.nn.Module:
    """A randomly initialised ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` /
    ``MistralForCausalLM`` (eval mode, CPU); ``rope_parameters`` (transformers 5's RoPE table,
    e.g. ``{"rope_type": "llama3", ...}``) replaces the default RoPE. ``random_norms``: every norm
    weight drawn from [0.5, 1.5) (transformers starts them at ones, where a norm weight applied
    twice, or not at all, would pass)."""
    transformers = require_transformers()
    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        initializer_range=initializer_range,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    if rope_parameters is not None:
        common["rope_parameters"] = rope_parameters
    if architecture == "llama":
        config = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    elif architecture == "qwen3":
        config = transformers.Qwen3Config(
            **common, head_dim=hidden_size // num_heads, use_sliding_window=False
        )
        cls = transformers.Qwen3ForCausalLM
    elif architecture == "qwen2":  # biases on q, k and v
        config = transformers.Qwen2Config(**common, use_sliding_window=False)
        cls = transformers.Qwen2ForCausalLM
    elif architecture == "mistral":
        config = transformers.MistralConfig(**common, sliding_window=None)
        cls = transformers.MistralForCausalLM
    else:
        raise ValueError(f"unknown tiny architecture {architecture!r}; use 'llama', 'qwen2', "
                         "'qwen3' or 'mistral'")
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    model = model.to(dtype).eval()
    if random_norms:
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.copy_(torch.rand(param.shape, generator=g) + 0.5)
    return model


def tiny_target(max_slots: int = 16, **kwargs: Any) -> HFTarget:
    """An :class:`HFTarget` around :func:`make_tiny_causal_lm` (``kwargs`` go to it)."""
    return HFTarget(make_tiny_causal_lm(**kwargs), max_slots=max_slots)


BYTE_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Ids 256, 257, 258 of the byte tokenizer: padding, turn start, turn end (also EOS)."""

_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_byte_tokenizer(vocab_size: int = 512) -> Any:
    """A byte-level tokenizer for tiny targets: ids 0..255 are bytes, 256..258 the
    :data:`BYTE_SPECIAL_TOKENS`, and ``<|extra_i|>`` fills the rest up to ``vocab_size``.

    It carries a ChatML chat template, so it drives the same prompt path as a real model.
    """
    transformers = require_transformers()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    if vocab_size < 256 + len(BYTE_SPECIAL_TOKENS):
        raise ValueError(f"a byte tokenizer needs vocab_size >= 259, got {vocab_size}")
    byte_chars = bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    for offset, token in enumerate(BYTE_SPECIAL_TOKENS):
        vocab[token] = 256 + offset
    extras = [f"<|extra_{i}|>" for i in range(256 + len(BYTE_SPECIAL_TOKENS), vocab_size)]
    for i, token in enumerate(extras):
        vocab[token] = 256 + len(BYTE_SPECIAL_TOKENS) + i
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=BYTE_SPECIAL_TOKENS[0],
        bos_token=BYTE_SPECIAL_TOKENS[1],
        eos_token=BYTE_SPECIAL_TOKENS[2],
        additional_special_tokens=[*BYTE_SPECIAL_TOKENS[1:], *extras],
    )
    tokenizer.chat_template = _CHAT_TEMPLATE
    return tokenizer


def save_tiny_model(directory: str | Path, **kwargs: Any) -> Path:
    """Write a tiny random model and its byte tokenizer as a Hugging Face directory.

    ``kwargs`` go to :func:`make_tiny_causal_lm`; the result loads with ``--target DIR``.
    """
    directory = Path(directory)
    vocab_size = int(kwargs.setdefault("vocab_size", 512))
    model = make_tiny_causal_lm(**kwargs)
    model.config.eos_token_id = 258
    model.config.pad_token_id = 256
    model.config.bos_token_id = 257
    model.save_pretrained(str(directory))
    make_byte_tokenizer(vocab_size).save_pretrained(str(directory))
    return directory


__all__ = ["BYTE_SPECIAL_TOKENS", "make_byte_tokenizer", "make_tiny_causal_lm",
           "save_tiny_model", "tiny_target"]
