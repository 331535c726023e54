"""vLLM's text-only Gemma-3n (``Gemma3nForCausalLM``) against HF on one text prompt, before a row exists for it.

Usage: ``.venv/bin/python scripts/gemma3n_per_layer_inputs.py [CHECKPOINT_DIR]`` (default: a temporary folder).
Builds a tiny synthetic Gemma-3n text checkpoint (every parameter randomized: 4 AltUp streams, a Laurel block,
per-layer inputs of width 32, activation sparsity, KV sharing, a sliding window, a final soft-cap), then prints the
largest and the mean |log-prob difference| of the prompt's tokens between vLLM (float32, eager) and HF as it is,
and between vLLM and HF with its per-layer token embeddings dropped (``get_per_layer_inputs`` returning None).
Equal to the second within float32 noise and far from the first: vLLM's text-only class never adds the per-layer
token embeddings (docs/upstream-bugs.md, "Gemma-3n").  Why no row yet: TransformerLens 4.3.0 cannot boot a
text-only Gemma-3n checkpoint (its adapter is for ``Gemma3nForConditionalGeneration``).
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch


def main() -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from harness.models.checkpoints import build_checkpoint
    from harness.models.families import _TINY, ModelSpec

    spec = ModelSpec("gemma3n_text", "gemma3n_text", {
        **_TINY, "hidden_size_per_layer_input": 32, "vocab_size_per_layer_input": 512, "laurel_rank": 16,
        "altup_num_inputs": 4, "num_kv_shared_layers": 1, "activation_sparsity_pattern": [0.95, 0.95, 0.0],
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"], "sliding_window": 8,
        "final_logit_softcapping": 30.0, "tie_word_embeddings": True})
    ck = str(build_checkpoint(spec, Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()) / "gemma3n"))
    torch.manual_seed(0)
    toks = torch.randint(3, 512, (48,)).tolist()

    import transformers
    from transformers.models.gemma3n import modeling_gemma3n as mg

    def hf_logprobs(drop_per_layer: bool) -> torch.Tensor:
        m = transformers.AutoModelForCausalLM.from_pretrained(ck, dtype=torch.float32,
                                                              attn_implementation="eager").eval()
        orig = mg.Gemma3nTextModel.get_per_layer_inputs
        if drop_per_layer:
            mg.Gemma3nTextModel.get_per_layer_inputs = lambda self, ids: None
        try:
            with torch.no_grad():
                return torch.log_softmax(m(torch.tensor([toks])).logits[0].double(), -1)
        finally:
            mg.Gemma3nTextModel.get_per_layer_inputs = orig

    hf, hf_dropped = hf_logprobs(False), hf_logprobs(True)
    from vllm import LLM, SamplingParams

    llm = LLM(model=ck, dtype="float32", enforce_eager=True, max_model_len=256, gpu_memory_utilization=0.5)
    rows = llm.generate([{"prompt_token_ids": toks}],
                        SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0))[0].prompt_logprobs

    def diff(ref: torch.Tensor) -> tuple[float, float]:
        d = [abs(rows[t][toks[t]].logprob - ref[t - 1, toks[t]].item()) for t in range(1, len(toks))]
        return max(d), sum(d) / len(d)

    print("largest / mean |dlogprob| vLLM vs HF:", diff(hf))
    print("largest / mean |dlogprob| vLLM vs HF without per-layer token embeddings:", diff(hf_dropped))


if __name__ == "__main__":
    main()
