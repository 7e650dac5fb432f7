"""Inference engines: vLLM servers (token-in/token-out), in-process HF transformers, OpenAI-compatible chat.

Importing the package registers the shipped engines (``agent.engines.builtin``) in ``agent.engines.registry``,
so any lookup sees them.
"""

from agent.engines import builtin as builtin
