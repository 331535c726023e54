"""The graph path's copy kernel: one read of one hook call, its terms summed, copied to the address a
device table holds for it, and the hook's call counted, in one Triton kernel launch.

Contract: :func:`kernel_terms` says whether the kernel can copy a read (pure, no Triton): one or two
terms of one shape and dtype, each *row-strided* (its first dimension strided anyhow, the others
contiguous: a module's output, a column slice of one), a dtype the kernel stores as such, two terms
only in a float dtype; it returns ``(tensors, rows, cols, row strides)`` or None.  :func:`launcher`
returns :func:`launch` where a CUDA device and Triton are there (and ``VLLM_PARITY_TAP_KERNEL`` is
not ``0``), else None (the caller keeps its torch copy).  ``launch(dests, entry, counts, slot, tensors, rows, cols, strides)`` enqueues one kernel that
writes the read's ``rows x cols`` elements, row-major, to the address ``dests[entry]`` holds *when the
kernel runs* (an int64 device table: a CUDA-graph replay takes the address of that replay, so the
harness points a replay straight at its records), and, for ``slot >= 0``, adds 1 to ``counts[slot]``.

Traps:

- Bits: a copy is a copy; two terms are summed in fp32 and rounded once to the dtype (round to nearest
  even), the bits of ``torch.add`` on CUDA for float16 / bfloat16 (opmath fp32) and float32.  More
  terms, broadcasting or type promotion, float64 sums: None (the torch copy keeps torch's rules).
- Addresses: the kernel trusts ``dests[entry]``; the caller must hold there an address with room
  for the read, aligned to :data:`ALIGN` bytes (the stores are vectorized on that promise;
  harness.engines.graph_capture sets and checks both) -- a wrong one writes anywhere.
- Under stream capture the launch is recorded like any kernel; the first launch of each
  specialization compiles, so the graph path's warm-up forwards (before vLLM captures) compile it.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Optional

import torch

COPY_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64,
                         torch.int32, torch.int64})  # stored as loaded
SUM_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})  # summed in fp32, rounded once
BLOCK = 2048
ALIGN = 16  # bytes: every destination address the kernel is given is a multiple of it
MAX_NUMEL = 2**31 - BLOCK  # the kernel's offsets are int32
ENV = "VLLM_PARITY_TAP_KERNEL"  # "0": no kernel, torch copies every read (the benchmark's comparison)


def row_stride(t: torch.Tensor) -> Optional[int]:  # noqa: UP045
    """The stride of ``t``'s first dimension when every other dimension is contiguous (row-major
    within a row), else None; a 0-d tensor is one row of one element (stride 0)."""
    if t.dim() == 0:
        return 0
    expected = 1
    for size, stride in zip(reversed(t.shape[1:]), reversed(t.stride()[1:])):
        if size != 1 and stride != expected:
            return None
        expected *= size
    return t.stride(0)


def kernel_terms(values: list) -> Optional[tuple]:  # noqa: UP045
    """``(tensors, rows, cols, strides)`` when the kernel can copy the read whose terms are ``values``
    (None terms count as zero and are dropped), else None."""
    tensors = [v for v in values if v is not None]
    if not tensors or len(tensors) > 2:
        return None
    first = tensors[0]
    if first.dtype not in COPY_DTYPES or first.numel() == 0 or first.numel() > MAX_NUMEL:
        return None
    if len(tensors) == 2:
        other = tensors[1]
        if first.dtype not in SUM_DTYPES or other.shape != first.shape or other.dtype != first.dtype \
                or other.device != first.device:
            return None
    strides = [row_stride(t) for t in tensors]
    if any(s is None for s in strides):
        return None
    rows = first.shape[0] if first.dim() else 1
    return tensors, rows, first.numel() // rows, strides


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=["entry", "slot"])
    def tap_copy(dests_ptr, entry, counts_ptr, slot, src0_ptr, stride0, src1_ptr, stride1, cols, n,
                 HAS1: tl.constexpr, COUNT: tl.constexpr, CONTIG: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        if COUNT:
            if pid == 0:
                tl.store(counts_ptr + slot, tl.load(counts_ptr + slot) + 1)
        dtype = src0_ptr.dtype.element_ty
        # every destination is ALIGN (16) bytes aligned, the caller's contract: stores can be vectorized
        dst_ptr = tl.multiple_of(tl.load(dests_ptr + entry), 16).to(tl.pointer_type(dtype))
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        if CONTIG:
            src0 = src0_ptr + offs
            src1 = src1_ptr + offs
        else:
            row = offs // cols
            col = offs - row * cols
            src0 = src0_ptr + row.to(tl.int64) * stride0 + col
            src1 = src1_ptr + row.to(tl.int64) * stride1 + col
        v = tl.load(src0, mask=mask)
        if HAS1:
            w = tl.load(src1, mask=mask)
            v = (v.to(tl.float32) + w.to(tl.float32)).to(dtype)
        tl.store(dst_ptr + offs, v, mask=mask)

    return tap_copy


_KERNEL: list = []


def launch(dests: torch.Tensor, entry: int, counts: torch.Tensor, slot: int, tensors: list,
           rows: int, cols: int, strides: list) -> None:
    """Enqueue the copy of one read (module doc); ``slot < 0``: count nothing."""
    if not _KERNEL:
        _KERNEL.append(_kernel())
    n = rows * cols
    src0 = tensors[0]
    src1 = tensors[1] if len(tensors) > 1 else src0
    contig = all(s == cols for s in strides) or rows == 1
    _KERNEL[0][((n + BLOCK - 1) // BLOCK,)](
        dests, entry, counts, max(slot, 0), src0, strides[0], src1, strides[-1], cols, n,
        HAS1=len(tensors) > 1, COUNT=slot >= 0, CONTIG=contig, BLOCK=BLOCK)


def launcher(device: torch.device) -> Optional[Callable]:  # noqa: UP045
    """:func:`launch` for a model on ``device`` where it is a CUDA device, Triton is there and
    ``VLLM_PARITY_TAP_KERNEL`` is not ``0`` (the benchmark's torch copies, for comparison), else None."""
    if os.environ.get(ENV, "").strip() == "0" or device.type != "cuda" or not torch.cuda.is_available():
        return None
    try:
        import triton  # noqa: F401
    except ImportError:
        return None
    return launch
