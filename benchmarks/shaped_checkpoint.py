"""A real-shaped checkpoint with seeded random weights, for timing: Llama-3-8B's architecture.

Run (from the repo root)::

    python -m benchmarks.shaped_checkpoint --shape llama3-8b --dtype bfloat16 --out /tmp/llama3-8b-shaped
    python -m benchmarks.shaped_checkpoint --shape llama3-8b --small --layers 2 --out /tmp/l8b-small  # CPU smoke

Writes an HF checkpoint directory: ``config.json`` (the shape's config, declared as data in
``SHAPES``), safetensors shards of at most ``--shard-gb`` GB each plus
``model.safetensors.index.json``, a WordLevel tokenizer of exactly ``vocab_size`` ids (the
harness's synthetic-family tokenizer, harness/models/checkpoints.py: ``<pad>`` 0, ``<s>`` 1,
``</s>`` 2, ``<unk>`` 3, then ``t4``...; so ``bos_token_id`` / ``eos_token_id`` are 1 / 2, not
Llama-3's 128000 / 128001 -- ids, not architecture), and ``shaped_checkpoint.json``
(provenance: shape, overrides, seed, device, the seconds each step took, and the numeric check
below).  The directory appears only when complete (built under ``DIR.tmpPID``, then renamed);
an existing complete one is kept unless ``--force``.

Weights (every parameter randomized, none left at HF's init): norm weights ``1 ± U[0.1, 0.5]``
(random sign, never identity: the harness's rule); embedding and ``lm_head`` rows ``N(0, 1)``
and ``N(0, 1/hidden)``; every linear ``N(0, 1/fan_in)``.  With pre-norm blocks this keeps each
block's contribution O(1), so the residual's RMS grows like sqrt(layers) and stays finite in
bf16 over 32 layers.  Generated on ``--device`` (default: cuda when available; an 8B draws in
well under a second there) from one seeded generator in a fixed order (embed, layer 0..N-1,
final norm, lm_head): the same seed and device give the same bytes.  Host memory: one shard at
a time (tensors move to host as their shard is written, then are freed), never the model.

Numeric check, on the fly: while the weights are on the device, a plain functional Llama
forward (RMSNorm, RoPE, GQA causal attention, SwiGLU; ``reference_forward``) runs
``--check-tokens`` tokens through each layer as it is generated; the residual RMS after each
layer and the logits' std land in ``shaped_checkpoint.json``, and a non-finite value fails the
build.  ``--verify-hf`` (CPU-sized checkpoints) loads the written checkpoint with transformers
and compares its logits with that forward's.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import torch

# Llama-3-8B (meta-llama/Meta-Llama-3-8B config.json), the architecture only.
SHAPES: dict[str, dict] = {
    "llama3-8b": dict(
        architectures=["LlamaForCausalLM"], model_type="llama",
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        head_dim=128, intermediate_size=14336, vocab_size=128256, rope_theta=500000.0,
        rms_norm_eps=1e-5, max_position_embeddings=8192, tie_word_embeddings=False,
        hidden_act="silu", attention_bias=False, mlp_bias=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,  # the synthetic tokenizer's ids (module doc)
    ),
}
# --small: the same architecture at CPU size (head_dim 32: vLLM's CPU attention rejects 16);
# GQA ratio (4:1) and vocab (128256) kept.
SMALL = dict(hidden_size=256, num_attention_heads=8, num_key_value_heads=2, head_dim=32, intermediate_size=896)


def shape_config(shape: str, small: bool = False, layers: int | None = None) -> dict:
    cfg = dict(SHAPES[shape])
    if small:
        cfg.update(SMALL)
    if layers:
        cfg["num_hidden_layers"] = layers
    return cfg


def param_plan(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every parameter of LlamaForCausalLM, in generation order."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    plan = [("model.embed_tokens.weight", (v, h))]
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        plan += [(p + "input_layernorm.weight", (h,)),
                 (p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                 (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, q)),
                 (p + "post_attention_layernorm.weight", (h,)),
                 (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
                 (p + "mlp.down_proj.weight", (h, i))]
    plan += [("model.norm.weight", (h,))]
    if not cfg.get("tie_word_embeddings"):
        plan += [("lm_head.weight", (v, h))]
    return plan


def shards(plan, itemsize: int, max_bytes: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    out, cur, size = [], [], 0
    for name, shp in plan:
        b = math.prod(shp) * itemsize
        if cur and size + b > max_bytes:
            out.append(cur)
            cur, size = [], 0
        cur.append((name, shp))
        size += b
    return out + ([cur] if cur else [])


def draw(name: str, shp: tuple[int, ...], gen: torch.Generator, device: str) -> torch.Tensor:
    """One parameter, fp32 on ``device`` (module doc: the scales)."""
    if len(shp) == 1:  # a norm weight
        mag = 0.1 + 0.4 * torch.rand(shp, generator=gen, device=device)
        sign = torch.where(torch.rand(shp, generator=gen, device=device) < 0.5, -1.0, 1.0)
        return 1.0 + sign * mag
    t = torch.randn(shp, generator=gen, device=device)
    return t if name == "model.embed_tokens.weight" else t.mul_(shp[1] ** -0.5)


# -- the functional forward (the numeric check) -------------------------------------------------
def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x: [heads, T, hd]; HF's rotate-half convention."""
    t, hd = x.shape[-2], x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(t, device=x.device, dtype=torch.float32), inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x1, x2 = x.float()[..., : hd // 2], x.float()[..., hd // 2:]
    return (x.float() * cos + torch.cat([-x2, x1], -1) * sin).to(x.dtype)


def layer_forward(x: torch.Tensor, w: dict, cfg: dict) -> torch.Tensor:
    """One Llama decoder layer on x [T, hidden] (weights ``w`` by short name)."""
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps = cfg.get("head_dim") or cfg["hidden_size"] // nh, cfg["rms_norm_eps"]
    t = x.shape[0]
    h = _rms(x, w["input_layernorm.weight"], eps)
    q = (h @ w["self_attn.q_proj.weight"].T).view(t, nh, hd).transpose(0, 1)
    k = (h @ w["self_attn.k_proj.weight"].T).view(t, nkv, hd).transpose(0, 1)
    v = (h @ w["self_attn.v_proj.weight"].T).view(t, nkv, hd).transpose(0, 1)
    q, k = _rope(q, cfg["rope_theta"]), _rope(k, cfg["rope_theta"])
    k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)
    a = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
    x = x + a.transpose(0, 1).reshape(t, nh * hd) @ w["self_attn.o_proj.weight"].T
    h = _rms(x, w["post_attention_layernorm.weight"], eps)
    m = torch.nn.functional.silu(h @ w["mlp.gate_proj.weight"].T) * (h @ w["mlp.up_proj.weight"].T)
    return x + m @ w["mlp.down_proj.weight"].T


class Check:
    """Runs the check tokens through each layer as its weights appear (generation order)."""

    def __init__(self, cfg: dict, tokens: torch.Tensor, dtype: torch.dtype):
        self.cfg, self.tokens, self.dtype = cfg, tokens, dtype
        self.x: torch.Tensor | None = None
        self.layer: dict = {}
        self.resid_rms: list[float] = []
        self.logits_std: float | None = None
        self.logits: torch.Tensor | None = None

    def see(self, name: str, t: torch.Tensor) -> None:
        t = t.to(self.dtype)  # the stored dtype: the forward sees what vLLM will load
        cfg = self.cfg
        if name == "model.embed_tokens.weight":
            self.x = t[self.tokens.to(t.device)]
            self.resid_rms.append(self.x.float().pow(2).mean().sqrt().item())
            if cfg.get("tie_word_embeddings"):
                self.embed = t
        elif name.startswith("model.layers."):
            short = name.split(".", 3)[3]
            self.layer[short] = t
            if short == "mlp.down_proj.weight":  # the layer's last parameter
                self.x = layer_forward(self.x, self.layer, cfg)
                self.layer = {}
                self.resid_rms.append(self.x.float().pow(2).mean().sqrt().item())
        elif name == "model.norm.weight":
            self.final = _rms(self.x, t, cfg["rms_norm_eps"])
            if cfg.get("tie_word_embeddings"):
                self._logits(self.embed)
        elif name == "lm_head.weight":
            self._logits(t)

    def _logits(self, w: torch.Tensor) -> None:
        self.logits = (self.final @ w.T).float().cpu()
        self.logits_std = self.logits.std().item()

    def result(self) -> dict:
        vals = self.resid_rms + [self.logits_std]
        if not all(v is not None and math.isfinite(v) for v in vals):
            raise RuntimeError(f"non-finite activations in the check forward: resid RMS {self.resid_rms}, "
                               f"logits std {self.logits_std}")
        return {"tokens": len(self.tokens), "resid_rms_per_layer": [round(v, 4) for v in self.resid_rms],
                "logits_std": round(self.logits_std, 4)}


def build(args) -> Path:
    from safetensors.torch import save_file
    from transformers import AutoConfig

    from harness.models.checkpoints import write_tokenizer

    out = Path(args.out)
    if (out / "shaped_checkpoint.json").exists() and not args.force:
        print(f"{out}: already built (shaped_checkpoint.json there); --force rebuilds", file=sys.stderr)
        return out
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    cfg = shape_config(args.shape, args.small, args.layers)
    t_start = time.perf_counter()
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    kw = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type")}
    config = AutoConfig.for_model(cfg["model_type"], **kw)
    config.architectures = cfg["architectures"]
    config.dtype = dtype  # transformers 5 writes "dtype" (older: "torch_dtype")
    config.save_pretrained(tmp)
    write_tokenizer(tmp, cfg["vocab_size"])
    t_tok = time.perf_counter()

    itemsize = torch.empty((), dtype=dtype).element_size()
    plan = param_plan(cfg)
    groups = shards(plan, itemsize, int(args.shard_gb * 1e9))
    gen = torch.Generator(device=device).manual_seed(args.seed)
    tok_gen = torch.Generator().manual_seed(args.seed)
    check = Check(cfg, torch.randint(4, cfg["vocab_size"], (args.check_tokens,), generator=tok_gen), dtype)
    weight_map, total, t_draw, t_write = {}, 0, 0.0, 0.0
    for s, group in enumerate(groups):
        fname = f"model-{s + 1:05d}-of-{len(groups):05d}.safetensors" if len(groups) > 1 else "model.safetensors"
        tensors = {}
        for name, shp in group:
            t0 = time.perf_counter()
            t = draw(name, shp, gen, device)
            check.see(name, t)
            tensors[name] = t.to(dtype).cpu()
            del t
            t_draw += time.perf_counter() - t0
            weight_map[name] = fname
            total += tensors[name].numel() * itemsize
        t0 = time.perf_counter()
        save_file(tensors, str(tmp / fname), metadata={"format": "pt"})
        t_write += time.perf_counter() - t0
        del tensors
        print(f"  shard {s + 1}/{len(groups)} {fname} written ({time.perf_counter() - t_start:.1f} s)", file=sys.stderr)
    if len(groups) > 1:
        (tmp / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    checked = check.result()
    if check.logits is not None:
        torch.save({"tokens": check.tokens, "logits": check.logits}, tmp / "check_logits.pt")
    prov = {"shape": args.shape, "small": args.small, "layers": cfg["num_hidden_layers"], "config": cfg,
            "dtype": args.dtype, "seed": args.seed, "device": device,
            "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
            "torch": torch.__version__, "parameters": sum(math.prod(s) for _, s in plan), "bytes": total,
            "shards": len(groups), "check": checked,
            "seconds": {"config_and_tokenizer": round(t_tok - t_start, 2), "draw_and_check": round(t_draw, 2),
                        "write": round(t_write, 2), "total": round(time.perf_counter() - t_start, 2)}}
    (tmp / "shaped_checkpoint.json").write_text(json.dumps(prov, indent=2))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    print(json.dumps({k: prov[k] for k in ("shape", "layers", "parameters", "bytes", "shards", "device", "seconds")}),
          file=sys.stderr)
    print(f"  check: residual RMS per layer {checked['resid_rms_per_layer']}, logits std {checked['logits_std']}",
          file=sys.stderr)
    return out


def verify_hf(out: Path) -> float:
    """Load with transformers (CPU) and compare its logits with the build's check forward."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ref = torch.load(out / "check_logits.pt")
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype="auto")
    tok = AutoTokenizer.from_pretrained(str(out))
    assert len(tok) == model.config.vocab_size, (len(tok), model.config.vocab_size)
    with torch.no_grad():
        logits = model(ref["tokens"][None]).logits[0].float()
    err = (logits - ref["logits"]).abs().max().item() / ref["logits"].abs().max().item()
    print(f"  transformers {type(model).__name__} ({model.dtype}) loads it; tokenizer {len(tok)} ids; logits vs the "
          f"check forward: max abs err / max abs = {err:.2e}", file=sys.stderr)
    return err


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--out", required=True, help="checkpoint directory to write")
    ap.add_argument("--layers", type=int, default=None, help="override num_hidden_layers")
    ap.add_argument("--small", action="store_true", help=f"CPU-sized widths: {SMALL}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None, help="where to draw the weights (default: cuda if available)")
    ap.add_argument("--shard-gb", type=float, default=5.0, help="max shard size, GB")
    ap.add_argument("--check-tokens", type=int, default=16, help="tokens of the on-the-fly numeric check")
    ap.add_argument("--force", action="store_true", help="rebuild even if --out holds a complete build")
    ap.add_argument("--verify-hf", action="store_true", help="then load with transformers and compare logits")
    args = ap.parse_args(argv)
    out = build(args)
    if args.verify_hf:
        err = verify_hf(out)
        if not err < 0.05:
            print(f"transformers disagrees with the check forward: {err:.2e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
