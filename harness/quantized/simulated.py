"""The references of a GGUF run: HF on the dequantized weights, plain and with ggml's kernels simulated.

Contract: :func:`reference_run(checkpoint, prompts, hooks, dtype, blocks=None)` runs HF
(eager attention) on the dequantized checkpoint and returns, per prompt, ``{hook: [T, ...]}``
for :data:`HOOKS`-style names (``embed.hook_out``, ``blocks.{i}.hook_in|hook_out``,
``blocks.{i}.attn.hook_out``, ``blocks.{i}.mlp.hook_out``) and ``"logprobs"`` ([T, V], float64).
With ``blocks`` (harness.quantized.gguf_weights) it is the *simulated* run: forward hooks
replace the output of every module with a block weight by :func:`~harness.quantized.q8_1.ggml_linear`
(its input quantized to Q8_1, the kernel's integer dot product), and the embedding output by
the Q8_0 table rounded to fp16 (vLLM's ``ggml_dequantize`` computes ``d * q`` in ``half2``,
``dequantize.cuh``).  :func:`floors(run, truth)` is the worst row relative error per hook over
prompts (harness.comparison.compare.compare_tensors), the harness's floor statistic
(``statistic="rel_median"``: the median row's, the main harness's second floor);
:func:`~harness.comparison.compare.top_k_mask` restricts log-prob rows to the entries a top-k engine returns.

What the floors mean (harness.quantized.gguf_parity gates with them):

* ``quant``: simulated vs plain, both in the run dtype -- how far the quantized kernels'
  arithmetic alone moves each hook; vLLM-GGUF vs the plain reference is gated by a multiple
  of it;
* ``dtype``: simulated in the run dtype vs simulated in the truth dtype (fp64 for fp32, fp32
  for bf16/fp16) with the kernels' own fp16/float32 steps kept -- the ordinary dtype floor of
  the simulated reference; vLLM-GGUF vs the simulated reference is gated by it.

Traps: hooks are registered after the simulation's, so a capture sees the replaced output;
the replaced module still computes its dense matmul (discarded: a few % of the run).  The
plain run must not be given ``blocks`` (it is the dequantized-weights reference).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from harness.comparison.compare import compare_tensors, top_k_mask
from harness.quantized.q8_1 import BlockWeight, ggml_linear
from harness.references.reference import decoder_layers
from harness.comparison.tolerances import TORCH_DTYPES

TRUTH = {"float32": "float64", "bfloat16": "float32", "float16": "float32"}


def load_model(checkpoint: Path, dtype: str, device: str = "cpu"):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=TORCH_DTYPES[dtype],
                                                 attn_implementation="eager")
    return model.to(device).eval()


def _simulate(model, blocks: dict[str, BlockWeight], accumulate: torch.dtype) -> list:
    handles = []
    modules = dict(model.named_modules())
    for name, w in blocks.items():
        if name == "model.embed_tokens":
            continue  # the embedding lookup is handled below (vLLM dequantizes rows, no Q8_1)
        mod = modules[name]
        w_dev = BlockWeight(w.ggml_type, w.q.to(mod.weight.device), w.d.to(mod.weight.device),
                            None if w.m is None else w.m.to(mod.weight.device))

        def hook(m, args, out, _w=w_dev):
            return ggml_linear(args[0], _w, accumulate=accumulate).to(out.dtype)
        handles.append(mod.register_forward_hook(hook))
    emb = blocks.get("model.embed_tokens")
    if emb is not None:
        table = emb.dequantize().to(torch.float16)

        def embed(m, args, out):
            return table.to(out.device)[args[0]].to(out.dtype)
        handles.append(model.get_input_embeddings().register_forward_hook(embed))
    return handles


def _captures(model, n_layers: int, caps: dict) -> list:
    handles = []
    emb = model.get_input_embeddings()
    handles.append(emb.register_forward_hook(lambda m, a, o: caps.__setitem__("embed.hook_out", o[0].detach().cpu())))
    for i, layer in enumerate(decoder_layers(model, n_layers)):
        def pre(m, args, kwargs, _i=i):
            h = args[0] if args else kwargs["hidden_states"]
            caps[f"blocks.{_i}.hook_in"] = h[0].detach().cpu()

        def post(m, args, out, _i=i):
            caps[f"blocks.{_i}.hook_out"] = (out[0] if isinstance(out, tuple) else out)[0].detach().cpu()

        def attn(m, args, out, _i=i):
            caps[f"blocks.{_i}.attn.hook_out"] = (out[0] if isinstance(out, tuple) else out)[0].detach().cpu()

        def mlp(m, args, out, _i=i):
            caps[f"blocks.{_i}.mlp.hook_out"] = out[0].detach().cpu()
        handles += [layer.register_forward_pre_hook(pre, with_kwargs=True), layer.register_forward_hook(post),
                    layer.self_attn.register_forward_hook(attn), layer.mlp.register_forward_hook(mlp)]
    return handles


def reference_run(checkpoint: Path, prompts: list[list[int]], hooks: set[str], dtype: str,
                  blocks: dict[str, BlockWeight] | None = None, device: str = "cpu",
                  model: Any = None) -> dict[int, dict[str, torch.Tensor]]:
    """Per prompt ``{hook: value}`` (only ``hooks`` kept) and ``"logprobs"`` (module doc)."""
    model = model if model is not None else load_model(checkpoint, dtype, device)
    accumulate = torch.float64 if dtype == "float64" else torch.float32
    n_layers = int(model.config.num_hidden_layers)
    out: dict[int, dict[str, torch.Tensor]] = {}
    handles = _simulate(model, blocks, accumulate) if blocks else []
    caps: dict[str, torch.Tensor] = {}
    handles += _captures(model, n_layers, caps)
    try:
        for p, tokens in enumerate(prompts):
            caps.clear()
            with torch.no_grad():
                logits = model(torch.tensor([tokens], device=device)).logits[0]
            out[p] = {k: v for k, v in caps.items() if k in hooks}
            out[p]["logprobs"] = torch.log_softmax(logits.double(), dim=-1).cpu()
    finally:
        for h in handles:
            h.remove()
    return out


def floors(run: dict[int, dict[str, torch.Tensor]], truth: dict[int, dict[str, torch.Tensor]],
           logprob_k: int | None = None, statistic: str = "rel_err") -> dict[str, float]:
    """Per hook, the largest over prompts of ``statistic`` (``rel_err``: the worst row's relative
    error; ``rel_median``: the median row's; ``scale_median``: the median signed row-norm deviation,
    largest in magnitude, sign kept; harness.comparison.compare.Metrics) of ``run`` against ``truth``
    -- the main harness's three floors (harness.references.reference); NaN where either side is
    non-finite (a NaN floor fails the rows it gates).  ``logprob_k``: log-prob rows compared on
    ``truth``'s top-k entries only (what vLLM returns)."""
    if statistic not in ("rel_err", "rel_median", "scale_median"):
        raise ValueError(f"statistic {statistic!r}: rel_err, rel_median or scale_median")
    out: dict[str, float] = {}
    for p, hooks in run.items():
        for name, value in hooks.items():
            ref = truth[p].get(name)
            if ref is None:
                continue
            if not (torch.isfinite(value).all() and torch.isfinite(ref).all()):
                out[name] = math.nan
                continue
            if name == "logprobs" and logprob_k:
                ref = top_k_mask(ref, logprob_k)
            err = getattr(compare_tensors(value, ref), statistic)
            if out.get(name, 0.0) == out.get(name, 0.0):  # a NaN floor stays NaN
                out[name] = max(out.get(name, 0.0), err, key=abs)  # scale keeps its sign; the others are >= 0
    return out
