"""Tiny random-init causal LMs built in memory (dense Llama and Qwen3-MoE) for fast tests and toy runs."""

from __future__ import annotations

from typing import Any

SMOLLM2_VOCAB = 49152


def tiny_llama_config(vocab_size: int = SMOLLM2_VOCAB, **overrides: Any) -> Any:
    """A 2-layer Llama (the SmolLM2 architecture) small enough to train in seconds on CPU."""
    from transformers import LlamaConfig

    kw: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    kw.update(overrides)
    return LlamaConfig(**kw)


def tiny_moe_config(vocab_size: int = SMOLLM2_VOCAB, **overrides: Any) -> Any:
    """A 2-layer Qwen3-MoE with 4 experts (2 active), the shape of a 30B-A3B model in miniature."""
    from transformers import Qwen3MoeConfig

    kw: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    kw.update(overrides)
    return Qwen3MoeConfig(**kw)


def build_tiny_model(kind: str = "llama", seed: int = 0, **overrides: Any) -> Any:
    """A random-init ``AutoModelForCausalLM`` of the given kind ("llama" | "moe"), fp32, seeded."""
    import torch
    from transformers import AutoModelForCausalLM

    cfgs = {"llama": tiny_llama_config, "moe": tiny_moe_config}
    if kind not in cfgs:
        raise ValueError(f"unknown tiny model kind {kind!r}; choose one of {sorted(cfgs)}")
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfgs[kind](**overrides))  # type: ignore[no-untyped-call]
