"""The ``mini_swe_agent`` harness: the real mini-swe-agent package plays SAO's SWE tasks.

What runs is mini-swe-agent's own: its ``DefaultAgent`` (the loop, its step limit, its format-error exit), the
prompts and templates of one of its SWE-bench configs, and its litellm model class, pointed at the episode's
OpenAI base URL (``openai/<model>`` with ``api_base``; ``cost_tracking: ignore_errors``, since a local policy has
no price, so its ``step_limit`` is what bounds it). What SAO supplies is the environment: ``SandboxEnvironment``
runs each command in the episode's SAO sandbox through the SWE env's own ``bash`` tool (``EnvWorkspace``), with
the config's environment variables exported first, and raises mini-swe-agent's ``Submitted`` when the output's
first line is ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` and the command exited 0, as its own environments do.

The default config is ``swebench_backticks`` (text actions in a ```` ```mswea_bash_command ```` block, model class
``litellm_textbased``): a small model such as SmolLM2 writes a fenced block as plain text, while the tool-call
config (``swebench``) needs replies with OpenAI function calls, which a model whose chat template has no tool
format only produces through SAO's ``<tool_call>`` text convention, never seen in mini-swe-agent's prompts.
Any config name of the package or a YAML path works; its model class must be ``litellm`` or
``litellm_textbased`` (the others call fixed URLs). Its ``environment`` section's ``cwd``/``timeout`` give way to the
SWE env's (``/testbed``, ``tool_timeout_s``).

The agent is synchronous (litellm blocks), so it runs in a thread of its own while the gateway serves in the event
loop. Process-wide settings made before the package is first imported (each only if unset): it starts silently
(``MSWEA_SILENT_STARTUP``), keeps its global config in SAO's cache (``MSWEA_GLOBAL_CONFIG_DIR``; not the user's
``~/.config``, whose ``.env`` it would load), litellm reads its bundled cost map (``LITELLM_LOCAL_MODEL_COST_MAP``:
no download at import) and a failed call is tried 3 times (``MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT``).
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from sao.agent.harness.protocols import (
    CommandResult,
    Endpoint,
    EpisodeEnded,
    HarnessEnd,
    HarnessLimits,
    Workspace,
    stop_reason,
)
from sao.agent.harness.workspace import in_thread

SUBMIT_SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
DEFAULT_CONFIG = "swebench_backticks"
REPO_DIR = "/testbed"
# The package's SWE-bench configs and the model class each is meant for when the calls go to our endpoint
# (swebench_backticks declares none, swebench_xml names openrouter, which cannot take another URL).
MODEL_CLASSES = {"swebench_backticks": "litellm_textbased", "swebench_xml": "litellm_textbased", "swebench": "litellm"}
ROUTABLE = ("litellm", "litellm_textbased")
EXIT_REASONS = {
    "Submitted": "submitted",
    "LimitsExceeded": "step_limit",
    "TimeExceeded": "time_limit",
    "RepeatedFormatError": "format_errors",
}


def prepare_import() -> None:
    """The process-wide settings of the module doc (each only if unset), before mini-swe-agent is imported."""
    from sao.core.paths import cache_dir

    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", str(cache_dir() / "mini-swe-agent"))
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "3")


def load_config(spec: str) -> tuple[dict[str, Any], str, str]:
    """(the config, the model class to use, where it came from) of a config name of the package or a YAML path;
    ``ValueError`` naming the fix for one SAO cannot route or that is not there."""
    prepare_import()
    import yaml
    from minisweagent.config import get_config_path

    try:
        path = get_config_path(spec)
    except FileNotFoundError as e:
        raise ValueError(
            f"mini-swe-agent config {spec!r} not found: name one of the package's (e.g. {DEFAULT_CONFIG}, swebench) "
            "or give a YAML path"
        ) from e
    cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(cfg.get("agent"), dict) or "system_template" not in cfg["agent"]:
        raise ValueError(f"mini-swe-agent config {path}: no agent.system_template; is it an agent config?")
    declared = str((cfg.get("model") or {}).get("model_class") or "litellm")
    model_class = MODEL_CLASSES.get(Path(spec).stem, declared) if path.parent.name == "benchmarks" else declared
    if model_class not in ROUTABLE:
        raise ValueError(
            f"mini-swe-agent config {path}: model_class {model_class!r} calls its own fixed URL; SAO sends the "
            f"model calls to its gateway through litellm: set model.model_class to one of {list(ROUTABLE)}"
        )
    return cfg, model_class, str(path)


class SandboxEnvironment:
    """mini-swe-agent's ``Environment`` over a SAO ``Workspace`` (see the module doc). ``ended_by``: the
    ``EpisodeEnded`` reason that stopped the agent, if one did."""

    def __init__(self, workspace: Workspace, env_vars: dict[str, str] | None = None) -> None:
        self.workspace = workspace
        self.env_vars = {str(k): str(v) for k, v in (env_vars or {}).items()}
        self.config = {"cwd": REPO_DIR, "env": self.env_vars, "environment_class": f"{__name__}.{type(self).__name__}"}
        self.ended_by = ""

    def execute(self, action: dict[str, Any], cwd: str = "") -> dict[str, Any]:
        """Run ``action["command"]`` in the sandbox (``cwd``: always the task's repository, as in the SWE env)."""
        from minisweagent.exceptions import LimitsExceeded

        command = str(action.get("command", ""))
        try:
            res = self.workspace.run_sync(self._exported(command))
        except EpisodeEnded as e:
            self.ended_by = e.reason
            exit_message = {"role": "exit", "content": str(e), "extra": {"exit_status": "LimitsExceeded",
                                                                          "submission": ""}}  # fmt: skip
            raise LimitsExceeded(exit_message) from e
        output = result_dict(res)
        check_submitted(output)
        return output

    def _exported(self, command: str) -> str:
        if not self.env_vars:
            return command
        import shlex

        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env_vars.items())
        return f"export {exports}\n{command}"

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        # What mini-swe-agent's own environments offer; the container shares this machine's kernel.
        return {**self.config, **platform.uname()._asdict(), **kwargs}

    def serialize(self) -> dict[str, Any]:
        return {"info": {"config": {"environment": self.config, "environment_type": self.config["environment_class"]}}}


def result_dict(res: CommandResult) -> dict[str, Any]:
    """The dict mini-swe-agent's environments return for one command."""
    return {"output": res.output, "returncode": res.exit_code, "exception_info": ""}


def check_submitted(output: dict[str, Any]) -> None:
    """Raise mini-swe-agent's ``Submitted`` when the command's first output line is the submit sentinel and it
    exited 0 (its own environments' rule); the submission is the rest of the output."""
    from minisweagent.exceptions import Submitted

    lines = output.get("output", "").lstrip().splitlines(keepends=True)
    if lines and lines[0].strip() == SUBMIT_SENTINEL and output.get("returncode") == 0:
        submission = "".join(lines[1:])
        raise Submitted(
            {"role": "exit", "content": submission, "extra": {"exit_status": "Submitted", "submission": submission}}
        )


class MiniSweAgentHarness:
    """The harness (see the module doc); ``config``: a config name of mini-swe-agent or a YAML path."""

    name = "mini_swe_agent"

    def __init__(self, config: str = DEFAULT_CONFIG) -> None:
        self.config_name = config or DEFAULT_CONFIG
        self.cfg, self.model_class, self.config_path = load_config(self.config_name)
        import minisweagent

        self._description = {
            "harness": self.name,
            "package": "mini-swe-agent",
            "version": minisweagent.__version__,
            "config": self.config_name,
            "config_path": self.config_path,
            "agent_class": "minisweagent.agents.default.DefaultAgent",
            "model_class": self.model_class,
        }

    def describe(self) -> dict[str, Any]:
        return dict(self._description)

    def make_agent(self, workspace: Workspace, endpoint: Endpoint, limits: HarnessLimits) -> tuple[Any, Any]:
        """(mini-swe-agent's ``DefaultAgent``, our environment) for one episode."""
        import litellm
        from minisweagent.agents.default import DefaultAgent
        from minisweagent.models import get_model

        litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banner per failed call
        model_cfg = {k: v for k, v in (self.cfg.get("model") or {}).items() if k not in ("model_class", "model_name")}
        kwargs = {**(model_cfg.pop("model_kwargs", None) or {}), "api_base": endpoint.base_url,
                  "api_key": endpoint.api_key, **endpoint.params}  # fmt: skip
        config = {**model_cfg, "model_name": f"openai/{endpoint.model}", "model_class": self.model_class,
                  "model_kwargs": kwargs, "cost_tracking": "ignore_errors"}  # fmt: skip
        model = get_model(config=config)
        env = SandboxEnvironment(workspace, (self.cfg.get("environment") or {}).get("env"))
        agent_cfg = {**self.cfg["agent"], "step_limit": limits.step_limit, "output_path": None}
        if limits.wall_s:
            agent_cfg["wall_time_limit_seconds"] = int(limits.wall_s)
        return DefaultAgent(model, env, **agent_cfg), env

    async def play(self, workspace: Workspace, endpoint: Endpoint, limits: HarnessLimits) -> HarnessEnd:
        agent, env = await in_thread(lambda: self.make_agent(workspace, endpoint, limits))
        try:
            result = await in_thread(lambda: agent.run(workspace.task_text), name="mini-swe-agent")
        except Exception as e:  # DefaultAgent re-raises what it did not expect, after its exit message
            context = "ContextWindowExceeded" in type(e).__name__
            error = f"{type(e).__name__}: {e}"
            return HarnessEnd(stop_reason("context_length" if context else "error"), type(e).__name__,
                              _messages(agent), error=error)  # fmt: skip
        status = str(result.get("exit_status", ""))
        reason = stop_reason(env.ended_by or EXIT_REASONS.get(status, "error"))
        info = {"submission": str(result.get("submission") or ""), "model_calls": agent.n_calls}
        return HarnessEnd(reason, status, _messages(agent), info, error="" if reason != "error" else status)


def _messages(agent: Any) -> list[dict[str, Any]]:
    """The agent's conversation without mini-swe-agent's bookkeeping (``extra``: raw responses, costs)."""
    keep = ("role", "content", "tool_calls", "tool_call_id")
    return [{k: m[k] for k in keep if m.get(k) is not None} for m in agent.messages]
