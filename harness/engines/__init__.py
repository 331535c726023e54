"""The only code that runs vLLM: the subject process, its worker extension and plugin, and what differs between vLLM lines (vllm_compat)."""
