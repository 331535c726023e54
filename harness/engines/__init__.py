"""The only code that runs vLLM: the subject process and the request it reads (engine_request), its worker extension and plugin, and what differs between vLLM lines (vllm_compat)."""
