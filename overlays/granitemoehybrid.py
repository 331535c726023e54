"""Granite-4.0-H (``GraniteMoeHybridForCausalLM``): Granite's multipliers and plain stream, with a Mamba-2 mixer in
attention's place on the layers ``layer_types`` names ``"linear_attention"`` (:class:`overlays.tree.SsmMixer`,
Mamba-2's reads from :mod:`overlays.mamba2`), and a dense shared MLP on every layer.  Written for the dense
configs (Granite-4.0-H-Micro / H-1B: ``num_local_experts`` 0).  The MoE configs (H-Tiny / H-Small) add a
``block_sparse_moe`` beside the shared MLP, which TransformerLens names ``blocks.{i}.moe.*`` and sums inline with
the shared MLP: for them the shared MLP's hooks are offered as for the dense configs, ``hook_mlp_out`` is
non-firing (:data:`MOE_MLP_OUT`: no module produces the sum, and TransformerLens offers none), and the MoE block's
own hooks are not offered (the row has one feed-forward slot); its output reaches the stream, which ``hook_out``
gates.

vLLM's tree (vllm/model_executor/models/granitemoehybrid.py)::

    model.embed_tokens                      VocabParallelEmbedding (x embedding_multiplier after the module)
    model.layers.{i}                        GraniteMoeHybrid{Mamba,Attention}DecoderLayer(hidden_states=, ...)
                                            -> (stream after the block, stream after the mixer)
    model.layers.{i}.input_layernorm        RMSNorm, called without a residual
    model.layers.{i}.mamba                  MambaMixer2 (Mamba layers): in_proj, gated norm, out_proj
    model.layers.{i}.self_attn              qkv_proj -> [rotary] -> attn -> o_proj (attention layers)
    model.layers.{i}.post_attention_layernorm
    model.layers.{i}.shared_mlp             GraniteMoeSharedMLP: input_linear [gate | up] -> SiluAndMul -> output_linear
    model.norm, logits_processor            (logits / logits_scaling)

Hook by hook:

- Stream: ``h = x + mixer(ln1(x)) * r`` then ``h + mlp(ln2(h)) * r`` inline; the layer returns the stream and the
  mid stream, so ``hook_out`` is ``out[0]`` and ``hook_resid_mid`` the input of ``post_attention_layernorm``
  (:data:`overlays.tree.STREAM_PAIR`).  Embedding multiplier, attention multiplier (softmax scale), logits
  scaling and the legacy ``hook_attn_out`` / ``hook_mlp_out`` (sublayer output x ``residual_multiplier``):
  Granite's (:mod:`overlays.granite`).  ``hook_attn_out`` exists on attention layers only: TransformerLens's
  ``ScaledResidualBlockBridge`` scales no Mamba contribution.
- Mamba layers: ``blocks.{i}.mixer.*`` (TL's adapter wires HF's ``mamba`` under the canonical ``mixer``), as
  :mod:`overlays.mamba2`'s, against the bridge and HF's forward hooks on ``layer.mamba``.  HF's
  ``GraniteMoeHybridRMSNormGated`` normalizes the whole inner width and ignores ``mamba_n_groups`` (as
  Mamba-2's ``MambaRMSNormGated``), vLLM's ``Mixer2RMSNormGated`` each group: the same reference bug
  (harness.comparison.known_issues.GATED_NORM_BUGS, this architecture's entry), the references corrected
  downstream of the norm (harness.references.reference.group_wise_gated_norm).  Released Granite-4.0-H
  configs have ``mamba_n_groups`` 1 (the bug cannot show there); the synthetic row has 2.
- Attention layers: no rotary in the released Granite-4.0-H configs (``position_embedding_type`` "nope"):
  ``hook_q`` / ``hook_k`` feed the derived scores / pattern (``SCORES_FROM_QK``).  Where the config says "rope"
  (Granite-4.0-micro; vLLM then builds ``self_attn.rotary_emb`` and rotates q / k, TransformerLens's adapter a
  rotary bridge) the row is :data:`GRANITEMOEHYBRID_ROPE`: ``hook_rot_q`` / ``hook_rot_k`` at the rotary and the
  scores from them (``SCORES_FROM_ROTATED``), chosen per config by :meth:`GraniteMoeHybridOverlay.tree_for`.
- MLP: TransformerLens names the dense block ``blocks.{i}.shared_mlp.*``: the builder's ``mlp.*`` hooks are
  offered under those names (``Tree.hook_names``), in compatibility mode too (``Tree.references``).  ``mlp.hook_pre`` is ``input_linear``'s
  gate half (HF chunks ``[gate | up]``, vLLM's ``SiluAndMul`` acts on the first half).
"""
from __future__ import annotations

from dataclasses import replace

from .base import NonFiring
from .decoder_only import DECODER
from .granite import GRANITE
from .tree import GATED, SCORES_FROM_QK, SCORES_FROM_ROTATED, STREAM_PAIR, Mlp, SsmMixer, TreeOverlay, config_get

_SHARED = ("hook_in", "hook_pre", "hook_pre_linear", "hook_post", "hook_out")  # the dense MLP's hooks

GRANITEMOEHYBRID = replace(
    GRANITE, name="granitemoehybrid", residual=STREAM_PAIR,
    attention=replace(DECODER.attention, rotary=None), score_inputs=SCORES_FROM_QK,
    mlp=Mlp(kind=GATED, module="shared_mlp", up="input_linear", down="output_linear"),
    d_mlp_keys=("shared_intermediate_size",), d_mlp_ratio=None,
    ssm_mixer=SsmMixer(),
    hook_names=tuple((f"mlp.{h}", f"shared_mlp.{h}") for h in _SHARED),
    # compatibility mode names them as the bridge does (the scaled contribution is hook_mlp_out, its own hook)
    references=GRANITE.references + tuple((f"mlp.{h}", (("compat", f"blocks.{{i}}.shared_mlp.{h}"),)) for h in _SHARED),
)


# position_embedding_type "rope" (Granite-4.0-micro): vLLM's attention rotates q / k at self_attn.rotary_emb
GRANITEMOEHYBRID_ROPE = replace(GRANITEMOEHYBRID, attention=DECODER.attention, score_inputs=SCORES_FROM_ROTATED)


# the MoE configs' MLP contribution (Granite-4.0-H-Tiny / H-Small): no single tensor
MOE_MLP_OUT = NonFiring(
    "blocks.{i}.hook_mlp_out",
    "with experts (num_local_experts > 0) the feed-forward contribution is block_sparse_moe's output plus "
    "shared_mlp's, times residual_multiplier, summed inline in the layer's forward (vLLM's and HF's): no module "
    "produces it, and TransformerLens 4.3.0 offers no hook_mlp_out there; the layer's hook_out holds it")


def has_experts(cfg) -> bool:
    """Whether ``cfg`` is a MoE config (Granite-4.0-H-Tiny / H-Small): a block_sparse_moe beside the shared MLP."""
    return int(config_get(cfg, "num_local_experts", default=0) or 0) > 0


class GraniteMoeHybridOverlay(TreeOverlay):
    """Granite-4.0-H: Granite's multipliers, Mamba-2 or attention by layer_types, a shared MLP per layer."""
    tree = GRANITEMOEHYBRID

    @staticmethod
    def tree_for(cfg) -> "TreeOverlay":
        """The builder of ``cfg``'s row: :data:`GRANITEMOEHYBRID_ROPE` where its attention is rotary; with experts,
        no ``hook_mlp_out`` (``Tree.mlp_contribution``, :data:`MOE_MLP_OUT` its reason)."""
        rope = config_get(cfg, "position_embedding_type", default="nope") == "rope"
        row = GRANITEMOEHYBRID_ROPE if rope else GRANITEMOEHYBRID
        if has_experts(cfg):
            row = replace(row, mlp_contribution=False, nonfiring=(*row.nonfiring, MOE_MLP_OUT))
        return TreeOverlay(row)

    def hook_specs(self, cfg):
        return self.tree_for(cfg).hook_specs(cfg)

    def derived_specs(self, cfg):
        return self.tree_for(cfg).derived_specs(cfg)

    def nonfiring_for(self, cfg):
        return self.tree_for(cfg).nonfiring_for(cfg)


__all__ = ["GRANITEMOEHYBRID", "GRANITEMOEHYBRID_ROPE", "MOE_MLP_OUT", "GraniteMoeHybridOverlay", "has_experts"]
