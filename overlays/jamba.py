"""Jamba (``JambaForCausalLM``): a hybrid whose layer kinds come from the config, implementing the
:class:`~overlays.base.Overlay` contract directly, as Nemotron-H does.  Each layer runs a Mamba-1 mixer (Mamba-1's
reads, :mod:`overlays.mamba`, plus weighted RMS norms on dt / B / C) or grouped-query attention without rotary,
then a dense SwiGLU MLP or a sparse MoE; two pre-norms and a fused residual pair, as Llama's.

Layer kinds (HF's ``JambaConfig`` properties, which vLLM reads too): ``layers_block_type[i]`` is ``"attention"``
where ``i % attn_layer_period == attn_layer_offset``, else ``"mamba"``; ``layers_num_experts[i]`` is
``num_experts`` where ``i % expert_layer_period == expert_layer_offset``, else 1 (a dense MLP).  Released
Jamba-v0.1: attention period 8 offset 4, experts period 2 offset 1.

vLLM's tree (vLLM 0.20.2: vllm/model_executor/models/jamba.py, layers/mamba/mamba_mixer.py; read, not booted:
vLLM runs it on CUDA only)::

    model.embed_tokens                    VocabParallelEmbedding
    model.layers.{i}                      Jamba{Mamba,Attention}DecoderLayer(positions=, hidden_states=, residual=)
                                          -> (feed-forward output, residual): the fused pair
    model.layers.{i}.input_layernorm      RMSNorm, fused add-norm from layer 1 on: (normed, residual)
    -- "mamba" layers --
    model.layers.{i}.mamba                MambaMixer(hidden_states, output): fills ``output`` in place, returns
                                          None; its body runs inside the custom op ``vllm::mamba_mixer`` (its
                                          static-forward-context name is ``model.layers.{i}.mixer``, the module
                                          attribute is ``mamba``), calling these as modules:
    model.layers.{i}.mamba.in_proj        [x | z], returns (out, bias); bias where mamba_proj_bias
    model.layers.{i}.mamba.x_proj         conv output (SiLU'd) -> [dt_rank | B | C], returns (out, bias)
    model.layers.{i}.mamba.dt_layernorm   RMSNorm(mamba_dt_rank), weighted (use_rms_norm=True, has_weight) -> tensor
    model.layers.{i}.mamba.b_layernorm    RMSNorm(mamba_d_state), weighted -> tensor
    model.layers.{i}.mamba.c_layernorm    RMSNorm(mamba_d_state), weighted -> tensor
    model.layers.{i}.mamba.dt_proj        skip_bias_add: (W dt, bias), the bias added in the scan
    model.layers.{i}.mamba.out_proj       the gated scan output -> d_model, returns (out, bias)
    -- "attention" layers (HF's ``.self_attn.`` is mapped away: the projections hang off the layer) --
    model.layers.{i}.qkv_proj             QKVParallelLinear [q | k | v], no bias, returns (out, bias)
    model.layers.{i}.attn                 Attention(q, k, v), scale head_dim ** -0.5, no rotary
    model.layers.{i}.o_proj               RowParallelLinear, returns (out, bias)
    -- every layer --
    model.layers.{i}.pre_ff_layernorm     RMSNorm(mixer output, residual) -> (normed, residual)
    model.layers.{i}.feed_forward         JambaMLP (= LlamaMLP: gate_up_proj [gate | up] -> SiluAndMul ->
                                          down_proj) where layers_num_experts[i] is 1, else JambaMoE: router
                                          (ReplicatedLinear, (logits, None)), experts (FusedMoE, softmax top-k,
                                          renormalize False)
    model.final_layernorm                 RMSNorm(hidden_states, residual) -> (normed, _)
    logits_processor                      as every decoder

HF's tree (transformers 5.19 modeling_jamba.py) is the same under ``model.layers.{i}.{mamba | self_attn}``,
``feed_forward`` (``JambaMLP``: gate_proj / up_proj / down_proj; ``JambaSparseMoeBlock``: router, experts).
TransformerBridge (TL 4.3.0, supported_architectures/jamba.py): ``BlockBridge`` (``ln1`` / ``ln2`` =
``input_layernorm`` / ``pre_ff_layernorm``), attention as ``attn`` (q / k / v / o LinearBridges, HF's native
attention), HF's ``mamba`` under the canonical ``mixer`` (``SSMMixerBridge``: in_proj, x_proj, the three norms,
out_proj), the feed-forward as ``mlp`` (``MoEBridge``: dense_gate / dense_in / dense_out on dense layers, ``router``
on MoE layers).

Hooks, and why each read is the TransformerLens value:

- Stream: ``hook_in`` (``in.hidden_states+in.residual``), ``hook_resid_mid`` (``pre_ff_layernorm``'s two inputs
  summed), ``hook_out`` (``out[0]+out[1]``), ``ln1`` / ``ln2`` / ``ln_final.hook_normalized`` (``out[0]`` un-folded
  by the norm's weight; a bare tensor at layer 0 is its own ``out[0]``), as Llama's.
- Mamba layers: ``mixer.hook_in`` (the mixer's input), ``mixer.in_proj.hook_out``, ``mixer.x_proj.hook_in`` (the
  conv's SiLU'd output: the conv is checked here) / ``hook_out``, ``mixer.out_proj.hook_in`` (the scan output gated
  by ``silu(z)``), ``mixer.hook_out`` (``out_proj``'s ``out[0]``, which ``output`` receives): Mamba-1's
  (:mod:`overlays.mamba`), against the bridge and HF's forward hooks on HF's ``mamba``
  (harness.references.reference._mamba1_mixer_hooks).  ``mixer.{dt,b,c}_layernorm.hook_normalized``: the norm's
  output un-folded by its weight, TL's ``RMSNormalizationBridge`` value (``x / rms``; measured: its ``hook_out`` is
  exactly ``hook_normalized x weight``); HF's hooks divide the module's output by its weight too.
- Attention layers: ``attn.hook_in`` (``qkv_proj``'s input: vLLM has no attention module, ``self_attention`` is a
  method), ``attn.hook_q`` / ``hook_k`` / ``hook_v`` (``qkv_proj``'s columns in heads), ``attn.hook_z``
  (``o_proj``'s input), ``attn.hook_out`` (``o_proj``'s output).  ``attn.hook_attn_scores`` / ``hook_pattern``:
  derived from ``hook_q`` / ``hook_k`` (no rotary), scale ``head_dim ** -0.5``, causal, grouped-query; the bridge's
  scores hook holds its pattern (harness.comparison.known_issues, ``JambaForCausalLM``), HF's eager softmax is the
  scores' reference.
- Dense layers: ``mlp.hook_in``, ``hook_pre`` / ``hook_pre_linear`` (``gate_up_proj``'s gate / up halves), ``hook_post``
  (``down_proj``'s input), ``mlp.hook_out`` (the block's output).
- MoE layers: ``mlp.hook_in`` / ``hook_out`` (the block's input and output), ``mlp.gate.hook_out``: the router
  logits ``[T, num_experts]`` (``router``'s ``out[0]``), TL's ``mlp.router.hook_out`` (bridge and compatibility
  mode).  The choice is the top-k of the softmax, so of the logits (no bias, no groups, no renormalization
  inside the choice): a near-tie flip is told from a bug by the router logits' own rule (harness.comparison.routing).

Non-firing, per layer (:meth:`JambaOverlay.nonfiring_for`): a Mamba layer's attention hooks and an attention layer's
mixer hooks; Mamba-1's fused internals (``conv1d``, ``dt_proj``, the SSM state: inside ``vllm::mamba_mixer``); a dense
layer's router; a MoE layer's per-expert MLP hooks and its choice (``mlp.gate.hook_expert_weights`` /
``hook_expert_indices``): TL's Jamba adapter wraps the router as a plain ``LinearBridge`` and HF's router is a plain
``nn.Linear``, so no reference holds the chosen experts.

Traps:

- The Mamba mixer's inner reads run inside ``vllm::mamba_mixer``: in eager mode its Python body runs, so the module
  hooks fire; a step mixing prefill and decode calls ``x_proj`` / the norms / ``out_proj`` on each part's own rows
  (decode first), so this overlay is run on ``single`` and ``decode`` serving, as Mamba-1's.
- ``layers_block_type`` / ``layers_num_experts`` are read from the config object (HF's properties), or computed from
  the periods and offsets where the config is a plain mapping (config.json stores only those).
- CUDA only (``selective_scan_fwd``): on CPU the family row is a refusal found by an op probe
  (harness.models.families, ``jamba``).  Registered for vLLM 0.20.2's native ``JambaForCausalLM`` (the only
  implementation this project runs it with).
"""
from __future__ import annotations

from typing import Any

from .base import Cols, Derived, Heads, HookSpec, NonFiring, Overlay, UnfoldNorm, config_get
from .mamba import NONFIRING as _MAMBA_NONFIRING
from .mixtral import MOE_NONFIRING

NORMS = ("dt_layernorm", "b_layernorm", "c_layernorm")  # in vLLM's and HF's call order
_MIXER_INNER = ("mixer.in_proj.hook_out", "mixer.x_proj.hook_in", "mixer.x_proj.hook_out",
                *(f"mixer.{n}.hook_normalized" for n in NORMS), "mixer.out_proj.hook_in")
_MIXER = ("mixer.hook_in", *_MIXER_INNER, "mixer.hook_out")
_ATTN = ("attn.hook_in", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z", "attn.hook_out",
         "attn.hook_attn_scores", "attn.hook_pattern")
_FUSED = tuple(nf for nf in _MAMBA_NONFIRING if nf.template.startswith("blocks.{i}.mixer."))  # conv1d, dt_proj, state
_NO_CHOICE = ("the router's choice: TransformerLens 4.3.0's Jamba adapter wraps the router as a plain LinearBridge "
              "(no hook_expert_weights / hook_expert_indices) and HF's router is a plain nn.Linear, so no reference "
              "holds the chosen experts; the choice (top-k of the softmax, so of the logits) is checked through the "
              "router logits mlp.gate.hook_out and their flip rule")
_ROUTER = (("bridge", "blocks.{i}.mlp.router.hook_out"), ("compat", "blocks.{i}.mlp.router.hook_out"))


def _periodic(cfg: Any, period: str, offset: str, default_period: int, default_offset: int) -> list[bool]:
    p = int(config_get(cfg, period, default=default_period))
    o = int(config_get(cfg, offset, default=default_offset))
    return [i % p == o for i in range(int(config_get(cfg, "num_hidden_layers")))]


def block_types(cfg: Any) -> list[str]:
    """``layers_block_type``: ``"attention"`` or ``"mamba"`` per layer (HF's property, or from the periods)."""
    types = config_get(cfg, "layers_block_type")
    if types is None:
        types = ["attention" if a else "mamba" for a in _periodic(cfg, "attn_layer_period", "attn_layer_offset", 8, 4)]
    types = list(types)
    if len(types) != int(config_get(cfg, "num_hidden_layers")) or set(types) - {"attention", "mamba"}:
        raise ValueError(f"jamba: layers_block_type {types!r} must give 'attention' or 'mamba' per layer")
    return types


def moe_layers(cfg: Any) -> list[bool]:
    """Whether each layer runs the MoE (``layers_num_experts[i] > 1``, HF's property, or from the periods)."""
    experts = config_get(cfg, "layers_num_experts")
    if experts is None:
        n = int(config_get(cfg, "num_experts", "num_local_experts", default=16))
        experts = [n if e else 1 for e in _periodic(cfg, "expert_layer_period", "expert_layer_offset", 2, 1)]
    return [int(e) > 1 for e in experts]


def _hf(name: str) -> tuple[tuple[str, str], ...]:
    return (("hf", name),)


class JambaOverlay(Overlay):
    """Jamba: Mamba-1 or attention by layers_block_type, then a dense MLP or a MoE by layers_num_experts."""

    name = "jamba"
    norm_weight_offset = 0.0  # RMS norms store the weight itself (overlays.norm_weight_offset)

    @staticmethod
    def dims(cfg: Any) -> dict[str, int]:
        d_model, heads = int(config_get(cfg, "hidden_size")), int(config_get(cfg, "num_attention_heads"))
        return dict(d_model=d_model, n_heads=heads, head_dim=d_model // heads,
                    n_kv=int(config_get(cfg, "num_key_value_heads", default=heads)),
                    d_mlp=int(config_get(cfg, "intermediate_size")),
                    inner=int(config_get(cfg, "mamba_expand", default=2)) * d_model,
                    state=int(config_get(cfg, "mamba_d_state", default=16)),
                    rank=_dt_rank(cfg, d_model),
                    n_experts=int(config_get(cfg, "num_experts", "num_local_experts", default=16)),
                    n_layers=int(config_get(cfg, "num_hidden_layers")))

    def hook_specs(self, hf_config: Any) -> dict[str, HookSpec]:
        cfg, d = hf_config, self.dims(hf_config)
        D, dm, I = d["d_model"], d["d_mlp"], d["inner"]
        q, kv = d["n_heads"] * d["head_dim"], d["n_kv"] * d["head_dim"]
        qh, kh = Heads(d["n_heads"], d["head_dim"]), Heads(d["n_kv"], d["head_dim"])
        specs: dict[str, HookSpec] = {"embed.hook_out": HookSpec("model.embed_tokens", "out", (), D)}
        for i, (kind, moe) in enumerate(zip(block_types(cfg), moe_layers(cfg))):
            L, b = f"model.layers.{i}", f"blocks.{i}"
            specs[f"{b}.hook_in"] = HookSpec(L, "in.hidden_states+in.residual", (), D)
            specs[f"{b}.ln1.hook_normalized"] = HookSpec(f"{L}.input_layernorm", "out[0]",
                                                         (UnfoldNorm(f"{L}.input_layernorm.weight"),), D)
            if kind == "mamba":
                M, m = f"{L}.mamba", f"{b}.mixer"
                specs[f"{m}.hook_in"] = HookSpec(M, "in.hidden_states", (), D, references=_hf(f"{m}.hook_in"))
                specs[f"{m}.in_proj.hook_out"] = HookSpec(f"{M}.in_proj", "out[0]", (), 2 * I,
                                                          references=_hf(f"{m}.in_proj.hook_out"))
                specs[f"{m}.x_proj.hook_in"] = HookSpec(f"{M}.x_proj", "in[0]", (), I,
                                                        references=_hf(f"{m}.x_proj.hook_in"))
                specs[f"{m}.x_proj.hook_out"] = HookSpec(f"{M}.x_proj", "out[0]", (), d["rank"] + 2 * d["state"],
                                                         references=_hf(f"{m}.x_proj.hook_out"))
                for norm, width in zip(NORMS, (d["rank"], d["state"], d["state"])):
                    specs[f"{m}.{norm}.hook_normalized"] = HookSpec(
                        f"{M}.{norm}", "out", (UnfoldNorm(f"{M}.{norm}.weight"),), width,
                        references=_hf(f"{m}.{norm}.hook_normalized"))
                specs[f"{m}.out_proj.hook_in"] = HookSpec(f"{M}.out_proj", "in[0]", (), I,
                                                          references=_hf(f"{m}.out_proj.hook_in"))
                # the mixer returns None (it fills ``output`` in place): its output is out_proj's
                specs[f"{m}.hook_out"] = HookSpec(f"{M}.out_proj", "out[0]", (), D, references=_hf(f"{m}.hook_out"))
            else:
                a = f"{b}.attn"
                specs[f"{a}.hook_in"] = HookSpec(f"{L}.qkv_proj", "in[0]", (), D)
                for x, cols, heads, width in (("q", Cols(0, q), qh, q), ("k", Cols(q, q + kv), kh, kv),
                                              ("v", Cols(q + kv, q + 2 * kv), kh, kv)):
                    specs[f"{a}.hook_{x}"] = HookSpec(f"{L}.qkv_proj", "out[0]", (cols, heads), width)
                specs[f"{a}.hook_z"] = HookSpec(f"{L}.o_proj", "in[0]", (qh,), q)
                specs[f"{a}.hook_out"] = HookSpec(f"{L}.o_proj", "out[0]", (), D)
            specs[f"{b}.hook_resid_mid"] = HookSpec(f"{L}.pre_ff_layernorm", "in[0]+in[1]", (), D)
            specs[f"{b}.ln2.hook_normalized"] = HookSpec(f"{L}.pre_ff_layernorm", "out[0]",
                                                         (UnfoldNorm(f"{L}.pre_ff_layernorm.weight"),), D)
            F = f"{L}.feed_forward"
            specs[f"{b}.mlp.hook_in"] = HookSpec(F, "in[0]", (), D)
            if moe:
                specs[f"{b}.mlp.gate.hook_out"] = HookSpec(
                    f"{F}.router", "out[0]", (), d["n_experts"],
                    references=tuple((ref, name.replace("{i}", str(i))) for ref, name in _ROUTER))
            else:
                specs[f"{b}.mlp.hook_pre"] = HookSpec(f"{F}.gate_up_proj", "out[0]", (Cols(0, dm),), dm)
                specs[f"{b}.mlp.hook_pre_linear"] = HookSpec(f"{F}.gate_up_proj", "out[0]", (Cols(dm, 2 * dm),), dm)
                specs[f"{b}.mlp.hook_post"] = HookSpec(f"{F}.down_proj", "in[0]", (), dm)
            specs[f"{b}.mlp.hook_out"] = HookSpec(F, "out", (), D)
            specs[f"{b}.hook_out"] = HookSpec(L, "out[0]+out[1]", (), D)
        specs["ln_final.hook_normalized"] = HookSpec("model.final_layernorm", "out[0]",
                                                     (UnfoldNorm("model.final_layernorm.weight"),), D)
        specs["unembed.hook_out"] = HookSpec("logits_processor", "out", (), int(config_get(cfg, "vocab_size")),
                                             calls="all")
        return specs

    def derived_specs(self, hf_config: Any) -> dict[str, Derived]:
        d = self.dims(hf_config)
        out: dict[str, Derived] = {}
        for i, kind in enumerate(block_types(hf_config)):
            if kind == "attention":
                common = dict(inputs=(f"blocks.{i}.attn.hook_q", f"blocks.{i}.attn.hook_k"),
                              scale=float(d["head_dim"]) ** -0.5)
                out[f"blocks.{i}.attn.hook_attn_scores"] = Derived("attn_scores", **common)
                out[f"blocks.{i}.attn.hook_pattern"] = Derived("pattern", **common)
        return out

    def nonfiring(self) -> list[NonFiring]:
        """The config-free part: none (every non-firing hook depends on the layer's kinds: :meth:`nonfiring_for`)."""
        return []

    def nonfiring_for(self, hf_config: Any) -> list[NonFiring]:
        cfg, out = hf_config, []
        for i, (kind, moe) in enumerate(zip(block_types(cfg), moe_layers(cfg))):
            at = lambda template: template.replace("{i}", str(i))  # noqa: E731
            if kind == "mamba":
                out += [NonFiring(f"blocks.{i}.{h}", f"layer {i} runs a Mamba-1 mixer (layers_block_type[{i}] is "
                                                     "'mamba'): no attention") for h in _ATTN]
                out += [NonFiring(at(nf.template), nf.reason) for nf in _FUSED]
            else:
                out += [NonFiring(f"blocks.{i}.{h}", f"layer {i} runs attention (layers_block_type[{i}] is "
                                                     "'attention'): no Mamba-1 mixer")
                        for h in (*_MIXER, *(nf.template.split(".", 2)[2] for nf in _FUSED))]
            if moe:
                out += [NonFiring(at(nf.template), nf.reason) for nf in MOE_NONFIRING]
                out += [NonFiring(f"blocks.{i}.mlp.gate.{h}", _NO_CHOICE)
                        for h in ("hook_expert_weights", "hook_expert_indices")]
            else:
                out.append(NonFiring(f"blocks.{i}.mlp.gate.hook_out", f"layer {i} runs a dense MLP "
                                                                      f"(layers_num_experts[{i}] is 1): no router"))
        return out


def _dt_rank(cfg: Any, d_model: int) -> int:
    rank = config_get(cfg, "mamba_dt_rank", default="auto")
    return -(-d_model // 16) if rank == "auto" else int(rank)  # HF's JambaConfig: ceil(hidden_size / 16)


__all__ = ["NORMS", "JambaOverlay", "block_types", "moe_layers"]
