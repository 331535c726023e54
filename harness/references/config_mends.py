"""Reference configs the installed transformers reads wrong, corrected before the references are built -- as data.

Contract: :func:`config_mend(config)` returns the :class:`ConfigMend` whose signature holds in ``config`` (the
``PretrainedConfig`` the installed transformers loaded from the checkpoint), or ``None``.  A mend's
:meth:`~ConfigMend.overrides` are attribute values set on the config before HF's model and TransformerBridge are
built from it (``from_pretrained(config=...)`` / ``boot_transformers(hf_config_overrides=...)``), so every reference
computes the model the checkpoint defines, and its :attr:`~ConfigMend.label` goes to the report as "reference
corrected" (harness.reporting.markdown).  The signature is read from the loaded config on every run: once the
installed transformers reads the field itself, nothing applies and nothing is labelled.

Trap: the check runs on the config transformers *loaded*, not on config.json: a checkpoint written by a fixed
transformers carries the derived field already (5.19 writes ``rope_parameters.partial_rotary_factor`` next to
``rotary_dim``), so the same synthetic family is mended on one host and not on another.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


def _legacy_rotary_dim(cfg: Any) -> dict[str, Any] | None:
    """``rotary_dim`` below ``head_dim`` that the loaded ``rope_parameters`` does not carry as
    ``partial_rotary_factor``: the overrides that carry it, else None."""
    rotary_dim, head_dim = getattr(cfg, "rotary_dim", None), getattr(cfg, "head_dim", None)
    rope = getattr(cfg, "rope_parameters", None)
    if not (rotary_dim and head_dim and isinstance(rope, dict)) or rotary_dim >= head_dim:
        return None
    if "partial_rotary_factor" in rope:
        return None
    return {"rope_parameters": {**rope, "partial_rotary_factor": rotary_dim / head_dim}}


@dataclass(frozen=True)
class ConfigMend:
    """One reference config bug: where it applies, what it is (with the versions measured), how it is mended."""

    label: str
    model_types: tuple[str, ...]
    reason: str
    fix: Callable[[Any], dict[str, Any] | None]  # the loaded config -> overrides where the signature holds

    def overrides(self, cfg: Any) -> dict[str, Any] | None:
        if getattr(cfg, "model_type", None) not in self.model_types:
            return None
        return self.fix(cfg)


CONFIG_MENDS: tuple[ConfigMend, ...] = (
    ConfigMend(
        "partial rotary from rotary_dim", ("minimax_m2",),
        "transformers 5.17.0's MiniMaxM2Config ignores the legacy rotary_dim that released MiniMax-M2 checkpoints "
        "express partial RoPE with (5.18.0 and later derive partial_rotary_factor = rotary_dim / head_dim from it in "
        "convert_rope_params_to_dict), so HF's rotary, and the bridge's, rotate every head_dim dim where the model "
        "(and vLLM's minimax_m2.py, which sets the same factor from rotary_dim) rotates rotary_dim of them: q and k "
        "keep their norms and turn by other angles from attn.hook_rot_q on",
        _legacy_rotary_dim),
)


def config_mend(cfg: Any) -> tuple[ConfigMend, dict[str, Any]] | None:
    """The mend whose signature holds in the loaded ``cfg``, with its overrides; None where none does."""
    for mend in CONFIG_MENDS:
        overrides = mend.overrides(cfg)
        if overrides:
            return mend, overrides
    return None


__all__ = ["CONFIG_MENDS", "ConfigMend", "config_mend"]
