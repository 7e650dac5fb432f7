"""A TokenGame whose every turn also runs a command in the episode's Docker sandbox (one from the runner's warm
pool, as PythonTool and SWE episodes get theirs), so a run on the toy model depends on a Docker daemon: the run-level
fault tests stop or restart that daemon under a whole `sao train` run. Registered on import; a run names it
``env.id=tests._docker_token_game:sao/DockerTokenGame-v0`` (the module is imported first)."""

from __future__ import annotations

from typing import Any

from sao.envs import register_env
from sao.envs.base import Turn
from sao.envs.token_game import TokenGameEnv
from sao.sandboxes.protocols import Sandbox

ENV_ID = "sao/DockerTokenGame-v0"


class DockerTokenGameEnv(TokenGameEnv):
    """TokenGame (same kwargs) plus ``sandbox`` (a ``SandboxConfig`` dict, backend docker) and the ``command`` each
    turn runs there before it is scored."""

    def __init__(self, sandbox: dict[str, Any], command: str = "sleep 0.2", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._sandbox_cfg, self.command = dict(sandbox), command
        self._box: Sandbox | None = None

    async def start_episode(self, task: Any) -> tuple[str, dict[str, Any]]:
        from sao.sandboxes.factory import sandbox_config_from_dict
        from sao.sandboxes.pool import acquire_sandbox

        self._box = await acquire_sandbox(sandbox_config_from_dict(self._sandbox_cfg))
        return await super().start_episode(task)

    async def take_turn(self, action: str) -> Turn:
        assert self._box is not None
        await self._box.exec(self.command, timeout=30)
        return await super().take_turn(action)

    async def end_episode(self) -> None:
        box, self._box = self._box, None
        if box is not None:
            await box.close()


register_env(ENV_ID, DockerTokenGameEnv, "TokenGame with a Docker command per turn (run-level fault tests).")
