"""Hook-name vocabulary: canonical TransformerBridge names and their
HookedTransformer-style aliases served by compatibility mode.

Contract: :func:`compat_alias(hook)` returns the legacy name that holds the
same tensor under ``bridge.enable_compatibility_mode(no_processing=True)``,
or ``None`` where no one-to-one alias exists.  Data only.
"""
from __future__ import annotations

from harness.vocab.hooks import at_layer, layer_of, template_of

# canonical template -> legacy template (one to one, same tensor)
COMPAT_ALIASES: dict[str, str] = {
    "embed.hook_out": "hook_embed",
    "blocks.{i}.hook_in": "blocks.{i}.hook_resid_pre",
    "blocks.{i}.hook_resid_mid": "blocks.{i}.hook_resid_mid",
    "blocks.{i}.hook_out": "blocks.{i}.hook_resid_post",
    "blocks.{i}.attn.hook_out": "blocks.{i}.hook_attn_out",
    "blocks.{i}.mlp.hook_out": "blocks.{i}.hook_mlp_out",
    "blocks.{i}.attn.hook_q": "blocks.{i}.attn.hook_q",
    "blocks.{i}.attn.hook_k": "blocks.{i}.attn.hook_k",
    "blocks.{i}.attn.hook_v": "blocks.{i}.attn.hook_v",
    "blocks.{i}.attn.hook_z": "blocks.{i}.attn.hook_z",
    # compatibility mode masks with -inf where the bridge uses the dtype's min
    # (harness.comparison.derived.ignore_common_mask ignores entries masked on both sides)
    "blocks.{i}.attn.hook_attn_scores": "blocks.{i}.attn.hook_attn_scores",
    "blocks.{i}.attn.hook_pattern": "blocks.{i}.attn.hook_pattern",
    "blocks.{i}.mlp.hook_pre": "blocks.{i}.mlp.hook_pre",
    "blocks.{i}.mlp.hook_post": "blocks.{i}.mlp.hook_post",
    "ln_final.hook_normalized": "ln_final.hook_normalized",
}


def compat_alias(hook: str) -> str | None:
    legacy = COMPAT_ALIASES.get(template_of(hook))
    return None if legacy is None else at_layer(legacy, layer_of(hook))


# Hooks plain HF forward hooks capture, for every architecture (harness.references.reference).
HF_HOOK_TEMPLATES: frozenset[str] = frozenset({"embed.hook_out", "blocks.{i}.hook_in", "blocks.{i}.hook_out"})


def hf_hook(hook: str) -> bool:
    return template_of(hook) in HF_HOOK_TEMPLATES


# A reference hook that fires several times per forward (HRM-Text's looped stacks: one physical layer runs at
# several recurrence steps) is named ``<name>@<n>``: its n-th firing (0 the first) in the forward.
FIRING_SEP = "@"


def at_firing(name: str, call: int) -> str:
    """``name``'s ``call``-th firing per forward, as a reference name."""
    return f"{name}{FIRING_SEP}{int(call)}"


def firing_of(name: str) -> tuple[str, int | None]:
    """``(name, n)`` of a ``<name>@<n>`` reference name; ``(name, None)`` for a hook that fires once."""
    base, sep, call = name.rpartition(FIRING_SEP)
    if not sep:
        return name, None
    if not call.isdigit():
        raise ValueError(f"reference hook name {name!r}: the firing after {FIRING_SEP!r} must be a number")
    return base, int(call)
