"""SAO trajectories as ATIF (Agent Trajectory Interchange Format, the ``atif`` package's pydantic models).

One ATIF ``Trajectory`` per SAO trajectory (a row of an outside agent's episode included), token-exact:

* step 1 (``source="user"``): the prompt segment, decoded as the model saw it (chat template markers included),
  its ids in ``extra["token_ids"]``;
* one ``source="agent"`` step per action segment: ``message`` is the action's text, ``metrics`` holds the ids the
  model was given (``prompt_token_ids``: every id before the action), the ids it sampled (``completion_token_ids``)
  and their sampling logprobs (``logprobs``), ``extra`` the policy version and the turn's reward; ``tool_calls``
  the call the action makes when it parses as one (SAO's ``<tool_call>`` form, or a ```` ```mswea_bash_command ````
  block: mini-swe-agent's), its id ``call_<step>``;
* the observation segment after an action becomes that step's ``observation`` (decoded, ids in ``extra``).

The document's ``extra`` keeps the outcome (reward, status, solved, truncation, prefix breaks, the harness), its
``agent`` is the harness that played (``sao`` for SAO's own loop) and ``continued_trajectory_ref`` links a row to
the next row of the same episode (a prefix break of its gateway session). ``final_metrics`` sums the tokens.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from sao.agent.records import Segment, Trajectory
from sao.core.jsonl import iter_jsonl
from sao.envs.protocols import FormatError
from sao.envs.tools.parsing import parse_action

SCHEMA_VERSION = "ATIF-v1.8"
# mini-swe-agent's default action_regex (models/litellm_textbased_model.py): one block, the command without its newline
_MINI_ACTION = re.compile(r"```mswea_bash_command\s*\n(.*?)\n```", re.DOTALL)
_OUTCOME = ("task_id", "env_id", "reward", "status", "group_id")
_INFO = ("episode", "seed", "solved", "truncation_reason", "graded", "turns", "row", "rows", "prefix_breaks",
         "exit_status", "infra_error", "render_drift")  # fmt: skip


def read_trajectories(path: str | Path) -> Iterator[tuple[int, Trajectory]]:
    """(line number, trajectory) of a JSONL of Trajectory records or a run's ledger (``{"type": "trajectory",
    "trajectory": {...}}`` lines; its events and resume lines skipped)."""
    for n, rec in iter_jsonl(path, torn_tail_ok=True, fix="was it written by SAO?"):
        if not isinstance(rec, dict) or rec.get("type") in ("event", "resume"):
            continue
        body = rec.get("trajectory", rec)
        try:
            yield n, Trajectory.from_dict(body)
        except (KeyError, ValueError, TypeError) as e:
            raise ValueError(f"{path}:{n}: not a trajectory record ({e}); was it written by SAO?") from e


def episode_key(traj: Trajectory, line: int) -> str:
    """The id of the episode a trajectory belongs to: its gateway session, else its task and episode index."""
    session = traj.info.get("session_id")
    if session:
        return str(session)
    episode = traj.info.get("episode")
    return f"{traj.task_id}.ep{episode}" if episode is not None else f"{traj.task_id}.line{line}"


def trajectory_id(traj: Trajectory, line: int) -> str:
    return f"{episode_key(traj, line)}.row{int(traj.info.get('row', 0))}"


def _tool_call(text: str, step_id: int) -> list[Any] | None:
    """The call an action makes: SAO's ``<tool_call>`` form, else exactly one mini-swe-agent command block."""
    from atif import ToolCall

    try:
        call = parse_action(text)
        name, arguments = call.name, dict(call.arguments)
    except FormatError:
        blocks = _MINI_ACTION.findall(text)
        if len(blocks) != 1:
            return None
        name, arguments = "bash", {"command": blocks[0]}
    return [ToolCall(tool_call_id=f"call_{step_id}", function_name=name, arguments=arguments)]


def _agent_step(
    step_id: int, seg: Segment, before: list[int], obs: Segment | None, tokenizer: Any, model_name: str | None
) -> Any:
    """The agent step of action ``seg`` (``before``: the ids before it; ``obs``: the observation after it)."""
    from atif import Metrics, Observation, ObservationResult, Step

    text = str(tokenizer.decode(list(seg.token_ids), skip_special_tokens=True))
    metrics = Metrics(
        prompt_tokens=len(before),
        completion_tokens=len(seg.token_ids),
        prompt_token_ids=list(before),
        completion_token_ids=list(seg.token_ids),
        logprobs=list(seg.logprobs or ()),
        extra={"policy_version": seg.policy_version},
    )
    calls = _tool_call(text, step_id)
    observation = None
    if obs is not None:
        result = ObservationResult(
            source_call_id=calls[0].tool_call_id if calls else None,
            content=str(tokenizer.decode(list(obs.token_ids), skip_special_tokens=False)),
            extra={"token_ids": list(obs.token_ids)},
        )
        observation = Observation(results=[result])
    return Step(
        step_id=step_id, source="agent", message=text, model_name=model_name, tool_calls=calls, metrics=metrics,
        observation=observation, llm_call_count=1, extra={"reward": seg.reward},
    )  # fmt: skip


def to_atif(
    traj: Trajectory, tokenizer: Any, *, line: int = 0, model_name: str | None = None, next_row: str | None = None
) -> Any:
    """The ATIF ``Trajectory`` of ``traj`` (see the module doc); ``next_row``: the id of its episode's next row."""
    from atif import Agent, FinalMetrics, Step
    from atif import Trajectory as AtifTrajectory

    steps: list[Any] = []
    seen: list[int] = []
    segs = traj.segments
    for i, seg in enumerate(segs):
        if seg.kind == "prompt":
            text = str(tokenizer.decode(list(seg.token_ids), skip_special_tokens=False))
            steps.append(Step(step_id=len(steps) + 1, source="user", message=text,
                              extra={"token_ids": list(seg.token_ids)}))  # fmt: skip
        elif seg.kind == "action":
            after = segs[i + 1] if i + 1 < len(segs) and segs[i + 1].kind == "observation" else None
            steps.append(_agent_step(len(steps) + 1, seg, seen, after, tokenizer, model_name))
        seen += seg.token_ids
    actions = traj.action_segments
    completion = sum(len(s.token_ids) for s in actions)
    given = traj.info.get("harness")
    harness: dict[str, Any] = given if isinstance(given, dict) else {"harness": "sao"}
    extra = {k: getattr(traj, k) for k in _OUTCOME} | {k: traj.info[k] for k in _INFO if k in traj.info}
    return AtifTrajectory(
        schema_version=SCHEMA_VERSION,
        session_id=episode_key(traj, line),
        trajectory_id=trajectory_id(traj, line),
        agent=Agent(
            name=str(harness.get("harness", "sao")),
            version=str(harness.get("version") or _sao_version()),
            model_name=model_name,
            extra={"harness": harness},
        ),
        steps=steps,
        final_metrics=FinalMetrics(
            total_prompt_tokens=traj.num_tokens - completion,
            total_completion_tokens=completion,
            total_steps=len(steps),
            extra={"reward": traj.reward},
        ),
        continued_trajectory_ref=next_row,
        extra=extra,
    )


def _sao_version() -> str:
    try:
        return metadata.version("sao")
    except metadata.PackageNotFoundError:
        return "0"


def export_file(src: Path, dest: Path, tokenizer: Any, *, model_name: str | None = None) -> dict[str, int]:
    """Write ``src``'s trajectories to ``dest`` as ATIF JSON lines (infra errors, which hold no tokens, skipped);
    returns the counts (``written``, ``skipped``, ``rows_continued``)."""
    from sao.core.jsonl import write_text_durably

    trajs = [(n, t) for n, t in read_trajectories(src)]
    next_of: dict[str, str] = {}
    by_row = {(episode_key(t, n), int(t.info.get("row", 0))): trajectory_id(t, n) for n, t in trajs}
    for (episode, row), tid in by_row.items():
        nxt = by_row.get((episode, row + 1))
        if nxt is not None:
            next_of[tid] = nxt
    lines, skipped = [], 0
    for n, t in trajs:
        if t.status == "infra_error" or not t.segments:
            skipped += 1
            continue
        doc = to_atif(t, tokenizer, line=n, model_name=model_name, next_row=next_of.get(trajectory_id(t, n)))
        lines.append(doc.model_dump_json(exclude_none=True))
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_text_durably(dest, "".join(line + "\n" for line in lines))
    return {"written": len(lines), "skipped": skipped, "rows_continued": len(next_of)}
