"""Known bugs in a *reference* engine, as data -- never in vLLM or in our overlays.

Contract: :func:`known_issue(architecture, reference, hook)` returns the
:class:`KnownIssue` that may cover that parity row, or ``None``.  It covers the
row only when the row *failed* and the issue's documented signature holds in
this run's reference captures (:meth:`KnownIssue.holds`, applied by
harness.comparison.gate.Gate.finalize): a name match alone explains nothing,
and an error row is never explained.  The parity test xfails a covered row and
fails a row whose issue no longer reproduces (the row passed), so a stale entry
cannot linger.  Reports keep the row's real numbers and status, add the
reason, and count it apart from unexplained failures.  Each entry names the
version it was measured with and the evidence.

Retired: "TransformerLens 4.3.0's default weight processing raises
``RuntimeError: shape '[4, 32]' is invalid for input of size 64`` for OLMo-2"
held for a checkpoint with ``attention_bias=True`` only.  The synthetic OLMo-2
lost its attention biases (vLLM 0.20 drops them, and no released OLMo-2 has
any: harness/models/families.py); processed compatibility mode then matches vLLM on
every residual hook, so the entry went (a strict xfail would have failed).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.vocab.hooks import matches


def _scores_equal_pattern(refs, reference: str, reference_hook: str) -> bool:
    """The reference's own attention scores equal its own pattern (bitwise), on every prompt."""
    store = {"bridge": refs.bridge, "compat": refs.compat}.get(reference) or {}
    pattern = reference_hook.replace("hook_attn_scores", "hook_pattern")
    pairs = [(caps.get(reference_hook), caps.get(pattern)) for caps in store.values()]
    return bool(pairs) and all(s is not None and p is not None and torch.equal(s, p) for s, p in pairs)


# signature name -> check(refs, reference, reference_hook): does the documented bug show in this run?
SIGNATURES = {"scores_equal_pattern": _scores_equal_pattern}


@dataclass(frozen=True)
class KnownIssue:
    architecture: str
    references: tuple[str, ...]
    template: str  # "blocks.{i}.attn.hook_attn_scores", or "*" for every hook of those references
    reason: str
    signature: str  # a key of SIGNATURES: the bug's observable fingerprint, checked on every run

    def holds(self, refs, reference: str, reference_hook: str) -> bool:
        return SIGNATURES[self.signature](refs, reference, reference_hook)


KNOWN_ISSUES: tuple[KnownIssue, ...] = (
    KnownIssue(
        "OPTForCausalLM", ("bridge", "compat"), "blocks.{i}.attn.hook_attn_scores",
        "TransformerLens 4.3.0 bug: for OPT the generic AttentionBridge.forward fires hook_attn_scores with "
        "HF's post-softmax attention weights (transformer_lens/model_bridge/generalized_components/"
        "attention.py, 'Most HF implementations return post-softmax weights'), so the bridge's "
        "hook_attn_scores equals its hook_pattern (torch.equal is True) and holds 0 where vLLM's scores "
        "are -inf. vLLM's hook_pattern derived from the same q and k passes against both references.",
        signature="scores_equal_pattern",
    ),
    KnownIssue(
        "BertForMaskedLM", ("bridge", "compat"), "blocks.{i}.attn.hook_attn_scores",
        "TransformerLens 4.3.0 bug, as for OPT: its BERT adapter wraps HF's BertAttention in the generic "
        "AttentionBridge, which fires hook_attn_scores with HF's post-softmax attention weights, so the "
        "bridge's hook_attn_scores equals its hook_pattern (torch.equal is True; measured on the synthetic "
        "bert checkpoint, where q @ k^T / sqrt(d_head) is not the pattern). vLLM's hook_pattern derived from "
        "the same q and k (bidirectional, no mask) passes against both references.",
        signature="scores_equal_pattern",
    ),
    KnownIssue(
        "GPTJForCausalLM", ("bridge", "compat"), "blocks.{i}.attn.hook_attn_scores",
        "TransformerLens 4.3.0 bug, as for OPT: its GPT-J adapter (GptjArchitectureAdapter) wraps HF's "
        "GPTJAttention in the generic AttentionBridge, which fires hook_attn_scores with HF's post-softmax "
        "attention weights, so the bridge's hook_attn_scores equals its hook_pattern (torch.equal is True on every "
        "layer of the synthetic gptj checkpoint, values in [0, 1]) and holds 0 where vLLM's scores are -inf. "
        "vLLM's hook_pattern derived from the same rotated q and k passes against both references.",
        signature="scores_equal_pattern",
    ),
    KnownIssue(
        "PhiMoEForCausalLM", ("bridge", "compat"), "blocks.{i}.attn.hook_attn_scores",
        "TransformerLens 4.3.0 bug, as for OPT: its PhiMoE adapter (PhiMoEArchitectureAdapter) keeps HF's "
        "PhimoeAttention in the generic AttentionBridge (maintain_native_attention), which fires hook_attn_scores "
        "with HF's post-softmax attention weights, so the bridge's hook_attn_scores equals its hook_pattern "
        "(torch.equal is True on the synthetic phimoe checkpoint, values in [0, 1]) and holds 0 where vLLM's scores "
        "are -inf. vLLM's hook_pattern derived from the same rotated q and k passes against both references.",
        signature="scores_equal_pattern",
    ),
    KnownIssue(
        "AfmoeForCausalLM", ("bridge", "compat"), "blocks.{i}.attn.hook_attn_scores",
        "TransformerLens 4.3.0 bug, as for OPT: its AFMoE adapter (AfmoeArchitectureAdapter) keeps HF's AfmoeAttention "
        "in the generic AttentionBridge (maintain_native_attention), which fires hook_attn_scores with HF's "
        "post-softmax attention weights, so the bridge's hook_attn_scores equals its hook_pattern and holds 0 where "
        "vLLM's scores are -inf. vLLM's hook_pattern derived from the same rotated q and k passes against both "
        "references.",
        signature="scores_equal_pattern",
    ),
    KnownIssue(
        "Gemma4ForCausalLM", ("bridge", "compat"), "blocks.{i}.attn.hook_attn_scores",
        "TransformerLens 4.3.0 bug, as for OPT: its Gemma-4 adapter (Gemma4ArchitectureAdapter, inherited by "
        "Gemma4TextArchitectureAdapter) keeps HF's Gemma4TextAttention in the generic AttentionBridge "
        "(maintain_native_attention; its comment: 'pattern AND scores both fire HF's post-softmax weights'), so the "
        "bridge's hook_attn_scores equals its hook_pattern and holds 0 where vLLM's scores are -inf. vLLM's "
        "hook_pattern derived from the same rotated q and k (scale 1.0) passes against both references.",
        signature="scores_equal_pattern",
    ),
    KnownIssue(
        "Llama4ForCausalLM", ("bridge", "compat"), "blocks.{i}.attn.hook_attn_scores",
        "TransformerLens 4.3.0 bug, as for OPT: its Llama-4 adapter (Llama4ArchitectureAdapter) keeps HF's "
        "Llama4TextAttention in the generic AttentionBridge (maintain_native_attention), which fires hook_attn_scores "
        "with HF's post-softmax attention weights, so the bridge's hook_attn_scores equals its hook_pattern and holds "
        "0 where vLLM's scores are -inf (outside a query's chunk too). vLLM's hook_pattern derived from the q and k "
        "its attention takes passes against both references.",
        signature="scores_equal_pattern",
    ),
    KnownIssue(
        "LagunaForCausalLM", ("bridge", "compat"), "blocks.{i}.attn.hook_attn_scores",
        "TransformerLens 4.3.0 bug, as for OPT: its Laguna adapter (LagunaArchitectureAdapter) keeps HF's "
        "LagunaAttention in the generic AttentionBridge (maintain_native_attention: per-layer head counts and the "
        "softplus gate), which fires hook_attn_scores with HF's post-softmax attention weights, so the bridge's "
        "hook_attn_scores equals its hook_pattern and holds 0 where vLLM's scores are -inf. vLLM's hook_pattern "
        "derived from the same rotated q and k passes against both references.",
        signature="scores_equal_pattern",
    ),
    KnownIssue(
        "RobertaForMaskedLM", ("bridge", "compat"), "blocks.{i}.attn.hook_attn_scores",
        "TransformerLens 4.3.0 bug, as for BERT: its RoBERTa adapter (RobertaArchitectureAdapter, a subclass of "
        "BertArchitectureAdapter) wraps HF's RobertaAttention in the generic AttentionBridge, which fires "
        "hook_attn_scores with HF's post-softmax attention weights, so the bridge's hook_attn_scores equals its "
        "hook_pattern (values in [0, 1], where q @ k^T / sqrt(d_head) is not). vLLM's hook_pattern derived from the "
        "same q and k (bidirectional, no mask) passes against both references.",
        signature="scores_equal_pattern",
    ),
    KnownIssue(
        "JambaForCausalLM", ("bridge", "compat"), "blocks.{i}.attn.hook_attn_scores",
        "TransformerLens 4.3.0 bug, as for OPT: its Jamba adapter (JambaArchitectureAdapter) keeps HF's "
        "JambaAttention in the generic AttentionBridge (maintain_native_attention), which fires hook_attn_scores "
        "with HF's post-softmax attention weights, so the bridge's hook_attn_scores equals its hook_pattern (torch.equal "
        "is True on the synthetic jamba checkpoint, bridge and compatibility mode) and holds 0 where vLLM's scores "
        "are -inf. vLLM's hook_pattern derived from the same q and k (no rotary) passes against both references.",
        signature="scores_equal_pattern",
    ),
    KnownIssue(
        "OlmoHybridForCausalLM", ("bridge", "compat"), "blocks.{i}.attn.hook_attn_scores",
        "TransformerLens 4.3.0 bug, as for OPT: its OLMo-Hybrid adapter (OlmoHybridArchitectureAdapter) keeps HF's "
        "OlmoHybridAttention in the generic AttentionBridge (maintain_native_attention), which fires hook_attn_scores "
        "with HF's post-softmax attention weights, so the bridge's hook_attn_scores equals its hook_pattern and holds "
        "0 where vLLM's scores are -inf. vLLM's hook_pattern derived from the same rotated q and k passes against both "
        "references.",
        signature="scores_equal_pattern",
    ),
)


@dataclass(frozen=True)
class LayoutBug:
    """A reference that holds a hook's numbers in a wrong head layout: the same values per token, split into
    other heads.  The row is compared after regrouping the reference into vLLM's layout (a reshape of each
    token's row: the same numbers, in the same order), the note naming the bug.  Its signature, checked on every
    row it covers: the reference's shape differs from the subject's with the same token count and the same
    numbers per token.  Where the shapes agree the bug is gone and the row is an error saying to retire the
    entry; where they differ otherwise the shape mismatch stands."""

    architectures: tuple[str, ...]
    references: tuple[str, ...]
    template: str
    reason: str
    # the two HF config keys whose values must differ for the bug to show (equal: the wrong split is the right
    # one, and the row is compared as it is)
    shows_when_differ: tuple[str, str] | None = None

    def covers(self, architecture: str, reference: str, hook: str) -> bool:
        return architecture in self.architectures and reference in self.references and matches(self.template, hook)

    def shows(self, config: dict | None) -> bool | None:
        """Whether the bug can show for a model with these config values (None: not known -- a stored
        reference captured before the values were recorded)."""
        if self.shows_when_differ is None:
            return True
        a, b = (config or {}).get(self.shows_when_differ[0]), (config or {}).get(self.shows_when_differ[1])
        return None if a is None or b is None else a != b


def _regroupable(subject: torch.Tensor, reference: torch.Tensor) -> bool:
    return (subject.shape != reference.shape and subject.dim() >= 1 and reference.dim() >= 1
            and subject.shape[0] == reference.shape[0] and subject.numel() == reference.numel())


LAYOUT_BUGS: tuple[LayoutBug, ...] = (
    LayoutBug(
        # GLM-4.7-Flash and GLM-5: TL's Glm4MoeLite / GlmMoeDsa adapters are the same MLA bridge, and their configs
        # map head_dim to qk_rope_head_dim too (released: v 256 against rope 64)
        ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM"),
        ("bridge", "compat", "bridge-ragged"),
        "blocks.{i}.attn.hook_z",
        "TransformerLens 4.3.0 bug: its DeepSeek attention bridge splits o_proj's input into heads of the config's "
        "head_dim, which HF sets to qk_rope_head_dim, instead of v_head_dim (n_heads x v_head_dim columns), so its "
        "hook_z has the wrong head count wherever the two differ (every released DeepSeek-V2/V3 and Kimi-K2: 64 "
        "against 128); regrouped per token into vLLM's n_heads x v_head_dim",
        shows_when_differ=("v_head_dim", "qk_rope_head_dim"),
    ),
)


def layout_config(cfg) -> dict:
    """The HF config values the :data:`LAYOUT_BUGS` depend on (recorded by the reference side)."""
    keys = {k for bug in LAYOUT_BUGS if bug.shows_when_differ for k in bug.shows_when_differ}
    keys |= {k for bug in GATED_NORM_BUGS for k in (bug.groups_key, bug.eps_key)}  # and the GatedNormBugs' groups, eps
    return {k: getattr(cfg, k) for k in sorted(keys) if isinstance(getattr(cfg, k, None), (int, float, str))}


def regroup_layout(architecture: str, reference: str, hook: str, pairs, config: dict | None = None):
    """``(pairs, note, stale)`` for a row a :class:`LayoutBug` covers: the pairs with each reference regrouped
    into its subject's shape and the note that says so, where the signature holds on every pair; ``stale``
    (an error message) where the bug should show for this model (``config``: :func:`layout_config`) and the
    reference already has the subject's shape.  Unchanged pairs and empty strings where no entry covers the
    row, the model cannot show the bug, or the shapes differ some other way."""
    bug = next((b for b in LAYOUT_BUGS if b.covers(architecture, reference, hook)), None)
    shows = bug.shows(config) if bug is not None else False
    if bug is None or not pairs or shows is False:
        return pairs, "", ""
    if all(s.shape == r.shape for s, r in pairs):
        if shows is None:  # the model's values are unknown: nothing to say either way
            return pairs, "", ""
        return pairs, "", (f"{hook} vs {reference}: documented reference layout bug no longer reproduces (the "
                           f"reference's shape {tuple(pairs[0][1].shape)} is vLLM's): retire it from "
                           f"harness/comparison/known_issues.py LAYOUT_BUGS ({bug.reason[:80]}...)")
    if not all(_regroupable(s, r) for s, r in pairs):
        return pairs, "", ""
    shapes = f"{tuple(pairs[0][1].shape)} -> {tuple(pairs[0][0].shape)}"
    return ([(s, r.reshape(s.shape)) for s, r in pairs],
            f"[reference layout bug, its signature holds ({shapes}): {bug.reason}]", "")


def known_issue(architecture: str, reference: str, hook: str) -> KnownIssue | None:
    for issue in KNOWN_ISSUES:
        if issue.architecture == architecture and reference in issue.references and matches(issue.template, hook):
            return issue
    return None


# -- gated-norm reference bugs (mamba2-groups) --
@dataclass(frozen=True)
class GatedNormBug:
    """A reference whose gated RMS norm (``y = w * rms_norm(x * silu(gate))``) normalizes the whole width where
    the model defines it per group of ``config[groups_key]`` equal groups.  The reference process corrects the
    model downstream of the norm (harness.references.reference.group_wise_gated_norm: the rows after it are gated
    against the model as defined), and the norm's own output row keeps the reference's value: where it fails, it
    is explained only if the signature (:func:`gated_norm_signature`) holds on the run's captures -- the
    reference's output is a whole-width gated norm of the reference's own input and gate, vLLM's the per-group
    one of vLLM's.  Where the model has one group the bug cannot show and the row compares as it is; where it has
    more and the row passes, or the reference's output is the per-group norm, the bug is gone (transformers fixed
    it) and the row is an error saying to retire the entry."""

    architectures: tuple[str, ...]
    references: tuple[str, ...]
    template: str  # the norm's output hook; its input and gate are the same template's hook_in / hook_gate
    reason: str
    groups_key: str = "n_groups"
    eps_key: str = "layer_norm_epsilon"  # the norm's eps, so the signature's norms are the model's to rounding

    def covers(self, architecture: str, reference: str, hook: str) -> bool:
        return architecture in self.architectures and reference in self.references and matches(self.template, hook)

    def groups(self, config: dict | None) -> int | None:
        """The model's group count (None: not recorded -- a stored reference captured before it was)."""
        g = (config or {}).get(self.groups_key)
        return None if g is None else int(g)

    def eps(self, config: dict | None) -> float:
        return float((config or {}).get(self.eps_key) or 0.0)


GATED_NORM_BUGS: tuple[GatedNormBug, ...] = (
    GatedNormBug(
        ("Mamba2ForCausalLM",), ("hf", "bridge", "compat", "bridge-ragged"), "blocks.{i}.mixer.inner_norm.hook_out",
        "transformers 5.19 bug: Mamba-2's MambaRMSNormGated (models/mamba2/modeling_mamba2.py) normalizes the whole "
        "intermediate width and ignores n_groups, where the original Mamba-2 (mamba_ssm RMSNormGated with "
        "group_size = d_ssm // ngroups), vLLM's Mixer2RMSNormGated and HF's own NemotronH (Zamba2RMSNormGated, "
        "group_size = intermediate_size // n_groups) normalize each group; TransformerBridge wraps HF's module. "
        "Released checkpoints have n_groups 8 (Mamba-Codestral-7B). Every reference ran with the group-wise norm "
        "downstream of this hook (reference corrected: group-wise gated norm), so the rows after it are gated "
        "against the model as defined",
    ),
    GatedNormBug(
        ("GraniteMoeHybridForCausalLM",), ("hf", "bridge", "compat", "bridge-ragged"),
        "blocks.{i}.mixer.inner_norm.hook_out",
        "transformers 5.19 bug: GraniteMoeHybrid's GraniteMoeHybridRMSNormGated (models/granitemoehybrid/"
        "modeling_granitemoehybrid.py, Mamba-2 layers) normalizes the whole intermediate width and ignores "
        "mamba_n_groups, where vLLM's Mixer2RMSNormGated and the original Mamba-2 normalize each group; "
        "TransformerBridge wraps HF's module. Every reference ran with the group-wise norm downstream of this hook "
        "(reference corrected: group-wise gated norm), so the rows after it are gated against the model as defined",
        groups_key="mamba_n_groups", eps_key="rms_norm_eps",
    ),
)

# a signature's fit residual (relative) below which an output "is" that norm of its input; the bug's own
# discrepancy is of the order of the output itself, rounding (bf16: 2^-8 per entry) far below
GATED_NORM_FIT = 0.05


def _silu_gated(x: torch.Tensor, gate: torch.Tensor, groups: int, eps: float = 0.0) -> torch.Tensor:
    """``rms_norm(x * silu(gate))`` over ``groups`` equal groups of the last dim, unweighted, in float64."""
    h = x.double() * torch.nn.functional.silu(gate.double())
    *prefix, width = h.shape
    g = h.reshape(*prefix, groups, width // groups)
    return (g / (g.pow(2).mean(-1, keepdim=True) + eps).sqrt().clamp_min(1e-300)).reshape(*prefix, width)


def norm_fit(y: list[torch.Tensor], x: list[torch.Tensor], gate: list[torch.Tensor], groups: int,
             eps: float = 0.0) -> float:
    """How far ``y`` is from ``w * rms_norm(x * silu(gate))`` over ``groups`` groups for the best per-column
    weight ``w`` (least squares over every token of every prompt): ||y - w u|| / ||y||.  Weight-free, so it reads
    the captures alone: an output that is that norm of its input fits to rounding, one normalized otherwise
    leaves a per-token, per-group scale no per-column weight absorbs."""
    ys = torch.cat([t.double().reshape(-1, t.shape[-1]) for t in y])
    us = torch.cat([_silu_gated(a, b, groups, eps).reshape(-1, a.shape[-1]) for a, b in zip(x, gate)])
    ok = torch.isfinite(ys).all(-1) & torch.isfinite(us).all(-1)
    ys, us = ys[ok], us[ok]
    w = (ys * us).sum(0) / (us * us).sum(0).clamp_min(1e-300)
    return float(torch.linalg.vector_norm(ys - w * us) / torch.linalg.vector_norm(ys).clamp_min(1e-300))


@dataclass(frozen=True)
class GatedNormSignature:
    groups: int
    reference_whole: float  # the reference's output against a whole-width norm of its input
    reference_grouped: float  # ... against the per-group one
    subject_whole: float  # vLLM's output against a whole-width norm of its input
    subject_grouped: float  # ... against the per-group one

    @property
    def reference_is_whole(self) -> bool:
        return self.reference_whole <= GATED_NORM_FIT and self.reference_whole * 10 <= self.reference_grouped

    @property
    def subject_is_grouped(self) -> bool:
        return self.subject_grouped <= GATED_NORM_FIT and self.subject_grouped * 10 <= self.subject_whole

    @property
    def holds(self) -> bool:
        return self.reference_is_whole and self.subject_is_grouped

    def describe(self) -> str:
        return (f"the reference's output fits a whole-width norm of its own input to {self.reference_whole:.1e} "
                f"(per-group: {self.reference_grouped:.1e}); vLLM's fits the {self.groups}-group norm of its input to "
                f"{self.subject_grouped:.1e} (whole-width: {self.subject_whole:.1e})")


def gated_norm_signature(subject: tuple[list, list, list], reference: tuple[list, list, list],
                         groups: int, eps: float = 0.0) -> GatedNormSignature:
    """The signature on one row's captures: ``subject`` / ``reference`` are ``(input, gate, output)``, each a
    list of per-prompt tensors ``[T, width]``; ``eps`` the norm's."""
    (sx, sg, sy), (rx, rg, ry) = subject, reference
    return GatedNormSignature(groups, norm_fit(ry, rx, rg, 1, eps), norm_fit(ry, rx, rg, groups, eps),
                              norm_fit(sy, sx, sg, 1, eps), norm_fit(sy, sx, sg, groups, eps))


def gated_norm_bug(architecture: str, reference: str, hook: str, config: dict | None) -> GatedNormBug | None:
    """The :class:`GatedNormBug` covering this row where the model can show it (more than one group)."""
    bug = next((b for b in GATED_NORM_BUGS if b.covers(architecture, reference, hook)), None)
    groups = bug.groups(config) if bug is not None else None
    return bug if groups is not None and groups > 1 else None


def explain_gated_norm(bug: GatedNormBug, row, signature: GatedNormSignature | None) -> None:
    """The row's status under ``bug``: a failed row whose signature holds is explained (``row.known_issue``);
    a row that passed, or whose reference's output is no longer the whole-width norm, is an error saying to
    retire the entry; otherwise the row stands, the signature's numbers added to its message."""
    if row.status == "error":
        return
    said = signature.describe() if signature is not None else "no captures to check it on"
    if row.status == "pass" or (signature is not None and not signature.reference_is_whole):
        row.status = "error"
        row.message = (f"{row.hook} vs {row.reference}: documented reference bug no longer reproduces ({said}): "
                       f"retire it from harness/comparison/known_issues.py GATED_NORM_BUGS ({bug.reason[:80]}...)")
    elif row.status == "fail" and signature is not None and signature.holds:
        row.known_issue = f"{bug.reason} [signature holds: {said}]"
    else:
        row.message = (row.message or f"{row.hook} vs {row.reference}:") + f" [gated-norm signature does not hold: {said}]"
# -- end gated-norm reference bugs --
