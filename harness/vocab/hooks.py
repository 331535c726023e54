"""Hook-name vocabulary: the one place that parses ``blocks.{i}.<kind>``.

Contract (pure, no imports of harness or overlays):

* a *hook* is a concrete name (``blocks.3.attn.hook_q``, ``embed.hook_out``);
* a *template* has ``{i}`` where the layer goes (``blocks.{i}.attn.hook_q``);
* a *kind* is the layer-free tail (``attn.hook_q``; layer-free hooks are their own kind).

Trap: a template is matched literally except for ``{i}``, so ``blocks.{i}.mlp.hook_out`` does
not match ``blocks.0.mlp.gate.hook_out``; ``"*"`` matches every hook.
"""
from __future__ import annotations

import re

_LAYER = re.compile(r"^blocks\.(\d+)\.")
_LAYER_OR_TEMPLATE = re.compile(r"^blocks\.(\d+|\{i\})\.")


def layer_of(hook: str) -> int | None:
    """``blocks.3.attn.hook_q`` -> 3; a hook outside the blocks -> None."""
    m = _LAYER.match(hook)
    return int(m.group(1)) if m else None


def hook_kind(hook_or_template: str) -> str:
    """``blocks.3.attn.hook_q`` (or ``blocks.{i}.attn.hook_q``) -> ``attn.hook_q``."""
    return _LAYER_OR_TEMPLATE.sub("", hook_or_template, count=1)


def template_of(hook: str) -> str:
    """``blocks.3.attn.hook_q`` -> ``blocks.{i}.attn.hook_q``."""
    return _LAYER.sub("blocks.{i}.", hook, count=1)


def at_layer(template: str, layer: int | None) -> str:
    """``blocks.{i}.attn.hook_q`` at layer 3 -> ``blocks.3.attn.hook_q`` (a layer-free template as is)."""
    return template if layer is None or "{i}" not in template else template.replace("{i}", str(layer))


def expand_layers(template: str, n_layers: int) -> list[str]:
    """Every concrete hook of ``template`` in a model of ``n_layers`` layers."""
    if "{i}" not in template:
        return [template]
    return [at_layer(template, i) for i in range(n_layers)]


def matches(template: str, hook: str) -> bool:
    """Does ``hook`` instantiate ``template`` (``{i}`` any layer; ``"*"`` every hook)?"""
    if template == "*":
        return True
    return re.fullmatch(re.escape(template).replace(r"\{i\}", r"\d+"), hook) is not None


def split_layer(hook: str) -> tuple[int | None, str]:
    """``blocks.3.mlp.hook_out`` -> ``(3, "mlp.hook_out")``."""
    return layer_of(hook), hook_kind(hook)
