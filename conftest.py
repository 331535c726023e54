"""Registers the vllm-parity pytest plugin for in-repo runs when the package's
``pytest11`` entry point is not installed (an installed package loads it itself)."""
from importlib.metadata import entry_points

if not any(ep.name == "vllm_parity" for ep in entry_points(group="pytest11")):
    pytest_plugins = ["harness.frontends.pytest_plugin"]
