"""A GGUF file's weights as quantized blocks, keyed by the HF module that uses them.

Contract: :func:`gguf_blocks(path, hf_config)` reads the file with the ``gguf`` package's
``GGUFReader`` and returns ``{hf module name: BlockWeight}`` for every weight whose GGML type
:mod:`~harness.quantized.q8_1` reproduces, plus :func:`tensor_types` ``{hf module: GGML type}``
for all of them (the report's table).  The name map is data (:data:`LLAMA_NAMES`); a tied
output layer (no ``output.weight`` in the file) is ``lm_head`` on ``token_embd``'s blocks.
:func:`check_against(blocks, state_dict)` asserts that every block weight dequantizes, bit
for bit, to the checkpoint the reference runs (harness.models.gguf_checkpoint's fp32
dequantization): the simulated run and the plain run use the same weights.

Traps:

* llama.cpp stores ``attn_q`` / ``attn_k`` with their rows permuted for its interleaved
  rotary; transformers un-permutes them (``reverse_permute_weights``: q with the query heads,
  k with the key/value heads) and vLLM does not -- it keeps the file's rows and runs GPT-J
  style rotary for GGUF llama (``LlamaAttention._init_rotary_emb``).  The blocks here follow
  transformers' rows (whole rows move; blocks run along the input dim), so they match the
  reference checkpoint; vLLM's q/k activations are the same values in the file's order, which
  is why q/k/rotary hooks are not compared (harness.quantized.gguf_parity).
* Block layouts (ggml-common.h): Q4_1 = fp16 d, fp16 m, 16 bytes of nibbles (element j in
  the low nibble of byte j, element j+16 in the high one); Q8_0 = fp16 d, 32 int8.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.quantized.q8_1 import QK, SIMULATED_TYPES, BlockWeight

# GGUF tensor (per layer "blk.{i}.") -> HF module (per layer "model.layers.{i}.")
LLAMA_NAMES: dict[str, str] = {
    "token_embd": "model.embed_tokens",
    "output": "lm_head",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}


def hf_name(gguf_name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj``; norms and unknowns -> None."""
    parts = gguf_name.split(".")
    if parts[-1] != "weight":
        return None
    if parts[0] == "blk":
        mod = LLAMA_NAMES.get(parts[2])
        return f"model.layers.{parts[1]}.{mod}" if mod else None
    return LLAMA_NAMES.get(parts[0]) if len(parts) == 2 else None


def _reverse_permute_rows(n_rows: int, n_head: int) -> torch.Tensor:
    """Row index map of transformers' ``reverse_permute_weights`` (HF row r <- file row idx[r])."""
    dim = n_rows // n_head // 2
    return torch.arange(n_rows).reshape(n_head, dim, 2).transpose(1, 2).reshape(n_rows)


def _parse(raw: np.ndarray, ggml_type: str, n_rows: int) -> BlockWeight:
    blocks = torch.from_numpy(np.ascontiguousarray(raw).view(np.uint8).reshape(n_rows, -1, BLOCK_BYTES[ggml_type]).copy())
    d = blocks[..., 0:2].contiguous().view(torch.float16)[..., 0].to(torch.float32)
    if ggml_type == "Q4_1":
        m = blocks[..., 2:4].contiguous().view(torch.float16)[..., 0].to(torch.float32)
        qs = blocks[..., 4:4 + QK // 2].to(torch.int32)
        q = torch.cat([qs & 0xF, qs >> 4], dim=-1).to(torch.float32)
        return BlockWeight("Q4_1", q, d, m)
    q = blocks[..., 2:].contiguous().view(torch.int8).to(torch.float32)
    return BlockWeight("Q8_0", q, d)


def _rows(w: BlockWeight, idx: torch.Tensor) -> BlockWeight:
    return BlockWeight(w.ggml_type, w.q[idx], w.d[idx], None if w.m is None else w.m[idx])


def tensor_types(path: Path) -> dict[str, str]:
    """``{gguf tensor name: GGML type}`` of every tensor in the file."""
    import gguf

    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


def gguf_blocks(path: Path, hf_config: Any) -> dict[str, BlockWeight]:
    """The file's simulated-type weights as blocks in transformers' row order, by HF module."""
    import gguf

    n_head = int(hf_config.num_attention_heads)
    n_kv = int(getattr(hf_config, "num_key_value_heads", None) or n_head)
    out: dict[str, BlockWeight] = {}
    names = set()
    for t in gguf.GGUFReader(str(path)).tensors:
        names.add(t.name)
        mod, kind = hf_name(t.name), t.tensor_type.name
        if mod is None or kind not in SIMULATED_TYPES:
            continue
        n_rows = int(t.shape[1]) if len(t.shape) > 1 else 1  # GGUF shapes are (in, out)
        w = _parse(t.data, kind, n_rows)
        if ".attn_q." in t.name:
            w = _rows(w, _reverse_permute_rows(n_rows, n_head))
        elif ".attn_k." in t.name:
            w = _rows(w, _reverse_permute_rows(n_rows, n_kv))
        out[mod] = w
    if "output.weight" not in names and "model.embed_tokens" in out:
        out["lm_head"] = out["model.embed_tokens"]  # tied
    return out


def check_against(blocks: dict[str, BlockWeight], state_dict: dict[str, torch.Tensor]) -> None:
    """Every block weight dequantizes bit for bit to the checkpoint's ``<module>.weight``."""
    for mod, w in blocks.items():
        key = f"{mod}.weight" if f"{mod}.weight" in state_dict else "model.embed_tokens.weight"
        ref = state_dict[key].to(torch.float32)
        got = w.dequantize()
        if got.shape != ref.shape or not torch.equal(got, ref):
            diff = float((got - ref).abs().max()) if got.shape == ref.shape else float("nan")
            raise ValueError(f"{mod}: the GGUF blocks do not dequantize to the checkpoint's {key} "
                             f"(shape {tuple(got.shape)} vs {tuple(ref.shape)}, max diff {diff:.3g}); "
                             "the simulated and plain references would not share weights")
