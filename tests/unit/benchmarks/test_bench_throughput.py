"""Small pieces of `sao bench throughput`: the latency env, the steady-state summary, variant configs, tokenizer."""

from __future__ import annotations

import math
import time
from pathlib import Path

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

from sao.benchmarks.bench_throughput import ThroughputConfig, _scaled, summarize, variant_configs
from sao.benchmarks.latency_env import ENV_ID, LatencyEnv, lognormal_stats
from sao.benchmarks.rl_bench_common import build_word_tokenizer, env_texts
from sao.core.config import load_yaml

ROOT = Path(__file__).resolve().parents[3]


def _row(step: int, step_s: float, idle: float, lag: float, trained: int) -> dict[str, float]:
    return {
        "step": step,
        "step_s": step_s,
        "trainer_idle_frac": idle,
        "policy_lag_mean": lag,
        "policy_lag_max": int(lag) + 1,
        "trained_episodes": trained,
        "dropped_stale": 0,
        "generated": trained,
        "success_rate": 0.5,
        "weight_sync_s": 0.01,
    }


def test_summary_leaves_out_warmup_and_weights_idle_by_step_time() -> None:
    rows = [_row(1, 10.0, 0.9, 0.0, 8), _row(2, 1.0, 0.0, 1.0, 16), _row(3, 3.0, 0.5, 2.0, 24)]
    s = summarize(rows, warmup=1)
    assert s["trained_per_s"] == pytest.approx(16 / 4.0)  # 16 trajectories in steps 2-3, 4 s
    assert s["trainer_idle_frac"] == pytest.approx((0.0 * 1 + 0.5 * 3) / 4)
    assert s["policy_lag_mean"] == pytest.approx(1.5)
    assert s["trained_per_s_incl_warmup"] == pytest.approx(24 / 14.0)
    assert s["steady_steps"] == 2
    # Too few steps for a warm-up: everything counts.
    assert summarize(rows[:2], warmup=1)["trained_per_s"] == pytest.approx(16 / 11.0)
    with pytest.raises(ValueError, match="no metrics"):
        summarize([], warmup=1)


def test_scale_keeps_grpo_batches_whole_groups() -> None:
    cfg = _scaled({"trainer": {"algorithm": "grpo", "batch_size": 16, "group_size": 8}, "rollout": {}}, 1.7)
    assert cfg["trainer"]["batch_size"] % 8 == 0 and cfg["trainer"]["batch_size"] == 24
    assert cfg["deepspeed"]["micro_batch_size"] == 24
    assert cfg["rollout"]["buffer_size"] >= 24


def test_variant_configs_from_the_shipped_file_are_valid_trainer_configs(tmp_path: Path) -> None:
    from sao.trainer.config import config_from_dict

    spec = load_yaml(ROOT / "configs/bench/throughput.yaml")
    bc = ThroughputConfig(out=tmp_path, steps=7, latency_sigma=2.0)
    cfgs = variant_configs(bc, spec, tmp_path / "tok", 64)
    algos = {name: config_from_dict(c).trainer.algorithm for name, c in cfgs.items()}
    assert {"sao": "sao", "sync_grpo": "grpo", "one_step_off": "grpo_dis"}.items() <= algos.items()
    assert all(c["run"]["total_steps"] == 7 and c["env"]["kwargs"]["sigma"] == 2.0 for c in cfgs.values())
    assert cfgs["sync_grpo"]["trainer"]["group_size"] == 8
    with pytest.raises(ValueError, match="unknown variant"):
        variant_configs(ThroughputConfig(out=tmp_path, variants=("nope",)), spec, tmp_path, 64)


def test_the_real_parts_config_gives_valid_trainer_configs_without_the_latency_env(tmp_path: Path) -> None:
    from sao.benchmarks.bench_throughput import uses_latency_env
    from sao.trainer.config import config_from_dict

    spec = load_yaml(ROOT / "configs/bench/throughput_real.yaml")
    assert not uses_latency_env(spec) and uses_latency_env(load_yaml(ROOT / "configs/bench/throughput.yaml"))
    cfgs = variant_configs(ThroughputConfig(out=tmp_path, steps=3), spec, None, None)
    parsed = {name: config_from_dict(c) for name, c in cfgs.items()}
    algos = {n: p.trainer.algorithm for n, p in parsed.items()}
    assert algos.pop("sync_grpo") == "grpo" and set(algos.values()) == {"sao"} and "sao" in algos
    # the frontier: SAO at several in-flight levels for one batch size; `threads` is the bench's, not the trainer's
    assert len({parsed[n].rollout.concurrency for n in algos}) >= 3
    assert len({parsed[n].trainer.batch_size for n in parsed}) == 1
    assert all("threads" not in c and "label" not in c for c in cfgs.values())
    assert all(p.rollout.engine == "vllm" and p.env.id == "sao/PythonTool-v0" for p in parsed.values())
    assert all(p.run.total_steps == 3 and p.model.tokenizer is None for p in parsed.values())
    with pytest.raises(ValueError, match="latency"):
        variant_configs(ThroughputConfig(out=tmp_path, latency_sigma=2.0), spec, None, None)


def test_latency_env_passes_check_env_and_keeps_the_inner_rewards() -> None:
    env = gymnasium.make(ENV_ID, inner_kwargs={"turns": 2}, median_s=0.001, sigma=0.5).unwrapped
    assert isinstance(env, LatencyEnv)
    check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=3)
    target = obs.split()[-1]
    obs2, r1, term1, _, info1 = env.step(target)
    assert not term1 and info1["turn_correct"] and info1["latency_s"] > 0
    _, r2, term2, _, info2 = env.step(obs2.split()[-1])
    assert term2 and info2["solved"] and r1 + r2 == 1.0
    env.close()


def test_latency_draws_are_seeded_lognormal_and_really_wait() -> None:
    env = LatencyEnv(median_s=0.02, sigma=1.0, max_s=0.05)
    env.reset(seed=7)
    a = [env.draw() for _ in range(200)]
    env.reset(seed=7)
    assert [env.draw() for _ in range(200)] == a
    assert max(a) <= 0.05 and min(a) > 0
    assert sorted(a)[100] == pytest.approx(0.02, rel=0.35)  # the median of the draws
    stats = lognormal_stats(0.02, 1.0)
    assert stats["mean"] == pytest.approx(0.02 * math.exp(0.5)) and stats["p99"] > stats["p90"] > stats["p50"]
    env.reset(seed=1)
    t0 = time.perf_counter()
    _, _, _, _, info = env.step("A")
    assert time.perf_counter() - t0 >= info["latency_s"] * 0.9
    env.close()
    with pytest.raises(ValueError, match=">= 0"):
        LatencyEnv(median_s=-1)


def test_word_tokenizer_encodes_env_text_and_actions_as_single_tokens(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    texts = env_texts("sao/TokenGame-v0", {"turns": 2}, episodes=3)
    tok = AutoTokenizer.from_pretrained(str(build_word_tokenizer(tmp_path / "tok", texts, ["A", "B", "C", "?"])))
    assert all(len(tok.encode(w, add_special_tokens=False)) == 1 for w in ["A", "B", "C", "?"])
    ids = tok.encode(texts[0], add_special_tokens=False)
    assert tok.unk_token_id not in ids
    chat = str(
        tok.apply_chat_template(
            [{"role": "user", "content": "Turn 1/2: B"}], tokenize=False, add_generation_prompt=True
        )
    )
    assert chat.endswith("<|im_start|>assistant\n")
    assert tok.decode(tok.encode("Turn 1 ?", add_special_tokens=False)) == "Turn 1 ?"
    assert tok.encode("what", add_special_tokens=False) == [tok.unk_token_id]


def test_phase_means_and_steady_cores_use_the_steps_after_warmup() -> None:
    from sao.benchmarks.bench_throughput import steady_cores

    rows = [_row(1, 10.0, 0.5, 0.0, 4), _row(2, 10.0, 0.0, 1.0, 8), _row(3, 10.0, 0.0, 1.0, 12)]
    for i, r in enumerate(rows):
        r.update(time_learner_s=5.0 + i, time_actor_s=2.0, time_critic_s=1.0 + i, learner_end=100.0 + 10 * i)
    s = summarize(rows, warmup=1)
    assert s["time_learner_s"] == pytest.approx(6.5) and s["time_critic_s"] == pytest.approx(2.5)
    assert "time_values_s" not in s  # not in the rows: left out, not invented
    # cumulative CPU seconds sampled each 5 s from t = 95: the trainer busy 1 core until t = 100, then 2
    samples = [
        {"t": 95.0 + 5 * k, "trainer": 5.0 * min(k, 1) + 10.0 * max(k - 1, 0), "vllm": 2.5 * k, "sandboxes": 0.0,
         "other_children": 0.0, "machine": 10.0 * k}
        for k in range(8)
    ]  # fmt: skip
    c = steady_cores(rows, samples, warmup=1)  # window = end of step 1 (t=100) .. end of step 3 (t=120)
    assert c["window_s"] == pytest.approx(20.0)
    assert c["trainer"] == pytest.approx(2.0)  # the warm-up's 1 core is left out
    assert c["vllm"] == pytest.approx(0.5) and c["machine"] == pytest.approx(2.0)
    assert steady_cores(rows, [], warmup=1) == {}


def test_goal_is_checked_for_every_sao_variant() -> None:
    from sao.benchmarks.bench_throughput import goal_check

    def res(algo: str, ratio: float, idle: float, lag: float) -> dict[str, object]:
        s = {"ratio_vs_sync_grpo": ratio, "trainer_idle_frac": idle, "policy_lag_mean": lag}
        return {"algorithm": algo, "summary": s}

    g = goal_check(
        {"sync_grpo": res("grpo", 1.0, 0.2, 0.0), "a": res("sao", 0.6, 0.0, 1.0), "b": res("sao", 3.5, 0.3, 1.0)}
    )
    assert set(g["variants"]) == {"a", "b"} and not g["met"] and g["best_within_idle_lag"] == "a"
    g = goal_check({"c": res("sao", 3.1, 0.05, 2.0), "d": res("sao", 4.0, 0.05, 2.5)})
    assert g["met"] and g["best_within_idle_lag"] == "c" and not g["variants"]["d"]["met"]


def test_cpu_sampler_sees_a_busy_child_process_and_the_machine() -> None:
    import subprocess
    import sys

    from sao.benchmarks.throughput_probe import CpuSampler, cores_used

    sampler = CpuSampler(period_s=0.2).start()
    burn = "import time\nwhile time.process_time() < 1.0: pass"  # 1 s of CPU, however loaded the machine is
    child = subprocess.Popen([sys.executable, "-c", burn])
    child.wait()
    samples = sampler.stop()
    assert len(samples) >= 3 and samples[-1]["t"] > samples[0]["t"]
    # the loop used 1 s of CPU; sampled every 0.2 s, all but its last period's is seen (its last value is kept)
    assert 0.6 <= samples[-1]["other_children"] - samples[0]["other_children"] <= 1.3
    # the loop is not counted as vLLM (a vLLM process another test left under this process may add a little)
    assert samples[-1]["vllm"] - samples[0]["vllm"] < 0.5
    assert samples[-1]["machine"] - samples[0]["machine"] >= 0.6
    c = cores_used(samples, samples[0]["t"], samples[-1]["t"])
    assert 0.0 < c["other_children"] <= 1.05 and c["window_s"] >= 0.8
