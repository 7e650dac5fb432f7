"""Inference engines: vLLM servers (token-in/token-out), in-process HF transformers, OpenAI-compatible chat."""
