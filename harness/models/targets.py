"""What to test: a synthetic family or a user's checkpoint directory.

Contract: :func:`targets_from_options(model, model_path)` returns
:class:`Target` rows -- name, checkpoint directory, HF architecture, overlay,
HF config, source ("synthetic", "packaged" or "path") and, for a packaged
checkpoint, its ``provenance.json`` -- or raises :class:`TargetError` with a
message naming the bad input and the fix (unknown family, missing directory,
no ``config.json``, a packaged checkpoint's package not installed).  A ``--model-path``
checkpoint whose architecture has no declared overlay runs on the seed's generic overlay, discovered from
vLLM's loaded model (harness.engines.discovery), or gets an error naming what its tree lacks; where vLLM refused to
boot it in the words of a refusal a family row of its architecture declares, it carries that refusal instead, and its
runs re-check it as the row's do.  A ``--model-path``
checkpoint carries the known vLLM bugs its architecture's family rows declare as *candidates*
(``Target.candidate_vllm_bugs``): its run checks each one's signature at any layer, and only one that holds
names the failure (harness.pipeline.runner); and the dtypes those rows declare vLLM refuses
(``Target.candidate_dtype_refusals``): its run in such a dtype boots vLLM first, and is skipped with vLLM's words
where vLLM still refuses it, or runs where it does not (harness.pipeline.refusals); and the refusals those rows
declare that a run's own error can show (``Target.candidate_refusals``: a boot refusal's words, a missing op's name):
a run whose vLLM fails in one's words on its devices is skipped with them, any other failure stays an error.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from overlays import NoImplementationOverlayError, NoOverlayError, Overlay, get_overlay, implementations
from overlays.base import config_get

from harness.models.families import (ModelSpec, Refusal, UnknownFamilyError, dtype_refusal_on,
                                     dtype_refusals_of_architecture, known_bugs_of_architecture, refusal_on,
                                     refusals_of, refusals_of_architecture, resolve_families)


class TargetError(ValueError):
    pass


@dataclass
class Target:
    name: str
    checkpoint: Path | None  # None: a family no checkpoint can be built for (Refusal probe "hf:")
    architecture: str
    overlay: Overlay
    source: str  # "synthetic", "packaged" (a real checkpoint from an installed package) or "path"
    seed: int | None = None
    unsupported_dtypes: dict[str, Refusal | tuple[Refusal, ...]] = field(default_factory=dict)  # the row's, as declared
    # provenance.json of a packaged checkpoint (package, version, file sha256, dequantization); else {}
    provenance: dict[str, Any] = field(default_factory=dict)
    # a --prompts file (harness.models.text_prompts.PromptsFile) its engines run instead of the defaults
    prompts: Any = None
    # vLLM cannot run the architecture on some devices: the family row's declaration as it stands (ModelSpec.refused: a
    # Refusal or one per device); overlay may be None.  Ask refusal_on(variant.device), never this field
    refused: Any = None
    # a bug of vLLM's that fails some dtypes' runs (harness.models.families.KnownVllmBug), its signature re-checked
    known_vllm_bug: Any = None
    # a --model-path checkpoint: the known vLLM bugs its architecture's family rows declare, as candidates
    # (harness.models.families.known_bugs_of_architecture): one explains the run only where its signature holds
    candidate_vllm_bugs: tuple = ()
    # a --model-path checkpoint: dtype -> (family, Refusal(s)) its architecture's family rows declare vLLM refuses, each
    # re-checked by a boot before the run (harness.pipeline.refusals.recheck_candidate_dtype)
    candidate_dtype_refusals: dict[str, tuple[str, Refusal | tuple[Refusal, ...]]] = field(default_factory=dict)
    # a --model-path checkpoint: (family, Refusal) -- the refusals its architecture's family rows declare that a run's
    # own error can show (families.refusals_of_architecture); a run whose vLLM fails in one's words is skipped with them
    candidate_refusals: tuple[tuple[str, Refusal], ...] = ()
    # why a family row has no overlay on the installed vLLM line (overlays.NoImplementationOverlayError): its run is
    # an error carrying this, and the other families run (overlay is None then)
    overlay_error: str = ""

    @property
    def refusals(self) -> tuple[Refusal, ...]:
        """Every Refusal the family row declares (empty for a checkpoint by path, or a family that runs)."""
        return refusals_of(self.refused)

    def refusal_on(self, device: str) -> Refusal | None:
        """The Refusal of a run on ``device`` (``Variant.device``), None where vLLM is declared to run it there."""
        return refusal_on(self.refused, device)

    def dtype_refusal_on(self, dtype: str, device: str) -> Refusal | None:
        """The row's declared refusal of ``dtype`` on ``device``, None where none is declared."""
        return dtype_refusal_on(self.unsupported_dtypes, dtype, device)

    @property
    def overlay_name(self) -> str:
        """The overlay's name for reports; a refused family may have none."""
        if self.overlay is not None:
            return self.overlay.name
        return "no overlay on this vLLM line" if self.overlay_error else "no overlay (declared refused)"

    @cached_property
    def hf_config(self) -> Any:
        from transformers import AutoConfig

        if self.checkpoint is None:  # a family with no checkpoint (Refusal probe "hf:"): never a hub name
            raise TargetError(f"{self.name}: no checkpoint, so no HF config (declared: {self.refusals[0].reason})")
        return AutoConfig.from_pretrained(str(self.checkpoint))

    @property
    def vocab_size(self) -> int:
        return int(config_get(self.hf_config, "vocab_size"))

    @property
    def bos_token_id(self) -> int | None:
        return config_get(self.hf_config, "bos_token_id")

    @property
    def max_model_len(self) -> int:
        return int(min(config_get(self.hf_config, "max_position_embeddings", "n_positions", default=256), 256))


def _architecture(checkpoint: Path) -> str:
    cfg_path = checkpoint / "config.json"
    if not cfg_path.is_file():
        raise TargetError(f"--model-path {checkpoint}: no config.json there; point it at an HF checkpoint directory")
    archs = json.loads(cfg_path.read_text()).get("architectures") or []
    if not archs:
        raise TargetError(f"--model-path {checkpoint}: config.json lists no 'architectures'; add the HF class name")
    return archs[0]


def _overlay(arch: str) -> Overlay:
    """The overlay for ``arch`` as the installed vLLM runs it; vLLM's registry is read only for an
    architecture whose overlays differ by implementation (native model vs Transformers backend)."""
    implementation = "native"
    if implementations(arch) != ("native",):
        from harness.engines.vllm_compat import model_implementation

        implementation = model_implementation(arch)
    return get_overlay(arch, implementation)


def target_for_family(spec: ModelSpec) -> Target:
    from harness.models.gguf_checkpoint import PackagedCheckpointError, read_provenance

    try:
        target = _family_target(spec)
    except PackagedCheckpointError as exc:
        raise TargetError(f"--model {spec.name}: {exc}") from None
    if spec.packaged is not None:
        target = replace(target, source="packaged", provenance=read_provenance(target.checkpoint))
    return target


def _family_target(spec: ModelSpec) -> Target:
    from harness.models.checkpoints import checkpoint_dir

    if not spec.builds_checkpoint:  # transformers has no model_type for it (Refusal "hf:"): nothing to build or load
        return Target(spec.name, None, spec.architecture, None, "synthetic", spec.seed, dict(spec.unsupported_dtypes),
                      refused=spec.refused, known_vllm_bug=spec.known_vllm_bug)
    ckpt = checkpoint_dir(spec)
    arch = _architecture(ckpt)
    overlay_error = ""
    try:
        overlay = _overlay(arch)
    except NoOverlayError:
        if not spec.refusals:
            raise
        overlay = None  # refused (on some devices): where vLLM could run it, the plan says there is no overlay
    except NoImplementationOverlayError as exc:  # this vLLM line runs it otherwise: the family's run is the error
        overlay, overlay_error = None, f"--model {spec.name}: {exc}"
    return Target(spec.name, ckpt, arch, overlay, "synthetic", spec.seed, dict(spec.unsupported_dtypes),
                  refused=spec.refused, known_vllm_bug=spec.known_vllm_bug, overlay_error=overlay_error)


def target_for_path(path: str) -> Target:
    ckpt = Path(path).expanduser().resolve()
    if not ckpt.is_dir():
        raise TargetError(f"--model-path {path}: no such directory; pass a local HF checkpoint directory")
    arch = _architecture(ckpt)
    try:
        overlay = _overlay(arch)
    except NoOverlayError:
        # no declared row: the seed's generic overlay, discovered from vLLM's loaded model (one boot)
        from harness.engines.discovery import DiscoveryError, generic_overlay

        try:
            overlay = generic_overlay(ckpt, arch)
        except DiscoveryError as exc:
            refused = _refused_at_discovery(arch, str(exc))
            if refused is None:
                raise TargetError(f"--model-path {path}: {exc}") from None
            # vLLM refused this very checkpoint in a row's declared words: the row's refusal, re-checked by the run
            return Target(ckpt.name, ckpt, arch, None, "path", refused=refused)
    return Target(ckpt.name, ckpt, arch, overlay, "path", candidate_vllm_bugs=known_bugs_of_architecture(arch),
                  candidate_dtype_refusals=dtype_refusals_of_architecture(arch),
                  candidate_refusals=refusals_of_architecture(arch))


def _refused_at_discovery(architecture: str, error: str) -> Refusal | None:
    """A family row's refusal of ``architecture`` (one that a run's own engine error can show) whose words vLLM's
    boot said while looking up a ``--model-path`` checkpoint's module tree (``error``), naming the row, else None.
    Such a checkpoint has no overlay to run on, and the refusal covers its devices as declared: its runs re-check
    it by booting (harness.pipeline.refusals.recheck_architecture), as the row's do.  That boot is not this one
    again: discovery asks float32 with no run's options (harness.engines.discovery), each re-check asks its run's
    own engine request (dtype, engine options, environment: refusals.probe_request), which may be answered
    otherwise."""
    for family, refusal in refusals_of_architecture(architecture):
        if refusal.run_said_in(error):
            return replace(refusal, reason=f"{refusal.reason} (declared by the family row {family!r}; vLLM refused "
                                           "this checkpoint in those words when its module tree was looked up)")
    return None


def targets_from_options(model: str | None, model_path: str | None) -> list[Target]:
    if model_path:
        targets = [target_for_path(p) for p in model_path.split(",") if p]
        if model:
            targets = [target_for_family(s) for s in _families(model)] + targets
        return targets
    return [target_for_family(s) for s in _families(model)]


def _families(model: str | None) -> list[ModelSpec]:
    try:
        return resolve_families(model)
    except UnknownFamilyError as exc:
        raise TargetError(str(exc)) from None
