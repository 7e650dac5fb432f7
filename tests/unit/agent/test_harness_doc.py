"""The example harness of docs/register_harness.md, run as the doc gives it: registered, made by ``make_player``, it
plays an episode through the real gateway on a scripted engine in a git repository on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harness_fakes import FIXED, TASK, ShellEnv

from sao.agent.engines.scripted import ScriptedEngine
from sao.agent.episodes import Episode, EpisodeRunner, RunnerConfig
from sao.agent.harness.registry import PlayerArgs, harness_spec, make_player
from sao.agent.loop import AgentConfig
from tests._harness_doc import register_doc_harness

pytest.importorskip("openai", reason="the doc's harness uses the openai client (pip install -e .[dev])")


async def test_the_docs_harness_fixes_the_bug_through_the_gateway(smollm2_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    register_doc_harness()
    tok: Any = AutoTokenizer.from_pretrained(str(smollm2_dir))
    replies = ["Let me look.", "```bash\nsed -i 's/a - b/a + b/' calc.py\n```", "```bash\nsubmit\n```"]
    engine = ScriptedEngine([[*tok.encode(r), tok.convert_tokens_to_ids("<|im_end|>")] for r in replies])
    player = make_player("tiny", PlayerArgs(AgentConfig(2048, 64, max_turns=8), engine, tok))
    env = ShellEnv(tmp_path / "repo")
    runner = EpisodeRunner(lambda: env, player, RunnerConfig(1, progress=False))
    async with runner:
        (row,) = await runner.run_one(Episode(0, TASK, 0, TASK["instance_id"]))
    assert (tmp_path / "repo" / "calc.py").read_text() == FIXED and env.ended == ["submitted"]
    assert row.status == "ok" and row.reward == 1.0 and row.info["harness"] == {"harness": "tiny", "version": "1"}
    # the agent keeps its history: one row, exactly the engine's last prompt and its reply
    assert row.info["prefix_breaks"] == 0 and [s.kind for s in row.segments].count("action") == 3
    assert [t for s in row.segments for t in s.token_ids] == engine.prompts[2] + [*tok.encode(replies[2]), 2]
    assert harness_spec("tiny").summary.startswith("a small OpenAI-client agent")
