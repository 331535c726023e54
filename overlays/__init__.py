"""Overlay registry: HF architecture name -> overlay, as data.

``get_overlay(architecture)`` raises :class:`NoOverlayError` naming the
architectures that have one; there is no silent fallback, because a generic
overlay on the wrong module tree captures the wrong tensors (or none).
"""
from __future__ import annotations

from .base import HookSpec, NonFiring, Overlay
from .decoder_only import DecoderOnlyOverlay
from .gemma import GemmaOverlay
from .gemma2 import Gemma2Overlay, Gemma3Overlay
from .gpt2 import GPT2Overlay
from .gpt_neox import GPTNeoXOverlay
from .opt import OPTOverlay
from .stablelm import StableLMOverlay
from .starcoder2 import Starcoder2Overlay
from .granite import GraniteOverlay
from .phi3 import Phi3Overlay
from .olmo2 import Olmo2Overlay
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
    "GPTNeoXForCausalLM": GPTNeoXOverlay(),  # vLLM Transformers backend
    "OPTForCausalLM": OPTOverlay(),
    "StableLmForCausalLM": StableLMOverlay(),
    "Starcoder2ForCausalLM": Starcoder2Overlay(),  # vLLM Transformers backend
    "Phi3ForCausalLM": Phi3Overlay(),  # vLLM Llama tree; bridge has no rotated q/k
    "GraniteForCausalLM": GraniteOverlay(),  # multipliers, plain residual
    "Olmo2ForCausalLM": Olmo2Overlay(),  # vLLM Transformers backend; post-norms
    "MixtralForCausalLM": MixtralOverlay(),  # sparse MoE (block_sparse_moe)
    "Qwen3MoeForCausalLM": Qwen3MoeOverlay(),  # sparse MoE (mlp), q/k norms
}


class NoOverlayError(LookupError):
    """An HF architecture with no overlay in :data:`OVERLAYS`."""


def get_overlay(architecture: str) -> Overlay:
    try:
        return OVERLAYS[architecture]
    except KeyError:
        raise NoOverlayError(
            f"no vLLM overlay for architecture {architecture!r}; architectures with one: "
            f"{', '.join(sorted(OVERLAYS))}. Add a row to overlays/__init__.py (and an overlay "
            "file if its module tree differs from overlays/decoder_only.py)."
        ) from None


__all__ = ["OVERLAYS", "HookSpec", "NonFiring", "Overlay", "NoOverlayError", "get_overlay"]
