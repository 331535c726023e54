"""vLLM activations in HookedTransformer coordinates (compatibility mode with
its default weight processing), as pure functions.

``bridge.enable_compatibility_mode()`` (no arguments) applies
HookedTransformer's weight processing: ``fold_ln``, ``center_writing_weights``,
``center_unembed``, ``fold_value_biases``.  Measured on these machines
(TransformerLens 4.3.0, fp32): for RMSNorm models every residual-stream hook
is unchanged; for LayerNorm models every tensor *written to* the residual
stream -- ``hook_embed``, ``hook_resid_pre/mid/post``, ``hook_attn_out``,
``hook_mlp_out`` -- is centred over ``d_model`` (to 5e-7), because the
writing weights are.  Other hooks move in other ways (``hook_v``/``hook_z``
lose the folded value bias), so only the residual-stream hooks get a
``compat-processed`` row: those are what SAE and probe users read.

Contract: :func:`harness.vocab.hook_rules.processed_hook(hook)` says whether a canonical hook gets a
row (the plan asks it); :func:`to_hooked_coordinates(x, normalization_type)` is the transform
applied to vLLM's value before comparing.
"""
from __future__ import annotations

import torch

CENTRED_NORMS = ("LN", "LNPre")


def to_hooked_coordinates(x: torch.Tensor, normalization_type: str | None) -> torch.Tensor:
    """Centre over the last dim where weight processing centres the writing weights."""
    if normalization_type in CENTRED_NORMS:
        return x - x.mean(dim=-1, keepdim=True)
    return x
