#!/usr/bin/env bash
# On an air-gapped GPU host, once the bundle is installed (scripts/gpu_bundle.sh, install.sh):
# (A) the Llama-3-8B-shaped dummy-weight baseline (roofline check), once;
# (B) a study of the real SmolLM2-135M (real acceptance on a GPU), one trial at a time, no Ray.
#
#   scripts/gpu_demo.sh [BUDGET_S]     (default 480 seconds)
#
# Resumable: the study lives in WORK (default ~/spec-tuner-gpu/demo, outside the checkout and
# OUT), and the same command continues it where the last run stopped (finished trials are kept;
# --n-trials counts them). It stops itself within BUDGET_S: the tuner stops launching trials
# (--timeout) when too little time is left for one, and a SIGINT at the budget (the tuner's own
# Ctrl-C path: engines reaped, results stored) is only the safety net. Each run packs what to
# bring back into one file, OUT/gpu-results.tar.gz: results/study/ is the study folder less
# engine logs and per-request records (study.journal, the report, each trial's token ids), so
# `tuner report` and `tuner predict` run on it on any machine; results/*.txt hold the printed
# output, the GPU and each launch's engine-path lines.
# env: SITE (~/spec-tuner-gpu/site), WORK, OUT (./gpu-results), SPACE (ngram), N_TRIALS (4),
#      WORKLOAD, NUM_PROMPTS, OUTPUT_LEN, CONCURRENCY (as gpu_bench.sh: instructcoder, 64, 128,
#      1,8,32), TRIAL_S (150: the longest one trial is expected to take), SKIP_A=1 (skip A),
#      M8 (the 8B shape's folder), STUDY_DIR (the study's folder, default WORK/smol), MODEL
#      (the study's --model; default the embedded SmolLM2-135M), ENGINE_ARGS (the study's vLLM
#      arguments as one string, passed whole: ENGINE_ARGS='--load-format dummy --dtype bfloat16'),
#      TUNER_ARGS (more `tuner optimize` options, split on whitespace, so no value with a space
#      or a quote in it).
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET_S=${1:-${BUDGET_S:-480}}; WORK=${WORK:-$HOME/spec-tuner-gpu/demo}
. scripts/gpu_host.sh
M8=${M8:-${SPEC_TUNER_SHAPES:-$SITE/model-shapes}/llama3-8b-shaped}
DUMMY='--load-format dummy --dtype bfloat16 --max-model-len 4096'
R="$WORK/results"; mkdir -p "$R"
STUDY_DIR=${STUDY_DIR:-$WORK/smol}
case "${TUNER_ARGS:-}" in *[\'\"]*)
  echo "gpu_demo: TUNER_ARGS is split on whitespace and keeps quotes as they are; put vLLM's" \
       "arguments in ENGINE_ARGS (one string) and the model in MODEL" >&2; exit 2 ;; esac
STUDY_ENGINE=()
[ -n "${MODEL:-}" ] && STUDY_ENGINE+=(--model "$MODEL")
# As one argument, in the --opt=VALUE form: a value that starts with -- is not read as an option.
[ -n "${ENGINE_ARGS:-}" ] && STUDY_ENGINE+=("--engine-args=$ENGINE_ARGS")
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$R/gpu.txt"
# run_for SECONDS CMD...: SIGINT at the budget (the tuner saves and exits), SIGKILL 30 s later.
run_for() { local s=$1; shift; timeout -s INT -k 30 "$s" "$@"; }
MEASURE=(--workload "$WORKLOAD" --num-prompts "$NUM_PROMPTS" --output-len "$OUTPUT_LEN"
         --concurrency "$CONCURRENCY")
if [ "${SKIP_A:-0}" != 1 ] && [ ! -f "$WORK/b8/result.json" ]; then
  run_for "$(( $(left) / 2 ))" python3 -m tuner bench --model "$M8" --engine-args "$DUMMY" \
    "${MEASURE[@]}" --output-dir "$WORK/b8" 2>&1 | tail -12 | tee "$R/a_bench8b.txt"
  cp "$WORK/b8/result.json" "$R/a_result.json" 2>/dev/null
  grep -E "model runner|async|backend|CUDA graph|Graph capturing|speculative" "$WORK/b8/engine.log" \
    | cut -c1-220 | head -20 >> "$R/a_bench8b.txt"
fi
TRIAL_S=${TRIAL_S:-150}
if [ "$(left)" -gt $(( TRIAL_S + 30 )) ]; then
  [ -d "$STUDY_DIR" ] && echo "gpu_demo: resuming the study in $STUDY_DIR"
  run_for "$(( $(left) - 20 ))" python3 -m tuner optimize "${MEASURE[@]}" \
    ${STUDY_ENGINE[@]+"${STUDY_ENGINE[@]}"} \
    --space "${SPACE:-ngram}" --n-trials "${N_TRIALS:-4}" --timeout "$(( $(left) - TRIAL_S ))" \
    ${TUNER_ARGS:-} --output-dir "$STUDY_DIR" 2>&1 | tee -a "$R/b_study.txt"
else
  echo "gpu_demo: $(left) s left, too little for one trial (TRIAL_S=$TRIAL_S): not starting the study"
fi
if [ -d "$STUDY_DIR" ]; then
  python3 -m tuner report "$STUDY_DIR" > "$R/b_report.txt" 2>&1
  # The study folder as `tuner report` and `tuner predict` read it: study.journal, the outputs
  # and each trial's token ids (trials/N/tokens.npz); engine logs, per-request records and lock
  # files stay here.
  rm -rf "$R/study"; mkdir -p "$R/study"
  tar -C "$STUDY_DIR" --exclude=engine.log --exclude=requests.jsonl --exclude='*.lock' -cf - . \
    | tar -C "$R/study" -xf -
  # The engine-path lines of every launch (vLLM 0.26's own wording, for the path parser's tests).
  for d in "$STUDY_DIR"/trials/*/ "$STUDY_DIR"/policy/*/; do
    grep -hE "model runner|Model Runner|[Aa]sync scheduling|backend|cudagraph_mode|non-default args" \
      "$d/engine.log" 2>/dev/null | cut -c1-400 | sed "s|^|$(basename "$d"): |"
    # The CUDA graph mode as the config line states it (0.26 may leave it out: exclude_unset).
    grep -ho "enforce_eager=[A-Za-z]*\|device_config=[a-z]*\|'cudagraph_mode': <[^>]*>" \
      "$d/engine.log" 2>/dev/null | sort -u | sed "s|^|$(basename "$d"): |"; done > "$R/b_engine_paths.txt"
fi
tar -czf "$OUT/gpu-results.tar.gz" -C "$WORK" results
echo "gpu_demo: $(( $(date +%s) - START )) s; results: $OUT/gpu-results.tar.gz ($(ls "$R" | tr '\n' ' '))"
echo "gpu_demo: elsewhere, after unpacking it: tuner report results/study; tuner predict results/study"
