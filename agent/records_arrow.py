"""Arrow / parquet round-trip of trajectories through Hugging Face ``datasets``, with a fixed schema.

Segments become a list of structs (nullable ``logprobs``/``policy_version``/``reward``); ``info`` and
``timings``, free-form dicts, are stored as JSON strings so every row shares one schema whatever they hold.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import datasets

from sao.agent.records import Segment, Trajectory
from sao.core.jsonl import atomic_path

FEATURES = datasets.Features(
    {
        "task_id": datasets.Value("string"),
        "env_id": datasets.Value("string"),
        "segments": datasets.List(
            {
                "kind": datasets.Value("string"),
                "token_ids": datasets.List(datasets.Value("int64")),
                "logprobs": datasets.List(datasets.Value("float64")),
                "policy_version": datasets.Value("int64"),
                "reward": datasets.Value("float64"),
            }
        ),
        "reward": datasets.Value("float64"),
        "status": datasets.Value("string"),
        "info_json": datasets.Value("string"),
        "timings_json": datasets.Value("string"),
        "group_id": datasets.Value("int64"),
    }
)
# Columns added after the first files were written: a dataset without them still reads (as None).
_OPTIONAL = {"group_id"}


def _row(t: Trajectory) -> dict[str, Any]:
    return {
        "task_id": t.task_id,
        "env_id": t.env_id,
        "segments": [s.to_dict() for s in t.segments],
        "reward": float(t.reward),
        "status": t.status,
        "info_json": json.dumps(t.info, default=str),
        "timings_json": json.dumps(t.timings),
        "group_id": t.group_id,
    }


def to_dataset(trajectories: Iterable[Trajectory]) -> datasets.Dataset:
    """Trajectories -> an in-memory Arrow-backed ``datasets.Dataset`` (one row per trajectory)."""
    return datasets.Dataset.from_list([_row(t) for t in trajectories], features=FEATURES)


def from_dataset(ds: datasets.Dataset) -> list[Trajectory]:
    """Inverse of ``to_dataset``; a row that is not a trajectory raises ValueError naming its index."""
    missing = set(FEATURES) - set(ds.column_names) - _OPTIONAL
    if missing:
        raise ValueError(f"dataset lacks trajectory columns {sorted(missing)}; was it written by to_dataset?")
    out = []
    for i, row in enumerate(ds):
        try:
            out.append(
                Trajectory(
                    task_id=row["task_id"],
                    env_id=row["env_id"],
                    segments=tuple(Segment.from_dict(s) for s in row["segments"]),
                    reward=float(row["reward"]),
                    status=row["status"],
                    info=json.loads(row["info_json"] or "{}"),
                    timings=json.loads(row["timings_json"] or "{}"),
                    group_id=row.get("group_id"),
                )
            )
        except (KeyError, ValueError, TypeError) as e:
            raise ValueError(f"row {i} is not a Trajectory record ({e})") from e
    return out


def write_parquet(path: str | Path, trajectories: Iterable[Trajectory]) -> None:
    """Write trajectories to one parquet file, atomically: a crash leaves the old file or the new one."""
    import pyarrow.parquet as pq

    with atomic_path(path) as tmp:
        pq.write_table(to_dataset(trajectories).data.table, str(tmp))


def read_parquet(path: str | Path) -> list[Trajectory]:
    """Read a parquet file written by ``write_parquet`` (no datasets cache is written)."""
    import pyarrow.parquet as pq

    if not Path(path).is_file():
        raise ValueError(f"no trajectory parquet file at {path}")
    return from_dataset(datasets.Dataset(pq.read_table(str(path))))
