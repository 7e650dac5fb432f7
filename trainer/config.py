"""The training config tree: typed dataclasses loaded from YAML, dotted CLI overrides, validation before any work."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ALGORITHMS = ("sao", "grpo", "grpo_dis", "ppo", "running_mean")
# Which algorithms train a critic (the others use a group or running-mean baseline).
CRITIC_ALGORITHMS = ("sao", "ppo")


class ConfigError(ValueError):
    """A config field is wrong; the message names the field and how to fix it."""


@dataclass
class RunConfig:
    """Where the run lives and how long it lasts."""

    dir: str = "runs/default"
    """RUN_DIR: config, trajectories.jsonl, metrics.jsonl, checkpoints, plots."""
    seed: int = 0
    total_steps: int = 10
    """Policy steps (versions) to train."""
    save_every: int = 5
    """Write a resumable checkpoint every N steps (and always at the end)."""
    keep_checkpoints: int = 2
    """Resumable checkpoints kept on disk (older ones are deleted)."""
    tensorboard: bool = True
    wandb_project: str | None = None
    plot: bool = True
    """Write RUN_DIR/plots/*.png at the end of the run."""
    progress: bool = True
    """A live rich progress line on stderr."""
    param_digest: bool = False
    """At the end, every rank writes RUN_DIR/param_digest/rank{R}.json (a hash of its gathered actor and critic
    parameters): a check that data-parallel ranks hold identical weights. Gathers the full model: small runs only."""


@dataclass
class ModelConfig:
    """The actor (policy) model."""

    path: str = "tiny:llama"
    """A HF model directory, ``smollm2`` (the SmolLM2-135M-Instruct dir made by ``bash scripts/setup.sh``), or
    ``tiny:llama`` / ``tiny:moe`` (random-init, for tests and toy runs)."""
    tokenizer: str | None = None
    """Tokenizer directory; default: the model directory (SmolLM2's for ``tiny:*``)."""
    dtype: str = "float32"
    """``float32`` or ``bfloat16`` (the master weights' dtype; DeepSpeed bf16 is set in ``deepspeed``)."""
    tiny_overrides: dict[str, Any] = field(default_factory=dict)
    """Extra config fields for ``tiny:*`` models (e.g. ``vocab_size``, ``hidden_size``)."""
    gradient_checkpointing: bool = False


@dataclass
class CriticConfig:
    """The value model: a causal-LM backbone plus a scalar head."""

    init: str = "actor"
    """``actor`` (copy the actor's weights), a value-pretraining checkpoint dir, or a HF model dir."""
    freeze_attention: bool = True
    """Freeze every attention parameter (q/k/v/o, q/k norms, pre-attention norms); train MLP/MoE, embeddings, head."""
    lr: float = 1e-4
    weight_decay: float = 0.0
    value_clip: float | None = None
    """PPO-style value clipping around the values computed before the K critic steps; null disables it."""


@dataclass
class TrainerConfig:
    """The algorithm and its knobs."""

    algorithm: str = "sao"
    """One of sao (default), grpo, grpo_dis, ppo, running_mean."""
    batch_size: int = 8
    """Trajectories per policy step."""
    lr: float = 1e-5
    weight_decay: float = 0.0
    critic_updates_per_step: int = 4
    """K: critic optimizer steps per policy step (the faster value update)."""
    eps_low: float = 0.2
    """DIS/PPO lower ratio bound: tokens with r <= 1 - eps_low are masked out."""
    eps_high: float = 0.28
    """DIS/PPO upper ratio bound: tokens with r >= 1 + eps_high are masked out."""
    gamma: float = 1.0
    lam: float = 1.0
    """GAE lambda (``lambda`` is accepted as the YAML key too)."""
    length_adaptive_lambda: bool = False
    """VAPO's length-adaptive lambda for the policy: lambda = 1 - 1 / (lambda_alpha * action_tokens)."""
    lambda_alpha: float = 0.05
    max_staleness: int = 4
    """Drop trajectories whose oldest action segment is more than this many versions behind."""
    sync_every: int = 1
    """Push new weights to the inference engine every N versions."""
    group_size: int = 4
    """GRPO: rollouts per prompt."""
    entropy_coef: float = 0.0
    warmup_steps: int = 0
    """Linear learning-rate warmup of the actor over its first N optimizer steps (0 = none)."""
    normalize_advantages: bool = False
    """Whiten the advantages over the global batch's action tokens (``(A - mean) / std``) before the policy step:
    the step size no longer depends on the critic's current error or the batch's reward spread."""
    advantage_std_floor: float = 0.2
    """Whitening divides by ``max(std, floor)``: a batch whose advantages barely differ (all solved, an accurate
    critic) is not blown up into unit-size noise (which can undo a learned policy)."""
    running_mean_momentum: float = 0.9
    """running_mean: EMA momentum of the reward baseline."""


@dataclass
class RolloutConfig:
    """How episodes are produced."""

    engine: str = "hf"
    """``hf`` (in-process transformers, follows the trainer's weights) or ``vllm`` (servers)."""
    vllm_urls: list[str] = field(default_factory=list)
    """vllm: server URLs; empty = launch one local server on the actor."""
    concurrency: int = 4
    """Episodes in flight."""
    buffer_size: int = 16
    """Finished trajectories waiting for the trainer; a full buffer pauses new episodes (backpressure)."""
    max_tokens: int = 64
    """Max new tokens per action."""
    temperature: float = 1.0
    max_turns: int = 8
    max_context_tokens: int = 2048
    action_vocab: list[str] = field(default_factory=list)
    """Restrict sampling (and the trained policy) to these words' tokens, e.g. ``[A, B, C]`` for the toy game with
    a random-init model; empty = the full vocabulary. Needs ``engine: hf``."""


@dataclass
class EnvConfig:
    """Which environment and which tasks."""

    id: str = "sao/TokenGame-v0"
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``gymnasium.make``."""
    tasks: str | None = None
    """A JSONL file of tasks, ``arithmetic`` (generated easy arithmetic tasks), or null (the env's own)."""
    num_tasks: int = 1000


@dataclass
class DeepSpeedConfig:
    """The DeepSpeed engines of the actor and the critic."""

    zero_stage: int = 0
    bf16: bool = False
    offload_optimizer: bool = False
    offload_param: bool = False
    micro_batch_size: int = 8
    """Sequences per forward/backward; a batch is split into micro batches (gradient accumulation)."""
    gradient_clipping: float = 1.0


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)

    @property
    def uses_critic(self) -> bool:
        return self.trainer.algorithm in CRITIC_ALGORITHMS

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        """Reject bad values and combinations; each message names the field and the fix."""
        t, r, d = self.trainer, self.rollout, self.deepspeed
        if t.algorithm not in ALGORITHMS:
            close = difflib.get_close_matches(t.algorithm, ALGORITHMS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"trainer.algorithm: unknown {t.algorithm!r}{hint}; choose one of {list(ALGORITHMS)}")
        checks: list[tuple[bool, str]] = [
            (t.critic_updates_per_step >= 1, "trainer.critic_updates_per_step (K) must be >= 1; set it to 1 or more"),
            (0 < t.eps_low < 1, "trainer.eps_low must be in (0, 1) (the ratio lower bound is 1 - eps_low)"),
            (t.eps_high > 0, "trainer.eps_high must be > 0 (the ratio upper bound is 1 + eps_high)"),
            (0 <= t.gamma <= 1, "trainer.gamma must be in [0, 1]"),
            (0 <= t.lam <= 1, "trainer.lam (lambda) must be in [0, 1]"),
            (t.lambda_alpha > 0, "trainer.lambda_alpha must be > 0"),
            (t.batch_size >= 1, "trainer.batch_size must be >= 1"),
            (t.lr > 0, "trainer.lr must be > 0"),
            (t.advantage_std_floor > 0, "trainer.advantage_std_floor must be > 0"),
            (t.warmup_steps >= 0, "trainer.warmup_steps must be >= 0 (0 = no warmup)"),
            (self.critic.lr > 0, "critic.lr must be > 0"),
            (t.max_staleness >= 0, "trainer.max_staleness must be >= 0 (0 = fully on-policy)"),
            (t.sync_every >= 1, "trainer.sync_every must be >= 1"),
            (t.group_size >= 1, "trainer.group_size must be >= 1"),
            (0 <= t.running_mean_momentum < 1, "trainer.running_mean_momentum must be in [0, 1)"),
            (r.engine in ("hf", "vllm"), f"rollout.engine: unknown {r.engine!r}; use 'hf' or 'vllm'"),
            (r.concurrency >= 1, "rollout.concurrency must be >= 1"),
            (r.buffer_size >= 1, "rollout.buffer_size must be >= 1"),
            (r.max_tokens >= 1, "rollout.max_tokens must be >= 1"),
            (r.max_turns >= 1, "rollout.max_turns must be >= 1"),
            (not r.action_vocab or r.engine == "hf", "rollout.action_vocab needs rollout.engine=hf; clear one of them"),
            (d.zero_stage in (0, 1, 2, 3), "deepspeed.zero_stage must be 0, 1, 2 or 3"),
            (d.micro_batch_size >= 1, "deepspeed.micro_batch_size must be >= 1"),
            (d.gradient_clipping >= 0, "deepspeed.gradient_clipping must be >= 0 (0 disables clipping)"),
            (self.model.dtype in ("float32", "bfloat16"), "model.dtype must be 'float32' or 'bfloat16'"),
            (self.run.total_steps >= 1, "run.total_steps must be >= 1"),
            (self.run.save_every >= 1, "run.save_every must be >= 1"),
            (self.run.keep_checkpoints >= 1, "run.keep_checkpoints must be >= 1"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)
        if t.algorithm == "grpo" and t.batch_size % t.group_size:
            raise ConfigError(
                f"trainer.batch_size ({t.batch_size}) must be a multiple of trainer.group_size ({t.group_size}) "
                "for grpo; change one of them"
            )


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check/convert a YAML value to the annotated type; raise ConfigError naming ``where``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], where)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping of fields, got {value!r}")
        return _build(tp, value, where)  # type: ignore[arg-type]
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return list(value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)  # YAML reads "1e-5" as a string
            except ValueError:
                pass
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


_ALIASES = {"trainer.lambda": "trainer.lam", "trainer.K": "trainer.critic_updates_per_step"}


def _build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = _field_types(cls)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        dotted = _ALIASES.get(dotted, dotted)
        name = dotted.rsplit(".", 1)[-1]
        if name not in hints:
            close = difflib.get_close_matches(str(key), list(hints), n=1)
            hint = f"; did you mean {prefix + '.' if prefix else ''}{close[0]}?" if close else ""
            raise ConfigError(f"unknown config key {dotted!r}{hint} (valid keys here: {sorted(hints)})")
        kwargs[name] = _coerce(value, hints[name], dotted)
    return cls(**kwargs)


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted!r}: {p!r} is not a section")
        node = child
    node[parts[-1]] = value


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    """``["trainer.lr=1e-5", ...]`` -> ``[("trainer.lr", 1e-05), ...]`` (values parsed as YAML scalars)."""
    out = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. trainer.critic_updates_per_step=2")
        key, raw = item.split("=", 1)
        out.append((key.strip(), yaml.safe_load(raw) if raw.strip() else None))
    return out


def config_from_dict(data: dict[str, Any], overrides: list[str] | None = None) -> Config:
    data = dict(data or {})
    for key, value in parse_overrides(overrides or []):
        _set_dotted(data, key, value)
    cfg: Config = _build(Config, data)
    cfg.validate()
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Load a YAML config file, apply dotted ``key=value`` overrides, validate."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} not found; pass a YAML file such as configs/toy.yaml")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML ({e})") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections (run, model, trainer, ...)")
    return config_from_dict(data, overrides)


def save_config(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


# Fields that may change between a run and its resume without changing what is being trained.
RESUME_MUTABLE = {
    "run.dir",
    "run.total_steps",
    "run.param_digest",
    "run.progress",
    "run.plot",
    "run.tensorboard",
    "run.wandb_project",
}


def config_diff(a: Config, b: Config) -> list[str]:
    """Dotted keys whose values differ between two configs (ignoring the resume-mutable ones)."""

    def flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict) and k not in ("kwargs", "tiny_overrides"):
                out.update(flat(v, key + "."))
            else:
                out[key] = v
        return out

    fa, fb = flat(a.to_dict()), flat(b.to_dict())
    return sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k) and k not in RESUME_MUTABLE)
