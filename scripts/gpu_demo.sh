#!/usr/bin/env bash
# On an offline GPU host after the bundle is installed (scripts/gpu_bundle.sh, install.sh):
# (A) the Llama-3-8B-shaped dummy-weight baseline at concurrency 1,8,32 (roofline check), once;
# (B) a study of the real SmolLM2-135M on instructcoder (real acceptance on a GPU), one trial at
# a time without Ray.
#
#   scripts/gpu_demo.sh [BUDGET_S]     (default 480: fits one 10-minute call with room to pack)
#
# Resumable: the study lives in WORK (default /root/gpu-work, outside the checkout and $OUT),
# and the same command continues it where the last call stopped (finished trials are kept;
# --n-trials counts them). It stops itself within BUDGET_S: the tuner stops launching trials
# (--timeout) when too little time is left for one, and a SIGINT at the budget (the tuner's own
# Ctrl-C path: engines reaped, results stored) is only the safety net. Everything comes back as
# one file, $OUT/gpu-results.tar.gz (results may come back only a few files a call).
# env: SITE (/root/site), WORK, OUT (default ./gpu-results), SPACE (ngram), N_TRIALS (4),
#      NUM_PROMPTS (16), TRIAL_S (150: the longest one trial is expected to take), SKIP_A=1,
#      M8 (the 8B shape), TUNER_ARGS (more `tuner optimize` options, word-split).
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET_S=${1:-${BUDGET_S:-480}}; WORK=${WORK:-/root/gpu-work}
. scripts/gpu_host.sh
M8=${M8:-/root/stash/models/llama3-8b-shaped}
DUMMY='--load-format dummy --dtype bfloat16 --max-model-len 4096'
R="$WORK/results"; mkdir -p "$R"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$R/gpu.txt"
# run_for SECONDS CMD...: SIGINT at the budget (the tuner saves and exits), SIGKILL 30 s later.
run_for() { local s=$1; shift; timeout -s INT -k 30 "$s" "$@"; }
if [ "${SKIP_A:-0}" != 1 ] && [ ! -f "$WORK/b8/result.json" ]; then
  run_for "$(( $(left) / 2 ))" python3 -m tuner bench --model "$M8" --engine-args "$DUMMY" \
    --workload instructcoder --num-prompts 16 --output-len 128 --concurrency 1,8,32 \
    --output-dir "$WORK/b8" 2>&1 | tail -12 | tee "$R/a_bench8b.txt"
  cp "$WORK/b8/result.json" "$R/a_result.json" 2>/dev/null
  grep -E "model runner|async|backend|CUDA graph|Graph capturing|speculative" "$WORK/b8/engine.log" \
    | cut -c1-220 | head -20 >> "$R/a_bench8b.txt"
fi
TRIAL_S=${TRIAL_S:-150}
if [ "$(left)" -gt $(( TRIAL_S + 30 )) ]; then
  [ -d "$WORK/smol" ] && echo "gpu_demo: resuming the study in $WORK/smol"
  run_for "$(( $(left) - 20 ))" python3 -m tuner optimize --workload instructcoder \
    --space "${SPACE:-ngram}" --n-trials "${N_TRIALS:-4}" --num-prompts "${NUM_PROMPTS:-16}" \
    --output-len 128 --concurrency 1,8,32 --timeout "$(( $(left) - TRIAL_S ))" \
    ${TUNER_ARGS:-} --output-dir "$WORK/smol" 2>&1 | tee -a "$R/b_study.txt"
else
  echo "gpu_demo: $(left) s left, too little for one trial (TRIAL_S=$TRIAL_S): not starting the study"
fi
if [ -d "$WORK/smol" ]; then
  python3 -m tuner report "$WORK/smol" > "$R/b_report.txt" 2>&1
  for f in trials.csv trials_raw.csv predicted.csv recommendation.json report.html; do
    cp "$WORK/smol/$f" "$R/b_$f" 2>/dev/null; done
  # The engine-path lines of every launch (vLLM 0.26's own wording, for the path parser's tests).
  for d in "$WORK"/smol/trials/*/; do
    grep -hE "model runner|Model Runner|[Aa]sync scheduling|backend|cudagraph_mode|non-default args" \
      "$d/engine.log" 2>/dev/null | cut -c1-400 | sed "s|^|$(basename "$d"): |"
    # The CUDA graph mode as the config line states it (0.26 may leave it out: exclude_unset).
    grep -ho "enforce_eager=[A-Za-z]*\|device_config=[a-z]*\|'cudagraph_mode': <[^>]*>" \
      "$d/engine.log" 2>/dev/null | sort -u | sed "s|^|$(basename "$d"): |"; done > "$R/b_engine_paths.txt"
  # Each trial's token ids (tuner.tokens), so the replay and the cost model can be re-run here.
  mkdir -p "$R/tokens"
  for f in "$WORK"/smol/trials/*/tokens.npz; do
    [ -f "$f" ] && cp "$f" "$R/tokens/$(basename "$(dirname "$f")").npz"; done
  cp -r "$WORK"/smol/*.png "$R/" 2>/dev/null
fi
tar -czf "$OUT/gpu-results.tar.gz" -C "$WORK" results
echo "gpu_demo: $(( $(date +%s) - START )) s; results: $OUT/gpu-results.tar.gz ($(ls "$R" | tr '\n' ' '))"
