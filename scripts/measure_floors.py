"""How far a dtype's reference sits from its truth run, token by token: the measurement behind the
median-row gate.  ``python scripts/measure_floors.py smollm2`` (about 2 minutes on 2 cores) prints,
per decoder layer of HF's model, the per-token relative error of ``hook_out`` in bf16 against fp32
with the original weights and against fp32 with the bf16-rounded weights: the worst token, the 90th
percentile and the median, over the default prompts.
"""
import torch, sys, time
from transformers import AutoModelForCausalLM
from harness.models.checkpoints import checkpoint_dir
from harness.models.families import FAMILIES
from harness.models.prompts import default_prompts
from harness.references.reference import decoder_layers
name = sys.argv[1] if len(sys.argv) > 1 else "smollm2"  # a family of harness/models/families.py
ck = checkpoint_dir(FAMILIES[name])
torch.set_num_threads(2)
def load(dtype, round_to=None):
    m = AutoModelForCausalLM.from_pretrained(str(ck), dtype=torch.float32, attn_implementation="eager")
    if round_to is not None:
        with torch.no_grad():
            for p in m.parameters(): p.copy_(p.to(round_to).to(torch.float32))
    return m.to(dtype).eval()
def run(m, toks):
    caps = {}
    hs = []
    for i, l in enumerate(decoder_layers(m, m.config.num_hidden_layers)):
        hs.append(l.register_forward_hook(lambda mod, a, o, _i=i: caps.__setitem__(_i, (o[0] if isinstance(o, tuple) else o)[0].double())))
    with torch.no_grad(): m(torch.tensor([toks]))
    for h in hs: h.remove()
    return caps
cfg = load(torch.float32).config
prompts = list(default_prompts(cfg.vocab_size, cfg.bos_token_id, 256).values())
t=time.time()
mb = load(torch.bfloat16); m32 = load(torch.float32); m32r = load(torch.float32, torch.bfloat16)
print("loaded", time.time()-t, flush=True)
def rel(a, b):  # per-token
    return ((a-b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-30))
res = {}
for p, toks in enumerate(prompts):
    cb, c32, c32r = run(mb, toks), run(m32, toks), run(m32r, toks)
    for i in cb:
        res.setdefault(i, []).append((rel(cb[i], c32[i]), rel(cb[i], c32r[i])))
print("layer | unrounded: max p90 p50 | rounded-weights: max p90 p50")
for i, lst in res.items():
    a = torch.cat([x for x, _ in lst]); b = torch.cat([y for _, y in lst])
    q = lambda v: (v.max().item(), v.quantile(0.9).item(), v.median().item())
    print(i, "| %.3g %.3g %.3g | %.3g %.3g %.3g" % (*q(a), *q(b)), flush=True)
