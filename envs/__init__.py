"""Gymnasium-style multi-turn text environments (SWE, Python-tool math, online writing, toy), ids under ``sao/``."""
