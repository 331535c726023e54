"""ggml's Q8_1 activation quantization and the GGUF matmul kernels' arithmetic (pure torch).

Contract: :func:`quantize_q8_1(x)` is what vLLM's CUDA ``quantize_q8_1`` kernel
(``csrc/quantization/gguf/gguf_kernel.cu``) does to a linear layer's input before
``ggml_mul_mat_a8`` / ``ggml_mul_mat_vec_a8``: along the last dim, in blocks of 32 (zero
padded), ``d = amax / 127`` and ``q = round(x / d)`` (int8) in float32, the block's
*unquantized* sum ``s = sum(x)``; ``d`` and ``s`` are stored as fp16 (``half2 ds``).
:func:`ggml_linear(x, w)` is the kernels' dot product for a weight's GGML type
(:data:`KERNELS`, data): per block an exact integer sum ``sumi = q_w . q_x``, then

* Q4_1 (``vec_dot_q4_1_q8_1_impl``): ``sumi * f16(d_w * d_x) + f16(m_w * s_x)`` -- both
  products by ``__hmul2``, i.e. rounded to fp16; the weight's minimum multiplies the
  *unquantized* block sum, not the quantized one;
* Q8_0 (``vec_dot_q8_0_q8_1_impl``): ``(d_w * d_x) * sumi`` in float32;

summed over blocks in float32 (float64 for a truth run) and written in the run dtype.
:func:`dequantize_q8_1` gives ``f16(d) * q``, the input a dense matmul would need to see the
quantized activations (exact for Q8_0 weights; for Q4_1 the minimum term differs, which is
why :func:`ggml_linear` exists).

Traps:

* ``roundf`` rounds halves away from zero; ``torch.round`` rounds them to even.
  :func:`round_half_away` does the former without the ``floor(|v| + 0.5)`` bug at
  0.49999997.
* A block whose ``amax`` is 0 has ``q = 0`` (not NaN), ``d = 0``, ``s = 0``.
* The products ``d_w * d_x`` of two fp16 values are exact in float32 (22 bits), so casting
  that float32 product to fp16 is ``__hmul``'s correctly rounded result, subnormals included.
* What is *not* reproduced: the kernel's float summation order (warp butterflies for ``s``,
  its tiling for the block sum), ~1e-7 relative; and a build with fast-math division, which
  would move ties of ``x / d`` (read: vLLM builds without ``--use_fast_math`` for these
  kernels was not verified).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

QK = 32  # ggml's block length (QK8_1, QK4_1, QK8_0)

# GGML type -> how vLLM 0.20's _fused_mul_mat_gguf runs a linear layer of that weight type
# (vllm/model_executor/layers/quantization/gguf.py): "q8_1" = activations quantized to Q8_1
# (MMVQ / MMQ kernels), "dense" = plain matmul in the run dtype.
KERNELS: dict[str, str] = {
    "F32": "dense", "F16": "dense", "BF16": "dense",
    "Q4_0": "q8_1", "Q4_1": "q8_1", "Q5_0": "q8_1", "Q5_1": "q8_1", "Q8_0": "q8_1",
    "Q2_K": "q8_1", "Q3_K": "q8_1", "Q4_K": "q8_1", "Q5_K": "q8_1", "Q6_K": "q8_1",
}
# the types whose dot product ggml_linear reproduces (the SmolLM2 file's: Q4_1 layers, Q8_0 embedding/lm_head)
SIMULATED_TYPES: tuple[str, ...] = ("Q4_1", "Q8_0")


@dataclass(frozen=True)
class Q8_1:
    """One tensor quantized to Q8_1: ``q`` [..., nb, 32] (float32 holding int8 values), ``d``
    and ``s`` [..., nb] as the kernel stores them (fp16 values, held in float32)."""

    q: torch.Tensor
    d: torch.Tensor
    s: torch.Tensor


@dataclass(frozen=True)
class BlockWeight:
    """A GGUF weight as its blocks: ``q`` [out, nb, 32] integer values (Q4_1: 0..15, Q8_0:
    -128..127) as float32, ``d`` (and Q4_1's ``m``) [out, nb] fp16 values as float32."""

    ggml_type: str
    q: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor | None = None

    def dequantize(self) -> torch.Tensor:
        """[out, in] float32, as the ``gguf`` package (and so transformers) dequantizes it."""
        w = self.d.unsqueeze(-1) * self.q
        if self.m is not None:
            w = w + self.m.unsqueeze(-1)
        return w.reshape(w.shape[0], -1)


def round_half_away(v: torch.Tensor) -> torch.Tensor:
    """C's ``roundf``: halves away from zero."""
    t = torch.trunc(v)
    return torch.where((v - t).abs() >= 0.5, t + torch.sign(v), t)


def _blocks(x: torch.Tensor) -> torch.Tensor:
    x = x.to(torch.float32)
    pad = (-x.shape[-1]) % QK
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(*x.shape[:-1], x.shape[-1] // QK, QK)


def quantize_q8_1(x: torch.Tensor) -> Q8_1:
    """Quantize ``x`` along its last dim as the CUDA kernel does (see the module doc)."""
    b = _blocks(x)
    amax = b.abs().amax(-1)
    d = amax / 127
    safe = torch.where(amax == 0, torch.ones_like(d), d).unsqueeze(-1)
    q = torch.where((amax == 0).unsqueeze(-1), torch.zeros_like(b), round_half_away(b / safe))
    s = b.sum(-1)
    f16 = lambda t: t.to(torch.float16).to(torch.float32)
    return Q8_1(q=q, d=f16(d), s=f16(s))


def dequantize_q8_1(x: torch.Tensor) -> torch.Tensor:
    """``f16(d) * q`` in ``x``'s shape and dtype: the activations the integer kernel multiplies."""
    qx = quantize_q8_1(x)
    out = (qx.d.unsqueeze(-1) * qx.q).reshape(*x.shape[:-1], -1)[..., : x.shape[-1]]
    return out.to(x.dtype)


def ggml_linear(x: torch.Tensor, w: BlockWeight, accumulate: torch.dtype = torch.float32,
                chunk: int = 4096) -> torch.Tensor:
    """``x @ W.T`` as vLLM's GGUF kernel computes it for ``w.ggml_type`` (module doc); ``x``
    [..., in] in the run dtype, result in ``x``'s dtype.  ``accumulate``: the block sum's dtype
    (float32 = the kernel; float64 for a truth run).  ``chunk``: output rows per step (memory)."""
    if w.ggml_type not in SIMULATED_TYPES:
        raise NotImplementedError(f"ggml_linear reproduces {', '.join(SIMULATED_TYPES)}, not {w.ggml_type}")
    lead = x.shape[:-1]
    qx = quantize_q8_1(x.reshape(-1, x.shape[-1]))
    nb = w.q.shape[1]
    if qx.q.shape[1] != nb:
        raise ValueError(f"input has {qx.q.shape[1]} blocks of {QK}, weight {nb}")
    xq = qx.q.transpose(0, 1)  # [nb, T, 32]
    outs = []
    for lo in range(0, w.q.shape[0], chunk):
        wq = w.q[lo:lo + chunk].transpose(0, 1).transpose(1, 2)  # [nb, 32, O]
        sumi = torch.bmm(xq, wq).permute(1, 2, 0)  # [T, O, nb]: integers, exact in float32
        dw = w.d[lo:lo + chunk].unsqueeze(0)  # [1, O, nb]
        dx = qx.d.unsqueeze(1)  # [T, 1, nb]
        if w.ggml_type == "Q4_1":
            dd = (dw * dx).to(torch.float16).to(accumulate)
            ms = (w.m[lo:lo + chunk].unsqueeze(0) * qx.s.unsqueeze(1)).to(torch.float16).to(accumulate)
            part = sumi.to(accumulate) * dd + ms
        else:  # Q8_0
            part = (dw * dx).to(accumulate) * sumi.to(accumulate)
        outs.append(part.sum(-1))
    return torch.cat(outs, dim=1).reshape(*lead, -1).to(x.dtype)
