"""`sao bench confirm`: the main comparison (SAO vs GRPO vs a running-mean baseline) on the real model.

One staged run makes the shared start: ``collect`` (the solver's demonstrations in Docker sandboxes), ``sft`` and
``eval`` of the SFT checkpoint on the held-out tasks (``OUT/shared``, the quickstart's stages). Then each arm is a
staged run ``[train, eval]`` from that SAME SFT checkpoint (``OUT/arms/NAME``) with the same number of trajectories
(``run.total_steps x trainer.batch_size``) and the same held-out tasks (``eval.seed``, ``eval.n``),
each in a spawned process (two SmolLM2 runs in one process were OOM-killed, see bench_throughput). Finished stages
are skipped on a re-run (``done.json``), so an interrupted bench continues where it stopped.

Output: ``confirm.json``, the table (success after SFT and after RL per arm with binomial standard errors, the
paired after-minus-SFT difference, valid tool-call rate, RL wall and CPU time) and ``confirm.png`` (held-out success
per arm, the trained batches' reward per step, SAO's critic explained variance).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sao.benchmarks.rl_bench_common import SPEC_HINT, print_table, write_json
from sao.core.config import apply_overrides, load_yaml, merge
from sao.core.jsonl import write_yaml_atomic

SHARED_STAGES = ["collect", "sft", "eval"]
ARM_STAGES = ["train", "eval"]
"""An arm's stages unless its spec names its own (``stages: [pretrain_value, train, eval]`` for SAO's recipe)."""


@dataclass
class ConfirmConfig:
    out: Path
    config: Path = Path("configs/bench/confirm_smollm2.yaml")
    arms: tuple[str, ...] = ()
    """Only these arms (default: all in the config, in its order)."""
    overrides: list[str] = field(default_factory=list)
    """``key=value`` overrides applied after the config's own (e.g. ``run.total_steps=1`` ``eval.n=2``)."""
    report_only: bool = False
    from_run: Path | None = None
    """A finished `sao train configs/quickstart.yaml` run (its stages collect, sft, eval, pretrain_value, train,
    eval) to take as the shared start (its SFT checkpoint and SFT eval) and as the ``sao`` arm (its own RL and
    last eval); the other arms start from its SFT checkpoint with its seed. Its held-out eval must match theirs.
    With ``run.seed=N`` in ``overrides`` (another seed than the run's) every arm, sao included, trains from that
    SFT checkpoint with seed N: RL seeds that share one SFT stage."""


def build_configs(cc: ConfirmConfig) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The shared run's config and each arm's, as plain dicts ready for `sao train`."""
    spec = load_yaml(cc.config, SPEC_HINT)
    base_path = Path(str(spec.get("base", "")))
    if not base_path.is_file():
        raise FileNotFoundError(f"{cc.config}: base {str(base_path)!r} not found; name a trainer config, e.g. "
                                "configs/quickstart.yaml (paths are relative to the repository root)")  # fmt: skip
    base = apply_overrides(merge(load_yaml(base_path), spec.get("overrides") or {}), cc.overrides)
    arms_spec: dict[str, Any] = spec.get("arms") or {}
    if not arms_spec:
        raise ValueError(f"{cc.config}: no arms; list one, e.g. arms: {{sao: {{trainer: {{algorithm: sao}}}}}}")
    names = list(cc.arms) or list(arms_spec)
    unknown = [a for a in names if a not in arms_spec]
    if unknown:
        raise ValueError(f"--arms: unknown {unknown}; the config has {list(arms_spec)}")
    shared = merge(base, {"stages": SHARED_STAGES, "run": {"dir": str(cc.out / "shared")}})
    sft_actor = cc.out / "shared" / f"{SHARED_STAGES.index('sft'):02d}_sft" / "final" / "actor"
    if cc.from_run is not None:
        given = _finished_run_config(cc.from_run)
        if not _sets_seed(cc.overrides):  # the arms train with the run's seed unless `--set run.seed=N` says
            base = merge(base, {"run": {"seed": given["run"]["seed"]}})
        from sao.trainer.config import EvalConfig

        for key in ("n", "seed", "temperature", "samples"):  # a key a config leaves out has EvalConfig's default
            default = getattr(EvalConfig(), key)
            mine, theirs = given["eval"].get(key, default), base["eval"].get(key, default)
            if mine != theirs:
                raise ValueError(
                    f"--from-run {cc.from_run}: its eval.{key} is {mine!r}, the arms' {theirs!r}; the arms must be "
                    "evaluated on the same held-out tasks, as often"
                )
        shared = merge(base, {"stages": SHARED_STAGES, "run": {"dir": str(cc.from_run)}})
        sft_actor = _stage_dir(cc.from_run, "sft") / "final" / "actor"
    arms = {
        name: merge(
            merge(base, {"stages": ARM_STAGES, **(arms_spec[name] or {})}),
            {"model": {"path": str(sft_actor)}, "run": {"dir": str(cc.out / "arms" / name)}},
        )
        for name in names
    }
    for name, arm in arms.items():
        if arm["stages"][-2:] != ["train", "eval"]:
            raise ValueError(f"{cc.config}: arm {name!r} stages {arm['stages']} must end with [train, eval]")
    return shared, arms


def _sets_seed(overrides: list[str]) -> bool:
    return any(item.split("=", 1)[0].strip() == "run.seed" for item in overrides)


def reuses_finished_run(cc: ConfirmConfig, name: str, arm: dict[str, Any]) -> bool:
    """Whether arm ``name`` is the ``--from-run`` run's own RL: the ``sao`` arm at that run's seed. With another
    seed (``--set run.seed=N``) the sao arm runs its own value pretraining, RL and eval from the same SFT
    checkpoint: an RL seed that shares the SFT stage."""
    if cc.from_run is None or name != "sao":
        return False
    return bool(arm["run"]["seed"] == _finished_run_config(cc.from_run)["run"]["seed"])


def _finished_run_config(run_dir: Path) -> dict[str, Any]:
    """The saved config of a finished staged run with an SFT stage and an eval before and after its train stage."""
    summary = run_dir / "summary.json"
    if not summary.exists() or not (run_dir / "config.yaml").exists():
        raise FileNotFoundError(f"--from-run {run_dir}: no finished staged run there (no summary.json / config.yaml)")
    cfg = load_yaml(run_dir / "config.yaml")
    stages = list(cfg.get("stages") or [])
    if "sft" not in stages or stages[-2:] != ["train", "eval"] or stages.count("eval") < 2:
        raise ValueError(f"--from-run {run_dir}: stages {stages} are not the main job's (sft, eval, ..., train, eval)")
    return cfg


def _staged_child(cfg: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """One staged `sao train` (resumed if its folder holds one, with the command line's ``overrides`` on top of
    its saved config: they reach the stages still to run); returns its summary.json."""
    from sao.trainer.runs.run import train

    run_dir = Path(cfg["run"]["dir"])
    if (run_dir / "config.yaml").exists():
        train(None, overrides, resume=str(run_dir))
    else:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        path = run_dir.with_name(run_dir.name + ".yaml")
        write_yaml_atomic(path, cfg)
        train(str(path), [])
    out: dict[str, Any] = json.loads((run_dir / "summary.json").read_text())
    return out


def staged_in_fresh_process(cfg: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_staged_child, cfg, overrides).result()


def _se(ev: dict[str, Any]) -> float:
    """An eval's success SE: its own (over tasks, ``eval.samples``), else binomial over its episodes (older runs)."""
    p, n = float(ev["success"]), int(ev["episodes"])
    return float(ev.get("success_se", math.sqrt(p * (1 - p) / max(n, 1))))


def time_limited(eval_dir: Path, n: int) -> int:
    """Episodes of an eval stage cut by the env's wall-clock limit (``truncation_reason: time_limit``): a
    machine-load effect that scores a correct answer 0, so the table shows it. The last ``n`` records count (a
    re-run stage appends to its trajectories.jsonl)."""
    path = eval_dir / "trajectories.jsonl"
    if not path.exists():
        return 0
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    rows = [r.get("trajectory", r) for r in rows if r.get("type", "trajectory") == "trajectory"][-n:] if n else []
    return sum((r.get("info") or {}).get("truncation_reason") == "time_limit" for r in rows)


def arm_result(name: str, summary: dict[str, Any], sft_eval: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """One arm's row: held-out success before (the shared SFT eval) and after, the paired difference, the RL
    stage's cost and its per-step curves."""
    from sao.eval.scores import paired_difference
    from sao.trainer.runs.metrics import read_metrics

    after = summary["evals"][-1]
    train = next(s for s in summary["stages"] if s.get("stage") == "train")
    diff, diff_se, n_pair = paired_difference(sft_eval["solved_by_task"], after["solved_by_task"])
    rows = read_metrics(_stage_dir(run_dir, "train"))
    pretrain = next((s for s in summary["stages"] if s.get("stage") == "pretrain_value"), None)
    warmup = _stage_dir(run_dir, "train") / "critic_warmup.jsonl"
    warm = [json.loads(x) for x in warmup.read_text().splitlines() if x.strip()] if warmup.exists() else []
    curve = {
        k: [r.get(k) for r in rows]
        for k in ("step", "success_rate", "reward_mean", "explained_variance", "trained_episodes", "step_s")
    }
    return {
        "arm": name,
        "success_sft": sft_eval["success"],
        "success_sft_se": _se(sft_eval),
        "success_rl": after["success"],
        "success_rl_se": _se(after),
        "episodes": after["episodes"],
        "paired_diff": diff,
        "paired_diff_se": diff_se,
        "paired_n": n_pair,
        # per task its solved fraction (0/1 with one episode a task) before and after: what `sao bench confirm-pool`
        # pools over seeds
        "solved_by_task_sft": dict(sft_eval["solved_by_task"]),
        "solved_by_task_rl": dict(after["solved_by_task"]),
        "valid_tool_call_sft": sft_eval["valid_tool_call_rate"],
        "valid_tool_call_rl": after["valid_tool_call_rate"],
        "rl_steps": train.get("steps"),
        "rl_wall_s": train.get("wall_s"),
        "rl_cpu_s": train.get("cpu_s"),
        "rl_load_avg": train.get("load_avg"),
        "eval_wall_s": after.get("wall_s"),
        "time_limited_sft": sft_eval.get("time_limited", 0),
        "time_limited_rl": after["time_limited"]
        if "time_limited" in after
        else time_limited(_stage_dir(run_dir, "eval"), int(after["episodes"])),
        # rollouts that trained only the critic (value pretraining, warm-up batches): not in the policy's budget
        "critic_only_rollouts": (int(pretrain["rollouts"]) if pretrain else 0)
        + sum(int(w.get("episodes", w.get("trajectories", 0))) for w in warm),  # "trajectories" before episodes
        "pretrain_held_out_ev": None if pretrain is None else pretrain.get("held_out_ev_after"),
        "curves": curve,
        # tasks of graded difficulty: per level the paired RL - SFT difference, and the critic's calibration
        "level_by_task": dict(after.get("level_by_task") or {}),
        "by_level": by_level_differences(sft_eval, after),
        "critic_calibration": after.get("critic_calibration"),
    }


def by_level_differences(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per difficulty level (the evals' ``level_by_task``): success before and after and the paired difference with
    its SE over that level's tasks; empty for tasks without levels."""
    b_all, a_all = before["solved_by_task"], after["solved_by_task"]
    out = _pooled_by_level([(b_all, a_all)], after.get("level_by_task") or {})
    for lv, g in out.items():
        ids = [k for k, v in (after.get("level_by_task") or {}).items() if str(int(v)) == lv]
        g["success_sft"] = sum(b_all.get(k, 0) for k in ids if k in b_all) / max(sum(k in b_all for k in ids), 1)
        g["success_rl"] = sum(a_all.get(k, 0) for k in ids if k in a_all) / max(sum(k in a_all for k in ids), 1)
    return out


def _stage_dir(run_dir: Path, stage: str) -> Path:
    """The arm's last folder of ``stage`` (``NN_stage``; the index depends on the arm's stages), or a path that
    does not exist when the arm has none (readers of it say so)."""
    found = sorted(run_dir.glob(f"[0-9][0-9]_{stage}"))
    return found[-1] if found else run_dir / f"00_{stage}"


def _in_se(d: float, se: float | None) -> str:
    """``d`` in standard errors, or ``n/a`` where no task changed outcome (SE 0)."""
    return f"{d / se:.1f} SE" if se and se > 0 else "n/a"


def table_rows(results: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    headers = ["arm", "success after SFT", "success after RL", "RL - SFT (paired)", "valid calls SFT -> RL",
               "time-limited SFT / RL", "RL steps", "critic-only rollouts", "RL wall / CPU"]  # fmt: skip
    rows = []
    for r in results:
        d, se = r["paired_diff"], r["paired_diff_se"]
        z = _in_se(d, se)
        rows.append([
            r["arm"],
            f"{r['success_sft']:.3f} ± {r['success_sft_se']:.3f}",
            f"{r['success_rl']:.3f} ± {r['success_rl_se']:.3f}",
            f"{d:+.3f} ± {se:.3f} ({z})",
            f"{r['valid_tool_call_sft']:.2f} -> {r['valid_tool_call_rl']:.2f}",
            f"{r.get('time_limited_sft', 0)} / {r.get('time_limited_rl', 0)}",
            str(r["rl_steps"]),
            str(r.get("critic_only_rollouts", 0)),
            f"{(r['rl_wall_s'] or 0) / 60:.1f} min / {(r['rl_cpu_s'] or 0) / 60:.1f} min",
        ])  # fmt: skip
    return headers, rows


def between_arms(results: list[dict[str, Any]], summaries: dict[str, dict[str, Any]]) -> list[str]:
    """Paired differences between arms (same held-out tasks): the first arm minus each other arm."""
    from sao.eval.scores import paired_difference

    if len(results) < 2:
        return []
    first = results[0]["arm"]
    lines = []
    for r in results[1:]:
        d, se, n = paired_difference(
            summaries[r["arm"]]["evals"][-1]["solved_by_task"], summaries[first]["evals"][-1]["solved_by_task"]
        )
        z = _in_se(d, se)
        lines.append(f"{first} - {r['arm']}: {d:+.3f} ± {se:.3f} ({z}; paired over {n} held-out tasks)")
    return lines


def level_lines(results: list[dict[str, Any]]) -> list[str]:
    """Per arm, the paired RL - SFT difference level by level, and the critic's first-action value against the
    success per level where the arm's eval probed its critic (``eval.critic_probe``)."""
    lines = []
    for r in results:
        if r.get("by_level"):
            per = ", ".join(f"L{lv} {g['success_sft']:.2f} -> {g['success_rl']:.2f} ({g['diff']:+.2f} ± {g['se']:.2f})"
                            for lv, g in r["by_level"].items())  # fmt: skip
            lines.append(f"{r['arm']} by level: {per}")
        for label, probe in ((r.get("critic_calibration") or {}).get("critics") or {}).items():
            cal = ", ".join(f"L{k} V0 {g['mean_value']:.2f} / {g['success']:.2f}"
                            for k, g in probe["by_level"].items() if k != "overall")  # fmt: skip
            ev0 = probe["by_level"]["overall"]["first_action_ev"]
            lines.append(f"{r['arm']} critic {label}: {cal}; EV tokens {probe['explained_variance']:.2f}, "
                         f"first action {ev0:.2f}")  # fmt: skip
    return lines


def plot(results: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    ax = axes[0]
    labels = ["after SFT"] + [r["arm"] for r in results]
    ys = [results[0]["success_sft"]] + [r["success_rl"] for r in results]
    errs = [results[0]["success_sft_se"]] + [r["success_rl_se"] for r in results]
    ax.bar(range(len(ys)), ys, yerr=errs, capsize=4, color=["grey"] + [f"C{i}" for i in range(len(results))])
    # slanted: long arm names (running_mean_by_level) overlap when level
    ax.set_xticks(range(len(ys)), labels, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_title(f"held-out success (n={results[0]['episodes']}, ± SE)")
    for i, r in enumerate(results):
        c = r["curves"]
        steps = [s for s in c["step"]]
        axes[1].plot(steps, [x if x is not None else float("nan") for x in c["reward_mean"]], marker=".",
                     color=f"C{i}", label=r["arm"])  # fmt: skip
        ev = [x if x is not None else float("nan") for x in c["explained_variance"]]
        if any(x == x for x in ev):
            axes[2].plot(steps, ev, marker=".", color=f"C{i}", label=r["arm"])
    axes[1].set_title("RL: mean reward of the trained batch")
    axes[1].set_ylim(0, 1.05)
    axes[1].set_xlabel("policy step")
    axes[1].legend(fontsize=8)
    axes[2].set_title("critic explained variance")
    axes[2].set_xlabel("policy step")
    axes[2].axhline(0, color="k", lw=0.5)
    if axes[2].lines[1:]:
        axes[2].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def run(cc: ConfirmConfig, echo: Callable[[str], None] = print) -> dict[str, Any]:
    shared_cfg, arm_cfgs = build_configs(cc)
    t0 = time.perf_counter()
    shared_dir = Path(shared_cfg["run"]["dir"])
    given: dict[str, Any] | None = None  # --from-run: the finished run's summary (the sao arm's too)
    if cc.from_run is not None:
        given = json.loads((cc.from_run / "summary.json").read_text())
        shared = {**given, "evals": given["evals"][:1]}  # its first eval is the SFT checkpoint's
        echo(f"== shared: the SFT checkpoint and eval of {cc.from_run}")
    elif cc.report_only:
        shared = json.loads((shared_dir / "summary.json").read_text())
    else:
        echo(f"== shared: {SHARED_STAGES} -> {shared_dir}")
        shared = staged_in_fresh_process(shared_cfg, cc.overrides)
    sft_eval = shared["evals"][-1]
    sft_eval_dir = (
        sorted(shared_dir.glob("[0-9][0-9]_eval"))[0]
        if given
        else shared_dir / f"{SHARED_STAGES.index('eval'):02d}_eval"
    )
    if "time_limited" not in sft_eval:  # a summary written before the eval stage counted it
        sft_eval["time_limited"] = time_limited(sft_eval_dir, int(sft_eval["episodes"]))
    echo(f"   after SFT: success {sft_eval['success']:.3f} on {sft_eval['episodes']} held-out tasks")
    results, summaries = [], {}
    for name, cfg in arm_cfgs.items():
        run_dir = Path(cfg["run"]["dir"])
        if given is not None and reuses_finished_run(cc, name, cfg):  # the finished run's RL is SAO's recipe
            assert cc.from_run is not None
            summaries[name] = given
            results.append(arm_result(name, given, sft_eval, cc.from_run))
            echo(f"   {name}: the RL stage of {cc.from_run}")
            continue
        if cc.report_only:
            if not (run_dir / "summary.json").exists():
                echo(f"   {name}: not run, left out")
                continue
            summaries[name] = json.loads((run_dir / "summary.json").read_text())
        else:
            echo(f"== arm {name}: {cfg['stages']} from the SFT checkpoint -> {run_dir}")
            summaries[name] = staged_in_fresh_process(cfg, cc.overrides)
        results.append(arm_result(name, summaries[name], sft_eval, run_dir))
        r = results[-1]
        echo(f"   {name}: success {r['success_sft']:.3f} -> {r['success_rl']:.3f} "
             f"(paired {r['paired_diff']:+.3f} ± {r['paired_diff_se']:.3f})")  # fmt: skip
    if not results:
        raise ValueError(f"no arm has finished in {cc.out}; run without --report-only first")
    headers, rows = table_rows(results)
    print_table(headers, rows, echo)
    pairs = between_arms(results, summaries)
    for line in pairs:
        echo(line)
    for line in level_lines(results):
        echo(line)
    png = plot(results, cc.out / "confirm.png")
    t = shared_cfg["trainer"]
    data = {
        "config": str(cc.config),
        "overrides": cc.overrides,
        "trajectories_per_arm": shared_cfg["run"]["total_steps"] * t["batch_size"],
        "shared": {k: v for k, v in shared.items() if k != "evals"} | {"sft_eval": sft_eval},
        "arms": results,
        "between_arms": pairs,
        "wall_s": time.perf_counter() - t0,
        "load_avg_end": os.getloadavg()[0],
    }
    write_json(cc.out / "confirm.json", data)
    echo(f"wrote {cc.out / 'confirm.json'} and {png}")
    return data


POOL_RERUN = "rebuild it with `sao bench confirm ... --report-only` (same --out, --config, --from-run and --set)"


def _whole_job(run_dir: Path) -> dict[str, Any]:
    """A finished `sao train` job (SFT, eval, ..., train, eval) read as a one-arm confirm run: its algorithm's
    RL against its own SFT eval. Its SFT stage is its own, so it adds an SFT seed to the pool, not only an RL one."""
    cfg = _finished_run_config(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    name = str((cfg.get("trainer") or {}).get("algorithm", "sao"))
    seed = (cfg.get("run") or {}).get("seed")
    return {
        "overrides": [f"whole job, run.seed={seed}"],
        "arms": [arm_result(name, summary, summary["evals"][0], run_dir)],
    }


def _pool_inputs(outs: list[Path]) -> list[dict[str, Any]]:
    if len(outs) < 2:
        raise ValueError(f"confirm-pool needs 2 or more runs (`sao bench confirm` --out folders), got {len(outs)}")
    docs, tasks = [], None
    for out in outs:
        path = out / "confirm.json"
        if not path.exists() and (out / "summary.json").exists():
            doc = _whole_job(out)
        elif not path.exists():
            raise FileNotFoundError(f"{path} does not exist: run `sao bench confirm --out {out}` first, or pass "
                                    "the folder of a finished `sao train` job (its summary.json)")  # fmt: skip
        else:
            doc = json.loads(path.read_text())
        for r in doc["arms"]:
            if "solved_by_task_rl" not in r:
                raise ValueError(f"{path} was written before confirm.json kept per-task outcomes: {POOL_RERUN}")
            tasks = set(r["solved_by_task_rl"]) if tasks is None else tasks
            if set(r["solved_by_task_rl"]) != tasks or set(r["solved_by_task_sft"]) != tasks:
                raise ValueError(f"{path}: arm {r['arm']} was evaluated on other held-out tasks than {outs[0]}; "
                                 "pool only runs with the same eval.seed and eval.n")  # fmt: skip
        docs.append(doc)
    return docs


def pool_seeds(outs: list[Path], echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Several `sao bench confirm` runs (one seed each) pooled: per arm its paired RL - SFT difference seed by seed
    and over the seeds (``pooled_paired_difference``: per task the mean over seeds, SE over tasks), and the first
    arm minus each later arm the same way (every pair). Only arms every run has are pooled."""
    from sao.eval.scores import pooled_paired_difference

    docs = _pool_inputs(outs)
    names = [r["arm"] for r in docs[0]["arms"]]
    names = [n for n in names if all(any(r["arm"] == n for r in d["arms"]) for d in docs)]
    if not names:
        raise ValueError(f"no arm is in every one of {[str(o) for o in outs]}")
    rows = {n: [next(r for r in d["arms"] if r["arm"] == n) for d in docs] for n in names}
    arms: list[dict[str, Any]] = []
    for n in names:
        pairs = [(r["solved_by_task_sft"], r["solved_by_task_rl"]) for r in rows[n]]
        mean, se, k = pooled_paired_difference(pairs)
        diffs = [r["paired_diff"] for r in rows[n]]
        arms.append({
            "between_seed_se": _between_seed_se(diffs),
            "by_level": _pooled_by_level(pairs, rows[n][0].get("level_by_task") or {}),
            "arm": n,
            "seeds": [{"out": str(o), "overrides": d.get("overrides", []), "diff": r["paired_diff"],
                       "se": r["paired_diff_se"], "success_rl": r["success_rl"], "success_sft": r["success_sft"]}
                      for o, d, r in zip(outs, docs, rows[n], strict=True)],
            "pooled_diff": mean, "pooled_se": se, "tasks": k,
            "success_rl_mean": sum(r["success_rl"] for r in rows[n]) / len(outs),
        })  # fmt: skip
    between = []
    # every pair, the earlier arm minus the later one: "SAO - GRPO" alone cannot say whether the critic or the single
    # rollout made a lead, the running mean - GRPO beside it can
    for i, first in enumerate(names):
        for n in names[i + 1 :]:
            pairs = [
                (b["solved_by_task_rl"], a["solved_by_task_rl"]) for a, b in zip(rows[first], rows[n], strict=True)
            ]
            mean, se, k = pooled_paired_difference(pairs)
            diffs = [sum(a[t] - b[t] for t in b) / max(len(b), 1) for b, a in pairs]
            between.append({"first": first, "other": n, "pooled_diff": mean, "pooled_se": se, "tasks": k,
                            "between_seed_se": _between_seed_se(diffs),
                            "by_level": _pooled_by_level(pairs, rows[n][0].get("level_by_task") or {})})  # fmt: skip
    headers = ["arm", "RL - SFT seed by seed (paired)", "pooled over seeds (SE over tasks)", "SE between seeds",
               "success after RL (mean)"]  # fmt: skip
    table = []
    for a in arms:
        table.append([
            a["arm"],
            ", ".join(f"{s['diff']:+.3f} ± {s['se']:.3f}" for s in a["seeds"]),
            f"{a['pooled_diff']:+.3f} ± {a['pooled_se']:.3f} ({_in_se(a['pooled_diff'], a['pooled_se'])})",
            f"{a['between_seed_se']:.3f} ({_in_se(a['pooled_diff'], a['between_seed_se'])})",
            f"{a['success_rl_mean']:.3f}",
        ])  # fmt: skip
    print_table(headers, table, echo)
    for b in between:
        d, se = b["pooled_diff"], b["pooled_se"]
        echo(
            f"{b['first']} - {b['other']} after RL, pooled over {len(outs)} seeds: {d:+.3f} ± {se:.3f} "
            f"({_in_se(d, se)}) over {b['tasks']} held-out tasks; between seeds ± {b['between_seed_se']:.3f}"
        )
    for name, per in [(a["arm"] + " RL - SFT", a["by_level"]) for a in arms] + [
        (f"{b['first']} - {b['other']}", b["by_level"]) for b in between
    ]:
        if per:
            echo(f"{name} by level: " + ", ".join(f"L{lv} {g['diff']:+.3f} ± {g['se']:.3f}" for lv, g in per.items()))
    return {"runs": [str(o) for o in outs], "arms": arms, "between_arms": between}


def _between_seed_se(diffs: list[float]) -> float:
    """The standard error of the mean of per-seed differences (the seeds' own spread; nan with one seed)."""
    k = len(diffs)
    if k < 2:
        return float("nan")
    m = sum(diffs) / k
    return float((sum((d - m) ** 2 for d in diffs) / (k - 1) / k) ** 0.5)


def _pooled_by_level(
    pairs: list[tuple[dict[str, float], dict[str, float]]], levels: dict[str, int]
) -> dict[str, dict[str, float]]:
    """``pooled_paired_difference`` over each level's tasks (``levels``: task id -> level); empty without levels."""
    from sao.eval.scores import pooled_paired_difference

    out: dict[str, dict[str, float]] = {}
    for lv in sorted({int(v) for v in levels.values()}):
        ids = {k for k, v in levels.items() if int(v) == lv}
        sub = [({k: v for k, v in b.items() if k in ids}, {k: v for k, v in a.items() if k in ids}) for b, a in pairs]
        d, se, n = pooled_paired_difference(sub)
        out[str(lv)] = {"diff": d, "se": se, "tasks": n}
    return out


def plot_pool(pooled: dict[str, Any], path: Path) -> Path:
    """Each arm's paired RL - SFT difference seed by seed (dots, ± SE) and pooled (bar, ± SE)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = pooled["arms"]
    fig, ax = plt.subplots(figsize=(2.2 + 1.6 * len(arms), 3.6))
    for i, a in enumerate(arms):
        ax.bar(i, a["pooled_diff"], yerr=a["pooled_se"], capsize=5, color=f"C{i}", alpha=0.45)
        k = len(a["seeds"])
        for j, s in enumerate(a["seeds"]):
            x = i + (j - (k - 1) / 2) * 0.15
            ax.errorbar(x, s["diff"], yerr=s["se"], fmt="o", color=f"C{i}", ms=4, capsize=2)
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks(range(len(arms)), [a["arm"] for a in arms])
    ax.set_ylabel("held-out success, RL - SFT (paired)")
    ax.set_title(f"{len(pooled['runs'])} seeds: dots each seed, bars pooled (± SE)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def run_pool(outs: list[Path], out: Path, echo: Callable[[str], None] = print) -> dict[str, Any]:
    pooled = pool_seeds(outs, echo)
    write_json(out / "pool.json", pooled)
    echo(f"wrote {out / 'pool.json'} and {plot_pool(pooled, out / 'pool.png')}")
    return pooled
