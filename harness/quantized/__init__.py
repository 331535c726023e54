"""Quantized checkpoints: vLLM running a quantized file with its own kernels, against the
reference on the dequantized weights, gated by a floor calibrated from the quantization itself.

Modules, one job each: :mod:`~harness.quantized.q8_1` (ggml's activation quantization and the
kernels' dot-product arithmetic, pure), :mod:`~harness.quantized.gguf_weights` (the GGUF file's
quantized blocks, per HF module), :mod:`~harness.quantized.simulated` (the reference forwards and
the floors), :mod:`~harness.quantized.gguf_parity` (the entry point: refusal, vLLM, verdict, report).
"""
