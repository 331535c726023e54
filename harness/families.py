"""Model families under test, declared as data.

Contract: ``FAMILIES[name]`` is a :class:`ModelSpec` row saying how to build a
tiny synthetic checkpoint for that family offline (an HF ``model_type`` plus
config overrides) and which parameters are offset-parameterized norms
(Gemma's ``(1 + w)``).  ``DEFAULT_FAMILIES`` is what runs when no ``--model``
is given.  :func:`resolve_families` turns a user's ``--model`` string into
rows or raises a :class:`UnknownFamilyError` naming the known ones.

Every synthetic config keeps ``head_dim`` at 32: vLLM's CPU attention rejects
16 (see DESIGN.md, section 3).  Layers are 3 so first, middle and last layer
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


@dataclass(frozen=True)
class ModelSpec:
    """One model family: how to build its synthetic checkpoint."""

    name: str
    model_type: str  # HF config model_type, passed to AutoConfig.for_model
    config: Mapping[str, Any] = field(default_factory=dict)
    # Norm weights stored as offsets from 1 (HF/vLLM multiply by 1 + w).
    norm_weight_offset: float = 0.0
    seed: int = 0

    def hf_config_kwargs(self) -> dict[str, Any]:
        return dict(self.config)


FAMILIES: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("llama", "llama", {**_TINY, "attention_bias": True, "mlp_bias": True}),
        ModelSpec("qwen3", "qwen3", {**_TINY, "tie_word_embeddings": True}),
        ModelSpec(
            "gemma",
            "gemma",
            {**_TINY, "num_key_value_heads": 1, "hidden_activation": "gelu_pytorch_tanh",
             "tie_word_embeddings": True},
            norm_weight_offset=1.0,
        ),
    )
}

DEFAULT_FAMILIES: tuple[str, ...] = ("qwen3", "llama", "gemma")


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
