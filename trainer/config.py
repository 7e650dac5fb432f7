"""The training config tree: typed dataclasses loaded from YAML, dotted CLI overrides, validation before any work."""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao.agent.engines.registry import WEIGHT_SYNC_KINDS, engine_spec, engines, trainable_engines
from sao.core.config import ConfigError as ConfigError  # the trainer's modules raise it from here
from sao.core.config import apply_overrides, build, load_yaml
from sao.core.jsonl import write_yaml_atomic
from sao.trainer.algos.registry import (
    AlgorithmSpec,
    advantage_names,
    advantage_traits,
    algorithm_names,
    get_algorithm,
    policy_loss_names,
    policy_loss_traits,
)

# The DIS bands of the paper as its public ports report them: (eps_low, eps_high), the band (1 - lo, 1 + hi).
DIS_BANDS: dict[str, tuple[float, float]] = {"reasoning": (0.3, 5.0), "coding": (0.8, 3.0)}
VALUE_POSITIONS = ("token", "turn")
"""``critic.value_positions``: where the critic is read and trained (``sao.trainer.learn.targets.value_mask``)."""


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
    export_every: int = 0
    """Export the policy (HF format, with its tokenizer) to RUN_DIR/policies/step_N every N steps: what
    `sao bench curve` evaluates on held-out tasks to draw the per-step curve. 0: never."""
    tensorboard: bool = True
    wandb_project: str | None = None
    plot: bool = True
    """Write RUN_DIR/plots/*.png at the end of the run."""
    progress: bool = True
    """A live progress line on the terminal (``sao.core.console.ProgressLine``)."""
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
    """Keep one input per decoder layer and recompute the layer in backward (actor and critic): activation memory
    of long rows drops by about half on SmolLM2 for little extra time; the model trains in training mode with it."""


@dataclass
class CriticConfig:
    """The value model: a causal-LM backbone plus a scalar head."""

    init: str = "actor"
    """``actor`` (copy the actor's weights), a value-pretraining checkpoint dir, or a HF model dir."""
    freeze_attention: bool = True
    """Freeze every attention parameter (q/k/v/o, q/k norms, pre-attention norms); train MLP/MoE, embeddings, head."""
    train_backbone: bool = True
    """False: only the value head trains (a linear critic on the frozen backbone's features, started by the ridge fit
    of value pretraining): a critic step costs a forward and no backward through the network. Measured on the levels
    job at ``value_positions: turn``: gradient steps on the backbone's MLPs took the head fit's held-out explained
    variance from 0.30 to -0.15 in two epochs (docs/results.md, "Where the critic reads the level")."""
    lr: float = 1e-4
    weight_decay: float = 0.0
    value_clip: float | None = None
    """PPO-style value clipping around the values computed before the K critic steps; null disables it."""
    gradient_clipping: float | None = 10.0
    """Gradient-norm clip of the critic's optimizer (0 disables it; null = ``deepspeed.gradient_clipping``, the
    actor's). Apart from the actor's on purpose: the critic's gradient norm runs at 4-27 in the quickstart, and a
    public SAO port traced a collapse to a critic starved by the actor's clip of 1.0."""
    value_positions: str = "token"
    """Where the critic is read and trained: ``token`` (the state before every action token, and after each turn's
    action) or ``turn`` (only the states where a turn begins, after the prompt or an observation, and after each
    turn's action; every action token of a turn takes the value of its turn's start). Measured on the levels job:
    ridge heads on the same frozen features explain 0.38 of the held-out first-action return variance fitted at turn
    starts against 0.01 fitted over every token; but RL with it (and ``train_backbone: false``) made seed 0's policy
    worse, -0.125 against SFT: the unbounded head's values left [0, 1] and credited failed turns up
    (docs/results.md, "Where the critic reads the level"). An ablation, not a default."""
    value_range: list[float] | None = None
    """``[low, high]``: the values the advantages (and lambda < 1 targets, and the probe) read are clamped to this
    range, the returns' own (``[0, 1]`` for 0/1 outcome rewards at gamma 1), so no state is valued beyond what any
    episode can earn and a failed turn is never credited up by a value below the worst return. The critic still
    trains on its raw output. null: no clamp. Measured with the turn-start linear critic on the levels job (seeds
    0-1): the signs came right and the policy did no better, -0.219 and +0.016 against SFT (docs/results.md, "The
    turn-start critic with its values clamped")."""


@dataclass
class TrainerConfig:
    """The algorithm and its knobs."""

    algorithm: str = "sao"
    """A registered algorithm: sao (default), grpo, grpo_dis, ppo (VAPO-style), running_mean, or one added with
    ``sao.trainer.algos.registry.register_algorithm`` (see docs/register_algorithm.md)."""
    advantage: str | None = None
    """Override the algorithm's advantage estimator, e.g. ``gae`` (token-level GAE that steps through observation
    tokens) for the ablation against skip-observation GAE; null = the algorithm's own."""
    batch_size: int = 8
    """Episodes per policy step (each with all its rows; under GRPO, ``batch_size / group_size`` whole groups)."""
    lr: float = 1e-5
    weight_decay: float = 0.0
    critic_updates_per_step: int = 4
    """K: critic optimizer steps per policy step (the faster value update)."""
    eps_low: float = 0.2
    """PPO trust region (and the DIS band when ``dis_band: custom``): ratios r <= 1 - eps_low are clipped (PPO) or
    masked out (DIS)."""
    eps_high: float = 0.28
    """PPO trust region (and the DIS band when ``dis_band: custom``): ratios r >= 1 + eps_high are clipped (PPO)
    or masked out (DIS)."""
    dis_band: str = "coding"
    """The DIS band (losses that mask by it: ``dis``): ``reasoning`` keeps ratios in (0.7, 6.0) and ``coding`` in
    (0.2, 4.0), as the paper's public ports report them (temperature 1, top-p 1); ``custom`` uses
    (1 - eps_low, 1 + eps_high). Strict: a ratio exactly on a bound is masked. The default is ``coding``: in
    `sao bench learning` it learned as fast as the others on the plain task and collapsed least under staleness
    (docs/benchmarks.md)."""
    gamma: float = 1.0
    """GAE discount per action token (skip-observation GAE counts action tokens only)."""
    lam: float = 1.0
    """GAE lambda of the actor's advantages (``lambda`` is accepted as the YAML key too). With gamma = lam = 1 the
    advantage is the Monte-Carlo return minus V whatever the estimator; lam < 1 makes the critic's values matter."""
    critic_lam: float = 1.0
    """GAE lambda of the critic's targets (VAPO-style: 1 = unbiased Monte-Carlo returns)."""
    length_adaptive_lambda: bool = False
    """VAPO's length-adaptive lambda for the policy: lambda = 1 - 1 / (lambda_alpha * action_tokens)."""
    lambda_alpha: float = 0.05
    max_staleness: int = 4
    """The most versions between a trajectory's oldest action segment and the step that trains it."""
    staleness_policy: str = "wait"
    """How ``max_staleness`` holds: ``wait`` (admission control: no episode starts that could not be trained in
    time, and the trainer waits for the oldest ones; nothing finished is dropped, so long episodes are not
    selected against) or ``drop`` (drop trajectories past the bound, counted as ``dropped_stale``)."""
    update_order: str = "advantages_first"
    """Critic algorithms: ``advantages_first`` (ours: the policy's advantages and the critic's returns both from
    the values before the K critic steps) or ``critic_first`` (the order the paper's ports use: K critic steps,
    then the policy's advantages from the updated critic, at the cost of one more critic forward)."""
    sync_every: int = 1
    """Push new weights to the inference engine every N versions."""
    group_size: int = 4
    """GRPO: rollouts per prompt."""
    ppo_epochs: int | None = None
    """Optimizer steps of the actor on each batch (> 1 lets a PPO-style clip act; the old-policy recompute
    happens once, before the first); null = the algorithm's own (ppo: 2, where 1 would leave its clip inert;
    others: 1)."""
    behavior_weight_cap: float | None = None
    """ppo (decoupled PPO): drop tokens whose behaviour weight pi_old / pi_rollout exceeds this; null = the
    algorithm's own (ppo: 2.0); ``.inf`` = no cap."""
    entropy_coef: float = 0.0
    critic_warmup_steps: int = 0
    """Critic-only updates before the first policy step: the first N batches train only the critic (K steps each;
    the policy and its version stay put), so the first advantages come from a critic that has seen the policy's own
    rollouts (the paper's ports use 10). Needs an algorithm whose spec declares ``critic_warmup``."""
    warmup_steps: int = 0
    """Linear learning-rate warmup of the actor over its first N optimizer steps (0 = none)."""
    normalize_advantages: bool = False
    """Whiten the advantages over the global batch's action tokens (``(A - mean) / std``) before the policy step:
    the step size no longer depends on the critic's current error or the batch's reward spread."""
    advantage_std_floor: float = 0.2
    """Whitening divides by ``max(std, floor)``: a batch whose advantages barely differ (all solved, an accurate
    critic) is not blown up into unit-size noise (which can undo a learned policy)."""
    skip_uniform_reward_batches: bool = False
    """Take no policy step on a batch whose trajectories all earned the same total reward (the critic still takes
    its K steps). Such a batch has no outcome signal: its advantages are only the critic's errors, which are
    systematic per state; normalisation scales them up and Adam turns a steady sign into lr-sized steps. Over a
    long all-success stretch that drift flipped converged policies into deterministic wrong ones, from which the
    policy gradient (proportional to 1 - p) cannot return (`sao bench stability`, docs/benchmarks.md)."""
    running_mean_momentum: float = 0.9
    """running_mean: EMA momentum of the reward baseline."""
    baseline_key: str = ""
    """running_mean: keep one running mean per value of this field of each episode's info (e.g. ``level``: a
    baseline that knows each episode's difficulty exactly, the most any critic reading the prompt could know of it),
    scoring an episode against its key's mean (the mean over all episodes until its key has one); empty: one mean
    for all episodes. Key by a field the env sets from the task (the level), never one the policy's actions write:
    the policy would pick the baseline it is scored against."""
    token_records: int = 0
    """Per-token records of what each step did (``RUN_DIR/token_records.jsonl``, read by `sao view`): for this many
    episodes of each batch (a seeded sample of rank 0's rows), per action token the engine's logprob, the new
    logprob, the DIS ratio and whether the band masked it, the advantage and the value; 0: off. Disk per step is
    bounded by ``N x action tokens x ~45 bytes`` (docs/view.md)."""


@dataclass
class RolloutConfig:
    """How episodes are produced."""

    engine: str = "hf"
    """An engine of ``sao.agent.engines.registry``: ``hf`` (in-process transformers, follows the trainer's weights) or
    ``vllm`` (servers), or one registered from outside the package (docs/register_engine.md)."""
    vllm_urls: list[str] = field(default_factory=list)
    """vllm: server URLs; empty = launch one local server on the actor. Servers given here are checked before the
    first episode (``sao.agent.engines.vllm_check``): the trainer's model and, at a temperature other than 1,
    ``--logprobs-mode processed_logprobs``; a mismatch is refused naming the fix."""
    stage_engine: str | None = None
    """The engine a staged run's ``eval`` and ``pretrain_value`` stages roll out on; null = ``engine``. One that
    runs in this process (``hf``) gets the stage's model; a server engine (``vllm``) is started on the stage's
    model directory and stopped with the stage (on CPU its prefix cache spares multi-turn episodes the re-read
    of the whole context every turn that the in-process engine pays)."""
    concurrency: int = 4
    """Episodes in flight."""
    buffer_size: int = 16
    """Finished episodes waiting for the trainer; a full buffer pauses new episodes (backpressure)."""
    max_tokens: int = 64
    """Max new tokens per action."""
    temperature: float = 1.0
    """Sampling temperature; the trainer's logprob recompute divides the logits by the same value, so the DIS
    ratio compares the distribution that was sampled from."""
    top_p: float = 1.0
    """Nucleus sampling is not supported for training (the recompute would not truncate the same way): keep 1."""
    top_k: int = 0
    """Top-k sampling is not supported for training (same reason): keep 0 (off)."""
    max_turns: int = 8
    max_context_tokens: int = 2048
    render_check_every: int = 8
    """Every N-th episode re-renders its whole conversation with the chat template and records the share of token
    positions that differ from what the model saw (``render_drift`` in the trajectory and the step metrics); 0: off."""
    action_vocab: list[str] = field(default_factory=list)
    """Restrict sampling (and the trained policy) to these words' tokens, e.g. ``[A, B, C]`` for the toy game with
    a random-init model; empty = the full vocabulary. Needs ``engine: hf``."""
    weight_sync: str = "checkpoint"
    """vllm: how new weights reach the servers: ``checkpoint`` (a safetensors dir every server reads: needs a
    filesystem shared with the trainer) or ``broadcast`` (in memory over a process group: gloo on CPU, NCCL on GPU)."""
    sync_bucket_mb: float = 64.0
    """broadcast: tensors travel in flat buckets of at most this many MiB (0 = one tensor per message)."""
    sync_timeout_s: float = 120.0
    """broadcast: the longest wait for the engines to join and for each bucket; past it the sync fails with an error
    naming the step (never a hang)."""
    server_grace_s: float = 120.0
    """vllm_urls: the servers given are health-checked (``GET /health``) while the run trains; when none has
    answered for longer than this many seconds the run stops with a checkpoint and exit 75 (restart them, then
    ``sao train --resume``); 0: not watched. The run's own server is watched without a grace (its process exits)."""
    infra_stall_s: float = 300.0
    """The rollout side is gone when, for this many seconds, every episode that ended was an infra error, at least
    max(16, 2 x concurrency) of them in a row (dead rollout workers, an engine or a Docker daemon that cannot serve):
    the run then stops with a checkpoint and exit 75 instead of playing failing episodes forever; 0: never. (A run
    whose episodes have all failed from its start stops at once with an error instead: that is its setup.)"""


@dataclass
class EnvConfig:
    """Which environment and which tasks."""

    id: str = "sao/TokenGame-v0"
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``gymnasium.make``."""
    tasks: str | None = None
    """A JSONL file of tasks, ``arithmetic`` (generated easy arithmetic tasks), ``arithmetic_chain`` (levels 1-4 of
    chained tool calls; ``arithmetic_chain:1,2,3,3,4`` for a level mix), or null (the env's own)."""
    num_tasks: int = 1000


@dataclass
class HarnessConfig:
    """What plays the episodes (``sao.agent.harness.registry``), in every stage and in RL alike."""

    harness: str = "sao"
    """``sao``: SAO's own episode loop and the env's tools; ``mini_swe_agent``: the real mini-swe-agent package
    (its agent, prompts and step limit ``rollout.max_turns``) behind SAO's gateway, which records each episode's
    exact tokens (one trajectory per row: a prefix break starts a new one); or one registered from outside."""
    config: str = ""
    """The harness's own config (mini-swe-agent: one of its config names or a YAML path); empty: its default."""


@dataclass
class DeepSpeedConfig:
    """The DeepSpeed engines of the actor and the critic."""

    zero_stage: int = 0
    bf16: bool = False
    offload_optimizer: bool = False
    offload_param: bool = False
    micro_batch_size: int = 8
    """Most sequences per forward/backward; a batch is split into micro batches (gradient accumulation)."""
    micro_batch_tokens: int = 4096
    """Token budget of a micro batch (rows x its longest row, padding included): rows are sorted by length, balanced
    over the ranks by tokens, and each micro batch, padded only to its own longest row, takes rows while it stays
    within both this budget and ``micro_batch_size`` (a row longer than the budget is a micro batch alone). Memory
    then follows tokens, not the batch's longest row. 0 = the plain row cut: ``micro_batch_size`` rows per micro
    batch, all padded to the batch's longest row."""
    gradient_clipping: float = 1.0


STAGES = ("collect", "sft", "eval", "pretrain_value", "train")


@dataclass
class SFTConfig:
    """Supervised fine-tuning (``sao sft``, and the ``sft`` stage): loss on action tokens only."""

    data: list[str] = field(default_factory=list)
    """JSONL / parquet files or hub ids of chat conversations (OpenAI messages) or SAO trajectories (see
    ``trainer/sft/data.py``); the ``sft`` stage of a staged run uses the ``collect`` stage's trajectories."""
    min_reward: float | None = None
    """Trajectories only: keep those with ``reward >= min_reward`` (rejection sampling); null keeps all."""
    epochs: int = 1
    steps: int = 0
    """Optimizer steps; 0 = ``epochs`` passes over the data."""
    batch_size: int = 8
    """Sequences per optimizer step (split into ``deepspeed.micro_batch_size`` micro batches)."""
    lr: float = 1e-5
    weight_decay: float = 0.0
    warmup_steps: int = 0
    max_len: int = 2048
    """Longer sequences are skipped (and counted)."""


@dataclass
class CollectConfig:
    """The ``collect`` stage: demonstrations rolled out on the env by a model spec (``solver`` for arithmetic)."""

    model: str = "solver"
    n: int = 64
    """Episodes to roll out, on the training tasks (``env.tasks``)."""
    concurrency: int = 4


@dataclass
class PretrainValueConfig:
    """The ``pretrain_value`` stage: the critic's cold start on rollouts of the policy RL starts from."""

    rollouts: int = 64
    """Episodes of the current policy on training tasks (sampled at ``rollout.temperature``); a share of them
    (``holdout``) is kept out of the fit to measure the critic's explained variance."""
    holdout: float = 0.25
    """Share of the rollouts (whole tasks) held out of the fit; the stage reports explained variance on them."""
    epochs: int = 4
    """Passes over the fit rollouts (batches of ``trainer.batch_size``, one critic optimizer step each)."""
    lr: float | None = None
    """The critic's learning rate while pretraining; null = ``critic.lr``."""
    head_fit: str = "ridge"
    """How the value head starts the fit: ``ridge``, least squares of the returns on the critic's frozen features
    (a linear probe; its penalty cross-validated over episodes) before the gradient steps; ``none``, the random
    head (before 2026-12-06, where 24 steps at lr 3e-5 left a value near the mean: docs/results.md)."""
    concurrency: int = 8


@dataclass
class EvalConfig:
    """The ``eval`` stage: the current policy on held-out tasks (success, valid tool-call rate, mean turns)."""

    n: int = 32
    """Held-out tasks."""
    samples: int = 1
    """Episodes per held-out task (each its own seed). Each task is one unit, its solved fraction: the success
    rate's standard error and every paired difference are taken over tasks (the rate itself over episodes). With one
    episode per task at temperature 1 the same policy evaluated twice differs by as much as a gain RL makes
    (measured: 0.422 vs 0.547 on 64 tasks, docs/results.md); more samples shrink that part of the noise, the task
    draw's part stays."""
    seed: int = 1000
    """Held-out tasks are ``arithmetic`` tasks (``arithmetic_chain``, every level in turn, for a chain source) drawn
    with this seed alone (the same set for every ``run.seed``); any task whose problem is also a training task is
    skipped."""
    temperature: float = 1.0
    """Sampling temperature of the evaluated policy (0 = greedy)."""
    concurrency: int = 16
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """``env.kwargs`` overrides for the eval episodes only, e.g. ``{pass_to_pass_sample: null}``: a SWE job's
    training reward runs a sample of the tests, its evals grade on all of them as the official harness does."""
    critic_probe: bool = False
    """Measure the critic as a predictor on the eval episodes (``trainer.runs.critic_probe``): after value
    pretraining on the eval before it (the fitted critic), and after RL on the eval after it (RL's final critic): per
    difficulty level its mean value at the first action token against the success, and its held-out explained
    variance; in the summary and ``plots/critic_calibration.png``. Costs a critic load and a forward over the eval
    episodes per critic."""


CLUSTER_BACKENDS = ("local", "ray")
RESOURCE_KEYS = ("num_cpus", "num_gpus", "memory", "resources")


@dataclass
class ClusterConfig:
    """Where the roles run: one machine (``local``) or placed by Ray on an existing cluster (``ray``)."""

    backend: str = "local"
    """``local`` (this process and its torchrun ranks) or ``ray`` (trainer ranks, vLLM engines and rollout workers
    as Ray actors; see docs/scale.md)."""
    address: str | None = None
    """ray: the cluster to join (``auto``, ``127.0.0.1:6379``, ``ray://...``); null starts a local Ray instance."""
    advertise_host: str | None = None
    """The address other nodes use to reach this run's rendezvous points (DeepSpeed master, weight-sync group);
    null: 127.0.0.1 on ``local``, the Ray node IP on ``ray``."""
    trainer_ranks: int = 1
    """ray: trainer ranks (one DeepSpeed world across Ray actors; one per GPU, or per CPU slot)."""
    engines: int = 1
    """ray with rollout.engine=vllm: vLLM server actors (each starts a server with the SAO worker extension)."""
    rollout_workers: int = 1
    """ray: rollout worker actors; each runs episodes with its node's sandbox host (Docker engine, warm pool)."""
    trainer_resources: dict[str, Any] = field(default_factory=lambda: {"num_cpus": 1})
    """Ray resources of one trainer rank: ``num_cpus``, ``num_gpus``, ``memory`` (bytes), ``resources`` (custom)."""
    engine_resources: dict[str, Any] = field(default_factory=lambda: {"num_cpus": 1})
    rollout_resources: dict[str, Any] = field(default_factory=lambda: {"num_cpus": 1})
    sandbox_resources: dict[str, Any] = field(default_factory=lambda: {"num_cpus": 0})
    """ray: resources of one sandbox host (one per node with rollout workers, pinned there; it owns the node's
    Docker engine and warm pool). Its containers' CPUs are Docker's, not Ray's: hence 0 by default."""
    sandbox_host_restarts: int = 3
    """ray: times Ray restarts a dead sandbox host (its episodes in flight are infra errors); past that, the
    node's rollout workers get no more episodes and the run goes on on the other nodes."""


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    agent: HarnessConfig = field(default_factory=HarnessConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    collect: CollectConfig = field(default_factory=CollectConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    pretrain_value: PretrainValueConfig = field(default_factory=PretrainValueConfig)
    stages: list[str] = field(default_factory=list)
    """Run these stages in order under ``sao train`` (e.g. ``[collect, sft, eval, train, eval]``, see
    ``trainer/runs/stages.py``); empty = RL training only."""

    @property
    def algorithm(self) -> AlgorithmSpec:
        """The spec of ``trainer.algorithm`` (what the learner and the run branch on)."""
        return get_algorithm(self.trainer.algorithm)

    @property
    def uses_critic(self) -> bool:
        return self.algorithm.critic

    @property
    def policy_epochs(self) -> int:
        """``trainer.ppo_epochs`` as resolved when the config loaded (the algorithm's own if it was null)."""
        return self.trainer.ppo_epochs or 1

    @property
    def dis_bounds(self) -> tuple[float, float]:
        """``(eps_low, eps_high)`` of the DIS band: the ``trainer.dis_band`` preset, or the custom eps."""
        t = self.trainer
        return DIS_BANDS.get(t.dis_band, (t.eps_low, t.eps_high))

    @property
    def advantage_estimator(self) -> str:
        """``trainer.advantage`` if set, else the algorithm's estimator."""
        return self.trainer.advantage or self.algorithm.advantage

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        """Reject bad values and combinations; each message names the field and the fix."""
        t, r, d = self.trainer, self.rollout, self.deepspeed
        known = algorithm_names()
        if t.algorithm not in known:
            close = difflib.get_close_matches(t.algorithm, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"trainer.algorithm: unknown {t.algorithm!r}{hint}; choose one of {known}")
        self._fill_algorithm_defaults()
        checks: list[tuple[bool, str]] = [
            (t.critic_updates_per_step >= 1, "trainer.critic_updates_per_step (K) must be >= 1; set it to 1 or more"),
            (0 < t.eps_low < 1, "trainer.eps_low must be in (0, 1) (the ratio lower bound is 1 - eps_low)"),
            (t.eps_high > 0, "trainer.eps_high must be > 0 (the ratio upper bound is 1 + eps_high)"),
            (0 <= t.gamma <= 1, "trainer.gamma must be in [0, 1]"),
            (0 <= t.lam <= 1, "trainer.lam (lambda) must be in [0, 1]"),
            (0 <= t.critic_lam <= 1, "trainer.critic_lam must be in [0, 1]"),
            (t.ppo_epochs is not None and t.ppo_epochs >= 1, "trainer.ppo_epochs must be >= 1 (1 = one per batch)"),
            (
                t.dis_band in (*DIS_BANDS, "custom"),
                f"trainer.dis_band: unknown {t.dis_band!r}; use one of {[*DIS_BANDS, 'custom']}",
            ),
            (
                t.staleness_policy in ("wait", "drop"),
                f"trainer.staleness_policy: unknown {t.staleness_policy!r}; use 'wait' or 'drop'",
            ),
            (
                t.update_order in ("advantages_first", "critic_first"),
                f"trainer.update_order: unknown {t.update_order!r}; use 'advantages_first' or 'critic_first'",
            ),
            (
                t.behavior_weight_cap is None or t.behavior_weight_cap > 1,
                "trainer.behavior_weight_cap must be > 1 (or null for no cap)",
            ),
            (t.lambda_alpha > 0, "trainer.lambda_alpha must be > 0"),
            (t.batch_size >= 1, "trainer.batch_size must be >= 1"),
            (t.lr > 0, "trainer.lr must be > 0"),
            (t.advantage_std_floor > 0, "trainer.advantage_std_floor must be > 0"),
            (t.warmup_steps >= 0, "trainer.warmup_steps must be >= 0 (0 = no warmup)"),
            (t.critic_warmup_steps >= 0, "trainer.critic_warmup_steps must be >= 0 (0 = no critic-only warm-up)"),
            (t.max_staleness >= 0, "trainer.max_staleness must be >= 0 (0 = fully on-policy)"),
            (t.sync_every >= 1, "trainer.sync_every must be >= 1"),
            (t.group_size >= 1, "trainer.group_size must be >= 1"),
            (0 <= t.running_mean_momentum < 1, "trainer.running_mean_momentum must be in [0, 1)"),
            (t.token_records >= 0, "trainer.token_records must be >= 0 (episodes recorded per step; 0 = off)"),
            (r.concurrency >= 1, "rollout.concurrency must be >= 1"),
            (r.buffer_size >= 1, "rollout.buffer_size must be >= 1"),
            (r.max_tokens >= 1, "rollout.max_tokens must be >= 1"),
            (r.temperature > 0, "rollout.temperature must be > 0 (greedy decoding has no logprobs to train on)"),
            (
                r.top_p == 1.0 and r.top_k == 0,
                "rollout.top_p / rollout.top_k: truncated sampling is not supported for training (the trainer's "
                "logprob recompute would not truncate the same way, so the DIS ratios would be wrong); set "
                "rollout.top_p=1.0 and rollout.top_k=0 and use rollout.temperature instead",
            ),
            (r.max_turns >= 1, "rollout.max_turns must be >= 1"),
            (r.server_grace_s >= 0, "rollout.server_grace_s must be seconds >= 0 (0: the servers are not watched)"),
            (r.infra_stall_s >= 0, "rollout.infra_stall_s must be seconds >= 0 (0: never stop on infra errors)"),
            (d.zero_stage in (0, 1, 2, 3), "deepspeed.zero_stage must be 0, 1, 2 or 3"),
            (d.micro_batch_size >= 1, "deepspeed.micro_batch_size must be >= 1"),
            (
                d.micro_batch_tokens >= 0,
                "deepspeed.micro_batch_tokens must be >= 0 (a token budget per micro batch; 0 = the plain row cut)",
            ),
            (d.gradient_clipping >= 0, "deepspeed.gradient_clipping must be >= 0 (0 disables clipping)"),
            (self.model.dtype in ("float32", "bfloat16"), "model.dtype must be 'float32' or 'bfloat16'"),
            (self.run.total_steps >= 1, "run.total_steps must be >= 1"),
            (self.run.save_every >= 1, "run.save_every must be >= 1"),
            (self.run.keep_checkpoints >= 1, "run.keep_checkpoints must be >= 1"),
            (self.run.export_every >= 0, "run.export_every must be >= 0 (0 = never)"),
        ]
        checks += _critic_checks(self) + _engine_checks(self) + _harness_checks(self) + _cluster_checks(self)
        checks += _stage_checks(self)
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)
        self._validate_algorithm()

    def _fill_algorithm_defaults(self) -> None:
        """Trainer fields left null take the algorithm's own value (``AlgorithmSpec.defaults``), else the generic
        one; the resolved config saved with a run then shows what ran."""
        t = self.trainer
        for name, value in self.algorithm.defaults:
            if getattr(t, name) is None:
                setattr(t, name, value)
        if t.ppo_epochs is None:
            t.ppo_epochs = 1

    def _validate_algorithm(self) -> None:
        """The checks the algorithm's spec asks for: registered parts, grouping, critic, its own checks."""
        t, spec = self.trainer, self.algorithm
        if spec.policy_loss not in policy_loss_names():
            raise ConfigError(
                f"trainer.algorithm {spec.name!r} names the policy loss {spec.policy_loss!r}, which is not registered; "
                f"register it (sao.trainer.algos.registry.register_policy_loss) before loading the config"
            )
        est = self.advantage_estimator
        if est not in advantage_names():
            close = difflib.get_close_matches(est, advantage_names(), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"trainer.advantage: unknown estimator {est!r}{hint}; choose one of {advantage_names()}")
        traits = advantage_traits(est)
        loss_traits = policy_loss_traits(spec.policy_loss)
        if loss_traits.needs_old_logp != spec.old_policy_recompute:
            need = "needs" if loss_traits.needs_old_logp else "does not use"
            raise ConfigError(
                f"trainer.algorithm {spec.name!r}: its policy loss {spec.policy_loss!r} {need} an old-policy recompute "
                f"but the spec sets old_policy_recompute={spec.old_policy_recompute}; make them agree in the spec"
            )
        staleness = t.max_staleness if spec.max_staleness is None else spec.max_staleness
        if t.staleness_policy == "wait" and not spec.synchronous and staleness < t.sync_every:
            raise ConfigError(
                f"trainer.max_staleness ({staleness}) < trainer.sync_every ({t.sync_every}): with "
                "staleness_policy=wait no episode could be started that is sure to be trained in time (the engine "
                "may hold weights sync_every versions old); raise trainer.max_staleness or set "
                "trainer.staleness_policy=drop"
            )
        if t.baseline_key and not traits.needs_baseline:
            raise ConfigError(
                f"trainer.baseline_key {t.baseline_key!r} keys a running-mean baseline, but trainer.advantage {est!r} "
                "keeps none; use trainer.algorithm=running_mean or clear trainer.baseline_key"
            )
        if traits.needs_values and not spec.critic:
            raise ConfigError(
                f"trainer.advantage {est!r} needs critic values, but algorithm {spec.name!r} trains no critic; "
                "pick an algorithm with a critic (sao, ppo) or another estimator"
            )
        if traits.needs_groups and not spec.grouped:
            raise ConfigError(
                f"trainer.advantage {est!r} compares rollouts of one prompt, but algorithm {spec.name!r} does not "
                "roll out in groups; pick a grouped algorithm (grpo, grpo_dis) or another estimator"
            )
        if spec.critic and not traits.needs_values:
            alt = f"trainer.algorithm={est}" if est in algorithm_names() else "an algorithm without a critic"
            raise ConfigError(
                f"trainer.advantage {est!r} reads no critic values, but algorithm {spec.name!r} trains a critic for "
                f"its advantages; use {alt} or an estimator that reads the critic (skip_obs_gae, gae)"
            )
        if spec.grouped and t.batch_size % t.group_size:
            raise ConfigError(
                f"trainer.batch_size ({t.batch_size}) must be a multiple of trainer.group_size ({t.group_size}) "
                f"for {spec.name} (it trains on whole groups); change one of them"
            )
        if t.critic_warmup_steps and not (spec.critic and spec.critic_warmup):
            raise ConfigError(
                f"trainer.critic_warmup_steps ({t.critic_warmup_steps}): algorithm {spec.name!r} has no critic to "
                "warm up (its spec does not declare critic_warmup); set trainer.critic_warmup_steps=0 or pick sao/ppo"
            )
        if "pretrain_value" in self.stages and not spec.critic:
            raise ConfigError(
                f"stages: pretrain_value trains a critic, but algorithm {spec.name!r} has none; drop the stage or "
                "pick an algorithm with a critic (sao, ppo)"
            )
        for check in spec.checks:
            msg = check(self)
            if msg:
                raise ConfigError(f"trainer.algorithm {spec.name!r}: {msg}")


def _harness_checks(cfg: Config) -> list[tuple[bool, str]]:
    """``agent.harness`` is registered and plays ``env.id``."""
    from sao.agent.harness.registry import harness_spec

    try:
        harness_spec(cfg.agent.harness).check_env(cfg.env.id)
    except ValueError as e:
        return [(False, f"agent.harness: {e}")]
    return []


def _stage_checks(cfg: Config) -> list[tuple[bool, str]]:
    s, e, p = cfg.sft, cfg.eval, cfg.pretrain_value
    unknown = [x for x in cfg.stages if x not in STAGES]
    return [
        (not unknown, f"stages: unknown {unknown}; each stage is one of {list(STAGES)}"),
        ("sft" not in cfg.stages or "collect" in cfg.stages or bool(s.data),
         "stages: the sft stage needs data: add a collect stage before it or set sft.data"),
        (s.epochs >= 1, "sft.epochs must be >= 1"),
        (s.steps >= 0, "sft.steps must be >= 0 (0 = sft.epochs passes)"),
        (s.batch_size >= 1, "sft.batch_size must be >= 1"),
        (s.lr > 0, "sft.lr must be > 0"),
        (s.warmup_steps >= 0, "sft.warmup_steps must be >= 0"),
        (s.max_len >= 2, "sft.max_len must be >= 2 tokens"),
        (cfg.collect.n >= 1, "collect.n must be >= 1"),
        (cfg.collect.concurrency >= 1, "collect.concurrency must be >= 1"),
        (e.n >= 1, "eval.n must be >= 1"),
        (e.samples >= 1, "eval.samples must be >= 1 (episodes per held-out task)"),
        (e.temperature >= 0, "eval.temperature must be >= 0 (0 = greedy)"),
        (e.concurrency >= 1, "eval.concurrency must be >= 1"),
        (p.rollouts >= 2, "pretrain_value.rollouts must be >= 2 (some to fit, some held out)"),
        (0 < p.holdout < 1, "pretrain_value.holdout must be in (0, 1) (the share of rollouts kept out of the fit)"),
        (p.epochs >= 1, "pretrain_value.epochs must be >= 1"),
        (p.lr is None or p.lr > 0, "pretrain_value.lr must be > 0 (or null for critic.lr)"),
        (p.concurrency >= 1, "pretrain_value.concurrency must be >= 1"),
        (p.head_fit in ("ridge", "none"), f"pretrain_value.head_fit: unknown {p.head_fit!r}; use ridge or none"),
        ("pretrain_value" not in cfg.stages or "train" in cfg.stages[cfg.stages.index("pretrain_value"):],
         "stages: pretrain_value warms the critic of a later train stage; put a train stage after it"),
    ]  # fmt: skip


def _is_low_high(pair: list[float]) -> bool:
    return len(pair) == 2 and all(math.isfinite(x) for x in pair) and pair[0] < pair[1]


def _critic_checks(cfg: Config) -> list[tuple[bool, str]]:
    c = cfg.critic
    return [
        (
            c.gradient_clipping is None or c.gradient_clipping >= 0,
            "critic.gradient_clipping must be >= 0 (0 disables clipping; null = deepspeed.gradient_clipping)",
        ),
        (
            c.value_positions in VALUE_POSITIONS,
            f"critic.value_positions: unknown {c.value_positions!r}; use token or turn",
        ),
        (c.lr > 0, "critic.lr must be > 0"),
        (
            c.value_range is None or _is_low_high(c.value_range),
            f"critic.value_range: {c.value_range!r} is not [low, high] with finite low < high; "
            "use e.g. [0, 1] for 0/1 rewards, or null for no clamp",
        ),
    ]


def _engine_checks(cfg: Config) -> list[tuple[bool, str]]:
    """What ``rollout.engine``'s registry entry (``sao.agent.engines.registry``) allows: training with it at all, the
    restricted vocabulary, the weight-sync kind, Ray placement; and what the stages' engine can play."""
    r, c = cfg.rollout, cfg.cluster
    usable = ", ".join(trainable_engines())
    try:
        e = engine_spec(r.engine)
    except ValueError:
        return [(False, f"rollout.engine: unknown {r.engine!r}; use one of {usable}")]
    if e.placement is None:
        return [(False, f"rollout.engine: {r.engine!r} cannot train ({e.summary}); use one of {usable}")]

    def having(flag: str) -> str:
        return ", ".join(x.name for x in engines() if getattr(x, flag))

    syncing = ", ".join(x.name for x in engines() if r.weight_sync in x.weight_sync)
    stages = list(dict.fromkeys(s for s in cfg.stages if s in ("eval", "pretrain_value")))
    checks = [
        (not r.action_vocab or e.restricted_vocab,
         f"rollout.action_vocab needs an engine that samples from a restricted vocabulary ({having('restricted_vocab')}"
         f"), not {r.engine!r}; set rollout.engine to one of them or clear one of them"),
        (r.weight_sync not in WEIGHT_SYNC_KINDS or r.weight_sync in e.weight_sync,
         f"rollout.weight_sync={r.weight_sync} needs rollout.engine={syncing or '(none registered)'} (engine "
         f"{r.engine!r} supports {', '.join(e.weight_sync)})"),
        (c.backend == "local" or e.placement == "server",
         f"cluster.backend=ray needs a server engine, rollout.engine={having('connect')} (rollout workers on other "
         f"nodes call its servers; {r.engine!r} lives in the trainer's process)"),
        (c.backend == "local" or bool(r.vllm_urls) or e.ray_actor,
         f"cluster.backend=ray: engine {r.engine!r} has no Ray engine actor to start its servers; list them in "
         f"rollout.vllm_urls or use an engine that has one ({having('ray_actor')})"),
        (c.backend != "local" or e.placement != "server" or bool(r.vllm_urls) or e.serve is not None,
         f"rollout.engine={r.engine!r} cannot start a server of its own; list its servers in rollout.vllm_urls"),
    ]  # fmt: skip
    if not stages:
        return checks
    name = r.stage_engine or r.engine
    try:
        se = engine_spec(name)
    except ValueError:
        return [*checks, (False, f"rollout.stage_engine: unknown {name!r}; use one of {usable}")]
    where = "rollout.stage_engine" if r.stage_engine else "rollout.engine"
    return [
        *checks,
        (se.in_process is not None or se.serve is not None,
         f"stages: {', '.join(stages)} play the current model, which {where}={name!r} can neither hold in this "
         f"process nor serve; set rollout.stage_engine to one of {having('in_process')}, {having('serve')}"),
        (se.in_process is not None or not str(cfg.model.path).startswith("tiny:"),
         f"{where}={name!r} serves a model directory, and model.path={cfg.model.path!r} is built in memory; use "
         f"rollout.stage_engine={having('in_process')}"),
    ]  # fmt: skip


def _cluster_checks(cfg: Config) -> list[tuple[bool, str]]:
    r, c = cfg.rollout, cfg.cluster
    out = [
        (r.weight_sync in WEIGHT_SYNC_KINDS, f"rollout.weight_sync must be one of {', '.join(WEIGHT_SYNC_KINDS)}"),
        (r.sync_bucket_mb >= 0, "rollout.sync_bucket_mb must be >= 0 (0 = one tensor per message)"),
        (r.sync_timeout_s > 0, "rollout.sync_timeout_s must be > 0 (seconds)"),
        (c.backend in CLUSTER_BACKENDS, f"cluster.backend: unknown {c.backend!r}; use one of {list(CLUSTER_BACKENDS)}"),
        (c.trainer_ranks >= 1, "cluster.trainer_ranks must be >= 1"),
        (c.engines >= 1, "cluster.engines must be >= 1"),
        (c.rollout_workers >= 1, "cluster.rollout_workers must be >= 1"),
        (c.sandbox_host_restarts >= 0, "cluster.sandbox_host_restarts must be >= 0"),
    ]
    for role in ("trainer", "engine", "rollout", "sandbox"):
        res = getattr(c, f"{role}_resources")
        bad = sorted(set(res) - set(RESOURCE_KEYS))
        out.append((not bad, f"cluster.{role}_resources: unknown key(s) {bad}; use {list(RESOURCE_KEYS)}"))
    return out


_ALIASES = {"trainer.lambda": "trainer.lam", "trainer.K": "trainer.critic_updates_per_step"}


def config_from_dict(data: dict[str, Any], overrides: list[str] | None = None) -> Config:
    """The validated config of a mapping of sections with dotted ``key=value`` overrides applied."""
    cfg = build(Config, apply_overrides(data or {}, overrides or []), aliases=_ALIASES)
    cfg.validate()
    return cfg


def load_config(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Load a YAML config file, apply dotted ``key=value`` overrides, validate."""
    return config_from_dict(load_yaml(path), overrides)


def save_config(cfg: Config, path: str | Path) -> None:
    """The resolved config as YAML, atomically (a kill while saving never leaves a run a torn ``config.yaml``)."""
    write_yaml_atomic(path, cfg.to_dict())


# Fields that may change between a run and its resume without changing what is being trained.
RESUME_MUTABLE = {
    "run.dir",
    "run.total_steps",
    "run.param_digest",
    "run.progress",
    "run.plot",
    "run.tensorboard",
    "run.wandb_project",
    "cluster.address",  # a resumed run may join another Ray cluster
    "cluster.advertise_host",
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


def resumed_config(cfg: Config, resume: str | Path) -> Config:
    """The saved config of the run in ``resume``, after checking that ``cfg`` (the config this resume was given:
    the saved one plus the command line's overrides, or another file) changes only what a resume may change
    (``RESUME_MUTABLE``); any other difference is refused naming its fields, so one run never mixes two configs.
    Plain and staged runs both resume through here."""
    saved_path = Path(resume) / "config.yaml"
    if not saved_path.exists():
        raise ConfigError(f"--resume {str(resume)!r}: no config.yaml there; pass a RUN_DIR written by `sao train`")
    saved = load_config(saved_path)
    diff = config_diff(saved, cfg)
    if diff:
        raise ConfigError(
            f"--resume {str(resume)!r}: the config differs from the run's saved config in {diff}; resume with the "
            f"saved config ({saved_path}) or start a new run.dir. A resume may change only "
            f"{', '.join(sorted(RESUME_MUTABLE))}"
        )
    return saved
