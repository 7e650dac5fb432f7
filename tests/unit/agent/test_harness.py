"""Harnesses: the registry, mini-swe-agent's environment adapter (result dict, submit detection), the workspace over
an env's bash tool, and episodes of the real mini-swe-agent package through the real gateway on a scripted engine
(SmolLM2's tokenizer) in a git repository on this machine (no Docker): rows, breaks, grading, outcomes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from harness_fakes import FIXED, TASK, ShellEnv

from sao.agent.engines.scripted import ScriptedEngine
from sao.agent.episodes import ChatPlayer, Episode, EpisodeRunner, RunnerConfig, TokenPlayer
from sao.agent.harness.mini_swe_agent import prepare_import
from sao.agent.harness.player import HarnessPlayer
from sao.agent.harness.protocols import CommandResult, Endpoint, EpisodeEnded, HarnessEnd, HarnessLimits
from sao.agent.harness.registry import (
    PlayerArgs,
    describe_harness,
    harness_spec,
    make_player,
    register_harness,
)
from sao.agent.harness.workspace import EnvWorkspace, bash_call
from sao.agent.loop import AgentConfig

prepare_import()  # before the package is first imported: quiet, its config dir in our cache
pytest.importorskip("minisweagent", reason="mini-swe-agent comes with the agents extra (pip install -e .[agents])")


@pytest.fixture(scope="module")
def tok(smollm2_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def act(tok: Any, text: str) -> list[int]:
    return [*tok.encode(text), tok.convert_tokens_to_ids("<|im_end|>")]


def mini(thought: str, command: str) -> str:
    return f"THOUGHT: {thought}\n\n```mswea_bash_command\n{command}\n```"


SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff"
FIX = "sed -i 's/a - b/a + b/' calc.py"


# ---- the registry ----------------------------------------------------------------------------------------------
def test_the_registry_knows_both_harnesses_by_name_and_alias() -> None:
    assert harness_spec("sao").own_loop
    spec = harness_spec("mini-swe-agent")
    assert spec is harness_spec("mini_swe_agent") and spec.default_config == "swebench_backticks"
    with pytest.raises(ValueError, match=r"unknown harness 'swe-agent' \(did you mean 'mini_swe_agent'\?\)"):
        harness_spec("swe-agent")
    with pytest.raises(ValueError, match="plays sao/SWE-v0 episodes, not 'sao/PythonTool-v0'"):
        spec.check_env("sao/PythonTool-v0")
    harness_spec("sao").check_env("sao/PythonTool-v0")  # SAO's own loop plays any env
    with pytest.raises(ValueError, match=r"\['mini-swe-agent'\] already name"):
        register_harness("other", "x", aliases=("mini-swe-agent",))


def test_make_player_builds_the_own_loop_or_a_harness_player(tok: Any) -> None:
    engine = ScriptedEngine([[1]])
    assert isinstance(make_player("sao", PlayerArgs(engine=engine, tokenizer=tok)), TokenPlayer)
    assert isinstance(make_player("sao", PlayerArgs(chat=object())), ChatPlayer)
    player = make_player("mini-swe-agent", PlayerArgs(engine=engine, tokenizer=tok))
    assert isinstance(player, HarnessPlayer) and player.harness.describe()["config"] == "swebench_backticks"
    with pytest.raises(ValueError, match="a scripted chat cannot drive it"):
        make_player("mini_swe_agent", PlayerArgs(per_task=lambda task_id: None))


def test_what_a_report_records_of_the_agent() -> None:
    assert describe_harness("sao") == {"harness": "sao"}
    d = describe_harness("mini-swe-agent", "swebench")
    assert d["package"] == "mini-swe-agent" and d["version"] == "2.4.6"
    assert d["config"] == "swebench" and d["model_class"] == "litellm"  # the tool-call config
    assert describe_harness("mini_swe_agent")["model_class"] == "litellm_textbased"


def test_a_config_sao_cannot_route_is_refused_with_the_fix(tmp_path: Path) -> None:
    from sao.agent.harness.mini_swe_agent import load_config

    with pytest.raises(ValueError, match="not found: name one of the package's"):
        load_config("no_such_config")
    cfg = tmp_path / "mine.yaml"
    cfg.write_text("agent: {system_template: s, instance_template: '{{task}}'}\nmodel: {model_class: openrouter}\n")
    with pytest.raises(ValueError, match=r"set model\.model_class to one of"):
        load_config(str(cfg))


# ---- the environment adapter ------------------------------------------------------------------------------------
class FakeWorkspace:
    task, prompt, task_text = None, "", "t"

    def __init__(self, results: list[CommandResult | Exception]) -> None:
        self.results, self.commands = results, []  # type: ignore[var-annotated]

    async def run(self, command: str) -> CommandResult:
        return self.run_sync(command)

    def run_sync(self, command: str) -> CommandResult:
        self.commands.append(command)
        r = self.results.pop(0)
        if isinstance(r, Exception):
            raise r
        return r


def test_the_adapter_returns_mini_swe_agents_result_dict_and_detects_the_submit() -> None:
    from minisweagent.exceptions import LimitsExceeded, Submitted

    from sao.agent.harness.mini_swe_agent import SandboxEnvironment

    ws = FakeWorkspace([
        CommandResult("a.py\n", 0),
        CommandResult("boom\n[exit code 2]", 2),
        CommandResult("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n", 1),  # failed: not a submission
        CommandResult("  \nCOMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\ndiff --git a/x b/x\n", 0),
    ])  # fmt: skip
    env = SandboxEnvironment(ws, {"PAGER": "cat"})  # type: ignore[arg-type]
    assert env.execute({"command": "ls"}) == {"output": "a.py\n", "returncode": 0, "exception_info": ""}
    assert env.execute({"command": "false"})["returncode"] == 2
    assert env.execute({"command": "x"})["returncode"] == 1
    with pytest.raises(Submitted) as sub:
        env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt"})
    assert sub.value.messages[0]["extra"] == {"exit_status": "Submitted", "submission": "diff --git a/x b/x\n"}
    assert ws.commands[0] == "export PAGER=cat\nls"  # the config's environment variables, as its envs pass them
    assert "PAGER" in env.get_template_vars()["env"] and "machine" in env.get_template_vars()
    ended = SandboxEnvironment(FakeWorkspace([EpisodeEnded("step_limit")]))  # type: ignore[arg-type]
    with pytest.raises(LimitsExceeded):
        ended.execute({"command": "ls"})
    assert ended.ended_by == "step_limit"


# ---- the workspace ------------------------------------------------------------------------------------------------
async def test_the_workspace_runs_commands_as_bash_calls_of_the_env(tmp_path: Path) -> None:
    env = ShellEnv(tmp_path / "repo", max_steps=4)
    exhausted = False
    ws = EnvWorkspace(env, TASK, "Fix calc.add.", exhausted=lambda: exhausted)
    assert ws.task_text == TASK["problem_statement"]
    ok = await ws.run("cat calc.py")
    assert ok.exit_code == 0 and "a - b" in ok.output
    assert (await ws.run("exit 3")).exit_code == 3
    assert await asyncio.to_thread(ws.run_sync, "echo from-a-thread") == CommandResult("from-a-thread\n", 0)
    with pytest.raises(RuntimeError, match="event loop's thread"):
        ws.run_sync("ls")
    with pytest.raises(EpisodeEnded, match="step_limit"):  # the env's own step limit: it graded there
        await ws.run("ls")
    assert ws.ended == "truncated" and ws.info["graded"] is True and env.commands[-1] == "ls"
    exhausted = True
    ws2 = EnvWorkspace(ShellEnv(tmp_path / "repo2"), TASK, "", exhausted=lambda: exhausted)
    with pytest.raises(EpisodeEnded, match="context budget"):
        await ws2.run("touch x")
    assert not (tmp_path / "repo2" / "x").exists()  # a command written into the last room is not run
    assert bash_call("a'\"b") == '<tool_call>{"name": "bash", "arguments": {"command": "a\'\\"b"}}</tool_call>'


async def test_a_command_holding_the_closing_tag_runs_as_written(tmp_path: Path) -> None:
    # issue 44: json.dumps left `</` as it is, the env's parser cut the call at the command's `</tool_call>`, and the
    # policy's command became an infra error (a policy-caused outcome discarded)
    from sao.envs.tools.parsing import parse_action

    command = "printf '%s\\n' '</tool_call>' '</x>'"
    assert parse_action(bash_call(command)).arguments == {"command": command}
    ws = EnvWorkspace(ShellEnv(tmp_path / "repo"), TASK, "Fix calc.add.")
    res = await ws.run(command)
    assert res == CommandResult("</tool_call>\n</x>\n", 0) and not ws.infra_error


# ---- episodes of the real mini-swe-agent package through the gateway -------------------------------------------
async def play(player: HarnessPlayer, env: ShellEnv, index: int = 0) -> list[Any]:
    runner = EpisodeRunner(lambda: env, player, RunnerConfig(1, progress=False))
    async with runner:
        return await runner.run_one(Episode(index, TASK, 0, TASK["instance_id"]))


async def test_mini_swe_agent_plays_through_the_gateway_and_a_format_error_starts_a_new_row(
    tok: Any, tmp_path: Path
) -> None:
    replies = ["I will just say it is fixed.", mini("Fix the sign.", FIX), mini("Submit.", SUBMIT)]
    engine = ScriptedEngine([act(tok, r) for r in replies], version=3)
    player = make_player("mini-swe-agent", PlayerArgs(AgentConfig(4096, 256, max_turns=10), engine, tok))
    env = ShellEnv(tmp_path / "repo")
    rows = await play(player, env)  # type: ignore[arg-type]
    assert (tmp_path / "repo" / "calc.py").read_text() == FIXED and env.ended == ["submitted"]
    assert [c.split("\n")[-1] for c in env.commands] == [FIX, SUBMIT]  # after the exported variables
    # mini-swe-agent drops a reply it cannot parse: the next request does not extend the row, so a new one starts
    assert len(rows) == 2 and all(r.info["prefix_breaks"] == 1 for r in rows)
    assert [r.info["row"] for r in rows] == [0, 1] and all(r.status == "ok" and r.reward == 1.0 for r in rows)
    last = rows[-1]
    assert last.info["solved"] and last.info["exit_status"] == "Submitted" and last.info["turns"] == 2
    assert last.info["harness"]["config"] == "swebench_backticks" and last.info["episode"] == 0
    assert "total_s" in last.timings and rows[0].timings == {}
    # token for token what the engine was given and sampled: row 0 = call 0, row 1 = calls 1 and 2
    ids = [[t for s in r.segments for t in s.token_ids] for r in rows]
    assert ids[0] == engine.prompts[0] + act(tok, replies[0])
    assert (
        ids[1][: len(engine.prompts[2])] == engine.prompts[2]
        and engine.prompts[2][: len(engine.prompts[1])] == (engine.prompts[1])
    )
    assert ids[1] == engine.prompts[2] + act(tok, replies[2])
    actions = [s for r in rows for s in r.segments if s.kind == "action"]
    assert [s.policy_version for s in actions] == [3, 3, 3] and actions[-1].reward == 1.0
    prompt = tok.decode(engine.prompts[0])
    assert "<pr_description>" in prompt and TASK["problem_statement"] in prompt  # its SWE-bench prompt, our task


async def test_an_agent_stopped_by_its_step_limit_is_graded_as_a_truncation(tok: Any, tmp_path: Path) -> None:
    engine = ScriptedEngine([act(tok, mini("Look.", "ls"))])
    player = make_player("mini_swe_agent", PlayerArgs(AgentConfig(4096, 128, max_turns=2), engine, tok))
    env = ShellEnv(tmp_path / "repo")
    (row,) = await play(player, env)  # type: ignore[arg-type]
    assert row.status == "truncated" and row.info["truncation_reason"] == "step_limit" and row.info["graded"]
    assert env.ended == ["step_limit"] and row.reward == 0.0 and not row.bootstraps  # graded: terminal
    assert row.info["exit_status"] == "LimitsExceeded" and len(env.commands) == 2


async def test_the_envs_own_limit_ends_the_agent_and_its_grade_stands(tok: Any, tmp_path: Path) -> None:
    engine = ScriptedEngine([act(tok, mini("Fix.", FIX)), act(tok, mini("Look.", "ls"))])
    player = make_player("mini_swe_agent", PlayerArgs(AgentConfig(4096, 128, max_turns=10), engine, tok))
    env = ShellEnv(tmp_path / "repo", max_steps=2)
    turns: list[int] = []
    player.on_turn = lambda: turns.append(1)  # type: ignore[attr-defined]  # the runner's progress line counts these
    (row,) = await play(player, env)  # type: ignore[arg-type]
    assert row.status == "truncated" and row.info["truncation_reason"] == "step_limit" and row.reward == 1.0
    assert len(turns) == 2
    assert env.ended == [] and len(env.commands) == 2  # the env graded at its limit; SAO did not grade again


async def test_an_engine_failure_behind_the_gateway_is_an_infra_error(
    tok: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "1")  # litellm's retries would only wait
    engine = ScriptedEngine([act(tok, mini("Look.", "ls"))], fail_after=1)
    player = make_player("mini_swe_agent", PlayerArgs(AgentConfig(4096, 128, max_turns=10), engine, tok))
    (row,) = await play(player, ShellEnv(tmp_path / "repo"))  # type: ignore[arg-type]
    assert row.status == "infra_error" and "engine failed" in row.info["infra_error"]


async def test_a_failed_request_the_agent_retried_keeps_the_episodes_graded_outcome(
    tok: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The second request fails once; mini-swe-agent retries it and goes on to submit the fix. Nothing was recorded
    # for the failed try, so the rows are those of a run without it and the graded outcome is the policy's.
    monkeypatch.setenv("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "2")
    engine = ScriptedEngine([act(tok, mini("Fix.", FIX)), act(tok, mini("Submit.", SUBMIT))], fail_attempts=[1])
    player = make_player("mini_swe_agent", PlayerArgs(AgentConfig(4096, 256, max_turns=10), engine, tok))
    (row,) = await play(player, ShellEnv(tmp_path / "repo"))  # type: ignore[arg-type]
    assert row.status == "ok" and row.reward == 1.0 and row.info["engine_errors"] == 1
    assert len(engine.prompts) == 2 and row.info["prefix_breaks"] == 0
    assert [s.kind for s in row.segments] == ["prompt", "action", "observation", "action"]


async def test_a_failed_request_before_an_env_step_limit_keeps_the_envs_grade(
    tok: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "2")
    engine = ScriptedEngine([act(tok, mini("Fix.", FIX)), act(tok, mini("Look.", "ls"))], fail_attempts=[1])
    player = make_player("mini_swe_agent", PlayerArgs(AgentConfig(4096, 128, max_turns=10), engine, tok))
    (row,) = await play(player, ShellEnv(tmp_path / "repo", max_steps=2))  # type: ignore[arg-type]
    assert row.status == "truncated" and row.info["truncation_reason"] == "step_limit" and row.reward == 1.0
    assert row.info["engine_errors"] == 1


class Lying:
    """mini-swe-agent, but its end claims the task solved and nothing graded (what a harness could write)."""

    name = "lying"

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def describe(self) -> dict[str, Any]:
        return {"harness": self.name}

    async def play(self, ws: Any, endpoint: Endpoint, limits: HarnessLimits) -> HarnessEnd:
        end = await self.inner.play(ws, endpoint, limits)
        return HarnessEnd(end.reason, end.exit_status, end.messages, {**end.info, "solved": True, "graded": False})


async def test_a_harness_cannot_overwrite_the_graders_outcome(tok: Any, tmp_path: Path) -> None:
    # issue 44: the harness's end.info was merged after the grader's, so it could say `solved` (and `graded`, which
    # decides whether the trainer bootstraps)
    engine = ScriptedEngine([act(tok, mini("Look.", "ls")), act(tok, mini("Submit.", SUBMIT))])
    inner = make_player("mini_swe_agent", PlayerArgs(AgentConfig(4096, 256, max_turns=10), engine, tok))
    player = HarnessPlayer(Lying(inner.harness), AgentConfig(4096, 256, max_turns=10), engine=engine, tokenizer=tok)  # type: ignore[attr-defined]
    (row,) = await play(player, ShellEnv(tmp_path / "repo"))
    assert row.status == "ok" and row.reward == 0.0
    assert row.info["solved"] is False and row.info["graded"] is True and row.info["harness"] == {"harness": "lying"}


async def test_a_command_costs_no_copy_of_the_sessions_record(
    tok: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 44: the player built the whole session record (every call, every prompt) before each command to read one
    # flag, work that grows with the session on every turn
    from sao.agent.gateway import Gateway

    built: list[str] = []
    real = Gateway.record
    monkeypatch.setattr(Gateway, "record", lambda self, sid: built.append(sid) or real(self, sid))
    replies = [mini("Look.", "ls"), mini("Look.", "git status"), mini("Fix.", FIX), mini("Submit.", SUBMIT)]
    engine = ScriptedEngine([act(tok, r) for r in replies])
    player = make_player("mini_swe_agent", PlayerArgs(AgentConfig(4096, 256, max_turns=10), engine, tok))
    env = ShellEnv(tmp_path / "repo")
    (row,) = await play(player, env)  # type: ignore[arg-type]
    assert row.reward == 1.0 and len(env.commands) == 4 and built == []


class Raising:
    name = "raising"

    def describe(self) -> dict[str, Any]:
        return {"harness": self.name}

    async def play(self, ws: Any, endpoint: Endpoint, limits: HarnessLimits) -> HarnessEnd:
        await ws.run("touch started")
        raise KeyError("the harness broke")


async def test_a_harness_that_raises_gives_an_infra_error_record(tok: Any, tmp_path: Path) -> None:
    player = HarnessPlayer(Raising(), AgentConfig(512, 64), engine=ScriptedEngine([[1]]), tokenizer=tok)
    (row,) = await play(player, ShellEnv(tmp_path / "repo"))
    assert row.status == "infra_error" and "KeyError" in row.info["infra_error"] and row.segments == ()


async def test_a_plain_endpoint_records_nothing_but_the_conversation(tok: Any, tmp_path: Path) -> None:
    from sao.agent.gateway import Gateway

    engine = ScriptedEngine([act(tok, mini("Fix.", FIX)), act(tok, mini("Submit.", SUBMIT))])
    async with Gateway(engine, tok, max_context_tokens=4096, max_action_tokens=256) as gw:  # any OpenAI server
        endpoint = Endpoint(gw.open_session("plain"), "m", params={"max_tokens": 256}, recorded=False)
        player = make_player("mini_swe_agent", PlayerArgs(AgentConfig(4096, 256, max_turns=10), endpoint=endpoint))
        (row,) = await play(player, ShellEnv(tmp_path / "repo"))  # type: ignore[arg-type]
    assert row.status == "ok" and row.reward == 1.0 and row.segments == ()
    roles = [m["role"] for m in row.info["messages"]]
    assert roles[:3] == ["system", "user", "assistant"] and roles[-1] == "exit"


async def test_the_function_calling_config_works_through_the_gateways_tool_calls(tok: Any, tmp_path: Path) -> None:
    """mini-swe-agent's `swebench` config: OpenAI tool calls out of the gateway, tool results back, one row."""

    def call(command: str) -> str:
        return '<tool_call>{"name": "bash", "arguments": {"command": ' + json.dumps(command) + "}}</tool_call>"

    engine = ScriptedEngine([act(tok, call(FIX)), act(tok, call(SUBMIT))])
    args = PlayerArgs(AgentConfig(8192, 256, max_turns=10), engine, tok, config="swebench")
    env = ShellEnv(tmp_path / "repo")
    (row,) = await play(make_player("mini_swe_agent", args), env)  # type: ignore[arg-type]
    assert row.status == "ok" and row.reward == 1.0 and row.info["prefix_breaks"] == 0
    assert row.info["harness"]["model_class"] == "litellm" and [c.split("\n")[-1] for c in env.commands] == [
        FIX,
        SUBMIT,
    ]
