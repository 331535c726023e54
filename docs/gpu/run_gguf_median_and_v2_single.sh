#!/usr/bin/env bash
# Two GPU jobs side by side on one H200 (vLLM 0.20.2): the GGUF parity with median-row gating (both
# dtypes, run_gguf.sh) and the V2 runner's single-prompt runs of qwen3 and gemma (their unreturned
# sampled-token log-prob rows named and left out).  Same setup as run_8b_fp32_and_gguf.sh.
# Results under /tmp/res3.
mkdir -p /tmp/vp /tmp/res3
tar --exclude=./.gpuwhl -cf - . | (cd /tmp/vp && tar -xf -)
cd /tmp/vp && rm -rf reports
export PYTHONPATH=/tmp/site:/tmp/vp HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
# the capture hooks' vllm.general_plugins entry point, before either job boots vLLM (run_gguf.sh writes it too)
PY=${PY:-python3} bash docs/gpu/register_plugin.sh /tmp/site
setsid nohup bash -c 'RES=/tmp/res3/gguf TOTAL_S=230 bash docs/gpu/run_gguf.sh > /tmp/res3/gguf.out 2>&1; echo "gguf done $(date +%s)" >> /tmp/res3/steps' >/dev/null 2>&1 </dev/null &
setsid nohup bash -c 'timeout 220 python3 -m harness run --model qwen3,gemma --device cuda --runner v2 --report-dir /tmp/res3/v2 > /tmp/res3/v2.out 2>&1; echo "v2 done $(date +%s)" >> /tmp/res3/steps' >/dev/null 2>&1 </dev/null &
echo "started $(date +%s)" >> /tmp/res3/steps
