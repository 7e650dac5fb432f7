"""Gymnasium-style multi-turn text environments (SWE, Python-tool math, online writing, toy), ids under ``sao/``.

Importing this package registers the ids (lazily: no env module is imported until ``gymnasium.make``); envs of
installed packages come in through the ``sao.envs`` entry-point group (``load_plugin_envs``).
"""

from sao.envs.registration import EnvSetupError, list_envs, load_plugin_envs, preflight, register_env

__all__ = ["EnvSetupError", "list_envs", "load_plugin_envs", "preflight", "register_env"]
