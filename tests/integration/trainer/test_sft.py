"""`sao sft` on DeepSpeed: it learns the action tokens, masks the rest, and a resumed run equals an unbroken one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

pytestmark = [pytest.mark.deepspeed]


def _data(path: Path, n: int = 12) -> Path:
    rows = []
    for i in range(n):
        a, b = 11 + i, 7 + 2 * i
        call = {"type": "function", "function": {"name": "python", "arguments": {"code": f"print({a} * {b})"}}}
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": f"Compute {a} * {b}."},
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "content": f"{a * b}\n"},
                    {"role": "assistant", "content": f"\\boxed{{{a * b}}}"},
                ]
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _config(tmp_path: Path, data: Path, steps: int) -> Path:
    cfg = {
        "run": {"dir": str(tmp_path / "sft"), "save_every": 2, "keep_checkpoints": 1, "progress": False},
        "model": {"path": "tiny:llama"},
        "sft": {"data": [str(data)], "steps": steps, "batch_size": 4, "lr": 1e-2, "max_len": 256},
        "deepspeed": {"micro_batch_size": 2},
    }
    p = tmp_path / f"sft{steps}.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def _weights(d: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(d / "final" / "actor" / "model.safetensors"))


def test_sft_lowers_the_action_loss_and_resume_matches_an_unbroken_run(
    tmp_path: Path, deepspeed_env: dict[str, str], smollm2_dir: Path
) -> None:
    from sao.trainer.sft.run import sft

    data = _data(tmp_path / "conv.jsonl")
    run_dir, _ = sft(str(_config(tmp_path, data, 4)), [f"run.dir={tmp_path / 'full'}"])
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["sft_loss"] < 0.8 * rows[0]["sft_loss"], [r["sft_loss"] for r in rows]
    assert (run_dir / "plots" / "curves.png").stat().st_size > 0
    assert (run_dir / "final" / "actor" / "tokenizer_config.json").exists()

    # Interrupted after 2 steps, then resumed to 4: the same weights as the unbroken run (data order and Adam
    # state come back from the checkpoint).
    part, _ = sft(str(_config(tmp_path, data, 2)), [f"run.dir={tmp_path / 'part'}"])
    sft(None, ["sft.steps=4"], resume=str(part))
    rows2 = [json.loads(x) for x in (part / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows2] == [1, 2, 3, 4]
    full_w, part_w = _weights(run_dir), _weights(part)
    for k, v in full_w.items():
        torch.testing.assert_close(part_w[k], v, rtol=1e-5, atol=1e-6, msg=k)


def test_the_loss_covers_action_tokens_only() -> None:
    """The SFT loss is the summed NLL of exactly the action tokens (each predicted from everything before it)."""
    from sao.core.tiny_models import build_tiny_model
    from sao.trainer.sft.run import action_nll

    model: Any = build_tiny_model("llama", seed=0)
    ids = torch.arange(20, 36).unsqueeze(0)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[0, 6:9] = True  # an action of three tokens
    mask[0, 12:14] = True  # a second action
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": mask}
    nll, _, n = action_nll(model, batch)
    nll = nll.detach()
    assert n == 5
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
    manual = -sum(float(logp[t - 1, ids[0, t]]) for t in (6, 7, 8, 12, 13))
    everything = -sum(float(logp[t - 1, ids[0, t]]) for t in range(1, 16))
    assert abs(float(nll) - manual) < 1e-4 and abs(manual - everything) > 1.0
