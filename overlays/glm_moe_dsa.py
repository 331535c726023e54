"""GLM-5 overlay (``GlmMoeDsaForCausalLM``, vLLM 0.20.2 native, CUDA only): GLM-4.7-Flash's MLA + MoE tree with
DeepSeek sparse attention (DSA) -- the :data:`GLM_MOE_DSA` row, :data:`overlays.glm4_moe_lite.GLM4_MOE_LITE`'s tree
run by DeepSeek's layer, with the router's choice compared against HF.

Status: written from vLLM 0.20.2's source and checked against HF's and TransformerLens's modules on the CPU
(tests/unit/overlays/test_glm_moe_dsa.py); registered for the CUDA line (the CPU refuses sparse attention: the
family row).  The family row's config carries ``rope_interleave`` / ``indexer_rope_interleave`` (true, as the released
config.json) and ``index_topk`` 128: vLLM 0.20.2's sparse MLA kernel takes the top-k in blocks of 128 ("NUM_TOPK_TOKENS
(8) must be divisible by BLOCK_N (128)" at 8), and the long prompt's 248 tokens keep the choice meaningful.  The
indexer's own reads (:data:`INDEXER_READS`) need a Tree field, not offered yet.  Serving: stitched runs take the
sparse backend's 64-token KV blocks (harness.engines.serving.block_size); ``preempt`` cannot preempt with them
(:data:`_PREEMPT_BLOCK`).

vLLM 0.20.2 runs it as ``deepseek_v2.GlmMoeDsaForCausalLM`` (= ``DeepseekV2ForCausalLM``; ``is_v32`` because the
config has ``index_topk``).  Its module tree, layer ``model.layers.{i}`` (``DeepseekV2DecoderLayer``, fused add-norms,
``(delta, residual)`` return, fp16 "overflow" rescale by ``1 / routed_scaling_factor``):

    self_attn                      DeepseekV2MLAAttention -> mla_attn (MultiHeadLatentAttentionWrapper)
      fused_qkv_a_proj             [q_c | kv_c | k_pe];  q_a_layernorm(q_c) -> q_b_proj -> q;  kv_a_layernorm(kv_c)
      rotary_emb                   get_rope(..., is_neox_style=False): q[..., nope:] and k_pe rotated in place
      indexer                      Indexer(hidden_states = the attention's input, q_c, positions, indexer_rope_emb)
        wq_b                       q_c -> [T, index_n_heads * index_head_dim]
        wk_weights_proj            x -> [wk(x) (index_head_dim) | weights_proj(x) (index_n_heads)]  (HF: wk, weights_proj)
        k_norm                     LayerNorm(index_head_dim), fp32 weights
        (indexer_rope_emb)         get_rope(..., is_neox_style=not config.indexer_rope_interleave): [rope | pass] split
        indexer_op                 SparseAttnIndexer(hidden_states, q_fp8, k, weights) -> topk_indices_buffer
        k_cache                    DeepseekV32IndexerCache: never called (the op writes its fp8 cache)
      mla_attn.mla_attn            MLAAttention(q, kv_c_normed, k_pe), use_sparse: FLASHMLA_SPARSE on an H200
      o_proj                       its input is hook_z
    mlp                            DeepseekV2MLP below first_k_dense_replace, DeepseekV2MoE above (gate, experts,
                                   shared_experts)

Hook by hook (what differs from :mod:`overlays.glm4_moe_lite` / :mod:`overlays.deepseek`):

- Latents, ``hook_q``, ``hook_z``, ``hook_out``: DeepSeek-V3's reads.  HF's ``GlmMoeDsaAttention`` always rotates
  de-interleaved (``apply_rotary_pos_emb_interleave``, no config flag); the row keeps ``rope_deinterleave_key =
  "rope_interleave"``, which ``GlmMoeDsaConfig`` does not define: the family's config must carry
  ``rope_interleave: true`` as GLM-5's released config.json does, or the rope dims are compared un-reordered.
- ``attn.q_a_layernorm.hook_normalized``: TransformerLens 4.3.0's GLM-MoE-DSA adapter keeps Q compression required
  (``q_lora_optional`` False), so ``q_a_layernorm`` is an ``RMSNormalizationBridge`` with the hook (GLM-4.7-Flash's
  HF-only override is dropped).
- Router choice (``mlp.gate.hook_expert_weights`` / ``hook_expert_indices``): the adapter's router is a plain
  component, so DeepSeek's HF-only rows (HF's ``GlmMoeDsaTopkRouter`` returns ``(logits, weights, ids)``).  vLLM's
  ``DeepseekV2MoE`` reads ``scoring_func`` / ``topk_method`` from the config (the family row sets them as released);
  HF always scores sigmoid plus ``e_score_correction_bias``: the row's ``SIGMOID_BIAS``.
- ``attn.hook_z``: TL splits ``o_proj``'s input by ``head_dim``, which ``GlmMoeDsaConfig`` sets to
  ``qk_rope_head_dim``: the DeepSeek layout bug (harness.comparison.known_issues.LAYOUT_BUGS lists this
  architecture).
- ``attn.hook_v``: the sparse backends run every token absorbed (MQA over the 576-wide latent cache), prefill
  included, so ``kv_b_proj`` is never called: non-firing by the CUDA MLA backend (harness.engines.mla_backends).
- Indexer internals: ``wq_b``, ``wk_weights_proj`` (columns = HF's ``wk`` / ``weights_proj``) and ``k_norm`` are
  module boundaries vLLM calls and HF holds the same tensors (``self_attn.indexer.{wq_b,wk,weights_proj,k_norm}``),
  but TransformerLens calls HF's indexer whole (no hooks inside it) and :class:`~overlays.tree.Tree` has no field
  offering HF-only reads at HF's modules: :data:`INDEXER_READS` declares them for that field, not offered yet.
  The indexer's rotated q / k have no HF module (HF rotates in a function): not offerable.
- Trap, rotary sharing: ``get_rope`` caches by (head size, max position, neox style, rope parameters, dtype).  With
  ``indexer_rope_interleave: true`` (released; what HF computes) the indexer's rope is the *same module object* as
  ``rotary_emb``, on every layer, called twice per layer (MLA's q [T, H, 64], then the indexer's [T, 32, 64]); the
  worker assigns a shared module's n-th call to the n-th layer's path (harness.engines.reads.sibling_paths), so
  ``rotary_emb``'s outputs would be the indexer's calls for later layers.  ``hook_rot_q`` / ``hook_rot_k`` are read
  at the MLA core's inputs instead (``Attention.mla_rot_at_core``: ``in[0][..., nope:]`` and ``in[2]``), per layer
  and unshared.  Without the flag the two modules differ, but vLLM's indexer rotates NeoX halves where HF rotates
  pairs: its selection is not GLM-5's.
- Non-firing: ``attn.hook_topk_indices`` and ``attn.hook_dsa_mask`` (:data:`_NO_TOPK`, :data:`_NO_MASK`), and
  DeepSeek's ``hook_k`` / scores / pattern / per-expert hooks.
- Selection, fp8 (:data:`_NO_TOPK`): vLLM's indexer quantizes the indexer query to fp8 e4m3 per 128-element group
  (= per index head; ``per_token_group_quant_fp8``, ue8m0 power-of-two scales) and its key to fp8 e4m3 with one ue8m0
  scale per 128 (``indexer_k_quant_and_cache``), computes the logits in DeepGEMM (``fp8_fp4_mqa_logits``:
  ReLU(q.k) x weights, summed over heads, the q scale and ``softmax_scale x n_heads^-0.5`` folded into ``weights``)
  and picks the top ``index_topk`` per row; HF computes the same scores in fp32 from the model-dtype projections.
  The scores differ by fp8 rounding (3 mantissa bits), so where a row's ``index_topk``-th and next keys score within
  it, the two engines attend to different keys.  By design (no bf16 indexer path on CUDA; the op refuses to run
  without DeepGEMM): the first hook to show it is ``blocks.0.attn.hook_z`` (``o_proj``'s input, the sparse
  attention's output), at rows past ``index_topk - 1`` only (earlier rows attend to every causal key either way);
  everything before it in the layer (latents, rope, ``hook_q``) is selection-free.
"""
from __future__ import annotations

from dataclasses import replace

from .base import NonFiring
from .deepseek import _HF_ROUTER
from .glm4_moe_lite import GLM4_MOE_LITE
from .tree import TreeOverlay

_NO_TOPK = ("vLLM's indexer returns topk_indices_buffer, one [max_num_batched_tokens, index_topk] int32 buffer shared "
            "by every layer (overwritten per layer), its rows in top_k_per_row_prefill's order with -1 where a row has "
            "fewer causal keys, chosen from fp8 e4m3 logits (indexer q and k quantized, ue8m0 scales per 128); TL holds "
            "torch.topk's descending order from fp32 scores, masked keys filling short rows: no conversion turns one "
            "into the other (an index set, not a tensor to compare with a tolerance), and near-ties flip under fp8 by "
            "design (first seen at attn.hook_z)")
_NO_MASK = ("vLLM's sparse MLA kernel takes the top-k indices directly (FlashMLA sparse); the additive 0 / -inf "
            "index mask TransformerLens builds from them is never formed")

_PREEMPT_BLOCK = ("vLLM's sparse MLA backend (FLASHMLA_SPARSE) takes KV blocks of 64 tokens only "
                  "(harness.engines.mla_backends.kernel_block_size), and in the scheme's 8 decode steps no prompt of "
                  "the set crosses a 64-token boundary (7 -> 15, 16 -> 24, 29 -> 37, 248 -> 256 tokens): no request "
                  "needs a new block, so none can be preempted (measured: 'no request crossed into a new block "
                  "while decoding')")

# Tree field proposal (report): (hook, vLLM module under self_attn, read, columns or None, HF module under
# self_attn); references ("bridge", None), ("compat", None), ("hf", <hook>) read at HF's module (Overlay.hf_reads).
INDEXER_READS = (
    ("attn.indexer.wq_b.hook_out", "indexer.wq_b", "out[0]", None, "indexer.wq_b"),
    ("attn.indexer.wk.hook_out", "indexer.wk_weights_proj", "out[0]", ("0", "index_head_dim"), "indexer.wk"),
    ("attn.indexer.weights_proj.hook_out", "indexer.wk_weights_proj", "out[0]",
     ("index_head_dim", "index_head_dim+index_n_heads"), "indexer.weights_proj"),
    ("attn.indexer.k_norm.hook_out", "indexer.k_norm", "out", None, "indexer.k_norm"),
)

GLM_MOE_DSA = replace(
    GLM4_MOE_LITE, name="glm_moe_dsa", references=_HF_ROUTER,
    attention=replace(GLM4_MOE_LITE.attention, mla_rot_at_core=True),
    serving_not_applicable=(("preempt", _PREEMPT_BLOCK),),
    nonfiring=(*GLM4_MOE_LITE.nonfiring, NonFiring("blocks.{i}.attn.hook_topk_indices", _NO_TOPK),
               NonFiring("blocks.{i}.attn.hook_dsa_mask", _NO_MASK)),
)


class GlmMoeDsaOverlay(TreeOverlay):
    """GLM-5: GLM-4.7-Flash's MLA + MoE tree, DeepSeek sparse attention (fp8 indexer), router choice against HF."""

    tree = GLM_MOE_DSA


__all__ = ["GLM_MOE_DSA", "INDEXER_READS", "GlmMoeDsaOverlay"]
