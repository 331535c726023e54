"""A checkpoint holding one NaN weight: both engines produce NaN from there on, and two NaN
captures must never compare as agreement.  Real engines end to end (one vLLM boot, fp32).

Before this rule the NaN hooks read rel_err 0.0 and passed, log-probs and argmax too: the
comparison ignores NaN on the reference side (it marks entries vLLM did not return).

The checkpoint carries a toy tokenizer of its own (a WordPiece model over the synthetic vocabulary,
not the WordLevel toy the harness recognises by type): the default text prompts tokenize to unknown
tokens under it, so the run falls back to the token-id prompts and says so, and the NaN is reached
(before, the run stopped on an internal prompt-length constraint and never reported it)."""
from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file, save_file

pytestmark = pytest.mark.parity

PLANTED = "model.layers.1.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory):
    from harness.models.checkpoints import checkpoint_dir
    from harness.models.families import FAMILIES
    from harness.models.targets import target_for_path
    from harness.pipeline.runner import run_model
    from harness.values.variant import Variant

    src = checkpoint_dir(FAMILIES["llama"])
    dst = tmp_path_factory.mktemp("nan") / "llama-nan"
    shutil.copytree(src, dst)
    (weights,) = dst.glob("*.safetensors")
    tensors = load_file(weights)
    tensors[PLANTED] = tensors[PLANTED].clone()
    tensors[PLANTED][3, 7] = float("nan")
    save_file(tensors, weights, metadata={"format": "pt"})
    _toy_wordpiece_tokenizer(dst)
    run = run_model(target_for_path(str(dst)), Variant.make("float32", "cpu"),
                    hooks={"blocks.0.hook_out", "blocks.1.mlp.hook_post", "blocks.1.mlp.hook_out", "blocks.1.hook_out",
                           "blocks.2.hook_out", "ln_final.hook_normalized"})
    assert run.result.error is None, run.result.error
    return run


def _toy_wordpiece_tokenizer(out, vocab_size=None) -> None:
    """Replace the checkpoint's tokenizer by a WordPiece toy over the same ids (<pad> <s> </s> <unk> t4 ...)."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    n = vocab_size or json.loads((out / "config.json").read_text())["vocab_size"]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"t{i}": i for i in range(4, n)}}
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (out / name).unlink(missing_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            pad_token="<pad>").save_pretrained(out)


def test_a_toy_tokenizer_of_its_own_runs_the_token_id_prompts_and_says_why(nan_run):
    info = nan_run.result.prompt_info
    assert info["source"].startswith("token ids") and "degenerate" in info["source"], info["source"]
    assert "unknown token" in info["source"], info["source"]
    assert any(n.startswith("token-id prompts") for n in info.get("notes", []))
    assert nan_run.result.prompt_names == ["short", "medium", "repeated", "long"]


def test_nan_rows_are_errors_naming_the_first_non_finite_hook(nan_run):
    rows = {(r.reference, r.hook): r for r in nan_run.result.rows}
    assert rows[("bridge", "blocks.0.hook_out")].status == "pass"  # upstream of the NaN weight
    assert rows[("bridge", "blocks.1.mlp.hook_post")].status == "pass"  # down_proj's input is still finite
    for hook in ("blocks.1.mlp.hook_out", "blocks.1.hook_out", "blocks.2.hook_out", "ln_final.hook_normalized"):
        row = rows[("bridge", hook)]
        assert row.status == "error", (hook, row.status, row.message)
        assert "non-finite values" in row.message and "NaN in vLLM's" in row.message
        assert "first non-finite hook of vLLM in forward order: NaN in vLLM's blocks.1.mlp.hook_out" in row.message
    assert rows[("hf", "logprobs")].status == "error" and rows[("hf", "argmax")].status == "error"


def test_a_run_with_nan_never_reports_pass(nan_run):
    s = nan_run.result.summary  # the verdict run_model stored
    assert s["verdict"] == "error" and s["errors"] > 0
