"""The GPU check's FLOP model: model FLOPs of the phases of one SAO learner step, for MFU (no recomputation counted).

Per token and layer, from the HF config: the attention weights (q, k, v, o), the MLP's (or the router's and the
``top_k`` experts' a token passes through), the causal score and value products, and the LM head on the rows it is
applied to. Checked against ``torch.utils.flop_counter`` on the tiny dense and MoE models (unit tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FlopShape:
    """The matmul shapes of a decoder LM, per token, from its HF config (MoE: the ``top_k`` experts a token uses)."""

    layers: int
    hidden: int
    heads: int
    head_dim: int
    attn_weights: int  # q, k, v, o weights of one layer
    mlp_weights: int  # MLP (or router + active experts) weights one token multiplies with, one layer
    vocab: int

    @staticmethod
    def of(config: Any) -> FlopShape:
        h, nh = int(config.hidden_size), int(config.num_attention_heads)
        hd = int(getattr(config, "head_dim", None) or h // nh)
        kv = int(getattr(config, "num_key_value_heads", None) or nh)
        attn = 2 * h * nh * hd + 2 * h * kv * hd
        experts = getattr(config, "num_experts", None)
        if experts:
            mlp = h * int(experts) + int(config.num_experts_per_tok) * 3 * h * int(config.moe_intermediate_size)
        else:
            mlp = 3 * h * int(config.intermediate_size)
        return FlopShape(int(config.num_hidden_layers), h, nh, hd, attn, mlp, int(config.vocab_size))

    def linear_flops(self, tokens: int) -> float:
        """Forward FLOPs of every weight matmul of the decoder layers over ``tokens`` tokens."""
        return 2.0 * tokens * self.layers * (self.attn_weights + self.mlp_weights)

    def attention_flops(self, tokens: int) -> float:
        """Forward FLOPs of the causal score and value products (half of the full ``T x T`` ones)."""
        return 2.0 * tokens * tokens * self.heads * self.head_dim * self.layers

    def forward_flops(self, tokens: int) -> float:
        return self.linear_flops(tokens) + self.attention_flops(tokens)

    def frozen_weight_grad_flops(self, tokens: int) -> float:
        """The backward FLOPs a frozen-attention critic skips: the gradients of the attention weights."""
        return 2.0 * tokens * self.layers * self.attn_weights

    def head_flops(self, rows: int) -> float:
        return 2.0 * rows * self.hidden * self.vocab


def step_flops(shape: FlopShape, tokens: int, action_tokens: int, k: int) -> dict[str, float]:
    """Model FLOPs (no recomputation counted, as MFU is defined) of the phases of one SAO step on one sequence:
    a backward costs twice its forward, the LM head runs on the action rows only (as the learner's chunked logprobs
    do), and the critic's backward skips its frozen attention weights."""
    fwd = shape.forward_flops(tokens)
    critic_step = 3 * fwd - shape.frozen_weight_grad_flops(tokens)
    return {
        "values": fwd,
        "actor": 3 * fwd + 3 * shape.head_flops(action_tokens),
        "critic": k * critic_step,
    }
