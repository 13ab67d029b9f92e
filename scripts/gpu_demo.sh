#!/usr/bin/env bash
# On an offline GPU host after the bundle is installed (scripts/gpu_bundle.sh, install.sh):
# (A) the Llama-3-8B-shaped dummy-weight baseline at concurrency 1,8,32 (roofline check), then
# (B) a study of the real SmolLM2-135M on instructcoder (real acceptance on a GPU).
# Results are copied to $OUT (or ./gpu-results) as they finish. Each step has a time limit.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-results}; mkdir -p "$OUT"
SITE=${SITE:-/root/site}
. "$SITE/spec-tuner-env.sh"
export PYTHONPATH="$PWD:${PYTHONPATH:-}"   # this checkout's tuner, not the bundled wheel
export PYTHONUNBUFFERED=1
M8=${M8:-/root/stash/models/llama3-8b-shaped}
DUMMY='--load-format dummy --dtype bfloat16 --max-model-len 4096'
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
W=/tmp/gpu-work; rm -rf "$W"; mkdir -p "$W"
if [ "${SKIP_A:-0}" != 1 ]; then
  timeout "${A_TIMEOUT:-230}" python3 -m tuner bench --model "$M8" --engine-args "$DUMMY" \
    --workload instructcoder --num-prompts 16 --output-len 128 --concurrency 1,8,32 \
    --output-dir "$W/b8" 2>&1 | tail -12 | tee "$OUT/a_bench8b.txt"
  cp "$W/b8/result.json" "$OUT/a_result.json" 2>/dev/null
  grep -E "model runner|async|backend|CUDA graph|Graph capturing|speculative" "$W/b8/engine.log" \
    | cut -c1-220 | head -20 >> "$OUT/a_bench8b.txt"
fi
timeout "${B_TIMEOUT:-330}" python3 -m tuner optimize --workload instructcoder --space "${SPACE:-ngram}" \
  --n-trials "${N_TRIALS:-4}" --num-prompts 16 --output-len 128 --concurrency 1,8,32 \
  --output-dir "$W/smol" 2>&1 | tail -40 | tee "$OUT/b_study.txt"
python3 -m tuner report "$W/smol" > "$OUT/b_report.txt" 2>&1
for f in trials.csv recommendation.json report.html; do cp "$W/smol/$f" "$OUT/b_$f" 2>/dev/null; done
ls -la "$OUT"
