"""The one owner of a run folder: refuse to overwrite a run, write a checkpoint the power-cut-safe way (a hidden
partial folder, fsynced, renamed, then ``latest``), and find the latest one.

Used by ``sao train`` (``sao.trainer.runs.run``), ``sao sft`` (``sao.trainer.sft.run``) and staged runs
(``sao.trainer.runs.stages``); atomic text and JSON writes live in ``sao.core.jsonl``, the one durable writer.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from sao.core.jsonl import fsync_tree, write_json_atomic, write_text_durably
from sao.trainer.config import ConfigError

STATE_FILE = "trainer_state.json"
"""Written last into a checkpoint folder: its presence marks the checkpoint complete."""


def refuse_existing_run(run_dir: Path, command: str, *markers: str) -> None:
    """A new run needs a folder that holds no run (``config.yaml`` or one of ``markers``); the error says how to
    continue the old one (``sao <command> --resume``) or where to go instead."""
    for name in ("config.yaml", *markers):
        if (run_dir / name).exists():
            raise ConfigError(
                f"run.dir {str(run_dir)!r} already holds a run; continue it with `sao {command} --resume {run_dir}` "
                "or set run.dir to a new directory"
            )


def require_run(resume: str | Path, command: str = "train") -> Path:
    """The folder ``sao <command> --resume`` names, refused (before anything is written there) unless a run wrote
    it: a resume needs the run's saved ``config.yaml``."""
    run_dir = Path(resume)
    if not run_dir.is_dir():
        raise ConfigError(f"--resume {str(run_dir)!r}: no such folder; pass the run.dir of an earlier `sao {command}`")
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(
            f"--resume {str(run_dir)!r}: this folder holds no run (no config.yaml, which every run writes first); "
            f"pass the run.dir of an earlier `sao {command}`, or start a new run with `sao {command} CONFIG`"
        )
    return run_dir


def checkpoint_paths(run_dir: Path, step: int) -> tuple[Path, Path]:
    """``(checkpoints/step_N, checkpoints/.step_N.partial)``; the partial folder is emptied for the writers."""
    ckpts = run_dir / "checkpoints"
    name = f"step_{step:06d}"
    partial = ckpts / f".{name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    return ckpts / name, partial


def commit_checkpoint(partial: Path, ckpt: Path, state: dict[str, Any], keep: int) -> None:
    """Finish a checkpoint whose files are in ``partial``: the state file, every file fsynced, the folder renamed to
    ``ckpt``, the ``latest`` marker moved to it, and all but the newest ``keep`` complete checkpoints removed. An
    ``OSError`` (disk full, ...) leaves the previous checkpoint the latest; the caller drops ``partial``."""
    ckpts = ckpt.parent
    marker = ckpts / "latest"
    write_json_atomic(partial / STATE_FILE, state, indent=None, default=_json_default)
    fsync_tree(partial)
    shutil.rmtree(ckpt, ignore_errors=True)
    os.replace(partial, ckpt)
    write_text_durably(marker, ckpt.name)
    done = sorted(p for p in ckpts.glob("step_*") if (p / STATE_FILE).exists())
    for old in done[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``checkpoints/latest`` names, or (when that one is incomplete) the newest complete one."""
    ckpts = run_dir / "checkpoints"
    marker = ckpts / "latest"
    if marker.exists():
        p = ckpts / marker.read_text().strip()
        if (p / STATE_FILE).exists():
            return p
    done = sorted(p for p in ckpts.glob("step_*") if (p / STATE_FILE).exists())
    return done[-1] if done else None


def latest_state(run_dir: Path) -> dict[str, Any] | None:
    """The latest complete checkpoint's state (with ``_dir``, its folder), or None when there is none."""
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        return None
    state: dict[str, Any] = json.loads((ckpt / STATE_FILE).read_text())
    state["_dir"] = str(ckpt)
    return state


def _json_default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, tuple):
        return list(o)
    return str(o)
