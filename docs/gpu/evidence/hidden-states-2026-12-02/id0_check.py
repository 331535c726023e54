"""What the eager CUDA export put in layer id 0 (blocks.0.hook_in): for each eager report here, the
worst element of the failing blocks.0.hook_in row against HF's values of the same synthetic checkpoint
(same hash as on the device) at that prompt, position and dim: the embedding output (what id 0 should
be), layer 0's output, and the last layer's output before the final norm.  Runs on the CPU:
    .venv/bin/python docs/gpu/evidence/hidden-states-2026-12-02/id0_check.py
(the checkpoints are built by harness.models.checkpoints.checkpoint_dir)."""
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from harness.models.checkpoints import checkpoint_dir
from harness.models.families import FAMILIES

HERE = Path(__file__).parent
for fam in ("llama", "qwen3"):
    ck = checkpoint_dir(FAMILIES[fam])
    model = AutoModelForCausalLM.from_pretrained(ck, dtype=torch.float32).eval()
    outs = {}
    for i, layer in enumerate(model.model.layers):
        layer.register_forward_hook(lambda mod, a, o, i=i: outs.__setitem__(i, o[0] if isinstance(o, tuple) else o))
    for variant in ("float32-ieee", "bfloat16"):
        rep = json.loads((HERE / fam / f"report-vllm-hidden-states-cuda-{variant}.json").read_text())
        row = next(r for r in rep["rows"] if r["hook"] == "blocks.0.hook_in" and r["reference"] == "hf")
        w = row["worst"]
        pos, d = w["index"]
        with torch.no_grad():
            hs = model(torch.tensor([rep["prompts"][w["prompt"]]]), output_hidden_states=True).hidden_states
        last = len(model.model.layers) - 1
        print(f"{fam} {variant}: {Path(ck).name}, prompt {rep['prompt_names'][w['prompt']]} pos {pos} d {d}: "
              f"vLLM id 0 = {w['subject']:.5f}; HF embedding output = {hs[0][0, pos, d].item():.5f}, "
              f"layer 0 output = {outs[0][0, pos, d].item():.5f}, "
              f"layer {last} output before the final norm = {outs[last][0, pos, d].item():.5f}")
