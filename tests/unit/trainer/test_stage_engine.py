"""The stages' engine (``rollout.stage_engine``): a server engine is started on the stage's model directory, aliases
resolved, its log in the stage's folder, and closing the engine stops it; an in-process one gets the loaded model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sao.agent.engines.registry import ServeArgs, Server, engine_spec, register_engine
from sao.core.paths import resolve_model_path
from sao.trainer.config import load_config

ROOT = Path(__file__).resolve().parents[3]
STARTED: list[ServeArgs] = []


class _FakeServer:
    def __init__(self, args: ServeArgs) -> None:
        self.url, self.proc, self.args, self.stopped = "http://127.0.0.1:1", None, args, False

    def alive(self) -> bool:
        return not self.stopped

    def stop(self) -> None:
        self.stopped = True


class _Client:
    def __init__(self, urls: Sequence[str], servers: Sequence[Server]) -> None:
        self.urls, self.servers = list(urls), list(servers)

    async def close(self) -> None:
        for s in self.servers:
            s.stop()


def _serve(a: ServeArgs) -> Server:
    STARTED.append(a)
    return _FakeServer(a)


def _fake_server_engine() -> str:
    try:
        engine_spec("fake_stage_server")
    except ValueError:
        register_engine(
            "fake_stage_server", "a server engine of this test", serve=_serve, connect=_Client,
            weight_sync=("checkpoint",),
        )  # fmt: skip
    return "fake_stage_server"


async def test_a_server_stage_engine_serves_the_stages_model_dir_and_stops_with_the_engine(tmp_path: Path) -> None:
    from sao.trainer.runs.stages import _stage_engine

    name = _fake_server_engine()
    cfg = load_config(ROOT / "configs" / "swe_quickstart.yaml", [f"rollout.stage_engine={name}"])
    STARTED.clear()
    engine = _stage_engine(cfg, None, "smollm2", tmp_path / "02_eval")
    assert isinstance(engine, _Client) and len(STARTED) == 1
    args = STARTED[0]
    assert args.model_dir == resolve_model_path("smollm2") != "smollm2"  # the alias resolved: servers need a dir
    assert args.max_model_len == cfg.rollout.max_context_tokens == 4096
    assert args.log_path == str(tmp_path / "02_eval" / "logs" / "stage_server.log")
    (server,) = engine.servers
    assert server.alive()
    await engine.close()  # what the stage's rollouts do when they end
    assert not server.alive()


def test_without_a_stage_engine_the_rollout_engine_plays_the_stages_in_process() -> None:
    from sao.trainer.runs.stages import _stage_engine

    class Tiny:
        pass

    cfg = load_config(ROOT / "configs" / "toy.yaml", ["stages=[eval]", "env.tasks=arithmetic"])
    assert cfg.rollout.stage_engine is None and engine_spec(cfg.rollout.engine).in_process is not None
    STARTED.clear()
    engine: Any = _stage_engine(cfg, Tiny(), "tiny:llama", Path("unused"))
    assert STARTED == [] and engine.version == 0 and hasattr(engine, "generate")
