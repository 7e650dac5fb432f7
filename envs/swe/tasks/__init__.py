"""Offline SWE-bench-format tasks synthesised from PyPI sdists (see ``builder`` for the design)."""

from sao.envs.swe.tasks.builder import BuildConfig, build_tasks
from sao.envs.swe.tasks.instance import load_instances, validate_instance
from sao.envs.swe.tasks.offline import ensure_offline_tasks, ensure_task_images

__all__ = [
    "BuildConfig",
    "build_tasks",
    "ensure_offline_tasks",
    "ensure_task_images",
    "load_instances",
    "validate_instance",
]
