"""Evaluation CLIs (SWE-bench Verified, math) and performance / learning benchmarks."""
