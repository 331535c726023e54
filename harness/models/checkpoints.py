"""Deterministic tiny synthetic checkpoints, built offline and cached.

Contract: :func:`checkpoint_dir(spec)` returns a directory holding an HF
checkpoint (``config.json``, safetensors weights, a WordLevel tokenizer) for
the family row ``spec``; the same spec always yields the same bytes, and a
built directory is reused (keyed by a hash of the spec and this module's
``BUILD_VERSION``).  A row with ``packaged`` set is a real trained checkpoint
instead: :func:`checkpoint_dir` hands it to :mod:`harness.models.gguf_checkpoint`,
which shares :func:`harness.paths.checkpoints_root`.

Every parameter is randomized: HF's default init leaves norm weights at 1
(Gemma: 0) and biases at 0, which would hide un-fold and bias bugs.  So is every
learned value HF keeps as a buffer (:data:`LEARNED_BUFFERS`: the sigmoid
router's ``e_score_correction_bias``, zero-initialized, which vLLM and HF add to
the expert scores before the top-k: a zero bias would leave a wrong bias read
untested).  Norm
weights land in [0.5, 0.9] U [1.1, 1.5] (as an offset from 1 for Gemma-style
norms), so neither ``÷ w`` nor ``÷ (1 + w)`` can be confused with identity.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from harness.models.families import ModelSpec
from harness.paths import checkpoints_root

BUILD_VERSION = 1
# buffer names (suffixes) holding learned values, randomized like parameters
LEARNED_BUFFERS = ("e_score_correction_bias", "expert_bias")  # expert_bias: LFM2-MoE's (its MoE block's buffer)
# buffer names (suffixes) holding learned multipliers HF initializes to 1 (Gemma-4's per-layer layer_scalar, which
# scales the whole stream): randomized around 1 as norm weights are, so a scalar left unread cannot pass as identity
LEARNED_SCALES = ("layer_scalar",)
# integer buffers holding a learned token -> experts table HF zero-initializes (DeepSeek-V4's hash-routed MoE layers,
# ``tid2eid`` [vocab, top_k]: every token to expert 0): filled with distinct random experts per token
ROUTE_TABLES = ("tid2eid",)


def spec_key(spec: ModelSpec) -> str:
    blob = json.dumps(
        {"v": BUILD_VERSION, "type": spec.model_type, "config": dict(spec.config),
         "offset": spec.norm_weight_offset, "seed": spec.seed,
         **({"architecture": spec.released_architecture} if spec.released_architecture else {}),
         **({"weight_names": [list(p) for p in spec.released_weight_names]} if spec.released_weight_names else {})},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _is_norm_weight(name: str, param: torch.Tensor) -> bool:
    lowered = name.lower()
    return param.ndim == 1 and ("norm" in lowered or ".ln" in lowered) and name.endswith("weight")


def randomize_(model: torch.nn.Module, spec: ModelSpec) -> None:
    """Overwrite every parameter with seeded random values (in place)."""
    gen = torch.Generator().manual_seed(spec.seed)
    # learned values HF keeps as buffers (and initializes to zero): the sigmoid router's expert-score
    # correction bias (DeepSeek-V3, GLM-4-MoE), which a zero would make a no-op in the routing
    learned_buffers = [(n, b) for n, b in model.named_buffers() if n.endswith(LEARNED_BUFFERS + LEARNED_SCALES)]
    with torch.no_grad():
        for name, param in sorted([*model.named_parameters(), *learned_buffers], key=lambda kv: kv[0]):
            shape = param.shape
            if name.endswith(LEARNED_SCALES):  # around 1, whatever the norms' offset
                mag = 0.1 + 0.4 * torch.rand(shape, generator=gen)
                value = 1.0 + torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0) * mag
            elif _is_norm_weight(name, param):
                # magnitude in [0.1, 0.5], random sign, around 1.
                mag = 0.1 + 0.4 * torch.rand(shape, generator=gen)
                sign = torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0)
                value = 1.0 + sign * mag - spec.norm_weight_offset
            elif param.ndim == 1:  # biases (and layer-norm biases)
                value = 0.1 * torch.randn(shape, generator=gen)
            elif "embed" in name or "wte" in name or "wpe" in name:
                value = torch.randn(shape, generator=gen)
            else:
                fan_in = shape[-1]
                value = torch.randn(shape, generator=gen) / fan_in**0.5
            param.copy_(value.to(param.dtype))
        for name, table in model.named_buffers():
            if name.endswith(ROUTE_TABLES):
                experts = int(model.config.n_routed_experts)
                ranked = torch.argsort(torch.rand(table.shape[0], experts, generator=gen), dim=-1)
                table.copy_(ranked[:, : table.shape[1]].to(table.dtype))


def write_tokenizer(out: Path, vocab_size: int) -> None:
    """Save a synthetic checkpoint's tokenizer into ``out``: WordLevel over ``vocab_size`` entries
    (``<pad> <s> </s> <unk>``, then ``t4``, ``t5``, ...), split on whitespace."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for i in range(len(vocab), vocab_size):
        vocab[f"t{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
        unk_token="<unk>", pad_token="<pad>",
    )
    fast.save_pretrained(out)


def build_checkpoint(spec: ModelSpec, out: Path) -> Path:
    import transformers
    from transformers import AutoConfig

    config = AutoConfig.for_model(spec.model_type, **spec.hf_config_kwargs())
    torch.manual_seed(spec.seed)
    model = getattr(transformers, spec.auto_class).from_config(config, dtype=torch.float32)
    randomize_(model, spec)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")  # per process: parallel jobs may build the same one
    tmp.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp, safe_serialization=True)
    if spec.released_weight_names:
        rename_weights(tmp, spec.released_weight_names)
    if spec.released_architecture:  # as the released checkpoints spell it (ModelSpec.released_architecture)
        cfg = json.loads((tmp / "config.json").read_text())
        cfg["architectures"] = [spec.released_architecture]
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    write_tokenizer(tmp, config.vocab_size)
    (tmp / "vllm_parity_spec.json").write_text(
        json.dumps({"family": spec.name, "key": spec_key(spec)}, indent=2)
    )
    try:
        tmp.rename(out)
    except OSError:  # another process finished the same (deterministic) build first
        if not (out / "config.json").exists():
            raise
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


def rename_weights(checkpoint: Path, renames: tuple[tuple[str, str], ...]) -> None:
    """Rename the weights of ``checkpoint``'s safetensors files whose key holds ``.saved.`` to ``.released.``
    (:attr:`ModelSpec.released_weight_names`), metadata kept; raises when a rename matches no key (the row's
    declaration is stale).  A synthetic checkpoint is one unsharded file: no index to rewrite."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    used = set()
    for path in sorted(checkpoint.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            meta = f.metadata()
            state = {k: f.get_tensor(k) for k in f.keys()}
        renamed = {}
        for key, value in state.items():
            for saved, released in renames:
                if f".{saved}." in key:
                    key = key.replace(f".{saved}.", f".{released}.")
                    used.add(saved)
            renamed[key] = value
        save_file(renamed, str(path), metadata=meta)
    unused = [saved for saved, _ in renames if saved not in used]
    if unused:
        raise ValueError(f"released_weight_names: no weight of {checkpoint} is named {unused} (transformers now saves "
                         "another layout: update the family row)")


def checkpoint_dir(spec: ModelSpec) -> Path:
    """Build (once) and return the checkpoint for ``spec``: synthetic, or a
    packaged real one (``spec.packaged``; see :mod:`harness.models.gguf_checkpoint`)."""
    if spec.packaged is not None:
        from harness.models.gguf_checkpoint import packaged_checkpoint_dir

        return packaged_checkpoint_dir(spec)
    out = checkpoints_root() / f"{spec.name}-{spec_key(spec)}"
    if not (out / "config.json").exists():
        build_checkpoint(spec, out)
    return out
