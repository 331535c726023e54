"""V2 runner, single prompt: what vLLM returned for the log-prob rows (an open finding)."""
import json, sys
from harness.models.families import FAMILIES
from harness.models.targets import target_for_family
from harness.pipeline.runner import run_model
from harness.values.variant import Variant
v = Variant.make(dtype="float32", device="cuda", runner="v2")
run = run_model(target_for_family(FAMILIES["qwen3"]), v)
r = run.result
meta = run.subject.meta if run.subject else {}
out = {"error": r.error, "logprob_rows_returned": meta.get("logprob_rows_returned"),
       "bad_rows": [(x.reference, x.hook, x.status, x.message[:300]) for x in r.rows if x.status != "pass"]}
if run.subject:
    lp = run.subject.logprobs
    out["nan_rows"] = {p: [int(i) for i in (t.isnan().all(-1)).nonzero().flatten()] for p, t in lp.items()}
print(json.dumps(out, indent=1, default=str))
