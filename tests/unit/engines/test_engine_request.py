"""harness.engines.engine_request: the engine request survives its trip across the process boundary field by
field (nested values too), an engine rejects a request it does not know with the field named, the value is
frozen, and the engine processes read attributes of it, never dict keys."""
from __future__ import annotations

import ast
import dataclasses
import json

import pytest

from harness.engines.engine_request import EngineRequest, EngineRequestError, Pooling
from harness.engines.subject_hidden_states import HiddenStatesExport
from harness.paths import REPO_ROOT


def _every_field_set() -> EngineRequest:
    """A request whose every field (and every nested field) differs from its default."""
    return EngineRequest(
        checkpoint="/ckpt/model.gguf", dtype="bfloat16", prompts=[[1, 2, 3], [4, 5]], vocab_size=32000,
        max_model_len=256, out_dir="/work/subject", device="cuda", enforce_eager=False, tp=2, executor="ray",
        serving="decode", full_logprobs=False, ragged=False,
        llm_overrides={"quantization": "gguf", "attention_config": {"backend": "CPU_MLA"}},
        reads=[("model.layers.0", "out"), ("model.embed_tokens", "out"), ("model.layers.0", "out")],
        params=["model.norm.weight", "lm_head.weight"], row_dims={"model.layers.0|out": 1},
        flat_rows={"model.layers.0.linear_attn.norm|in[0]": 4},
        pooling=Pooling(task="token_classify", token_types=[[0, 0, 1], [0, 1]], width=128), discover=True, timing_repeats=2,
        subject_args=HiddenStatesExport(layer_ids=[0, 1, 2], hidden_size=64, connector="CpuHiddenStatesConnector"))


def _defaults(cls) -> dict:
    return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}


def test_every_field_round_trips_through_json_nested_values_included():
    request = _every_field_set()
    for cls, value in ((EngineRequest, request), (Pooling, request.pooling), (HiddenStatesExport, request.subject_args)):
        unset = [name for name, default in _defaults(cls).items() if getattr(value, name) == default]
        assert not unset, f"{cls.__name__} fields left at their default (this test must set every field): {unset}"
    text = request.to_json()
    back = EngineRequest.from_json(text)
    assert back == request
    for f in dataclasses.fields(EngineRequest):
        assert getattr(back, f.name) == getattr(request, f.name), f.name
    assert isinstance(back.pooling, Pooling) and isinstance(back.subject_args, HiddenStatesExport)
    assert back.prompts == ((1, 2, 3), (4, 5)) and back.pooling.token_types == ((0, 0, 1), (0, 1))
    assert json.loads(text) == request.to_dict() and EngineRequest.from_json(back.to_json()) == request


def test_reads_and_params_are_stored_sorted_and_unique_prompts_in_order():
    request = _every_field_set()
    assert request.reads == (("model.embed_tokens", "out"), ("model.layers.0", "out"))
    assert request.params == ("lm_head.weight", "model.norm.weight")
    assert request.prompt_lengths == [3, 2]


def test_a_minimal_request_round_trips_with_its_defaults():
    request = EngineRequest(checkpoint="/c", dtype="float32", prompts=[[1, 2]], vocab_size=8, max_model_len=64)
    assert EngineRequest.from_json(request.to_json()) == request
    assert request.pooling is None and request.subject_args is None and dict(request.llm_overrides) == {}


def test_an_unknown_or_missing_field_is_an_error_naming_it():
    data = _every_field_set().to_dict()
    with pytest.raises(EngineRequestError, match=r"unknown field\(s\) \['hooks'\]"):
        EngineRequest.from_dict({**data, "hooks": {}})
    with pytest.raises(EngineRequestError, match=r"missing field\(s\) \['max_model_len', 'vocab_size'\]"):
        EngineRequest.from_dict({k: v for k, v in data.items() if k not in ("vocab_size", "max_model_len")})
    with pytest.raises(EngineRequestError, match=r"pooling: unknown field\(s\) \['pooling_task'\]"):
        EngineRequest.from_dict({**data, "pooling": {"task": "embed", "pooling_task": "embed"}})
    kind = "harness.engines.subject_hidden_states.HiddenStatesExport"
    with pytest.raises(EngineRequestError, match=r"subject_args \(.*HiddenStatesExport\): missing field\(s\) \['layer_ids'\]"):
        EngineRequest.from_dict({**data, "subject_args": {"kind": kind, "hidden_size": 64}})


def test_the_engine_refuses_a_request_without_its_out_dir(tmp_path):
    path = tmp_path / "subject_request.json"
    path.write_text(dataclasses.replace(_every_field_set(), out_dir="").to_json())
    with pytest.raises(EngineRequestError, match="no out_dir"):
        EngineRequest.read(path)
    path.write_text(_every_field_set().to_json())
    assert EngineRequest.read(path) == _every_field_set()


def test_it_is_frozen_and_owns_its_mappings():
    overrides = {"quantization": "gguf", "attention_config": {"backend": "X"}}
    request = EngineRequest(checkpoint="/c", dtype="float32", prompts=[[1]], vocab_size=8, max_model_len=64,
                            llm_overrides=overrides)
    overrides["quantization"] = "fp8"
    overrides["attention_config"]["backend"] = "Y"
    assert request.llm_overrides == {"quantization": "gguf", "attention_config": {"backend": "X"}}
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.dtype = "bfloat16"
    with pytest.raises(TypeError):
        request.llm_overrides["quantization"] = "fp8"
    # LLM(**overrides) hands vLLM plain dicts, which it type-checks
    assert type({**request.llm_overrides}["attention_config"]) is dict
    assert dataclasses.replace(request, tp=2).llm_overrides == request.llm_overrides


ENGINE_PROCESSES = ("subject_vllm", "subject_tl_vllm", "subject_hidden_states")


@pytest.mark.parametrize("module", ENGINE_PROCESSES)
def test_the_engine_process_reads_attributes_never_request_keys(module):
    tree = ast.parse((REPO_ROOT / "harness" / "engines" / f"{module}.py").read_text())
    keyed = [node.lineno for node in ast.walk(tree)
             if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "req")
             or (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "req"
                 and node.attr == "get")]
    assert not keyed, f"harness/engines/{module}.py reads the request by key at lines {keyed}"
    assert "EngineRequest.read(request_path)" in ast.unparse(tree)


def test_every_subjects_own_part_round_trips_and_an_unnamed_kind_is_an_error():
    """``subject_args``: each registry row's class (Subject.args) crosses as JSON with its ``kind`` and comes back
    equal; a kind no row names is an error naming it, before anything is built."""
    from harness.engines.subject_tl_vllm import TlHooks
    from harness.engines.subject_vllm_lens import LensLayers
    from harness.engines.subjects import SUBJECTS

    values = [TlHooks({"blocks.0.hook_out": "model.layers.0|out"}), LensLayers([0, 2], [0, 1]),
              HiddenStatesExport(layer_ids=[0, 1], hidden_size=64)]
    assert {f"{type(v).__module__}.{type(v).__qualname__}" for v in values} == {
        s.args for s in SUBJECTS.values() if s.args}
    for value in values:
        request = EngineRequest(checkpoint="/c", dtype="float32", prompts=[[1]], vocab_size=8, max_model_len=64,
                                subject_args=value)
        back = EngineRequest.from_json(request.to_json())
        assert back == request and type(back.subject_args) is type(value)
    data = json.loads(request.to_json())
    data["subject_args"]["kind"] = "os.system"
    with pytest.raises(EngineRequestError, match="kind 'os.system' is no subject's"):
        EngineRequest.from_dict(data)
