"""Actor and critic models: load a causal LM, build a value model on its backbone, freeze attention by module type."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from sao.core.jsonl import write_json_atomic
from sao.core.paths import resolve_model_path  # aliases (smollm2) shared with eval
from sao.trainer.config import Config, ConfigError

VALUE_HEAD_FILE = "value_head.safetensors"
CRITIC_MARKER = "sao_critic.json"
# Sibling modules of an attention block that normalise its input. Llama's ``post_attention_layernorm`` is NOT one:
# it normalises the residual stream before the MLP, so it stays trainable.
_PRE_ATTENTION_NORMS = ("input_layernorm", "ln_1", "attention_norm", "pre_attention_layernorm", "self_attn_layer_norm")


def _torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def load_actor(cfg: Config) -> nn.Module:
    """The policy: ``AutoModelForCausalLM`` from a directory, or a seeded random ``tiny:llama`` / ``tiny:moe``."""
    from transformers import AutoModelForCausalLM

    path, dtype = resolve_model_path(cfg.model.path), _torch_dtype(cfg.model.dtype)
    if path.startswith("tiny:"):
        from sao.core.tiny_models import build_tiny_model

        kind = path.split(":", 1)[1]
        try:
            model = build_tiny_model(kind, seed=cfg.run.seed, **cfg.model.tiny_overrides)
        except ValueError as e:
            raise ConfigError(f"model.path: {e}") from e
        model = model.to(dtype)
    else:
        if not Path(path).is_dir():
            raise ConfigError(
                f"model.path: {path!r} is not a model directory; give a HF model dir (e.g. the SmolLM2 dir made by "
                "`bash scripts/setup.sh`) or tiny:llama / tiny:moe"
            )
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    _checkpointing(model, cfg)
    model.config.use_cache = False
    out: nn.Module = model
    return out


def _checkpointing(model: nn.Module, cfg: Config) -> None:
    """``model.gradient_checkpointing``: keep one layer's input and recompute the rest in backward. HF models
    checkpoint only in training mode and ``from_pretrained`` returns them in eval mode, so the flag alone did
    nothing (measured on SmolLM2, 2 x 2,048 tokens: 8.9 GB peak either way; in training mode 4.1 GB); the model
    is put in training mode with it (dropout, where a config has any, then applies as in any HF training loop)."""
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()  # type: ignore[operator]
        model.train()


def load_tokenizer(cfg: Config) -> Any:
    """The tokenizer: ``model.tokenizer``, else the model dir, else (for ``tiny:*``) SmolLM2's."""
    from transformers import AutoTokenizer

    from sao.core.paths import smollm2_dir

    src = resolve_model_path(cfg.model.tokenizer) if cfg.model.tokenizer else None  # an alias or a dir
    if src is None:
        src = str(smollm2_dir()) if cfg.model.path.startswith("tiny:") else resolve_model_path(cfg.model.path)
    if not Path(src).is_dir():
        raise ConfigError(
            f"model.tokenizer: {src!r} is not a tokenizer directory; run `bash scripts/setup.sh` (SmolLM2) "
            "or set model.tokenizer"
        )
    tok = AutoTokenizer.from_pretrained(src)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


class ValueModel(nn.Module):
    """A causal-LM backbone with a scalar head: ``values[b, t]`` is the value of the prefix ending at token t."""

    def __init__(self, backbone: nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        # Small random weights (not zeros): with a zero head the first critic step could not reach the backbone.
        nn.init.normal_(self.value_head.weight, std=0.02)
        nn.init.zeros_(self.value_head.bias)

    @property
    def config(self) -> Any:
        return self.backbone.config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        features: torch.Tensor | None = None,
        return_features: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The values ``[B, T]``; with ``return_features`` also the (detached) ``features`` the head read.
        ``features``: the head reads these instead of running the backbone, for a frozen backbone
        (``critic.train_backbone: false``), whose features of a batch are the same at every critic step."""
        # The head runs in float32 whatever its storage: DeepSpeed's bf16 mode casts every parameter (this head
        # too) to bfloat16 in deepspeed.initialize, and a bf16 output would round values to ~3 digits, losing the
        # small differences GAE depends on. (Its master weights stay float32 in DeepSpeed's optimizer.)
        w, b = self.value_head.weight, self.value_head.bias
        feats = self.features(input_ids, attention_mask, position_ids) if features is None else features
        values = torch.nn.functional.linear(feats, w.float(), b.float()).squeeze(-1)
        return (values, feats.detach()) if return_features else values

    def features(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``[B, T, H]`` float32: what the head reads, the backbone's last hidden state at every token."""
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
        hidden: torch.Tensor = out.last_hidden_state
        return hidden.float()

    def save(self, out_dir: str | Path, state: dict[str, torch.Tensor] | None = None) -> None:
        """Write the backbone (HF format) and the head (safetensors) so ``critic.init`` can load it."""
        from safetensors.torch import save_file

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        sd = state if state is not None else self.state_dict()
        backbone_sd = {k[len("backbone.") :]: v for k, v in sd.items() if k.startswith("backbone.")}
        self.backbone.save_pretrained(out, state_dict=backbone_sd, safe_serialization=True)  # type: ignore[operator]
        head = {k[len("value_head.") :]: v.contiguous() for k, v in sd.items() if k.startswith("value_head.")}
        save_file(head, str(out / VALUE_HEAD_FILE))
        write_json_atomic(out / CRITIC_MARKER, {"format": "sao-critic-v1"}, indent=None)  # last: marks it whole


def _backbone_of(lm: nn.Module) -> nn.Module:
    prefix = getattr(lm, "base_model_prefix", "model")
    backbone: nn.Module | None = getattr(lm, prefix, None)
    if backbone is None:
        raise ConfigError(f"critic: cannot find the backbone ({prefix!r}) of {type(lm).__name__}")
    return backbone


def is_critic_checkpoint(path: str | Path) -> bool:
    return (Path(path) / CRITIC_MARKER).is_file()


def load_critic(cfg: Config, actor: nn.Module) -> ValueModel:
    """The critic from ``critic.init``: the actor's weights, a value-pretraining checkpoint, or a HF model dir."""
    from transformers import AutoModel

    init, dtype = cfg.critic.init, _torch_dtype(cfg.model.dtype)
    if init == "actor":
        backbone = copy.deepcopy(_backbone_of(actor))
        critic = ValueModel(backbone, int(actor.config.hidden_size))  # type: ignore[union-attr, arg-type]
    else:
        p = Path(init)
        if not p.is_dir():
            raise ConfigError(
                f"critic.init: {init!r} is neither 'actor' nor a directory; use 'actor', a checkpoint written by "
                "`sao pretrain-value`, or a HF model dir"
            )
        backbone = AutoModel.from_pretrained(str(p), dtype=dtype)
        _checkpointing(backbone, cfg)  # (init: actor copies the actor's backbone, checkpointing included)
        critic = ValueModel(backbone, backbone.config.hidden_size)
        if is_critic_checkpoint(p):
            from safetensors.torch import load_file

            critic.value_head.load_state_dict(load_file(str(p / VALUE_HEAD_FILE)))
    critic = critic.to(dtype)
    critic.value_head.float()  # a bf16 scalar head loses the small value differences GAE depends on
    if cfg.critic.freeze_attention:
        freeze_attention(critic)
    if not cfg.critic.train_backbone:
        critic.backbone.requires_grad_(False)
    return critic


def attention_param_names(model: nn.Module) -> list[str]:
    """Names of every attention parameter, found by module type: modules whose class name ends with
    ``Attention`` (their q/k/v/o projections and q/k norms) and the norms that feed them (``input_layernorm``)."""
    names: set[str] = set()
    found = False
    for mod_name, mod in model.named_modules():
        if not type(mod).__name__.endswith("Attention"):
            continue
        found = True
        for p_name, _ in mod.named_parameters():
            names.add(f"{mod_name}.{p_name}" if mod_name else p_name)
        parent_name = mod_name.rsplit(".", 1)[0] if "." in mod_name else ""
        parent = model.get_submodule(parent_name) if parent_name else model
        for child_name, child in parent.named_children():
            if child_name in _PRE_ATTENTION_NORMS:
                for p_name, _ in child.named_parameters():
                    names.add(f"{parent_name}.{child_name}.{p_name}" if parent_name else f"{child_name}.{p_name}")
    if not found:
        raise ConfigError(
            f"critic.freeze_attention: no attention modules (class names ending in 'Attention') in "
            f"{type(model).__name__}; set critic.freeze_attention=false or use a transformers decoder model"
        )
    return sorted(names)


def freeze_attention(model: nn.Module) -> list[str]:
    """Set ``requires_grad=False`` on every attention parameter (see ``attention_param_names``); return them."""
    names = attention_param_names(model)
    params = dict(model.named_parameters())
    for n in names:
        params[n].requires_grad_(False)
    return names


def shifted_values(values: torch.Tensor) -> torch.Tensor:
    """Align critic outputs with tokens: ``V[:, t]`` = value of the prefix BEFORE token t (the state in which the
    token was sampled), i.e. the head output at t - 1."""
    out = torch.zeros_like(values)
    out[:, 1:] = values[:, :-1]
    return out
