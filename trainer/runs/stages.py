"""A staged run under `sao train`: ``stages: [collect, sft, eval, train, eval]`` in the config.

Each stage writes its own folder ``RUN_DIR/NN_stage`` and a ``done.json`` there when it finishes; re-running
with ``--resume RUN_DIR`` skips finished stages (an unfinished ``train`` stage resumes from its checkpoint). The
model flows from stage to stage: ``sft`` and ``train`` start from the current model and replace it with their
``final/actor``.

* ``collect``: ``collect.n`` episodes of ``collect.model`` (a demonstrator of ``sao.agent.engines.registry``:
  ``solver`` for arithmetic, ``swe_demonstrator`` for SWE tasks) on the training tasks, through the one episode
  runner, in the env's sandboxes -> ``trajectories.jsonl``;
* ``sft``: ``sao.trainer.sft.run`` on ``sft.data`` or else the collected trajectories (``sft.min_reward``, default 1.0
  for collected ones: only solved episodes);
* ``eval``: the current model (on ``rollout.stage_engine``, else ``rollout.engine``: in this process, or a server
  started on the model's directory for the stage) on ``eval.n`` held-out tasks (success, valid tool-call rate,
  mean turns), its env made with ``env.kwargs`` updated by ``eval.env_kwargs``;
* ``pretrain_value``: rollouts of the current policy, a value fit on them and its held-out explained variance;
  the next ``train`` stage starts its critic from it;
* ``train``: SAO from the current model, through `sao train`'s entry point (``trainer.runs.run.train``, which runs the
  stages and hands itself in: run.py is the layer above this module).

At the end: a before/after table of every eval (printed, ``summary.md``, ``summary.json``) and
``plots/stages.png`` (the evals side by side and the RL success curve).
"""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sao.agent.engines.protocols import Engine
from sao.agent.engines.registry import InProcessArgs, ServeArgs, engine_spec, make_demonstrator
from sao.agent.episodes import episodes_of, is_last_row
from sao.agent.records import Trajectory
from sao.core import memory
from sao.core.console import say
from sao.core.jsonl import write_json_atomic, write_text_durably
from sao.core.paths import resolve_model_path
from sao.eval.scores import episode_scores, level_table, paired_difference, score_table
from sao.trainer import distributed as dist_utils
from sao.trainer.config import Config, ConfigError, resumed_config, save_config
from sao.trainer.rollout.env_tasks import load_env_tasks
from sao.trainer.rollout.runner import episode_runner
from sao.trainer.runs.run_folder import latest_checkpoint

DONE = "done.json"
TrainFn = Callable[..., Path]
"""`sao train`'s entry point, ``trainer.runs.run.train(config_path, overrides, resume=)``, which a train stage runs."""


def training_tasks(cfg: Config) -> list[dict[str, Any]]:
    tasks = load_env_tasks(cfg)
    if tasks is None:
        raise ConfigError("a staged run needs env.tasks (e.g. arithmetic): collect and eval draw from it")
    return tasks


def held_out_tasks(cfg: Config) -> list[dict[str, Any]]:
    """``eval.n`` tasks of the held-out split of ``env.tasks`` when it has one (``swe-offline:NAME``), else
    generated tasks drawn with ``eval.seed``, none of whose problems is a training task: ``arithmetic_chain`` with
    every level in turn (stratified by level, whatever the training mix) for a chain source, else ``arithmetic``.

    The draw does not depend on ``run.seed``: every seed and every arm is scored on the same set, so seeds differ
    only by their training, not by which tasks happened to be held out."""
    from sao.envs.datasets import generated_eval_spec, held_out_spec, load_tasks

    split = held_out_spec(cfg.env.tasks)
    if split is not None:
        held = load_tasks(split)[: cfg.eval.n]
        if len(held) < cfg.eval.n:
            raise ConfigError(f"eval.n={cfg.eval.n}: the held-out split {split} has {len(held)} tasks; lower eval.n")
        return held

    seen = {str(t.get("problem", t.get("prompt"))) for t in training_tasks(cfg)}
    pool = load_tasks(generated_eval_spec(cfg.env.tasks), num_generated=cfg.eval.n * 2 + 16, seed=cfg.eval.seed)
    out = [t for t in pool if t["problem"] not in seen][: cfg.eval.n]
    if len(out) < cfg.eval.n:
        raise ConfigError("eval: too few held-out tasks differ from the training tasks; change eval.seed")
    return out


async def _rollouts(
    cfg: Config, engine: Any, tokenizer: Any, tasks: list[Any], out: Path, conc: int, temp: float,
    env_kwargs: dict[str, Any] | None = None, samples: int = 1,
) -> list[Trajectory]:  # fmt: skip
    # The stages record no render drift (rollout.render_check_every is the training run's).
    runner = episode_runner(
        cfg,
        engine,
        tokenizer,
        temperature=temp,
        render_check_every=0,
        concurrency=conc,
        progress=cfg.run.progress,
        out_path=out,
        env_kwargs=env_kwargs,
    )
    got: list[Trajectory] = []
    try:
        await runner.run(episodes_of(tasks, seed=cfg.run.seed, samples=samples), on_trajectory=got.append)
    finally:
        await engine.close()
    return got


def collect_stage(cfg: Config, model_dir: str, out: Path) -> dict[str, Any]:
    from sao.trainer.learn.models import load_tokenizer

    c = cfg.collect
    tok = load_tokenizer(cfg)
    tasks = training_tasks(cfg)[: c.n]
    try:
        engine = make_demonstrator(c.model, tok, tasks)
    except ValueError as e:
        raise ConfigError(f"collect.model: {e}") from e
    t0 = time.perf_counter()
    rows = asyncio.run(_rollouts(cfg, engine, tok, tasks, out / "trajectories.jsonl", c.concurrency, 0.0))
    trajs = [t for t in rows if is_last_row(t)]  # an outside agent's episode may have several rows: count it once
    solved = sum(bool(t.info.get("solved")) for t in trajs)
    return {
        "episodes": len(trajs),
        "rows": len(rows),
        "solved": solved,
        "infra_errors": sum(t.status == "infra_error" for t in trajs),
        "wall_s": time.perf_counter() - t0,
    }


def _stage_engine(cfg: Config, tokenizer: Any, model_dir: str, out: Path) -> Engine:
    """The stages' engine (``rollout.stage_engine``, else ``rollout.engine``) on the current model: in this
    process when it can live there, else one server started on ``model_dir`` that closing the engine stops
    (config validation refuses an engine that can do neither)."""
    spec = engine_spec(cfg.rollout.stage_engine or cfg.rollout.engine)
    if spec.in_process is not None:
        from sao.trainer.learn.models import load_actor

        return spec.in_process(InProcessArgs(load_actor(cfg), tokenizer, seed=cfg.run.seed))
    assert spec.serve is not None and spec.connect is not None, "config validation refuses such a stage engine"
    log = out / "logs" / "stage_server.log"
    path = resolve_model_path(model_dir)  # the first stage's model may be an alias (smollm2)
    server = spec.serve(ServeArgs(path, log_path=str(log), max_model_len=cfg.rollout.max_context_tokens))
    try:
        return spec.connect([server.url], [server])
    except BaseException:
        server.stop()  # no engine owns it yet
        raise


def eval_stage(cfg: Config, model_dir: str, out: Path) -> dict[str, Any]:
    from sao.trainer.learn.models import load_tokenizer

    tok = load_tokenizer(cfg)
    t0 = time.perf_counter()
    engine = _stage_engine(cfg, tok, model_dir, out)
    tasks = held_out_tasks(cfg)
    trajs = asyncio.run(
        _rollouts(cfg, engine, tok, tasks, out / "trajectories.jsonl", cfg.eval.concurrency,
                  cfg.eval.temperature, cfg.eval.env_kwargs, cfg.eval.samples)
    )  # fmt: skip
    scores = episode_scores(trajs, tok, tasks)
    scores["model"], scores["wall_s"] = model_dir, time.perf_counter() - t0
    rl = _stage_before(out, "train")
    if cfg.eval.critic_probe and rl is not None and (rl / "final" / "critic").is_dir():
        from sao.trainer.runs.critic_probe import calibrate

        critics = {"after RL": str(rl / "final" / "critic")}
        fitted = _stage_before(out, "pretrain_value")
        if fitted is not None and (fitted / "value_init").is_dir():  # where RL's critic started, on the same episodes
            critics = {"after value pretraining": str(fitted / "value_init"), **critics}
        scores["critic_calibration"] = calibrate(cfg, critics, out)
    return scores


def _stage_before(out: Path, stage: str) -> Path | None:
    """The folder of the last ``stage`` stage before the stage writing to ``out`` (same run dir), if any."""
    found = sorted(p for p in out.parent.glob(f"[0-9][0-9]_{stage}") if p.name < out.name)
    return found[-1] if found else None


def sft_stage(cfg: Config, model_dir: str, out: Path, collected: Path | None) -> dict[str, Any]:
    from sao.trainer.sft.run import run_sft

    c = copy.deepcopy(cfg)
    if not c.sft.data:
        if collected is None:
            raise ConfigError("the sft stage has no data: set sft.data or put a collect stage before it")
        c.sft.data = [str(collected)]
        if c.sft.min_reward is None:
            c.sft.min_reward = 1.0
    c.run.dir = str(out)
    resume = (out / "checkpoints" / "latest").exists()
    if not resume and dist_utils.rank() == 0:
        import shutil

        shutil.rmtree(out, ignore_errors=True)  # a stage that died before its first checkpoint starts over
    dist_utils.barrier()
    last = run_sft(c, out, resume=resume)
    return {"final_loss": last.get("sft_loss"), "token_accuracy": last.get("sft_token_accuracy"),
            "wall_s": last.get("wall_s"), "model": str(out / "final" / "actor")}  # fmt: skip


def pretrain_value_stage(cfg: Config, model_dir: str, out: Path) -> dict[str, Any]:
    """The critic's cold start: ``pretrain_value.rollouts`` episodes of the current policy (the one RL starts
    from, not the demonstrator) on training tasks, a value fit on most of them (``sao.trainer.learn.value_pretrain``)
    and the explained variance on the held-out rest, before and after; the critic goes to ``value_init`` for the next
    ``train`` stage's ``critic.init``."""
    from sao.trainer.learn.models import load_tokenizer
    from sao.trainer.learn.value_pretrain import fit_critic, read_rollouts, split_by_task

    p = cfg.pretrain_value
    path = out / "trajectories.jsonl"
    t0 = time.perf_counter()
    if dist_utils.rank() == 0 and _count_lines(path) < p.rollouts:
        # a stage cut short while rolling out starts its rollouts over; one cut short in the fit keeps them (they
        # came from this same policy, and rolling out is most of the stage's time)
        path.unlink(missing_ok=True)
        tok = load_tokenizer(cfg)
        tasks = training_tasks(cfg)
        # the tasks after the collected ones first (the demonstrations already covered those)
        start = min(cfg.collect.n if "collect" in cfg.stages else 0, max(len(tasks) - p.rollouts, 0))
        picked = (tasks[start:] + tasks[:start])[: p.rollouts]
        engine = _stage_engine(cfg, tok, model_dir, out)
        asyncio.run(_rollouts(cfg, engine, tok, picked, path, p.concurrency, cfg.rollout.temperature))
        del engine
        _release_memory()
    dist_utils.barrier()
    rollout_s = time.perf_counter() - t0
    trajs = read_rollouts(path)
    fit, held = split_by_task(trajs, p.holdout, cfg.run.seed)
    res = fit_critic(cfg, fit, held, p.epochs, p.lr or cfg.critic.lr, out / "value_init")
    rewards = [t.reward for t in trajs]
    res.update(
        rollouts=len(trajs),
        rollout_success=sum(bool(t.info.get("solved", t.reward > 0)) for t in trajs) / max(len(trajs), 1),
        rollout_reward_std=float(_std(rewards)),
        rollout_s=rollout_s,
        wall_s=time.perf_counter() - t0,
        critic=str(out / "value_init"),
    )
    held_eval = _stage_before(out, "eval")
    if cfg.eval.critic_probe and held_eval is not None and dist_utils.rank() == 0:
        from sao.trainer.runs.critic_probe import calibrate

        # only the fitted critic: the one before has an untrained head (held_out_ev_before says how far off it is),
        # and each probe costs a forward over every eval episode (~1.5 min for 64 chain episodes on 2 quiet cores)
        res["critic_calibration"] = calibrate(cfg, {"after value pretraining": res["critic"]}, held_eval)
    if dist_utils.rank() == 0:
        say(
            f"   value pretraining: held-out explained variance {res['held_out_ev_before']:.3f} -> "
            f"{res['held_out_ev_after']:.3f} ({len(held)} held-out rollouts, {len(fit)} fit)"
        )
    return res


def _count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    from sao.core.jsonl import iter_jsonl

    return sum(1 for _ in iter_jsonl(path, torn_tail_ok=True))  # a line torn by a kill does not count


def _std(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return float((sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5)


def train_stage(cfg: Config, model_dir: str, out: Path, train: TrainFn) -> dict[str, Any]:
    """SAO from the current model through `sao train`'s own entry point ``train`` (an unfinished stage resumes)."""
    import shutil

    from sao.trainer.runs.metrics import read_metrics

    c = copy.deepcopy(cfg)
    c.stages = []
    c.run.dir = str(out)
    t0 = time.perf_counter()
    if (out / "config.yaml").exists() and latest_checkpoint(out) is not None:
        train(None, [f"run.total_steps={c.run.total_steps}"], resume=str(out))
    else:
        if dist_utils.rank() == 0:
            shutil.rmtree(out, ignore_errors=True)  # a stage that died before its first checkpoint starts over
            out.mkdir(parents=True)
            save_config(c, out.parent / f"{out.name}.yaml")
        dist_utils.barrier()
        train(str(out.parent / f"{out.name}.yaml"), [])
    rows = read_metrics(out) if dist_utils.rank() == 0 else [{}]
    return {"steps": len(rows), "last_success_rate": rows[-1].get("success_rate"),
            **rl_dynamics(rows), "wall_s": time.perf_counter() - t0,
            "model": str(out / "final" / "actor")}  # fmt: skip


def rl_dynamics(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What says whether the policy steps carried signal: the share of batches whose episodes all earned one
    reward, of policy steps skipped, the critic's explained variance (first / last step), the mean DIS-masked
    share of action tokens, and how often a turn's advantage had its episode's sign (solved: > 0, failed: < 0)."""

    def mean(key: str) -> float | None:
        xs = [float(r[key]) for r in rows if isinstance(r.get(key), int | float)]
        return sum(xs) / len(xs) if xs else None

    evs = [r.get("explained_variance") for r in rows]
    masked = [float(r.get("mask_frac_low", 0.0)) + float(r.get("mask_frac_high", 0.0)) for r in rows
              if "mask_frac_low" in r]  # fmt: skip
    return {
        "uniform_batch_frac": mean("uniform_reward_batch"),
        "skipped_step_frac": sum(float(r.get("skipped_steps", 0) or 0) > 0 for r in rows) / max(len(rows), 1),
        "first_explained_variance": evs[0] if evs else None,
        "last_explained_variance": evs[-1] if evs else None,
        "dis_masked_frac": sum(masked) / len(masked) if masked else None,
        "batch_success_mean": mean("success_rate"),
        "adv_pos_turns_solved": mean("adv_pos_turns_solved"),
        "adv_neg_turns_failed": mean("adv_neg_turns_failed"),
    }


def _with_model(cfg: Config, model_dir: str) -> Config:
    c = copy.deepcopy(cfg)
    c.model.path = model_dir
    return c


def run_stages(cfg: Config, resume: str | None, train: TrainFn) -> Path:
    """Run ``cfg.stages`` in order in ``run.dir`` (see the module doc); returns the run dir. ``train``: `sao train`'s
    entry point, for the train stages."""
    run_dir = Path(resume) if resume else Path(cfg.run.dir)
    if resume is None and (run_dir / "config.yaml").exists():
        raise ConfigError(
            f"run.dir {str(run_dir)!r} already holds a run; continue it with `sao train --resume {run_dir}` "
            "or set run.dir to a new directory"
        )
    # On resume ``cfg`` is the run's saved config plus the command line's overrides (e.g. run.total_steps=30): the
    # same check as a plain run, before config.yaml is rewritten, so a resume changes only what a resume may change.
    if resume is not None:
        resumed_config(cfg, resume)
    dist_utils.init_distributed()
    rank0 = dist_utils.rank() == 0
    if rank0:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.yaml")
    t_run = time.perf_counter()
    model = cfg.model.path
    collected: Path | None = None
    critic: str | None = None  # a pretrain_value stage's critic, for the train stage after it
    results: list[dict[str, Any]] = []
    every: list[dict[str, Any]] = []
    label = "base"
    for i, stage in enumerate(cfg.stages):
        out = run_dir / f"{i:02d}_{stage}"
        done = out / DONE
        if done.exists():
            res = json.loads(done.read_text())
        else:
            out.mkdir(parents=True, exist_ok=True)
            if rank0:
                say(f"== stage {i + 1}/{len(cfg.stages)}: {stage} ({out})")
            c = _with_model(cfg, model)
            cpu0 = _cpu_s()
            memory.reset_peak_rss()
            res = {}
            if stage in ("collect", "eval"):
                if rank0:
                    res = collect_stage(c, model, out) if stage == "collect" else eval_stage(c, model, out)
            elif stage == "sft":
                res = sft_stage(c, model, out, collected)
            elif stage == "pretrain_value":
                res = pretrain_value_stage(c, model, out)
            else:
                if critic is not None:
                    c.critic.init = critic
                res = train_stage(c, model, out, train)
            res["stage"] = stage
            res["cpu_s"] = _cpu_s() - cpu0
            res["load_avg"] = os.getloadavg()[0]
            res["peak_rss_gib"] = round(memory.run_peak_rss() / 2**30, 2)  # this stage's, on this rank
            if rank0:
                write_json_atomic(done, res)
            dist_utils.barrier()
            _release_memory()
        every.append(res)
        if stage == "collect":
            collected = out / "trajectories.jsonl"
        elif stage == "pretrain_value":
            critic = str(res["critic"])
        elif stage in ("sft", "train"):
            model = str(res["model"])
            label = "after SFT" if stage == "sft" else "after RL"
        else:
            res.setdefault("label", label)
            results.append({**res, "label": res.get("label", label)})
        if rank0 and stage != "eval":
            shown = {k: v for k, v in res.items() if k not in ("stage", "curve", "critic_calibration")}
            say(f"   {stage}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in shown.items()))
    if rank0:
        _report(run_dir, cfg, results, every, time.perf_counter() - t_run)
    return run_dir


def _release_memory() -> None:
    """After a stage: collect its objects and hand glibc's freed heap back to the system, so the next stage does
    not sit on the previous one's memory (an eval after ``train`` was seen holding ~9 GiB and was OOM-killed on a
    busy machine; SmolLM2 + one AdamW step, deleted: 1,037 MiB resident after gc, 441 MiB after the trim)."""
    gc.collect()
    memory.trim_heap()


def _cpu_s() -> float:
    """CPU seconds used by this process and its finished children: with the load average, what makes a wall
    time measured on a shared machine comparable to one measured on an idle one."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _report(
    run_dir: Path, cfg: Config, results: list[dict[str, Any]], every: list[dict[str, Any]], wall_s: float
) -> None:
    table = score_table(results) if results else "(no eval stage)"
    if len(results) >= 2 and "solved_by_task" in results[0] and "solved_by_task" in results[-1]:
        mean, se, n = paired_difference(results[0]["solved_by_task"], results[-1]["solved_by_task"])
        # With no task changing outcome the SE is 0 and a ratio means nothing: say so instead of "nan".
        size = f"{mean / se:.1f} standard errors" if se > 0 else "no task changed outcome"
        table += (
            f"\n\nsuccess {results[-1]['label']} - {results[0]['label']}: {mean:+.3f} ± {se:.3f} "
            f"(paired over {n} held-out tasks; {size})"
        )
    by_level = level_table(results)
    if by_level:
        table += "\n\nby difficulty level (success ± SE, valid tool-call rate in brackets):\n\n" + by_level
    families = sorted({f for r in results for f in r.get("solved_by_family") or {}})
    if families:  # resolved / episodes per injected bug family, eval by eval
        table += "\n\nresolved by bug family: " + "; ".join(
            f"{f} " + " -> ".join("{}/{}".format(*r["solved_by_family"].get(f, [0, 0])) for r in results)
            for f in families
        )
    table += _dynamics_text(every)
    calibrations = [r["critic_calibration"] for r in every if r.get("critic_calibration")]
    if calibrations:
        from sao.trainer.runs.critic_probe import calibration_table, plot_calibration

        table += (
            "\n\ncritic as a predictor on held-out eval episodes (V0: mean value at the first action token; EV: "
            "explained variance):\n\n" + calibration_table(calibrations)
        )
        if cfg.run.plot:
            plot_calibration(run_dir / "plots" / "critic_calibration.png", calibrations)
    text = f"# {run_dir.name}: stages {cfg.stages}\n\n{table}\n\nwall time {wall_s / 60:.1f} min\n"
    write_text_durably(run_dir / "summary.md", text)
    write_json_atomic(run_dir / "summary.json", {"evals": results, "stages": every, "wall_s": wall_s})
    say("\n" + table + f"\n\nstaged run finished in {wall_s / 60:.1f} min: {run_dir}/summary.md")
    if cfg.run.plot and results:
        plot_stages(run_dir, results)


def _dynamics_text(every: list[dict[str, Any]]) -> str:
    """The lines under the table that say whether RL had signal to learn from (value pretraining, RL batches)."""

    def f(v: Any) -> str:
        if v is None or (isinstance(v, float) and math.isnan(v)):  # NaN: no variance (e.g. every return equal)
            return "n/a"
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    out = ""
    for r in every:
        if r.get("stage") == "pretrain_value":
            out += (f"\n\nvalue pretraining: {r.get('rollouts')} rollouts of the policy (success "
                    f"{f(r.get('rollout_success'))}), held-out explained variance {f(r.get('held_out_ev_before'))} "
                    f"-> {f(r.get('held_out_ev_after'))}")  # fmt: skip
        elif r.get("stage") == "train":
            out += (f"\n\nRL: {r.get('steps')} policy steps, uniform-reward batches {f(r.get('uniform_batch_frac'))}, "
                    f"skipped steps {f(r.get('skipped_step_frac'))}, critic explained variance "
                    f"{f(r.get('first_explained_variance'))} (first) -> {f(r.get('last_explained_variance'))} (last), "
                    f"DIS-masked tokens {f(r.get('dis_masked_frac'))}; turns whose advantage has their episode's "
                    f"sign: solved {f(r.get('adv_pos_turns_solved'))}, failed "
                    f"{f(r.get('adv_neg_turns_failed'))}")  # fmt: skip
    return out


def plot_stages(run_dir: Path, results: list[dict[str, Any]]) -> Path:
    """``plots/stages.png``: each eval's success / valid tool-call rate, and the RL run's success per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sao.trainer.runs.metrics import read_metrics

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    keys = [("success", "success"), ("valid_tool_call_rate", "valid tool call")]
    width = 0.8 / len(keys)
    for k, (key, name) in enumerate(keys):
        xs = [i + k * width for i in range(len(results))]
        axes[0].bar(xs, [r[key] for r in results], width, label=name)
    axes[0].set_xticks([i + width / 2 for i in range(len(results))], [r["label"] for r in results])
    axes[0].set_ylim(0, 1)
    axes[0].set_title("held-out evaluation")
    axes[0].legend(fontsize=8)
    rl = sorted(run_dir.glob("*_train"))
    if rl and (rl[-1] / "metrics.jsonl").exists():
        rows = read_metrics(rl[-1])
        axes[1].plot([r["step"] for r in rows], [r.get("success_rate", 0) for r in rows], marker=".")
    axes[1].set_title("RL: success of the trained batches")
    axes[1].set_xlabel("policy step")
    fig.tight_layout()
    out = run_dir / "plots" / "stages.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
