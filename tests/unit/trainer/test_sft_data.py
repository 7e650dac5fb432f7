"""SFT inputs: the agent's token ids for a tool conversation, the action-only mask, bad input, bucketing; the solver."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from sao.agent.records import Segment, Trajectory
from tests.unit.agent.agent_fakes import ScriptedEnv

TOOLS = [
    {
        "type": "function",
        "function": {"name": "python", "description": "Run Python.", "parameters": {"type": "object"}},
    }
]


@pytest.fixture(scope="module")
def tok(smollm2_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def _conversation() -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "python", "arguments": '{"code": "print(17 * 23)"}'}}
    return [
        {"role": "system", "content": "You solve math problems."},
        {"role": "user", "content": "Compute 17 * 23."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "391\n"},
        {"role": "assistant", "content": "The tool printed 391, so \\boxed{391}"},
    ]


def test_sft_ids_equal_the_agents_trajectory_ids_for_the_same_conversation(tok: Any) -> None:
    from sao.agent.chat import ChatRenderer
    from sao.agent.conversation import action_ids, render_conversation
    from sao.agent.engines.scripted import ScriptedEngine
    from sao.agent.loop import AgentConfig, run_episode

    chat = ChatRenderer(tok)
    msgs = _conversation()
    # The agent plays the same conversation: the engine writes the two actions, the env returns the tool output.
    texts = ['<tool_call>{"name": "python", "arguments": {"code": "print(17 * 23)"}}</tool_call>', msgs[4]["content"]]
    engine = ScriptedEngine([action_ids(chat, t) for t in texts])
    env = ScriptedEnv(
        [("391\n", 0.0, False, False, {"role": "tool"}), ("", 1.0, True, False, {"solved": True})],
        task=msgs[1]["content"],
        system_prompt=msgs[0]["content"],
        tools=TOOLS,
    )
    traj = asyncio.run(run_episode(env, engine, tok, AgentConfig(max_context_tokens=4096)))  # type: ignore[arg-type]
    assert env.actions == texts  # the env parsed exactly the text the SFT data stands for

    r = render_conversation(chat, msgs, TOOLS)
    assert list(r.input_ids) == traj.token_ids
    expected_mask = [s.kind == "action" for s in traj.segments for _ in s.token_ids]
    assert list(r.action_mask) == expected_mask
    # Prompt, the tool output and the template's headers are masked; the two actions (with <|im_end|>) are not.
    assert r.num_action_tokens == sum(len(s.token_ids) for s in traj.action_segments)
    assert tok.decode([t for t, m in zip(r.input_ids, r.action_mask, strict=True) if m]).count("<|im_end|>") == 2


def _write(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _traj(tok: Any, reward: float, status: str = "ok") -> dict[str, Any]:
    prompt = tok.encode("<|im_start|>user\nCompute 2 * 3.<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    act = tok.encode("\\boxed{6}<|im_end|>", add_special_tokens=False)
    segs = (Segment("prompt", prompt), Segment("action", act, tuple([-0.1] * len(act)), 0, reward))
    return Trajectory("t", "e", segs, reward, status).to_dict()  # type: ignore[arg-type]


def test_trajectories_are_filtered_by_reward_and_keep_their_own_ids(tmp_path: Path, tok: Any) -> None:
    from sao.trainer.sft.data import load_examples

    recs = [_traj(tok, 1.0), _traj(tok, 0.0), {"type": "trajectory", "trajectory": _traj(tok, 1.0)},
            {"type": "event", "uid": "x"}, _traj(tok, 1.0, "infra_error")]  # fmt: skip
    data = _write(tmp_path / "t.jsonl", recs)
    ex, stats = load_examples([str(data)], tok, min_reward=1.0)
    assert len(ex) == 2 and stats.below_min_reward == 1 and stats.infra_errors == 1
    tr = Trajectory.from_dict(recs[0])
    assert list(ex[0].input_ids) == tr.token_ids
    assert sum(ex[0].loss_mask) == len(tr.action_segments[0].token_ids)
    ex_all, _ = load_examples([str(data)], tok, min_reward=None)
    assert len(ex_all) == 3


def test_examples_come_in_content_order_whatever_the_file_order(tmp_path: Path, tok: Any) -> None:
    """The same demonstrations written in another order (a concurrent collect finishes its episodes in a different
    order every run) give the same examples in the same order, so the seeded SFT batches are the same."""
    from sao.trainer.sft.data import load_examples

    recs = [_traj(tok, 1.0)]
    for answer in ("7", "12", "5"):
        other = Trajectory.from_dict(_traj(tok, 1.0)).to_dict()
        act = tok.encode(f"\\boxed{{{answer}}}<|im_end|>", add_special_tokens=False)
        other["segments"][1] = {**other["segments"][1], "token_ids": act, "logprobs": [-0.1] * len(act)}
        recs.append(other)
    a, _ = load_examples([str(_write(tmp_path / "a.jsonl", recs))], tok)
    b, _ = load_examples([str(_write(tmp_path / "b.jsonl", recs[::-1]))], tok)
    assert len({e.input_ids for e in a}) == 4
    assert [e.input_ids for e in a] == [e.input_ids for e in b]
    assert [e.input_ids for e in a] == sorted(e.input_ids for e in a)


@pytest.mark.parametrize(
    ("record", "needle"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant message"),
        ({"prompt": "hi", "completion": "there"}, "missing field 'messages'"),
        ({"messages": [{"content": "hi"}, {"role": "assistant", "content": "x"}]}, "has no 'role'"),
    ],
)
def test_bad_records_name_the_file_line_and_fix(tmp_path: Path, tok: Any, record: dict[str, Any], needle: str) -> None:
    from sao.trainer.sft.data import SFTDataError, load_examples

    good = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    data = _write(tmp_path / "d.jsonl", [good, record])
    with pytest.raises(SFTDataError, match=needle) as e:
        load_examples([str(data)], tok)
    assert f"{data}:2:" in str(e.value)


def test_a_trajectory_from_another_tokenizer_is_refused(tmp_path: Path, tok: Any) -> None:
    from sao.trainer.sft.data import SFTDataError, load_examples

    rec = _traj(tok, 1.0)
    shifted = dict(rec)
    shifted["segments"] = [dict(s, token_ids=[t + 7 for t in s["token_ids"]]) for s in rec["segments"]]
    huge = dict(rec)
    huge["segments"] = [dict(s, token_ids=[t + len(tok) for t in s["token_ids"]]) for s in rec["segments"]]
    for bad, needle in ((shifted, "round-trip"), (huge, "outside this tokenizer's vocabulary")):
        data = _write(tmp_path / "x.jsonl", [rec, bad])
        with pytest.raises(SFTDataError, match=needle) as e:
            load_examples([str(data)], tok)
        assert f"{data}:2:" in str(e.value) and "different tokenizer" in str(e.value)


def test_bucketing_keeps_batch_size_covers_everything_and_pads_less() -> None:
    import random

    from sao.trainer.sft.data import bucketed_batches, padding_fraction

    rng = random.Random(0)
    lengths = [rng.randint(20, 400) for _ in range(200)]
    batches = bucketed_batches(lengths, 8, seed=1)
    assert all(len(b) == 8 for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(200))
    shuffled = list(range(200))
    rng.shuffle(shuffled)
    plain = [shuffled[i : i + 8] for i in range(0, 200, 8)]
    assert padding_fraction(batches, lengths, 4) < 0.5 * padding_fraction(plain, lengths, 4)
    assert bucketed_batches(lengths, 8, seed=1) == batches  # resume replays the same order
    assert bucketed_batches(lengths, 8, seed=2) != batches


def test_solver_calls_the_tool_then_boxes_the_tools_output(tok: Any) -> None:
    from sao.agent.chat import ChatRenderer
    from sao.agent.engines.protocols import EngineError, SamplingParams
    from sao.agent.engines.solver import SolverEngine, solver_action
    from sao.envs.tools.parsing import parse_action

    chat = ChatRenderer(tok)
    msgs = chat.initial_messages("sys", "Compute 277 * 535 + 64. Use the python tool.", TOOLS)
    prompt = chat.render_prompt(msgs)
    gen = asyncio.run(SolverEngine(tok).generate(prompt, SamplingParams(max_tokens=64)))
    assert gen.token_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>") and set(gen.logprobs) == {0.0}
    call = parse_action(chat.action_text(list(gen.token_ids)))
    assert call.name == "python" and call.arguments == {"code": "print(277 * 535 + 64)"}
    # The answer is whatever the tool printed (the real output), not the solver's own arithmetic.
    obs = chat.render_after_action(list(gen.token_ids), chat.message("tool", "148259\n"))
    text = tok.decode(prompt + list(gen.token_ids) + obs, skip_special_tokens=False)
    assert solver_action(text) == "\\boxed{148259}"
    assert solver_action(text.replace("148259", "Traceback: NameError")).startswith("<tool_call>")
    with pytest.raises(EngineError, match="only solves arithmetic"):
        solver_action("<|im_start|>user\nFind all primes p such that p^2 + 2 is prime.<|im_end|>")
    with pytest.raises(EngineError, match="max_tokens"):
        asyncio.run(SolverEngine(tok).generate(prompt, SamplingParams(max_tokens=8)))
