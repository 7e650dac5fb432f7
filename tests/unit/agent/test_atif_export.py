"""`sao export atif`: SAO trajectories (own loop, a harness episode's rows, a training ledger) as ATIF, validated
by the `atif` package's own models, token ids and logprobs per agent step exactly the trajectory's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sao.agent.records import Segment, Trajectory, write_jsonl

atif = pytest.importorskip("atif", reason="atif comes with the agents extra (pip install -e .[agents])")


@pytest.fixture(scope="module")
def tok(smollm2_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def own_loop(tok: Any) -> Trajectory:
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Fix a.py."}], tokenize=False, add_generation_prompt=True
    )
    prompt = tok.encode(text)
    call = '<tool_call>{"name": "bash", "arguments": {"command": "cat a.py"}}</tool_call>'
    act1 = [*tok.encode(call), 2]
    obs = tok.encode("\n<|im_start|>user\nx = 1<|im_end|>\n<|im_start|>assistant\n")
    act2 = [*tok.encode("Done."), 2]
    segs = (
        Segment("prompt", tuple(prompt)),
        Segment("action", tuple(act1), tuple(-0.1 * (i + 1) for i in range(len(act1))), 4, 0.0),
        Segment("observation", tuple(obs)),
        Segment("action", tuple(act2), tuple(-0.5 for _ in act2), 5, 1.0),
    )
    return Trajectory("t-1", "sao/SWE-v0", segs, 1.0, "ok", {"episode": 0, "solved": True, "turns": 2})


def harness_rows(tok: Any) -> list[Trajectory]:
    info = {"session_id": "ep1-abc", "prefix_breaks": 1, "rows": 2, "episode": 1, "exit_status": "Submitted",
            "harness": {"harness": "mini_swe_agent", "version": "2.4.6", "config": "swebench_backticks"}}  # fmt: skip
    rows = []
    for r, text in enumerate(["no block here", "THOUGHT: x\n\n```mswea_bash_command\nls -la\n```"]):
        act = [*tok.encode(text), 2]
        segs = (
            Segment("prompt", tuple(tok.encode(f"prompt {r}"))),
            Segment("action", tuple(act), (-1.0,) * len(act), 7),
        )
        rows.append(Trajectory("t-2", "sao/SWE-v0", segs, 0.0, "truncated", {**info, "row": r}))
    return rows


def test_a_run_folder_exports_to_atif_that_the_atif_models_validate(
    tok: Any, tmp_path: Path, smollm2_dir: Path
) -> None:
    from sao.cli.main import app

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(f"model:\n  path: {smollm2_dir}\n")
    infra = Trajectory("t-3", "sao/SWE-v0", (), 0.0, "infra_error", {"infra_error": "docker"})
    write_jsonl(run / "trajectories.jsonl", [own_loop(tok), *harness_rows(tok), infra])
    ledger = [{"type": "trajectory", "uid": "u", "trajectory": own_loop(tok).to_dict()},
              {"type": "event", "uid": "u", "event": "trained", "step": 1, "version": 1}]  # fmt: skip
    (run / "02_train").mkdir()
    (run / "02_train" / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ledger))
    res = CliRunner().invoke(app, ["export", "atif", str(run)])
    assert res.exit_code == 0, res.output
    assert "3 trajectories (1 infra errors skipped)" in res.output
    lines = (run / "atif" / "trajectories.atif.jsonl").read_text().splitlines()
    docs = [atif.Trajectory.model_validate_json(line) for line in lines]  # the package's own validation
    assert len(docs) == 3 and len((run / "atif" / "02_train__trajectories.atif.jsonl").read_text().splitlines()) == 1
    own = docs[0]
    assert [s.source for s in own.steps] == ["user", "agent", "agent"] and own.agent.name == "sao"
    t = own_loop(tok)
    a1, a2 = own.steps[1], own.steps[2]
    assert a1.metrics.completion_token_ids == list(t.segments[1].token_ids)
    assert a1.metrics.logprobs == list(t.segments[1].logprobs) and a1.metrics.extra == {"policy_version": 4}
    assert a1.metrics.prompt_token_ids == list(t.segments[0].token_ids)
    assert a2.metrics.prompt_token_ids == [i for s in t.segments[:3] for i in s.token_ids]
    assert a1.tool_calls[0].function_name == "bash" and a1.tool_calls[0].arguments == {"command": "cat a.py"}
    assert a1.observation.results[0].source_call_id == a1.tool_calls[0].tool_call_id
    assert a1.observation.results[0].extra == {"token_ids": list(t.segments[2].token_ids)}
    assert own.extra["reward"] == 1.0 and own.extra["solved"] is True and own.final_metrics.total_steps == 3
    row0, row1 = docs[1], docs[2]
    assert row0.agent.name == "mini_swe_agent" and row0.agent.version == "2.4.6" and row0.session_id == "ep1-abc"
    assert row0.continued_trajectory_ref == row1.trajectory_id and row1.continued_trajectory_ref is None
    assert row0.steps[1].tool_calls is None and row1.steps[1].tool_calls[0].arguments == {"command": "ls -la"}
    assert row1.extra["prefix_breaks"] == 1 and row1.extra["status"] == "truncated"


def test_a_folder_without_its_model_or_trajectories_is_named(tmp_path: Path) -> None:
    from sao.cli.export import export_atif

    with pytest.raises(ValueError, match=r"no trajectories\.jsonl"):
        export_atif(tmp_path)
    write_jsonl(tmp_path / "trajectories.jsonl", [])
    with pytest.raises(ValueError, match="pass --tokenizer"):
        export_atif(tmp_path)
