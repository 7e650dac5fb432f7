"""SAO: Single-rollout Asynchronous Optimization for multi-turn LLM coding agents.

Everything installs under this one namespace: ``sao.core`` (paths, setup, console, durable files),
``sao.sandboxes``, ``sao.envs``, ``sao.agent``, ``sao.trainer``, ``sao.benchmarks`` and ``sao.cli``. In the
repository the five design folders stay at the top level (``envs/``, ``agent/``, ...); ``sao/`` links to them.
"""
