"""The seed's generic decoder overlay: for a checkpoint whose architecture has no declared row, the five hook
kinds every standard-shape decoder has, at module paths discovered from vLLM's own loaded model.

Contract: :func:`find_layout(modules)` takes vLLM's module tree as ``(dot path, class name)`` pairs (the
worker's ``vp_module_tree``, harness.engines.discovery) and returns a :class:`DecoderLayout` -- the root, the
embedding, the layer list, each layer's attention and MLP children, the final norm -- or raises
:class:`NotStandardShape` naming what is missing.  :class:`GenericDecoderOverlay` offers, on that layout:

- ``embed.hook_out``: the embedding module's output;
- ``blocks.{i}.hook_out``: the layer's fused ``(delta, residual)`` pair summed, ``out[0]+out[1]`` (on vLLM's
  Transformers backend: HF's layer output itself, every read with its batch dim of 1 dropped);
- ``blocks.{i}.attn.hook_out`` / ``blocks.{i}.mlp.hook_out``: the attention and MLP children's outputs;
- ``ln_final.hook_normalized``: the final norm's ``out[0]`` over its weight (plain RMS/LayerNorm weight);
- ``unembed.hook_out`` and the log-prob rows, as every decoder.

Traps:
- "Standard shape" is vLLM's Llama shape: decoder layers returning ``(delta, residual)``, attention and MLP
  as children of each layer, a final norm whose weight multiplies (not Gemma's ``1 + w``).  A model that only
  looks like it (parallel blocks, post-norms, an offset norm, a layer returning one tensor) fails or errors
  at the hook where it differs -- which is the point: the report says it ran on the generic overlay, and a
  declared row (docs/adding-an-architecture.md) is the fix.  Every other TransformerLens hook is listed
  non-firing with that reason, never dropped.
- The layout is found by module *role* (the embedding class, a list of numbered layers, children named or
  classed as attention / MLP / norm), not by one architecture's names.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .base import DropBatch, HookSpec, NonFiring, Overlay, UnfoldNorm, config_get

SEED_KINDS = ("embed.hook_out", "blocks.{i}.hook_out", "blocks.{i}.attn.hook_out", "blocks.{i}.mlp.hook_out",
              "ln_final.hook_normalized", "unembed.hook_out")
_ATTN_NAMES = ("self_attn", "attention", "attn", "self_attention")
_MLP_NAMES = ("mlp", "feed_forward", "ffn", "block_sparse_moe")


class NotStandardShape(ValueError):
    """vLLM's module tree of a checkpoint lacks a piece of the standard decoder shape."""


@dataclass(frozen=True)
class DecoderLayout:
    embed: str  # "model.embed_tokens"
    layers: str  # "model.layers": layer i is f"{layers}.{i}"
    n_layers: int
    attention: str  # the attention child's name inside a layer ("self_attn")
    mlp: str  # the MLP child's name inside a layer ("mlp")
    final_norm: str  # "model.norm"
    logits: str = "logits_processor"
    # vLLM runs HF's own modules (its Transformers modeling backend): [1, T, d] activations, and a layer returns
    # the stream itself, not a fused (delta, residual) pair
    hf_modules: bool = False

    def describe(self) -> str:
        return (f"{self.embed}, {self.layers}.{{0..{self.n_layers - 1}}}.{{{self.attention}, {self.mlp}}}, "
                f"{self.final_norm}" + ("; vLLM's Transformers backend" if self.hf_modules else ""))


def find_layout(modules: list[tuple[str, str]], hf_modules: bool = False) -> DecoderLayout:
    """The standard decoder layout in vLLM's ``(path, class)`` module list (module doc), or
    :class:`NotStandardShape` naming every piece that is missing; ``hf_modules``: vLLM runs the architecture
    through its Transformers backend (harness.engines.vllm_compat.model_implementation)."""
    classes = dict(modules)
    missing: list[str] = []
    embeds = [n for n, c in modules if "Embedding" in c and "Rotary" not in c and "Position" not in c]
    embed = embeds[0] if embeds else None
    if embed is None:
        missing.append("a token embedding (a module of an *Embedding class)")
    numbered: dict[str, set[int]] = {}
    for name, _ in modules:
        m = re.fullmatch(r"(.+)\.(\d+)", name)
        if m:
            numbered.setdefault(m.group(1), set()).add(int(m.group(2)))
    lists = sorted(((p, ix) for p, ix in numbered.items() if ix == set(range(len(ix)))),
                   key=lambda item: (-len(item[1]), item[0].count(".")))
    layers = next((p for p, _ in lists if "layer" in p.rsplit(".", 1)[-1] or p.endswith(".h")), None)
    if layers is None:
        missing.append("a list of decoder layers (<root>.layers.0, .1, ...)")
        raise NotStandardShape("; ".join(missing))
    n_layers = len(numbered[layers])
    children = {n[len(layers) + 3:] for n in classes if n.startswith(f"{layers}.0.") and n.count(".") == layers.count(".") + 2}
    attention = next((c for c in _ATTN_NAMES if c in children), None) or next(
        (c for c in sorted(children) if "Attention" in classes[f"{layers}.0.{c}"]), None)
    mlp = next((c for c in _MLP_NAMES if c in children), None) or next(
        (c for c in sorted(children) if re.search("MLP|MoE|FeedForward", classes[f"{layers}.0.{c}"])), None)
    if attention is None:
        missing.append(f"an attention child in {layers}.0 (has: {', '.join(sorted(children)) or 'none'})")
    if mlp is None:
        missing.append(f"an MLP child in {layers}.0 (has: {', '.join(sorted(children)) or 'none'})")
    root = layers.rsplit(".", 1)[0] if "." in layers else ""
    norms = [n for n in (f"{root}.norm", f"{root}.final_layernorm", f"{root}.ln_f", f"{root}.norm_f")
             if n.lstrip(".") in classes]
    final_norm = norms[0].lstrip(".") if norms else None
    if final_norm is None:
        missing.append(f"a final norm beside the layers ({root or '<root>'}.norm)")
    if missing:
        raise NotStandardShape("; ".join(missing))
    return DecoderLayout(embed, layers, n_layers, attention, mlp, final_norm, hf_modules=hf_modules)


class GenericDecoderOverlay(Overlay):
    """The seed's five hook kinds on a discovered :class:`DecoderLayout` (module doc)."""

    def __init__(self, layout: DecoderLayout, declared_kinds: int | None = None) -> None:
        self.layout = layout
        versus = f" against {declared_kinds} on a declared Llama-shaped row" if declared_kinds else ""
        self.name = (f"generic decoder overlay (discovered from vLLM's tree: {layout.describe()}; "
                     f"{len(SEED_KINDS) - 1} hook kinds and the logits{versus})")
        # what reports and the matrix name the overlay by (a declared row: its class name)
        self.report_name = f"GenericDecoderOverlay ({len(SEED_KINDS) - 1} hook kinds{versus})"

    def hook_specs(self, hf_config: Any) -> dict[str, HookSpec]:
        lay = self.layout
        d = int(config_get(hf_config, "hidden_size", "n_embd", "d_model"))
        b = (DropBatch(),) if lay.hf_modules else ()  # HF's modules run on [1, T, d]
        specs = {"embed.hook_out": HookSpec(lay.embed, "out", b, d)}
        for i in range(lay.n_layers):
            L = f"{lay.layers}.{i}"
            specs[f"blocks.{i}.attn.hook_out"] = HookSpec(f"{L}.{lay.attention}", "out[0]", b, d)
            specs[f"blocks.{i}.mlp.hook_out"] = HookSpec(f"{L}.{lay.mlp}", "out[0]", b, d)
            specs[f"blocks.{i}.hook_out"] = HookSpec(L, "out[0]" if lay.hf_modules else "out[0]+out[1]", b, d)
        specs["ln_final.hook_normalized"] = HookSpec(lay.final_norm, "out[0]",
                                                     (*b, UnfoldNorm(f"{lay.final_norm}.weight")), d)
        specs["unembed.hook_out"] = HookSpec(lay.logits, "out", (), int(config_get(hf_config, "vocab_size")), calls="all")
        return specs

    def nonfiring(self) -> list[NonFiring]:
        why = ("not offered by the generic overlay (the seed's five hook kinds only): declare a row for this "
               "architecture (docs/adding-an-architecture.md) to gate it")
        return [NonFiring(t, why) for t in ("blocks.{i}.hook_in", "blocks.{i}.hook_resid_mid", "blocks.{i}.ln1.hook_normalized",
                                            "blocks.{i}.ln2.hook_normalized", "blocks.{i}.attn.hook_q",
                                            "blocks.{i}.attn.hook_k", "blocks.{i}.attn.hook_v", "blocks.{i}.attn.hook_z",
                                            "blocks.{i}.attn.hook_pattern", "blocks.{i}.mlp.hook_pre",
                                            "blocks.{i}.mlp.hook_post")]


__all__ = ["DecoderLayout", "GenericDecoderOverlay", "NotStandardShape", "SEED_KINDS", "find_layout"]
