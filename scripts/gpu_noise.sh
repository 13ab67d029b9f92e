#!/usr/bin/env bash
# On an air-gapped GPU host, once the bundle is installed (docs/gpu.md): where run-to-run spread
# comes from (benchmarks/noise_sources.py): launches of one config, each measured many ways
# through its running engine, then the tables.
#
#   scripts/gpu_noise.sh [BUDGET_S]     (default 500 seconds)
#
# Resumable: the run lives in WORK/noise (default WORK=~/spec-tuner-gpu) and the same command
# adds the launches still missing (a launch starts only when one fits the budget left). Packs
# OUT/gpu-noise.tar.gz, one folder noise/: every JSON of the run (run.json, launch.json, each
# measurement's measurement.json, result.json, summary.json), each launch's engine-path lines,
# the printed output (run.txt), the tables (tables.txt) and the GPU (gpu.txt); no prompt text,
# no token ids. `benchmarks/noise_sources.py analyze noise` prints the tables again anywhere.
# env: SITE, WORK, OUT (./gpu-results), WORKLOAD (instructcoder), NUM_PROMPTS (16 here: the c=1
#      level sends 16 requests, 8 measurements of it a launch), OUTPUT_LEN (128), CONCURRENCY
#      (1,8,32), LAUNCHES (3), REPS (3), SUSPECTS (a,b,c,d,e,f,g,h),
#      MODEL (the model launched; default the embedded SmolLM2-135M), ENGINE_ARGS (vLLM's
#      arguments as one string, passed whole: ENGINE_ARGS='--load-format dummy --dtype bfloat16'),
#      NOISE_ARGS (more options of `noise_sources.py run`, split on whitespace, so no value
#      with a space or a quote in it: e.g. --interleave JSON --stability 3).
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET_S=${1:-500}; WORK=${WORK:-$HOME/spec-tuner-gpu}; RUN=$WORK/noise
NUM_PROMPTS=${NUM_PROMPTS:-16}
. scripts/gpu_host.sh
case "${NOISE_ARGS:-}" in *[\'\"]*)
  echo "gpu_noise: NOISE_ARGS is split on whitespace and keeps quotes as they are; put vLLM's" \
       "arguments in ENGINE_ARGS (one string) and the model in MODEL" >&2; exit 2 ;; esac
extra=()
[ -n "${MODEL:-}" ] && extra+=(--model "$MODEL")
# As one argument, in the --opt=VALUE form: a value that starts with -- is not read as an option.
[ -n "${ENGINE_ARGS:-}" ] && extra+=("--engine-args=$ENGINE_ARGS")
mkdir -p "$RUN"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$RUN/gpu.txt"
# The benchmark stops itself 25 s before the budget's end (the packing's time); SIGINT at 10 s
# before (its Ctrl-C path reaps the engine), SIGKILL 30 s later.
# shellcheck disable=SC2086  # NOISE_ARGS: options, split on purpose
timeout -s INT -k 30 "$(( $(left) - 10 ))" python3 benchmarks/noise_sources.py run \
  --out "$RUN" --budget-s "$(( $(left) - 25 ))" --workload "$WORKLOAD" \
  --num-prompts "$NUM_PROMPTS" --output-len "$OUTPUT_LEN" --concurrency "$CONCURRENCY" \
  --launches "${LAUNCHES:-3}" --reps "${REPS:-3}" --suspects "${SUSPECTS:-a,b,c,d,e,f,g,h}" \
  ${extra[@]+"${extra[@]}"} ${NOISE_ARGS:-} 2>&1 | tee -a "$RUN/run.txt"
python3 benchmarks/noise_sources.py analyze "$RUN" > "$RUN/tables.txt" 2>&1
for d in "$RUN"/launch-*/; do
  grep -hE "non-default args|cudagraph_mode|[Aa]sync scheduling|[Mm]odel [Rr]unner" \
    "$d/engine.log" 2>/dev/null | cut -c1-400 > "$d/engine_path.txt"
done
(cd "$WORK" && find noise \( -name '*.json' -o -name '*.txt' \) -not -path 'noise/prompts/*' \
  -print0 | tar -czf "$OUT/gpu-noise.tar.gz" --null -T -)
echo "gpu_noise: $(( $(date +%s) - START )) s; $(ls -d "$RUN"/launch-*/ 2>/dev/null | wc -l) launch folder(s); $OUT/gpu-noise.tar.gz"
