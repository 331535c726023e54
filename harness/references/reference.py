"""Reference engines, in this process: TransformerLens's TransformerBridge
(canonical names), its compatibility mode (HookedTransformer names), and
plain HF transformers (forward hooks on the decoder layers + log-probs).

Contract: :func:`capture_references` returns a :class:`ReferenceCapture`:

* ``bridge[prompt][hook]``, ``compat[prompt][legacy]``, ``hf[prompt][hook]``,
  ``compat_processed[prompt][legacy]`` (compatibility mode with HookedTransformer's
  default weight processing, see :mod:`harness.comparison.processing`)
  -- tensors in canonical layout (batch dim dropped, see :mod:`harness.comparison.shapes`);
* ``logprobs[prompt]`` -- fp64 ``[T, V]`` log-softmax of HF's logits;
* ``floors[engine][hook]`` -- the noise floor of that engine for that hook:
  the worst relative error (over prompts) between the engine in the run dtype
  and the same engine in the truth dtype (see :mod:`harness.comparison.tolerances`).
  Engines: ``bridge``, ``compat``, ``hf`` and ``processed`` -- processed compatibility mode against
  the truth run's compatibility-mode values in hooked coordinates: its weights are folded and then
  rounded to the run dtype, a rounding neither vLLM nor the unprocessed references share, so the
  bridge's floor does not bound it (measured on SmolLM2-135M bf16, AVX2: its worst rows sat 2-4x the
  bridge's floor from vLLM while the bridge's sat 1.2-1.5x; docs/numerics.md).  The ``logprobs``
  floor is measured on the entries the compared row holds: each row's top ``logprob_k`` of the
  truth where vLLM returns its top-k only (a full-vocabulary floor is dominated by the tail's
  large log-probs and read 3x below the top-k's own noise);
* ``chaos`` -- the chaotic tokens the floor run found (harness.comparison.chaos), and the tokens whose
  expert choice an engine's own run-dtype run flipped against its truth-dtype run (``OwnFlip``, the same
  module): the floors leave out the tokens they set aside, as the compared rows do;
* ``meta`` -- boot times, forward latency, top operators; ``meta["phases"]``: seconds per
  phase (harness.phases), in order: ``bridge_boot``, ``compat`` (compatibility mode switched on),
  ``bridge_forward`` (the forwards, reading the canonical and the compatibility-mode names at once),
  ``processed`` (only when asked for), ``truth_bridge`` (the
  truth-dtype bridge and compatibility runs and their floors; sub-phases ``truth_bridge.bridge_boot``,
  ``.compat``, ``.bridge_forward``, ``.floors``), ``hf``, ``hf_timing`` (the latency repeats and the
  profiled forward), ``truth_hf``.  A caller's :class:`~harness.phases.Phases` (``phases=``) receives
  them as they happen, so a crash keeps those already finished.

Memory: the bridge captures (``bridge``, ``compat``, ``compat_processed``, the truth run's) are
:class:`~harness.spill.SpilledTensors` -- on disk, written a few layers per forward
(``SPILL_GROUP_BYTES``), read one tensor at a time -- and one reference model is resident at a
time.  Measured on SmolLM2-135M fp32 (``python benchmarks/bench_real_model.py``): see docs/benchmarks.md.

HF hooks are architecture-agnostic: the decoder layers are the model's
``nn.ModuleList`` whose length is ``num_hidden_layers``; a layer's input
``hidden_states`` is ``blocks.{i}.hook_in`` and its first output is
``blocks.{i}.hook_out``; the input embeddings' output is ``embed.hook_out``.  A Mamba-2 layer's
mixer adds its own (:func:`_ssm_mixer_hooks`, under TransformerBridge's names), and so does a Mamba-1
layer's (:func:`_mamba1_mixer_hooks`).  A layer's attention scores and pattern are HF's own, read at its eager
softmax (:func:`_attention_softmax_hooks`): the ``hf`` reference of the derived ``attn.hook_attn_scores`` /
``attn.hook_pattern``, which gates them where TransformerLens's scores hook holds the pattern (known_issues).

A config the installed transformers reads wrong (:mod:`harness.references.config_mends`: MiniMax-M2's legacy
``rotary_dim`` under transformers 5.17) is mended before every reference model is built, HF's and the bridge's
alike, and ``meta["reference_corrected"]`` says so, as it does for the Mamba-2 group-wise gated norm.

An encoder (the plan's :class:`overlays.base.Encoder`): HF's model is built with its ``hf_class``
(``AutoModelForMaskedLM``) instead of a causal LM, every engine gets the prompts' token types
(``token_type_ids``, the same ones vLLM is given), and a chaotic token sets its whole prompt aside
(bidirectional attention carries it to every position, earlier ones included).
"""
from __future__ import annotations

import functools
import math
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Callable
from collections.abc import Mapping

import torch

from harness.comparison.chaos import ChaoticToken, OwnFlip, find_chaotic, find_own_flips
from harness.comparison.compare import all_finite, compare_tensors, top_k_mask
from harness.comparison.set_aside import mask_from, set_aside
from harness.comparison.derived import ignore_common_mask
from harness.comparison.known_issues import layout_config
from harness.comparison.shapes import reference_to_canonical
from harness.vocab.hook_rules import heads_first
from harness.engines.timing import profile_call
from harness.phases import Phases
from harness.references.config_mends import config_mend
from harness.memory import trim_heap
from harness.spill import SpilledTensors
from harness.values.plan import ReferenceInputs
from harness.vocab.hooks import layer_of
from harness.vocab.hook_names import firing_of
from overlays.hrm_text import unrolled_blocks
from harness.comparison.processing import to_hooked_coordinates
from harness.comparison.tolerances import TORCH_DTYPES, Calibration, calibration_for


@dataclass
class ReferenceCapture:
    bridge: dict[int, dict[str, torch.Tensor]]
    compat: dict[int, dict[str, torch.Tensor]]
    logprobs: dict[int, torch.Tensor]
    hf: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    floors: dict[str, dict[str, float]] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    # the floor run's other statistics: floor_stats["median" | "scale"][engine][hook] (see _floors)
    floor_stats: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    compat_processed: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    # tokens the floor run found chaotic, and own routing flips (harness.comparison.chaos): rows and floors leave them out
    chaos: list[ChaoticToken | OwnFlip] = field(default_factory=list)


def default_pos_axis(hook: str) -> int:
    """The token axis of a canonical reference value when no plan says: attention scores and patterns
    are ``[heads, query, key]``; everything else ``[T, ...]``."""
    return 1 if heads_first(hook) else 0


def _float64_safe(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """HF 5 runs MoE experts with ``torch._grouped_mm`` by default, which rejects
    float64 (the truth dtype): use HF's eager experts there.  No-op for dense models."""
    if dtype == torch.float64 and hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    return model


def round_weights(model: torch.nn.Module, through: torch.dtype | None) -> torch.nn.Module:
    """Round every parameter through ``through`` (e.g. bf16) and back, in place: the truth run then
    computes exactly with the weights both engines hold in the run dtype, so the floor measures the
    run dtype's *compute* noise only, not weight rounding that vLLM and the reference share (measured
    on SmolLM2-135M bf16: weight rounding dominated the floor of deep layers).  Buffers (rotary
    frequencies) keep the truth precision.  ``None``: no-op."""
    if through is not None:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(through).to(p.dtype))
    return model


@lru_cache(maxsize=4)
def _bridge_tokenizer(checkpoint: str):
    """The tokenizer TransformerLens's ``boot_transformers`` would load (its own call, its fallback), once
    per checkpoint and process: every bridge boot of a run (run dtype, processed, truth dtype) and of the
    session's other variants gets it.  The references feed token ids, so it only has to be the one TL
    would build (boot normalizes it with ``configure_tokenizer`` each time, idempotently).  Loading it
    was 2.9 s a boot on gemma3_270m's 262,144-entry vocabulary (cProfile of ``python -m harness run``)."""
    from transformers import AutoTokenizer
    from transformer_lens.utilities.hf_utils import autotokenizer_with_special_token_compat

    try:
        return autotokenizer_with_special_token_compat(checkpoint, auto_tokenizer=AutoTokenizer, add_bos_token=True,
                                                       use_fast=True, token=None, trust_remote_code=False,
                                                       revision=None)
    except ValueError:  # TL's own fallback (a tokenizer without a BOS token)
        return AutoTokenizer.from_pretrained(checkpoint, use_fast=True, trust_remote_code=False)


@lru_cache(maxsize=4)
def _config_mend(checkpoint: str):
    """``(ConfigMend, overrides)`` where the installed transformers reads ``checkpoint``'s config wrong
    (harness.references.config_mends), else None: once per checkpoint and process."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(checkpoint)
    except (OSError, ValueError, KeyError):  # the model's own loader says why, in its words, right after
        return None
    return config_mend(config)


def _boot_bridge(checkpoint: Path, dtype: torch.dtype, device: str, round_through: torch.dtype | None = None):
    from transformer_lens.model_bridge import TransformerBridge

    mended = _config_mend(str(checkpoint))
    bridge = TransformerBridge.boot_transformers(str(checkpoint), device=device, dtype=dtype,
                                                 tokenizer=_bridge_tokenizer(str(checkpoint)),
                                                 **({"hf_config_overrides": mended[1]} if mended else {}))
    _float64_safe(bridge.original_model, dtype)
    round_weights(bridge.original_model, round_through)
    group_wise_gated_norm(bridge.original_model)  # a reference bug corrected downstream (Mamba-2, n_groups > 1)
    return bridge


SPILL_GROUP_BYTES = 512 << 20  # captures one reference forward may hold before they go to disk (SmolLM2 fp32:
# 512 MB keeps the truth run under the weight-processing peak with 3 forwards of the long prompt, not 5)


def _layer_groups(names: set[str]) -> tuple[list[set[str]], set[str]]:
    """``names`` by decoder layer (in layer order), and the names outside every layer."""
    by_layer: dict[int, set[str]] = {}
    other: set[str] = set()
    for n in names:
        layer = layer_of(n)
        (other if layer is None else by_layer.setdefault(layer, set())).add(n)
    return [by_layer[i] for i in sorted(by_layer)], other


class _LayerSize:
    """Bytes one decoder layer's captures take for a prompt of T tokens: ``linear * T + quadratic * T**2``
    (attention scores and patterns hold T x T per head), learnt from the first forward that held a
    whole layer; None until then."""

    def __init__(self) -> None:
        self.linear = self.quadratic = None

    def learn(self, caps: dict[str, torch.Tensor], group: set[str], n_layers: int, t: int) -> None:
        lin = sum(v.nbytes for n, v in caps.items() if n in group and list(v.shape).count(t) < 2)
        quad = sum(v.nbytes for n, v in caps.items() if n in group and list(v.shape).count(t) >= 2)
        self.linear, self.quadratic = lin / n_layers / t, quad / n_layers / t ** 2

    def of(self, t: int) -> float | None:
        return None if self.linear is None else self.linear * t + self.quadratic * t ** 2


def _inputs(tokens: list[int], token_types: list[int] | None, device: str) -> tuple[torch.Tensor, dict]:
    """One prompt's ids ``[1, T]`` and the forward's keyword inputs: its token types, where given."""
    ids = torch.tensor([tokens], device=device)
    return ids, ({} if token_types is None else {"token_type_ids": torch.tensor([token_types], device=device)})


def _plain_mask(name: str, value: torch.Tensor) -> torch.Tensor:
    """A canonical hook's value read in compatibility mode, as the plain bridge gives it.  Measured on
    every synthetic default family in fp32, fp64 and bf16 (TransformerLens 4.3.0): every canonical hook
    is bitwise the same in both modes except ``attn.hook_attn_scores``, whose masked entries are
    ``-inf`` in compatibility mode and ``finfo(dtype).min`` (HF's additive mask) in the plain bridge;
    mapping the one to the other makes them bitwise equal.  tests/unit/references/test_reference.py
    holds the rule; the parity rows prove it (scripts/diff_reports.py: identical rows)."""
    if name.endswith("hook_attn_scores") and value.is_floating_point():
        return value.masked_fill(torch.isneginf(value), torch.finfo(value.dtype).min)
    return value


def _run_cache(bridge, tokens: list[int], names: set[str], device: str, store: SpilledTensors,
               size: _LayerSize | None = None, token_types: list[int] | None = None,
               also: tuple[set[str], SpilledTensors] | None = None, rename: Mapping[str, str] | None = None) -> None:
    """Every hook in ``names`` for one prompt, into ``store`` (on disk), a few layers per forward:
    a forward holds at most about ``SPILL_GROUP_BYTES`` of captures.  A layer's size comes from
    ``size`` (learnt on an earlier prompt of the same pass); without one the first forward takes one
    layer (and the hooks outside the layers) and measures it.  The forwards compute the same values
    (a hook only records; tests/unit/test_spill.py checks it bitwise), so this changes memory, not results.
    ``also``: more names read by the same forwards into a second store (compatibility mode's names,
    :func:`_bridge_and_compat`); ``names`` then go through :func:`_plain_mask`.  ``rename``: a bridge name ->
    the canonical name it is stored under (an overlay's ``("bridge", name)``: HRM-Text's ``<hook>@<n>``)."""
    rename = rename or {}
    legacy, second = also if also is not None else (set(), None)
    wanted_all = set(names) | set(legacy)
    layers, other = _layer_groups(wanted_all)
    size = size or _LayerSize()
    ids, extra = _inputs(tokens, token_types, device)
    t, i = len(tokens), 0
    while i < len(layers) or (i == 0 and other):
        per_layer = size.of(t)
        take = 1 if per_layer is None else max(1, int(SPILL_GROUP_BYTES // max(per_layer, 1)))
        group = set().union(*layers[i:i + take]) if layers else set()
        wanted = group | (other if i == 0 else set())
        with torch.no_grad():
            _, cache = bridge.run_with_cache(ids, names_filter=lambda n: n in wanted, **extra)
        caps = {n: reference_to_canonical(n, cache[n]) for n in wanted if n in cache}
        del cache
        caps.update(_firings(bridge, ids, extra, wanted))
        if layers and per_layer is None:
            size.learn(caps, group, len(layers[i:i + take]), t)
        if second is None:
            store.add({rename.get(n, n): v for n, v in caps.items()})
        else:
            store.add({rename.get(n, n): _plain_mask(n, v) for n, v in caps.items() if n in names})
            second.add({n: v for n, v in caps.items() if n in legacy})
        del caps
        i += take if layers else 1


def _free() -> None:
    """A released model's memory back to the OS now, before the next model loads (harness.memory)."""
    trim_heap()


def _captures(bridge, prompts, names, device, spill: Path, tag: str,
              token_types: list[list[int]] | None = None, legacy: set[str] | None = None,
              rename: Mapping[str, str] | None = None):
    """``names`` for every prompt, spilled under ``spill`` (one mapping per prompt).  With ``legacy``
    (the bridge in compatibility mode): those names too, from the same forwards, returned as a second
    ``{prompt: mapping}`` (tagged ``{tag}-compat``)."""
    out, size = {}, _LayerSize()  # one layer's size, learnt on the first prompt, sizes the others' groups
    second: dict[int, SpilledTensors] = {}
    for p, toks in enumerate(prompts):
        out[p] = SpilledTensors(spill, f"{tag}-{p}")
        also = None
        if legacy is not None:
            second[p] = SpilledTensors(spill, f"{tag}-compat-{p}")
            also = (set(legacy), second[p])
        _run_cache(bridge, toks, names, device, out[p], size, token_types[p] if token_types else None, also, rename)
    return out if legacy is None else (out, second)


def _bridge_and_compat(checkpoint, dtype, prompts, names, legacy, device, round_through=None,
                       phases: Phases | None = None, spill: Path | None = None, tag: str = "bridge",
                       token_types: list[list[int]] | None = None, rename: Mapping[str, str] | None = None):
    """Canonical-name and compatibility-mode (no processing) captures, from one boot and one pass of
    forwards: the mode only adds legacy hook names, it changes no weight, so the bridge is switched to
    it first and every forward reads both name sets (the canonical values as the plain bridge gives
    them: :func:`_plain_mask`).  Before, a second pass of forwards read the legacy names: measured on
    Gemma-3-270M fp32 (2 CPU cores, shared), the bridge's forwards 20.6 s and the compatibility pass
    15.6 s.  ``phases``: where the boot and the forwards are timed (None: not split, the caller times
    the whole; ``compat`` is the mode switch only); ``spill``: the folder the captures go to (harness.spill)."""
    clock = phases or Phases()
    spill = spill or Path(tempfile.mkdtemp(prefix="vp-refs-"))
    with clock("bridge_boot"):
        bridge = _boot_bridge(checkpoint, dtype, device, round_through)
    compat = {}
    if legacy:
        with clock("compat"):
            bridge.enable_compatibility_mode(no_processing=True)
    with clock("bridge_forward"):
        if legacy:
            canonical, compat = _captures(bridge, prompts, names, device, spill, tag, token_types, legacy=set(legacy),
                                          rename=rename)
        else:
            canonical = _captures(bridge, prompts, names, device, spill, tag, token_types, rename=rename)
    del bridge  # its hooks hold reference cycles: collect now, or its weights stay until the next GC
    _free()
    return canonical, compat


def _processed_captures(checkpoint, dtype, prompts, names, device, meta=None, spill: Path | None = None,
                        token_types: list[list[int]] | None = None):
    """Compatibility mode with HookedTransformer's default weight processing (harness.comparison.processing):
    its own boot, since processing rewrites the weights."""
    bridge = _boot_bridge(checkpoint, dtype, device)
    bridge.enable_compatibility_mode()
    if meta is not None:
        meta["normalization_type"] = getattr(bridge.cfg, "normalization_type", None)
    out = _captures(bridge, prompts, names, device, spill or Path(tempfile.mkdtemp(prefix="vp-refs-")), "processed",
                    token_types)
    del bridge
    _free()
    return out


def decoder_layers(model: torch.nn.Module, n_layers: int) -> torch.nn.ModuleList:
    for _, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n_layers and n_layers > 0:
            return mod
    raise LookupError(f"no nn.ModuleList of {n_layers} decoder layers in {type(model).__name__}")


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def _ssm_mixer_hooks(layer: torch.nn.Module, i: int, caps: dict[str, torch.Tensor]) -> list:
    """A Mamba-2 layer's mixer (a ``mixer`` with ``in_proj`` and a gated ``norm``; any other layer: none),
    hooked under TransformerBridge's names (its Mamba-2 adapter calls HF's ``mixer.norm``
    ``inner_norm``): ``mixer.hook_in`` / ``hook_out``, ``mixer.in_proj.hook_out`` and its columns
    ``hook_xBC`` / ``hook_dt`` (HF's ``[.., gate, hidden_states_B_C, dt]``, by HF's own mixer sizes),
    ``mixer.inner_norm.hook_in`` / ``hook_gate`` / ``hook_out`` (overlays/mamba2.py)."""
    mixer = getattr(layer, "mixer", None)
    if mixer is None:  # GraniteMoeHybrid's Mamba layers hold it as ``mamba`` (TL's adapter: the canonical ``mixer``)
        mixer = getattr(layer, "mamba", None)
    if not all(hasattr(mixer, a) for a in ("in_proj", "norm", "conv_dim", "num_heads")):
        return []
    b, heads, conv = f"blocks.{i}.mixer", mixer.num_heads, mixer.conv_dim

    def keep(name, t):
        caps[name] = t.detach().clone()

    def in_proj(mod, args, out):
        keep(f"{b}.in_proj.hook_out", out)
        keep(f"{b}.in_proj.hook_xBC", out[..., -(heads + conv):-heads])
        keep(f"{b}.in_proj.hook_dt", out[..., -heads:])

    def norm(mod, args, kwargs, out):
        keep(f"{b}.inner_norm.hook_in", args[0] if args else kwargs["hidden_states"])
        keep(f"{b}.inner_norm.hook_gate", args[1] if len(args) > 1 else kwargs["gate"])
        keep(f"{b}.inner_norm.hook_out", out)
    return [mixer.register_forward_pre_hook(lambda mod, args, kwargs: keep(
                f"{b}.hook_in", args[0] if args else kwargs["hidden_states"]), with_kwargs=True),
            mixer.register_forward_hook(lambda mod, args, out: keep(f"{b}.hook_out", _first(out))),
            mixer.in_proj.register_forward_hook(in_proj),
            mixer.norm.register_forward_hook(norm, with_kwargs=True)]


def _gdn_mixer_hooks(layer: torch.nn.Module, i: int, caps: dict[str, torch.Tensor]) -> list:
    """A Gated DeltaNet layer's mixer (Qwen3-Next / Qwen3.5's ``linear_attn``; any other layer: none), hooked under
    TransformerBridge's ``GatedDeltaNetBridge`` names, which fire on the bridge's own prefill path only (with a cache,
    as the references run, only its hook_in / hook_out do): the pre-conv q / k / v per head and the write-gate logit,
    as HF's forward splits its projections (Qwen3-Next: HF's own ``fix_query_key_value_ordering``; Qwen3.5: the
    ``[q | k | v]`` columns of ``in_proj_qkv``, ``in_proj_b``; OLMo-Hybrid: ``q_proj`` / ``k_proj`` / ``v_proj`` and
    ``b_proj``, called in that order), and the gated norm's two inputs (``norm``; OLMo-Hybrid's ``o_norm``), the
    recurrence output and z, back in ``[B, T, v_heads, d_v]`` (overlays.tree.GdnMixer)."""
    mixer = getattr(layer, "linear_attn", None)
    gated_norm = getattr(mixer, "norm", None) or getattr(mixer, "o_norm", None)
    if mixer is None or gated_norm is None or not hasattr(mixer, "head_v_dim"):
        return []
    b, hold = f"blocks.{i}.linear_attn", {}

    def keep(name, t):
        caps[name] = t.detach().clone()

    def pre_conv(q, k, v, beta_logit):
        for name, t in (("q", q), ("k", k), ("v", v)):
            keep(f"{b}.hook_{name}_pre_conv", t)
        keep(f"{b}.hook_beta_logit", beta_logit)

    def norm(mod, args, out):
        B, T = hold["shape"]
        keep(f"{b}.hook_recurrence_out", args[0].reshape(B, T, -1, mixer.head_v_dim))
        keep(f"{b}.hook_gate_input", args[1].reshape(B, T, -1, mixer.head_v_dim))

    def mixer_in(mod, args, kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        hold["shape"] = tuple(h.shape[:2])
        keep(f"{b}.hook_in", h)
    handles = [mixer.register_forward_pre_hook(mixer_in, with_kwargs=True),
               mixer.register_forward_hook(lambda mod, args, out: keep(f"{b}.hook_out", _first(out))),
               gated_norm.register_forward_hook(norm)]
    if hasattr(mixer, "in_proj_qkvz"):  # Qwen3-Next: interleaved per key-head group, split by HF's own method
        handles.append(mixer.in_proj_qkvz.register_forward_hook(lambda mod, args, out: hold.__setitem__("qkvz", out)))

        def ba(mod, args, out):
            q, k, v, _, beta_logit, _ = mixer.fix_query_key_value_ordering(hold["qkvz"], out)
            pre_conv(q, k, v, beta_logit)
        handles.append(mixer.in_proj_ba.register_forward_hook(ba))
    elif hasattr(mixer, "in_proj_qkv"):  # Qwen3.5: [q | k | v], b on its own

        def qkv(mod, args, out):
            q, k, v = torch.split(out, [mixer.key_dim, mixer.key_dim, mixer.value_dim], dim=-1)
            hold["qkv"] = (q.reshape(*q.shape[:2], -1, mixer.head_k_dim), k.reshape(*k.shape[:2], -1, mixer.head_k_dim),
                           v.reshape(*v.shape[:2], -1, mixer.head_v_dim))
        handles.append(mixer.in_proj_qkv.register_forward_hook(qkv))
        handles.append(mixer.in_proj_b.register_forward_hook(lambda mod, args, out: pre_conv(*hold["qkv"], out)))
    elif all(hasattr(mixer, f"{p}_proj") for p in "qkvb"):  # OLMo-Hybrid: one projection each, q / k / v before b
        dims = {"q": mixer.head_k_dim, "k": mixer.head_k_dim, "v": mixer.head_v_dim}

        def proj(name):
            return lambda mod, args, out: hold.__setitem__(name, out.reshape(*out.shape[:2], -1, dims[name]))
        handles += [getattr(mixer, f"{p}_proj").register_forward_hook(proj(p)) for p in "qkv"]
        handles.append(mixer.b_proj.register_forward_hook(
            lambda mod, args, out: pre_conv(hold["q"], hold["k"], hold["v"], out)))
    return handles


GROUP_WISE_GATED_NORM = "group-wise gated norm"  # the label of the correction below, in meta and the report
# HF Mamba-2 mixers whose gated norm ignores n_groups (known_issues.GATED_NORM_BUGS, one entry per architecture)
_WHOLE_WIDTH_GATED_NORM_MIXERS = ("Mamba2Mixer", "GraniteMoeHybridMambaLayer")


def group_wise_gated_norm_(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float,
                           n_groups: int) -> torch.Tensor:
    """Mamba-2's gated RMS norm over each of ``n_groups`` equal groups of the last dim: HF's own group-wise
    arithmetic (transformers' ``Zamba2RMSNormGated``, which NemotronH's Mamba-2 mixer uses with
    ``group_size = intermediate_size // n_groups``), as vLLM's ``Mixer2RMSNormGated`` and mamba_ssm's
    ``RMSNormGated(group_size=d_ssm // ngroups)`` compute it."""
    dtype = x.dtype
    h = x.to(torch.float32) * torch.nn.functional.silu(gate.to(torch.float32))
    *prefix, width = h.shape
    g = h.view(*prefix, n_groups, width // n_groups)
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    return weight * g.view(*prefix, width).to(dtype)


def _unwrapped(module):
    """The HF module a TransformerBridge component wraps (the module itself where none does)."""
    return getattr(module, "original_component", None) or module


def group_wise_gated_norm(model: torch.nn.Module) -> str | None:
    """Correct, in this (the reference) process only, the Mamba-2 reference bug of transformers 5.19
    (harness.comparison.known_issues.GATED_NORM_BUGS): ``Mamba2Mixer``'s ``MambaRMSNormGated`` normalizes the
    whole inner width and ignores ``n_groups``.  For every HF Mamba-2 mixer of ``model`` (a plain HF model, or a
    TransformerBridge's ``original_model``) with ``n_groups`` > 1, ``out_proj``'s input is replaced by the
    group-wise gated norm (:func:`group_wise_gated_norm_`) of the inputs HF's norm was called with, its weight and
    eps: the norm module's own output (``inner_norm.hook_out``, in HF and the bridge alike) stays HF's, so that
    row shows the bug and its signature is checked there, while everything downstream (``mixer.hook_out``, the
    stream, the logits) is the model the original Mamba-2 defines.  Idempotent.  Returns the label
    (:data:`GROUP_WISE_GATED_NORM`) where some mixer is corrected, else None (``n_groups`` 1: nothing to
    correct, every row compares as is)."""
    corrected = False
    for mixer in list(model.modules()):
        if (type(mixer).__name__ not in _WHOLE_WIDTH_GATED_NORM_MIXERS
                or int(getattr(mixer, "n_groups", 1) or 1) <= 1):
            continue
        corrected = True
        if getattr(mixer, "_vp_group_wise_norm", False):
            continue
        norm, out_proj = _unwrapped(mixer.norm), _unwrapped(mixer.out_proj)
        seen: dict[str, torch.Tensor] = {}

        def norm_inputs(mod, args, kwargs, _seen=seen):
            _seen["x"] = args[0] if args else kwargs["hidden_states"]
            _seen["gate"] = args[1] if len(args) > 1 else kwargs.get("gate")

        def corrected_input(mod, args, _seen=seen, _norm=norm, _groups=int(mixer.n_groups)):
            if "x" not in _seen or _seen["gate"] is None:
                return None
            fixed = group_wise_gated_norm_(_seen.pop("x"), _seen.pop("gate"), _norm.weight,
                                           _norm.variance_epsilon, _groups)
            return (fixed.to(args[0].dtype), *args[1:])
        norm.register_forward_pre_hook(norm_inputs, with_kwargs=True)
        out_proj.register_forward_pre_hook(corrected_input)
        mixer._vp_group_wise_norm = True
    return GROUP_WISE_GATED_NORM if corrected else None


def _router_choice_hooks(layer: torch.nn.Module, i: int, caps: dict[str, torch.Tensor]) -> list:
    """A router whose output is HF's ``(logits, top-k weights, top-k ids)`` (DeepSeek-V2/V3's ``mlp.gate``; any
    other layer: none), hooked as TransformerLens's router hooks hold the choice, for the rows its bridge lacks
    (overlays/deepseek.py): ``mlp.gate.hook_expert_weights`` ``[T, n_experts]`` (each chosen expert's weight --
    HF's, ``routed_scaling_factor`` included -- at its id, 0 elsewhere) and ``mlp.gate.hook_expert_indices``
    (the ids, sorted by :func:`reference_to_canonical`).  Nemotron-H's MoE is the layer's ``mixer``, its router
    ``mixer.gate`` with the same output: the same two under ``mixer.gate.``, and its logits as
    ``mixer.gate.hook_out``, which TransformerLens's adapter does not offer (overlays/nemotron_h.py)."""
    prefix = f"blocks.{i}.mlp.gate"
    gate = getattr(getattr(layer, "mlp", None), "gate", None)
    if not isinstance(gate, torch.nn.Module) and isinstance(getattr(getattr(layer, "mixer", None), "gate", None),
                                                            torch.nn.Module):
        prefix, gate = f"blocks.{i}.mixer.gate", layer.mixer.gate
    if not isinstance(gate, torch.nn.Module):  # a router HF names mlp.router (AFMoE: overlays/afmoe.py)
        gate = getattr(getattr(layer, "mlp", None), "router", None)
    if not isinstance(gate, torch.nn.Module):  # Llama-4's feed_forward.router (overlays/llama4.py)
        gate = getattr(getattr(layer, "feed_forward", None), "router", None)
    if not isinstance(gate, torch.nn.Module):
        return []

    def hook(mod, args, out):
        if (isinstance(out, tuple) and len(out) == 2 and isinstance(getattr(mod, "top_k", None), int)
                and out[0].shape == out[1].shape):
            # Llama-4's (scores, logits): scores are sigmoid(logit) at the top_k chosen ids and exactly 0 elsewhere
            # (sigmoid(-inf)), already TransformerLens's dense weights; the ids are where they are set
            scores = out[0].reshape(-1, out[0].shape[-1])
            caps[f"blocks.{i}.mlp.gate.hook_expert_weights"] = scores.detach().clone()[None]
            caps[f"blocks.{i}.mlp.gate.hook_expert_indices"] = scores.topk(mod.top_k, dim=-1).indices.detach().clone()[None]
            return
        if not (isinstance(out, tuple) and len(out) == 3 and not out[2].is_floating_point()):
            return
        logits, weights, ids = (t.reshape(-1, t.shape[-1]) for t in out)
        dense = torch.zeros(logits.shape, dtype=weights.dtype, device=weights.device).scatter_(1, ids.long(), weights)
        caps[f"{prefix}.hook_expert_weights"] = dense.detach().clone()[None]
        caps[f"{prefix}.hook_expert_indices"] = ids.detach().clone()[None]
        if prefix.endswith(".mixer.gate"):
            caps[f"{prefix}.hook_out"] = logits.detach().clone()[None]
    return [gate.register_forward_hook(hook)]


def _latent_norm_hooks(layer: torch.nn.Module, i: int, caps: dict[str, torch.Tensor]) -> list:
    """MLA's q latent norm (DeepSeek's ``self_attn.q_a_layernorm``; any other layer: none), as TL's
    ``hook_normalized``: HF's output over its weight, the un-fold vLLM's side gets too (overlays/deepseek.py)."""
    norm = getattr(getattr(layer, "self_attn", None), "q_a_layernorm", None)
    if not isinstance(norm, torch.nn.Module) or getattr(norm, "weight", None) is None:
        return []

    def hook(mod, args, out):
        caps[f"blocks.{i}.attn.q_a_layernorm.hook_normalized"] = (out / mod.weight).detach().clone()
    return [norm.register_forward_hook(hook)]


def _unweighted(norm: torch.nn.Module, out: torch.Tensor) -> torch.Tensor:
    """An RMS norm's output over its learned weight (Jamba's dt / B / C norms: TL's ``hook_normalized``); a norm
    without a learned weight (FalconMamba's weightless norms, whose dummy weight is a buffer) as is."""
    weight = getattr(norm, "weight", None)
    return out / weight if isinstance(weight, torch.nn.Parameter) else out


def _mamba1_mixer_hooks(layer: torch.nn.Module, i: int, caps: dict[str, torch.Tensor]) -> list:
    """A Mamba-1 layer's mixer (a ``mixer`` with ``in_proj``, ``x_proj`` and ``out_proj``; any other layer:
    none), hooked under TransformerBridge's names (overlays/mamba.py): ``mixer.hook_in`` / ``hook_out``,
    ``in_proj.hook_out``, ``x_proj.hook_in`` (the conv's SiLU'd output) / ``hook_out``, ``out_proj.hook_in``
    (the gated scan output).  HF never calls ``conv1d`` or ``dt_proj`` as modules.  FalconMamba's weightless
    RMS norms on dt, B and C (``dt_layernorm`` / ``b_layernorm`` / ``c_layernorm``, overlays/falcon_mamba.py), where
    the mixer has them: ``<norm>.hook_normalized``, the module's output (over its weight where it has a learned one:
    Jamba's, overlays/jamba.py).  Jamba's Mamba layers hold the mixer as ``mamba``."""
    mixer = getattr(layer, "mixer", None)
    if mixer is None:  # Jamba's Mamba layers hold it as ``mamba`` (TL's adapter: the canonical ``mixer``)
        mixer = getattr(layer, "mamba", None)
    if not all(hasattr(mixer, a) for a in ("in_proj", "x_proj", "dt_proj", "out_proj")):
        return []
    b = f"blocks.{i}.mixer"

    def keep(name, t):
        caps[name] = t.detach().clone()

    def x_proj(mod, args, out):  # a forward hook's return value would replace the output: return None
        keep(f"{b}.x_proj.hook_in", args[0])
        keep(f"{b}.x_proj.hook_out", out)
    norms = [mixer.get_submodule(n).register_forward_hook(lambda mod, args, out, _n=n: keep(
                 f"{b}.{_n}.hook_normalized", _unweighted(mod, out)))
             for n in ("dt_layernorm", "b_layernorm", "c_layernorm") if hasattr(mixer, n)]
    return [mixer.register_forward_pre_hook(lambda mod, args, kwargs: keep(
                f"{b}.hook_in", args[0] if args else kwargs["hidden_states"]), with_kwargs=True),
            mixer.register_forward_hook(lambda mod, args, out: keep(f"{b}.hook_out", _first(out))),
            mixer.in_proj.register_forward_hook(lambda mod, args, out: keep(f"{b}.in_proj.hook_out", out)),
            mixer.x_proj.register_forward_hook(x_proj),
            *norms,
            mixer.out_proj.register_forward_pre_hook(lambda mod, args: keep(f"{b}.out_proj.hook_in", args[0]))]


_SOFTMAX = torch.nn.functional.softmax  # the function :func:`_attention_softmax_hooks` stands in for, and restores


def _attention_softmax_hooks(layer: torch.nn.Module, i: int, caps: dict[str, torch.Tensor], n_tokens: int) -> list:
    """HF's own attention scores and pattern of a layer, read where its eager attention takes the softmax:
    while the layer runs, ``torch.nn.functional.softmax`` (which every eager attention of the matrix calls by
    that attribute) records its input as ``attn.hook_attn_scores`` and its output as ``attn.hook_pattern``
    (``[heads, T, T]`` once the batch is dropped: after HF's scale, soft-cap, ALiBi and additive mask, masked
    keys at the dtype's most negative value, which the derived rows' mask rule treats as masked).

    Traps: only a softmax over the last dim of a 4-D ``[batch, heads, T, T]`` input counts (a router's softmax is
    2-D; a sink column makes it ``T + 1`` wide and is not recorded: Tree.scores_not_in_hf); a layer with two such
    calls records neither (no single tensor is the layer's); the function is restored after the layer even if its
    forward raises (and by :func:`_hf_run`'s ``finally``)."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def tapped(x, *args, **kwargs):
        out = _SOFTMAX(x, *args, **kwargs)
        dim = kwargs.get("dim", args[0] if args else None)
        if (isinstance(x, torch.Tensor) and x.dim() == 4 and dim in (-1, 3)
                and x.shape[-1] == x.shape[-2] == n_tokens):
            seen.append((x.detach().clone(), out.detach().clone()))
        return out

    def pre(mod, args, kwargs):
        seen.clear()
        torch.nn.functional.softmax = tapped

    def post(mod, args, kwargs, out):
        torch.nn.functional.softmax = _SOFTMAX
        if len(seen) == 1:
            caps[f"blocks.{i}.attn.hook_attn_scores"], caps[f"blocks.{i}.attn.hook_pattern"] = seen[0]
        seen.clear()
    return [layer.register_forward_pre_hook(pre, with_kwargs=True),
            layer.register_forward_hook(post, with_kwargs=True, always_call=True)]


def _firings(bridge, ids: torch.Tensor, extra: dict, wanted: set[str]) -> dict[str, torch.Tensor]:
    """The ``<hook>@<n>`` names among ``wanted`` (harness.vocab.hook_names.firing_of): the n-th firing of a hook
    that fires several times per forward (HRM-Text's looped stacks), from one more forward that keeps every
    firing in order (run_with_cache keeps one value per hook name)."""
    picks = {n: firing_of(n) for n in wanted}
    picks = {n: (base, call) for n, (base, call) in picks.items() if call is not None}
    if not picks:
        return {}
    fired: dict[str, list[torch.Tensor]] = {}

    def keep(value, hook, name):  # keyed by the name asked for: an alias fires as the hook it aliases
        fired.setdefault(name, []).append(value.detach().clone())  # return None: a value would replace the output

    with torch.no_grad():
        bridge.run_with_hooks(ids, fwd_hooks=[(base, functools.partial(keep, name=base))
                                              for base in sorted({b for b, _ in picks.values()})], **extra)
    return {n: reference_to_canonical(base, fired[base][call]) for n, (base, call) in picks.items()
            if call < len(fired.get(base, ()))}


def _looped_block_hooks(model: torch.nn.Module, blocks, caps: dict[str, torch.Tensor]) -> list:
    """``blocks.{b}.hook_in`` / ``hook_out`` of unrolled looped stacks (overlays.hrm_text.unrolled_blocks): block
    ``b`` is call ``blocks[b].call`` of its stack layer, counted per forward by that layer's hooks."""
    handles = []
    by_module: dict[str, dict[int, int]] = {}
    for b, blk in enumerate(blocks):
        by_module.setdefault(blk.module, {})[blk.call] = b
    for path, block_of_call in by_module.items():
        layer, seen = model.get_submodule(path), [0, 0]

        def pre(mod, args, kwargs, _blocks=block_of_call, _seen=seen):
            h = args[0] if args else kwargs["hidden_states"]
            caps[f"blocks.{_blocks[_seen[0]]}.hook_in"] = h.detach().clone()
            _seen[0] += 1

        def post(mod, args, kwargs, out, _blocks=block_of_call, _seen=seen):
            caps[f"blocks.{_blocks[_seen[1]]}.hook_out"] = _first(out).detach().clone()
            _seen[1] += 1
        handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(layer.register_forward_hook(post, with_kwargs=True))
    return handles


def _hf_module_reads(model: torch.nn.Module, reads: tuple, caps: dict[str, torch.Tensor]) -> list:
    """The overlay's HF module reads (overlays.base.Overlay.hf_reads: ``(hook, HookSpec)`` pairs, read ``out`` or
    ``in[0]`` at a module of HF's model), converted with HF's own parameters (a LayerNorm un-folded by HF's weight),
    into ``caps`` under the hook's name, the batch dim kept (the caller's reference_to_canonical drops it)."""
    from harness.comparison.conversions import convert

    params = dict(model.named_parameters())
    handles = []
    for name, spec in reads:
        if spec.read not in ("out", "in[0]"):
            raise ValueError(f"HF read {spec.read!r} of {name}: only 'out' and 'in[0]' are read at HF's modules")

        def keep(value, _name=name, _spec=spec):
            caps[_name] = convert(_spec, value.detach(), params).detach().clone()
        module = model.get_submodule(spec.module)
        handles.append(module.register_forward_hook(lambda mod, args, out, _k=keep: _k(out)) if spec.read == "out"
                       else module.register_forward_pre_hook(lambda mod, args, _k=keep: _k(args[0])))
    return handles


def _hf_run(model, tokens: list[int], device: str, n_layers: int,
            token_types: list[int] | None = None, output: str = "logits",
            reads: tuple = ()) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """HF's hooks and the log-softmax of its per-token output: the logits, or (``output`` "hidden": an encoder vLLM
    serves without its head, overlays.base.Encoder.output) its last hidden state; ``reads``: the overlay's HF module
    reads (:func:`_hf_module_reads`)."""
    caps: dict[str, torch.Tensor] = {}
    handles = []
    looped = unrolled_blocks(model.config)  # HRM-Text: each block is one call of a stack layer
    if looped is not None:
        handles += _looped_block_hooks(model, looped, caps)
    for i, layer in enumerate(decoder_layers(model, n_layers) if looped is None else ()):
        def pre(mod, args, kwargs, _i=i):
            h = args[0] if args else kwargs["hidden_states"]
            caps[f"blocks.{_i}.hook_in"] = h.detach().clone()

        def post(mod, args, kwargs, out, _i=i):
            caps[f"blocks.{_i}.hook_out"] = _first(out).detach().clone()
        handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(layer.register_forward_hook(post, with_kwargs=True))
        handles += _ssm_mixer_hooks(layer, i, caps)
        handles += _mamba1_mixer_hooks(layer, i, caps)
        handles += _gdn_mixer_hooks(layer, i, caps)
        handles += _router_choice_hooks(layer, i, caps)
        handles += _latent_norm_hooks(layer, i, caps)
        handles += _attention_softmax_hooks(layer, i, caps, len(tokens))
    handles.append(model.get_input_embeddings().register_forward_hook(
        lambda mod, args, out: caps.__setitem__("embed.hook_out", out.detach().clone())))
    handles += _hf_module_reads(model, reads, caps)
    try:
        with torch.no_grad():
            ids, extra = _inputs(tokens, token_types, device)
            if output == "hidden":
                out = model(ids, output_hidden_states=True, **extra)
                last = getattr(out, "last_hidden_state", None)
                logits = (last if last is not None else out.hidden_states[-1])[0]
            else:
                logits = model(ids, **extra).logits[0]
    finally:
        torch.nn.functional.softmax = _SOFTMAX
        for h in handles:
            h.remove()
    return ({k: reference_to_canonical(k, v) for k, v in caps.items()},
            torch.log_softmax(logits.double(), dim=-1).cpu())


def _load_hf(checkpoint: Path, dtype: torch.dtype, device: str, round_through: torch.dtype | None = None,
             hf_class: str = "AutoModelForCausalLM"):
    """HF's model of ``checkpoint``, built by ``hf_class`` (an encoder's: ``AutoModelForMaskedLM``)."""
    import transformers

    # eager: HF's reference attention.  Its default (sdpa) silently drops Gemma-2's
    # attention-logit soft-capping (measured: 0.38 max logit difference on the
    # synthetic gemma2); TransformerBridge and vLLM both apply it.
    # on a GPU, loaded straight there: loading on the host first made the 8B-shaped model's fp64 truth
    # run peak at 80 GB of host memory (docs/gpu/evidence/llama3-8b-shaped-fp32)
    where = {"device_map": device} if device.startswith("cuda") else {}
    mended = _config_mend(str(checkpoint))
    if mended:  # harness.references.config_mends: the config as the checkpoint defines it
        config = transformers.AutoConfig.from_pretrained(str(checkpoint))
        for key, value in mended[1].items():
            setattr(config, key, value)
        where["config"] = config
    model = getattr(transformers, hf_class).from_pretrained(str(checkpoint), dtype=dtype, attn_implementation="eager",
                                                            **where)
    group_wise_gated_norm(model)  # a reference bug corrected downstream (Mamba-2, n_groups > 1)
    return round_weights(_float64_safe(model, dtype), round_through).to(device).eval()


def _nonfinite(t: torch.Tensor) -> bool:
    """NaN or +inf anywhere (-inf is a legitimate attention mask)."""
    if not t.is_floating_point() or all_finite(t):  # one reduction for the common case
        return False
    return bool((torch.isnan(t) | (t == math.inf)).any())


def _floors(run: dict[int, dict[str, torch.Tensor]], truth: dict[int, dict[str, torch.Tensor]],
            chaos: list[ChaoticToken | OwnFlip] = (), pos_axis: Callable[[str], int] = default_pos_axis,
            logprob_k: int | None = None, left_out: Mapping[str, torch.Tensor] | None = None,
            ) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Per hook, over prompts: the worst row's relative error, the largest per-prompt median row
    error, and the largest (by size, signed) per-prompt median scale deviation of ``run`` from ``truth``;
    without the tokens a chaotic token or an own routing flip sets aside (the rows compared with vLLM leave them
    out too).
    ``logprob_k``: the ``logprobs`` rows on the truth's top-k entries only, as vLLM returns them.
    ``left_out``: hook -> last-dim mask of the entries the compared rows leave out (a un-fold whose
    divisor is 0: harness.comparison.conversions.left_out); the floor leaves them out too, since
    such an entry can hold most of a row's norm (measured on Gemma-3-270M: 93-97 %)."""
    worst: dict[str, float] = {}
    median: dict[str, float] = {}
    scale: dict[str, float] = {}
    for p, hooks in run.items():
        for name, value in hooks.items():
            if name in truth.get(p, {}) and value.shape == truth[p][name].shape:
                if _nonfinite(value) or _nonfinite(truth[p][name]):
                    # NaN would be ignored as "not returned" by compare_tensors: the floor would read 0
                    worst[name] = median[name] = scale[name] = math.nan
                    continue
                if worst.get(name, 0.0) != worst.get(name, 0.0):  # a NaN floor stays NaN
                    continue
                # masked attention scores hold each dtype's own most negative value: ignore them
                ref = ignore_common_mask(value, truth[p][name])
                if name == "logprobs" and logprob_k:  # after the non-finite check: the mask is NaN
                    ref = top_k_mask(ref, logprob_k)
                dead = (left_out or {}).get(name)
                if dead is not None and ref.shape[-1] == dead.shape[0]:
                    ref = torch.where(dead.to(ref.device), torch.full_like(ref, math.nan), ref)
                aside = set_aside(name, [c for c in chaos if c.prompt == p]).get(p)
                if aside is not None:
                    if aside.token == 0:
                        continue
                    ref = mask_from(ref, aside.token, pos_axis(name))
                m = compare_tensors(value, ref)
                worst[name] = max(worst.get(name, 0.0), m.rel_err)
                median[name] = max(median.get(name, 0.0), m.rel_median)
                scale[name] = max(scale.get(name, 0.0), m.scale_median, key=abs)
    return worst, median, scale


def capture_references(checkpoint: Path, *, dtype: str, calibration: Calibration, prompts: list[list[int]],
                       hooks: list[str], compat_names: list[str], device: str = "cpu", timing_repeats: int = 5,
                       processed_names: list[str] = (),
                       calibrate: bool = True, phases: Phases | None = None,
                       pos_axis: Callable[[str], int] = default_pos_axis,
                       spill_root: Path | None = None, logprob_k: int | None = None,
                       left_out: Mapping[str, torch.Tensor] | None = None,
                       inputs: ReferenceInputs = ReferenceInputs(),
                       routers: Mapping[str, tuple] | None = None,
                       bridge_names: Mapping[str, str] | None = None) -> ReferenceCapture:
    """``calibration``: the run dtype's (harness.comparison.gate.Gate.dtype_calibration): its truth dtype
    and ceiling.  ``logprob_k``: vLLM returns each row's top-k log-probs only (None: the whole vocabulary), and the
    ``logprobs`` floor is measured on the truth's top-k entries, as the compared row is.  ``pos_axis``: the token axis of a hook's canonical value (harness.values.plan.Plan.pos_axis),
    for setting chaotic tokens aside in the floors.  The captures go to disk as they are made
    (harness.spill), in a folder under ``spill_root`` (default: the system's temporary folder); each
    mapping deletes its shards when it is garbage-collected, and the last one the folder.
    ``inputs``: the model's inputs beyond the token ids (harness.values.plan.ReferenceInputs: HF's class,
    causal or bidirectional attention, token types; the defaults are a causal LM's; module doc).  ``routers``: the
    references' router-logit hooks (any engine's name) -> ``(k, overlays.base.Routing or None)``, whose choice in the
    run dtype against the truth dtype finds the references' own routing flips (harness.comparison.chaos).
    ``bridge_names``: a name in ``hooks`` the bridge knows -> the canonical name its capture is stored under."""
    spill = Path(tempfile.mkdtemp(prefix="vp-refs-", dir=spill_root))
    try:
        job = _Job(checkpoint, TORCH_DTYPES[dtype], TORCH_DTYPES[calibration.truth_dtype], calibration.ceiling, prompts,
                   device, spill, phases or Phases(), pos_axis, logprob_k, left_out, inputs, routers, bridge_names)
        job.meta["truth_dtype"] = calibration.truth_dtype
        want, legacy = set(hooks), set(compat_names)
        if calibrate:  # every layer's residual output: where the floor run finds chaotic tokens
            want |= {f"blocks.{i}.hook_out" for i in range(_n_layers(checkpoint))}
        # TransformerLens has no adapter for the architecture (ReferenceInputs.bridge): HF alone, its floors and chaos
        bridge, compat, processed = (_run_dtype_bridge_side(job, want, legacy, set(processed_names)) if inputs.bridge
                                     else ({}, {}, {}))
        floors: dict[str, dict[str, float]] = {}
        stats: dict[str, dict[str, dict[str, float]]] = {"median": {}, "scale": {}}
        chaos: list[ChaoticToken | OwnFlip] = []
        if calibrate and inputs.bridge:
            chaos = _bridge_side_floors(job, want, legacy, bridge, compat, processed, floors, stats)
        hf, logprobs, n_layers = _run_dtype_hf(job, timing_repeats)
        if calibrate:
            chaos = _hf_floors(job, hf, logprobs, n_layers, chaos, floors, stats)
        job.meta["phases"] = job.clock.own()
        return ReferenceCapture(bridge, compat, logprobs, hf, floors, job.meta, compat_processed=processed,
                                floor_stats=stats, chaos=chaos)
    finally:  # a folder no capture was written to (the run stopped first): gone now, not left in /tmp
        try:
            spill.rmdir()  # only when empty: the shards in it are their mappings', deleted with them
        except OSError:
            pass


@dataclass
class _Job:
    """What every step of one reference capture reads: the inputs, the clock, the spill folder, and
    the ``meta`` each step adds to."""

    checkpoint: Path
    dtype: torch.dtype
    truth_dtype: torch.dtype
    ceiling: float
    prompts: list[list[int]]
    device: str
    spill: Path
    clock: Phases
    pos_axis: Callable[[str], int]
    logprob_k: int | None
    left_out: Mapping[str, torch.Tensor] | None
    inputs: ReferenceInputs = ReferenceInputs()
    routers: Mapping[str, tuple] | None = None
    bridge_names: Mapping[str, str] | None = None
    meta: dict = field(default_factory=dict)

    def types(self, p: int) -> list[int] | None:
        return self.inputs.types(p)

    @property
    def token_types(self) -> list[list[int]] | None:
        return None if self.inputs.token_types is None else [list(t) for t in self.inputs.token_types]


def _run_dtype_bridge_side(job: _Job, want: set[str], legacy: set[str], processed_names: set[str]):
    """The bridge, compatibility mode and processed compatibility mode, in the run's dtype."""
    bridge, compat = _bridge_and_compat(job.checkpoint, job.dtype, job.prompts, want, legacy, job.device,
                                        phases=job.clock, spill=job.spill, token_types=job.token_types,
                                        rename=job.bridge_names)
    # bridge_s (boot and every forward, compatibility mode included): older reports' key, kept
    job.meta["bridge_s"] = sum(job.clock.own().get(k, 0.0) for k in ("bridge_boot", "bridge_forward", "compat"))
    job.meta["bridge_boot_s"] = job.clock.own().get("bridge_boot")
    processed: dict = {}
    try:
        if processed_names:
            with job.clock("processed"):
                processed = _processed_captures(job.checkpoint, job.dtype, job.prompts, processed_names, job.device,
                                                meta=job.meta, spill=job.spill, token_types=job.token_types)
    except Exception as exc:  # noqa: BLE001 -- processing unsupported for this architecture: rows say so
        processed, job.meta["processed_error"] = {}, f"{type(exc).__name__}: {exc}"
    return bridge, compat, processed


def _bridge_side_floors(job: _Job, want, legacy, bridge, compat, processed, floors, stats
                        ) -> list[ChaoticToken | OwnFlip]:
    """The bridge side's truth-dtype run: the chaotic tokens (the bridge's own run-dtype error above the
    ceiling), the tokens whose expert choice the bridge's or compatibility mode's own run flipped (their
    run-dtype choice vs their truth-dtype one: a router TransformerLens names otherwise is compatibility mode's
    only), and the bridge, compatibility-mode and processed floors, into ``floors`` / ``stats``."""
    truth_clock = job.clock.child("truth_bridge")
    with job.clock("truth_bridge"):
        truth, truth_compat = _bridge_and_compat(job.checkpoint, job.truth_dtype, job.prompts, want, legacy,
                                                 job.device, round_through=job.dtype, phases=truth_clock,
                                                 spill=job.spill, tag="truth", token_types=job.token_types,
                                                 rename=job.bridge_names)
        with truth_clock("floors"):
            chaos = find_chaotic(bridge, truth, job.ceiling)
            chaos += _own_flips((bridge, truth), (compat, truth_compat), routers=job.routers)
            if not job.inputs.causal:  # every position attends to a chaotic token: its whole prompt is set aside
                chaos = [replace(c, token=0) for c in chaos]
            floors["bridge"], stats["median"]["bridge"], stats["scale"]["bridge"] = _floors(
                bridge, truth, chaos, job.pos_axis, left_out=job.left_out)
            if legacy:  # compatibility mode computes some hooks its own way: its own noise floor
                floors["compat"], stats["median"]["compat"], stats["scale"]["compat"] = _floors(
                    compat, truth_compat, chaos, job.pos_axis, left_out=job.left_out)
            if processed:  # processed weights are rounded after folding: their own floor (module doc)
                floors["processed"], stats["median"]["processed"], stats["scale"]["processed"] = _floors(
                    processed, _hooked(truth_compat, processed, job.meta.get("normalization_type")), chaos,
                    job.pos_axis, left_out=job.left_out)
        del truth, truth_compat
    return chaos


def _run_dtype_hf(job: _Job, timing_repeats: int):
    """Plain HF in the run's dtype: every prompt's hooks and log-probs, then its forward latency."""
    with job.clock("hf"):
        hf_model = _load_hf(job.checkpoint, job.dtype, job.device, hf_class=job.inputs.hf_class)
        n_layers = int(getattr(hf_model.config, "num_hidden_layers", 0) or 0)
        job.meta["layout_config"] = layout_config(hf_model.config)  # where a reference layout bug can show
        corrected = [GROUP_WISE_GATED_NORM] if group_wise_gated_norm(hf_model) else []  # every reference ran so
        mended = _config_mend(str(job.checkpoint))  # (the function's doc; harness.references.config_mends)
        corrected += [f"{mended[0].label} ({mended[0].reason})"] if mended else []
        if corrected:
            job.meta["reference_corrected"] = "; ".join(corrected)
        hf, logprobs = {}, {}
        for p, toks in enumerate(job.prompts):
            hf[p], logprobs[p] = _hf_run(hf_model, toks, job.device, n_layers, job.types(p), job.inputs.output,
                                         job.inputs.hf_reads)
    with job.clock("hf_timing"):
        _time_hf(hf_model, job.prompts[0], job.device, timing_repeats, job.meta, job.types(0))
    del hf_model  # before the truth-dtype model loads: one reference model resident at a time
    _free()
    return hf, logprobs, n_layers


def _own_flips(*pairs, routers=None, known=()) -> list[OwnFlip]:
    """The own routing flips of each ``(run, truth)`` pair of one engine's captures, less those ``known``
    already holds (the same prompt, layer and token); ``routers``: as :func:`capture_references`'s."""
    seen = {(e.prompt, e.layer, e.token) for e in known if isinstance(e, OwnFlip)}
    out = []
    for run, truth in pairs:
        for f in find_own_flips(run, truth, routers):
            if (f.prompt, f.layer, f.token) not in seen:
                seen.add((f.prompt, f.layer, f.token))
                out.append(f)
    return out


def _hf_floors(job: _Job, hf, logprobs, n_layers: int, chaos, floors, stats) -> list[ChaoticToken | OwnFlip]:
    """HF's truth-dtype run and the ``hf`` floors (log-probs included), into ``floors`` / ``stats``; ``chaos``
    with HF's own routing flips added (its run-dtype choice vs its truth-dtype one, where HF's hooks hold it)."""
    with job.clock("truth_hf"):
        truth_model = _load_hf(job.checkpoint, job.truth_dtype, job.device, round_through=job.dtype,
                               hf_class=job.inputs.hf_class)
        truth_hf = {}
        for p, toks in enumerate(job.prompts):
            truth_hf[p], lp = _hf_run(truth_model, toks, job.device, n_layers, job.types(p), job.inputs.output,
                                      job.inputs.hf_reads)
            truth_hf[p]["logprobs"] = lp
        del truth_model
        _free()
        own = _own_flips((hf, truth_hf), routers=job.routers, known=chaos)
        chaos = list(chaos) + [replace(f, token=0) if not job.inputs.causal else f for f in own]
        if not job.inputs.bridge:  # HF is the only reference (ReferenceInputs.bridge): its own chaotic tokens
            chaos += [replace(c, token=0) if not job.inputs.causal else c
                      for c in find_chaotic(hf, truth_hf, job.ceiling)]
        floors["hf"], stats["median"]["hf"], stats["scale"]["hf"] = _floors(
            {p: {**hf[p], "logprobs": logprobs[p]} for p in hf}, truth_hf, chaos, job.pos_axis, job.logprob_k,
            job.left_out)
    return chaos


class _Hooked(Mapping):
    """One prompt's truth compatibility-mode values in hooked coordinates, converted when read (one
    tensor at a time, as the spilled captures are read)."""

    def __init__(self, values: Mapping, normalization_type: str | None) -> None:
        self.values, self.normalization_type = values, normalization_type

    def __getitem__(self, name: str) -> torch.Tensor:
        return to_hooked_coordinates(self.values[name].double(), self.normalization_type)

    def __iter__(self):
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)


def _hooked(truth_compat, processed, normalization_type) -> dict[int, Mapping]:
    """The truth run's compatibility-mode values, in hooked coordinates, for each prompt of ``processed``:
    what processed compatibility mode computes in exact arithmetic (harness.comparison.processing)."""
    return {p: _Hooked(truth_compat.get(p, {}), normalization_type) for p in processed}


def _n_layers(checkpoint: Path) -> int:
    from transformers import AutoConfig

    return int(getattr(AutoConfig.from_pretrained(str(checkpoint)), "num_hidden_layers", 0) or 0)


def _time_hf(hf_model, tokens: list[int], device: str, repeats: int, meta: dict,
             token_types: list[int] | None = None) -> None:
    """HF's forward latency (median of ``repeats`` after a warm-up) and its top operators, into ``meta``."""
    ids, extra = _inputs(tokens, token_types, device)
    with torch.no_grad():
        hf_model(ids, **extra)  # warm-up
        times = []
        for _ in range(repeats):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            hf_model(ids, **extra)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        meta["forward_ms_median"] = statistics.median(times) * 1e3
        meta["forward_ms_all"] = [x * 1e3 for x in times]
        meta["top_ops"] = profile_call(lambda: hf_model(ids, **extra))


def tf32_floors(checkpoint: Path, prompts: list[list[int]], hooks: list[str], device: str,
                logprob_k: int | None = None, inputs: ReferenceInputs = ReferenceInputs(),
                routers: Mapping[str, tuple] | None = None) -> "ReferenceCapture":
    """The references' own distance from fp64 with their fp32 matmuls in TF32: the floors of the
    ``float32-tf32`` gate (harness.comparison.tolerances).  TF32 error grows with depth and through
    the softmax, so one constant cannot gate every hook; the compared references themselves stay IEEE.
    ``inputs``, ``routers``: as :func:`capture_references`'s (an encoder's; the routers' rules)."""
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    matmul.allow_tf32 = True
    try:
        return capture_references(checkpoint, dtype="float32", calibration=calibration_for("float32"), prompts=prompts,
                                  hooks=hooks, compat_names=[],
                                  device=device, timing_repeats=1, logprob_k=logprob_k, inputs=inputs,
                                  routers=routers)
    finally:
        matmul.allow_tf32 = before
