"""`sao bench gateway` on a scripted engine: both paths replay the same prompts, the table's numbers add up, bad
settings are named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from sao.agent.engines.scripted import ScriptedEngine
from sao.benchmarks.bench_gateway import GatewayBenchConfig, _level


async def test_a_level_replays_the_gateways_engine_prompts_directly(tmp_path: Path, smollm2_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(str(smollm2_dir))
    engine = ScriptedEngine([[*tok.encode(" ls"), 2]], delay_s=0.02)
    cfg = GatewayBenchConfig(out=tmp_path, turns=3, max_tokens=4, episodes_at_1=2)
    level = await _level(engine, tok, 4, cfg, 512)
    # Gateway (a warm-up episode + 4), direct twice (a warm-up call + the same 12 prompts), gateway again.
    assert (level.episodes, level.calls, level.same_tokens) == (4, 24, True)
    assert len(engine.prompts) == 2 * (3 + 12) + 2 * (1 + 12)
    through_gateway = sorted(map(tuple, engine.prompts[3:15]))
    assert sorted(map(tuple, engine.prompts[16:28])) == sorted(map(tuple, engine.prompts[29:41])) == through_gateway
    assert level.engine_s >= 24 * 0.02 and level.client_s > level.engine_s and level.overhead > 0


def test_sao_bench_gateway_names_a_bad_setting(tmp_path: Path) -> None:
    from sao.cli.main import app

    res = CliRunner().invoke(app, ["bench", "gateway", "--out", str(tmp_path), "--turns", "0"])
    assert res.exit_code == 2 and "--turns" in res.output
