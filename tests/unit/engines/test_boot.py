"""The one door into vLLM (harness.engines.boot): what reaches ``LLM(...)``, in which precedence, and the
engine environment; no engine is booted."""
from __future__ import annotations

import os

import pytest

from harness.engines import boot
from harness.engines.vllm_compat import llm_kwargs, subject_env_defaults


def test_layers_merge_left_to_right_over_the_version_layer():
    version = dict(device="cpu", kv_bytes=64 << 20)
    args = boot.engine_arguments(model="m", dtype="float32", version=version,
                                 defaults={"skip_tokenizer_init": True, "seed": 7},
                                 overrides=({"runner": "pooling"}, {"skip_tokenizer_init": False}))
    assert args == {"model": "m", "dtype": "float32", **llm_kwargs(**version),  # the version layer's seed wins
                    "skip_tokenizer_init": False, "runner": "pooling"}
    assert list(args)[:2] == ["model", "dtype"]  # the named arguments first, as the call sites wrote them


def test_without_a_version_only_what_the_caller_says_reaches_vllm():
    assert boot.engine_arguments(model="m", dtype="float32", seed=0) == {"model": "m", "dtype": "float32", "seed": 0}


def test_a_layer_may_not_repeat_a_named_argument():
    with pytest.raises(TypeError, match="dtype"):  # as LLM(dtype=..., **{"dtype": ...}) would
        boot.engine_arguments(model="m", dtype="float32", overrides=({"dtype": "bfloat16"},))


def test_env_defaults_keep_what_is_set(monkeypatch):
    for key in subject_env_defaults("cpu", 1):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")  # a variant's own choice
    boot.env_defaults("cpu")
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_only_the_benchmark_extension_carries_the_probes():
    from harness.engines.bench_probes import BenchCaptureExtension, BenchProbes
    from harness.engines.vllm_worker import CaptureExtension

    probes = {n for n in vars(BenchProbes) if n.startswith("vp_")}
    assert probes and not probes & set(dir(CaptureExtension))
    assert probes <= set(dir(BenchCaptureExtension)) and issubclass(BenchCaptureExtension, CaptureExtension)
    for name in (boot.CAPTURE_EXTENSION, boot.BENCH_EXTENSION):
        module, _, cls = name.rpartition(".")
        assert getattr(__import__(module, fromlist=[cls]), cls)
