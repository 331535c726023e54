"""Benchmarks (plain scripts, not tests): run each with ``python -m benchmarks.<name>``."""
