"""Discover a checkpoint's module tree from vLLM's own loaded model, for the generic overlay.

Contract: :func:`generic_overlay(checkpoint, architecture)` boots vLLM once on the checkpoint (no hooks, a
two-token prompt, in its own process like every engine), takes the loaded model's ``(path, class)`` list
(the worker's ``vp_module_tree``) and returns :class:`overlays.generic.GenericDecoderOverlay` on the layout
:func:`overlays.generic.find_layout` finds, or raises :class:`DiscoveryError` saying what vLLM said or what
the tree lacks.  It is called only for an architecture with no declared row (harness.models.targets).

Traps:
- The boot runs on the device a run would use (``auto``: CUDA where torch sees one), in float32 unless the
  checkpoint's config says another dtype; the tree does not depend on the dtype.
- vLLM's tree, not HF's: vLLM may serve an architecture through its Transformers backend, whose tree is
  HF's ``[1, T, d]`` one; the layout check then fails or the rows error, and the report says generic.
"""
from __future__ import annotations

import functools
import json
import shutil
import tempfile
from pathlib import Path

from overlays.generic import GenericDecoderOverlay, NotStandardShape, find_layout

from harness.paths import RUNS_ROOT


class DiscoveryError(ValueError):
    """No generic overlay for a checkpoint: vLLM could not load it, or its tree is not the standard shape."""


def module_tree(checkpoint: Path, timeout_s: float = 600) -> list[tuple[str, str]]:
    """vLLM's loaded model of ``checkpoint`` as ``(dot path, class name)`` pairs: booted once per process and
    checkpoint (the pytest plugin resolves a ``--model-path`` target more than once)."""
    return list(_module_tree(str(Path(checkpoint).resolve()), timeout_s))


@functools.lru_cache(maxsize=16)
def _module_tree(checkpoint_dir: str, timeout_s: float) -> tuple[tuple[str, str], ...]:
    checkpoint = Path(checkpoint_dir)
    import torch

    from harness.engines.engine_request import EngineRequest
    from harness.engines.subject import capture_vllm

    config = json.loads((checkpoint / "config.json").read_text())
    vocab = int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size") or 2)
    RUNS_ROOT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=RUNS_ROOT, prefix="discover-"))
    try:
        request = EngineRequest(checkpoint=str(checkpoint), dtype="float32", prompts=[[1, min(2, vocab - 1)]],
                                vocab_size=vocab, max_model_len=64, reads=[("logits_processor", "out")],
                                full_logprobs=False, ragged=False, discover=True,
                                device="cuda" if torch.cuda.is_available() else "cpu")
        cap = capture_vllm(request, work, timeout_s=timeout_s)
        return tuple(tuple(x) for x in cap.meta.get("module_tree") or [])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def generic_overlay(checkpoint: Path, architecture: str) -> GenericDecoderOverlay:
    """The generic overlay of a checkpoint with no declared row (module doc)."""
    try:
        tree = module_tree(checkpoint)
    except Exception as exc:  # noqa: BLE001 -- vLLM's own reason, said with the architecture
        raise DiscoveryError(f"{architecture} has no declared overlay, and vLLM could not boot the checkpoint to "
                             f"discover its module tree: {str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}"
                             "; declare a row in overlays/__init__.py (docs/adding-an-architecture.md)") from None
    try:
        from harness.engines.vllm_compat import model_implementation

        layout = find_layout(tree, hf_modules=model_implementation(architecture) == "transformers")
    except NotStandardShape as exc:
        raise DiscoveryError(f"{architecture} has no declared overlay, and vLLM's module tree of it is not the "
                             f"standard decoder shape the generic overlay needs: missing {exc}; declare a row "
                             "in overlays/__init__.py (docs/adding-an-architecture.md)") from None
    return GenericDecoderOverlay(layout, declared_kinds=_declared_kinds())


def _declared_kinds() -> int:
    """How many hook kinds the declared Llama-shaped row offers (the report's comparison)."""
    from overlays.decoder_only import DECODER
    from overlays.tree import TreeOverlay
    from harness.vocab.hooks import hook_kind

    cfg = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=32, vocab_size=512, rms_norm_eps=1e-6)

    class _Llama(TreeOverlay):
        tree = DECODER

    ov = _Llama()
    return len({hook_kind(h) for h in [*ov.hook_specs(cfg), *ov.derived_specs(cfg)]} - {"unembed.hook_out"})


__all__ = ["DiscoveryError", "generic_overlay", "module_tree"]
