"""The RoBERTa and ModernBERT overlays (overlays/roberta.py, overlays/modernbert.py), engine-free: their module paths
are vLLM's trees (read from the installed vllm source), the ModernBERT HF reads are HF's tree (a built model's
modules) with the same layouts, the encoders served without a head declare it (Encoder.output "hidden": the
engine's task and tokenizer, the references' last hidden state), the HF-only plan (no bridge rows), the
bidirectional sliding window of the derived scores, and the non-firing reasons."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.models.families import FAMILIES
from overlays import get_overlay
from overlays.base import Encoder, UnfoldNorm
from overlays.modernbert import ModernBertOverlay
from overlays.roberta import RobertaOverlay


def _target(name):
    from harness.models.targets import target_for_family

    return target_for_family(FAMILIES[name])


def _vllm_source(module: str) -> str:
    import vllm

    return (Path(vllm.__file__).parent / f"model_executor/models/{module}.py").read_text()


def test_registered_as_encoders_served_without_a_head():
    rob, mb = get_overlay("RobertaForMaskedLM"), get_overlay("ModernBertModel")
    assert isinstance(rob, RobertaOverlay) and isinstance(mb, ModernBertOverlay)
    for ov in (rob, mb):
        assert ov.encoder.output == "hidden" and ov.encoder.pooling_task == "token_embed"
        assert ov.encoder.second_segment is None and ov.norm_weight_offset == 0.0
    assert rob.encoder.hf_class == "AutoModelForMaskedLM" and mb.encoder.hf_class == "AutoModel"
    assert rob.tl_adapter and not mb.tl_adapter
    assert FAMILIES["roberta"].architecture == "RobertaForMaskedLM"
    assert FAMILIES["modernbert"].architecture == "ModernBertModel"
    with pytest.raises(ValueError, match="output"):
        Encoder(output="pooled")


def test_vllm_serves_both_as_embedding_models_without_a_head():
    from harness.engines.vllm_compat import _registry_tables  # noqa: F401 -- the registry is read from its source
    import vllm

    reg = (Path(vllm.__file__).parent / "model_executor/models/registry.py").read_text()
    assert '"RobertaForMaskedLM": ("roberta", "RobertaEmbeddingModel")' in reg
    assert '"ModernBertModel": ("modernbert", "ModernBertModel")' in reg
    assert '{"lm_head.": None}' in _vllm_source("roberta")  # the MLM head is dropped at load


def test_roberta_is_berts_tree_under_model_without_the_head():
    cfg = _target("roberta").hf_config
    specs = RobertaOverlay().hook_specs(cfg)
    assert not {"mlm_head.hook_out", "ln_final.hook_normalized", "unembed.hook_out"} & set(specs)
    assert all(s.module.startswith("model.") for s in specs.values())
    assert specs["pos_embed.hook_out"].module == "model.embeddings.position_embeddings"
    ln1 = "model.encoder.layer.0.attention.output.LayerNorm"
    assert specs["blocks.0.ln1.hook_normalized"].convert == (UnfoldNorm(f"{ln1}.weight", bias=f"{ln1}.bias"),)
    names = {nf.template for nf in RobertaOverlay().nonfiring()}
    assert {"mlm_head.hook_out", "ln_final.hook_normalized", "ln_final.hook_scale", "unembed.hook_out"} <= names
    src = _vllm_source("bert") + _vllm_source("roberta")
    attrs = {a for s in specs.values() for a in s.module.split(".") if not a.isdigit()}
    assert not [a for a in attrs if f"self.{a} =" not in src]


def test_modernbert_paths_are_vllms_and_hfs_trees():
    target = _target("modernbert")
    cfg = target.hf_config
    ov = ModernBertOverlay()
    specs, reads = ov.hook_specs(cfg), ov.hf_reads(cfg)
    src = _vllm_source("modernbert")
    attrs = {a for s in specs.values() for a in s.module.split(".") if not a.isdigit()}
    assert not [a for a in attrs if f"self.{a} =" not in src]
    from transformers import AutoModel

    hf = AutoModel.from_config(cfg)
    hf_modules = dict(hf.named_modules())
    assert all(s.module in hf_modules for s in reads.values())
    # every hook but the derived inputs and HF's own forward-hook captures is read at HF's modules, same layout
    assert set(specs) - set(reads) == {"embed.hook_out", *(f"blocks.{i}.{h}" for i in range(3)
                                       for h in ("hook_in", "hook_out", "attn.hook_rot_q", "attn.hook_rot_k"))}
    vllm_path = lambda path: path.replace("layers.", "encoder_layer.layers.", 1) if path.startswith("layers.") else path  # noqa: E731
    for hook, read in reads.items():
        assert vllm_path(read.module) == specs[hook].module, hook
        assert tuple(UnfoldNorm(vllm_path(c.param)) if isinstance(c, UnfoldNorm) else c
                     for c in read.convert) == specs[hook].convert, hook  # the same layouts, HF's parameter names
        assert specs[hook].reference_name("hf", None) == hook and specs[hook].reference_name("bridge", "x") is None
    assert specs["blocks.1.mlp.hook_pre"].convert[0].stop == 192 and specs["blocks.1.mlp.hook_pre_linear"].convert[
        0].start == 192
    assert "blocks.0.ln1.hook_normalized" not in specs  # layer 0's attn_norm is nn.Identity
    assert isinstance(hf.layers[0].attn_norm, torch.nn.Identity)


def test_modernbert_derived_window_is_bidirectional():
    from harness.comparison.derived import visible_keys

    derived = ModernBertOverlay().derived_specs(_target("modernbert").hf_config)
    assert [derived[f"blocks.{i}.attn.hook_pattern"].window for i in range(3)] == [None, 5, None]
    assert all(not d.causal for d in derived.values())
    seen = visible_keys(12, 5, causal=False)
    assert seen[6].nonzero().flatten().tolist() == [2, 3, 4, 5, 6, 7, 8, 9, 10]  # |i - j| <= sliding_window 4
    assert visible_keys(4, 2).int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]


def test_modernbert_plan_is_hf_only_and_engine_request_picks_the_task():
    from harness.values.engine_request import run_request
    from harness.values.plan import build_plan
    from harness.values.variant import Variant

    target, variant = _target("modernbert"), Variant.make("float32", "cpu")
    plan = build_plan(target, variant)
    assert {c.reference for c in plan.cases} == {"hf"} and not plan.bridge
    prompts = [[1, 5, 6, 7], [1, 8, 9]]
    inputs = plan.reference_inputs(prompts)
    assert (inputs.bridge, inputs.output, inputs.hf_class, inputs.token_types) == (False, "hidden", "AutoModel", None)
    assert dict(inputs.hf_reads) == ModernBertOverlay().hf_reads(target.hf_config)
    req = run_request(target, variant, plan, prompts)
    assert req.pooling.task == "token_embed" and req.pooling.width == 128 and req.pooling.token_types is None
    assert req.llm_overrides["pooler_config"] == {"task": "token_embed"}
    assert req.llm_overrides["skip_tokenizer_init"] is False


def test_hf_module_reads_and_the_last_hidden_state():
    from harness.references.reference import _hf_run

    target = _target("modernbert")
    from transformers import AutoModel

    torch.manual_seed(0)
    model = AutoModel.from_config(target.hf_config, attn_implementation="eager").eval()
    reads = tuple(ModernBertOverlay().hf_reads(target.hf_config).items())
    caps, logprobs = _hf_run(model, [1, 5, 6, 7, 8, 9], "cpu", 3, output="hidden", reads=reads)
    assert caps["blocks.1.attn.hook_q"].shape == (6, 4, 32) and caps["blocks.1.mlp.hook_pre"].shape == (6, 192)
    with torch.no_grad():
        out = model(torch.tensor([[1, 5, 6, 7, 8, 9]]))
    assert torch.allclose(logprobs, torch.log_softmax(out.last_hidden_state[0].double(), -1))
    w = model.final_norm.weight.detach()
    assert torch.allclose(caps["ln_final.hook_normalized"], out.last_hidden_state[0] / w, atol=1e-5)
