"""Gymnasium-style multi-turn text environments (SWE, Python-tool math, online writing, toy), ids under ``sao/``.

Importing this package registers the ids (lazily: no env module is imported until ``gymnasium.make``).
"""

from envs.registration import list_envs, register_env

__all__ = ["list_envs", "register_env"]
