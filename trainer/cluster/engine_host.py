"""The Ray engine actor of ``cluster.backend: ray`` (``EngineHost``): one server of ``rollout.engine`` on its node
(the engine's registry entry ``serve``s it), from a model directory local to that node. The server dies with the
actor, even one killed with SIGKILL: ``vllm``'s ``serve`` starts it with ``sao.core.tether.popen_tethered``, as
docs/register_engine.md asks of every engine."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from sao.agent.engines.registry import ServeArgs, engine_spec
from sao.core.tether import pid_alive
from sao.trainer.config import Config, ConfigError, config_from_dict


def _sweep_dead_work_dirs() -> None:
    """Delete the work dirs of engine actors that died without ``stop`` (killed with SIGKILL): each holds its owner's
    pid in ``owner.pid``."""
    for d in Path(tempfile.gettempdir()).glob("sao-engine-*"):
        try:
            owner = int((d / "owner.pid").read_text())
        except (OSError, ValueError):
            continue  # another user's dir, or one being created
        if not pid_alive(owner):
            shutil.rmtree(d, ignore_errors=True)


def _local_model_dir(cfg: Config, into: Path) -> str:
    """A HF model directory on this node for the engine: the configured path, or a ``tiny:*`` model written here."""
    from sao.core.paths import resolve_model_path
    from sao.trainer.learn.models import load_actor, load_tokenizer

    path = resolve_model_path(cfg.model.path)
    if not path.startswith("tiny:"):
        if not Path(path, "config.json").exists():
            raise ConfigError(f"model.path: {path!r} is not a model directory on this engine node")
        return path
    into.mkdir(parents=True, exist_ok=True)
    model: Any = load_actor(cfg)
    model.save_pretrained(into, safe_serialization=True)  # seeded: the same weights as the trainer's
    load_tokenizer(cfg).save_pretrained(into)
    return str(into)


class EngineHostImpl:
    """One server of ``rollout.engine`` on this actor's node; ``start`` returns its URL as other nodes reach it."""

    def __init__(self) -> None:
        self.server: Any = None
        self.work: Path | None = None

    def start(self, cfg_dict: dict[str, Any], advertise_host: str | None) -> str:
        import ray

        cfg = config_from_dict(cfg_dict)
        serve = engine_spec(cfg.rollout.engine).serve
        assert serve is not None, "config validation places engine actors only for engines that serve"
        _sweep_dead_work_dirs()
        work = self.work = Path(tempfile.mkdtemp(prefix="sao-engine-"))
        (work / "owner.pid").write_text(str(os.getpid()))
        atexit.register(self.stop)
        model_dir = _local_model_dir(cfg, work / "model")
        host = advertise_host or str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        bind = "127.0.0.1" if host == "127.0.0.1" else "0.0.0.0"
        log = str(work / f"{cfg.rollout.engine}.log")
        self.server = serve(ServeArgs(model_dir, bind, log, cfg.rollout.max_context_tokens))
        return str(self.server.url).replace("127.0.0.1", host)

    def server_pid(self) -> int | None:
        return None if self.server is None else int(self.server.proc.pid)

    def alive(self) -> bool:
        return self.server is not None and bool(self.server.alive())

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self.work is not None:  # the model copy and the server's log: ~30 MB per start, in /tmp
            shutil.rmtree(self.work, ignore_errors=True)
            self.work = None
