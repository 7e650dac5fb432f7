"""Inference engines: vLLM servers (token-in/token-out), in-process HF transformers, OpenAI-compatible chat.

Importing the package registers the shipped engines (``sao.agent.engines.builtin``) in ``sao.agent.engines.registry``,
so any lookup sees them.
"""

from sao.agent.engines import builtin as builtin
