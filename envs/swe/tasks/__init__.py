"""Offline SWE-bench-format tasks synthesised from PyPI sdists (see ``builder`` for the design)."""

from envs.swe.tasks.builder import BuildConfig, build_tasks
from envs.swe.tasks.instance import load_instances, validate_instance

__all__ = ["BuildConfig", "build_tasks", "load_instances", "validate_instance"]
